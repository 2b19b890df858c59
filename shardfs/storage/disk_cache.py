"""A persistent cache of object bytes on local disk, shared by the mounts of one host.

Why: a cluster node mounts the same bucket prefix again and again (every job,
every restart), and every mount would fetch the same shard indexes and chunks
from the store again. This cache keeps what was fetched, in fixed-size blocks
of each object version, in a directory that outlives the daemon.

Choices:

- **Blocks, keyed by object version.** A block is `BLOCK` bytes at a multiple
  of `BLOCK` in one version (ETag) of one object. Reads of any range are
  assembled from blocks, so a remount whose read-ahead windows fall
  differently still finds them; a replaced object has a new ETag, so no read
  of it can ever be answered from the old version's blocks.
- **diskcache for the index and the eviction** (python-diskcache, SQLite in WAL
  mode plus one file per value). It was chosen for its behaviour across
  processes and crashes: every change of its index is an SQLite transaction,
  so concurrent mounts sharing the directory and a daemon killed at any
  instant leave a consistent index; value files are written under fresh
  random names before the transaction that points to them, so no reader ever
  sees a half-written file under a committed key; least-recently-used
  eviction against `size_limit` happens inside those transactions, so two
  mounts never evict from under each other's index.
- **Our own checksum on every block.** diskcache does not fsync its value
  files, and a power loss or a full disk can leave a committed key pointing to
  a truncated or zeroed file. Each block is stored with its CRC32C and the
  object's size; a block that does not check out is dropped (one log line) and
  fetched again, never served.
- **Failures degrade to no caching.** A full disk, a locked or damaged
  database: the read goes to the store as if there were no cache, with one log
  line; writes resume after `PAUSE` seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable

import crc32c
import diskcache

from shardfs.primitives.errors import CorruptData

log = logging.getLogger("shardfs")

#: The unit of caching: big enough that a block costs one round trip worth its bytes,
#: small enough that a reader of one chunk does not fetch much in vain.
BLOCK = 1 << 20
#: Seconds without cache writes after a write failed (a full disk), before trying again.
PAUSE = 60.0
#: Seconds a cache call waits for the SQLite lock another process holds.
LOCK_TIMEOUT = 5.0
#: CRC32C of the block's bytes, the object's size.
_HEADER = struct.Struct("<IQ")

#: `fetch(offset, length)`: the object's bytes from `offset`, `length` of them or up to its
#: end if that comes first, and the object's size.
Fetch = Callable[[int, int], tuple[bytes, int]]


@dataclasses.dataclass
class DiskCacheStats:
    hits: int = 0
    misses: int = 0
    #: bytes served from disk, and bytes written to it
    bytes_read: int = 0
    bytes_written: int = 0
    #: blocks found damaged and dropped
    dropped: int = 0
    #: reads or writes that failed and went without the cache
    failures: int = 0


class DiskCache:
    """Blocks of object versions in `directory`, at most about `size` bytes. Thread-safe."""

    def __init__(self, directory: str, size: int, block: int = BLOCK) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.size = size
        self.block = block
        self._cache = diskcache.Cache(
            directory,
            size_limit=size,
            eviction_policy="least-recently-used",
            timeout=LOCK_TIMEOUT,
        )
        self.stats = DiskCacheStats()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._paused_until = 0.0
        self._warned_until = 0.0

    def close(self) -> None:
        self._cache.close()

    def read(self, name: str, version: str, offset: int, length: int, fetch: Fetch) -> bytes:
        """`length` bytes at `offset` of version `version` of object `name` (a name unique
        on this host: the store and the key), from the cache where it holds them, the rest
        by `fetch`, which is then kept. CorruptData if the object ends before them."""
        if length <= 0:
            return b""
        end = offset + length
        first, last = offset // self.block, (end - 1) // self.block
        # The bytes asked for of each block, copied out of a held one (whose buffer the
        # next one reuses) or viewed in a fetched one.
        pieces: dict[int, bytes | memoryview] = {}
        size: int | None = None
        for index in range(first, last + 1):
            found = self._get(name, version, index, *self._within(index, offset, end))
            if found is not None:
                pieces[index], size = found
        missing = [i for i in range(first, last + 1) if i not in pieces]
        for start, stop in _runs(missing):
            data, size = fetch(start * self.block, (stop - start) * self.block)
            fetched = memoryview(data)
            for index in range(start, stop):
                block = fetched[(index - start) * self.block : (index - start + 1) * self.block]
                if not block:
                    break
                self._put(name, version, index, block, size)
                low, high = self._within(index, offset, end)
                pieces[index] = block[low:high]
        if size is None or end > size:
            raise CorruptData(f"wanted {length} bytes at {offset}, the object has {size} bytes")
        if first == last and isinstance(pieces[first], bytes):
            return pieces[first]  # already a copy of its own
        return b"".join(pieces[index] for index in range(first, last + 1))

    def _within(self, index: int, offset: int, end: int) -> tuple[int, int]:
        """Where the bytes from `offset` to `end` lie in block `index`, as (low, high)."""
        base = index * self.block
        return max(offset, base) - base, min(end, base + self.block) - base

    def held_span(
        self, name: str, version: str, offset: int, length: int
    ) -> tuple[int, int] | None:
        """The whole blocks around `length` bytes at `offset` of a version, as (start, end),
        if the cache holds every one of them; else None. No block is read, counted or
        made recent: a reader asks this to size what it reads, since a held block costs
        the same to read whatever part of it is wanted, and a missing one a round trip."""
        if length <= 0:
            return None
        first, last = offset // self.block, (offset + length - 1) // self.block
        try:
            for index in range(first, last + 1):
                if self._key(name, version, index) not in self._cache:
                    return None
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            self._failed(f"reading {self.directory}", e)
            return None
        return first * self.block, (last + 1) * self.block

    def _key(self, name: str, version: str, index: int) -> str:
        return f"{name}\0{version}\0{index}"

    def _get(
        self, name: str, version: str, index: int, low: int, high: int
    ) -> tuple[bytes, int] | None:
        """Bytes `low` to `high` of a block and the object's size, if the block is held
        and checks out. The whole block is read into this thread's buffer and checked;
        only the bytes wanted are copied out (a fresh megabyte costs more than the read)."""
        key = self._key(name, version, index)
        try:
            value = self._cache.get(key, read=True)  # a file, or bytes kept in the index
            if value is None or isinstance(value, bytes):
                stored = value
            else:
                buffer = self._buffer()
                with value:
                    stored = buffer[: value.readinto(buffer)]
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            self._failed(f"reading {self.directory}", e)
            return None
        if stored is None:
            self._count("misses")
            return None
        if len(stored) >= _HEADER.size:
            digest, size = _HEADER.unpack_from(stored)
            data = memoryview(stored)[_HEADER.size :]
            expected = min(self.block, size - index * self.block)
            if len(data) == expected and crc32c.crc32c(data) == digest:
                self._count("hits", bytes_read=len(data))
                return bytes(data[low:high]), size
        log.warning(
            "disk cache %s: a damaged block of %s (version %s, bytes %d-) was dropped",
            self.directory, name, version, index * self.block,
        )  # fmt: skip
        self._count("dropped")
        try:
            self._cache.delete(key)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            self._failed(f"dropping a block in {self.directory}", e)
        return None

    def _buffer(self) -> memoryview:
        """This thread's buffer for one stored block, made once: reused, its pages stay
        mapped. One byte more than a block holds, so a file too long shows. (Scratch, not
        a cache: one block per thread that reads, the daemon's 16 workers and the few
        read-ahead threads.)"""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = memoryview(bytearray(_HEADER.size + self.block + 1))
        return buffer

    def _put(self, name: str, version: str, index: int, data: memoryview, size: int) -> None:
        if time.monotonic() < self._paused_until:
            return
        value = _HEADER.pack(crc32c.crc32c(data), size) + data
        try:
            self._cache.set(self._key(name, version, index), value)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            self._paused_until = time.monotonic() + PAUSE
            self._failed(f"writing to {self.directory} (no caching for {PAUSE:.0f} s)", e)
            return
        self._count(bytes_written=len(data))

    def _failed(self, doing: str, error: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            self.stats.failures += 1
            quiet = now < self._warned_until
            if not quiet:
                self._warned_until = now + PAUSE
        if not quiet:  # one line per failing spell, not one per block
            log.warning("disk cache: %s failed: %s", doing, error or type(error).__name__)

    def _count(self, event: str = "", bytes_read: int = 0, bytes_written: int = 0) -> None:
        with self._lock:
            stats = self.stats
            if event:
                setattr(stats, event, getattr(stats, event) + 1)
            stats.bytes_read += bytes_read
            stats.bytes_written += bytes_written

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats` (blocks hit and missed, bytes each way)."""
        with self._lock:
            stats = dataclasses.asdict(self.stats)
        try:
            stats["used"] = int(self._cache.volume())
        except (OSError, sqlite3.Error, diskcache.Timeout):
            stats["used"] = -1
        stats["budget"] = self.size
        return stats


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted `indexes`, as (start, stop) pairs."""
    runs: list[tuple[int, int]] = []
    for index in indexes:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs
