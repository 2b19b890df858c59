"""The read-only view of a webknossos-wrap (WKW) dataset: Zarr arrays of plain chunk files.

A dataset root (`datasource-properties.json`) is shown as a group, each WKW
layer as a group, each magnification as an array; a bare magnification
(`header.wkw` only) is an array at the root. Every directory keeps its path;
the view adds the Zarr documents (`zarr.json`, or `.zgroup`/`.zarray`/`.zattrs`
and a consolidated `.zmetadata` in the v2 view) and, in a magnification's
directory, replaces the WKW files by one chunk file per block: `c/0/X/Y/Z`
(v3) or `0/X/Y/Z` (v2, `dimension_separator` `/`: no directory lists more than a row
of blocks). Other files of the dataset pass through.

A chunk file's size is known from the header alone, so stat and listings
read no data file. A data file's header and the part of its jump table that
locates a block (`PART_BLOCKS` blocks: the whole table of the files
webknossos writes) are read the first time one of its blocks is opened,
checked against the magnification's header, and cached by the file's version
and part; a block is then one ranged read (through `ReadAhead` where requests
are costly), LZ4 blocks decoded. A file changed while a block of it is open
fails the reads rather than mixing versions.

A block is read whole (LZ4 decodes only whole), and the kernel reads it in
pieces, so an open chunk file holds its block between reads; what all open
files hold is in one byte budget (`HeldBlocks`), made room in before a block
is fetched and decoded, so that readers that stop half way cannot make the
daemon hold a block each.
"""

from __future__ import annotations

import logging
import stat as stat_mod
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.wkw import (
    HEADER,
    HEADER_SIZE,
    PROPERTIES,
    V2_NAMES,
    V3_NAMES,
    Header,
    Mag,
    Vector,
    bare_shape,
    file_key,
    group_json,
    parse_file_part,
    parse_properties,
    v2_documents,
    zmetadata,
)
from shardfs.formats.zarr_v2 import ZMETADATA
from shardfs.formats.zarr_v2 import render as render_v2
from shardfs.primitives.blocking import WouldBlock, check_may_block, may_block
from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import (
    CorruptData,
    InvalidMetadata,
    IsADirectory,
    NotADirectory,
    NotFound,
)
from shardfs.storage.base import READ, SEARCH, Access, Entry, Need, Stat, Storage
from shardfs.view.base import (
    Chunk,
    Reader,
    SourceView,
    entry_path,
    latest,
    open_again,
    stored_file,
    verified,
)
from shardfs.view.hierarchy import join
from shardfs.view.nodes import Attr, Listing, Node, Role
from shardfs.view.presentation import Covers, View
from shardfs.view.readahead import Extents, ReadAhead

log = logging.getLogger("shardfs")

#: What the blocks that open chunk files hold between reads may take, all together
#: (a block bigger than this is held alone).
HELD_BLOCKS = 256 << 20
#: Seconds a block stays held for an open file that does not read on.
HOLD_IDLE = 5.0
#: What a document no one else may read is shown as: root's, mode 0.
_ROOT_ALONE: Access = (stat_mod.S_IFREG, 0, 0)


@dataclass(frozen=True)
class Dataset:
    """What the view shows of a WKW source, from version `stat` of its metadata file:
    its groups (attributes by directory), its magnifications (by directory) and the
    documents the view renders (by path)."""

    stat: Stat
    groups: dict[str, dict[str, Any]]
    mags: dict[str, Mag]
    docs: dict[str, bytes]

    @property
    def cost(self) -> int:
        return sum(len(d) for d in self.docs.values()) + 1024 * (len(self.mags) + 1)

    def mag_of(self, path: str) -> Mag | None:
        """The magnification whose directory holds `path` (or is it)."""
        for key, mag in self.mags.items():
            if not key or path == key or path.startswith(key + "/"):
                return mag
        return None


@dataclass(frozen=True)
class WkwSource:
    """A source holding a WKW dataset (or one magnification), as found when it was opened."""

    storage: Storage
    dataset: Dataset

    def report(self) -> list[dict[str, Any]]:
        """Each magnification: its directory, layer, layout and shape, for `shardfs info`."""
        return [
            {
                "path": key or ".",
                "layer": mag.layer,
                "mag": list(mag.factors) if mag.factors is not None else None,
                "data_type": mag.header.dtype.name,
                "channels": mag.header.channels,
                "layout": mag.header.describe(),
                "shape": mag.array_shape,
                "chunk_shape": mag.chunk_shape,
            }
            for key, mag in sorted(self.dataset.mags.items())
        ]


