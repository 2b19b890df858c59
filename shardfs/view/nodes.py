"""What the view is made of: nodes, their attributes, and directory listings.

Plain data, no I/O. A listing holds the chunk files of a directory in bulk
(`ChunkRun`: arrays of coordinates and sizes per shard), so that listing a
directory of a million chunks creates no Python object per chunk; callers
that need a node per entry (`Listing.items`) make them as they go.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, auto

import numpy as np

from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.zarr_v2 import Transform, V2Array
from shardfs.formats.zarr_v3 import ShardedLayout
from shardfs.primitives.errors import CorruptData
from shardfs.storage.base import Access, Stat
from shardfs.view.hierarchy import join
from shardfs.view.readahead import HasExtents


class Role(Enum):
    DIR = auto()  #: a source directory, shown as is
    FILE = auto()  #: a source file, shown as is
    GROUP = auto()  #: the directory of a group whose metadata the view rewrites
    ARRAY = auto()  #: the directory of an array whose chunks the view serves
    METADATA = auto()  #: a metadata document the view writes (zarr.json, .zarray, ...)
    CHUNK_DIR = auto()  #: a directory of an array's chunk key space
    CHUNK = auto()  #: one chunk of the view


@dataclass(frozen=True, eq=False)
class ArrayView:
    """An array whose chunks the view serves: a sharded one, or any array in the v2 view.

    `layout.keys` names the shards (or plain chunk objects) in the source
    directory `data`; `names` names the view's chunk files. `docs` names the
    metadata files shown in the array directory instead of the source's.

    It is what every lookup of a chunk needs, and no more: its size does not
    grow with the array's attributes. `layout.view_metadata` is the view's
    `zarr.json` with empty attributes; the documents themselves are rendered from the stored document `source`
    (version `metadata`) when they are needed (see `Presentation._rendered`).
    """

    key: str
    data: str
    layout: ShardedLayout
    metadata: Stat
    names: ChunkKeyEncoding
    docs: tuple[str, ...]
    #: how stored chunks become v2 chunks (v2 view only)
    v2: V2Array | None
    #: Per level, the index slot of each view chunk of a shard (see `level_slots`).
    slots: list[np.ndarray] = field(repr=False)
    #: the key of the stored document the array's view is made from
    source: str | None = None
    #: where the attributes lie in that document (a byte span), for `with_attributes`;
    #: None where its documents are rendered by parsing it (or it has none)
    attributes: tuple[int, int] | None = None

    @property
    def version(self) -> tuple[str | None, object]:
        """The version of the stored document (as `NodeDoc.version`)."""
        return self.source, self.metadata.version

    @property
    def cost(self) -> int:
        held = len(self.layout.view_metadata) + 64 * len(self.docs)
        return held + sum(s.nbytes for s in self.slots) + 1024

    @property
    def served_as_stored(self) -> bool:
        """Whether its chunk files hold their stored bytes, with no codec undone or applied."""
        return self.v2 is None or self.v2.transform is Transform.RAW

    def served_size(self, stored: int) -> int:
        """The size of the view chunk whose stored form has `stored` bytes."""
        if self.v2 is None:
            return stored
        size = self.v2.served_size(stored)
        if size < 0:
            raise CorruptData(f"a chunk of {self.key} is {stored} bytes, too short for its crc32c")
        return size

    def served_sizes(self, stored: np.ndarray) -> np.ndarray:
        """`served_size` of many chunks at once."""
        if self.v2 is None:
            return stored
        return np.array([self.served_size(n) for n in stored.tolist()], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class GroupView:
    """A group whose metadata the view rewrites (v2 view, draft sources): the documents
    `docs` names replace its zarr.json. They are rendered from the stored document
    `source` (None for an implicit draft group) when they are needed."""

    key: str
    metadata: Stat
    docs: tuple[str, ...]
    source: str | None = None
    #: it holds OME-Zarr 0.5 metadata (its arrays need the `/` separator in OME-Zarr 0.4)
    ome: bool = False

    @property
    def version(self) -> tuple[str | None, object]:
        """The version of the stored document (as `NodeDoc.version`)."""
        return self.source, self.metadata.version

    @property
    def cost(self) -> int:
        return 64 * len(self.docs) + 512


NodeView = ArrayView | GroupView


@dataclass(frozen=True, eq=False)
class ShardTable(HasExtents):
    """One shard's decoded index, flattened to the view's chunks.

    `entries` has shape `chunks_per_shard + (2,)` in view (array) axis order,
    holding absolute (offset, nbytes) in the shard, or EMPTY. They come from
    the index that ends at byte `end` of version `stat` (its size, unless an
    append was under way), whose raw bytes have the crc32c `digest`: what a
    later version must still hold there to hold the same chunks.
    """

    stat: Stat
    entries: np.ndarray
    end: int
    digest: int | None = None

    @property
    def cost(self) -> int:
        return 2 * self.entries.nbytes + 256  # with the extents read-ahead may add


@dataclass(frozen=True, slots=True)
class Node:
    """A path of the view and what it is. `meta` is the array or group the node
    belongs to; `coords` are chunk coordinates (CHUNK) or the coordinates a
    chunk directory fixes (CHUNK_DIR)."""

    path: str
    role: Role
    meta: NodeView | None = None
    coords: tuple[int, ...] = ()
    #: the source key of a FILE node shown at another path (a draft document)
    source: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.role in (Role.DIR, Role.GROUP, Role.ARRAY, Role.CHUNK_DIR)

    @property
    def array(self) -> ArrayView:
        assert isinstance(self.meta, ArrayView), self
        return self.meta

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


@dataclass(frozen=True, slots=True)
class Extent:
    """Where a file's bytes are stored just as it serves them: `length` bytes at `offset`
    of version `stat` of object `key`. What lets a read skip opening a reader."""

    key: str
    stat: Stat
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Attr:
    is_dir: bool
    size: int
    mtime_ns: int
    #: where its bytes are stored as served, if that was found anyway (a chunk's lookup)
    extent: Extent | None = field(default=None, compare=False)
    #: the mode and owner of the stored object it is shown from (`Stat.access`: a chunk
    #: file's shard, a document's stored document, a virtual directory's nearest stored
    #: one), None where the store has none; what the mount shows of it
    access: Access | None = None
    #: a chunk file's shard (its key and the version these attributes come from): what a
    #: kernel-served mount numbers the file's versions by
    shard: tuple[str, Stat] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, stat: Stat) -> Attr:
        """A source object shown as it is stored."""
        return cls(stat.is_dir, stat.size, stat.mtime_ns, None, stat.access)

    @classmethod
    def of_chunk(cls, array: ArrayView, key: str, stat: Stat, offset: int, nbytes: int) -> Attr:
        """A chunk file of `array`, stored as `nbytes` at `offset` of shard `key` at `stat`."""
        if not array.served_as_stored:
            size = array.served_size(nbytes)
            return cls(False, size, stat.mtime_ns, None, stat.access, (key, stat))
        extent = Extent(key, stat, offset, nbytes)
        return cls(False, nbytes, stat.mtime_ns, extent, stat.access, (key, stat))


@dataclass(frozen=True, eq=False)
class ChunkRun:
    """The chunk files of one directory that an array's shards hold, as arrays.

    Row i is a chunk at grid coordinates `coords[i]`, stored at `extents[i]`
    (offset, nbytes) in shard `shards[shard[i]]` (its key, and its stat when
    its index was read), shown as a file of `sizes[i]` bytes. Rows are in grid
    order.
    """

    array: ArrayView
    directory: str
    shards: list[tuple[str, Stat]]
    shard: np.ndarray
    coords: np.ndarray
    extents: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def cost(self) -> int:
        """Bytes held (`sizes` may be a view of `extents`), with the grid positions (`flat`)
        that a listing computes."""
        arrays = (self.shard, self.coords, self.extents, self.sizes)
        return sum(a.nbytes for a in arrays) + 8 * len(self) + 100 * len(self.shards) + 256

    @functools.cached_property
    def _shard_mtimes(self) -> list[int]:
        return [stat.mtime_ns for _, stat in self.shards]

    def mtimes(self, start: int, stop: int) -> list[int]:
        """The mtimes of chunks [start, stop): their shards'."""
        mtimes = self._shard_mtimes
        return [mtimes[i] for i in self.shard[start:stop].tolist()]

    def accesses(self, start: int, stop: int) -> list[Access | None]:
        """The modes and owners of chunks [start, stop): their shards' (see `Attr.access`)."""
        accesses = [stat.access for _, stat in self.shards]
        return [accesses[i] for i in self.shard[start:stop].tolist()]

    def names(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The file names of chunks [start, stop): the last component of each view key."""
        names = self.array.names
        if not self.array.layout.ndim:
            return [names.encode(())] * len(self.coords[start:stop])
        if names.nested:
            return list(map(str, self.coords[start:stop, -1].tolist()))
        # Columns, not rows: a list per row would be a million objects for the collector.
        rows = zip(*(column.tolist() for column in self.coords[start:stop].T), strict=True)
        return [names.encode(row).rpartition("/")[2] for row in rows]

    def node(self, i: int, name: str) -> Node:
        coords = tuple(self.coords[i].tolist())
        return Node(join(self.directory, name), Role.CHUNK, self.array, coords)

    @functools.cached_property
    def flat(self) -> np.ndarray:
        """Each row's position in C order of the grid (ascending: rows are in grid order):
        where a chunk is looked up in the run, and its derived inode number."""
        grid = self.array.layout.grid
        if not grid:
            return np.zeros(len(self.coords), np.int64)
        return np.ravel_multi_index(self.coords.T, grid).astype(np.int64)

    def extent(self, coords: tuple[int, ...]) -> Extent | None:
        """Where chunk `coords` is stored, if it is one of these rows and its file holds its
        stored bytes; as of the shard versions the run was made from."""
        if not self.array.served_as_stored:
            return None
        flat = 0
        for coord, size in zip(coords, self.array.layout.grid, strict=True):
            flat = flat * size + coord
        i = int(np.searchsorted(self.flat, flat))
        if i == len(self.flat) or self.flat[i] != flat:
            return None
        key, stat = self.shards[int(self.shard[i])]
        offset, nbytes = self.extents[i].tolist()
        return Extent(key, stat, offset, nbytes)

    def stored_rows(
        self, names: list[bytes], start: int, stop: int
    ) -> list[tuple[int, int, list[bytes], list[int], list[int], list[int]]]:
        """Rows [start, stop) (named `names`) per shard that holds some: the shard's index
        in `shards`, the first row's (from `start`), and the rows' names, grid positions
        (`flat`), offsets and lengths; for a front end that serves them itself. Empty where
        files are not stored bytes."""
        if not self.array.served_as_stored:
            return []
        extents, shards = self.extents[start:stop], self.shard[start:stop]
        flat = self.flat[start:stop].tolist()
        offsets, lengths = extents[:, 0].tolist(), extents[:, 1].tolist()
        cuts = [0, *(np.flatnonzero(shards[1:] != shards[:-1]) + 1).tolist(), len(shards)]
        return [
            (int(shards[a]), a, names[a:b], flat[a:b], offsets[a:b], lengths[a:b])
            for a, b in itertools.pairwise(cuts)
            if b > a
        ]

    def keep(self, mask: np.ndarray) -> ChunkRun:
        """The run without the chunks where `mask` is False."""
        return replace(
            self,
            shard=self.shard[mask],
            coords=self.coords[mask],
            extents=self.extents[mask],
            sizes=self.sizes[mask],
        )


@dataclass(frozen=True)
class Listing:
    """A directory's entries: `entries` with their nodes, then the chunk files of `runs`.

    Positions (0, 1, ...) are stable for the life of the listing, which is
    what a reader paging through it with offsets needs.
    """

    entries: list[tuple[str, Node, Attr]]
    runs: Sequence[ChunkRun] = ()
    #: position of each run's first chunk
    starts: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lengths = itertools.accumulate((len(run) for run in self.runs), initial=len(self.entries))
        object.__setattr__(self, "starts", list(lengths))

    def __len__(self) -> int:
        return self.starts[-1]

    def chunks(self, start: int) -> Iterator[tuple[int, ChunkRun, int]]:
        """(position, run, row) of the run holding each stretch of chunks from `start` on."""
        first = max(0, bisect.bisect_right(self.starts, start) - 1)
        for i in range(first, len(self.runs)):
            row = max(0, start - self.starts[i])
            if row < len(self.runs[i]):
                yield self.starts[i] + row, self.runs[i], row

    def extent(self, node: Node) -> Extent | None:
        """Where the file of `node` is stored, if it is one of the chunk files listed and
        holds its stored bytes (see `ChunkRun.extent`); None for any other node, also of
        views whose chunks are not a Zarr array's."""
        if node.role is not Role.CHUNK or not isinstance(node.meta, ArrayView):
            return None
        meta = node.meta
        for run in self.runs:
            # the same array as of the same document: coordinates mean the same chunk
            if run.array.key != meta.key or run.array.version != meta.version:
                continue
            if (found := run.extent(node.coords)) is not None:
                return found
        return None

    def items(self) -> Iterator[tuple[str, Node, Attr]]:
        """Every entry with a node (one object per chunk: for small directories and tests)."""
        yield from self.entries
        for run in self.runs:
            end = len(run)
            details = zip(
                run.names(), run.sizes.tolist(), run.mtimes(0, end), run.accesses(0, end),
                strict=True,
            )  # fmt: skip
            for i, (name, size, mtime_ns, access) in enumerate(details):
                yield name, run.node(i, name), Attr(False, size, mtime_ns, None, access)
