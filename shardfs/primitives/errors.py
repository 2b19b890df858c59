"""The exceptions the core raises.

The core never knows about errno; the FUSE adapter maps these classes to errno
values in one table (`shardfs.fuse.adapter.errno_for`) and raises nothing else.
Each class names the condition from the caller's point of view, so other front
ends can map them too.
"""


class ShardfsError(Exception):
    """Base class of every error shardfs raises on purpose.

    `logged` is set by code that already wrote the error's one log line, so
    the boundary that maps it to errno does not log it again.
    """

    logged: bool = False


class NotFound(ShardfsError):
    """The path does not exist in the view."""


class UnknownNode(ShardfsError):
    """A request named a node that the table does not hold: a defect, answered as an I/O
    error (never as a missing file, which a reader would take for a fill value)."""


class MissingChunk(NotFound):
    """A key of an array's chunk grid that holds no chunk. Only a write of that chunk
    makes it exist, so a front end may let its client remember the absence as long
    as it remembers entries."""


class NotADirectory(ShardfsError):
    """A directory operation was asked of a file."""


class IsADirectory(ShardfsError):
    """A file operation was asked of a directory."""


class ReadOnly(ShardfsError):
    """The operation would modify something this view cannot modify."""


class NotPermitted(ShardfsError):
    """A kind of file the view never holds (a device, a symlink): no mode makes it possible."""


class Unimplemented(ShardfsError):
    """The view does not do this operation at all, so a front end may stop asking for it
    (FUSE's kernel then serves opens and flushes itself)."""


class BadHandle(ShardfsError):
    """The operation does not apply to the way the file was opened (a write to a reader)."""


class InvalidRequest(ShardfsError):
    """The request asks for something no view does (a rename that exchanges two files)."""


class NoAttribute(ShardfsError):
    """The file has no extended attribute of that name."""


class AttributesFixed(ShardfsError):
    """Extended attributes are the view's own: they cannot be set or removed."""


class AlreadyExists(ShardfsError):
    """The path to create already exists."""


class NotEmpty(ShardfsError):
    """A directory to remove still has entries."""


class CannotMove(ShardfsError):
    """The rename is not possible within the view (a directory); tools fall back to copying."""


class InvalidWrite(ShardfsError):
    """What was written cannot be stored in the source's format (wrong size, other codecs, ...)."""


class CorruptData(ShardfsError):
    """Stored data failed validation; serving it could return wrong bytes."""


class StorageError(ShardfsError):
    """The storage backend failed (I/O error, vanished object, ...)."""


class SourceChanged(StorageError):
    """The object changed between reading its index and reading its data."""


class InvalidMetadata(ShardfsError):
    """A metadata document cannot be understood."""


class UsageError(ShardfsError):
    """Bad command line, option or mount request."""