def _metadata_key(storage: Storage) -> str | None:
    """What makes the root a WKW source: its properties, or a magnification's header."""
    for key in (PROPERTIES, HEADER):
        stat = storage.stat(key)
        if stat is not None and not stat.is_dir:
            return key
    return None


def open_wkw(storage: Storage, view: View = View.V3) -> WkwSource | None:
    """The WKW dataset at the root of `storage`, or None if there is none; InvalidMetadata
    if its metadata cannot be read."""
    key = _metadata_key(storage)
    if key is None:
        return None
    dataset = latest(storage, key, lambda stat: load_dataset(storage, key, stat, view))
    if dataset is None:
        return None
    if not dataset.mags:
        raise InvalidMetadata(f"{PROPERTIES} lists no WKW magnification shardfs can read")
    return WkwSource(storage, dataset)


def _read_header(storage: Storage, key: str) -> Header | None:
    """The header of a magnification directory `key`, or None (with a warning) if it has
    none that shardfs reads."""
    path = join(key, HEADER)
    stat = storage.stat(path)
    if stat is None or stat.is_dir:
        return None
    try:
        return Header.parse(storage.read(path, 0, min(HEADER_SIZE, stat.size), stat.version))
    except CorruptData as e:
        log.warning("%s: shown as stored: %s", storage.describe(path), e)
        return None


def _files(storage: Storage, key: str, row: int | None = None) -> list[tuple[Vector, Stat]]:
    """The data files of magnification `key` (`z*/y*/x*.wkw`): their positions and stats;
    only those of file row `y{row}` if it is given (it saves listing the others)."""
    found = []
    for z in storage.list(key):
        zi = parse_file_part("z", z.name)
        if zi is None or not z.stat.is_dir:
            continue
        if row is not None:
            y_dir = storage.stat(join(join(key, z.name), f"y{row}"))
            rows = [Entry(f"y{row}", y_dir)] if y_dir is not None else []
        else:
            rows = storage.list(join(key, z.name))
        for y in rows:
            yi = parse_file_part("y", y.name)
            if yi is None or not y.stat.is_dir:
                continue
            for x in storage.list(join(join(key, z.name), y.name)):
                xi = parse_file_part("x", x.name, ".wkw")
                if xi is not None and not x.stat.is_dir:
                    found.append(((xi, yi, zi), x.stat))
    return found


def load_dataset(storage: Storage, key: str, stat: Stat, view: View) -> Dataset:
    """The dataset that version `stat` of its metadata file `key` describes, with the
    headers of its magnifications; a magnification that cannot be read is left as stored
    (one warning)."""
    raw = storage.read(key, 0, stat.size, stat.version)
    groups: dict[str, dict[str, Any]] = {}
    mags: dict[str, Mag] = {}
    if key == HEADER:
        try:
            header = Header.parse(raw)
        except CorruptData as e:
            raise InvalidMetadata(f"{HEADER}: {e}") from None
        shape = bare_shape(header, [position for position, _ in _files(storage, "")])
        mags[""] = Mag("", header, shape)
    else:
        properties = parse_properties(raw)
        for line in properties.skipped:
            log.warning("%s: %s", storage.describe(key), line)
        groups[""] = properties.attributes
        for layer in properties.layers:
            for spec in layer.mags:
                found = next(
                    (
                        (d, h)
                        for d in spec.candidates
                        if (h := _read_header(storage, d)) is not None
                    ),
                    None,
                )
                if found is None:
                    log.warning(
                        "%s: layer %s: no WKW magnification %s found (looked in %s)",
                        storage.describe(key),
                        layer.name,
                        "-".join(map(str, spec.mag)),
                        ", ".join(spec.candidates),
                    )
                    continue
                directory, header = found
                shape = layer.shape(spec.mag)
                mags[directory] = Mag(
                    directory, header, shape, spec.mag, layer.top_left, layer.name
                )
                groups[layer.name] = layer.attributes
    for directory in mags:
        groups.pop(directory, None)
    return Dataset(stat, groups, mags, _documents(groups, mags, view))


