"""The checksum of the unsharded view: every file as a mount of the source shows it.

Computed in-process over a `Namespace`, not through FUSE. The files are the
view's listings, as a mount lists them. A chunk file's bytes are a range of
its shard: each shard is read once, in big sequential pieces in offset order,
and every chunk is hashed as a slice of a piece (as served, where the view
serves other bytes than those stored: the v2 view cuts off a trailing
crc32c, or decodes). Other files (metadata documents, files passed through)
are read through the view. Reads and hashes run in a thread pool.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from tqdm import tqdm

from shardfs.checksum.hashing import (
    PIECE,
    batches,
    default_workers,
    md5_range,
    md5_reader,
    parallel,
)
from shardfs.checksum.tree import ChecksumTree
from shardfs.errors import CorruptData, SourceChanged
from shardfs.formats.zarr_v2 import Transform
from shardfs.maintenance.progress import quiet, walked
from shardfs.maintenance.report import format_size
from shardfs.storage.base import Stat
from shardfs.view.namespace import ArrayView, Namespace, Node

#: Bytes between two chunks of a shard read over rather than starting a new read (at least).
GAP = 256 << 10


@dataclass
class _Hashed:
    """Files hashed by one task: their indexes, digests and sizes (as served)."""

    indexes: list[int] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


@dataclass
class _Shard:
    """The chunk files served from one shard (or plain chunk object), in arrays added per
    listing: their offsets and sizes in the shard and their file indexes."""

    key: str
    version: Hashable
    serve: Callable[[bytes], bytes] | None
    offsets: list[np.ndarray] = field(default_factory=list)
    nbytes: list[np.ndarray] = field(default_factory=list)
    indexes: list[np.ndarray] = field(default_factory=list)


@dataclass
class _Read:
    """One read of a shard: [start, end), and the chunks inside it."""

    shard: _Shard
    start: int
    end: int
    offsets: list[int]
    nbytes: list[int]
    indexes: list[int]


class _Files:
    """Every file of the view, found by walking its listings. Chunk files come in runs
    (see `Listing`), so they are added in bulk, with their extents in their shards."""

    def __init__(self, namespace: Namespace, progress: tqdm) -> None:
        self.ns = namespace
        self.paths: list[str] = []
        self.sizes: list[int] = []
        self.shards: dict[str, _Shard] = {}
        self.others: list[tuple[int, Node]] = []
        pending = [namespace.root()]
        while pending:
            directory = pending.pop()
            listing = namespace.listing(directory)
            listed = len(self.paths)
            for _, node, attr in listing.entries:
                if attr.is_dir:
                    pending.append(node)
                else:
                    self.others.append((len(self.paths), node))
                    self.paths.append(node.path)
                    self.sizes.append(attr.size)
            for run in listing.runs:
                first = len(self.paths)
                base = run.directory + "/" if run.directory else ""
                self.paths += [base + name for name in run.names()]
                self.sizes += run.sizes.tolist()
                indexes = np.arange(first, len(self.paths))
                for i, (key, stat) in enumerate(run.shards):
                    mine = run.shard == i
                    self._add(self._shard(run.array, key, stat), run.extents[mine], indexes[mine])
            progress.update(len(self.paths) - listed)

    def _shard(self, array: ArrayView, key: str, stat: Stat) -> _Shard:
        """The shard's record, made on first sight; its chunks must come from one version."""
        shard = self.shards.get(key)
        if shard is None:
            v2 = array.v2
            serve = None if v2 is None or v2.transform is Transform.RAW else v2.serve
            shard = self.shards[key] = _Shard(key, stat.version, serve)
        elif shard.version != stat.version:
            raise SourceChanged(f"{self.ns.storage.describe(key)} changed during the checksum")
        return shard

    @staticmethod
    def _add(shard: _Shard, extents: np.ndarray, indexes: np.ndarray) -> None:
        shard.offsets.append(extents[:, 0].astype(np.int64))
        shard.nbytes.append(extents[:, 1].astype(np.int64))
        shard.indexes.append(indexes)


