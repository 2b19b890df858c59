"""The checksum of a source as stored: every object, shards included.

Objects whose store keeps an ETag (S3) are taken from the listings alone,
as DANDI does; all others are read and hashed in parallel. The private
`.shardfs/` area of a local source is not part of it (the storage never
shows it).
"""

from __future__ import annotations

from tqdm import tqdm

from shardfs.checksum.hashing import default_workers, hash_objects
from shardfs.checksum.tree import ChecksumTree
from shardfs.maintenance.progress import quiet, walked
from shardfs.maintenance.report import format_size
from shardfs.storage.base import Stat, Storage
from shardfs.view.hierarchy import join


def stored_objects(storage: Storage, progress: tqdm) -> list[tuple[str, Stat]]:
    """(key, stat) of every object below the root; `progress` counts them."""
    objects = []
    pending = [""]
    while pending:
        directory = pending.pop()
        listed = len(objects)
        for entry in storage.list(directory):
            key = join(directory, entry.name)
            if entry.stat.is_dir:
                pending.append(key)
            else:
                objects.append((key, entry.stat))
        progress.update(len(objects) - listed)
    return objects


def stored_checksum(
    storage: Storage, progress: tqdm | None = None, workers: int | None = None
) -> ChecksumTree:
    """The tree of every stored object's digest; `progress` counts the objects listed, then
    those read (none where the listings give every digest)."""
    progress = quiet() if progress is None else progress
    tree = ChecksumTree()
    unknown = []
    for key, stat in stored_objects(storage, progress):
        etag = storage.etag(stat)
        if etag is None:
            unknown.append((key, stat))
        else:
            tree.add(key, etag, stat.size)
    walked(progress, len(unknown))
    done = 0
    for batch in hash_objects(storage, unknown, workers or default_workers(storage)):
        for key, digest, size in batch:
            tree.add(key, digest, size)
        done += sum(size for _, _, size in batch)
        progress.set_postfix_str(format_size(done), refresh=False)
        progress.update(len(batch))
    return tree
