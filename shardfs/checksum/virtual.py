"""The checksum of the unsharded view: every file as a mount of the source shows it.

Computed in-process over a `Namespace` (or a `WkwNamespace`, whose listings are all
files: its chunk files are read through the view, each block decoded as a mount
serves it), not through FUSE, in one depth-first
walk of the view's listings (as a mount lists them) whose digests are folded
directory by directory (`Fold`): memory holds the directories on the walk's
path and the batches in flight, never the whole tree. Chunk directories are
walked in grid order, so each shard is read front to back, a stretch of it
at a time. A chunk file's bytes are a range of its shard: the chunks of a
batch are read in offset order, in reads of up to a piece over small gaps,
and each is hashed as a slice of its read (as served, where the view serves
other bytes than those stored: the v2 view cuts off a trailing crc32c, or
decodes). Other files (metadata documents, files passed through) are read
through the view. Batches are hashed in a thread pool and folded in the
walk's order.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from tqdm import tqdm

from shardfs.checksum.hashing import (
    BATCH_FILES,
    Block,
    batches,
    default_workers,
    fold,
    md5_range,
    md5_reader,
    piece_size,
)
from shardfs.checksum.tree import Digest, DirectoryChecksum, Item
from shardfs.formats.zarr_v2 import Transform
from shardfs.primitives.errors import CorruptData, SourceChanged
from shardfs.view.namespace import Namespace
from shardfs.view.nodes import ChunkRun, Node, Role
from shardfs.view.wkw import WkwNamespace

#: The views whose files it walks.
Walked = Namespace | WkwNamespace

#: Bytes between two chunks of a shard read over rather than starting a new read (at least).
GAP = 256 << 10
#: Shards whose listed version is remembered (the most recently listed).
SHARDS_KEPT = 1 << 16


@dataclass(frozen=True)
class _File:
    """A file read through the view: a metadata document, a file passed through."""

    directory: str
    name: str
    node: Node
    size: int


@dataclass(frozen=True, eq=False)
class _Chunks:
    """Chunk files of one directory (a stretch of a listing's run): the shard each is
    stored in (a row of `shards`: key and listed version), its extent there (offset,
    nbytes), and how the view serves stored bytes (None: as they are)."""

    directory: str
    names: list[str]
    shard: np.ndarray
    shards: list[tuple[str, Hashable]]
    extents: np.ndarray
    serve: Callable[[bytes], bytes] | None


def _weight(item: _File | _Chunks) -> tuple[int, int]:
    """(files, bytes to read) of an item, to size batches."""
    if isinstance(item, _File):
        return 1, item.size
    return len(item.names), int(item.extents[:, 1].sum())


class _Versions:
    """The version each shard was listed at, for the last SHARDS_KEPT shards listed: a shard
    listed at two versions (replaced between the listings of two of its directories)
    fails the checksum rather than mixing them. The walk lists a shard's directories
    close together, so a few shards' worth is all it needs."""

    def __init__(self, namespace: Walked) -> None:
        self.ns = namespace
        self._seen: OrderedDict[str, Hashable] = OrderedDict()

    def check(self, key: str, version: Hashable) -> tuple[str, Hashable]:
        if key not in self._seen:
            self._seen[key] = version
            if len(self._seen) > SHARDS_KEPT:
                self._seen.popitem(last=False)
        elif self._seen[key] != version:
            raise SourceChanged(f"{self.ns.storage.describe(key)} changed during the checksum")
        else:
            self._seen.move_to_end(key)
        return key, version


def _walk(namespace: Walked) -> Iterator[_File | _Chunks]:
    """Every file of the view, depth first: a directory's files, then its subdirectories
    (chunk directories in grid order, others by name)."""
    versions = _Versions(namespace)
    pending: list[Iterator[Node]] = [iter([namespace.root()])]
    while pending:
        directory = next(pending[-1], None)
        if directory is None:
            pending.pop()
            continue
        listing = namespace.listing(directory)
        children = []
        for name, node, attr in listing.entries:
            if attr.is_dir:
                children.append(node)
            else:
                yield _File(directory.path, name, node, attr.size)
        for run in listing.runs:
            yield from _stretches(run, versions)
        children.sort(key=_walk_order)
        pending.append(iter(children))


def _walk_order(node: Node) -> tuple[Any, ...]:
    """Chunk directories in grid order, the order writers store chunks in a shard in: the
    walk then reads each shard front to back, and needs few shard indexes at a time."""
    return (0, node.coords) if node.role is Role.CHUNK_DIR else (1, node.path)


def _stretches(run: ChunkRun, versions: _Versions) -> Iterator[_Chunks]:
    """The run's chunks in stretches of at most BATCH_FILES."""
    shards = [versions.check(key, stat.version) for key, stat in run.shards]
    v2 = run.array.v2
    serve = None if v2 is None or v2.transform is Transform.RAW else v2.serve
    for start in range(0, len(run), BATCH_FILES):
        stop = start + BATCH_FILES
        names = run.names(start, stop)
        shard, extents = run.shard[start:stop], run.extents[start:stop]
        yield _Chunks(run.directory, names, shard, shards, extents, serve)


def _hash(ns: Walked, gap: int, piece: int, batch: list[_File | _Chunks]) -> list[Block]:
    """The (name, digest, size) of the files of `batch`, by directory, in its order."""
    chunks = [item for item in batch if isinstance(item, _Chunks)]
    digests, sizes = _hash_chunks(ns, chunks, gap, piece) if chunks else ([], [])
    blocks: list[Block] = []
    at = 0
    for item in batch:
        entries: list[Item]
        if isinstance(item, _File):
            with ns.open(item.node) as reader:
                entries = [(item.name, md5_reader(reader, piece), reader.size)]
        else:
            end = at + len(item.names)
            entries = list(zip(item.names, digests[at:end], sizes[at:end], strict=True))
            at = end
        if blocks and blocks[-1][0] == item.directory:
            blocks[-1][1].extend(entries)
        else:
            blocks.append((item.directory, entries))
    return blocks


def _hash_chunks(
    ns: Walked, chunks: list[_Chunks], gap: int, piece: int
) -> tuple[list[str], list[int]]:
    """The digests and served sizes of the chunk files of `chunks`, in their order.

    The chunks are read in (shard, offset) order, gathered into reads of up to
    `piece` bytes over gaps of up to `gap` bytes; a bigger chunk is a read of
    its own, streamed unless the view serves other bytes than those stored.
    """
    ids: dict[tuple[str, Hashable], int] = {}
    serves: dict[int, Callable[[bytes], bytes] | None] = {}
    rows = []
    for item in chunks:
        local = np.array([ids.setdefault(shard, len(ids)) for shard in item.shards], np.int64)
        serves.update(dict.fromkeys(local.tolist(), item.serve))
        rows.append(local[item.shard])
    shard_of = np.concatenate(rows)
    extents = np.concatenate([item.extents for item in chunks]).astype(np.int64)
    order = np.lexsort((extents[:, 0], shard_of))
    shards = list(ids)
    digests = [""] * len(order)
    sizes = extents[:, 1].tolist()  # as stored; `serve` may change some
    shard_l = shard_of[order].tolist()
    offset_l = extents[order, 0].tolist()
    nbytes_l = extents[order, 1].tolist()
    slot_l = order.tolist()
    first, count = 0, len(slot_l)
    while first < count:  # one read: rows [first, last)
        shard, start = shard_l[first], offset_l[first]
        end = start + nbytes_l[first]
        last = first + 1
        while last < count and shard_l[last] == shard:
            stop = offset_l[last] + nbytes_l[last]
            if offset_l[last] - end > gap or max(end, stop) - start > piece:
                break
            end = max(end, stop)
            last += 1
        key, version = shards[shard]
        serve = serves[shard]
        if end - start > piece and serve is None:  # one chunk bigger than a piece: streamed
            digests[slot_l[first]] = md5_range(ns.storage, key, start, end - start, version, piece)
            first = last
            continue
        data = memoryview(ns.storage.read(key, start, end - start, version))
        for row in range(first, last):
            at = offset_l[row] - start
            stored = data[at : at + nbytes_l[row]]
            slot = slot_l[row]
            if serve is None:
                digests[slot] = hashlib.md5(stored).hexdigest()
            else:
                served = _serve(ns, key, serve, stored, chunks, slot)
                digests[slot] = hashlib.md5(served).hexdigest()
                sizes[slot] = len(served)
        first = last
    return digests, sizes


def _serve(
    ns: Walked,
    key: str,
    serve: Callable[[bytes], bytes],
    stored: memoryview,
    chunks: list[_Chunks],
    slot: int,
) -> bytes:
    """The bytes the view serves for a stored chunk (a v2 chunk); a chunk that fails its
    check is named by its path in the view."""
    try:
        return serve(bytes(stored))
    except CorruptData as e:
        starts = list(itertools.accumulate((len(item.names) for item in chunks), initial=0))
        i = bisect.bisect_right(starts, slot) - 1
        item, name = chunks[i], chunks[i].names[slot - starts[i]]
        path = f"{item.directory}/{name}" if item.directory else name
        raise CorruptData(f"{path} (stored in {ns.storage.describe(key)}): {e}") from None


def virtual_checksum(
    namespace: Walked,
    progress: tqdm | None = None,
    workers: int | None = None,
    on_directory: Callable[[DirectoryChecksum], None] | None = None,
) -> Digest:
    """The checksum of every file of the view; `progress` counts the files and bytes hashed,
    `on_directory` gets each directory's checksum as it is made (see `Fold`)."""
    workers = workers or default_workers(namespace.storage)
    piece = piece_size(workers)
    gap = max(GAP, namespace.storage.request_cost)
    tasks = (
        partial(_hash, namespace, gap, piece, batch)
        for batch in batches(_walk(namespace), _weight, piece)
    )
    return fold(tasks, workers, progress, on_directory)
