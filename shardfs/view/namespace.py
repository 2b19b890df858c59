"""The unsharded view of a source: which paths exist, what they are, where their bytes are.

Every path of the view is the same path in the source. Directories, groups,
unsharded arrays and other files pass through. In the directory of a sharded
array, the shards are replaced by one virtual file per non-empty inner chunk,
named by the array's own chunk key encoding, and `zarr.json` is rewritten to
describe the unsharded array (see `shardfs.formats.zarr_v3`).

Nothing is scanned up front: a path is classified when it is looked up, and a
shard's index is read the first time one of its chunks is needed. Decoded
indexes live in one bounded LRU cache (`index_cache`), parsed metadata in
another (`metadata_cache`); both key on the object's version, so a source
changed behind the mount's back is reread, never mixed with old state.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np

from shardfs.errors import (
    CorruptData,
    InvalidMetadata,
    IsADirectory,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
)
from shardfs.formats.keys import parse_index
from shardfs.formats.shard_index import EMPTY, check_entries
from shardfs.formats.zarr_v3 import (
    ShardedLayout,
    Unshardable,
    level_slots,
    parse_node,
    sharded_layout,
)
from shardfs.storage.base import Entry, Stat, Storage
from shardfs.view.cache import LruCache

log = logging.getLogger("shardfs")

METADATA = "zarr.json"


class Role(Enum):
    DIR = auto()  #: a source directory, shown as is
    FILE = auto()  #: a source file, shown as is
    ARRAY = auto()  #: the directory of a sharded array
    METADATA = auto()  #: the rewritten zarr.json of a sharded array
    CHUNK_DIR = auto()  #: a directory of a sharded array's chunk key space
    CHUNK = auto()  #: one inner chunk of a sharded array


@dataclass(frozen=True, eq=False)
class ArrayView:
    """A sharded array as the view shows it."""

    key: str
    layout: ShardedLayout
    metadata: Stat
    #: Per level, the index slot of each view chunk of a shard (see `level_slots`).
    slots: list[np.ndarray] = field(repr=False)

    @property
    def cost(self) -> int:
        return len(self.layout.view_metadata) + sum(s.nbytes for s in self.slots) + 512


@dataclass(frozen=True, eq=False)
class ShardTable:
    """One shard's decoded index, flattened to the view's chunks.

    `entries` has shape `chunks_per_shard + (2,)` in view (array) axis order,
    holding absolute (offset, nbytes) in the shard, or EMPTY.
    """

    stat: Stat
    entries: np.ndarray

    @property
    def cost(self) -> int:
        return self.entries.nbytes + 256


@dataclass(frozen=True, slots=True)
class Node:
    """A path of the view and what it is. `coords` are chunk coordinates (CHUNK)
    or the coordinates a chunk directory fixes (CHUNK_DIR)."""

    path: str
    role: Role
    array: ArrayView | None = None
    coords: tuple[int, ...] = ()

    @property
    def is_dir(self) -> bool:
        return self.role in (Role.DIR, Role.ARRAY, Role.CHUNK_DIR)

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


@dataclass(frozen=True, slots=True)
class Attr:
    is_dir: bool
    size: int
    mtime_ns: int


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


#: Chunks up to this size are read whole on the first read of an open file, so
#: that reading a chunk costs one positioned read of its shard however the
#: kernel splits the file into requests.
WHOLE_CHUNK_LIMIT = 4 << 20


class Reader:
    """An open file of the view. Reads are pinned to the version seen at open."""

    def __init__(
        self,
        namespace: Namespace,
        node: Node,
        key: str,
        stat: Stat,
        base: int,
        size: int,
        data: bytes | None = None,
    ) -> None:
        self._ns = namespace
        self.node = node
        self._key = key
        self._stat = stat
        self._base = base
        self.size = size
        self._data = data
        self._whole = node.role is Role.CHUNK and size <= WHOLE_CHUNK_LIMIT

    def read(self, offset: int, size: int) -> bytes:
        if offset >= self.size or size <= 0:
            return b""
        size = min(size, self.size - offset)
        data = self._data
        if data is None and self._whole:
            data = self._data = self._fetch(0, self.size)
        if data is not None:
            if self._whole and offset + size >= self.size:
                self._data = None  # read to the end: free the buffer of a sequential reader
            return data[offset : offset + size]
        return self._fetch(offset, size)

    def _fetch(self, offset: int, size: int) -> bytes:
        try:
            return self._ns.storage.read(self._key, self._base + offset, size, self._stat.version)
        except SourceChanged:
            self._follow_change()
            return self._ns.storage.read(self._key, self._base + offset, size, self._stat.version)

    def _follow_change(self) -> None:
        """The object changed while open: carry on only if this file's bytes did not.

        A passthrough file simply shows its new content. A chunk may carry on
        if its shard still holds it at the same place (the shard was appended
        to); otherwise the file's content is gone and the read fails.
        """
        node = self._ns.refresh(self.node)
        if self.node.role is Role.FILE:
            stat = self._ns.storage.stat(self._key)
            if stat is None or stat.is_dir:
                raise StorageError(f"{self._ns.storage.describe(self._key)} was removed while open")
            self._stat, self.size = stat, stat.size
            return
        assert node.array is not None
        key, table, offset, nbytes = self._ns.locate(node.array, node.coords)
        if (offset, nbytes) != (self._base, self.size):
            raise StorageError(f"{self._ns.storage.describe(key)} was rewritten while open")
        self._stat = table.stat


class Namespace:
    """The view of one source. Thread-safe; every method may block on storage."""

    def __init__(
        self,
        storage: Storage,
        index_cache: int = 64 << 20,
        metadata_cache: int = 16 << 20,
    ) -> None:
        self.storage = storage
        self.indexes: LruCache[ShardTable] = LruCache(
            index_cache, lambda t: t.cost, cache_errors=(CorruptData,)
        )
        self.arrays: LruCache[ArrayView | None] = LruCache(
            metadata_cache, lambda a: a.cost if a is not None else 256
        )

    # -- classification ---------------------------------------------------

    def root(self) -> Node:
        stat = self.storage.stat("")
        if stat is None or not stat.is_dir:
            raise NotFound("source root is gone")
        return self._dir_node("")

    def resolve(self, path: str) -> Node:
        """The node at a `/`-separated view path ("" is the root)."""
        node = self.root()
        for name in filter(None, path.split("/")):
            node = self.lookup(node, name)
        return node

    def lookup(self, parent: Node, name: str) -> Node:
        if not parent.is_dir:
            raise NotADirectory(parent.path)
        if name in ("", ".", "..") or "/" in name:
            raise NotFound(name)
        path = join(parent.path, name)
        if parent.role is Role.DIR:
            return self._source_node(path)
        array = self._fresh(parent.array)
        layout = array.layout
        if parent.role is Role.ARRAY:
            if name == METADATA:
                return Node(path, Role.METADATA, array)
            if not layout.keys.owns(name, layout.ndim):
                return self._source_node(path, inside_array=True)
            parts = [name]
        else:
            parts = [*self._key_parts(parent), name]
        coords = layout.keys.decode("/".join(parts), layout.ndim)
        if coords is not None:
            self.locate(array, coords)
            return Node(path, Role.CHUNK, array, coords)
        prefix = layout.keys.dir_depth(parts, layout.ndim)
        if prefix is None or not self._chunk_dir_exists(array, prefix):
            raise NotFound(path)
        return Node(path, Role.CHUNK_DIR, array, prefix)

    def refresh(self, node: Node) -> Node:
        """The node for the same path now, raising NotFound if it is gone."""
        if node.array is None:
            return node
        current = self._fresh(node.array)
        return node if current is node.array else Node(node.path, node.role, current, node.coords)

    def _source_node(self, path: str, inside_array: bool = False) -> Node:
        stat = self.storage.stat(path)
        if stat is None:
            raise NotFound(path)
        if not stat.is_dir:
            return Node(path, Role.FILE)
        return Node(path, Role.DIR) if inside_array else self._dir_node(path)

    def _dir_node(self, key: str) -> Node:
        array = self._array_at(key)
        return Node(key, Role.ARRAY, array) if array is not None else Node(key, Role.DIR)

    def _array_at(self, key: str) -> ArrayView | None:
        """The sharded array whose directory is `key`, if there is one."""
        meta_key = join(key, METADATA)
        stat = self.storage.stat(meta_key)
        if stat is None or stat.is_dir:
            return None
        return self.arrays.get((meta_key, stat.version), lambda: self._load_array(key, stat))

    def _load_array(self, key: str, stat: Stat) -> ArrayView | None:
        meta_key = join(key, METADATA)
        raw = self.storage.read(meta_key, 0, stat.size, stat.version)
        try:
            meta = parse_node(raw)
            if meta["node_type"] != "array":
                return None
            layout = sharded_layout(meta)
        except (InvalidMetadata, Unshardable) as e:
            log.warning("%s: shown unchanged: %s", self.storage.describe(meta_key), e)
            return None
        if layout is None:
            return None
        return ArrayView(key, layout, stat, level_slots(layout))

    def _fresh(self, array: ArrayView | None) -> ArrayView:
        """`array` as it is now: its metadata may have changed since the node was made."""
        assert array is not None
        current = self._array_at(array.key)
        if current is None:
            raise NotFound(array.key)
        return current

    # -- shards -------------------------------------------------------------

    def shard_key(self, array: ArrayView, shard: tuple[int, ...]) -> str:
        return join(array.key, array.layout.keys.encode(shard))

    def table(self, array: ArrayView, shard: tuple[int, ...]) -> ShardTable | None:
        """The decoded index of a shard, or None if the shard does not exist."""
        key = self.shard_key(array, shard)
        for _attempt in range(3):
            stat = self.storage.stat(key)
            if stat is None or stat.is_dir:
                return None
            try:
                return self.indexes.get(
                    (key, stat.version), lambda st=stat: self._load_table(array, key, st)
                )
            except SourceChanged:
                continue  # rewritten while we read its index: read the new one
        raise StorageError(f"{self.storage.describe(key)} keeps changing while its index is read")

    def _load_table(self, array: ArrayView, key: str, stat: Stat) -> ShardTable:
        layout = array.layout
        cps = layout.chunks_per_shard
        count = math.prod(cps)
        entries = np.empty((count, 2), dtype=np.uint64)
        try:
            self._fill(array, key, stat, 0, 0, stat.size, np.arange(count), entries)
        except CorruptData as e:
            name = self.storage.describe(key)
            log.error("%s: corrupt shard, its chunks give EIO: %s", name, e)
            error = CorruptData(f"{name}: {e}")
            error.logged = True
            raise error from None
        return ShardTable(stat, entries.reshape((*cps, 2)))

    def _fill(
        self,
        array: ArrayView,
        key: str,
        stat: Stat,
        level: int,
        start: int,
        length: int,
        rows: np.ndarray,
        out: np.ndarray,
    ) -> None:
        """Resolve the view chunks `rows` through the shard (or nested shard) at [start, start+length)."""
        spec = array.layout.levels[level]
        size = spec.index_size
        if length < size:
            raise CorruptData(f"{length} bytes cannot hold a {size}-byte shard index")
        at = start if spec.index_at_start else start + length - size
        index = spec.index.decode(
            self.storage.read(key, at, size, stat.version), spec.chunks_per_shard
        ).reshape(-1, 2)
        if spec.index_at_start:
            check_entries(index, size, length)
        else:
            check_entries(index, 0, length - size)
        slots = array.slots[level][rows]
        picked = index[slots]
        used = picked[:, 1] != EMPTY
        picked[used, 0] += np.uint64(start)
        if level + 1 == len(array.layout.levels):
            out[rows] = picked
            return
        out[rows[~used]] = EMPTY
        for slot in np.unique(slots[used]):
            offset, nbytes = (int(v) for v in index[slot])
            self._fill(
                array, key, stat, level + 1, start + offset, nbytes, rows[slots == slot], out
            )

    def locate(self, array: ArrayView, coords: tuple[int, ...]) -> tuple[str, ShardTable, int, int]:
        """(shard key, table, offset, nbytes) of a non-empty chunk; NotFound otherwise."""
        layout = array.layout
        if not layout.in_bounds(coords):
            raise NotFound(layout.keys.encode(coords))
        shard, local = layout.shard_of(coords)
        table = self.table(array, shard)
        if table is None:
            raise NotFound(layout.keys.encode(coords))
        offset, nbytes = table.entries[local]
        if nbytes == EMPTY:
            raise NotFound(layout.keys.encode(coords))
        return self.shard_key(array, shard), table, int(offset), int(nbytes)

    def _chunk_dir_exists(self, array: ArrayView, prefix: tuple[int, ...]) -> bool:
        layout = array.layout
        if any(not 0 <= i < g for i, g in zip(prefix, layout.grid, strict=False)):
            return False
        cps = layout.chunks_per_shard
        shard_prefix = tuple(i // n for i, n in zip(prefix, cps, strict=False))
        stat = self.storage.stat(join(array.key, layout.keys.dir_path(shard_prefix)))
        return stat is not None and stat.is_dir

    def _key_parts(self, node: Node) -> list[str]:
        """The components of a chunk directory's path below its array."""
        assert node.array is not None
        rest = node.path[len(node.array.key) :].lstrip("/")
        return rest.split("/") if rest else []

    # -- attributes and listings ----------------------------------------------

    def attr(self, node: Node) -> Attr:
        if node.role in (Role.DIR, Role.FILE, Role.ARRAY, Role.CHUNK_DIR):
            stat = self.storage.stat(self._backing_key(node))
            if stat is None or stat.is_dir != node.is_dir:
                raise NotFound(node.path)
            return Attr(node.is_dir, stat.size, stat.mtime_ns)
        array = self._fresh(node.array)
        if node.role is Role.METADATA:
            return Attr(False, len(array.layout.view_metadata), array.metadata.mtime_ns)
        _, table, _, nbytes = self.locate(array, node.coords)
        return Attr(False, nbytes, table.stat.mtime_ns)

    def _backing_key(self, node: Node) -> str:
        """The source key whose stat stands for a directory or passthrough node."""
        if node.role is not Role.CHUNK_DIR:
            return node.path
        assert node.array is not None
        layout = node.array.layout
        shard_prefix = tuple(
            i // n for i, n in zip(node.coords, layout.chunks_per_shard, strict=False)
        )
        return join(node.array.key, layout.keys.dir_path(shard_prefix))

    def listdir(self, node: Node) -> list[tuple[str, Node, Attr]]:
        """The entries of a directory node, sorted by name."""
        if not node.is_dir:
            raise NotADirectory(node.path)
        if node.role is Role.DIR:
            listing = [
                self._source_entry(node.path, e.name, e.stat) for e in self.storage.list(node.path)
            ]
        elif node.role is Role.ARRAY:
            listing = self._list_array(self._fresh(node.array))
        else:
            listing = self._list_chunk_dir(self._fresh(node.array), node.coords)
        listing.sort(key=lambda item: item[0])
        return listing

    def _source_entry(self, parent: str, name: str, stat: Stat) -> tuple[str, Node, Attr]:
        path = join(parent, name)
        node = self._dir_node(path) if stat.is_dir else Node(path, Role.FILE)
        return name, node, Attr(stat.is_dir, stat.size, stat.mtime_ns)

    def _list_array(self, array: ArrayView) -> list[tuple[str, Node, Attr]]:
        layout = array.layout
        keys = layout.keys
        meta = Node(join(array.key, METADATA), Role.METADATA, array)
        listing = [
            (METADATA, meta, Attr(False, len(layout.view_metadata), array.metadata.mtime_ns))
        ]
        entries = self.storage.list(array.key)
        for entry in entries:
            if entry.name == METADATA:
                continue
            if not keys.owns(entry.name, layout.ndim):
                path = join(array.key, entry.name)
                role = Role.DIR if entry.stat.is_dir else Role.FILE
                listing.append((entry.name, Node(path, role), self._attr_of(entry.stat)))
            elif keys.nested and keys.name == "default" and entry.stat.is_dir:
                node = Node(join(array.key, "c"), Role.CHUNK_DIR, array, ())
                listing.append(("c", node, self._attr_of(entry.stat)))
        if keys.nested and keys.name == "v2":
            listing += self._chunk_dir_entries(array, (), array.key, entries)
        elif not keys.nested:
            shards = []
            for entry in entries:
                shard = keys.decode(entry.name, layout.ndim)
                if shard is not None and not entry.stat.is_dir:
                    shards.append(shard)
            listing += self._chunks_of_shards(array, array.key, shards, ())
        return listing

    @staticmethod
    def _attr_of(stat: Stat) -> Attr:
        return Attr(stat.is_dir, stat.size, stat.mtime_ns)

    def _list_chunk_dir(
        self, array: ArrayView, prefix: tuple[int, ...]
    ) -> list[tuple[str, Node, Attr]]:
        layout = array.layout
        cps = layout.chunks_per_shard
        shard_prefix = tuple(i // n for i, n in zip(prefix, cps, strict=False))
        real = join(array.key, layout.keys.dir_path(shard_prefix))
        path = join(array.key, layout.keys.dir_path(prefix))
        return self._chunk_dir_entries(array, prefix, path, self.storage.list(real))

    def _chunk_dir_entries(
        self, array: ArrayView, prefix: tuple[int, ...], path: str, entries: list[Entry]
    ) -> list[tuple[str, Node, Attr]]:
        """The view entries of the chunk directory `path` fixing `prefix`, given the
        entries of the source directory holding the matching shards."""
        layout = array.layout
        depth = len(prefix)
        cps, grid = layout.chunks_per_shard, layout.grid
        leaf = depth == layout.ndim - 1
        listing: list[tuple[str, Node, Attr]] = []
        shards = []
        for entry in entries:
            index = parse_index(entry.name)
            if index is None or entry.stat.is_dir == leaf:
                continue
            shard_prefix = (*(i // n for i, n in zip(prefix, cps, strict=False)), index)
            if leaf:
                shards.append(shard_prefix)
                continue
            for i in range(index * cps[depth], min((index + 1) * cps[depth], grid[depth])):
                node = Node(join(path, str(i)), Role.CHUNK_DIR, array, (*prefix, i))
                listing.append((str(i), node, self._attr_of(entry.stat)))
        listing += self._chunks_of_shards(array, path, shards, prefix)
        return listing

    def _chunks_of_shards(
        self,
        array: ArrayView,
        path: str,
        shards: list[tuple[int, ...]],
        prefix: tuple[int, ...],
    ) -> list[tuple[str, Node, Attr]]:
        """The chunk files of `shards` whose coordinates start with `prefix`.

        `path` is the view directory the files are listed in; names are the
        last component of each chunk's key.
        """
        layout = array.layout
        cps = layout.chunks_per_shard
        grid = np.asarray(layout.grid)
        local_prefix = tuple(i % n for i, n in zip(prefix, cps, strict=False))
        listing: list[tuple[str, Node, Attr]] = []
        for shard in shards:
            table = self.table(array, shard)
            if table is None:
                continue
            sizes = table.entries[..., 1][local_prefix]
            rest = np.argwhere(sizes != EMPTY)
            nbytes = sizes[tuple(rest.T)]
            fixed = np.broadcast_to(
                np.asarray(local_prefix, dtype=np.int64), (len(rest), len(prefix))
            )
            coords = np.hstack([fixed, rest]) + np.asarray(shard) * np.asarray(cps)
            keep = (coords < grid).all(axis=1)
            mtime = table.stat.mtime_ns
            for chunk, size in zip(coords[keep].tolist(), nbytes[keep].tolist(), strict=True):
                name = layout.keys.encode(chunk).rpartition("/")[2]
                node = Node(join(path, name), Role.CHUNK, array, tuple(chunk))
                listing.append((name, node, Attr(False, size, mtime)))
        return listing

    # -- data -------------------------------------------------------------------

    def open(self, node: Node) -> Reader:
        if node.is_dir:
            raise IsADirectory(node.path)
        if node.role is Role.FILE:
            stat = self.storage.stat(node.path)
            if stat is None or stat.is_dir:
                raise NotFound(node.path)
            return Reader(self, node, node.path, stat, 0, stat.size)
        array = self._fresh(node.array)
        node = Node(node.path, node.role, array, node.coords)
        if node.role is Role.METADATA:
            data = array.layout.view_metadata
            return Reader(self, node, node.path, array.metadata, 0, len(data), data)
        key, table, offset, nbytes = self.locate(array, node.coords)
        return Reader(self, node, key, table.stat, offset, nbytes)
