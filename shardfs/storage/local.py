"""A local directory as the source.

Every name below it is opened, stat'ed and listed through its `beneath.Tree`, resolved
beneath the root with no symlink followed (whoever writes the source can plant one
anywhere); a key's path is only ever joined for messages and for the native front's
checks of a version it holds open (`stat_path`).

Writes are crash-safe: `put` renames a durable temp file over the object,
`append` writes in place under a journal entry that `recover` uses to keep a
whole tail or cut a torn one (see `shardfs.storage.journal`). Writers of one
key serialize on a lock in the private `.shardfs/` area, which readers never
see, and which `tidy` removes once it is not needed (the end of a read-write
mount, of `shardfs fsck` and of `shardfs compact` call it).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import logging
import operator
import os
import secrets
import stat as stat_mod
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardfs.primitives.blocking import WouldBlock, check_may_block, may_block
from shardfs.primitives.errors import (
    CorruptData,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
)
from shardfs.storage import journal
from shardfs.storage.base import ABSENT, Access, Entry, Pin, RequestCounts, Stat, Storage
from shardfs.storage.beneath import Tree
from shardfs.storage.descriptors import Descriptor, DescriptorPool
from shardfs.storage.watch import Token, Watches
from shardfs.storage.writers import Identity, UnsafeSource, acting_as, writer_of

log = logging.getLogger("shardfs")

# Temp files of `put` next to the key when the private area is on another file system.
_FALLBACK_TEMP = ".shardfs-tmp."
#: Checked paths of keys kept (see `LocalStorage._path`); all are dropped when full.
_PATHS_KEPT = 4096
#: Directories of up to NAMES_DIR_SIZE entries whose names are kept, for listings that
#: need no worker thread (see `LocalStorage._keep_names`); all are dropped when full.
NAMES_KEPT = 1024
NAMES_DIR_SIZE = 256
#: How old a directory's last change must be for its names to be kept (ns).
NAMES_SETTLED = 2_000_000_000


#: What opening a name below the root finds when the source holds nothing there: no such
#: name, a file on the way, or a symlink (not part of a source: never followed).
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _dir_version(st: os.stat_result) -> tuple[int, ...]:
    """What changes whenever an entry of a directory is added, removed or renamed."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _is_private(key: str) -> bool:
    """Whether `key` is in the private area or a fallback temp file, which readers must not see."""
    if journal.PRIVATE not in key and _FALLBACK_TEMP not in key:
        return False  # almost every key: asked on every stat and read
    parts = [p for p in key.split("/") if p not in ("", ".")]
    return bool(parts) and (parts[0] == journal.PRIVATE or parts[-1].startswith(_FALLBACK_TEMP))


def _stat_of(st: os.stat_result) -> Stat:
    is_dir = stat_mod.S_ISDIR(st.st_mode)
    return Stat(is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns, _version(st), _access(st))


#: The version of a local file as its stat tells (its inode, size and times), taken on every
#: lookup and read of a chunk: an `attrgetter`, which runs no Python frame.
_version: Callable[[os.stat_result], tuple[int, int, int, int, int]] = operator.attrgetter(
    "st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns"
)

#: Its mode, owner and group (`Stat.access`): from the stat its version comes from.
_access: Callable[[os.stat_result], Access] = operator.attrgetter("st_mode", "st_uid", "st_gid")


