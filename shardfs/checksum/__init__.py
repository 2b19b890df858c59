"""DANDI zarr checksums of a source: of the tree as stored, and of the unsharded view.

`tree` is the algorithm (no I/O); `stored` and `virtual` walk a `Storage` or
a `Namespace` and hash what they find in parallel; `digests` keeps the md5
of chunk files that a mount exposes as the `user.md5` extended attribute.
"""

from shardfs.checksum.stored import stored_checksum
from shardfs.checksum.tree import EMPTY_CHECKSUM, ChecksumTree, Digest, DirectoryChecksum
from shardfs.checksum.virtual import virtual_checksum

__all__ = [
    "EMPTY_CHECKSUM",
    "ChecksumTree",
    "Digest",
    "DirectoryChecksum",
    "stored_checksum",
    "virtual_checksum",
]
