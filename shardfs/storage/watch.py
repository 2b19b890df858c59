"""Which pinned local files were written since their version was verified: inotify
watches for `IN_MODIFY` on the inodes pins hold open.

Why: a local file's version is its stat (inode, size, mtime, ctime). A file renamed
over or unlinked gets a new ctime and keeps its bytes, and a pin must go on serving it;
but a descriptor opened for writing before can still write to it, and a rewrite in place
at the same size with the mtime set back, then a rename over it, changes exactly the
same fields. Stat cannot tell the two apart; a write event seen since the version was
verified can. A watch is in place before the stat that verifies the version: a write
before it shows in that stat, one after it as an event.

Not seen: writes through a shared writable mmap (the kernel sends no event for them).
Where a file cannot be watched (inotify unavailable, its limits reached, `WATCHES`
held), no write is ruled out, and an unlinked version with a changed ctime counts as
another version: sound, at the price of EIO for a file renamed over while read.
"""

from __future__ import annotations

import array
import collections
import contextlib
import ctypes
import fcntl
import logging
import os
import struct
import termios
import threading

log = logging.getLogger("shardfs")

#: Watches held at most, those of no pin (`LINGER`) included: beyond, a pin goes without
#: one. The user's `fs.inotify.max_user_watches` is shared with their other programs.
WATCHES = 4096
#: Watches kept after their last pin closed, the oldest removed first: opening a file
#: again (the next chunk file of a shard) then costs no watch made and removed (25 µs).
LINGER = 256
#: Reads of the event queue per drain: more (writers outpacing the drain) counts as an
#: overflow.
DRAIN_READS = 64

_IN_MODIFY = 0x2
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (of the name that follows)

_libc = ctypes.CDLL(None, use_errno=True)
_init1 = _libc.inotify_init1
_init1.argtypes = [ctypes.c_int]
_add_watch = _libc.inotify_add_watch
_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_rm_watch = _libc.inotify_rm_watch
_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


class _Watch:
    """One inode's watch, shared by every pin on it (clones included)."""

    __slots__ = ("events", "inode", "pins", "wd")

    def __init__(self, wd: int, inode: tuple[int, int]) -> None:
        self.wd = wd
        self.inode = inode
        self.pins = 0
        #: events seen on it: writes, and one for its end (IN_IGNORED, an overflow)
        self.events = 0


#: What a pin holds of its watch: the watch, and its events when the version was verified.
Token = tuple[_Watch, int]