class _FilePin(Pin):
    """A local file's inode, held open: replaced by a rename or unlinked, it stays
    readable, so an open chunk keeps the bytes it opened; changed in place (an append,
    a rewrite, also after its unlink: see `_same_content`), it is a new version. Pins of
    one version share its descriptor, which the store's budget may close between reads
    (`shardfs.storage.descriptors`)."""

    in_place = True
    keeps_version = True

    def __init__(self, storage: LocalStorage, key: str, stat: Stat) -> None:
        super().__init__(storage, key, stat)
        self._descriptor: Descriptor | None = None
        #: the write watch that vouches for the version once unlinked (`_same_content`)
        self._watch: Token | None = None
        self._watches = storage._watches
        self._pool = storage._descriptors
        #: the range last given to `advise`
        self._advised = (0, 0)
        self._descriptor = self._pool.share(
            (key, stat.version),
            storage.describe(key),
            lambda: _open_version(storage, key, stat),
            lambda: storage._tree.open_now(key, os.O_RDONLY),
        )
        self._watch = self._watched(stat)

    def _held(self) -> Descriptor:
        assert self._descriptor is not None, "a read of a closed pin"
        return self._descriptor

    def _watched(self, stat: Stat) -> Token | None:
        """A write watch taken before a stat of the file that finds it exactly version
        `stat` (None otherwise: a change since `stat` was taken, such as an in-place
        rewrite with the mtime set back, may be in it, and nothing vouches for it)."""
        try:
            with self._fd() as fd:
                st, watch = self._watches.watch(fd)
        except SourceChanged:
            return None
        if watch is not None and _version(st) != stat.version:
            self._watches.release(watch)
            watch = None
        return watch

    def _same_content(self, st: os.stat_result) -> bool:
        """Whether the file `st` describes still holds the bytes of the version pinned.
        An inode unlinked or renamed over gets a new ctime but keeps its bytes; but a
        descriptor opened before can still write to it, and a rewrite in place at the
        same size with the mtime set back, then an unlink, changes the same fields. So
        only if no write to it was seen since its version was verified."""
        version = _version(st)
        if version == self.stat.version:
            return True
        if st.st_nlink != 0 or version[:4] != self.stat.version[:4]:  # type: ignore[index]
            return False
        return self._watch is not None and self._watches.unchanged(self._watch)

    def read(self, offset: int, length: int) -> bytes:
        """`Pin.read`. A file that grew since is another version too: an appender leaves
        the bytes before the old end as they were, but nothing tells an append from a
        rewrite in place before it (the model-based test found one: a chunk shown, its
        shard rewritten in place at the same size, then appended to)."""
        descriptor = self._held()
        fd = self._pool.acquire(descriptor)  # not closed for the budget until released
        try:
            data = os.pread(fd, length, offset) if may_block() else _read_cached(fd, offset, length)
            st = os.fstat(fd)
        except OSError as e:
            code = _errno_name(e)
            raise StorageError(f"{self.storage.describe(self.key)}: read failed ({code})") from None
        finally:
            self._pool.release(descriptor)
        self.storage.counts.add("read", read=len(data))
        if _version(st) != self.stat.version and not self._same_content(st):
            # Checked after the read, so that a change during it is seen too.
            raise SourceChanged(f"{self.storage.describe(self.key)} changed")
        if len(data) != length:
            raise CorruptData(
                f"{self.storage.describe(self.key)}: wanted {length} bytes at {offset}, "
                f"file has only {len(data)}"
            )
        return data

    def read_tail(self, length: int) -> bytes:
        return self.read(self.stat.size - length, length)

    def current(self) -> Stat | None:
        descriptor = self._held()
        try:
            fd = self._pool.acquire(descriptor)
        except SourceChanged as e:
            raise StorageError(str(e)) from None  # whether it is gone cannot be told
        try:
            return _stat_of(os.fstat(fd))
        finally:
            self._pool.release(descriptor)

    def follow(self, stat: Stat) -> None:
        """`Pin.follow`, with a write watch taken afresh to vouch for `stat` (the change
        followed, an append, was itself a write)."""
        super().follow(stat)
        if self._watch is not None:
            self._watches.release(self._watch)
            self._watch = None
        self._watch = self._watched(stat)

    @contextmanager
    def _fd(self) -> Iterator[int]:
        """The version's descriptor, kept open for the budget while in use (SourceChanged
        if the budget closed it and the file changed since)."""
        descriptor = self._held()
        fd = self._pool.acquire(descriptor)
        try:
            yield fd
        finally:
            self._pool.release(descriptor)

    def duplicate(self) -> int | None:
        try:
            with self._fd() as fd:
                if _version(os.fstat(fd)) != self.stat.version:
                    return None  # changed in place: Python decides whether it still holds it
                return os.dup(fd)
        except (SourceChanged, OSError):
            return None

    def clone(self) -> _FilePin:
        descriptor = self._held()
        other = copy.copy(self)
        other._advised = (0, 0)
        other._watch = None if self._watch is None else self._watches.share(self._watch)
        self._pool.again(descriptor)
        return other

    def advise(self, offset: int, length: int) -> None:
        start, end = self._advised
        if start <= offset and offset + length <= end:
            return  # asked for already
        self._advised = (offset, offset + length)
        with contextlib.suppress(SourceChanged, OSError), self._fd() as fd:  # only a hint
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        if self._watch is not None:
            self._watches.release(self._watch)
            self._watch = None
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            self._pool.unshare(descriptor)

    def __del__(self) -> None:
        """A reader dropped without `close` must not leak its descriptor, nor its watch
        (both let go without a lock, which this thread may hold: see `Watches.drop` and
        `DescriptorPool.dropped`)."""
        watch, self._watch = getattr(self, "_watch", None), None
        if watch is not None:
            self._watches.drop(watch)
        descriptor, self._descriptor = getattr(self, "_descriptor", None), None
        if descriptor is not None:
            self._pool.dropped(descriptor)


