"""What a front end needs of a view: the one interface the FUSE adapter programs against.

Four classes implement it: `Namespace` (a Zarr source, read-only), `Workspace`
(a Zarr source, read-write), `PrecomputedNamespace` (a Neuroglancer precomputed
source, read-only) and `WkwNamespace` (a WKW dataset, read-only). A front end asks `writes` for the writable side instead of
checking types, and never reaches past these methods into the classes behind
them, so a new view (or a new front end, such as an HTTP server) only has to
meet these two protocols.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shardfs.storage.base import Storage
    from shardfs.view.leaves import ChunkDirectory
    from shardfs.view.namespace import Namespace
    from shardfs.view.nodes import Attr, Extent, Listing, Node


class OpenFile(Protocol):
    """An open file of the view: a reader of a version of the source, or a buffered file
    being written."""

    #: Whether it is a file of the write side, whose bytes are in the write buffer: what
    #: the `Writes` calls that take a handle take.
    buffered: bool

    def read(self, offset: int, size: int) -> bytes: ...

    def attr(self) -> Attr:
        """The file as opened, whatever its path names now."""
        ...


class Opened(OpenFile, Protocol):
    """What `ViewInterface.open` gives: a reader that may pin a version of the source."""

    @property
    def version(self) -> Hashable:
        """The version of the source it serves: equal for two readers of one file only if
        they serve the same bytes."""
        ...

    def close(self) -> None: ...


class WriteHandle(OpenFile, Protocol):
    """A file open for writing through `Writes`."""

    #: Whether closing it stores it in the source (metadata documents, files passed
    #: through): a front end then closes it where waiting for I/O is allowed.
    stores_on_close: bool


class ViewInterface(Protocol):
    """The read side of a view, and the way to its write side."""

    #: Where its files are stored: what a front end that caches records versions of (see
    #: `shardfs.view.shown`).
    storage: Storage

    @property
    def writes(self) -> Writes | None:
        """The writable side of this view, or None where the view is read-only."""
        ...

    def root(self) -> Node: ...

    def resolve(self, path: str) -> Node: ...

    def entry(self, parent: Node, name: str) -> tuple[Node, Attr]: ...

    def attr(self, node: Node) -> Attr: ...

    def chunk_directory(self, path: str) -> ChunkDirectory | None: ...

    def cached_chunk(self, extent: Extent) -> bytes | None: ...

    def listing(self, node: Node) -> Listing: ...

    def open(self, node: Node) -> Opened: ...

    def digest_source(self, node: Node) -> Namespace | None:
        """The Zarr namespace whose stored bytes `node` serves as they are stored, so that
        their md5 can be taken and kept by where they are stored; None where the node is
        not such a chunk file (another file, a precomputed chunk, a chunk written through
        the mount and not yet committed)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Figures for `shardfs stats`: what the source was asked and each cache's."""
        ...

    def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for background fetches in flight (the mount ends)."""
        ...


class Writes(Protocol):
    """The write side of a read-write view. Every call does its I/O before it changes any
    state, so a front end may retry it (see `shardfs.primitives.blocking`)."""

    def open(self, node: Node, flags: int) -> OpenFile:
        """A reader, or a `WriteHandle` where `flags` ask for writing."""
        ...

    def reopen(self, handle: WriteHandle, flags: int) -> WriteHandle: ...

    def create(self, parent: Node, name: str) -> tuple[Node, Attr, WriteHandle]: ...

    def mkdir(self, parent: Node, name: str) -> tuple[Node, Attr]: ...

    def rmdir(self, parent: Node, name: str) -> Node: ...

    def unlink(self, parent: Node, name: str) -> Node: ...

    def rename(
        self, old: Node, old_name: str, new: Node, new_name: str, noreplace: bool
    ) -> tuple[Node, Node, bool]: ...

    def link(self, node: Node, new_parent: Node, new_name: str) -> tuple[Node, Attr]: ...

    def truncate(self, node: Node, size: int) -> Attr: ...

    def truncate_open(self, handle: WriteHandle, size: int) -> Attr: ...

    def write(self, handle: WriteHandle, offset: int, data: bytes) -> int: ...

    def flush(self, handle: WriteHandle) -> None: ...

    def fsync(self, handle: WriteHandle) -> None: ...

    def release(self, handle: WriteHandle) -> None: ...

    def sync(self) -> int:
        """Commit everything buffered; how many chunks could not be stored."""
        ...
