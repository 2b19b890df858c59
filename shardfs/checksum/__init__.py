"""DANDI zarr checksums of a source: of the tree as stored, and of the unsharded view.

`tree` is the algorithm (no I/O), folded directory by directory; `stored`
and `virtual` walk a `Storage` or a `Namespace` depth first and hash what
they find in parallel, in bounded memory; `digests` keeps the md5 of chunk
files that a mount exposes as the `user.md5` extended attribute.
"""

from shardfs.checksum.stored import stored_checksum
from shardfs.checksum.tree import EMPTY_CHECKSUM, Digest, DirectoryChecksum, Fold
from shardfs.checksum.virtual import virtual_checksum

__all__ = [
    "EMPTY_CHECKSUM",
    "Digest",
    "DirectoryChecksum",
    "Fold",
    "stored_checksum",
    "virtual_checksum",
]
