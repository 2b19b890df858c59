"""What a client that caches (the kernel of a kernel-served mount) was shown of each file,
so that every byte served for the file comes from the version whose size it holds.

Why: a kernel-served mount hands the kernel a file's size (in a lookup, a
getattr or a listing) and lets it keep that for `cache_timeout`, with no open
to tell the daemon when a reader starts. If the source changes meanwhile, the
kernel still reads the file with the old size: bytes of the new version would
come back cut at the old size, or mixed with pages it cached of the old one.
So a read is served as of the versions its file was last shown from: each show
records the versions of every object the view consulted (`Storage.recording`)
and a read opens the file as of them (`Storage.as_of`). On a local source the
daemon keeps each version shown open (`Pin.keeps_version`), so a file renamed
over stays readable as the kernel knows it; where a version is gone (an S3
object replaced, a kept version dropped for the budget), the read fails once
and the kernel is told to drop what it holds (see the FUSE adapter).

A show is kept per inode (lookups and getattrs) and per directory (a listing
shows every entry at once: one record, whatever the number of chunk files), and
dropped once the kernel's copy has expired (`timeout`, after which it asks
again) or beyond a budget: a file whose show was dropped is read as it is now.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Protocol

from shardfs.primitives.blocking import WouldBlock, may_block
from shardfs.primitives.errors import ShardfsError
from shardfs.storage.base import Pin, Stat, Storage
from shardfs.view.nodes import Extent

#: Seconds a show outlives the kernel's timeout, for requests already on their way.
SLACK = 5.0
#: Shows and kept versions past their lifetime are let go at most this often (those over
#: a budget at once): looking at every show cost a few µs of every lookup.
TIDY_EVERY = 1.0
#: Shows kept per inode and per directory.
SHOWS_KEPT = 65536
#: Object versions the kept shows hold in all (about 100 bytes each): a listing of a
#: directory of plain files holds one per file.
STATS_KEPT = 1 << 18
#: Versions kept open (each a descriptor), the least recently shown (to within
#: `TIDY_EVERY`) dropped first; at most half the store's descriptor budget, so that the
#: files read meanwhile have theirs too (`Storage.descriptor_budget`).
VERSIONS_KEPT = 1024
#: Bytes of a kept version the kernel is asked to read ahead from a read that found its
#: own not in the page cache (see `read_kept`).
READ_AHEAD = 4 << 20
#: Objects of a show asked about after a read as of it failed (see `changed`).
CHANGES_ASKED = 256
#: Versions a listing may keep open; the rest of a big listing is read as it is now if it
#: changes (keeping them all would open every file of a directory of plain files).
VERSIONS_PER_LISTING = 64


class Shown:
    """One show: the versions a file's attributes were computed from, in the order shown.
    Never changed once made. A plain class: one is made at every lookup of a file, and a
    frozen dataclass sets each field through `object.__setattr__`."""

    __slots__ = ("at", "extent", "seq", "stats")

    def __init__(
        self, seq: int, at: float, stats: dict[str, Stat | None], extent: Extent | None = None
    ) -> None:
        self.seq = seq
        self.at = at
        #: objects by key as they were (None: absent); empty for "as it is now"
        self.stats = stats
        #: where the file's bytes are stored as served, if its show found that (see
        #: `read_kept`)
        self.extent = extent


class KeptElsewhere(Protocol):
    """Copies of kept versions held outside Python (the native front's), by (key, version)."""

    def shown_at(self, key: str, version: Hashable) -> float:
        """When the version was last shown there (`time.monotonic`), or 0."""
        ...

    def drop(self, key: str, version: Hashable) -> None:
        """The version is let go: its copy must be too."""
        ...


class KernelVersions:
    """The shows of one mount, and the versions they keep readable. The shows belong to
    the event loop; the kept versions are also read from worker threads (under a lock)."""

    def __init__(
        self,
        storage: Storage,
        timeout: float,
        shows: int = SHOWS_KEPT,
        versions: int | None = None,
        stats: int = STATS_KEPT,
    ) -> None:
        self.storage = storage
        self.lifetime = timeout + SLACK
        self._budget = shows
        self._stats_budget = stats
        #: object versions the kept shows hold
        self._held = 0
        self._inodes: OrderedDict[int, Shown] = OrderedDict()
        self._dirs: OrderedDict[str, Shown] = OrderedDict()
        self._kept: OrderedDict[tuple[str, Hashable], tuple[Pin, float]] = OrderedDict()
        if versions is None:
            budget = storage.descriptor_budget()
            versions = VERSIONS_KEPT if budget is None else min(VERSIONS_KEPT, budget // 2)
        self._versions = versions
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._tidy_at = 0.0
        #: the versions the latest call of `_keep` kept, and when (see `show`)
        self._last_kept: dict[str, Stat | None] = {}
        self._kept_at = 0.0
        #: copies of kept versions held outside Python, which shows them too (the native
        #: front): asked before a version is let go, and told when it is
        self.elsewhere: KeptElsewhere | None = None

    def show(
        self,
        stats: dict[str, Stat | None],
        inode: int | None = None,
        directory: str | None = None,
        extent: Extent | None = None,
    ) -> Shown:
        """Record that the kernel was given attributes computed from `stats`: of `inode`
        (whose bytes `extent` may locate), or of every entry of `directory`. Keeps the
        file versions among them open."""
        now = time.monotonic()
        shown = Shown(next(self._seq), now, stats, extent)
        table: OrderedDict = self._inodes if directory is None else self._dirs
        where = inode if directory is None else directory
        self._held -= len(getattr(table.pop(where, None), "stats", ()))
        table[where] = shown
        self._held += len(stats)
        tidy = now >= self._tidy_at
        if tidy:
            self._tidy_at = now + TIDY_EVERY
        if tidy or len(table) > self._budget or self._held > self._stats_budget:
            self._expire(now)
        self._touch(stats, now, None if directory is None else VERSIONS_PER_LISTING, tidy)
        return shown

    def keep(self, stats: dict[str, Stat | None]) -> None:
        """Keep the file versions among `stats` readable, with no show recorded: for a
        file whose node id names the versions it is read as of (a kernel-served chunk
        file, see `shardfs.fuse.inodes`)."""
        now = time.monotonic()
        if stats is self._last_kept and now < self._tidy_at and now < self._kept_at + TIDY_EVERY:
            return  # the chunk files of one shard, one after another: nothing to do
        tidy = now >= self._tidy_at
        if tidy:
            self._tidy_at = now + TIDY_EVERY
            self._expire(now)
        self._touch(stats, now, None, tidy)

    def _touch(
        self, stats: dict[str, Stat | None], now: float, limit: int | None, tidy: bool
    ) -> None:
        # The same versions as the last show, shown again within `TIDY_EVERY` (the chunk
        # files of one shard, one after another): `_keep` would find them kept.
        if stats is not self._last_kept or now >= self._kept_at + TIDY_EVERY:
            self._keep(stats, now, limit)
            self._last_kept, self._kept_at = stats, now
        if tidy or len(self._kept) > self._versions:
            self._drop_kept(now)

    def latest(self, inode: int, directory: str) -> Shown | None:
        """The latest show of `inode` (which is an entry of `directory`), if still kept."""
        deadline = time.monotonic() - self.lifetime
        own, listed = self._inodes.get(inode), self._dirs.get(directory)
        if own is not None and own.at <= deadline:
            own = None
        if listed is not None and listed.at <= deadline:
            listed = None
        if own is None or listed is None:
            return own or listed
        return own if own.seq > listed.seq else listed

    def forget(self, inode: int) -> None:
        self._held -= len(getattr(self._inodes.pop(inode, None), "stats", ()))

    def changed(self, shown: Shown) -> bool:
        """Whether a file the show names (of the first `CHANGES_ASKED`) is another version
        now: what tells a read that failed because its version is gone from one that
        failed for another reason."""
        files = (item for item in shown.stats.items() if item[1] is None or not item[1].is_dir)
        return any(
            self.storage.stat(key) != stat for key, stat in itertools.islice(files, CHANGES_ASKED)
        )

    @contextlib.contextmanager
    def as_of(self, shown: Shown | None) -> Iterator[None]:
        """Read as of `shown` within this block (see `Storage.as_of`)."""
        if shown is None or not shown.stats:
            yield
            return
        with self.storage.as_of(shown.stats, self._kept_pin):
            yield

    def read_kept(self, extent: Extent, offset: int, size: int) -> bytes | None:
        """Up to `size` bytes at `offset` of the file `extent` locates, read from the kept
        version it names: a read with no reader to open. None if that version is not kept
        or changed in place, or the read failed; opening the file as of its show then
        tells which, and answers for it. Inline on the kept descriptor itself (the mode
        is non-blocking: page-cache hits only); in a worker thread on a clone of it, so
        that no read from the disk holds the lock the event loop takes."""
        length = min(size, extent.length - offset)
        with self._lock:
            found = self._kept.get((extent.key, extent.stat.version))
            if found is None:
                return None
            pin = found[0]
            if not may_block():
                try:
                    return pin.read(extent.offset + offset, length)
                except WouldBlock:
                    # Not in the page cache: have the reads that follow find theirs
                    # there (readers of chunk files go through a shard in order).
                    pin.advise(extent.offset + offset, READ_AHEAD)
                    raise
                except ShardfsError:
                    return None
            pin = pin.clone()
        try:
            return pin.read(extent.offset + offset, length)
        except ShardfsError:
            return None
        finally:
            pin.close()

    def _kept_pin(self, key: str, version: Hashable) -> Pin | None:
        """A pin of its own on a kept version: cloned under the lock, so that a kept pin
        dropped meanwhile can never leave it a closed (or reused) descriptor."""
        with self._lock:
            found = self._kept.get((key, version))
            return found[0].clone() if found is not None else None

    def _keep(self, stats: dict[str, Stat | None], now: float, limit: int | None) -> None:
        """Keep open the versions of the files in `stats` (the first `limit` of them), or
        refresh those kept: under one lock, and no more often than `TIDY_EVERY` each (a
        kept version may so be let go that much before its show; see `SLACK`). A pin that
        cannot be made (the file already changed) is left out: a read of it fails once,
        as for any version gone."""
        missing = []
        files = 0
        with self._lock:
            kept = self._kept
            for key, stat in stats.items():
                if stat is None or stat.is_dir:
                    continue
                if files == limit:
                    break
                files += 1
                found = kept.get((key, stat.version))
                if found is None:
                    missing.append((key, stat))
                elif now - found[1] >= TIDY_EVERY:
                    kept.move_to_end((key, stat.version))
                    kept[(key, stat.version)] = (found[0], now)
        for key, stat in missing:
            try:
                pin = self.storage.pin(key, stat)
            except ShardfsError:
                continue
            if not pin.keeps_version:
                pin.close()
                return  # the store keeps no versions: nothing to keep of any
            with self._lock:
                self._kept[(key, stat.version)] = (pin, now)

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats`: the shows kept (by inode and by directory), the
        object versions they hold, and the versions kept open, each a descriptor, within
        their limit."""
        with self._lock:
            versions = len(self._kept)
        return {
            "shows": len(self._inodes) + len(self._dirs),
            "held": self._held,
            "versions": versions,
            "versions_limit": self._versions,
        }

    def tidy(self) -> None:
        """Let go the kept versions whose shows the kernel no longer holds, however idle
        the mount: the daemon calls this every `TIDY_EVERY` seconds, so that a file
        removed from the source frees its space within `lifetime` of its last show, not
        at the next show. Touches only the kept versions: safe from any thread."""
        self._drop_kept(time.monotonic())

    def lend(self, key: str, stat: Stat, take: Callable[[int], object]) -> bool:
        """Hand `take` a descriptor of kept version `stat` of `key` (it owns it then) under
        the lock that keeps the version from being let go meanwhile, so that whoever holds
        the copy hears of the drop (`elsewhere`). False if it is not kept or has none."""
        with self._lock:
            found = self._kept.get((key, stat.version))
            fd = None if found is None else found[0].duplicate()
            if fd is None:
                return False
            take(fd)
            return True

    def _drop_kept(self, now: float) -> None:
        deadline = now - self.lifetime
        dropped = []
        elsewhere = self.elsewhere
        with self._lock:
            kept = self._kept
            asked = 0
            while kept:
                ident, (pin, at) = next(iter(kept.items()))
                over = len(kept) > self._versions
                if not over and at > deadline:
                    break
                if not over and elsewhere is not None and asked < len(kept):
                    asked += 1
                    shown = elsewhere.shown_at(*ident)
                    if shown > deadline:  # shown there since: kept as of that show
                        kept.move_to_end(ident)
                        kept[ident] = (pin, shown)
                        continue
                del kept[ident]
                dropped.append((ident, pin))
        for ident, pin in dropped:  # a reader that cloned it holds the descriptor on
            if elsewhere is not None:
                elsewhere.drop(*ident)
            pin.close()

    def _expire(self, now: float) -> None:
        """Drop the oldest shows beyond the budgets, and those the kernel no longer holds."""
        deadline = now - self.lifetime
        inodes, dirs = self._inodes, self._dirs
        table: OrderedDict[int, Shown] | OrderedDict[str, Shown]
        while inodes or dirs:
            # the older of the two tables' oldest shows
            first_inode = next(iter(inodes.values())) if inodes else None
            first_dir = next(iter(dirs.values())) if dirs else None
            if first_dir is None or (first_inode is not None and first_inode.seq < first_dir.seq):
                table, first = inodes, first_inode
            else:
                table, first = dirs, first_dir
            assert first is not None
            over = len(table) > self._budget or self._held > self._stats_budget
            if not over and first.at > deadline:
                break
            table.popitem(last=False)
            self._held -= len(first.stats)

    def close(self) -> None:
        """Let every kept version go (the mount ends)."""
        with self._lock:
            pins = [pin for pin, _ in self._kept.values()]
            self._kept.clear()
        for pin in pins:
            pin.close()
