"""Chunk reads from stores where every request costs a round trip (S3).

A legacy reader asks for one chunk file at a time, so serving each read with
its own ranged GET would pay one round trip per chunk. Instead, when a
reader walks neighbouring chunks of one shard, the chunks that follow in the
shard are fetched with the one it asked for, in one ranged GET (reading over
gaps smaller than the store's `request_cost`), into a bounded cache where
the next reads find them. The window starts small, so a random reader
wastes little, and doubles with each fetch from the same shard version, up
to `MAX_WINDOW`. Fetches in flight are shared: a read of a chunk that is on
its way waits for it rather than asking again.

Entries are keyed by the shard's version, so bytes of two versions never mix.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import Future
from functools import cached_property

import numpy as np

from shardfs.formats.shard_index import EMPTY
from shardfs.storage.base import Stat, Storage
from shardfs.storage.blocking import WouldBlock, may_block
from shardfs.view.cache import LruCache

#: The first fetch from a shard: small, as one chunk may be all a reader wants.
FIRST_WINDOW = 256 << 10
#: The largest fetch (also limited to a quarter of the cache).
MAX_WINDOW = 16 << 20
#: Shards whose window size is remembered.
TRACKED_SHARDS = 4096


class Extents:
    """The non-empty chunks of one shard version, sorted by offset: where to look ahead."""

    def __init__(self, entries: np.ndarray) -> None:
        flat = entries.reshape(-1, 2)
        used = flat[flat[:, 1] != EMPTY]
        order = np.lexsort((used[:, 1], used[:, 0]))
        self.starts = used[order, 0].astype(np.int64)
        self.sizes = used[order, 1].astype(np.int64)

    @property
    def nbytes(self) -> int:
        return self.starts.nbytes + self.sizes.nbytes


class HasExtents:
    """Mixin for a shard table: its extents, computed on first use and kept with it."""

    entries: np.ndarray
    stat: Stat

    @cached_property
    def extents(self) -> Extents:
        return Extents(self.entries)


ChunkKey = tuple[str, Hashable, int, int]


class ReadAhead:
    """Reads whole chunks of shards, fetching their neighbours ahead. Thread-safe.

    With a store whose `request_cost` is 0, or a zero budget, it only passes
    reads through.
    """

    def __init__(self, storage: Storage, budget: int) -> None:
        self.storage = storage
        self.enabled = storage.request_cost > 0 and budget > 0
        self.cache: LruCache[bytes] = LruCache(budget, len)
        self.max_window = max(FIRST_WINDOW, min(MAX_WINDOW, budget // 4))
        self._lock = threading.Lock()
        self._pending: dict[ChunkKey, Future[None]] = {}
        self._windows: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        #: Ranged reads issued, and chunks they brought that had not been asked for.
        self.fetches = 0
        self.prefetched = 0

    def read(self, key: str, table: HasExtents, offset: int, nbytes: int) -> bytes:
        """The `nbytes` bytes at `offset` of shard `key` (version `table.stat.version`)."""
        version = table.stat.version
        if not self.enabled:
            return self.storage.read(key, offset, nbytes, version)
        wanted: ChunkKey = (key, version, offset, nbytes)
        while True:
            data = self.cache.peek(wanted)
            if data is not None:
                return data
            if not may_block():
                raise WouldBlock
            with self._lock:
                waiting = self._pending.get(wanted)
                if waiting is None:
                    plan = self._plan(key, table, offset, nbytes)
                    future: Future[None] = Future()
                    for chunk in plan:
                        self._pending[chunk] = future
            if waiting is None:
                return self._fetch(wanted, plan, future)
            # If its fetch failed, the next round fetches it here and meets the error first-hand.
            with contextlib.suppress(Exception):
                waiting.result()

    def _plan(self, key: str, table: HasExtents, offset: int, nbytes: int) -> list[ChunkKey]:
        """The chunks to fetch with the one at `offset`: it, and those that follow it
        within the shard's window, up to a big gap or one already cached or on its way."""
        version = table.stat.version
        shard = (key, version)
        window = self._windows.get(shard)
        window = FIRST_WINDOW if window is None else min(self.max_window, 2 * window)
        self._windows[shard] = window
        self._windows.move_to_end(shard)
        if len(self._windows) > TRACKED_SHARDS:
            self._windows.popitem(last=False)
        plan: list[ChunkKey] = [(key, version, offset, nbytes)]
        extents = table.extents
        end = offset + nbytes
        at = int(np.searchsorted(extents.starts, offset, side="right"))
        gap = self.storage.request_cost
        for start, size in zip(
            extents.starts[at:].tolist(), extents.sizes[at:].tolist(), strict=True
        ):
            chunk = (key, version, start, size)
            if (
                start + size - offset > window
                or start - end > gap
                or chunk in self._pending
                or self.cache.peek(chunk) is not None
            ):
                break
            if start + size <= end:
                continue  # lies within what is fetched already (a duplicate entry)
            plan.append(chunk)
            end = start + size
        return plan

    def _fetch(self, wanted: ChunkKey, plan: list[ChunkKey], future: Future[None]) -> bytes:
        key, version, start, _ = plan[0]
        end = max(offset + size for _, _, offset, size in plan)
        try:
            data = self.storage.read(key, start, end - start, version)
            self.fetches += 1
            self.prefetched += len(plan) - 1
            for chunk in plan[1:]:
                _, _, offset, size = chunk
                self.cache.put(chunk, data[offset - start : offset - start + size])
            return data[: wanted[3]]
        finally:
            with self._lock:
                for chunk in plan:
                    self._pending.pop(chunk, None)
            future.set_result(None)
