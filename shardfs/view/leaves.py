"""Directories of chunk files, prepared for the lookups of a cold read (issue 33).

A first read of an array looks up each of its chunk files once. Finding out
what the directory is (its node, its array's metadata, the key parts it fixes)
was most of such a lookup's cost, and the same for every file in the
directory. A `ChunkDirectory` holds that answer as of one version of the
array's stored document, so that a lookup there does what freshness needs and
little more: one stat of that document, the name decoded, one stat of the
shard and its index entry from the index cache.

It needs no invalidation: the document's stat is the check, and whatever it
cannot vouch for (another version, a name that is no chunk key, an array the
metadata cache let go) is left to the long way (`Namespace.entry`), which
makes a new one. A shard whose index is not in the cache is located as any
lookup locates a chunk (`Shards.locate`, which reads the index). In the daemon a handler costs
about what it touches (see docs/design.md), so the common case, a directory
whose chunk names are one integer each (`c/0/1/<k>`), is served from numbers
worked out once here, with no call per axis.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable

import numpy as np

from shardfs.primitives.errors import MissingChunk
from shardfs.storage.base import Stat
from shardfs.view.interface import Found, Rows
from shardfs.view.nodes import ArrayView, Attr, Extent
from shardfs.view.shards import EMPTY_NBYTES, Shards

#: Prepared chunk directories a view (and a front end) keeps; all dropped when full.
DIRECTORIES_KEPT = 4096
#: Up to this many rows, `shard_rows` takes them one by one rather than with numpy.
FEW_ROWS = 64
#: Shard keys a directory keeps (see `ChunkDirectory._key`); all dropped when full.
KEYS_KEPT = 1024


class ChunkDirectory:
    """The chunk files of one directory (`parts`: the key parts it fixes, "" or ending in
    the separator) of `array`, whose stored document `doc_key` is at version `doc`.
    Thread-safe: nothing in it changes but a memo."""

    __slots__ = (
        "_array",
        "_as_stored",
        "_base",
        "_doc",
        "_doc_key",
        "_doc_version",
        "_keys",
        "_limit",
        "_local",
        "_parts",
        "_per_shard",
        "_prefix",
        "_seen",
        "_shard",
        "_shards",
        "_version",
        "array_key",
    )

    def __init__(
        self, version: Callable[[str], Hashable | None], shards: Shards, array: ArrayView,
        doc_key: str, doc: Stat, parts: str,
    ) -> None:  # fmt: skip
        self.array_key = array.key
        #: weakly: the metadata cache owns the array's budget (see the module's docstring)
        self._array = weakref.ref(array)
        self._as_stored = array.served_as_stored
        self._version = version
        self._shards = shards
        self._doc_key = doc_key
        self._doc = doc
        self._doc_version = doc.version
        self._parts = parts
        self._keys: dict[int, str] = {}
        self._seen: dict[str, dict[str, Stat | None]] = {}
        layout = array.layout
        fixed = array.names.decode(parts + "0", layout.ndim) if layout.ndim else None
        #: Where a name is one integer k (the last axis of a nested key space), chunk k is
        #: `_prefix + (k,)`, in shard `_shard + (k // _per_shard,)` at entry `_local + (k %
        #: _per_shard,)`, grid index `_base + k`, for k < `_limit`; elsewhere (`_limit`
        #: None) names are decoded whole.
        self._limit: int | None = None
        self._prefix: tuple[int, ...] = ()
        self._shard: tuple[int, ...] = ()
        self._local: tuple[int, ...] = ()
        self._per_shard = self._base = 1
        if fixed is not None and array.names.separator == "/" and layout.levels:
            prefix, grid, cps = fixed[:-1], layout.grid, layout.chunks_per_shard
            self._limit = grid[-1] if layout.in_bounds(fixed) else 0
            self._prefix = prefix
            self._shard = tuple(c // n for c, n in zip(prefix, cps, strict=False))
            self._local = tuple(c % n for c, n in zip(prefix, cps, strict=False))
            self._per_shard = cps[-1]
            self._base = _ravel(prefix, grid[:-1]) * grid[-1]

    @property
    def document(self) -> tuple[str, Stat]:
        """The array's stored document, and the version this directory was made as of."""
        return self._doc_key, self._doc

    def shard_rows(self, found: Found) -> Rows | None:
        """The chunk files of this directory stored in the shard, and its version, that
        `found` (what `entry` found here) is stored in: their names, grid indices, offsets
        and lengths, as the shard's index says; for a front end that answers their lookups
        itself. None where names are decoded whole, chunks are not served as stored, or
        the index is no longer cached."""
        extent = found[3].extent
        if self._limit is None or not self._as_stored or extent is None or self._shards.guard:
            return None
        table = self._shards.indexes.peek((extent.key, extent.stat.version))
        k = found[2] - self._base
        if table is None or table.stat is not extent.stat or table.end != table.stat.size:
            return None
        if not 0 <= k < self._limit:
            return None
        first = k - k % self._per_shard
        stop = min(first + self._per_shard, self._limit)
        entries = table.entries[self._local][: stop - first]
        if stop - first <= FEW_ROWS:  # a loop over few rows costs less than numpy's calls
            names, indices, offsets, lengths = [], [], [], []
            base = self._base + first
            for i, (offset, nbytes) in enumerate(entries.tolist()):
                if nbytes != EMPTY_NBYTES:
                    names.append(b"%d" % (first + i))
                    indices.append(base + i)
                    offsets.append(offset)
                    lengths.append(nbytes)
            return names, indices, offsets, lengths
        present = entries[:, 1] != EMPTY_NBYTES
        ks = np.arange(first, stop)[present]
        return (
            [str(n).encode() for n in ks.tolist()],
            (ks + self._base).tolist(),
            entries[present, 0].tolist(),
            entries[present, 1].tolist(),
        )

    def names_ahead(self, found: Found, count: int) -> list[str]:
        """The first chunk file of each of the `count` shards after the one `found` is
        stored in, in this directory: where a reader going through it in key order looks
        next (empty where names are decoded whole)."""
        if self._limit is None:
            return []
        k = found[2] - self._base
        first = k - k % self._per_shard + self._per_shard
        stop = min(first + count * self._per_shard, self._limit)
        return [str(n) for n in range(first, stop, self._per_shard)]

    def entry(self, name: str) -> Found | None:
        """The chunk file `name` (MissingChunk if the array has no such chunk), or None
        where only the long way can tell (see the module's docstring)."""
        array = self._array()
        if array is None:
            return None
        if self._version(self._doc_key) != self._doc_version:
            return None
        shards = self._shards
        limit = self._limit
        coords: tuple[int, ...] | None
        if (
            limit is not None
            and name.isdigit()
            and name.isascii()
            and (name[0] != "0" or len(name) == 1)  # the canonical spelling, as `parse_index`
            and shards.guard is None
        ):
            k = int(name)
            if k >= limit:
                raise MissingChunk(self._parts + name)
            shard, local = divmod(k, self._per_shard)
            key = self._keys.get(shard)
            if key is None:
                key = self._key(array, shard)
            coords, local_at, index = (*self._prefix, k), (*self._local, local), self._base + k
        else:
            layout = array.layout
            coords = array.names.decode(self._parts + name, layout.ndim)
            if coords is None:
                return None
            if not layout.levels or shards.guard is not None:
                return self._located(array, coords, _ravel(coords, layout.grid))
            if not layout.in_bounds(coords):
                raise MissingChunk(self._parts + name)
            shard_at, local_at = layout.shard_of(coords)
            key, index = shards.key(array, shard_at), _ravel(coords, layout.grid)
        version = self._version(key)
        if version is None:
            raise MissingChunk(self._parts + name)
        table = shards.indexes.peek((key, version))  # `Shards.cached_table`, inline
        if table is None or table.end != table.stat.size:
            return self._located(array, coords, index)
        offset, nbytes = table.entries[local_at].tolist()
        if nbytes == EMPTY_NBYTES:
            raise MissingChunk(self._parts + name)
        stat = table.stat
        if self._as_stored:  # `Attr.of_chunk`, inline: a frame less per chunk file
            attr = Attr(
                False,
                nbytes,
                stat.mtime_ns,
                Extent(key, stat, offset, nbytes),
                stat.access,
                (key, stat),
            )
        else:
            attr = Attr.of_chunk(array, key, stat, offset, nbytes)
        seen = self._seen.get(key)
        if seen is None or seen[key] is not stat:
            seen = self._seen_of(key, stat)
        return array, coords, index, attr, seen

    def _located(self, array: ArrayView, coords: tuple[int, ...], index: int) -> Found:
        """The chunk at `coords` located the way any lookup does (`Shards.locate`): where
        its shard's index must be read first, or a writer's guard passed."""
        key, table, offset, nbytes = self._shards.locate(array, coords)
        attr = Attr.of_chunk(array, key, table.stat, offset, nbytes)
        return array, coords, index, attr, {self._doc_key: self._doc, key: table.stat}

    def _seen_of(self, key: str, stat: Stat) -> dict[str, Stat | None]:
        """The versions a chunk of shard `key` at `stat` is shown from: one dict for all
        its chunks, never changed (a show that gets the same one again need not look
        at the versions it keeps: see `KernelVersions.show`)."""
        if len(self._seen) >= KEYS_KEPT:
            self._seen.clear()
        seen = self._seen[key] = {self._doc_key: self._doc, key: stat}
        return seen

    def _key(self, array: ArrayView, shard: int) -> str:
        if len(self._keys) >= KEYS_KEPT:
            self._keys.clear()
        key = self._keys[shard] = self._shards.key(array, (*self._shard, shard))
        return key


def _ravel(coords: tuple[int, ...], grid: tuple[int, ...]) -> int:
    """The index of `coords` in `grid`, C order (as `np.ravel_multi_index`, slow for one)."""
    index = 0
    for coord, size in zip(coords, grid, strict=True):
        index = index * size + coord
    return index