class Watches:
    """The write watches of one storage's pins: one inotify instance, made at the first
    pin. Called from the event loop and from worker threads; `_lock` is a leaf, held
    only across system calls that never wait (`fstat`, inotify's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._warned = False
        #: bytes of events queued (`FIONREAD`: cheaper than a read that finds none)
        self._queued = array.array("i", [0])
        #: the watches the kernel holds for us, by watch descriptor
        self._by_wd: dict[int, _Watch] = {}
        #: those a new pin may share: by (st_dev, st_ino)
        self._by_inode: dict[tuple[int, int], _Watch] = {}
        #: those of no pin (at most `LINGER`), the oldest first
        self._idle: collections.OrderedDict[int, _Watch] = collections.OrderedDict()
        #: watches of pins collected without `release` (a finalizer must not wait for
        #: the lock its own thread may hold), released at the next call
        self._dropped: collections.deque[_Watch] = collections.deque()

    def watch(self, fd: int) -> tuple[os.stat_result, Token | None]:
        """The stat of the file open as `fd`, and a watch for writes to it that was in
        place before that stat; None if it cannot be watched (then no write can be
        ruled out)."""
        with self._lock:
            self._settle()
            if self._fd < 0:
                self._fd = _init1(os.O_NONBLOCK | os.O_CLOEXEC)
                if self._fd < 0:
                    self._cannot(f"inotify_init1: {os.strerror(ctypes.get_errno())}")
                    return os.fstat(fd), None
            # Count what is queued first: events of writes before the stat below are not
            # the new pin's, and a watch the kernel dropped (IN_IGNORED: its inode, and
            # so its number, may be another file's by now) is not shared.
            self._drain()
            st = os.fstat(fd)
            watch = self._by_inode.get((st.st_dev, st.st_ino))
            if watch is None:
                watch = self._add(fd, (st.st_dev, st.st_ino))
                if watch is None:
                    return st, None
                st = os.fstat(fd)  # after the watch: a write since shows as an event
            else:
                self._idle.pop(watch.wd, None)
            watch.pins += 1
            return st, (watch, watch.events)

    def share(self, token: Token) -> Token:
        """The same watch for a clone of a pin holding `token`."""
        with self._lock:
            token[0].pins += 1
            return token

    def unchanged(self, token: Token) -> bool:
        """Whether no write to the file was seen since `token` was taken. Reads the
        queued events: asked only when a stat says the file may have changed (rare)."""
        with self._lock:
            self._drain()
            return token[0].events == token[1]

    def release(self, token: Token) -> None:
        """A pin holding `token` is closed."""
        with self._lock:
            self._settle()
            self._unpin(token[0])

    def drop(self, token: Token) -> None:
        """`release` from a finalizer: deferred to the next call, taking no lock."""
        self._dropped.append(token[0])

    def _add(self, fd: int, inode: tuple[int, int]) -> _Watch | None:
        if len(self._by_wd) >= WATCHES:
            if not self._idle:
                self._cannot(f"{WATCHES} files watched")
                return None
            self._remove(self._idle.popitem(last=False)[1])
        # The magic link resolves to the open inode, also one unlinked or renamed over.
        wd = _add_watch(self._fd, b"/proc/self/fd/%d" % fd, _IN_MODIFY)
        if wd < 0:
            self._cannot(f"inotify_add_watch: {os.strerror(ctypes.get_errno())}")
            return None
        watch = self._by_wd.get(wd)  # known by another (st_dev, st_ino): share it
        if watch is None:
            watch = self._by_wd[wd] = self._by_inode[inode] = _Watch(wd, inode)
        return watch

    def _unpin(self, watch: _Watch) -> None:
        watch.pins -= 1
        if watch.pins == 0 and self._by_wd.get(watch.wd) is watch:
            self._idle[watch.wd] = watch
            if len(self._idle) > LINGER:
                self._remove(self._idle.popitem(last=False)[1])

    def _settle(self) -> None:
        while self._dropped:
            self._unpin(self._dropped.popleft())

    def _forget(self, watch: _Watch) -> None:
        """Count an end of `watch` (no write after it is seen) and let no pin share it."""
        watch.events += 1
        del self._by_wd[watch.wd]
        if self._by_inode.get(watch.inode) is watch:
            del self._by_inode[watch.inode]
        self._idle.pop(watch.wd, None)

    def _remove(self, watch: _Watch) -> None:
        self._forget(watch)
        _rm_watch(self._fd, watch.wd)  # fails if the kernel dropped it meanwhile

    def _drain(self) -> None:
        """Count the queued events. An overflow (or more than `DRAIN_READS` reads of
        them) lost some, IN_IGNORED among them: every watch is then let go, counting as
        written, and pins made later watch afresh."""
        queued = self._queued
        for _ in range(DRAIN_READS):
            fcntl.ioctl(self._fd, termios.FIONREAD, queued, True)
            if not queued[0]:
                return
            if not self._count(os.read(self._fd, queued[0])):
                break
        for watch in list(self._by_wd.values()):
            self._remove(watch)

    def _count(self, data: bytes) -> bool:
        """Count the events in `data`; False at an overflow."""
        by_wd = self._by_wd
        pos = 0
        while pos < len(data):
            wd, mask, _, size = _EVENT.unpack_from(data, pos)
            pos += _EVENT.size + size
            if mask & _IN_Q_OVERFLOW:
                return False
            watch = by_wd.get(wd)
            if watch is None:
                continue  # one removed: its IN_IGNORED
            if mask & _IN_IGNORED:
                self._forget(watch)  # the kernel dropped it (its inode was removed)
            else:
                watch.events += 1
        return True

    def _cannot(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "local source: %s; a file renamed over or removed while it is read now "
                "fails (EIO) unless its ctime is unchanged (logged once)",
                why,
            )

    def __del__(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
