"""Finding the shards of a source and reading their indexes fresh, for fsck and compact.

Both commands work on the source itself, never through a mount, and only
through the `Storage` interface. A shard's index is always read from storage
pinned to the version just stat'ed, never from a cache, because the source may
be mounted read-write meanwhile: a mount's append changes the version, and a
half-written append must not be taken for damage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from shardfs.formats.shard_index import EMPTY
from shardfs.formats.zarr_v3 import (
    ShardedLayout,
    ShardLevel,
    Unshardable,
    parse_node,
    sharded_layout,
)
from shardfs.maintenance.progress import quiet
from shardfs.primitives.errors import (
    CorruptData,
    InvalidMetadata,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import Entry, Stat, Storage
from shardfs.storage.journal import Unsettled
from shardfs.view.hierarchy import ZarrV3, join, open_hierarchy


class KeptChanging(StorageError):
    """Other writers changed a shard every time it was read; it was left for a later run."""


@dataclass(frozen=True)
class ShardedArray:
    """A `sharding_indexed` array and the keys of the shard objects found in its directory."""

    path: str
    layout: ShardedLayout
    shards: list[str]

    @property
    def level(self) -> ShardLevel:
        """The outer sharding level: the only one fsck checks and compact rewrites."""
        return self.layout.levels[0]


@dataclass(frozen=True)
class Skipped:
    """A node that was not looked at, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Inventory:
    arrays: list[ShardedArray]
    skipped: list[Skipped]

    @property
    def shard_count(self) -> int:
        return sum(len(a.shards) for a in self.arrays)


def display(path: str) -> str:
    """A node path as reports show it: "/" for the root, "/a/b" below it."""
    return "/" + path


@dataclass(frozen=True)
class NodeMeta:
    """A group or array of the hierarchy and its parsed `zarr.json`."""

    path: str
    meta: dict[str, Any]


def find_nodes(storage: Storage) -> tuple[list[NodeMeta], list[Skipped]]:
    """Every group and array of the source's hierarchy, in path order, and the nodes whose
    metadata does not parse (with the reason).

    Directories without `zarr.json` are searched too, since a stray directory
    may still hold arrays below it. Draft v3 sources are not supported.
    """
    hierarchy = open_hierarchy(storage)
    if not isinstance(hierarchy, ZarrV3):
        return [], [Skipped("", "draft Zarr v3 sources are not supported")]
    nodes: list[NodeMeta] = []
    skipped: list[Skipped] = []
    pending = [""]
    while pending:
        path = pending.pop()
        doc = hierarchy.find(path)
        if doc is not None:
            assert doc.key is not None  # a final v3 node always has its zarr.json
            try:
                meta = parse_node(_read_whole(storage, doc.key))
            except InvalidMetadata as e:
                skipped.append(Skipped(path, str(e)))
                continue
            nodes.append(NodeMeta(path, meta))
            if meta["node_type"] == "array":
                continue
        pending += [join(path, e.name) for e in _list(storage, path) if e.stat.is_dir]
    nodes.sort(key=lambda n: n.path)
    skipped.sort(key=lambda s: s.path)
    return nodes, skipped


def find_shards(storage: Storage, progress: tqdm | None = None) -> Inventory:
    """Every sharded array of the source's hierarchy with its shard keys, in path order;
    `progress` counts the shards as they are found.

    Arrays whose metadata cannot be understood are skipped with the reason;
    unsharded arrays are left out (see `find_nodes`).
    """
    progress = quiet() if progress is None else progress
    nodes, skipped = find_nodes(storage)
    arrays: list[ShardedArray] = []
    for node in nodes:
        if node.meta["node_type"] != "array":
            continue
        try:
            layout = sharded_layout(node.meta)
        except (InvalidMetadata, Unshardable) as e:
            skipped.append(Skipped(node.path, str(e)))
            continue
        if layout is not None:
            keys = shard_keys(storage, node.path, layout, progress)
            arrays.append(ShardedArray(node.path, layout, keys))
    skipped.sort(key=lambda s: s.path)
    return Inventory(arrays, skipped)


def _read_whole(storage: Storage, key: str) -> bytes:
    """The whole object, of one version even if writers replace it meanwhile."""
    for _ in attempts():
        stat = storage.stat(key)
        if stat is None or stat.is_dir:
            raise InvalidMetadata(f"{storage.describe(key)} vanished while it was read")
        try:
            return storage.read(key, 0, stat.size, stat.version)
        except SourceChanged:
            continue
    raise KeptChanging(f"{storage.describe(key)} kept changing while it was read")


def _list(storage: Storage, key: str) -> list[Entry]:
    """The entries of a directory; none if it vanished (a writer removed it meanwhile)."""
    try:
        return storage.list(key)
    except (NotFound, NotADirectory):
        return []


