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
- **A private directory.** The directory is used only if the daemon's user
  alone can change it (`primitives.private`: owned by that user, written by
  nobody else, nor any directory above it unless sticky, not a symlink);
  else the mount goes on without the cache. Everything in it is 0700
  (directories) and 0600 (files). Anyone who could write it could plant
  blocks (the CRC32C below protects against damage, not against forgery), and
  anyone who could read it could read the cached objects.
- **Our own schema, of bytes and integers.** The index is an SQLite database,
  `blocks.db` (WAL mode: readers never wait for the one writer), with one row
  per block: `key` (the SHA-256 of object name, version and block index, 32
  bytes), the block's `crc` (CRC32C), `length`, the object's `size`, and
  `used` (when it was last read, in microseconds of the wall clock, shared by
  every process). Nothing read back from it is executed (there is no pickle)
  or used as a path: a block's file is `blocks/<hex of key>` split after two
  characters, its name computed from the key asked for; eviction, which
  iterates rows, derives the path from a key only if it is exactly 32 bytes
  (other rows are deleted and no file is touched). Every value read back is
  checked to be an integer in range before use. A database that is not
  SQLite, or has another schema (tables, indexes, triggers) than exactly ours,
  is damaged: one log line, and the cache starts afresh (our database and our
  block files are removed).
- **A block is served only if it checks out.** Its row holds its CRC32C and
  length, so a block file that is missing, shorter, longer, rewritten (with
  any header) or not a regular file (a symlink: it is opened with O_NOFOLLOW)
  is never served: it is dropped (one log line unless it is missing) and
  fetched again. Files are not fsynced: after a power loss a row may name a
  file whose pages never reached the disk, and the CRC32C finds that.
- **Writes.** The blocks of a fetched run are written to temporary files in
  `tmp/`, renamed into place, and then their rows are inserted in one
  transaction, which also evicts the least recently used blocks until the
  total is within `size` (unlinking their files before it commits).
