"""The write buffer: the content of files written through the mount until they are committed.

Each buffered file is a `Blob`, held in memory while the buffer's memory use
stays within its budget (`write_buffer`) and spilled to a file in the spool
directory beyond it, so a writer faster than the commits never grows the
daemon without bound. The buffer owns the budget and the spool; blobs are
thread-safe and may be written, read and truncated at any offset.

Spool files are private to one buffer (one daemon): each buffer makes its own
directory `shardfs-spool-XXXXXXXX.private` (mode 0700) in the spool directory,
creates every spill file in it exclusively (mode 0600, never through a symlink),
and removes it at `close()`. The spool directory itself must be one no other
user can change (`spool_root`): the daemon user's or root's, and writable by
others only if sticky, as /tmp; else the buffer is refused. Many
daemons may share one `spool=DIR`, and nothing a killed daemon left there is
ever read again. The buffer holds an `flock` on its directory for its life, so
a directory whose lock can be taken belongs to a daemon that is gone (killed,
crashed): every new buffer removes those it finds next to its own. Nothing else
in the spool directory is touched (`DIR/pending/` holds the chunks that
`shardfs.writeback.leftover` keeps).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections import OrderedDict

from shardfs.primitives.blocking import check_may_block
from shardfs.primitives.errors import StorageError
from shardfs.primitives.private import UnsafeState, check_private_dir, open_private, private_dir

log = logging.getLogger("shardfs")

#: The private directory of a buffer is PREFIX + random + SUFFIX. Older versions made
#: `shardfs-spool-XXXXXXXX` (no suffix) and never lock it: the suffix keeps their
#: directories out of the sweep, since a running one would look dead.
PREFIX = "shardfs-spool-"
SUFFIX = ".private"


class Blob:
    """One buffered file. `generation` grows with every change, so a commit can tell
    whether the content it stored is still the current one."""

    def __init__(self, pool: WriteBuffer, data: bytes = b"") -> None:
        self._pool = pool
        self.lock = threading.Lock()
        #: The content while in memory: the `bytes` a file was created with or first
        #: written whole (kept as they are, see `write`), a bytearray once changed again.
        self._memory: bytes | bytearray | None = bytes(data)
        self._spool: str | None = None
        self.size = len(data)
        self.mtime_ns = time.time_ns()
        self.generation = 0
        pool._charge(self, len(data))

    def read(self, offset: int, size: int) -> bytes:
        with self.lock:
            return self._read(offset, size)

    def _read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.size - offset))
        if self._memory is not None:
            return bytes(self._memory[offset : offset + size])
        return self._pool._spool_read(self._spool, offset, size)

    def getvalue(self) -> bytes:
        return self.read(0, self.size)

    def snapshot(self) -> tuple[int, bytes] | None:
        """(generation, content) taken together, or None once the blob is released: a
        commit may meet a file that was removed or replaced since it listed the changes."""
        with self.lock:
            if self._memory is None and self._spool is None:
                return None
            return self.generation, self._read(0, self.size)

    def write(self, offset: int, data: bytes) -> None:
        with self.lock:
            end = offset + len(data)
            if self._memory is not None:
                grown = max(0, end - len(self._memory))
                if grown:
                    self._pool._charge(self, grown)
                if not self._memory and not offset and type(data) is bytes:
                    # A new file written in one piece, as chunk writers do: the request's
                    # bytes are kept, not copied into fresh memory (a copy and a page
                    # fault per 4 KiB: half the cost of the request).
                    self._memory = data
                else:
                    memory = self._writable()
                    if offset > len(memory):
                        memory.extend(bytes(offset - len(memory)))
                    memory[offset:end] = data
            else:
                self._pool._spool_write(self._spool, offset, data)
            self.size = max(self.size, end)
            self._changed()
        self._pool._enforce()

    def truncate(self, size: int) -> None:
        with self.lock:
            if self._memory is not None:
                memory = self._writable()
                self._pool._charge(self, size - len(memory))
                if size < len(memory):
                    del memory[size:]
                else:
                    memory.extend(bytes(size - len(memory)))
            else:
                self._pool._spool_truncate(self._spool, size)
            self.size = size
            self._changed()
        self._pool._enforce()

    def copy(self) -> Blob:
        return Blob(self._pool, self.getvalue())

    def release(self) -> None:
        """Free the blob's memory or spool file; it must not be used afterwards."""
        with self.lock:
            if self._memory is not None:
                freed, self._memory = len(self._memory), None
                self._pool._charge(self, -freed)
            if self._spool is not None:
                self._pool._spool_remove(self._spool)
                self._spool = None

    def _writable(self) -> bytearray:
        """The content in memory as a bytearray, to be changed in place (under `lock`)."""
        if not isinstance(self._memory, bytearray):
            assert self._memory is not None
            self._memory = bytearray(self._memory)
        return self._memory

    @property
    def in_memory(self) -> int:
        return len(self._memory) if self._memory is not None else 0

    def _changed(self) -> None:
        self.generation += 1
        self.mtime_ns = time.time_ns()

    def _spill(self, path: str) -> int:
        """Move the content to the new spool file `path`; returns the bytes of memory freed."""
        with self.lock:
            if self._memory is None:
                return 0
            self._pool._spool_create(path, self._memory)
            freed = len(self._memory)
            self._memory, self._spool = None, path
            return freed


