"""The descriptors local pins hold (`shardfs.storage.local`): one per version of a file,
shared by every pin on it, and at most `budget()` at once.

Why: a local pin holds its file open, so that a version renamed over or removed stays
readable (`Pin.keeps_version`). With a descriptor of its own per pin, one user holding
many opens of a `kernel_cache=no` mount, or a kernel-served mount keeping the versions it
showed, filled the daemon's descriptor table, and every other reader got EIO. So the pins
of one version share one descriptor (`pread` keeps no offset), and a descriptor that would
go beyond the budget first closes the least recently used one that no read is using. A
pin whose descriptor was closed opens its file again at its next read, and goes on only
if the file is exactly as it was when its descriptor was closed; otherwise it reads as a
version that is gone (SourceChanged), as it would had the file changed while open.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from shardfs.primitives.errors import SourceChanged

#: Descriptors left to the rest of the daemon (the FUSE device, sockets, the log, the
#: journal, spool and SQLite files, the short-lived opens of reads and listings): this
#: many, or a tenth of the limit if that is more.
HEADROOM = 64
#: Descriptors pins may always hold, however low the limit (reads in flight need theirs).
FLOOR = 8


def budget() -> int:
    """Descriptors the pins of a process may hold at once: its soft `RLIMIT_NOFILE` (which
    the daemon raises to the hard limit at start) less `HEADROOM`."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20  # the kernel's own ceiling (fs.nr_open) by default
    return max(FLOOR, soft - max(HEADROOM, soft // 10))


class Descriptor:
    """One version of a local file held open, for the pins on it (`DescriptorPool`)."""

    __slots__ = ("busy", "closed_as", "fd", "id", "lost", "path", "pins", "reopen")

    def __init__(self, ident: Hashable, path: str, fd: int, reopen: Callable[[], int]) -> None:
        #: (key, version) it was opened for
        self.id = ident
        #: the file's path, for messages (never opened: see `reopen`)
        self.path = path
        #: opens the file again after the budget closed it (as its store opens it)
        self.reopen = reopen
        #: -1 while closed for the budget (opened again at the next read)
        self.fd = fd
        #: pins on it, and reads using it now (never closed under one)
        self.pins = 1
        self.busy = 0
        #: the file's fingerprint when it was closed for the budget: what a reopen must find
        self.closed_as: Hashable = None
        #: closed for the budget, and the file changed since: every read is SourceChanged
        self.lost = False


class DescriptorPool:
    """The descriptors of a store's pins, shared per version, within `limit()`: beyond it
    the least recently used one no read is using is closed (see the module's docstring).
    Thread-safe; its lock is a leaf, held for no more than an `fstat`."""

    def __init__(self, fingerprint: Callable[[os.stat_result], Hashable]) -> None:
        #: what tells a file unchanged (a local file's version)
        self._fingerprint = fingerprint
        self._lock = threading.Lock()
        #: open or closed for the budget, by (key, version), while a pin holds them
        self._shared: dict[Hashable, Descriptor] = {}
        #: the open ones, least recently used first
        self._open: OrderedDict[Descriptor, None] = OrderedDict()
        #: descriptors being opened (counted against the limit)
        self._opening = 0
        #: whether it went beyond its limit while every descriptor was in a read
        self._over = False
        #: descriptors of pins dropped without `unshare` (see `dropped`)
        self._dropped: list[Descriptor] = []
        #: descriptors closed for the budget, and opened again after that
        self.evicted = 0
        self.reopened = 0
        #: descriptors of the process's budget held elsewhere (see `reserve`)
        self.reserved = 0

    def limit(self) -> int:
        """Descriptors it may hold: `budget()` less what was reserved, asked each time a
        descriptor is opened (the daemon raises its limit after its source is opened)."""
        return budget() - self.reserved

    def reserve(self, count: int) -> int:
        """Set aside up to `count` more descriptors of the budget for another holder (the
        native front's copies of kept versions, the metrics server's sockets), leaving this
        pool at least half: how many."""
        granted = max(0, min(count, budget() // 2 - self.reserved))
        self.reserved += granted
        return granted

    def __len__(self) -> int:
        """Descriptors open now."""
        return len(self._open)

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats`: descriptors open now and the most it may hold,
        and how often one was closed for the budget and opened again."""
        with self._lock:
            open_now = len(self._open)
            evicted, reopened = self.evicted, self.reopened
        return {"open": open_now, "limit": self.limit(), "evicted": evicted, "reopened": reopened}

    def share(
        self, ident: Hashable, path: str, open_: Callable[[], int], reopen: Callable[[], int]
    ) -> Descriptor:
        """The descriptor of `ident` (key, version) with one more pin on it: shared if a pin
        holds it, else `open_()` (which opens the file and checks that it is that version);
        `reopen()` opens it again, unchecked, after the budget closed it (see `acquire`).
        `path` names it in messages."""
        with self._lock:
            victims = self._drain()
            found = self._shared.get(ident)
            if found is not None:
                found.pins += 1
            else:
                victims += self._make_room()
        _close(victims)
        if found is not None:
            return found
        try:
            fd = open_()
        except BaseException:
            with self._lock:
                self._opening -= 1
            raise
        with self._lock:
            self._opening -= 1
            found = self._shared.get(ident)
            if found is None:
                made = self._shared[ident] = Descriptor(ident, path, fd, reopen)
                self._open[made] = None
                return made
            found.pins += 1  # another thread opened it meanwhile
        os.close(fd)
        return found

    def again(self, descriptor: Descriptor) -> None:
        """One more pin on `descriptor` (a clone)."""
        with self._lock:
            descriptor.pins += 1

    def unshare(self, descriptor: Descriptor) -> None:
        """One pin fewer on `descriptor`: closed with the last."""
        with self._lock:
            fd = self._unpin(descriptor)
        if fd >= 0:
            os.close(fd)

    def dropped(self, descriptor: Descriptor) -> None:
        """`unshare` for a pin's finalizer, which may run in the middle of any code, this
        pool's locked blocks included: done at the next `share`."""
        self._dropped.append(descriptor)  # atomic: takes no lock

    def acquire(self, descriptor: Descriptor) -> int:
        """The descriptor for a read, never closed before `release`; opened again if it
        was closed for the budget. SourceChanged if the file changed since then."""
        with self._lock:
            if descriptor.fd >= 0:
                descriptor.busy += 1
                self._open.move_to_end(descriptor)
                return descriptor.fd
            if descriptor.lost:
                raise _lost(descriptor)
            victims = self._make_room()
        _close(victims)
        fd = -1
        try:
            fd = descriptor.reopen()
            same = self._fingerprint(os.fstat(fd)) == descriptor.closed_as
        except OSError:
            same = False
        with self._lock:
            self._opening -= 1
            if descriptor.fd < 0 and same and not descriptor.lost:
                descriptor.fd, fd = fd, -1
                self._open[descriptor] = None
                self.reopened += 1
            elif descriptor.fd < 0:
                descriptor.lost = True
                if self._shared.get(descriptor.id) is descriptor:
                    del self._shared[descriptor.id]  # new pins open the file afresh
            if not descriptor.lost:
                descriptor.busy += 1
                self._open.move_to_end(descriptor)
        if fd >= 0:
            os.close(fd)  # not the same file, or another read opened it meanwhile
        if descriptor.lost:
            raise _lost(descriptor)
        return descriptor.fd

    def release(self, descriptor: Descriptor) -> None:
        """The read that `acquire` began is over."""
        with self._lock:
            descriptor.busy -= 1
            fd = self._unpin(descriptor, 0)
            victims = self._evict(0) if self._over else []
        _close([fd, *victims] if fd >= 0 else victims)

    def _unpin(self, descriptor: Descriptor, pins: int = 1) -> int:
        """Under the lock: `pins` pins fewer on `descriptor`; the descriptor to close if
        none is left and no read uses it (else -1)."""
        descriptor.pins -= pins
        if descriptor.pins:
            return -1
        if self._shared.get(descriptor.id) is descriptor:
            del self._shared[descriptor.id]
        if descriptor.busy or descriptor.fd < 0:
            return -1
        fd, descriptor.fd = descriptor.fd, -1
        del self._open[descriptor]
        return fd

    def _drain(self) -> list[int]:
        """Under the lock: unpin what finalizers dropped (see `dropped`); returns the
        descriptors to close."""
        fds = []
        while self._dropped:
            fd = self._unpin(self._dropped.pop())
            if fd >= 0:
                fds.append(fd)
        return fds

    def _make_room(self) -> list[int]:
        """Under the lock: make room for one more descriptor, and count it as opening.
        Returns the descriptors to close (after the lock: closing the last descriptor of a
        big removed file frees its blocks). While every open one is in a read, the pool
        goes beyond its limit by those reads, which the daemon's threads bound, until the
        first of them ends (`release`)."""
        victims = self._evict(1)
        self._opening += 1
        return victims

    def _evict(self, room: int) -> list[int]:
        """Under the lock: close the least recently used descriptors no read uses until
        `room` more fit; returns them, to be closed after the lock."""
        limit = self.limit()
        victims: list[int] = []
        while len(self._open) + self._opening + room > limit:
            victim = next((d for d in self._open if not d.busy), None)
            if victim is None:
                self._over = True
                return victims
            del self._open[victim]
            try:
                victim.closed_as = self._fingerprint(os.fstat(victim.fd))
            except OSError:
                victim.closed_as = None  # cannot be told unchanged: lost at its next read
            victims.append(victim.fd)
            victim.fd = -1
            self.evicted += 1
        self._over = False
        return victims


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _lost(descriptor: Descriptor) -> SourceChanged:
    return SourceChanged(
        f"{descriptor.path} changed after its descriptor was closed (descriptor budget)"
    )