- **Hits stay cheap.** A hit is one SELECT by primary key, an open, one read
  into this thread's buffer, a CRC32C, a copy of the bytes wanted: no write.
  Its recency is written later, at most once per `TOUCH` seconds per block,
  batched (in the next write's transaction, or its own when due), so LRU
  order is exact to within `TOUCH` seconds.
- **Tidying.** At most once per `TIDY` seconds (by whichever process opens
  the cache, or writes to it, then), temporary files and block files that no row names, older
  than `GRACE` (debris of a killed writer), are removed, rows that are not
  well formed are deleted, the byte total is counted again, and the files of
  the python-diskcache cache of earlier versions (`cache.db`, `*.val`) go.
- **Failures degrade to no caching, and say what they are.** A directory that
  is not private, a full or read-only file system, a database locked for
  longer than `LOCK_TIMEOUT`: at open, the mount goes on without the cache
  (one line naming the directory and the reason); while running, reads go to
  the store and writes pause for `PAUSE` seconds, with one line per `PAUSE`.
  "Full" and "read-only" come from the errno, SQLite's error code or statvfs,
  never "damaged" unless SQLite says the database is. A database found
  damaged while running: one line, no caching until the next open, which
  starts afresh.

Races between processes sharing the directory (every change of rows is a
transaction; a file is placed by rename and removed by unlink, never written
in place; the bytes of a key are always the same, one block of one version).
The outcome of each is at worst a miss, never wrong bytes:

- P reads K while Q evicts it: P opened the file before Q unlinked it (and
  reads it whole: it was complete when renamed into place), or gets ENOENT, a
  miss; its delete of the row, guarded by the row's values, deletes nothing.
- P places K (renamed, row not yet inserted) while Q evicts an older row of
  K: Q may unlink P's new file; P's row then names no file: the next read of
  K misses, deletes that row (quietly) and fetches again.
- P and Q place K at once: the last rename wins, both insert the same row.
- A row without its file (a kill during eviction, the case above) is a miss,
  and counts in the total until it is read or evicted. A file without its
  row (a kill between rename and insert, a failed insert whose files could
  not be removed) is never read, and is removed by tidying after `GRACE`.
- Tidying may remove a file that another process renamed into place after
  tidying found no row for it (only if that process took over `GRACE` to
  insert it): a miss.
- A damaged block is deleted only if its row is still the one read, and its
  file unlinked only then; a fresh copy renamed into place meanwhile may go
  with it: a miss.
- A process that starts the cache afresh unlinks the database under processes
  that run with it open: they go on with the old one, unseen; their new files
  have no row in the new one (tidied), their evictions may unlink files the
  new one names (misses).
- Two processes opening the cache at once are serialised by an flock of
  `lock` (schema creation, starting afresh, tidying).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import sqlite3
import stat
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import crc32c

from shardfs.primitives.errors import CorruptData, ShardfsError
from shardfs.primitives.private import DIR_MODE, FILE_MODE, open_private, private_dir

log = logging.getLogger("shardfs")

#: The unit of caching: big enough that a block costs one round trip worth its bytes,
#: small enough that a reader of one chunk does not fetch much in vain.
BLOCK = 1 << 20
#: Seconds without cache writes after a write failed (a full disk), before trying again.
PAUSE = 60.0
#: Seconds a cache call waits for the SQLite lock another process holds.
LOCK_TIMEOUT = 5.0
#: Seconds an open waits for another process that is opening the cache (and tidying it).
OPEN_TIMEOUT = 30.0
#: A hit refreshes its block's recency if it is older than this many seconds; refreshes
#: are written together, at most this often.
TOUCH = 10.0
#: Seconds after which a temporary file, or a block file no row names, is a killed
#: writer's debris. (A live writer takes at most LOCK_TIMEOUT to insert the row of a file
#: it renamed into place; one stopped for longer only loses that block: a miss.)
GRACE = 60.0
#: Seconds between two tidyings of the directory, by whichever process opens or writes
#: to it then.
TIDY = 3600.0

#: What is in the directory.
DATABASE, LOCK, BLOCKS, TMP, DAMAGED = "blocks.db", "lock", "blocks", "tmp", "damaged"
#: "shfc", and the version of the schema below.
APPLICATION_ID, SCHEMA_VERSION = 0x73686663, 1
#: Bytes in a block's key (SHA-256).
KEY_SIZE = 32
SCHEMA = (
    "CREATE TABLE block (key BLOB PRIMARY KEY, crc INTEGER NOT NULL, length INTEGER NOT NULL,"
    " size INTEGER NOT NULL, used INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX block_used ON block (used)",
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
)
_SUBDIR = re.compile(r"[0-9a-f]{2}")
_BLOCK_NAME = re.compile(f"[0-9a-f]{{{2 * KEY_SIZE - 2}}}")
_TMP_NAME = re.compile(r"[0-9a-f]{32}")
#: The python-diskcache cache of earlier versions: its database and value files.
_OLD_DATABASE = ("cache.db", "cache.db-wal", "cache.db-shm")
_OLD_VALUE = re.compile(r"[0-9a-f]{28}\.val")

#: `fetch(offset, length)`: the object's bytes from `offset`, `length` of them or up to its
#: end if that comes first, and the object's size (None if the answer did not tell it).
Fetch = Callable[[int, int], tuple[bytes, int | None]]


class CacheUnusable(ShardfsError):
    """The cache directory cannot be used (full, read-only, locked): one line naming it
    and the reason. The mount goes on without the cache."""


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
    """Blocks of object versions in `directory`, at most about `size` bytes. Thread-safe.

    UnsafeState if the directory is not the daemon user's alone, CacheUnusable if it
    cannot be used (the message says why)."""

    def __init__(self, directory: str, size: int, block: int = BLOCK) -> None:
        self.directory = private_dir(directory)
        self.size = size
        self.block = block
        self.stats = DiskCacheStats()
        self._lock = threading.Lock()
        self._local = threading.local()
        #: every connection opened, each used by one thread; a new generation drops them
        self._connections: list[sqlite3.Connection] = []
        self._generation = 0
        self._closed = False
        self._paused_until = 0.0
        self._warned_until = 0.0
        #: why the cache is no longer used (its database was found damaged), or ""
        self._broken = ""
        #: recency not written yet: key -> time of the hit (microseconds)
        self._touches: dict[bytes, int] = {}
        self._touch_due = time.monotonic() + TOUCH
        #: subdirectories of `blocks` checked to be ours, in this process
        self._subdirs: set[str] = set()
        self._tidy_due = time.monotonic() + TIDY
        self._database = os.path.join(self.directory, DATABASE)
        self._blocks = os.path.join(self.directory, BLOCKS)
        self._tmp = os.path.join(self.directory, TMP)
        try:
            self._open()
        except (OSError, sqlite3.Error) as e:
            self._drop_connections()
            raise CacheUnusable(f"cache_dir {self.directory}: {self._reason(e)}") from None
        _CACHES.add(self)

    # -- reading ------------------------------------------------------------------------

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
            kept: list[tuple[int, memoryview]] = []
            for index in range(start, stop):
                block = fetched[(index - start) * self.block : (index - start + 1) * self.block]
                if not block:
                    break
                if size is not None and len(block) == self._expected(index, size):
                    kept.append((index, block))
                low, high = self._within(index, offset, end)
                pieces[index] = block[low:high]
            if size is not None:  # else nothing is kept
                self._put(name, version, kept, size)
        if size is None or end > size:
            raise CorruptData(f"wanted {length} bytes at {offset}, the object has {size} bytes")
        if first == last and isinstance(piece := pieces[first], bytes):
            return piece  # already a copy of its own
        return b"".join(pieces[index] for index in range(first, last + 1))

    def _within(self, index: int, offset: int, end: int) -> tuple[int, int]:
        """Where the bytes from `offset` to `end` lie in block `index`, as (low, high)."""
        base = index * self.block
        return max(offset, base) - base, min(end, base + self.block) - base

    def _expected(self, index: int, size: int) -> int:
        """How many bytes block `index` of an object of `size` bytes has (0: none)."""
        return max(0, min(self.block, size - index * self.block))

    def held_span(
        self, name: str, version: str, offset: int, length: int
    ) -> tuple[int, int] | None:
        """The whole blocks around `length` bytes at `offset` of a version, as (start, end),
        if the cache holds every one of them; else None. No block is read, counted or
        made recent: a reader asks this to size what it reads, since a held block costs
        the same to read whatever part of it is wanted, and a missing one a round trip."""
        if length <= 0 or self._broken:
            return None
        first, last = offset // self.block, (offset + length - 1) // self.block
        keys = [self._key(name, version, index) for index in range(first, last + 1)]
        try:
            db = self._db()
            for batch in _batches(keys):
                marks = ",".join("?" * len(batch))
                (held,) = db.execute(
                    f"SELECT count(*) FROM block WHERE key IN ({marks})", batch
                ).fetchone()
                if held != len(batch):
                    return None
        except sqlite3.Error as e:
            self._failed("reading", e)
            return None
        return first * self.block, (last + 1) * self.block

    def _key(self, name: str, version: str, index: int) -> bytes:
        text = f"{name}\0{version}\0{index}".encode("utf-8", "surrogatepass")
        return hashlib.sha256(text).digest()

    def _path(self, key: bytes) -> tuple[str, str]:
        """The subdirectory and file of the block with `key` (exactly KEY_SIZE bytes)."""
        assert len(key) == KEY_SIZE
        name = key.hex()
        subdir = os.path.join(self._blocks, name[:2])
        return subdir, os.path.join(subdir, name[2:])

    def _get(
        self, name: str, version: str, index: int, low: int, high: int
    ) -> tuple[bytes, int] | None:
        """Bytes `low` to `high` of a block and the object's size, if the block is held
        and checks out. The whole block is read into this thread's buffer and checked
        against its row; only the bytes wanted are copied out (a fresh megabyte costs
        more than the read)."""
        if self._broken:
            return None
        key = self._key(name, version, index)
        try:
            row = (
                self._db()
                .execute("SELECT crc, length, size, used FROM block WHERE key = ?", (key,))
                .fetchone()
            )
        except sqlite3.Error as e:
            self._failed("reading", e)
            return None
        if row is None:
            self._count("misses")
            return None
        crc, length, size, used = row
        if not (
            all(type(value) is int for value in row)
            and 0 <= crc < 1 << 32
            and 0 < length == self._expected(index, size)
        ):
            return self._damaged(name, version, index, key, row)
        subdir, path = self._path(key)
        try:
            self._check_subdir(subdir, create=False)
            fd = open_private(path, os.O_RDONLY | os.O_NONBLOCK)  # no FIFO can hold us
        except FileNotFoundError:  # evicted meanwhile, or a kill left the row alone: a miss
            self._count("misses")
            self._drop(key, row, None)
            return None
        except OSError as e:
            if e.errno != errno.ELOOP:  # ELOOP: a symlink where the block belongs
                self._failed("reading", e)
                return None
            return self._damaged(name, version, index, key, row)
        buffer = self._buffer()
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            read = _read_into(fd, buffer) if regular else -1
        except OSError as e:
            self._failed("reading", e)
            return None
        finally:
            os.close(fd)
        if read != length or crc32c.crc32c(buffer[:read]) != crc:
            return self._damaged(name, version, index, key, row)
        self._count("hits", bytes_read=length)
        now = _now()
        if used < now - int(TOUCH * 1e6):
            with self._lock:
                self._touches[key] = now
        if self._touches and time.monotonic() >= self._touch_due:
            self._write_touches()
        return bytes(buffer[low:high]), size

    def _damaged(
        self, name: str, version: str, index: int, key: bytes, row: tuple[Any, ...]
    ) -> tuple[bytes, int] | None:
        log.warning(
            "disk cache %s: a damaged block of %s (version %s, bytes %d-) was dropped",
            self.directory, name, version, index * self.block,
        )  # fmt: skip
        self._count("dropped")
        self._drop(key, row, self._path(key)[1])
        return None

    def _drop(self, key: bytes, row: tuple[Any, ...], path: str | None) -> None:
        """Delete the row of `key` if it is still `row`, and then unlink `path`."""

        def drop(db: sqlite3.Connection) -> None:
            deleted = db.execute(
                "DELETE FROM block WHERE key = ? AND crc IS ? AND length IS ? AND size IS ?"
                " AND used IS ?",
                (key, *row),
            ).rowcount
            if deleted:
                length = row[1] if type(row[1]) is int else 0
                _set_meta(db, "bytes", max(0, _meta(db, "bytes") - length))
                if path is not None:
                    _unlink(path)

        try:
            self._transaction(drop)
        except sqlite3.Error as e:
            self._failed("dropping a block", e)

    def _buffer(self) -> memoryview:
        """This thread's buffer for one stored block, made once: reused, its pages stay
        mapped. One byte more than a block holds, so a file too long shows. (Scratch, not
        a cache: one block per thread that reads, the daemon's 16 workers and the few
        read-ahead threads.)"""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = memoryview(bytearray(self.block + 1))
        return buffer

    def _write_touches(self) -> None:
        """Write the recency of the blocks hit, in a transaction of its own, if the lock is
        free (else at the next chance: recency is worth no wait)."""
        self._touch_due = time.monotonic() + TOUCH
        try:
            db = self._db()
            db.execute("PRAGMA busy_timeout = 0")
            try:
                self._transaction(self._touch)
            finally:
                db.execute(f"PRAGMA busy_timeout = {int(LOCK_TIMEOUT * 1000)}")
        except sqlite3.Error:
            pass

    def _touch(self, db: sqlite3.Connection) -> None:
        """Within a transaction: write (then forget) the recency of the blocks hit."""
        with self._lock:
            touches, self._touches = self._touches, {}
        try:
            db.executemany(
                "UPDATE block SET used = ? WHERE key = ? AND used < ?",
                [(used, key, used) for key, used in touches.items()],
            )
        except BaseException:
            with self._lock:
                self._touches = touches | self._touches
            raise

    # -- writing -------------------------------------------------------------------------

    def _put(
        self, name: str, version: str, blocks: list[tuple[int, memoryview]], size: int
    ) -> None:
        """Keep fetched `blocks` (index, bytes) of an object of `size` bytes."""
        if not blocks or self._broken or time.monotonic() < self._paused_until:
            return
        placed: list[tuple[bytes, int, int, str]] = []  # key, crc, length, path
        try:
            for index, data in blocks:
                key = self._key(name, version, index)
                subdir, path = self._path(key)
                crc = crc32c.crc32c(data)
                self._place(subdir, path, data)
                placed.append((key, crc, len(data), path))
            self._transaction(lambda db: self._insert(db, placed, size))
        except (OSError, sqlite3.Error) as e:
            for *_, path in placed:  # no row names them
                _unlink(path)
            self._failed("writing", e)
            return
        self._count(bytes_written=sum(length for _, _, length, _ in placed))
        if time.monotonic() >= self._tidy_due:
            self._tidy_due = time.monotonic() + TIDY
            self._try_tidy()

    def _place(self, subdir: str, path: str, data: memoryview) -> None:
        """Write `data` to a temporary file, and rename it to `path`."""
        temporary = os.path.join(self._tmp, secrets.token_hex(16))
        try:
            fd = _open_own(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
            finally:
                os.close(fd)
            self._check_subdir(subdir, create=True)
            os.rename(temporary, path)
        except BaseException:
            _unlink(temporary)
            raise

    def _insert(
        self, db: sqlite3.Connection, placed: list[tuple[bytes, int, int, str]], size: int
    ) -> None:
        """Within a transaction: the rows of blocks just placed, then eviction."""
        now = _now()
        total = _meta(db, "bytes")
        for key, crc, length, _ in placed:
            old = db.execute("SELECT length FROM block WHERE key = ?", (key,)).fetchone()
            if old is not None and type(old[0]) is int:
                total -= old[0]
            db.execute(
                "INSERT OR REPLACE INTO block VALUES (?, ?, ?, ?, ?)", (key, crc, length, size, now)
            )
            total += length
        if self._touches:
            self._touch(db)
        self._evict(db, total)

    def _evict(self, db: sqlite3.Connection, total: int) -> None:
        """Within a transaction: delete the least recently used rows, and unlink their
        files, until the `total` bytes the rows count are within the size; record it."""
        while total > self.size:
            rows = db.execute("SELECT key, length FROM block ORDER BY used LIMIT 64").fetchall()
            if not rows:
                total = 0
                break
            for key, length in rows:
                db.execute("DELETE FROM block WHERE key = ?", (key,))
                total -= length if type(length) is int else 0
                if type(key) is bytes and len(key) == KEY_SIZE:  # else never a path
                    _unlink(self._path(key)[1])
                if total <= self.size:
                    break
        _set_meta(db, "bytes", max(0, total))

    def _check_subdir(self, subdir: str, create: bool) -> None:
        """That a subdirectory of `blocks` is a directory of ours (made if `create`)."""
        if subdir in self._subdirs:
            return
        if create:
            try:
                os.mkdir(subdir, DIR_MODE)
            except FileExistsError:
                pass
            else:
                os.chmod(subdir, DIR_MODE)  # the umask may have taken bits away
        info = os.lstat(subdir)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o22:
            raise OSError(errno.ENOTDIR, "not a directory of the daemon's user alone", subdir)
        self._subdirs.add(subdir)

    # -- failures --------------------------------------------------------------------------

    def _failed(self, doing: str, error: BaseException) -> None:
        """One line per PAUSE about failures; writes pause; a damaged database ends caching."""
        reason = self._reason(error)
        now = time.monotonic()
        if _is_damage(error):
            with self._lock:
                self.stats.failures += 1
                first, self._broken = not self._broken, reason
            if first:
                log.warning(
                    "disk cache %s: %s failed: %s; going on without the disk cache (the next "
                    "mount starts it afresh)",
                    self.directory, doing, reason,
                )  # fmt: skip
                with contextlib.suppress(OSError):
                    os.close(_open_own(os.path.join(self.directory, DAMAGED), os.O_CREAT))
            return
        writing = doing == "writing"
        with self._lock:
            self.stats.failures += 1
            if writing:
                self._paused_until = now + PAUSE
            quiet = now < self._warned_until
            if not quiet:
                self._warned_until = now + PAUSE
        if not quiet:  # one line per failing spell, not one per block
            then = f"no caching for {PAUSE:.0f} s" if writing else "read from the store"
            log.warning("disk cache %s: %s failed: %s; %s", self.directory, doing, reason, then)

    def _reason(self, error: BaseException) -> str:
        """What went wrong, as its errno, SQLite's code or the file system tell it."""
        return _reason(error, self.directory)

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
            stats["used"] = -1 if self._broken else _meta(self._db(), "bytes")
        except sqlite3.Error:
            stats["used"] = -1
        stats["budget"] = self.size
        return stats

    # -- the database ---------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (opened anew after a fork)."""
        local = self._local
        if getattr(local, "generation", None) != (self._generation, os.getpid()):
            if self._closed:
                raise sqlite3.ProgrammingError("the disk cache is closed")
            db = sqlite3.connect(
                f"file:{urllib.parse.quote(self._database)}?mode=rw",  # never made by SQLite
                timeout=LOCK_TIMEOUT,
                isolation_level=None,
                check_same_thread=False,
                uri=True,
            )
            with self._lock:
                self._connections.append(db)
            local.db, local.generation = db, (self._generation, os.getpid())
            db.execute("PRAGMA trusted_schema = OFF")
            db.execute("PRAGMA synchronous = NORMAL")  # WAL: consistent, not durable
            db.execute("PRAGMA cache_size = -512")  # KiB: one per thread
        return local.db  # type: ignore[no-any-return]

    def _transaction(self, body: Callable[[sqlite3.Connection], object]) -> None:
        """Run `body` in a write transaction of this thread's connection."""
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            body(db)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    def _drop_connections(self) -> None:
        """Close every connection; threads open new ones when they next need one."""
        with self._lock:
            connections, self._connections = self._connections, []
            self._generation += 1
        for db in connections:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    def close(self) -> None:
        if self._touches and not self._broken:
            self._write_touches()
        self._closed = True
        self._drop_connections()
        _CACHES.discard(self)

    # -- opening -----------------------------------------------------------------------------

    def _open(self) -> None:
        """Make the layout, check (or create) the database, start afresh if it is
        damaged, and tidy if it is time: one process at a time."""
        with self._opening():
            for directory in (self._blocks, self._tmp):
                self._check_subdir(directory, create=True)
            damage = self._damage()
            if damage:
                log.warning("cache_dir %s: %s; starting the cache afresh", self.directory, damage)
                self._start_afresh()
                damage = self._damage()
                if damage:
                    raise sqlite3.DatabaseError(damage)
            self._try_tidy()

    def _try_tidy(self) -> None:
        try:
            self._tidy()
        except (OSError, sqlite3.Error) as e:
            log.info("disk cache %s: tidying failed: %s", self.directory, self._reason(e))

    @contextlib.contextmanager
    def _opening(self) -> Iterator[None]:
        """Hold the flock of `lock` (another process may be opening the cache)."""
        fd = _open_own(os.path.join(self.directory, LOCK), os.O_RDWR | os.O_CREAT)
        try:
            deadline = time.monotonic() + OPEN_TIMEOUT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError(
                            errno.EBUSY,
                            f"another process has been opening it for {OPEN_TIMEOUT:.0f} s",
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def _damage(self) -> str:
        """Why the database is not ours to use ("" if it is, made now if it was empty)."""
        if os.path.lexists(os.path.join(self.directory, DAMAGED)):
            return "an earlier mount found its database damaged"
        try:
            fd = _open_own(self._database, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"its database {DATABASE} is a symbolic link"
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return f"its database {DATABASE} is not a regular file"
        finally:
            os.close(fd)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISREG(os.lstat(self._database + suffix).st_mode):
                    return f"its database's {DATABASE}{suffix} is not a regular file"
        try:
            found = _schema(self._db())
            if found == (0, 0, set()):
                self._db().execute("PRAGMA journal_mode = WAL")
                self._transaction(_create)
                found = _schema(self._db())
        except sqlite3.Error as e:
            if _is_damage(e):
                return f"its database is damaged ({e})"
            raise
        if found != _SCHEMA:
            return "its database is not one this version of shardfs made (another schema)"
        return ""

    def _start_afresh(self) -> None:
        """Remove our database and our block and temporary files (nothing else)."""
        self._drop_connections()
        for name in (DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm", f"{DATABASE}-journal"):
            _unlink(os.path.join(self.directory, name))
        for path in self._files(self._blocks, _SUBDIR, _BLOCK_NAME):
            _unlink(path)
        for path in self._files(self._tmp, None, _TMP_NAME):
            _unlink(path)
        _unlink(os.path.join(self.directory, DAMAGED))

    def _files(
        self, top: str, subdir: re.Pattern[str] | None, name: re.Pattern[str]
    ) -> Iterator[str]:
        """The entries named like `name` in `top` (in its subdirectories named like
        `subdir`, if given; those that are ours), never following a symlink."""
        if subdir is None:
            directories = [top]
        else:
            directories = []
            with os.scandir(top) as entries:
                for entry in entries:
                    if subdir.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                        try:
                            self._check_subdir(entry.path, create=False)
                        except OSError:
                            continue
                        directories.append(entry.path)
        for directory in directories:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if name.fullmatch(entry.name):
                        yield entry.path

    def _tidy(self) -> None:
        """Once per TIDY seconds (whoever opens then): remove the debris of killed writers
        and of python-diskcache, delete rows that are not well formed, count the bytes
        again and evict down to the size."""
        now = time.time()

        def claim(db: sqlite3.Connection) -> None:
            if 0 <= now - _meta(db, "tidied") < TIDY:
                raise _NotDue
            _set_meta(db, "tidied", int(now))

        try:
            self._transaction(claim)
        except _NotDue:
            return
        self._remove_diskcache()
        old = now - GRACE
        for path in self._files(self._tmp, None, _TMP_NAME):
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_mtime < old:
                    _unlink(path)
        db = self._db()
        by_key = {
            bytes.fromhex(os.path.basename(os.path.dirname(p)) + os.path.basename(p)): p
            for p in self._files(self._blocks, _SUBDIR, _BLOCK_NAME)
        }
        named: set[bytes] = set()
        for batch in _batches(list(by_key)):
            marks = ",".join("?" * len(batch))
            named.update(
                k for (k,) in db.execute(f"SELECT key FROM block WHERE key IN ({marks})", batch)
            )
        for key, path in by_key.items():
            if key not in named:
                with contextlib.suppress(FileNotFoundError):
                    if os.lstat(path).st_mtime < old:
                        _unlink(path)

        def recount(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM block WHERE typeof(key) != 'blob' OR length(key) != ?"
                " OR typeof(crc) != 'integer' OR typeof(length) != 'integer'"
                " OR typeof(size) != 'integer' OR typeof(used) != 'integer'",
                (KEY_SIZE,),
            )
            (total,) = db.execute("SELECT coalesce(sum(length), 0) FROM block").fetchone()
            self._evict(db, total)

        self._transaction(recount)

    def _remove_diskcache(self) -> None:
        """Remove the cache python-diskcache kept here for earlier versions: its database
        and its value files `XX/YY/<28 hex>.val` (nothing else)."""
        if not any(os.path.lexists(os.path.join(self.directory, n)) for n in _OLD_DATABASE):
            return
        for name in _OLD_DATABASE:
            _unlink(os.path.join(self.directory, name))
        removed = 0
        for top in _fanout(self.directory):
            for sub in _fanout(top):
                with os.scandir(sub) as entries:
                    values = [e.path for e in entries if _OLD_VALUE.fullmatch(e.name)]
                for path in values:
                    removed += _unlink(path)
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
            with contextlib.suppress(OSError):
                os.rmdir(top)
        log.info(
            "disk cache %s: removed the cache of an earlier shardfs (python-diskcache: its "
            "database and %d blocks)",
            self.directory, removed,
        )  # fmt: skip


class _NotDue(Exception):
    """Tidying is not due."""


#: Open caches, whose connections are closed before a fork (see `_before_fork`).
_CACHES: weakref.WeakSet[DiskCache] = weakref.WeakSet()


def _before_fork() -> None:
    """SQLite connections must not cross a fork: a detaching `shardfs mount` opens the
    cache (and reads through it) before it forks the daemon. Close them; each thread
    opens a new one when it next needs it."""
    for cache in list(_CACHES):
        cache._drop_connections()


def _after_fork_in_child() -> None:
    """A lock another thread held at the fork would stay held in the child."""
    for cache in list(_CACHES):
        cache._lock = threading.Lock()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _create(db: sqlite3.Connection) -> None:
    """Within a transaction: our schema, unless another process made it meanwhile."""
    if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        return
    for statement in SCHEMA:
        db.execute(statement)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _schema(db: sqlite3.Connection) -> tuple[int, int, set[tuple[Any, ...]]]:
    """(application id, schema version, what sqlite_master lists) of a database."""
    (application,) = db.execute("PRAGMA application_id").fetchone()
    (version,) = db.execute("PRAGMA user_version").fetchone()
    entries = set(db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    return application, version, entries


def _ours() -> tuple[int, int, set[tuple[Any, ...]]]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("BEGIN")
    _create(db)
    db.execute("COMMIT")
    try:
        return _schema(db)
    finally:
        db.close()


#: What `_schema` finds in a database of ours.
_SCHEMA = _ours()


def _meta(db: sqlite3.Connection, name: str) -> int:
    row = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    return row[0] if row is not None and type(row[0]) is int else 0


def _set_meta(db: sqlite3.Connection, name: str, value: int) -> None:
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))


def _now() -> int:
    """The wall clock in microseconds: the recency of blocks, shared by processes."""
    return time.time_ns() // 1000


def _open_own(path: str, flags: int) -> int:
    """`open_private`, and mode 0600 whatever the umask (SQLite gives the database's WAL
    and shared memory files the database's mode)."""
    fd = open_private(path, flags)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_into(fd: int, buffer: memoryview) -> int:
    """Read from `fd` until its end or `buffer` is full; how many bytes."""
    total = 0
    while total < len(buffer):
        n = os.readv(fd, [buffer[total:]])
        if not n:
            break
        total += n
    return total


def _unlink(path: str) -> bool:
    """Remove a file of ours if it is there (a directory in its place stays)."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def _batches(keys: list[bytes], size: int = 500) -> Iterator[list[bytes]]:
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def _is_damage(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None) or 0
    return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _reason(error: BaseException, directory: str) -> str:
    """What went wrong, truthfully: the file system is full or read-only (from the errno,
    SQLite's error code, or statvfs when neither says), the database is locked or
    damaged, or the error as it is."""
    if isinstance(error, OSError):
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return _full(directory, error.errno)
        if error.errno == errno.EROFS:
            return "the file system is read-only"
        detail = error.strerror or str(error)
        if error.filename:
            detail = f"{error.filename}: {detail}"
    elif isinstance(error, sqlite3.Error):
        code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
        if code == sqlite3.SQLITE_FULL:
            return _full(directory, errno.ENOSPC)
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return f"its database was locked by another process for over {LOCK_TIMEOUT:.0f} s"
        if _is_damage(error):
            return f"its database is damaged ({error})"
        detail = f"its database: {error}"
    else:
        detail = str(error) or type(error).__name__
    try:
        fs = os.statvfs(directory)
    except OSError:
        return detail
    if fs.f_flag & os.ST_RDONLY:
        return "the file system is read-only"
    if fs.f_bavail == 0 or fs.f_favail == 0:
        return _full(directory, errno.ENOSPC)
    return detail


def _full(directory: str, code: int) -> str:
    if code == errno.EDQUOT:
        return "the disk quota is used up"
    with contextlib.suppress(OSError):
        fs = os.statvfs(directory)
        if fs.f_favail == 0 and fs.f_bavail > 0:
            return "the file system has no free inodes"
    return "the file system is full"


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted `indexes`, as (start, stop) pairs."""
    runs: list[tuple[int, int]] = []
    for index in indexes:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def _fanout(directory: str) -> list[str]:
    """The subdirectories of `directory` named as diskcache named its fan-out (`XX`), not
    followed through symlinks."""
    with os.scandir(directory) as entries:
        return [
            e.path for e in entries if _SUBDIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        ]
