"""Chunk reads from stores where every request costs a round trip (S3).

A legacy reader asks for one chunk file at a time, so serving each read with
its own ranged GET would pay one round trip per chunk. Instead, when a
reader walks neighbouring chunks of one shard, the chunks that follow in the
shard are fetched with the one it asked for, in one ranged GET (reading over
gaps smaller than the store's `request_cost`), into a bounded cache where
the next reads find them. Chunks before the one asked for count too, as
concurrent readers do not ask in order. The first fetch from a shard version is small
(`FIRST_WINDOW`), so a random reader wastes little; a second read from the
same shard version (of a chunk fetched ahead, or another fetch) shows a reader
walking it, and every fetch from then on takes up to `MAX_WINDOW`. Fetches in flight are shared: a read of a chunk
that is on its way waits for it rather than asking again.

A reader walking a shard is likely to walk the next one too (readers of a
whole array go in C order), so the first window of the shard that follows
is fetched at the same time, in the background: by the time the reader gets
there, its index and first chunks are in memory instead of two round trips
away. A whole-array read walks all the shards a row of chunks crosses at
once, so the shards right after the one walked are often walked already:
what is fetched ahead are the next shards that nobody walks yet.

What is looked ahead in is an `ExtentSource`: the chunks of a whole Zarr shard,
or of one part of a shard whose index comes in parts (a minishard of a
Neuroglancer precomputed shard, whose index alone locates its chunks). Walks are
told apart by part, and the part a walker goes to next is the caller's to say.

Where the store keeps a local copy of what it fetched (S3 with a disk cache),
a chunk it holds costs no round trip: it is read with the chunks of the same
local blocks and no more (`Storage.local_span`), since a window sized for
round trips would read whole shards from disk for a reader that wants a few
chunks of each.

Entries are keyed by the shard's version, so bytes of two versions never mix.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from functools import cached_property
from typing import ClassVar, Protocol

import numpy as np

from shardfs.formats.shard_index import EMPTY
from shardfs.primitives.blocking import WouldBlock, may_block
from shardfs.primitives.cache import LruCache
from shardfs.storage.base import Pin, Stat, Storage

#: The first fetch from a shard: small, as one chunk may be all a reader wants.
#: (At least the store's `request_cost`: up to that, more bytes cost less than
#: the second request they may save.)
FIRST_WINDOW = 256 << 10
#: Every later fetch from the same shard (also limited to a quarter of the cache).
MAX_WINDOW = 16 << 20
#: Shards remembered as read from.
TRACKED_SHARDS = 4096
#: Background prefetches at once (their fetches together at most half the read cache).
PREFETCHES = 8
#: Shards fetched ahead of a walker: the next ones (in the order a whole-array read
#: goes) that no reader walks and no prefetch took yet, ...
AHEAD = 4
#: ... looked for among the next LOOKAHEAD (a row of chunks may cross that many shards,
#: all walked at once).
LOOKAHEAD = 16
#: Seconds a prefetch thread waits for work before it ends.
WORKER_IDLE = 30.0
#: What a shard version has seen: one fetch; a reader walking it; its walker's next shard asked for.
FETCHED, WALKED, NEXT_ASKED = 1, 2, 3

log = logging.getLogger("shardfs")


class Extents:
    """The non-empty chunks of one shard version (or part), sorted by offset: where to look
    ahead."""

    def __init__(self, starts: np.ndarray, sizes: np.ndarray) -> None:
        self.starts = starts
        self.sizes = sizes

    @classmethod
    def of_entries(cls, entries: np.ndarray) -> Extents:
        """The extents of a Zarr shard index: (offset, nbytes) entries in any order, EMPTY
        for absent chunks."""
        flat = entries.reshape(-1, 2)
        used = flat[flat[:, 1] != EMPTY]
        order = np.lexsort((used[:, 1], used[:, 0]))
        return cls(used[order, 0].astype(np.int64), used[order, 1].astype(np.int64))

    @property
    def nbytes(self) -> int:
        return self.starts.nbytes + self.sizes.nbytes


class ExtentSource(Protocol):
    """Chunks of one version `stat` of a shard that a reader may walk: the whole shard, or
    the part `part` of it (walks of two parts are told apart)."""

    @property
    def stat(self) -> Stat: ...

    @property
    def part(self) -> Hashable: ...

    @property
    def extents(self) -> Extents: ...


class HasExtents:
    """Mixin for a Zarr shard table: its extents, computed on first use and kept with it."""

    entries: np.ndarray
    stat: Stat
    part: ClassVar[Hashable] = None  #: the whole shard

    @cached_property
    def extents(self) -> Extents:
        return Extents.of_entries(self.entries)


ChunkKey = tuple[str, Hashable, int, int]
#: A shard version, or a part of one, as read-ahead tracks walks: (key, version, part).
Walk = tuple[str, Hashable, Hashable]
#: Finds the n-th extent source a walker of this one goes to next: (key, source), or None.
NextShard = Callable[[int], "tuple[str, ExtentSource] | None"]


class ReadAhead:
    """Reads whole chunks of shards, fetching their neighbours ahead. Thread-safe.

    With a store whose `request_cost` is 0, or a zero budget, it only passes
    reads through.
    """

    def __init__(self, storage: Storage, budget: int) -> None:
        self.storage = storage
        self.enabled = storage.request_cost > 0 and budget > 0
        self.cache: LruCache[bytes] = LruCache(budget, len)
        self.max_window = max(FIRST_WINDOW, storage.request_cost, min(MAX_WINDOW, budget // 4))
        self._lock = threading.Lock()
        self._pending: dict[ChunkKey, Future[None]] = {}
        #: What each recent shard version (or part) has seen (FETCHED, WALKED or NEXT_ASKED).
        self._seen: OrderedDict[Walk, int] = OrderedDict()
        self._prefetching = threading.BoundedSemaphore(PREFETCHES)
        #: Prefetches asked for, and the threads that take them (see `_start_worker`).
        self._jobs: queue.SimpleQueue[tuple[NextShard, int]] = queue.SimpleQueue()
        self._workers = 0
        #: Bytes that prefetches are fetching: at most half the cache, so that what they
        #: bring does not push out what walkers are about to read.
        self._ahead_bytes = 0
        #: Where the walker of each shard version (or part) that a reader reached by `read`
        #: goes next: what lets `hit` serve the rest of it with the same bookkeeping.
        self._next: dict[Walk, NextShard | None] = {}
        #: Ranged reads issued, and chunks they brought that had not been asked for.
        self.fetches = 0
        self.prefetched = 0

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats`: the cache's, its fetches, the chunks fetched ahead."""
        with self._lock:
            counts = {"fetches": self.fetches, "prefetched": self.prefetched}
        return {**self.cache.snapshot(), **counts}

    def read(
        self,
        pin: Pin,
        table: ExtentSource,
        offset: int,
        nbytes: int,
        next_shard: NextShard | None = None,
    ) -> bytes:
        """The `nbytes` bytes at `offset` of the shard `pin` holds, a chunk `table` lists.

        `next_shard` is called, in the background, once a reader is seen walking this shard
        (or part), to fetch ahead the ones the reader goes to next.
        """
        if not self.enabled:
            return pin.read(offset, nbytes)
        key, version = pin.key, table.stat.version
        walk: Walk = (key, version, table.part)
        wanted: ChunkKey = (key, version, offset, nbytes)
        while True:
            data = self.cache.peek(wanted)
            if data is not None:
                self._walked(walk, next_shard)
                return data
            if not may_block():
                raise WouldBlock
            with self._lock:
                waiting = self._pending.get(wanted)
            # Where the store holds it (asked only by a reader that is to fetch it, and
            # outside the lock: the answer may take a disk read).
            span = None if waiting else self.storage.local_span(key, offset, nbytes, version)
            with self._lock:
                waiting = self._pending.get(wanted)
                if waiting is None:
                    self._remember(walk, next_shard)
                    state = self._seen.get(walk, 0)  # (a walker's next asked for stays so)
                    self._note(walk, state + 1 if state < WALKED else state)
                    plan = self._plan(key, table, offset, nbytes, span, walked=state > 0)
                    future: Future[None] = Future()
                    for chunk in plan:
                        self._pending[chunk] = future
            if waiting is None:
                self._ask_next(walk, next_shard)
                return self._fetch(wanted, plan, future)
            # If its fetch failed, the next round fetches it here and meets the error first-hand.
            with contextlib.suppress(Exception):
                waiting.result()

    def hit(self, key: str, version: Hashable, offset: int, nbytes: int) -> bytes | None:
        """The chunk at `offset` of version `version` of shard `key` (a whole Zarr shard) if
        the cache has it and a reader of that version came by `read` before, as `read`
        would give it (a walker is noted, and its next shards are asked for); None
        otherwise. It never blocks: what a front end serves a chunk from without opening
        it."""
        walk: Walk = (key, version, None)
        with self._lock:
            if walk not in self._next:
                return None
            next_shard = self._next[walk]
        data = self.cache.peek((key, version, offset, nbytes))
        if data is not None:
            self._walked(walk, next_shard)
        return data

    def _walked(self, walk: Walk, next_shard: NextShard | None) -> None:
        """A chunk of `walk` was found in the cache: it was fetched with another, or ahead,
        so a reader walks it."""
        with self._lock:
            self._remember(walk, next_shard)
            if self._seen.get(walk, FETCHED) == FETCHED:
                self._note(walk, WALKED)
        self._ask_next(walk, next_shard)

    def _remember(self, walk: Walk, next_shard: NextShard | None) -> None:
        """Note where the walker of `walk`, which a read came by, goes next (for `hit`).
        Under the lock."""
        if walk not in self._next and len(self._next) >= TRACKED_SHARDS:
            self._next.clear()
        self._next[walk] = next_shard

    def cached(self, key: str, version: Hashable, offset: int, nbytes: int) -> bytes | None:
        """The chunk at `offset` of version `version` of shard `key` if the cache has it,
        also once a fetch on its way brings it (then it waits); None otherwise. It makes no
        request of its own."""
        wanted: ChunkKey = (key, version, offset, nbytes)
        data = self.cache.peek(wanted)
        if data is None:
            with self._lock:
                waiting = self._pending.get(wanted)
            if waiting is not None:
                if not may_block():
                    raise WouldBlock
                with contextlib.suppress(Exception):  # its reader meets the error
                    waiting.result()
                data = self.cache.peek(wanted)  # None if it was that reader's own chunk
        return data

    def _note(self, shard: Walk, state: int) -> None:
        self._seen[shard] = state
        self._seen.move_to_end(shard)
        if len(self._seen) > TRACKED_SHARDS:
            self._seen.popitem(last=False)

    def _ask_next(self, shard: Walk, next_shard: NextShard | None) -> None:
        """Once a reader walks `shard`, prefetch the shards it will walk next (once)."""
        if next_shard is None:
            return
        with self._lock:
            if self._seen.get(shard) != WALKED:
                return
            self._seen[shard] = NEXT_ASKED
        for n in range(1, AHEAD + 1):
            # When all are busy the shard is skipped: the walker of the one before asks again.
            if self._prefetching.acquire(blocking=False):
                self._jobs.put((next_shard, n))
                self._start_worker()

    def _start_worker(self) -> None:
        """One more prefetch thread, until there are `PREFETCHES`: they are kept while
        there is work (up to `WORKER_IDLE` seconds without), since starting a thread
        makes its starter wait until it runs, and the starter is often the event loop."""
        with self._lock:
            if self._workers >= PREFETCHES:
                return
            self._workers += 1
        threading.Thread(target=self._work, name="shardfs-prefetch", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=WORKER_IDLE)
            except queue.Empty:
                with self._lock:  # a job put meanwhile is taken, or finds one worker fewer
                    if self._jobs.empty():
                        self._workers -= 1
                        return
                continue
            self._prefetch(*job)

    def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the prefetches in flight: at the end of a mount,
        so that what they bring lands (a disk cache keeps it for the next mount) instead
        of being cut off as the daemon exits. No new ones start meanwhile."""
        deadline = time.monotonic() + timeout
        taken = 0
        while taken < PREFETCHES and self._prefetching.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            taken += 1
        for _ in range(taken):
            self._prefetching.release()

    def _plan(
        self,
        key: str,
        table: ExtentSource,
        offset: int,
        nbytes: int,
        span: tuple[int, int] | None,
        walked: bool,
    ) -> list[ChunkKey]:
        """The chunks to fetch with the one at `offset` (first in the list): its neighbours
        in the shard within the window, on both sides (concurrent readers do not ask in
        order), up to a gap bigger than `request_cost` (chunks already cached or on their
        way count as gap: reading over them beats another request). Where the store holds
        the chunk locally (`span`, from `Storage.local_span`), there is no round trip to
        save: the window is the span, which it reads for that chunk anyway."""
        version = table.stat.version
        gaps = self.storage.request_cost
        if span is not None:
            window = gaps = span[1] - span[0]
        elif not walked:
            window = max(FIRST_WINDOW, self.storage.request_cost)
        else:
            window = self.max_window
        extents = table.extents
        starts, sizes = extents.starts, extents.sizes
        at = int(np.searchsorted(starts, offset, side="left"))
        low, high = offset, offset + nbytes
        plan: list[ChunkKey] = [(key, version, offset, nbytes)]
        for step in (1, -1):
            i = at + 1 if step == 1 else at - 1
            while 0 <= i < len(starts):
                start, size = int(starts[i]), int(sizes[i])
                chunk = (key, version, start, size)
                if start >= low and start + size <= high:
                    i += step
                    continue  # within what is fetched already (the same chunk, or a duplicate)
                if chunk in self._pending or self.cache.peek(chunk) is not None:
                    i += step
                    continue  # had already: no reason to fetch it, but no reason to stop
                if span is not None and not span[0] <= start <= start + size <= span[1]:
                    break
                gap = start - high if step == 1 else low - (start + size)
                if max(high, start + size) - min(low, start) > window or gap > gaps:
                    break
                plan.append(chunk)
                low, high = min(low, start), max(high, start + size)
                i += step
        return plan

    def _prefetch(self, next_shard: NextShard, first: int) -> None:
        """Fetch the first window of the first shard that nobody walks or fetches yet among
        the `first`-th next one and every `AHEAD`-th after it, as a walker would. The
        `AHEAD` prefetches of a walker look at shards of their own, so that none waits
        for the index another is loading; a search stops at a shard that does not
        exist."""
        try:
            for n in range(first, LOOKAHEAD + 1, AHEAD):
                found = next_shard(n)
                if found is None or self._prefetch_shard(*found):
                    return
        except Exception as e:  # the reader that needs it will meet the error itself
            log.debug("prefetch of a shard ahead failed: %s", e)
        finally:
            self._prefetching.release()

    def _prefetch_shard(self, key: str, table: ExtentSource) -> bool:
        """Fetch the first window of `table` unless a reader or a prefetch got there first
        (or it has no chunk); whether it did."""
        extents = table.extents
        if not len(extents.starts):
            return False
        shard: Walk = (key, table.stat.version, table.part)
        first: ChunkKey = (key, shard[1], int(extents.starts[0]), int(extents.sizes[0]))
        span = self.storage.local_span(key, first[2], first[3], shard[1])
        with self._lock:
            if shard in self._seen:
                return False
            if first in self._pending or self.cache.peek(first) is not None:
                self._note(shard, WALKED)
                return True
            plan = self._plan(key, table, first[2], first[3], span, walked=True)
            start, end = _range(plan)
            size = end - start
            if self._ahead_bytes + size > self.cache.budget // 2:
                return True  # no room ahead: a walker that gets there fetches it
            self._note(shard, WALKED)  # its first reader will be walking it
            self._ahead_bytes += size
            future: Future[None] = Future()
            for chunk in plan:
                self._pending[chunk] = future
        try:
            self.cache.put(first, self._fetch(first, plan, future))
        finally:
            with self._lock:
                self._ahead_bytes -= size
        return True

    def _fetch(self, wanted: ChunkKey, plan: list[ChunkKey], future: Future[None]) -> bytes:
        key, version, _, _ = wanted
        start, end = _range(plan)
        try:
            data = self.storage.read(key, start, end - start, version)
            with self._lock:  # counted under the lock: fetches run in many threads
                self.fetches += 1
                self.prefetched += len(plan) - 1
            for chunk in plan[1:]:
                _, _, offset, size = chunk
                self.cache.put(chunk, data[offset - start : offset - start + size])
            return data[wanted[2] - start : wanted[2] - start + wanted[3]]
        finally:
            with self._lock:
                for chunk in plan:
                    self._pending.pop(chunk, None)
            future.set_result(None)


def _range(plan: list[ChunkKey]) -> tuple[int, int]:
    """The bytes [start, end) of the shard that one ranged read of the chunks of `plan` takes."""
    start = min(offset for _, _, offset, _ in plan)
    return start, max(offset + size for _, _, offset, size in plan)
