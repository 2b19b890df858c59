"""The checksum of a source as stored: every object, shards included.

Objects whose store keeps an ETag (S3) are taken from the listings alone,
as DANDI does; all others are read and hashed in parallel. The private
`.shardfs/` area of a local source is not part of it (the storage never
shows it).
"""

from __future__ import annotations

from shardfs.checksum.hashing import default_workers, hash_objects
from shardfs.checksum.tree import ChecksumTree
from shardfs.maintenance.progress import Progress
from shardfs.storage.base import Stat, Storage
from shardfs.view.hierarchy import join


def stored_objects(storage: Storage) -> list[tuple[str, Stat]]:
    """(key, stat) of every object below the root."""
    objects = []
    pending = [""]
    while pending:
        directory = pending.pop()
        for entry in storage.list(directory):
            key = join(directory, entry.name)
            if entry.stat.is_dir:
                pending.append(key)
            else:
                objects.append((key, entry.stat))
    return objects


def stored_checksum(
    storage: Storage, progress: Progress | None = None, workers: int | None = None
) -> ChecksumTree:
    """The tree of every stored object's digest; `progress` counts the objects read."""
    tree = ChecksumTree()
    unknown = []
    for key, stat in stored_objects(storage):
        etag = storage.etag(stat)
        if etag is None:
            unknown.append((key, stat))
        else:
            tree.add(key, etag, stat.size)
    if progress is not None and unknown:  # nothing to show where listings gave every digest
        progress.start(len(unknown), sum(stat.size for _, stat in unknown))
    for batch in hash_objects(storage, unknown, workers or default_workers(storage)):
        for key, digest, size in batch:
            tree.add(key, digest, size)
        if progress is not None:
            progress.advance(len(batch), sum(size for _, _, size in batch))
    return tree