def shard_keys(
    storage: Storage, path: str, layout: ShardedLayout, progress: tqdm | None = None
) -> list[str]:
    """The keys of the shard objects (or, for a layout of an unsharded array, the chunk
    objects) below the array directory `path`, sorted; `progress` counts them as each
    directory holding some is listed."""
    keys, ndim = layout.keys, layout.ndim
    progress = quiet() if progress is None else progress
    if not keys.nested:
        flat = [
            join(path, e.name)
            for e in _list(storage, path)
            if not e.stat.is_dir and keys.decode(e.name, ndim) is not None
        ]
        progress.update(len(flat))
        return sorted(flat)
    # One directory level per axis (`c/<i>/<j>` or `<i>/<j>`): directories down to the
    # last axis, whose entries are the shards.
    top = keys.dir_path(())
    found = [join(path, top) if top else path]
    for depth in range(ndim):
        leaf = depth == ndim - 1
        below: list[str] = []
        for parent in found:
            listed = [
                join(parent, e.name)
                for e in _list(storage, parent)
                if e.stat.is_dir != leaf and keys.component(e.name, depth) is not None
            ]
            if leaf:
                progress.update(len(listed))
            below += listed
        found = below
    return sorted(found)


@dataclass(frozen=True)
class ShardIndex:
    """A shard's outer index as read at `stat.version`: flat (slots, 2), absolute offsets."""

    stat: Stat
    entries: np.ndarray
    index_size: int

    @property
    def live(self) -> int:
        """Bytes some index entry points to (a byte shared by two entries counts once)."""
        used = self.entries[self.entries[:, 1] != EMPTY].astype(np.int64)
        if not len(used):
            return 0
        used = used[np.argsort(used[:, 0], kind="stable")]
        starts, ends = used[:, 0], used[:, 0] + used[:, 1]
        reach = np.maximum.accumulate(np.concatenate(([0], ends[:-1])))
        return int(np.clip(ends - np.maximum(starts, reach), 0, None).sum())

    @property
    def dead(self) -> int:
        """Bytes neither the index nor a chunk occupies: what appends left behind."""
        return self.stat.size - self.index_size - self.live


class IndexReader:
    """Reads shard indexes fresh from storage and tells damage from an append in flight.

    With `repair`, unfinished appends are settled first (`Storage.recover`:
    a torn tail is cut back, which is always safe), and again whenever a
    shard that fails to decode has one, since recovery waits for a live
    writer rather than cutting its tail. Without `repair` nothing is changed
    and such shards are reported as damage with that note.
    """

    def __init__(self, storage: Storage, repair: bool) -> None:
        self.storage = storage
        self.repair = repair
        #: The lines of every recovery run (repair) ...
        self.recovery: list[str] = storage.recover() if repair else []
        #: Why unfinished appends could not be looked for, if they could not: credentials
        #: that may only read cannot list S3's multipart uploads.
        self.unfinished_unknown: str | None = None
        #: ... or the keys with unfinished appends at the start (no repair).
        self.pending: list[str] = [] if repair else self._unfinished() or []

    def _unfinished(self) -> list[str] | None:
        """The keys with unfinished appends; None where the store would not say (see
        `unfinished_unknown`): a check that only reads must not need more than reads."""
        try:
            return self.storage.pending_recovery()
        except StorageError as e:
            self.unfinished_unknown = str(e)
            return None

    def read(self, key: str, level: ShardLevel) -> ShardIndex | None:
        """The shard's current index; None if there is no shard (any more).

        Raises CorruptData (naming the shard) if it does not verify, and
        KeptChanging if writers changed it at every attempt.
        """
        for _ in attempts():
            stat = self.storage.stat(key)
            if stat is None or stat.is_dir:
                return None
            try:
                return self._decode(key, level, stat)
            except SourceChanged:
                continue
            except CorruptData as e:
                current = self.storage.stat(key)
                if current is None or current.version != stat.version:
                    continue  # a writer was at work: read the new version
                unfinished = self._unfinished()
                if unfinished is None or key not in unfinished:
                    raise CorruptData(f"{self.storage.describe(key)}: {e}") from None
                if not self.repair:
                    raise CorruptData(
                        f"{self.storage.describe(key)}: {e} (it has an unfinished append, "
                        "whose writer is at work or crashed; repair rolls a torn one back)"
                    ) from None
                self.recovery += self.storage.recover()
                if key in (self._unfinished() or ()):
                    raise CorruptData(
                        f"{self.storage.describe(key)}: {e} (it has an unfinished append that "
                        "recovery leaves to a person: see POSSIBLY TORN)"
                    ) from None
        raise KeptChanging(f"{self.storage.describe(key)} kept changing while it was read")

    def _decode(self, key: str, level: ShardLevel, stat: Stat) -> ShardIndex:
        size = level.index_size
        raw = self.storage.read(key, level.index_offset(stat.size), size, stat.version)
        entries = level.decode_index(raw, stat.size)
        return ShardIndex(stat, entries, size)


def split_recovery(lines: list[str]) -> tuple[list[str], list[str]]:
    """Recovery lines: what was repaired, and (once each) what is left to a person."""
    repaired = [line for line in lines if not isinstance(line, Unsettled)]
    return repaired, list(dict.fromkeys(line for line in lines if isinstance(line, Unsettled)))
