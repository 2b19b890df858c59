"""The private area of a local source: per-key locks, the append journal, temp files.

Why a journal: appending in place is what makes growing a big object cheap,
but a crash in the middle leaves a torn tail that no rename can undo. So an
appender first records durably what it is about to do (old size, new size,
checksum of the tail); recovery then keeps a tail that verifies and cuts any
other back to the old size.

Layout below the source root (the storage hides it from readers):

    .shardfs/lock                 one-byte OFD locks, one offset per key (hashed)
    .shardfs/journal/<sha1(key)>  {"key": str, "old_size": int, "new_size": int, "crc32c": int,
                                   "dev": int, "ino": int}
    .shardfs/tmp/<offset>.<hex>   files being written; <offset> is the lock their writer holds

Whoever can write the source can write here too, so nothing in the area is
trusted as a path: every name is resolved beneath the source root with no
symlink followed (`shardfs.storage.beneath`), and recovery acts only on the
regular file whose device and inode the entry names (see `Journal.settle`).

Linux-only: open-file-description locks are what make threads of one process
exclude each other as well as other processes.

The area exists only while it is needed: writers make it, and `Journal.tidy`
removes it again once nothing is in it and nobody holds a lock (at the end
of a read-write mount, of fsck and compact), so a source that shardfs wrote
to looks as if written by anything else. Removing a lock file that other
processes have open is what needs care: a lock taken on a file that is no
longer the one the path names excludes nobody. So

* tidy takes a lock on the whole lock file without waiting (it gets it only
  if no key is locked), removes `journal/` and `tmp/` if empty, unlinks the
  lock file while still holding that lock, and only then removes `.shardfs/`;
* every lock taker, once it has its lock, checks that the path still names
  the file it locked, else it drops that lock and starts over on the file
  that is there now (making the area again if it is gone); only then does
  it make `journal/` and `tmp/`, which a tidy thus never removes under it.

A lock taken on the file the path named at that moment excludes every other
such lock on that key: the file is unlinked only under a lock on all of it,
so whoever verified a lock on it had released that lock before the unlink,
and everyone who locks it afterwards finds it unlinked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import stat
import struct
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from shardfs.formats import jsondoc
from shardfs.storage.beneath import Tree, components

log = logging.getLogger("shardfs")

PRIVATE = ".shardfs"
#: The area and what is in it, as names below the source root.
AREA, LOCK, ENTRIES, TEMPS = PRIVATE, f"{PRIVATE}/lock", f"{PRIVATE}/journal", f"{PRIVATE}/tmp"
#: The largest journal entry read (a key of PATH_MAX bytes, escaped, fits many times over).
MAX_ENTRY = 64 << 10
# `struct flock` on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
_FLOCK = struct.Struct("hhqqi4x")
_IOV_MAX = os.sysconf("SC_IOV_MAX")
_TEMP_NAME = re.compile(r"(\d+)\.[0-9a-f]+", re.ASCII)
_CHUNK = 1 << 20


def lock_offset(key: str) -> int:
    """The byte of the lock file that guards `key`; a collision only serializes two keys."""
    return crc32c.crc32c(os.fsencode(key)) % 2**31


def entry_name(key: str) -> str:
    """A fixed-length file name for `key`'s journal entry, whatever the key looks like."""
    return hashlib.sha1(os.fsencode(key), usedforsecurity=False).hexdigest()


def byte_views(parts: Sequence[bytes | memoryview]) -> list[memoryview]:
    """Flat byte views of the non-empty parts (a memoryview may have wider items)."""
    return [v for p in parts if (v := memoryview(p).cast("B")).nbytes]


def write_all(fd: int, views: Sequence[memoryview], offset: int) -> None:
    """pwritev `views` at `offset`, looping because a write may be short."""
    pending = list(views)
    first = 0
    while first < len(pending):
        written = os.pwritev(fd, pending[first : first + _IOV_MAX], offset)
        if written == 0:  # cannot happen for regular files; guards against a silent endless loop
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        offset += written
        while first < len(pending) and written >= pending[first].nbytes:
            written -= pending[first].nbytes
            first += 1
        if written:
            pending[first] = pending[first][written:]