def _reads(shard: _Shard, gap: int) -> Iterator[_Read]:
    """The shard's chunks in offset order, gathered into reads of up to PIECE bytes
    (a bigger chunk is a read of its own) over gaps of up to `gap` bytes."""
    offsets = np.concatenate(shard.offsets)
    order = np.argsort(offsets, kind="stable")
    nbytes = np.concatenate(shard.nbytes)[order].tolist()
    indexes = np.concatenate(shard.indexes)[order].tolist()
    offsets = offsets[order].tolist()
    first = 0
    start = end = offsets[0]
    for i, (offset, size) in enumerate(zip(offsets, nbytes, strict=True)):
        if i > first and (offset - end > gap or max(end, offset + size) - start > PIECE):
            yield _Read(shard, start, end, offsets[first:i], nbytes[first:i], indexes[first:i])
            first, start, end = i, offset, offset
        end = max(end, offset + size)
    yield _Read(shard, start, end, offsets[first:], nbytes[first:], indexes[first:])


def _hash_reads(ns: Namespace, paths: list[str], reads: list[_Read]) -> _Hashed:
    storage = ns.storage
    hashed = _Hashed()
    for read in reads:
        shard = read.shard
        hashed.indexes += read.indexes
        if read.end - read.start > PIECE and shard.serve is None:  # one big chunk: streamed
            hashed.digests.append(
                md5_range(storage, shard.key, read.start, read.end - read.start, shard.version)
            )
            hashed.sizes += read.nbytes
            continue
        data = memoryview(storage.read(shard.key, read.start, read.end - read.start, shard.version))
        pieces = [
            data[o - read.start : o - read.start + n]
            for o, n in zip(read.offsets, read.nbytes, strict=True)
        ]
        if shard.serve is not None:
            pieces = [
                _serve(ns, shard, piece, paths[i])
                for piece, i in zip(pieces, read.indexes, strict=True)
            ]
            hashed.sizes += [len(piece) for piece in pieces]
        else:
            hashed.sizes += read.nbytes
        hashed.digests += [hashlib.md5(piece).hexdigest() for piece in pieces]
    return hashed


def _serve(ns: Namespace, shard: _Shard, stored: memoryview, path: str) -> bytes:
    """The bytes the view serves for a stored chunk (a v2 chunk)."""
    assert shard.serve is not None
    try:
        return shard.serve(bytes(stored))
    except CorruptData as e:
        where = ns.storage.describe(shard.key)
        raise CorruptData(f"{path} (stored in {where}): {e}") from None


def _hash_files(ns: Namespace, files: list[tuple[int, Node]]) -> _Hashed:
    hashed = _Hashed()
    for index, node in files:
        with ns.open(node) as reader:
            hashed.indexes.append(index)
            hashed.digests.append(md5_reader(reader))
            hashed.sizes.append(reader.size)
    return hashed


def virtual_checksum(
    namespace: Namespace, progress: tqdm | None = None, workers: int | None = None
) -> ChecksumTree:
    """The tree of every view file's digest; `progress` counts the files listed, then the
    files (and bytes) hashed."""
    progress = quiet() if progress is None else progress
    files = _Files(namespace, progress)
    gap = max(GAP, namespace.storage.request_cost)
    reads = [read for shard in files.shards.values() for read in _reads(shard, gap)]
    tasks: list[Callable[[], _Hashed]] = [
        partial(_hash_files, namespace, batch)
        for batch in batches(files.others, lambda item: files.sizes[item[0]])
    ]
    tasks += [
        partial(_hash_reads, namespace, files.paths, group)
        for group in batches(reads, lambda read: read.end - read.start)
    ]
    digests = [""] * len(files.paths)
    sizes = files.sizes
    walked(progress, len(digests))
    done = 0
    for hashed in parallel(tasks, workers or default_workers(namespace.storage)):
        for index, digest, size in zip(hashed.indexes, hashed.digests, hashed.sizes, strict=True):
            digests[index] = digest
            sizes[index] = size
        done += sum(hashed.sizes)
        progress.set_postfix_str(format_size(done), refresh=False)
        progress.update(len(hashed.indexes))
    tree = ChecksumTree()
    for path, digest, size in zip(files.paths, digests, sizes, strict=True):
        tree.add(path, digest, size)
    return tree