class WriteBuffer:
    """Owner of every blob's memory (`budget` bytes) and of the spool directory.

    `pressure` tells the committer to commit everything now: it is set once
    memory use passes half the budget, so that commits usually free memory
    before anything has to be spilled.
    """

    def __init__(self, budget: int, spool_dir: str | None = None) -> None:
        self.budget = budget
        #: where the private directories are made: `spool=DIR`, or the temporary directory
        self.spool_root = spool_root(spool_dir or tempfile.gettempdir())
        #: this buffer's private directory, which holds its spool files and nothing else
        self.spool_dir, self._dir_fd = _make_private_dir(self.spool_root)
        self._closed = False
        _sweep(self.spool_root, self.spool_dir)
        self._lock = threading.Lock()
        self._blobs: OrderedDict[int, Blob] = (
            OrderedDict()
        )  #: in memory, least recently grown first
        self.used = 0
        self.spilled = 0
        self.pressure = threading.Event()
        self._names = itertools.count()

    def new(self, data: bytes = b"") -> Blob:
        blob = Blob(self, data)
        try:
            self._enforce()
        except BaseException:
            blob.release()  # a non-blocking attempt gave up: it is made again in a thread
            raise
        return blob

    def close(self) -> None:
        """Remove this buffer's private directory with its spool files (never anything
        else in the spool directory), then let go of its lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True

        try:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
            if os.path.lexists(self.spool_dir):
                log.warning("cannot remove the spool directory %s", self.spool_dir)
        finally:
            os.close(self._dir_fd)

    def _charge(self, blob: Blob, delta: int) -> None:
        with self._lock:
            self.used += delta
            if self.used > self.budget // 2:
                self.pressure.set()
            self._blobs.pop(id(blob), None)
            if blob._memory is not None or delta > 0:
                self._blobs[id(blob)] = blob

    def _enforce(self) -> None:
        """Spill the least recently grown blobs until memory use is within budget."""
        while True:
            with self._lock:
                if self.used <= self.budget or not self._blobs:
                    return
            check_may_block()
            with self._lock:
                if not self._blobs:
                    return
                _, victim = self._blobs.popitem(last=False)
                path = os.path.join(self.spool_dir, f"{next(self._names)}.blob")
            try:
                freed = victim._spill(path)
            except BaseException:
                with self._lock:  # still in memory: the next attempt may spill it again
                    if victim._memory is not None and id(victim) not in self._blobs:
                        self._blobs[id(victim)] = victim
                        self._blobs.move_to_end(id(victim), last=False)
                raise
            with self._lock:
                self.used -= freed
                self.spilled += freed

    # -- spool files (one per spilled blob, in the private directory) -------------

    def _spool_create(self, path: str, data: bytes | bytearray) -> None:
        """Make the spool file `path`, which must not exist yet, holding `data`."""
        check_may_block()
        try:
            fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except OSError as e:
            raise StorageError(f"cannot create spool file {path}: {e.strerror}") from None
        try:
            _write_all(fd, 0, data)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise StorageError(f"spool file {path}: {e.strerror}") from None
        finally:
            os.close(fd)

    def _spool_write(self, path: str | None, offset: int, data: bytes | bytearray) -> None:
        assert path is not None
        check_may_block()
        try:
            fd = open_private(path, os.O_WRONLY)  # made by _spool_create, never here
            try:
                _write_all(fd, offset, data)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"spool file {path}: {e.strerror}") from None

    def _spool_read(self, path: str | None, offset: int, size: int) -> bytes:
        assert path is not None
        check_may_block()
        try:
            fd = open_private(path, os.O_RDONLY)
            try:
                return os.pread(fd, size, offset)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"spool file {path}: {e.strerror}") from None

    def _spool_truncate(self, path: str | None, size: int) -> None:
        assert path is not None
        check_may_block()
        try:
            fd = open_private(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"spool file {path}: {e.strerror}") from None

    def _spool_remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not self._closed:  # after close() the whole directory is gone
                log.warning("spool file %s was removed by someone else", path)
        except OSError as e:
            log.warning("cannot remove spool file %s: %s", path, e.strerror)


def spool_root(path: str) -> str:
    """The spool directory `path` (absolute), made private (0700) if it is missing.
    UnsafeState, naming it and why, unless another user cannot change what is in it: it
    must be a real directory (not a symlink) of the daemon's user or root, writable by
    nobody else unless it is sticky (as /tmp: there others may add entries, but neither
    rename nor remove the private directory this buffer makes), and so must every
    directory above it."""
    path = os.path.abspath(path)
    try:
        if not os.path.lexists(path):
            return private_dir(path)
        check_private_dir(path, shared=True)
    except UnsafeState as e:
        raise UnsafeState(f"spool directory {e}") from None
    return path


def _write_all(fd: int, offset: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _make_private_dir(root: str) -> tuple[str, int]:
    """Make a private directory in `root` and lock it: (its path, the locked descriptor).

    The sweeper (`_sweep`) of another daemon may take the lock of a directory made a moment
    ago, before its maker locked it, and remove it: the maker then finds the lock taken or
    its path no longer naming the directory it locked, and makes another.
    """
    for _ in range(20):
        try:
            path = tempfile.mkdtemp(prefix=PREFIX, suffix=SUFFIX, dir=root)  # mode 0700
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # swept before it could be opened
        except OSError as e:
            raise StorageError(f"spool directory {root}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # a sweeper has it, and removes it
            continue
        except OSError as e:  # a file system without locks: never swept, by anyone
            log.warning(
                "cannot lock the spool directory %s (%s): if this daemon is killed, "
                "remove it by hand",
                path,
                e.strerror,
            )
        try:
            mine, now = os.fstat(fd), os.lstat(path)
        except OSError:
            now = None
        if now is not None and (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
            return path, fd
        os.close(fd)  # swept between the mkdtemp and the lock
    raise StorageError(f"spool directory {root}: cannot make a private directory in it")


def _sweep(root: str, own: str) -> None:
    """Remove the private directories in `root` of buffers whose daemon is gone: those whose
    lock can be taken. Directories of running daemons, of other users, and everything else in
    `root` are left alone. Nothing is followed: not a symlink with the name of a private
    directory (skipped), nor one inside a directory removed (`shutil.rmtree` removes it
    through descriptors, unlinking symlinks), and a directory others may write in is not
    one this user made (skipped: what they put there is theirs)."""
    try:
        names = os.listdir(root)
    except OSError as e:
        log.warning("cannot list spool directory %s: %s", root, e.strerror)
        return
    uid = os.geteuid()
    for name in names:
        path = os.path.join(root, name)
        if not (name.startswith(PREFIX) and name.endswith(SUFFIX)) or path == own:
            continue
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o022:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its daemon runs
            mine = os.fstat(fd)
            if (mine.st_dev, mine.st_ino) != (info.st_dev, info.st_ino):
                continue
            if not shutil.rmtree.avoids_symlink_attacks:  # pragma: no cover (Linux has it)
                continue
            shutil.rmtree(path, ignore_errors=True)
            if os.path.lexists(path):
                log.warning("cannot remove the spool directory of a stopped daemon: %s", path)
            else:
                log.info("removed the spool directory of a daemon that is gone: %s", path)
        finally:
            os.close(fd)