def _open_version(storage: LocalStorage, key: str, stat: Stat) -> int:
    """`key` opened, if it is still the file of version `stat` (the same inode, as big
    or bigger: an append since leaves the bytes before it); else SourceChanged."""
    try:
        fd = storage._tree.open_now(key, os.O_RDONLY)
    except OSError as e:
        if e.errno in _ABSENT:
            raise SourceChanged(f"{storage.describe(key)} was removed") from None
        raise StorageError(f"{storage.describe(key)}: {e.strerror}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != stat.version[:2] or st.st_size < stat.size:  # type: ignore[index]
        os.close(fd)
        raise SourceChanged(f"{storage.describe(key)} was replaced")
    return fd


class LocalStorage(Storage):
    """Objects are the regular files below `root`; other file types are ignored."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.counts = RequestCounts()
        #: Where everything is written: names resolved beneath the root (see `beneath`).
        self._tree = Tree(str(self.root))
        self._journal = journal.Journal(self.root, self._tree)
        #: Who writes (see `check_writable`): not yet asked, an identity, or the refusal.
        self._writer: Identity | UnsafeSource | bool | None = False
        self._paths: dict[str, str] = {}
        self._names: dict[str, tuple[tuple[int, ...], list[str]]] = {}
        #: the descriptors of its pins, shared per version, within the process's budget
        self._descriptors = DescriptorPool(_version)
        #: write watches of the inodes its pins hold (see `_FilePin._same_content`)
        self._watches = Watches()

    def _path(self, key: str) -> str:
        """The path of `key` (NotFound for a key that could lead out or is private): for
        messages only, never opened (see the module's docstring)."""
        # Every request stats a few keys (a metadata document, a shard), the same ones
        # again and again: each is checked and joined once.
        path = self._paths.get(key)
        if path is None:
            if key.startswith("/") or ".." in key.split("/") or _is_private(key):
                raise NotFound(key)
            path = os.path.join(self.root, key) if key else str(self.root)
            if len(self._paths) >= _PATHS_KEPT:
                self._paths.clear()
            self._paths[key] = path
        return path

    def _stat(self, key: str) -> Stat | None:
        st = self._lstat(key)
        if st is None or not (stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode)):
            return None
        return _stat_of(st)

    def _listed_stat(self, key: str) -> Stat | None:
        return self._stat(key)  # (an entry added, removed or renamed changes its times)

    def version(self, key: str) -> Hashable | None:
        st = self._lstat(key)
        return _version(st) if st is not None and stat_mod.S_ISREG(st.st_mode) else None

    def _lstat(self, key: str) -> os.stat_result | None:
        """What is at `key` (None: nothing). Symlinks are not part of the source."""
        if key not in self._paths:  # a key joined before was checked then
            if _is_private(key):
                return None
            self._path(key)
        self.counts.add("stat")
        try:
            return self._tree.stat_now(key)
        except OSError as e:
            if e.errno in _ABSENT:
                return None
            raise StorageError(f"{self.describe(key)}: {e.strerror}") from None

    def _list(self, key: str) -> list[Entry]:
        self.counts.add("list")
        known = self._names.get(key)
        if known is not None:
            entries = self._list_known(key, *known)
            if entries is not None:
                return entries
        check_may_block()  # a cold listing of a big directory can take long
        self._path(key)
        try:
            fd = self._tree.open_now(key, os.O_RDONLY | os.O_DIRECTORY)
        except NotADirectoryError:
            raise NotADirectory(key) from None
        except OSError as e:
            if e.errno in _ABSENT:
                raise NotFound(key) from None
            raise StorageError(f"{self.describe(key)}: {e.strerror}") from None
        try:
            before = os.fstat(fd)
            with os.scandir(fd) as it:
                entries = []
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while listing
                    if _is_private(f"{key}/{entry.name}"):
                        continue
                    if stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode):
                        entries.append(Entry(entry.name, _stat_of(st)))
            self._keep_names(key, before, entries)
            return entries
        except OSError as e:
            raise StorageError(f"{self.describe(key)}: {e.strerror}") from None
        finally:
            os.close(fd)

    def _keep_names(self, key: str, before: os.stat_result, entries: list[Entry]) -> None:
        """Keep the names of a small directory listed, to list it again without a worker
        thread (see `_list_known`); only when its mtime is old enough that any change
        after the listing must give it another (timestamps are coarse: two changes
        within one clock tick can leave the same mtime)."""
        if len(entries) > NAMES_DIR_SIZE or time.time_ns() - before.st_ctime_ns < NAMES_SETTLED:
            return
        if len(self._names) >= NAMES_KEPT:
            self._names.clear()
        self._names[key] = (_dir_version(before), [entry.name for entry in entries])

    def _list_known(
        self, key: str, version: tuple[int, ...], names: list[str]
    ) -> list[Entry] | None:
        """The entries of a directory whose names are known, if it has not changed since
        they were taken: each stated afresh (a shard appended to in place changes its
        stat, not the directory's). None if the directory changed: list it again."""
        try:
            fd = self._tree.open_now(key, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None  # gone: listing it again says so
        try:
            if _dir_version(os.fstat(fd)) != version:
                return None
            entries = []
            for name in names:  # one name each: stat'ed in the directory opened
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                entries.append(Entry(name, _stat_of(st)))
        except OSError:
            return None  # a name went: the directory changed under us
        finally:
            os.close(fd)
        return entries

    def _read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        self._path(key)
        try:
            fd = self._tree.open_now(key, os.O_RDONLY)
        except OSError as e:
            if e.errno not in _ABSENT:
                raise StorageError(f"{self.describe(key)}: {e.strerror}") from None
            if version is not None:
                raise SourceChanged(f"{self.describe(key)} was removed") from None
            raise NotFound(key) from None
        try:
            if version is not None and _stat_of(os.fstat(fd)).version != version:
                raise SourceChanged(f"{self.describe(key)} changed")
            data = os.pread(fd, length, offset) if may_block() else _read_cached(fd, offset, length)
        except OSError as e:
            code = _errno_name(e)
            raise StorageError(f"{self.describe(key)}: read failed ({code})") from None
        finally:
            os.close(fd)
        self.counts.add("read", read=len(data))
        if len(data) != length:
            raise CorruptData(
                f"{self.describe(key)}: wanted {length} bytes at {offset}, file has only {len(data)}"
            )
        return data

    def _pin(self, key: str, stat: Stat) -> Pin:
        return _FilePin(self, key, stat)

    def stats(self) -> dict[str, Any]:
        """Requests and bytes (`Storage.stats`), and the descriptors its pins hold."""
        return {**self.counts.snapshot(), "descriptors": self._descriptors.snapshot()}

    def descriptor_budget(self) -> int:
        return self._descriptors.limit()

    def reserve_descriptors(self, count: int) -> int:
        return self._descriptors.reserve(count)

    def stat_path(self, key: str) -> str | None:
        try:
            return self._path(key)
        except NotFound:
            return None

    def append_in_progress(self, key: str, stat: Stat) -> int | None:
        try:
            entry = self._journal.load(journal.entry_name(key))
        except (OSError, ValueError):
            return None  # no journal, or an entry recovery will report
        if entry is None or not entry.applies_to(stat.version):
            return None
        return entry.old_size if entry.old_size <= stat.size else None

    def describe(self, key: str) -> str:
        return self._path(key)

    def check_writable(self) -> None:
        """UnsafeSource (one line saying why and what to do) if root must not write this
        source; else decide whose rights writes run with (see `shardfs.storage.writers`).
        Every write asks this first; front ends ask it early, to refuse before any work."""
        if self._writer is False:
            try:
                self._writer = writer_of(self._tree)
            except UnsafeSource as e:
                self._writer = e
        if isinstance(self._writer, UnsafeSource):
            raise UnsafeSource(str(self._writer))

    @contextmanager
    def _as_writer(self) -> Iterator[None]:
        """Run the block's file-system calls with the rights writes of this source have."""
        self.check_writable()
        assert not isinstance(self._writer, bool | UnsafeSource)
        with acting_as(self._writer):
            yield

    @contextmanager
    def _writing(self, key: str) -> Iterator[str]:
        """Hold `key`'s lock with any append a crashed writer left on it settled; yields
        the key's name below the root (checked by `_path`) and maps OS errors to
        StorageError."""
        check_may_block()
        self._path(key)
        try:
            with self._as_writer(), self._journal.locked(key):
                self._settle_before_write(key)
                yield key
        except OSError as e:
            raise self._error(key, e) from None

    def put(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        with self._writing(key) as rel:
            self.counts.add("put", written=sum(memoryview(p).nbytes for p in parts))
            self._journal.sync()
            self._expect(key, self._version(key), expect)
            journal.makedirs_durably(self._tree, os.path.dirname(rel))
            views = journal.byte_views(parts)
            try:
                return _rename_into_place(self._tree, *self._journal.create_temp(key), rel, views)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
            # The key's directory is on another file system: a temp file next to it
            # (which recover() cannot find if we crash, but readers never see).
            tmp = os.path.join(os.path.dirname(rel), _FALLBACK_TEMP + secrets.token_hex(8))
            fd = self._tree.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            return _rename_into_place(self._tree, fd, tmp, rel, views)

    def append(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        with self._writing(key) as rel:
            self._expect(key, self._version(key), expect)
            if expect is ABSENT:
                raise NotFound(key)
            self.counts.add("append", written=sum(memoryview(p).nbytes for p in parts))
            fd = self._tree.open(rel, os.O_WRONLY | os.O_NONBLOCK)
            try:
                return self._append_locked(key, fd, journal.byte_views(parts), expect)
            finally:
                os.close(fd)

    def _append_locked(self, key: str, fd: int, views: list[memoryview], expect: Hashable) -> Stat:
        """The append protocol proper; the caller holds the key's lock and has it open as `fd`."""
        st = os.fstat(fd)
        self._expect(key, _stat_of(st).version, expect)  # the file opened is the one checked
        size = sum(v.nbytes for v in views)
        if not size:
            return _stat_of(st)
        entry = journal.JournalEntry(
            key, st.st_size, st.st_size + size, journal.crc_of(views), (st.st_dev, st.st_ino)
        )
        self._journal.write(entry)
        try:
            journal.write_all(fd, views, entry.old_size)
            os.fsync(fd)
        except OSError:
            # Undo now rather than at the next recovery: even a tail that reads back whole is
            # not known to be durable after a failed fsync. If this fails too, the entry stays.
            try:
                os.ftruncate(fd, entry.old_size)
                os.fsync(fd)
                self._journal.discard(journal.entry_name(key))
            except OSError:
                log.warning("%s: could not undo a failed append; recovery will", self.describe(key))
            raise
        self._journal.discard(journal.entry_name(key))
        return _stat_of(os.fstat(fd))

    def delete(self, key: str, expect: Hashable) -> None:
        with self._writing(key) as rel:
            self.counts.add("delete")
            self._journal.sync()
            current = self._version(key)
            self._expect(key, current, expect)
            if current is ABSENT:
                raise NotFound(key)
            self._tree.unlink(rel)
            journal.fsync_dir(self._tree, os.path.dirname(rel))

    def makedirs(self, key: str) -> None:
        check_may_block()
        self._path(key)
        try:
            with self._as_writer():
                journal.makedirs_durably(self._tree, key)
        except OSError as e:
            raise self._error(key, e) from None

    def recover(self) -> list[str]:
        check_may_block()
        try:
            with self._as_writer():
                return self._recover()
        except OSError as e:  # taking the writer's identity failed
            raise StorageError(f"{self.root}: {e.strerror or e}") from None

    def _recover(self) -> list[str]:
        try:
            self._journal.clear_planted()
        except OSError as e:
            raise StorageError(f"{self._journal.area}: {e.strerror}") from None
        if not self._journal.exists():
            return []  # nothing was ever written through shardfs: leave no trace
        lines = [line for name in self._journal_names() if (line := self._recover_entry(name))]
        try:
            removed = self._journal.sweep_temps()
        except OSError as e:
            raise StorageError(f"{self._journal.temps}: {e.strerror}") from None
        if removed:
            lines.append(f"{self._journal.temps}: removed {removed} temp files of crashed writers")
        return lines

    def settle(self, key: str) -> str:
        """Settle by hand the unfinished append of `key` that recovery leaves to a person
        (`journal.Unsettled`): the file at `key` is taken to be the one appended to, and
        a tail that verifies is kept, any other cut. Returns the line saying what was done."""
        check_may_block()
        self._path(key)
        try:
            with self._as_writer(), self._journal.locked(key):
                try:
                    entry = self._journal.load(journal.entry_name(key))
                except ValueError as e:
                    return self._discard_malformed(journal.entry_name(key), e)
                if entry is None:
                    return f"{self.describe(key)}: no unfinished append to settle"
                return self._journal.settle(entry, key, self.describe(key), by_hand=True)
        except OSError as e:
            raise self._error(key, e) from None

    def tidy(self) -> None:
        check_may_block()
        try:
            with self._as_writer():
                why = self._journal.tidy()
        except OSError as e:
            raise StorageError(f"{self._journal.area}: {e.strerror or e}") from None
        if why is None:
            log.debug("%s: no %s left", self.root, journal.PRIVATE)
        else:
            log.info("%s stays: %s", self._journal.area, why)

    def _recover_entry(self, name: str) -> str | None:
        """Settle one entry under its key's lock, so a live writer finishes first."""
        try:
            entry = self._journal.load(name)
            if entry is None:
                return None  # its writer finished
            self._path(entry.key)
        except (ValueError, NotFound) as e:
            return self._discard_malformed(name, e)
        except OSError as e:
            raise StorageError(f"{self._journal.entry_path(name)}: {e.strerror}") from None
        try:
            with self._journal.locked(entry.key):
                return self._settle(entry.key)
        except OSError as e:
            raise self._error(entry.key, e) from None

    def pending_recovery(self) -> list[str]:
        check_may_block()
        keys = set()
        for name in self._journal_names():
            try:
                entry = self._journal.load(name)
            except ValueError:
                continue  # names no key; recover() removes and reports it
            except OSError as e:
                raise StorageError(f"{self._journal.entry_path(name)}: {e.strerror}") from None
            if entry is not None:
                keys.add(entry.key)
        return sorted(keys)

    def _journal_names(self) -> list[str]:
        try:
            return self._journal.names()
        except OSError as e:
            raise StorageError(f"{self._journal.entries}: {e.strerror}") from None

    def _settle_before_write(self, key: str) -> None:
        """Settle what a crashed appender of `key` left, or it would later cut the new content."""
        if line := self._settle(key):
            log.warning("%s", line)

    def _settle(self, key: str) -> str | None:
        """Settle the entry a crashed appender of `key` left, if any; returns the log line.

        The caller holds `key`'s lock, so no live writer is mid-append.
        """
        name = journal.entry_name(key)
        try:
            entry = self._journal.load(name)
        except ValueError as e:
            return self._discard_malformed(name, e)
        return None if entry is None else self._journal.settle(entry, key, self.describe(key))

    def _discard_malformed(self, name: str, why: Exception) -> str:
        """Drop an entry that cannot be settled (it does not say what to undo); returns the log line."""
        self._journal.discard(name)
        return f"{self._journal.entry_path(name)}: removed a malformed journal entry ({why})"

    def _version(self, key: str) -> Hashable:
        """The version of the object at `key`, or ABSENT; a directory or special file is an error."""
        try:
            st = self._tree.lstat(key)
        except (FileNotFoundError, NotADirectoryError):
            return ABSENT
        if not stat_mod.S_ISREG(st.st_mode):
            raise StorageError(f"{self.describe(key)}: not a regular file")
        return _stat_of(st).version

    def _expect(self, key: str, current: Hashable, expect: Hashable) -> None:
        if current == expect:
            return
        if expect is ABSENT:
            what = "exists"
        elif current is ABSENT:
            what = "was removed"
        else:
            what = "changed"
        raise SourceChanged(f"{self.describe(key)} {what} since the version this write is based on")

    def _error(self, key: str, e: OSError) -> StorageError:
        path = self._path(key)
        where = f" ({e.filename})" if e.filename not in (None, path) else ""
        return StorageError(f"{self.describe(key)}: {e.strerror or e}{where}")


def _rename_into_place(tree: Tree, fd: int, tmp: str, rel: str, views: list[memoryview]) -> Stat:
    """Fill temp file `tmp` (open as `fd`), make it durable and rename it to `rel`, both
    names below `tree`.

    Closes `fd`; removes `tmp` unless it was renamed.
    """
    try:
        try:
            journal.write_all(fd, views, 0)
            _keep_access(fd, tree, rel)
            os.fsync(fd)
            tree.rename(tmp, rel)
        except BaseException:
            journal.remove_quietly(tree, tmp)
            raise
        journal.fsync_dir(tree, os.path.dirname(rel))
        return _stat_of(os.fstat(fd))  # after the rename, which changes the ctime
    finally:
        os.close(fd)


def _keep_access(fd: int, tree: Tree, rel: str) -> None:
    """Give the new version (open as `fd`) the mode, owner and group of the file at `rel`
    (below `tree`) it replaces: the mount shows them and other users' access follows them, so a rewrite
    must not open a private shard to everyone (nor take it from its owner, where the
    daemon may give it back: as root, or as a member of its group)."""
    try:
        old = tree.lstat(rel)
    except (FileNotFoundError, NotADirectoryError):
        return  # a new file: the umask's mode
    if not stat_mod.S_ISREG(old.st_mode):
        return
    new = os.fstat(fd)
    if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid):
        uid = old.st_uid if os.geteuid() == 0 else -1  # only root gives files away
        with contextlib.suppress(PermissionError):  # not a member of its group
            os.fchown(fd, uid, old.st_gid)
    os.fchmod(fd, stat_mod.S_IMODE(old.st_mode))  # after fchown, which clears set-id bits


def _errno_name(e: OSError) -> str:
    """The name of `e`'s errno, for a message ("?" if it has none)."""
    return "?" if e.errno is None else errno.errorcode.get(e.errno, "?")


def _read_cached(fd: int, offset: int, length: int) -> bytes:
    """Read only from the page cache (RWF_NOWAIT); WouldBlock if the disk is needed."""
    buf = bytearray(length)
    try:
        got = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except (BlockingIOError, InterruptedError):
        raise WouldBlock from None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without RWF_NOWAIT
            raise WouldBlock from None
        raise
    if got != length:  # partly cached, or a short file: the blocking read tells which
        raise WouldBlock
    return bytes(buf)
