"""The md5 of chunk files of the view, behind the `user.md5` extended attribute of a mount.

Listing tools (DANDI's checksum among them) can take a chunk's digest from
the attribute instead of reading its bytes. A digest is computed on the
first request, from exactly the bytes the view serves, and kept in one
bounded cache keyed by where those bytes come from: the shard, its version,
the chunk's extent, and the array's metadata version. A changed shard or
array is therefore hashed again, never answered from old state.
"""

from __future__ import annotations

from shardfs.checksum.hashing import md5_reader
from shardfs.primitives.cache import LruCache
from shardfs.view.interface import DigestSource
from shardfs.view.nodes import Node, Role

#: The budget of the digest cache, in bytes (about 64k digests).
BUDGET = 16 << 20
#: What one cached digest costs: its key, the hex string and the cache's bookkeeping.
DIGEST_COST = 256


class ChunkDigests:
    """md5 hex digests of the view's chunk files, cached. Thread-safe."""

    def __init__(self, namespace: DigestSource, budget: int = BUDGET) -> None:
        self.ns = namespace
        self.cache: LruCache[str] = LruCache(budget, lambda _: DIGEST_COST)

    def md5(self, node: Node) -> str | None:
        """The digest of a chunk file (None for other nodes: they have no such attribute)."""
        if node.role is not Role.CHUNK:
            return None
        node = self.ns.refresh(node)
        array = node.array
        key, table, offset, nbytes = self.ns.shards.locate(array, node.coords)
        where = (key, table.stat.version, offset, nbytes, array.metadata.version)
        return self.cache.get(where, lambda: self._md5(node))

    def _md5(self, node: Node) -> str:
        with self.ns.open(node) as reader:
            return md5_reader(reader)
