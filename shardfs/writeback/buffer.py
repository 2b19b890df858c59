"""The write buffer: the content of files written through the mount until they are committed.

Each buffered file is a `Blob`, held in memory while the buffer's memory use
stays within its budget (`write_buffer`) and spilled to a file in the spool
directory beyond it, so a writer faster than the commits never grows the
daemon without bound. The buffer owns the budget and the spool; blobs are
thread-safe and may be written, read and truncated at any offset.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict

from shardfs.errors import StorageError
from shardfs.storage.blocking import check_may_block


class Blob:
    """One buffered file. `generation` grows with every change, so a commit can tell
    whether the content it stored is still the current one."""

    def __init__(self, pool: WriteBuffer, data: bytes = b"") -> None:
        self._pool = pool
        self.lock = threading.Lock()
        self._memory: bytearray | None = bytearray(data)
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
                if offset > len(self._memory):
                    self._memory.extend(bytes(offset - len(self._memory)))
                self._memory[offset:end] = data
            else:
                self._pool._spool_write(self._spool, offset, data)
            self.size = max(self.size, end)
            self._changed()
        self._pool._enforce()

    def truncate(self, size: int) -> None:
        with self.lock:
            if self._memory is not None:
                if size < len(self._memory):
                    self._pool._charge(self, size - len(self._memory))
                    del self._memory[size:]
                else:
                    self._pool._charge(self, size - len(self._memory))
                    self._memory.extend(bytes(size - len(self._memory)))
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

    @property
    def in_memory(self) -> int:
        return len(self._memory) if self._memory is not None else 0

    def _changed(self) -> None:
        self.generation += 1
        self.mtime_ns = time.time_ns()

    def _spill(self, path: str) -> int:
        """Move the content to the spool file `path`; returns the bytes of memory freed."""
        with self.lock:
            if self._memory is None:
                return 0
            self._pool._spool_write(path, 0, self._memory)
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
        self._own_spool = spool_dir is None
        self.spool_dir = spool_dir or tempfile.mkdtemp(prefix="shardfs-spool-")
        os.makedirs(self.spool_dir, exist_ok=True)
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
        """Remove the spool directory (if this buffer made it)."""
        if self._own_spool:
            shutil.rmtree(self.spool_dir, ignore_errors=True)

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
            freed = victim._spill(path)
            with self._lock:
                self.used -= freed
                self.spilled += freed

    # -- spool files (one per spilled blob) ------------------------------------

    def _spool_write(self, path: str | None, offset: int, data: bytes | bytearray) -> None:
        assert path is not None
        check_may_block()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    written = os.pwrite(fd, view, offset)
                    view, offset = view[written:], offset + written
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"spool file {path}: {e.strerror}") from None

    def _spool_read(self, path: str | None, offset: int, size: int) -> bytes:
        assert path is not None
        check_may_block()
        try:
            with open(path, "rb") as f:
                return os.pread(f.fileno(), size, offset)
        except OSError as e:
            raise StorageError(f"spool file {path}: {e.strerror}") from None

    def _spool_truncate(self, path: str | None, size: int) -> None:
        assert path is not None
        check_may_block()
        try:
            os.truncate(path, size)
        except OSError as e:
            raise StorageError(f"spool file {path}: {e.strerror}") from None

    def _spool_remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
