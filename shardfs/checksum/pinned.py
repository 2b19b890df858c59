"""The checksum of a pinned tree (`shardfs.formats.dandi_manifest`), from its ETags and
sizes alone: what a manifest's `zarrChecksum` must be, and what `shardfs manifest` writes."""

from __future__ import annotations

from shardfs.checksum.tree import Digest, Fold
from shardfs.formats.dandi_manifest import PinnedTree


def tree_checksum(tree: PinnedTree) -> Digest:
    """The DANDI zarr checksum of every object `tree` names. No I/O."""
    fold = Fold()
    table = tree.table
    sizes = table.sizes
    for path, directory in tree.files():
        fold.add_files(
            path,
            [
                (table.name(i).decode("utf-8", "surrogatepass"), table.etag(i), sizes[i])
                for i in range(directory.start, directory.end)
                if sizes[i] >= 0
            ],
        )
    return fold.finish()