def _documents(
    groups: dict[str, dict[str, Any]], mags: dict[str, Mag], view: View
) -> dict[str, bytes]:
    """The documents the view renders, by path."""
    if view is View.V3:
        docs = {join(key, "zarr.json"): group_json(attrs) for key, attrs in groups.items()}
        docs.update({join(key, "zarr.json"): mag.zarr_json() for key, mag in mags.items()})
        return docs
    v2 = v2_documents(groups, mags)
    docs = {
        join(key, name): render_v2(doc) for key, named in v2.items() for name, doc in named.items()
    }
    for key in groups:
        docs[join(key, ZMETADATA)] = render_v2(zmetadata(v2, key))
    return docs


@dataclass(frozen=True, eq=False)
class _Table:
    """Where the blocks of part `part` of the table of version `stat` of data file `key`
    are: (offset, stored size) by index from the part's first block. What read-ahead
    walks (walks of two parts are told apart)."""

    key: str
    stat: Stat
    part: int
    entries: np.ndarray

    @cached_property
    def extents(self) -> Extents:
        return Extents(self.entries[:, 0], self.entries[:, 1])  # in file order already

    @property
    def cost(self) -> int:
        return 3 * self.entries.nbytes + 256


@dataclass(frozen=True)
class _Block:
    """A chunk file: block `block` of magnification `mag`, in data file `key` (as stat'ed)."""

    mag: Mag
    block: Vector
    key: str
    stat: Stat


@dataclass(frozen=True)
class _ChunkDir:
    """A directory of a magnification's chunk keys (v3), fixing coordinates `prefix`."""

    mag: Mag
    prefix: tuple[int, ...]


