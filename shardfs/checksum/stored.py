"""The checksum of a source as stored: every object, shards included.

Objects whose store keeps an ETag (S3) are taken from the listings alone,
as DANDI does; all others are read and hashed in parallel. The walk is depth
first and its digests are folded directory by directory (`Fold`), so memory
holds the listings on the walk's path and the batches in flight, not the
tree. The private `.shardfs/` area of a local source is not part of it (the
storage never shows it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import NamedTuple

from tqdm import tqdm

from shardfs.checksum.hashing import (
    Block,
    batches,
    default_workers,
    fold,
    md5_range,
    piece_size,
)
from shardfs.checksum.tree import Digest, DirectoryChecksum
from shardfs.storage.base import Stat, Storage
from shardfs.view.hierarchy import join


class _Object(NamedTuple):
    """An object of the walk, with its digest where the listing gives it (an ETag). A
    tuple: the walk makes one per object, and a frozen dataclass costs nearly twice as much."""

    directory: str
    name: str
    stat: Stat
    etag: str | None


def _walk(storage: Storage) -> Iterator[_Object]:
    """Every object below the root, depth first: a directory's objects, then its
    subdirectories' (the stack holds the directories still to list)."""
    pending = [""]
    while pending:
        directory = pending.pop()
        for entry in storage.list(directory):
            if entry.stat.is_dir:
                pending.append(join(directory, entry.name))
            else:
                yield _Object(directory, entry.name, entry.stat, storage.etag(entry.stat))


def _weight(item: _Object) -> tuple[int, int]:
    """(files, bytes to read) of an object, to size batches."""
    return 1, 0 if item.etag is not None else item.stat.size


def _hash(storage: Storage, piece: int, batch: list[_Object]) -> list[Block]:
    """The (name, digest, size) of the objects of `batch`, by directory, in its order."""
    blocks: list[Block] = []
    for item in batch:
        stat = item.stat
        digest = item.etag
        if digest is None:
            key = join(item.directory, item.name)
            digest = md5_range(storage, key, 0, stat.size, stat.version, piece)
        if not blocks or blocks[-1][0] != item.directory:
            blocks.append((item.directory, []))
        blocks[-1][1].append((item.name, digest, stat.size))
    return blocks


def stored_checksum(
    storage: Storage,
    progress: tqdm | None = None,
    workers: int | None = None,
    on_directory: Callable[[DirectoryChecksum], None] | None = None,
) -> Digest:
    """The checksum of every stored object; `progress` counts the objects and bytes,
    `on_directory` gets each directory's checksum as it is made (see `Fold`)."""
    workers = workers or default_workers(storage)
    piece = piece_size(workers)
    tasks = (
        partial(_hash, storage, piece, batch) for batch in batches(_walk(storage), _weight, piece)
    )
    return fold(tasks, workers, progress, on_directory)
