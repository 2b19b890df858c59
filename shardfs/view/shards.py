"""Where the chunks of the arrays a Zarr view serves are stored: shard keys, decoded
shard indexes, and an array's chunk key space (its chunk directories and the chunk files
its shards hold).

A shard's index is read the first time one of its chunks is needed, into one bounded
LRU cache (`indexes`) keyed by the shard's version, and so are the chunk runs of
directory listings (`listings`): a shard changed behind the mount's back is read
again, never mixed with what was read before. Nothing here knows how the view
presents an array (v3 or v2): an `ArrayView` says how its chunks are named.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import crc32c
import numpy as np

from shardfs.formats.shard_index import EMPTY
from shardfs.formats.zarr_v3 import ShardedLayout
from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import CorruptData, MissingChunk, NotADirectory, NotFound
from shardfs.storage.base import Entry, Pin, Stat, Storage
from shardfs.view.base import latest, verified
from shardfs.view.hierarchy import join
from shardfs.view.nodes import ArrayView, Attr, ChunkRun, Node, Role, ShardTable

#: `EMPTY` as a Python int, for comparing with entries read out with `tolist`
EMPTY_NBYTES = int(EMPTY)
#: Shard keys kept encoded (see `Shards.key`); all are dropped when full.
SHARD_KEYS_KEPT = 4096

Entries = list[tuple[str, Node, Attr]]


@dataclass(frozen=True, eq=False)
class DirRows:
    """The non-empty chunks of one shard version, grouped by the deepest chunk directory
    that lists them (the chunks that share every coordinate but the last). Made once per
    shard version, with a few operations over its whole index: a listing then takes a
    directory's rows of each shard with two slices, where searching the index for them
    took a dozen array operations per directory and shard (docs/design.md)."""

    #: the rows of directory d (its coordinates in the shard, in C order) are
    #: [bounds[d], bounds[d + 1])
    bounds: np.ndarray
    #: each row's grid coordinate along the last axis, and where it is stored
    last: np.ndarray
    extents: np.ndarray

    @classmethod
    def of(cls, table: ShardTable, origin: int, end: int) -> DirRows:
        """The rows of `table`, a shard whose chunks start at grid coordinate `origin` along
        the last axis; those at `end` or past it (outside the grid) are left out."""
        cps = table.entries.shape[:-1]
        flat = table.entries.reshape(-1, 2)
        used = np.flatnonzero(flat[:, 1] != EMPTY)
        last = used % cps[-1] + origin
        inside = last < end
        used, last = used[inside], last[inside]
        bounds = np.searchsorted(used // cps[-1], np.arange(math.prod(cps[:-1]) + 1))
        return cls(bounds, last, flat[used].astype(np.int64))

    @property
    def cost(self) -> int:
        return self.bounds.nbytes + self.last.nbytes + self.extents.nbytes + 256


def table_cost(layout: ShardedLayout) -> int:
    """What the decoded index of one shard of `layout` costs in `Shards.indexes`
    (`ShardTable.cost` of its 16 bytes per view chunk), known before one is read."""
    return 2 * 16 * math.prod(layout.chunks_per_shard) + 256


def _listing_cost(value: list[ChunkRun] | DirRows) -> int:
    if isinstance(value, DirRows):
        return value.cost
    return sum(run.cost for run in value) + 256


def listed(storage: Storage, key: str) -> list[Entry]:
    """The entries of source directory `key`; none if it is not a directory (any more)."""
    try:
        return storage.list(key)
    except (NotFound, NotADirectory):
        return []


class Shards:
    """The shards of one source's arrays. Thread-safe; every method may block on storage."""

    def __init__(self, storage: Storage, index_cache: int, listing_cache: int) -> None:
        self.storage = storage
        #: Called with a shard's key before its index is read: waits while this
        #: process is writing that shard (see `shardfs.writeback`).
        self.guard: Callable[[str], None] | None = None
        self.indexes: LruCache[ShardTable] = LruCache(
            index_cache, lambda t: t.cost, cache_errors=(CorruptData,)
        )
        #: The chunk runs of directory listings (see `runs`), and the `DirRows` of the
        #: shard versions they are made from.
        self.listings: LruCache[list[ChunkRun] | DirRows] = LruCache(listing_cache, _listing_cost)
        self._keys: dict[tuple[str, str, str, tuple[int, ...]], str] = {}

    def key(self, array: ArrayView, shard: tuple[int, ...]) -> str:
        """The source key of a shard of `array` (or of a plain array's chunk object)."""
        # Asked for on every lookup and read of a chunk, for the same few shards; by the
        # encoding's name and separator, which hash in C (its dataclass hash runs Python).
        keys = array.layout.keys
        memo = (array.data, keys.name, keys.separator, shard)
        key = self._keys.get(memo)
        if key is None:
            key = join(array.data, array.layout.keys.encode(shard))
            if len(self._keys) >= SHARD_KEYS_KEPT:
                self._keys.clear()
            self._keys[memo] = key
        return key

    def locate(self, array: ArrayView, coords: tuple[int, ...]) -> tuple[str, ShardTable, int, int]:
        """(shard key, table, offset, nbytes) of a non-empty chunk; NotFound otherwise."""
        layout = array.layout
        if not layout.in_bounds(coords):
            raise MissingChunk(array.names.encode(coords))
        shard, local = layout.shard_of(coords)
        table = self.table(array, shard)
        if table is None:
            raise MissingChunk(array.names.encode(coords))
        # as Python ints at once: numpy scalars cost more to make and to compare
        offset, nbytes = table.entries[local].tolist()
        if nbytes == EMPTY_NBYTES:
            raise MissingChunk(array.names.encode(coords))
        return self.key(array, shard), table, offset, nbytes

    def table(
        self, array: ArrayView, shard: tuple[int, ...], listed: Stat | None = None
    ) -> ShardTable | None:
        """The decoded index of a shard, or None if the shard does not exist.

        `listed` is the shard's stat from a listing just taken, which saves asking
        for it again (unless this process may have written the shard since). A
        plain (unsharded) array's chunk object is its own one-entry table, made
        from its stat without a read or a cache entry.
        """
        key = self.key(array, shard)
        if self.guard is not None:
            self.guard(key)
            listed = None  # it may have been written while we waited
        elif array.layout.levels:
            # The index of this version is usually cached already: no retries to set up.
            listed = listed or self.storage.stat(key)
            if listed is None or listed.is_dir:
                return None
            cached = self.cached_table(key, listed.version)
            if cached is not None:
                return cached

        def load(stat: Stat) -> ShardTable:
            if not array.layout.levels:
                entries = np.array([0, stat.size], dtype=np.uint64)
                shape = (1,) * array.layout.ndim + (2,)
                return ShardTable(stat, entries.reshape(shape), stat.size)
            cache_key = (key, stat.version)
            table = self.indexes.get(cache_key, lambda: self._load_table(array, key, stat))
            if table.end != stat.size:
                self.indexes.discard(cache_key)  # an append is under way: see `_load_table`
            return table

        return latest(self.storage, key, load, listed, "its index is read")

    def cached_table(self, key: str, version: Hashable) -> ShardTable | None:
        """The index of `version` of shard `key` if the cache holds it whole, without
        loading it (a writer's `guard` must be passed first: see `table`)."""
        cached = self.indexes.peek((key, version))
        return cached if cached is not None and cached.end == cached.stat.size else None

    def next_shard(
        self, array: ArrayView, shard: tuple[int, ...], n: int
    ) -> tuple[str, ShardTable] | None:
        """The `n`-th shard after `shard` in C order, with its table, if it exists: where a
        reader walking the whole array goes next."""
        grid = array.layout.shard_grid
        position = int(np.ravel_multi_index(shard, grid)) + n
        if position >= math.prod(grid):
            return None
        coords = tuple(int(c) for c in np.unravel_index(position, grid))
        table = self.table(array, coords)
        return (self.key(array, coords), table) if table is not None else None

    def _load_table(self, array: ArrayView, key: str, stat: Stat) -> ShardTable:
        """The index of version `stat` of a shard, trusted only when it is complete.

        While an append to the shard is under way, or was left torn by a writer
        that died, the store's record of it (`append_in_progress`) says where the
        shard ended before: the index there is the last complete one, and the
        table is made from it (a tail that does not verify: see `verified`).
        """
        layout = array.layout
        cps = layout.chunks_per_shard
        count = math.prod(cps)
        entries = np.empty((count, 2), dtype=np.uint64)
        before = self.storage.append_in_progress(key, stat)
        end = stat.size if before is None else before
        pin = self.storage.pin(key, stat)
        try:
            raw = verified(
                self.storage,
                key,
                stat,
                lambda: self._fill(array, pin, 0, 0, end, None, entries),
            )
        finally:
            pin.close()
        return ShardTable(stat, entries.reshape((*cps, 2)), end, crc32c.crc32c(raw))

    def _fill(
        self,
        array: ArrayView,
        pin: Pin,
        level: int,
        start: int,
        length: int,
        rows: np.ndarray | None,
        out: np.ndarray,
    ) -> bytes:
        """Resolve the view chunks `rows` (None: all of them, the outermost shard)
        through the shard (or nested shard) at [start, start+length) of `pin`'s version;
        returns the index read there."""
        spec = array.layout.levels[level]
        at = start + spec.index_offset(length)
        if level == 0 and not spec.index_at_start and length == pin.stat.size:
            raw = pin.read_tail(spec.index_size)
        else:
            raw = pin.read(at, spec.index_size)
        index = spec.decode_index(raw, length)
        slots = array.slots[level] if rows is None else array.slots[level][rows]
        picked = index[slots]
        used = picked[:, 1] != EMPTY
        if start:
            picked[used, 0] += np.uint64(start)
        if level + 1 == len(array.layout.levels):
            if rows is None:
                out[:] = picked  # (indexing with every row costs several times more)
            else:
                out[rows] = picked
            return raw
        if rows is None:
            rows = np.arange(len(out))
        out[rows[~used]] = EMPTY
        for slot in np.unique(slots[used]):
            offset, nbytes = (int(v) for v in index[slot])
            self._fill(array, pin, level + 1, start + offset, nbytes, rows[slots == slot], out)
        return raw

    # -- the chunk key space -----------------------------------------------------------

    def key_node(self, parent: Node, name: str) -> Node | None:
        """What `name` in an array or chunk directory names in the array's key space,
        whether or not it exists: a CHUNK, a CHUNK_DIR, or None (not a key)."""
        array = parent.array
        layout, names = array.layout, array.names
        if parent.role is Role.ARRAY:
            if name in array.docs or not names.owns(name, layout.ndim):
                return None
            parts = [name]
        else:
            rest = parent.path[len(array.key) :].lstrip("/")
            parts = [*(rest.split("/") if rest else []), name]
        path = join(parent.path, name)
        coords = names.decode("/".join(parts), layout.ndim)
        if coords is not None:
            return Node(path, Role.CHUNK, array, coords)
        prefix = names.dir_depth(parts, layout.ndim)
        if prefix is None or not all(0 <= i < g for i, g in zip(prefix, layout.grid, strict=False)):
            return None
        return Node(path, Role.CHUNK_DIR, array, prefix)

    def directory(self, array: ArrayView, prefix: tuple[int, ...]) -> str:
        """The source directory holding the shards of the view chunks starting with `prefix`."""
        layout = array.layout
        cps = layout.chunks_per_shard
        shard_prefix = tuple(i // n for i, n in zip(prefix, cps, strict=False))
        directory = layout.keys.dir_path(shard_prefix)
        return join(array.data, directory) if directory else array.data

    def has_directory(self, array: ArrayView, prefix: tuple[int, ...]) -> bool:
        """Whether chunk directory `prefix` exists: the source directory behind it does."""
        stat = self.storage.stat(self.directory(array, prefix))
        return stat is not None and stat.is_dir

    @staticmethod
    def holds_shards(node: Node) -> bool:
        """Whether the source directory behind chunk directory `node` holds shards (its
        chunk files), not directories."""
        return node.role is Role.CHUNK_DIR and len(node.coords) == node.array.layout.ndim - 1

    def array_entries(self, array: ArrayView, data: list[Entry]) -> tuple[Entries, list[ChunkRun]]:
        """The chunk directories and chunk files shown in an array's directory, given the
        entries of its source directory `data`."""
        layout, names = array.layout, array.names
        if not names.nested:
            shards = []
            for entry in data:
                shard = layout.keys.decode(entry.name, layout.ndim)
                if shard is not None and not entry.stat.is_dir:
                    shards.append((shard, entry.stat))
            return [], self.runs(array, array.key, shards, ())
        top = self.directory(array, ())
        if names.name == "default":  # every chunk lies below "c"
            stat = self.storage.stat(top)
            if stat is None or not stat.is_dir:
                return [], []
            return [("c", Node(join(array.key, "c"), Role.CHUNK_DIR, array, ()), Attr.of(stat))], []
        source = data if top == array.data else listed(self.storage, top)
        return self._entries(array, (), array.key, source)

    def chunk_dir_entries(
        self, array: ArrayView, prefix: tuple[int, ...]
    ) -> tuple[Entries, list[ChunkRun]]:
        """The entries of the chunk directory of `array` fixing `prefix`."""
        path = join(array.key, array.names.dir_path(prefix))
        return self._entries(array, prefix, path, self.storage.list(self.directory(array, prefix)))

    def _entries(
        self, array: ArrayView, prefix: tuple[int, ...], path: str, entries: list[Entry]
    ) -> tuple[Entries, list[ChunkRun]]:
        """The view entries of the chunk directory `path` fixing `prefix`, given the
        entries of the source directory holding the matching shards: its
        subdirectories, and its chunk files in runs."""
        layout = array.layout
        depth = len(prefix)
        cps, grid = layout.chunks_per_shard, layout.grid
        leaf = depth == layout.ndim - 1
        listing: Entries = []
        shards = []
        for entry in entries:
            index = layout.keys.component(entry.name, depth)
            if index is None or entry.stat.is_dir == leaf:
                continue
            shard_prefix = (*(i // n for i, n in zip(prefix, cps, strict=False)), index)
            if leaf:
                shards.append((shard_prefix, entry.stat))
                continue
            for i in range(index * cps[depth], min((index + 1) * cps[depth], grid[depth])):
                node = Node(join(path, str(i)), Role.CHUNK_DIR, array, (*prefix, i))
                listing.append((str(i), node, Attr.of(entry.stat)))
        return listing, self.runs(array, path, shards, prefix)

    def runs(
        self,
        array: ArrayView,
        path: str,
        shards: list[tuple[tuple[int, ...], Stat]],
        prefix: tuple[int, ...],
    ) -> list[ChunkRun]:
        """The chunk files whose coordinates start with `prefix` in `shards` (coordinates
        and stat as listed), listed in the view directory `path`. Kept in the listing
        cache under the versions of the metadata and of every shard it is made from."""
        versions = tuple((shard, stat.version) for shard, stat in shards)
        key = (path, array.metadata.version, versions)
        runs = self.listings.get(key, lambda: self._make_runs(array, path, shards, prefix))
        assert isinstance(runs, list)
        return runs

    def _make_runs(
        self, array: ArrayView, path: str, shards: list, prefix: tuple
    ) -> list[ChunkRun]:
        """One run for all of `shards` (see `runs`), made with a few array operations."""
        layout = array.layout
        local = tuple(i % n for i, n in zip(prefix, layout.chunks_per_shard, strict=False))
        found = []
        for shard, stat in sorted(shards, key=lambda item: item[0]):
            table = self.table(array, shard, stat)
            if table is not None:
                found.append((shard, table))
        if not found:
            return []
        keys = [(self.key(array, shard), table.stat) for shard, table in found]
        if len(prefix) == layout.ndim - 1:
            return self._deepest_runs(array, path, found, keys, prefix)
        extents = np.stack([table.entries[local] for _, table in found])
        hits = np.argwhere(extents[..., 1] != EMPTY)
        which = hits[:, 0].astype(np.int32)
        origins = np.array([shard for shard, _ in found], dtype=np.int64)
        origins *= np.asarray(layout.chunks_per_shard, dtype=np.int64)
        fixed = np.broadcast_to(np.asarray(local, dtype=np.int64), (len(hits), len(local)))
        coords = origins[which] + np.hstack([fixed, hits[:, 1:]])
        keep = (coords < np.asarray(layout.grid, dtype=np.int64)).all(axis=1)
        extents = extents[tuple(hits[keep].T)].astype(np.int64)
        if not len(extents):
            return []
        sizes = array.served_sizes(extents[:, 1])
        return [ChunkRun(array, path, keys, which[keep], coords[keep], extents, sizes)]

    def _deepest_runs(
        self,
        array: ArrayView,
        path: str,
        found: list[tuple[tuple[int, ...], ShardTable]],
        keys: list[tuple[str, Stat]],
        prefix: tuple[int, ...],
    ) -> list[ChunkRun]:
        """`_make_runs` of a directory that lists chunk files only, from the `DirRows` of
        its shards `found`."""
        layout = array.layout
        cps = layout.chunks_per_shard
        d = 0  # the directory's place among those of a shard, in C order
        for i, n in zip(prefix, cps, strict=False):
            d = d * n + i % n
        which, parts = [], []
        for i, ((shard, table), (key, _)) in enumerate(zip(found, keys, strict=True)):
            memo = ("rows", key, table.stat.version, table.end, layout.grid[-1])
            origin = shard[-1] * cps[-1]
            rows = self.listings.get(
                memo, functools.partial(DirRows.of, table, origin, layout.grid[-1])
            )
            assert isinstance(rows, DirRows)
            lo, hi = rows.bounds[d : d + 2].tolist()
            if lo < hi:
                which.append(i)
                parts.append((rows, lo, hi))
        if not parts:
            return []
        counts = [hi - lo for _, lo, hi in parts]
        coords = np.empty((sum(counts), layout.ndim), dtype=np.int64)
        coords[:, :-1] = prefix
        coords[:, -1] = np.concatenate([rows.last[lo:hi] for rows, lo, hi in parts])
        extents = np.concatenate([rows.extents[lo:hi] for rows, lo, hi in parts])
        shard_of = np.repeat(np.array(which, dtype=np.int32), counts)
        sizes = array.served_sizes(extents[:, 1])
        return [ChunkRun(array, path, keys, shard_of, coords, extents, sizes)]
