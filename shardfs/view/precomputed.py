"""The read-only view of a Neuroglancer precomputed volume: sharded scales shown unsharded.

Every path of the view is the same path in the source. The root `info` is
rewritten without the `sharding` entries of the scales the view unshards; in
such a scale's directory the shard files are replaced by one file per chunk
they hold, named by its voxel box (`x0-x1_y0-y1_z0-z1`) and holding the chunk's
encoded bytes with the sharding's data_encoding undone. Everything else
(unsharded scales, meshes, skeletons, other files) passes through.

As in `shardfs.view.namespace`, nothing is scanned up front: a path is
classified against the current `info` when it is asked for, and a shard's
fixed index and minishard indexes are read when one of their chunks is
needed, into one bounded LRU cache keyed by the shard's version. What an index
may cost is bounded before it is read: a minishard index by the chunks its
minishard can hold and a share of that cache (`MINISHARD_SHARE`), a fixed index
by reading one too big to keep (`WHOLE_INDEX_SHARE`) an entry at a time.

Where requests are costly (S3), chunks are read through `ReadAhead`, one minishard
at a time: a minishard's index is all that locates its chunks, and writers store
them together, in chunk id order. Which minishard a walker goes to next is
known only under the identity hash, where the next minishard, then the first of
the next shard file, holds the chunk ids that follow (the next block in Morton
order, with `preshift_bits`); a murmurhash spreads neighbouring chunks over
unrelated minishards and shards, so nothing is fetched ahead of those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardfs.formats.precomputed import (
    FIXED_ENTRY,
    GZIP_MIN,
    INFO,
    Minishard,
    Position,
    Scale,
    Volume,
    is_volume,
    parse_info,
)
from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import (
    CorruptData,
    InvalidMetadata,
    IsADirectory,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import Entry, Stat, Storage
from shardfs.view.base import (
    Chunk,
    Reader,
    SourceView,
    entry_path,
    latest,
    logged_corruption,
    open_again,
    stored_file,
    verified,
)
from shardfs.view.hierarchy import join
from shardfs.view.nodes import Attr, Listing, Node, Role
from shardfs.view.readahead import Extents, NextShard, ReadAhead

log = logging.getLogger("shardfs")

#: The most bytes one merged read of gzip trailers may span (see `_read_ranges`).
MAX_SPAN = 16 << 20
#: Minishards fetched ahead of a walker (see `ahead`).
MINISHARDS_AHEAD = 2
#: A minishard index may decode to at most index_cache / MINISHARD_SHARE bytes: decoded, it
#: costs twice that in the cache (48 bytes a chunk), and others need room there too.
MINISHARD_SHARE = 4
#: A shard's fixed index is read whole (and cached) if it is at most index_cache /
#: WHOLE_INDEX_SHARE bytes; a bigger one an entry (16 bytes) at a time for a lookup.
WHOLE_INDEX_SHARE = 16
#: Entries of a fixed index not read whole that one read covers when a listing, or a
#: walker looking for its next minishards, goes through them (1 MiB).
INDEX_PIECE = 1 << 16


@dataclass(frozen=True)
class PrecomputedSource:
    """A source whose root `info` describes a Neuroglancer precomputed volume."""

    storage: Storage
    volume: Volume


def open_volume(storage: Storage) -> PrecomputedSource | None:
    """The volume at the root of `storage`, or None if its root has no `info` that claims
    to be a multiscale volume; InvalidMetadata if it claims to but is not valid."""
    stat = storage.stat(INFO)
    if stat is None or stat.is_dir:
        return None
    raw = storage.read(INFO, 0, stat.size, stat.version)
    return PrecomputedSource(storage, parse_info(raw)) if is_volume(raw) else None


@dataclass(frozen=True, eq=False)
class _Run:
    """Minishard `part` of shard number `shard` of a scale (object `key`, version `stat`),
    decoded (`index`): chunks stored together, which read-ahead walks."""

    scale: Scale
    key: str
    stat: Stat
    shard: int
    part: int
    index: Minishard

    @cached_property
    def extents(self) -> Extents:
        return Extents(self.index.offsets, self.index.sizes)  # in stored order already

    @property
    def cost(self) -> int:
        return self.index.cost + 256


@dataclass(frozen=True)
class _Chunk:
    """Where a chunk of a sharded scale is stored: `stored` bytes from `offset` of the shard
    that holds minishard `run`."""

    run: _Run
    position: Position
    offset: int
    stored: int

    @property
    def scale(self) -> Scale:
        return self.run.scale

    @property
    def key(self) -> str:
        return self.run.key

    @property
    def stat(self) -> Stat:
        return self.run.stat


#: What a view path is: the rewritten info, a source file or directory, or a chunk.
_Target = Volume | Stat | _Chunk


def _cost(value: np.ndarray | _Run | int) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes + 256
    if isinstance(value, _Run):
        return value.cost
    return 128


class PrecomputedNamespace(SourceView):
    """The view of one precomputed source, for the FUSE adapter's read-only calls
    (`root`, `resolve`, `lookup`, `attr`, `listdir`, `open`). Thread-safe; every method
    may block on storage."""

    def __init__(
        self, storage: Storage, index_cache: int = 64 << 20, read_cache: int = 64 << 20
    ) -> None:
        self.storage = storage
        #: The most bytes a minishard index may decode to (see `Scale.minishard_limit`).
        self.minishard_cap = index_cache // MINISHARD_SHARE
        #: The most bytes of a fixed shard index read (and cached) whole.
        self.whole_index = index_cache // WHOLE_INDEX_SHARE
        #: Fixed shard indexes, minishard indexes and gzip sizes of chunks, by shard version.
        self.indexes: LruCache[np.ndarray | _Run | int] = LruCache(
            index_cache, _cost, cache_errors=(CorruptData,)
        )
        #: Chunks fetched ahead of their reads (only on stores with costly requests).
        self.read_ahead = ReadAhead(storage, read_cache)
        #: The parsed info by version; None when it is not a valid volume any more.
        self.volumes: LruCache[Volume | None] = LruCache(
            4 << 20, lambda v: v.cost if v is not None else 256
        )

    # -- the info document -------------------------------------------------------------

    def volume(self) -> Volume | None:
        """The volume as `info` describes it now; None (everything passes through) if the
        info is gone or no longer valid."""
        return latest(
            self.storage, INFO, lambda stat: self.volumes.get(stat.version, self._info_loader(stat))
        )

    def _info_loader(self, stat: Stat) -> Callable[[], Volume | None]:
        def load() -> Volume | None:
            name = self.storage.describe(INFO)
            try:
                volume = parse_info(self.storage.read(INFO, 0, stat.size, stat.version))
            except InvalidMetadata as e:
                log.warning("%s: every file shown unchanged: %s", name, e)
                return None
            for line in volume.unchanged:
                log.warning("%s: %s", name, line)
            return volume

        return load

    # -- classification ----------------------------------------------------------------

    def digest_source(self, node: Node) -> None:
        return None  # `user.md5` is a Zarr view's

    def chunk_directory(self, path: str) -> None:
        return None  # chunk files are found the long way only

    def caches(self) -> dict[str, LruCache | ReadAhead]:
        return {
            "shard indexes": self.indexes,
            "metadata": self.volumes,
            "read-ahead": self.read_ahead,
        }

    def _root(self) -> Node:
        return Node("", Role.DIR)

    def lookup(self, parent: Node, name: str) -> Node:
        path = entry_path(parent, name)
        volume = self.volume()
        return Node(path, self._role(volume, path, self._target(volume, path)))

    def _target(self, volume: Volume | None, path: str) -> _Target:
        """What `path` is now; NotFound if nothing."""
        if path == INFO and volume is not None:
            return volume
        directory, _, name = path.rpartition("/")
        scale = volume.scales.get(directory) if volume is not None else None
        if scale is not None:
            position = scale.parse_chunk_name(name)
            if position is not None:
                return self._locate(scale, position, path)
            if scale.sharding.parse_shard_name(name) is not None:
                raise NotFound(path)  # a shard: replaced by its chunks
        stat = self.storage.stat(path)
        if stat is None:
            raise NotFound(path)
        return stat

    @staticmethod
    def _role(volume: Volume | None, path: str, target: _Target) -> Role:
        if isinstance(target, Volume):
            return Role.METADATA
        if isinstance(target, _Chunk):
            return Role.CHUNK
        if not target.is_dir:
            return Role.FILE
        return Role.ARRAY if volume is not None and path in volume.scales else Role.DIR

    # -- shards ------------------------------------------------------------------------

    def _locate(self, scale: Scale, position: Position, path: str) -> _Chunk:
        """Where the chunk at grid `position` is stored; NotFound if no shard holds it."""
        chunk_id = scale.chunk_id(position)
        shard, minishard = scale.sharding.locate(chunk_id)
        key = join(scale.key, scale.sharding.shard_name(shard))

        def find(stat: Stat) -> _Chunk | None:
            start, end = self._entry(scale, key, stat, minishard)
            if start == end:
                return None
            run = self._minishard(scale, key, stat, shard, minishard, start, end)
            found = run.index.find(chunk_id)
            if found is None:
                return None
            return _Chunk(run, position, *found)

        chunk = latest(self.storage, key, find)
        if chunk is None:
            raise NotFound(path)
        return chunk

    def _read_index(self, scale: Scale, key: str, stat: Stat, first: int, count: int) -> np.ndarray:
        """`count` entries of the fixed index of shard `key` from minishard `first`, verified
        (see `Sharding.decode_shard_index`); not cached."""
        spec = scale.sharding

        def decode() -> np.ndarray:
            spec.check_shard_size(stat.size)
            raw = self.storage.read(key, FIXED_ENTRY * first, FIXED_ENTRY * count, stat.version)
            return spec.decode_shard_index(raw, stat.size, first, count)

        return verified(self.storage, key, stat, decode)

    def _whole(self, scale: Scale) -> bool:
        """Whether the fixed indexes of `scale` are read whole (see WHOLE_INDEX_SHARE)."""
        return scale.sharding.index_size <= self.whole_index

    def _shard_index(self, scale: Scale, key: str, stat: Stat) -> np.ndarray:
        """The whole fixed index of a shard of a scale whose indexes are read whole."""
        count = 1 << scale.sharding.minishard_bits
        value = self.indexes.get(
            ("index", key, stat.version), lambda: self._read_index(scale, key, stat, 0, count)
        )
        assert isinstance(value, np.ndarray)
        return value

    def _entry(self, scale: Scale, key: str, stat: Stat, minishard: int) -> tuple[int, int]:
        """Where the index of `minishard` lies in shard `key`: [start, end). From the
        whole fixed index if it is read whole, else from its one entry (16 bytes, cached):
        a lookup never reads more of a big fixed index, even for a chunk no shard holds."""
        if self._whole(scale):
            start, end = self._shard_index(scale, key, stat)[minishard]
        else:
            value = self.indexes.get(
                ("entry", key, stat.version, minishard),
                lambda: self._read_index(scale, key, stat, minishard, 1),
            )
            assert isinstance(value, np.ndarray)
            start, end = value[0]
        return int(start), int(end)

    def _used(
        self, scale: Scale, key: str, stat: Stat, first: int, stop: int
    ) -> Iterator[np.ndarray]:
        """The non-empty entries of the fixed index of shard `key` among minishards
        [first, stop), in order, as arrays of (minishard, start, end) rows: a fixed index
        not read whole is read INDEX_PIECE entries at a time, each piece's non-empty
        entries cached (a sparse index costs its cache almost nothing)."""
        if self._whole(scale):
            index = self._shard_index(scale, key, stat)[first:stop]
            used = np.flatnonzero(index[:, 0] != index[:, 1])
            yield np.column_stack([used + first, index[used]])
            return
        count = 1 << scale.sharding.minishard_bits
        for piece in range(first // INDEX_PIECE, -(-stop // INDEX_PIECE)):
            at = piece * INDEX_PIECE

            def load(at: int = at) -> np.ndarray:
                index = self._read_index(scale, key, stat, at, min(INDEX_PIECE, count - at))
                used = np.flatnonzero(index[:, 0] != index[:, 1])
                return np.column_stack([used + at, index[used]])

            value = self.indexes.get(("used", key, stat.version, piece), load)
            assert isinstance(value, np.ndarray)
            yield value[(value[:, 0] >= first) & (value[:, 0] < stop)]

    def _minishard(
        self, scale: Scale, key: str, stat: Stat, shard: int, minishard: int, start: int, end: int
    ) -> _Run:
        cap = self.minishard_cap

        def decode() -> Minishard:
            # Bounded before it is read, and (gzip) while it is inflated.
            scale.sharding.check_minishard_stored(
                minishard, end - start, scale.minishard_limit(cap)
            )
            raw = self.storage.read(key, start, end - start, stat.version)
            return scale.decode_minishard(raw, shard, minishard, stat.size, cap)

        def load() -> _Run:
            index = verified(self.storage, key, stat, decode)
            return _Run(scale, key, stat, shard, minishard, index)

        value = self.indexes.get(("minishard", key, stat.version, minishard), load)
        assert isinstance(value, _Run)
        return value

    def next_run(self, run: _Run, n: int) -> tuple[str, _Run] | None:
        """The `n`-th non-empty minishard after `run` in stored order, within its shard and
        then the next shard file, if there is one: where a walker of chunk ids goes next
        under the identity hash (see the module's docstring)."""
        scale, key, stat, after = run.scale, run.key, run.stat, run.part
        for shard in (run.shard, run.shard + 1):
            if shard != run.shard:
                if shard >> scale.sharding.shard_bits:
                    return None
                key = join(scale.key, scale.sharding.shard_name(shard))
                found = self.storage.stat(key)
                if found is None or found.is_dir:
                    return None
                stat, after = found, -1
            stop = 1 << scale.sharding.minishard_bits
            if not self._whole(scale):  # look no further than one piece's worth ahead
                stop = min(stop, after + 1 + INDEX_PIECE)
            for used in self._used(scale, key, stat, after + 1, stop):
                if n <= len(used):
                    minishard, start, end = (int(v) for v in used[n - 1])
                    return key, self._minishard(scale, key, stat, shard, minishard, start, end)
                n -= len(used)
        return None

    def ahead(self, run: _Run) -> NextShard | None:
        """Where a walker of `run` goes next, for read-ahead, if anything predicts it: the
        next `MINISHARDS_AHEAD` minishards (a walk in id order is in one at a time)."""
        if run.scale.sharding.hash != "identity":
            return None
        return lambda n: self.next_run(run, n) if n <= MINISHARDS_AHEAD else None

    def _file_size(self, chunk: _Chunk) -> int:
        """The size of a chunk's file; for gzip sizes, one read of its trailer (cached)."""
        scale = chunk.scale
        if not scale.gzip_sizes:
            return scale.file_size(chunk.position, chunk.stored)

        def load() -> int:
            self._check_gzip(chunk)
            version = chunk.stat.version
            # A walker's next chunk has usually been fetched ahead: its trailer costs nothing.
            stored = self.read_ahead.cached(chunk.key, version, chunk.offset, chunk.stored)
            if stored is not None:
                return scale.file_size(chunk.position, chunk.stored, stored[-4:])
            start = chunk.offset + chunk.stored - 4
            trailer = self.storage.read(chunk.key, start, 4, version)
            return scale.file_size(chunk.position, chunk.stored, trailer)

        value = self.indexes.get(self._size_key(chunk), load)
        assert isinstance(value, int)
        return value

    @staticmethod
    def _size_key(chunk: _Chunk) -> tuple[str, str, object, int]:
        return ("size", chunk.key, chunk.stat.version, chunk.offset)

    def _check_gzip(self, chunk: _Chunk) -> None:
        if chunk.stored < GZIP_MIN:
            name = chunk.scale.chunk_name(chunk.position)
            raise logged_corruption(
                f"{self.storage.describe(chunk.key)}: corrupt shard, its chunks give EIO: "
                f"chunk {name} is {chunk.stored} bytes, too short for gzip"
            )

    def _gzip_sizes(self, chunks: list[_Chunk]) -> None:
        """Cache the gzip sizes of chunks of one shard version, reading their trailers
        together (see `_read_ranges`)."""
        missing = [c for c in chunks if self.indexes.peek(self._size_key(c)) is None]
        for chunk in missing:
            if chunk.stored < GZIP_MIN:
                self._file_size(chunk)  # fails, logged once (the failure is cached)
        if not missing:
            return
        first = missing[0]
        ranges = [(c.offset + c.stored - 4, 4) for c in missing]
        for chunk, trailer in zip(
            missing, self._read_ranges(first.key, first.stat, ranges), strict=True
        ):
            size = chunk.scale.file_size(chunk.position, chunk.stored, trailer)
            self.indexes.put(self._size_key(chunk), size)

    def _read_ranges(self, key: str, stat: Stat, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of each (offset, length) of one object version. Where a request
        costs more than the bytes between two ranges (`Storage.request_cost`), they are
        read together, up to MAX_SPAN bytes at once."""
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        out = [b""] * len(ranges)
        i = 0
        while i < len(order):
            start, length = ranges[order[i]]
            end = start + length
            j = i + 1
            while j < len(order):
                offset, length = ranges[order[j]]
                gap, span = offset - end, max(end, offset + length) - start
                if gap > self.storage.request_cost or span > MAX_SPAN:
                    break
                end = max(end, offset + length)
                j += 1
            data = self.storage.read(key, start, end - start, stat.version)
            for k in order[i:j]:
                offset, length = ranges[k]
                out[k] = data[offset - start : offset - start + length]
            i = j
        return out

    # -- attributes and listings ---------------------------------------------------------

    def attr(self, node: Node) -> Attr:
        target = self._target(self.volume(), node.path)
        if isinstance(target, Volume):
            info = self.storage.stat(INFO)
            if info is None:
                return Attr(False, len(target.info), 0)
            return Attr(False, len(target.info), info.mtime_ns, None, info.access)
        if isinstance(target, _Chunk):
            stat = target.stat
            return Attr(False, self._file_size(target), stat.mtime_ns, None, stat.access)
        return Attr.of(target)

    def listdir(self, node: Node) -> list[tuple[str, Node, Attr]]:
        """The entries of a directory node, sorted by name."""
        for _ in attempts():
            try:
                listing = self._listdir(node)
            except SourceChanged:
                continue  # a shard was replaced while it was listed: list again
            listing.sort(key=lambda item: item[0])
            return listing
        raise StorageError(f"{self.storage.describe(node.path)} keeps changing while it is listed")

    def listing(self, node: Node) -> Listing:
        """`listdir` as a `Listing` (a node per chunk: chunks are not numbered by position)."""
        return Listing(self.listdir(node))

    def _listdir(self, node: Node) -> list[tuple[str, Node, Attr]]:
        volume = self.volume()
        target = self._target(volume, node.path)
        if not isinstance(target, Stat) or not target.is_dir:
            raise NotADirectory(node.path)
        entries = self.storage.list(node.path)
        scale = volume.scales.get(node.path) if volume is not None else None
        if scale is None:
            return [self._source_entry(volume, node.path, entry) for entry in entries]
        listing = []
        for entry in entries:
            shard = scale.sharding.parse_shard_name(entry.name)
            if shard is not None:
                if not entry.stat.is_dir:
                    listing += self._chunks_of_shard(scale, node.path, shard, entry.stat)
            elif scale.parse_chunk_name(entry.name) is None:  # chunk names are the view's
                listing.append(self._source_entry(volume, node.path, entry))
        return listing

    def _source_entry(
        self, volume: Volume | None, directory: str, entry: Entry
    ) -> tuple[str, Node, Attr]:
        path = join(directory, entry.name)
        stat = entry.stat
        if path == INFO and volume is not None and not stat.is_dir:
            return (
                entry.name,
                Node(path, Role.METADATA),
                Attr(False, len(volume.info), stat.mtime_ns, None, stat.access),
            )
        role = self._role(volume, path, stat)
        return entry.name, Node(path, role), Attr.of(stat)

    def _chunks_of_shard(
        self, scale: Scale, directory: str, shard: int, stat: Stat
    ) -> list[tuple[str, Node, Attr]]:
        """The chunk files of one shard (version `stat`): every chunk of every minishard."""
        key = join(directory, scale.sharding.shard_name(shard))
        chunks = []
        for used in self._used(scale, key, stat, 0, 1 << scale.sharding.minishard_bits):
            for minishard, start, end in used.tolist():
                run = self._minishard(scale, key, stat, shard, minishard, start, end)
                found = run.index
                for position, offset, size in zip(
                    found.positions.tolist(),
                    found.offsets.tolist(),
                    found.sizes.tolist(),
                    strict=True,
                ):
                    chunks.append(_Chunk(run, tuple(position), offset, size))
        if scale.gzip_sizes:
            self._gzip_sizes(chunks)
        listing = []
        for chunk in chunks:
            name = scale.chunk_name(chunk.position)
            node = Node(join(directory, name), Role.CHUNK)
            attr = Attr(False, self._file_size(chunk), stat.mtime_ns, None, stat.access)
            listing.append((name, node, attr))
        return listing

    # -- data ----------------------------------------------------------------------------

    def open(self, node: Node) -> Reader:
        return open_again(node, self._open)

    def _open(self, node: Node) -> Reader:
        volume = self.volume()
        target = self._target(volume, node.path)
        if isinstance(target, Volume):
            info = self.storage.stat(INFO)
            if info is None or info.is_dir:
                raise SourceChanged(f"{self.storage.describe(INFO)} is gone")
            return Reader(self.storage, node.path, info, None, data=target.info)
        if isinstance(target, Stat):
            if target.is_dir:
                raise IsADirectory(node.path)
            return stored_file(self.storage, node.path, node.path, target)
        chunk = target
        size = self._file_size(chunk)
        sharding = chunk.scale.sharding
        if not sharding.data_gzip and chunk.stored != size:
            raise logged_corruption(
                f"{node.path} (stored in {self.storage.describe(chunk.key)}): chunk holds "
                f"{chunk.stored} bytes, its file size says {size}"
            )
        decode = (lambda stored: sharding.decode_data(stored, size)) if sharding.data_gzip else None
        return Reader(
            self.storage,
            node.path,
            chunk.stat,
            self.storage.pin(chunk.key, chunk.stat),
            chunk.offset,
            chunk.stored,
            size,
            decode=decode,
            chunk=Chunk(self.read_ahead, chunk.run, self.ahead(chunk.run)),
        )