def fsync_dir(tree: Tree, rel: str) -> None:
    """Make the entries of directory `rel` of `tree` (creations, renames, removals) durable."""
    tree.fsync_dir(rel)


def makedirs_durably(tree: Tree, rel: str) -> None:
    """`mkdir -p` of `rel` below `tree` that fsyncs each parent it adds an entry to, so new
    directories survive power loss.

    A directory that someone removes while this makes it (a tidy of the private
    area) is made again.
    """
    if not components(rel) or _is_dir(tree, rel):
        return
    parent = os.path.dirname(rel)
    makedirs_durably(tree, parent)
    while True:
        try:
            tree.mkdir(rel)
            break
        except FileExistsError:
            try:
                if stat.S_ISDIR(tree.lstat(rel).st_mode):
                    break  # made by a concurrent writer, which may not have fsynced the parent yet
            except FileNotFoundError:
                continue  # and removed again since
            raise
    fsync_dir(tree, parent)


def _is_dir(tree: Tree, rel: str) -> bool:
    try:
        return stat.S_ISDIR(tree.lstat(rel).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def remove_quietly(tree: Tree, rel: str) -> None:
    """Remove a temp file on a failure path, where a second error would hide the first."""
    with contextlib.suppress(OSError):
        tree.unlink(rel)


def remove_empty_dir(tree: Tree, rel: str) -> bool:
    """rmdir `rel` if it is empty; whether it is gone (False: something is in it)."""
    try:
        tree.rmdir(rel)
    except FileNotFoundError:
        pass  # removed by someone else: gone all the same
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            return False
        raise
    return True


def _lock(fd: int, offset: int, wait: bool, length: int = 1) -> bool:
    """Write-lock `length` bytes (0: to the end of any file); without `wait`, False if
    another open file description holds one of them."""
    arg = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, length, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, arg)
    except OSError as e:
        if not wait and e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class Unsettled(str):
    """A recovery line about an entry left for a person to settle (`Journal.settle`):
    fsck reports it apart from what it repaired."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """What an appender is about to do: enough to tell a whole tail from a torn one.

    `inode` is the (device, inode) of the file appended to: recovery acts on that
    file alone, never on another one put at the key since (or planted there).
    Entries of older versions have none; recovery leaves those to a person.
    """

    key: str
    old_size: int
    new_size: int
    crc32c: int
    inode: tuple[int, int] | None

    def applies_to(self, version: Hashable) -> bool:
        """Whether the entry is about the file of local version `version` (see `_stat_of`);
        for what readers see, an entry that names no file is taken to (it changes nothing)."""
        return self.inode is None or tuple(version[:2]) == self.inode  # type: ignore[index]

    def encode(self) -> bytes:
        if self.inode is None:
            raise ValueError("a journal entry must name its file's device and inode")
        dev, ino = self.inode
        doc = {
            "key": self.key,
            "old_size": self.old_size,
            "new_size": self.new_size,
            "crc32c": self.crc32c,
            "dev": dev,
            "ino": ino,
        }
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, data: bytes, name: str) -> JournalEntry:
        """Parse the entry stored as `name`; ValueError says why it is malformed."""
        doc = jsondoc.loads(data)  # its errors, and UnicodeDecodeError, are ValueErrors
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        key, old, new, crc = (doc.get(f) for f in ("key", "old_size", "new_size", "crc32c"))
        if not isinstance(key, str):
            raise ValueError("no key")
        if type(old) is not int or type(new) is not int or type(crc) is not int:
            raise ValueError("sizes or checksum missing or not integers")
        if not 0 <= old <= new or not 0 <= crc < 2**32:
            raise ValueError(f"impossible sizes or checksum ({old}, {new}, {crc})")
        if entry_name(key) != name:
            raise ValueError("its name does not match its key")
        dev, ino = doc.get("dev"), doc.get("ino")
        if (dev, ino) == (None, None):
            return cls(key, old, new, crc, None)
        if type(dev) is not int or type(ino) is not int:
            raise ValueError("device or inode not integers")
        return cls(key, old, new, crc, (dev, ino))


class Journal:
    """The `.shardfs/` area of one source root. Stateless, so any number of threads may share it.

    Every name in it is resolved beneath the source root with no symlink followed
    (`Tree`); a symlink found where the area or one of its parts belongs was not
    made by shardfs, and is removed (`clear_planted`).
    """

    def __init__(self, root: Path, tree: Tree | None = None) -> None:
        self.tree = tree or Tree(str(root))
        area = root / PRIVATE
        self.area = str(area)
        self.lock_path = str(area / "lock")
        self.entries = str(area / "journal")
        self.temps = str(area / "tmp")

    def exists(self) -> bool:
        return _is_dir(self.tree, AREA)

    def clear_planted(self) -> bool:
        """Remove symlinks where the area, its lock file or its directories belong (one log
        line each); whether there were any."""
        removed = False
        for rel in (AREA, LOCK, ENTRIES, TEMPS):
            try:
                if not stat.S_ISLNK(self.tree.lstat(rel).st_mode):
                    continue
                self.tree.unlink(rel)
            except (FileNotFoundError, NotADirectoryError):
                continue
            log.warning(
                "%s: removed a symbolic link where shardfs keeps its own state (not made by "
                "shardfs; never followed)",
                self.tree.path(rel),
            )
            removed = True
        return removed

    def _planted_cleared(self, e: OSError) -> bool:
        """Whether error `e` came from a symlink planted in the area, now removed: try again."""
        return e.errno in (errno.ELOOP, errno.EEXIST, errno.ENOTDIR) and self.clear_planted()

    def _make_dir(self, rel: str) -> None:
        while True:
            try:
                return makedirs_durably(self.tree, rel)
            except OSError as e:
                if not self._planted_cleared(e):
                    raise

    def _acquire(self, offset: int, length: int, wait: bool, make: bool) -> int | None:
        """An open file description of the lock file with `length` bytes at `offset` locked
        (see `_lock`), on the file that the lock path names once the lock is held; None if
        they are locked and not `wait`. Closing it releases the lock.

        With `make`, an area that is gone (a tidy removed it) is made again; without,
        FileNotFoundError says it is gone.
        """
        while True:
            try:
                fd = self.tree.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666)
            except FileNotFoundError:
                if not make:
                    raise
                self._make_dir(AREA)
                continue
            except OSError as e:
                if self._planted_cleared(e):
                    continue
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", self.lock_path)
                if not _lock(fd, offset, wait, length):
                    os.close(fd)
                    return None
                if self._is_lock_file(fd):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # a tidy unlinked the file we locked: start over on the one there now

    def _is_lock_file(self, fd: int) -> bool:
        """Whether the lock path still names the file open as `fd`. Our descriptor keeps
        that inode allocated, so no new file can have its number."""
        st = os.fstat(fd)
        try:
            named = self.tree.lstat(LOCK)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            if e.errno == errno.ELOOP:
                return False  # the area is a symlink now: start over
            raise
        return (st.st_dev, st.st_ino) == (named.st_dev, named.st_ino)

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold `key`'s lock, with the area there for whatever the holder writes into it.

        A fresh open file description per call, so threads exclude each other too.
        """
        fd = self._acquire(lock_offset(key), 1, wait=True, make=True)
        assert fd is not None
        try:
            # Only now: a tidy removes these while it holds the whole lock file, or
            # before it unlinks it, so never after a lock on the current file was taken.
            self._make_dir(ENTRIES)
            self._make_dir(TEMPS)
            yield
        finally:
            os.close(fd)  # releases the lock, as a crash would

    def tidy(self) -> str | None:
        """Remove the area if nothing is in it and nobody holds a lock; None once it is
        gone, else why it stays. Safe while other processes write to the source (see
        the module docstring); whoever is at work then leaves it."""
        while True:
            try:
                fd = self._acquire(0, 0, wait=False, make=False)
            except FileNotFoundError:
                return None  # no area (or another tidy just removed it)
            except NotADirectoryError:
                return f"{self.area} is not a directory"
            if fd is None:
                return "another writer of the source is at work"
            try:
                if self.names():
                    return "it holds journal entries for recovery"
                if self._temp_names():
                    return "it holds temp files of writers that crashed"
                if not (
                    remove_empty_dir(self.tree, ENTRIES) and remove_empty_dir(self.tree, TEMPS)
                ):
                    return "its journal/ or tmp/ holds files of another tool"
                self.tree.unlink(LOCK)
            finally:
                os.close(fd)
            if not remove_empty_dir(self.tree, AREA):
                try:
                    foreign = set(self.tree.listdir(AREA)) - {"lock", "journal", "tmp"}
                except FileNotFoundError:
                    foreign = set()  # removed by another tidy since
                if foreign:
                    return "it holds files of another tool"
                continue  # a writer has come since: look again
            fsync_dir(self.tree, "")
            return None

    def _temp_names(self) -> list[str]:
        try:
            return self.tree.listdir(TEMPS)
        except FileNotFoundError:
            return []

    def create_temp(self, key: str) -> tuple[int, str]:
        """A new temp file for a writer holding `key`'s lock, and its name below the source
        root; the file's name says which lock that is."""
        rel = f"{TEMPS}/{lock_offset(key)}.{secrets.token_hex(8)}"
        return self.tree.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), rel

    def entry_path(self, name: str) -> str:
        return os.path.join(self.entries, name)

    def write(self, entry: JournalEntry) -> None:
        """Store `entry` durably and whole (temp file, fsync, rename, fsync of the directory)."""
        data = entry.encode()
        fd, tmp = self.create_temp(entry.key)
        try:
            with open(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(fd)
            self.tree.rename(tmp, f"{ENTRIES}/{entry_name(entry.key)}")
        except BaseException:
            remove_quietly(self.tree, tmp)
            raise
        fsync_dir(self.tree, ENTRIES)

    def load(self, name: str) -> JournalEntry | None:
        """The entry stored as `name`, None if there is none (any more); ValueError if malformed."""
        try:
            fd = self.tree.open(f"{ENTRIES}/{name}", os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ValueError("it is a symbolic link (not followed)") from None
            raise
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a regular file")
            data = f.read(MAX_ENTRY + 1)
        if len(data) > MAX_ENTRY:
            raise ValueError(f"larger than {MAX_ENTRY} bytes")
        return JournalEntry.decode(data, name)

    def discard(self, name: str) -> None:
        """Remove an entry. Not fsynced: an entry that reappears after a power loss still verifies,
        and writers that change an object otherwise call `sync` first."""
        with contextlib.suppress(FileNotFoundError):
            self.tree.unlink(f"{ENTRIES}/{name}")

    def sync(self) -> None:
        """Make earlier removals of entries durable.

        A writer that replaces or removes an object calls this first: an entry
        reappearing after a power loss would otherwise cut the new object to
        the old size.
        """
        fsync_dir(self.tree, ENTRIES)

    def names(self) -> list[str]:
        """The names of all entries; none if the area was never created."""
        try:
            return sorted(self.tree.listdir(ENTRIES))
        except FileNotFoundError:
            return []

    def settle(self, entry: JournalEntry, rel: str, name: str, by_hand: bool = False) -> str:
        """Keep a tail that verifies or cut a torn one, then drop the entry.

        Acts only on the very file the entry names: `rel` (the key's path below the
        source root) opened beneath the root with no symlink followed, a regular
        file whose device and inode are the entry's. An entry that names no file
        (an older version's) or a file with more than one name is left, with an
        `Unsettled` line saying how to settle it by hand; `by_hand` is that: the
        file at `rel` is taken to be the one appended to.

        The caller holds the key's lock, so no live writer is mid-append.
        Returns the log line; `name` is how it names the object.
        """
        try:
            fd = self.tree.open(rel, os.O_RDWR | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            line = f"{name}: left as is: it is no file since an interrupted append"
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                # a file the writer may not write: whoever appended to it was not this writer
                line = Unsettled(
                    f"{name}: left as is: cannot open it to settle an interrupted "
                    f"append ({e.strerror}); its owner can, with fsck --settle"
                )
            elif e.errno in (errno.ELOOP, errno.EXDEV):
                line = f"{name}: left as is: it is a symbolic link (or below one), never followed"
            else:
                raise
        else:
            try:
                line = self._settle_file(fd, entry, name, by_hand)
            finally:
                os.close(fd)
        if not isinstance(line, Unsettled):
            self.discard(entry_name(entry.key))
        return line

    def _settle_file(self, fd: int, entry: JournalEntry, name: str, by_hand: bool) -> str:
        st = os.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):
            return f"{name}: left as is: it is no regular file since an interrupted append"
        if entry.inode is not None and (st.st_dev, st.st_ino) != entry.inode:
            return f"{name}: left as is: another file replaced it since an interrupted append"
        if not by_hand and (entry.inode is None or st.st_nlink != 1):
            why = (
                "its journal entry, written by an older shardfs, names no file"
                if entry.inode is None
                else f"it has {st.st_nlink} names (hard links)"
            )
            return Unsettled(
                f"{name}: possibly torn, left as is: an append from {entry.old_size} to "
                f"{entry.new_size} bytes was interrupted, and {why}; once sure it is the file "
                f"appended to, `shardfs fsck --settle {shlex.quote(entry.key)} "
                f"{shlex.quote(self.tree.root)}` keeps the tail if it verifies, else cuts it"
            )
        if size < entry.old_size:
            return (
                f"{name}: left as is: it has {size} bytes, fewer than the "
                f"{entry.old_size} before an interrupted append, so something else changed it"
            )
        if size == entry.old_size:
            return f"{name}: dropped the record of an append that had written nothing"
        if size == entry.new_size and _crc_of_range(fd, entry.old_size, size) == entry.crc32c:
            os.fsync(fd)  # the tail may be in the page cache only: durable before the entry goes
            return f"{name}: kept a completed append ({size - entry.old_size} bytes)"
        os.ftruncate(fd, entry.old_size)
        os.fsync(fd)
        return f"{name}: rolled back a torn append (kept {entry.old_size} of {size} bytes)"

    def sweep_temps(self) -> int:
        """Remove temp files of dead writers: a live writer holds the lock its file's name gives.

        Returns how many were removed.
        """
        removed = 0
        for name in self._temp_names():
            match = _TEMP_NAME.fullmatch(name)
            if not match:
                continue  # not ours to judge
            try:
                fd = self._acquire(int(match[1]), 1, wait=False, make=False)
            except FileNotFoundError:
                break  # the area is gone: a tidy found no temp file left
            if fd is None:
                continue  # its writer is alive
            try:
                with contextlib.suppress(FileNotFoundError):  # renamed by a writer just done
                    self.tree.unlink(f"{TEMPS}/{name}")
                    removed += 1
            finally:
                os.close(fd)
        return removed


def crc_of(views: Sequence[memoryview]) -> int:
    crc = 0
    for v in views:
        crc = crc32c.crc32c(v, crc)
    return crc


def _crc_of_range(fd: int, start: int, end: int) -> int:
    crc = 0
    while start < end:
        chunk = os.pread(fd, min(_CHUNK, end - start), start)
        if not chunk:
            break
        crc = crc32c.crc32c(chunk, crc)
        start += len(chunk)
    return crc