class HeldBlocks:
    """The whole blocks that open chunk files hold between reads, in one byte budget.

    A chunk file that is read whole (an LZ4 block, which decodes only whole, or
    a small raw block) is read in pieces by the kernel, and a reader may stop
    half way and keep the file open for good. So what a file holds is counted
    here, and room is made before a block is fetched and decoded: by dropping
    what idle files hold, least recently read first (a file whose block was
    dropped fetches and decodes it again if it reads on), and, while blocks being
    decoded fill the budget, by waiting for them. What is held and being decoded
    never exceeds the budget, except for one block alone when it is bigger. A
    block not read for `HOLD_IDLE` seconds is dropped too. Thread-safe.
    """

    def __init__(self, budget: int, idle: float = HOLD_IDLE) -> None:
        self.budget = budget
        self.idle = idle
        self._lock = threading.Lock()
        #: What a read that needs room waits on.
        self._room = threading.Condition(self._lock)
        #: What the thread that drops idle blocks waits on (never notified: it waits for
        #: the oldest block's time, and a block dropped meanwhile only wakes it early).
        self._clock = threading.Condition(self._lock)
        #: The blocks of idle files by file, least recently read first, with when.
        self._held: OrderedDict[object, tuple[bytes, float]] = OrderedDict()
        #: Bytes held, and taken by reads under way.
        self.used = 0
        self.hits = 0
        self.loads = 0
        self.dropped = 0
        self._sweeping = False

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats`: reads that found their block held (hits) or
        loaded it (misses), blocks dropped, bytes held of the budget."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.loads,
                "evictions": self.dropped,
                "used": self.used,
                "budget": self.budget,
            }

    def take(self, owner: object) -> bytes | None:
        """The block `owner` holds, if it was not dropped; its bytes stay counted until
        `settle`."""
        with self._lock:
            item = self._held.pop(owner, None)
            if item is None:
                return None
            self.hits += 1
            return item[0]

    def reserve(self, nbytes: int) -> int:
        """Count `nbytes` that a read is about to load, once there is room; `nbytes`."""
        with self._lock:
            while self.used and self.used + nbytes > self.budget:
                if self._held:
                    self._drop_oldest()
                    continue
                if not may_block():
                    raise WouldBlock
                self._room.wait()
            self.used += nbytes
            self.loads += 1
        return nbytes

    def settle(self, owner: object, counted: int, keep: bytes | None) -> None:
        """A read of `owner` is done: the `counted` bytes it took or reserved are free,
        and `keep`, if given, is held for it until its next read."""
        with self._lock:
            self.used -= counted
            if keep is not None:
                self.used += len(keep)
                self._held[owner] = (keep, time.monotonic())
                if not self._sweeping:
                    self._sweeping = True
                    threading.Thread(target=self._sweep, name="shardfs-held", daemon=True).start()
            self._room.notify_all()

    def drop(self, owner: object) -> None:
        """`owner` was closed: what it holds is free."""
        with self._lock:
            item = self._held.pop(owner, None)
            if item is not None:
                self.used -= len(item[0])
                self._room.notify_all()

    def _drop_oldest(self) -> None:
        _, (data, _) = self._held.popitem(last=False)
        self.used -= len(data)
        self.dropped += 1
        self._room.notify_all()

    def _sweep(self) -> None:
        """Drop blocks idle for `idle` seconds, while there are any held."""
        with self._lock:
            while self._held:
                # (only the time: a reference to the block would keep it while it waits)
                since = next(iter(self._held.values()))[1]
                wait = since + self.idle - time.monotonic()
                if wait <= 0:
                    self._drop_oldest()
                else:
                    self._clock.wait(wait)
            self._sweeping = False


class _BlockReader(Reader):
    """A chunk file: a `Reader` whose block, when it is read whole, is held between reads
    in the view's `HeldBlocks` rather than by the reader, so that what idle open files
    hold stays within that budget. Reads of one file run one at a time (the kernel
    sends several at once), so that a block is loaded once for them."""

    def __init__(self, held: HeldBlocks, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = held
        self._serving = threading.Lock()
        #: What a load takes beyond the block: its stored bytes, and their copy that the
        #: LZ4 decoder reads (see `Header.decode`).
        self._transient = 2 * self._stored if self._decode is not None else 0

    def read(self, offset: int, size: int) -> bytes:
        if not self._whole:
            return super().read(offset, size)
        if self._failed is not None:
            raise self._failed
        if offset >= self.size or size <= 0:
            return b""
        size = min(size, self.size - offset)
        if not self._serving.acquire(blocking=may_block()):
            raise WouldBlock
        try:
            data = self._held.take(self)
            counted, keep = 0 if data is None else len(data), None
            try:
                if data is None:
                    check_may_block()  # a fetch and a decode: in a worker thread
                    counted = self._held.reserve(self.size + self._transient)
                    data = self._load()
                # Read to the end: a sequential reader is done with it.
                keep = data if offset + size < self.size else None
                return data[offset : offset + size]
            finally:
                self._held.settle(self, counted, keep)
        finally:
            self._serving.release()

    def close(self) -> None:
        self._held.drop(self)
        super().close()


#: What a view path is: a rendered document, a chunk, a chunk directory, a magnification
#: directory, or a source file or directory.
_Target = bytes | _Block | _ChunkDir | Mag | Stat
_ROLES = {bytes: Role.METADATA, _Block: Role.CHUNK, _ChunkDir: Role.CHUNK_DIR, Mag: Role.ARRAY}


class WkwNamespace(SourceView):
    """The view of one WKW source, for the FUSE adapter's read-only calls. Thread-safe;
    every method may block on storage."""

    def __init__(
        self,
        storage: Storage,
        view: View = View.V3,
        index_cache: int = 64 << 20,
        read_cache: int = 64 << 20,
        held_blocks: int = HELD_BLOCKS,
        covers: Covers | None = None,
    ) -> None:
        self.storage = storage
        self.view = view
        #: What decides the magnifications a `.zmetadata` holds (see `_document`); None
        #: where no other user reads through the mount: then it holds them all.
        self.covers = covers
        self.names: ChunkKeyEncoding = V3_NAMES if view is View.V3 else V2_NAMES
        self.metadata_key = _metadata_key(storage) or PROPERTIES
        #: Parts of data files' block tables, by file version and part (corrupt ones too:
        #: logged once).
        self.tables: LruCache[_Table] = LruCache(
            index_cache, lambda t: t.cost, cache_errors=(CorruptData,)
        )
        #: Whole blocks that open chunk files hold between reads.
        self.held = HeldBlocks(held_blocks)
        #: Blocks fetched ahead of their reads (only on stores with costly requests).
        self.read_ahead = ReadAhead(storage, read_cache)
        #: The dataset by version of its metadata file; None once it is not valid.
        self.datasets: LruCache[Dataset | None] = LruCache(
            4 << 20, lambda d: d.cost if d is not None else 256
        )

    def caches(self) -> dict[str, LruCache | ReadAhead]:
        return {
            "shard indexes": self.tables,
            "metadata": self.datasets,
            "read-ahead": self.read_ahead,
        }

    def stats(self) -> dict[str, Any]:
        figures = super().stats()
        figures["caches"]["held blocks"] = self.held.snapshot()
        return figures

    def digest_source(self, node: Node) -> None:
        return None  # `user.md5` is a Zarr view's

    def chunk_directory(self, path: str) -> None:
        return None  # chunk files are found the long way only

    # -- the dataset -------------------------------------------------------------------

    def dataset(self) -> Dataset | None:
        """The dataset as its metadata file describes it now; None (everything shown as
        stored) if that is gone or no longer valid."""
        key = self.metadata_key
        return latest(
            self.storage, key, lambda stat: self.datasets.get(stat.version, self._loader(stat))
        )

    def _loader(self, stat: Stat) -> Callable[[], Dataset | None]:
        def load() -> Dataset | None:
            try:
                return load_dataset(self.storage, self.metadata_key, stat, self.view)
            except InvalidMetadata as e:
                name = self.storage.describe(self.metadata_key)
                log.warning("%s: every file shown as stored: %s", name, e)
                return None

        return load

    def _document(self, dataset: Dataset, path: str) -> bytes | None:
        """The rendered document at `path`, if there is one. A group's `.zmetadata` is shown
        with the mode of the metadata file, as every document, but is made from the
        headers of the magnifications below it too: where other users read through the
        mount, it leaves out a magnification that one of those its mode admits could not
        reach and read the header of (as `Presentation` does for a Zarr group's)."""
        doc = dataset.docs.get(path)
        group, _, name = path.rpartition("/")
        if doc is None or self.covers is None or name != ZMETADATA:
            return doc
        hidden = {
            key
            for key in dataset.mags
            if (not group or key.startswith(group + "/"))
            and not self._readable(dataset, group, key)
        }
        if not hidden:
            return doc
        shown = {key: mag for key, mag in dataset.mags.items() if key not in hidden}
        return render_v2(zmetadata(v2_documents(dataset.groups, shown), group))

    def _document_access(self, dataset: Dataset, path: str) -> Access | None:
        """The mode and owner the rendered document at `path` is shown with: the metadata
        file's. A magnification's own documents are made from its header too: where other
        users read through the mount and that mode would admit one the header denies, the
        header's, if it admits no one the metadata file denies; else no one's but root's."""
        shown = dataset.stat.access
        key = path.rpartition("/")[0]
        if self.covers is None or key not in dataset.mags:
            return shown
        header = self.storage.stat(join(key, HEADER))
        if header is None or header.is_dir:
            return _ROOT_ALONE
        if self.covers(shown, [(False, header.access, READ)]):
            return shown
        if self.covers(header.access, [(False, shown, READ)]):
            return header.access
        return _ROOT_ALONE

    def _readable(self, dataset: Dataset, group: str, key: str) -> bool:
        """Whether every user who may read the metadata file may search each directory
        from `group` down to magnification `key` and read its header."""
        assert self.covers is not None
        needs: list[Need] = []
        names = key.split("/")
        for i in range(len(group.split("/")) if group else 0, len(names)):
            stat = self.storage.stat("/".join(names[: i + 1]))
            if stat is None or not stat.is_dir:
                return False
            needs.append((True, stat.access, SEARCH))
        header = self.storage.stat(join(key, HEADER))
        if header is None or header.is_dir:
            return False
        needs.append((False, header.access, READ))
        return self.covers(dataset.stat.access, needs)

    # -- classification ----------------------------------------------------------------

    def _root(self) -> Node:
        dataset = self.dataset()
        return Node("", self._role(dataset, "", self._target(dataset, "")))

    def lookup(self, parent: Node, name: str) -> Node:
        path = entry_path(parent, name)
        dataset = self.dataset()
        return Node(path, self._role(dataset, path, self._target(dataset, path)))

    def _target(self, dataset: Dataset | None, path: str) -> _Target:
        """What `path` is now; NotFound if nothing."""
        if dataset is not None:
            doc = self._document(dataset, path)
            if doc is not None:
                return doc
            mag = dataset.mag_of(path)
            if mag is not None:
                return self._in_mag(mag, path)
        stat = self.storage.stat(path)
        if stat is None:
            raise NotFound(path)
        return stat

    def _in_mag(self, mag: Mag, path: str) -> _Block | _ChunkDir | Mag:
        if path == mag.key:
            return mag
        rel = path[len(mag.key) + 1 :] if mag.key else path
        coords = self.names.decode(rel, 4)
        if coords is not None:
            block = mag.chunk_coords(coords)
            if block is not None:
                position, _ = mag.locate(block)
                key = join(mag.key, file_key(position))
                stat = self.storage.stat(key)
                if stat is not None and not stat.is_dir:
                    return _Block(mag, block, key, stat)
            raise NotFound(path)
        prefix = self.names.dir_depth(rel.split("/"), 4)
        if prefix is not None and (not prefix or mag.chunk_coords((*prefix, 0, 0, 0)[:4])):
            return _ChunkDir(mag, prefix)
        raise NotFound(path)

    @staticmethod
    def _role(dataset: Dataset | None, path: str, target: _Target) -> Role:
        if not isinstance(target, Stat):
            return _ROLES[type(target)]
        if not target.is_dir:
            return Role.FILE
        return Role.GROUP if dataset is not None and path in dataset.groups else Role.DIR

    # -- attributes and listings ---------------------------------------------------------

    def attr(self, node: Node) -> Attr:
        dataset = self.dataset()
        target = self._target(dataset, node.path)
        if isinstance(target, bytes):
            assert dataset is not None
            access = self._document_access(dataset, node.path)
            return Attr(False, len(target), dataset.stat.mtime_ns, None, access)
        if isinstance(target, _Block):
            stat = target.stat
            return Attr(False, target.mag.header.block_bytes, stat.mtime_ns, None, stat.access)
        if isinstance(target, _ChunkDir | Mag):
            assert dataset is not None
            mag = target if isinstance(target, Mag) else target.mag
            return Attr(True, 0, dataset.stat.mtime_ns, None, self._dir_access(mag))
        return Attr.of(target)

    def _dir_access(self, mag: Mag) -> Access | None:
        """The mode and owner of a magnification's directories: its stored directory's (the
        chunk directories below it are not stored)."""
        stat = self.storage.stat(mag.key)
        return stat.access if stat is not None else None

    def listing(self, node: Node) -> Listing:
        """The entries of a directory node, sorted by name."""
        dataset = self.dataset()
        target = self._target(dataset, node.path)
        if isinstance(target, Mag | _ChunkDir):
            assert dataset is not None
            entries = self._chunk_entries(dataset, node.path, target)
        elif isinstance(target, Stat) and target.is_dir:
            entries = self._source_entries(dataset, node.path)
        else:
            raise NotADirectory(node.path)
        entries.sort(key=lambda item: item[0])
        return Listing(entries)

    def _docs_in(self, dataset: Dataset, directory: str) -> list[tuple[str, Node, Attr]]:
        return [
            (
                name,
                Node(path, Role.METADATA),
                Attr(
                    False,
                    len(doc),
                    dataset.stat.mtime_ns,
                    None,
                    self._document_access(dataset, path),
                ),
            )
            for path in dataset.docs
            if (name := path.rpartition("/")[2])
            and join(directory, name) == path
            and (doc := self._document(dataset, path)) is not None
        ]

    def _source_entries(
        self, dataset: Dataset | None, directory: str
    ) -> list[tuple[str, Node, Attr]]:
        """A source directory's entries, with the view's documents instead of any of the
        same name, and magnifications shown as arrays."""
        listed = []
        docs = self._docs_in(dataset, directory) if dataset is not None else []
        shown = {name for name, _, _ in docs}
        for entry in self.storage.list(directory):
            if entry.name in shown:
                continue
            path = join(directory, entry.name)
            if dataset is not None and path in dataset.mags:
                node = Node(path, Role.ARRAY)
                attr = Attr(True, 0, dataset.stat.mtime_ns, None, entry.stat.access)
                listed.append((entry.name, node, attr))
                continue
            role = self._role(dataset, path, entry.stat)
            listed.append((entry.name, Node(path, role), Attr.of(entry.stat)))
        return docs + listed

    def _chunk_entries(
        self, dataset: Dataset, directory: str, target: Mag | _ChunkDir
    ) -> list[tuple[str, Node, Attr]]:
        """A magnification's documents and its key space's first level (`c` in v3), or one
        level of its chunk keys: only what a data file holds blocks of."""
        mag = target if isinstance(target, Mag) else target.mag
        prefix = target.prefix if isinstance(target, _ChunkDir) else ()
        entries = self._docs_in(dataset, directory) if isinstance(target, Mag) else []
        # A directory c/0/X/Y lists blocks of one row of files only.
        row = prefix[2] // mag.header.file_len if len(prefix) == 3 else None
        found: dict[int, int] = {}  # index at this level: the latest mtime of its files
        #: a chunk's mode and owner: its file's (a chunk's block lies in one file)
        accesses: dict[int, Access | None] = {}
        for position, stat in _files(self.storage, mag.key, row):
            ranges = [range(1), *mag.blocks_of_file(position)]
            if all(ranges[1:]) and all(p in r for p, r in zip(prefix, ranges, strict=False)):
                for i in ranges[len(prefix)]:
                    found[i] = max(found.get(i, 0), stat.mtime_ns)
                    accesses[i] = stat.access
        dir_access = self._dir_access(mag) if found else None
        if isinstance(target, Mag) and self.names.name == "default":  # v3: keys below `c`
            if found:
                node = Node(join(directory, "c"), Role.CHUNK_DIR, coords=())
                entries.append(("c", node, Attr(True, 0, dataset.stat.mtime_ns, None, dir_access)))
            return entries
        for i, mtime_ns in found.items():
            coords = (*prefix, i)
            if len(coords) == 4:  # a chunk: its block lies in one file
                size = mag.header.block_bytes
                role, attr = Role.CHUNK, Attr(False, size, mtime_ns, None, accesses[i])
            else:
                role, attr = Role.CHUNK_DIR, Attr(True, 0, mtime_ns, None, dir_access)
            entries.append((str(i), Node(join(directory, str(i)), role, coords=coords), attr))
        return entries

    # -- data ----------------------------------------------------------------------------

    def open(self, node: Node) -> Reader:
        return open_again(node, self._open)

    def _open(self, node: Node) -> Reader:
        dataset = self.dataset()
        target = self._target(dataset, node.path)
        if isinstance(target, bytes):
            assert dataset is not None
            shown = replace(dataset.stat, access=self._document_access(dataset, node.path))
            return Reader(self.storage, node.path, shown, None, data=target)
        if isinstance(target, _ChunkDir | Mag) or (isinstance(target, Stat) and target.is_dir):
            raise IsADirectory(node.path)
        if isinstance(target, Stat):
            return stored_file(self.storage, node.path, node.path, target)
        header = target.mag.header
        _, index = target.mag.locate(target.block)
        part, row = divmod(index, header.part_blocks)
        table = self._table(header, target.key, target.stat, part)
        offset, stored = (int(v) for v in table.entries[row])
        return _BlockReader(
            self.held,
            self.storage,
            node.path,
            target.stat,
            self.storage.pin(target.key, target.stat),
            offset,
            stored,
            header.block_bytes,
            decode=header.decode if header.compressed else None,
            chunk=Chunk(self.read_ahead, table),
        )

    def _table(self, header: Header, key: str, stat: Stat, part: int) -> _Table:
        """Part `part` of the block table of version `stat` of a data file: one read of
        its start (the header and the first part), or two (the header, and the part's
        entries): never more than `PART_BLOCKS` entries, whatever the file's size."""

        def read(offset: int, length: int) -> bytes:
            length = min(length, stat.size - offset)
            return self.storage.read(key, offset, length, stat.version) if length > 0 else b""

        def load() -> _Table:
            entries = verified(
                self.storage,
                key,
                stat,
                lambda: header.extents(
                    [read(*r) for r in header.table_reads(part)], stat.size, part
                ),
            )
            return _Table(key, stat, part, entries)

        return self.tables.get((key, stat.version, part), load)
