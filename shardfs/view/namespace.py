"""The unsharded view of a source: which paths exist, what they are, where their bytes are.

Every path of the view is the same path in the source. Directories, groups,
unsharded arrays and other files pass through. In the directory of a sharded
array, the shards are replaced by one virtual file per non-empty inner chunk,
named by the array's own chunk key encoding, and `zarr.json` is rewritten to
describe the unsharded array (see `shardfs.formats.zarr_v3`).

The zarr v2 view (`View.V2`) shows every group and array as zarr v2 instead:
`.zgroup`/`.zarray`, `.zattrs` and a consolidated `.zmetadata` replace
`zarr.json`, and the chunks of every array, sharded or not, are named by v2
keys and served as v2 chunks (see `shardfs.formats.zarr_v2`).

Nothing is scanned up front: a path is classified when it is looked up. The
`Namespace` answers the view's calls by asking two objects: its `Presentation`
(`shardfs.view.presentation`: what each node is shown as, v3, v2 or unchanged, its
metadata and the documents rendered for it) and its `Shards`
(`shardfs.view.shards`: where each chunk is stored, from shard indexes read the
first time one of their chunks is needed). Their caches key on the version of
each object, so a source changed behind the mount's back is reread, never mixed
with old state.
"""

from __future__ import annotations

import functools
import logging

from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import (
    IsADirectory,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import Storage
from shardfs.view.base import Chunk, Reader, SourceView, entry_path, stored_file
from shardfs.view.hierarchy import Hierarchy, ZarrV3
from shardfs.view.leaves import DIRECTORIES_KEPT, ChunkDirectory
from shardfs.view.nodes import (
    ArrayView,
    Attr,
    ChunkRun,
    Extent,
    GroupView,
    Listing,
    Node,
    Role,
)
from shardfs.view.presentation import Covers, Presentation, View
from shardfs.view.readahead import ReadAhead
from shardfs.view.shards import Shards, listed

log = logging.getLogger("shardfs")


class Namespace(SourceView):
    """The view of one source. Thread-safe; every method may block on storage."""

    def __init__(
        self,
        storage: Storage,
        index_cache: int = 64 << 20,
        metadata_cache: int = 16 << 20,
        view: View = View.V3,
        hierarchy: Hierarchy | None = None,
        serve_plain: bool = False,
        read_cache: int = 64 << 20,
        listing_cache: int = 64 << 20,
        document_cache: int = 16 << 20,
        shard_mtimes: bool = False,
        covers: Covers | None = None,
    ) -> None:
        self.storage = storage
        #: What the view shows (v3 or v2) of which source layout: the mount's choice, as
        #: `presentation` applies it.
        self.view = view
        self.tree = hierarchy or ZarrV3(storage)
        #: A directory of chunk files is as new as the newest shard behind it, not only
        #: as its source directory: a kernel that caches listings keeps them while the
        #: directory's mtime stays the same, and an append changes no directory's.
        self.shard_mtimes = shard_mtimes
        self.presentation = Presentation(
            storage,
            self.tree,
            view,
            serve_plain,
            metadata_cache,
            document_cache,
            index_cache,
            covers,
        )
        self.shards = Shards(storage, index_cache, listing_cache)
        #: Chunks fetched ahead of their reads (only on stores with costly requests).
        self.read_ahead = ReadAhead(storage, read_cache)
        #: By path, the directories chunk files were found in, prepared for lookups
        self._leaves: dict[str, ChunkDirectory] = {}

    def digest_source(self, node: Node) -> Namespace | None:
        return self if node.role is Role.CHUNK else None

    def caches(self) -> dict[str, LruCache | ReadAhead]:
        return {
            "shard indexes": self.shards.indexes,
            "listings": self.shards.listings,
            "metadata": self.presentation.nodes,
            "documents": self.presentation.documents,
            "read-ahead": self.read_ahead,
        }

    # -- classification ---------------------------------------------------

    def _root(self) -> Node:
        return self.presentation.dir_node("")

    def lookup(self, parent: Node, name: str) -> Node:
        with self.presentation.snapshot():
            node = self._lookup(parent, name)
            if node.role is Role.CHUNK:
                self.shards.locate(node.array, node.coords)  # it exists only if its index has it
            return node

    def entry(self, parent: Node, name: str) -> tuple[Node, Attr]:
        """`lookup` and `attr` in one step. A chunk's attributes come from the index that
        finds it: one stat of its metadata and of its shard, not two."""
        leaf = self._leaves.get(parent.path)
        found = leaf.entry(name) if leaf is not None else None
        if found is not None:
            array, coords, _, attr, seen = found
            self.storage.noted(seen)
            return Node(entry_path(parent, name), Role.CHUNK, array, coords), attr
        with self.presentation.snapshot():
            node = self._lookup(parent, name)
            if node.role is not Role.CHUNK:
                return node, self.attr(node)
            attr = self._chunk_attr(node.array, node.coords)
        self._learn(parent.path, node.array, node.path)
        return node, attr

    def chunk_directory(self, path: str) -> ChunkDirectory | None:
        return self._leaves.get(path)

    def cached_chunk(self, extent: Extent) -> bytes | None:
        if not self.read_ahead.enabled:
            return None
        return self.read_ahead.hit(extent.key, extent.stat.version, extent.offset, extent.length)

    def _learn(self, directory: str, array: ArrayView, chunk: str) -> None:
        """Prepare `directory`, where `chunk` of `array` was just found, for the lookups of
        its other chunk files (see `shardfs.view.leaves`), if its array's document has
        a key of its own."""
        if array.source is None or array.source != self.tree.document_key(array.key):
            return
        if len(self._leaves) >= DIRECTORIES_KEPT:
            self._leaves.clear()
        parts = chunk[len(array.key) :].lstrip("/").rpartition("/")[0]
        self._leaves[directory] = ChunkDirectory(
            self.storage.version, self.shards, array, array.source, array.metadata,
            f"{parts}/" if parts else "",
        )  # fmt: skip

    def _lookup(self, parent: Node, name: str) -> Node:
        """The node `name` in `parent` names, with fresh metadata; a chunk not yet located."""
        path = entry_path(parent, name)
        if parent.role is Role.DIR:
            return self.presentation.source_node(path)
        meta = self.presentation.fresh(parent.meta)
        if parent.role is Role.GROUP:
            assert isinstance(meta, GroupView)
            return self.presentation.group_member(meta, name)
        assert isinstance(meta, ArrayView)
        if parent.role is Role.ARRAY:
            member = self.presentation.array_member(meta, name)
            if member is not None:
                return member
        node = self.shards.key_node(Node(parent.path, parent.role, meta, parent.coords), name)
        if node is None:
            raise NotFound(path)
        if node.role is Role.CHUNK_DIR and not self.shards.has_directory(meta, node.coords):
            raise NotFound(path)
        return node

    def refresh(self, node: Node) -> Node:
        """The node for the same path now, raising NotFound if it is gone."""
        if node.meta is None:
            return node
        current = self.presentation.fresh(node.meta)
        return node if current is node.meta else Node(node.path, node.role, current, node.coords)

    # -- attributes and listings ----------------------------------------------

    def attr(self, node: Node) -> Attr:
        if node.role in (Role.GROUP, Role.ARRAY) and not self.presentation.passthrough:
            meta = self.presentation.fresh(node.meta)
            return Attr(True, 0, meta.metadata.mtime_ns, None, self.presentation.dir_access(meta))
        if node.is_dir or node.role is Role.FILE:
            key = self._backing_key(node)
            stat = self.storage.stat(key)
            if stat is None or stat.is_dir != node.is_dir:
                raise NotFound(node.path)
            mtime_ns = stat.mtime_ns
            if self.shard_mtimes and self.shards.holds_shards(node):
                entries = listed(self.storage, key)
                mtime_ns = max([mtime_ns, *(e.stat.mtime_ns for e in entries)])
            return Attr(node.is_dir, stat.size, mtime_ns, None, stat.access)
        meta = self.presentation.fresh(node.meta)
        if node.role is Role.METADATA:
            size, mtime_ns = self.presentation.document_size(meta, node.name)
            return Attr(False, size, mtime_ns, None, meta.metadata.access)
        assert isinstance(meta, ArrayView)
        return self._chunk_attr(meta, node.coords)

    def _chunk_attr(self, array: ArrayView, coords: tuple[int, ...]) -> Attr:
        key, table, offset, nbytes = self.shards.locate(array, coords)
        return Attr.of_chunk(array, key, table.stat, offset, nbytes)

    def _backing_key(self, node: Node) -> str:
        """The source key whose stat stands for a directory or passthrough node."""
        if node.source is not None:
            return node.source
        if node.role is not Role.CHUNK_DIR:
            return node.path
        return self.shards.directory(node.array, node.coords)

    def listdir(self, node: Node) -> list[tuple[str, Node, Attr]]:
        """The entries of a directory node with a node each, sorted by name."""
        return sorted(self.listing(node).items(), key=lambda item: item[0])

    def listing(self, node: Node) -> Listing:
        """The entries of a directory node; chunk files in bulk (see `Listing`)."""
        if not node.is_dir:
            raise NotADirectory(node.path)
        if node.role is Role.DIR:
            entries = [
                self.presentation.source_entry(node.path, entry)
                for entry in self.storage.list(node.path)
            ]
            runs: list[ChunkRun] = []
        elif node.role is Role.GROUP:
            group = self.presentation.fresh(node.meta)
            entries, runs = self.presentation.group_entries(group), []
        elif node.role is Role.ARRAY:
            entries, runs = self._list_array(self.presentation.fresh_array(node))
        else:
            entries, runs = self.shards.chunk_dir_entries(
                self.presentation.fresh_array(node), node.coords
            )
        entries.sort(key=lambda item: item[0])
        return Listing(entries, runs)

    def _list_array(self, array: ArrayView) -> tuple[list[tuple[str, Node, Attr]], list[ChunkRun]]:
        data = listed(self.storage, array.data)
        chunks, runs = self.shards.array_entries(array, data)
        return self.presentation.array_entries(array, data) + chunks, runs

    # -- data -------------------------------------------------------------------

    def open(self, node: Node) -> Reader:
        if node.is_dir:
            raise IsADirectory(node.path)
        if node.role is Role.FILE:
            key = self._backing_key(node)
            stat = self.storage.stat(key)
            if stat is None or stat.is_dir:
                raise NotFound(node.path)
            return stored_file(self.storage, key, node.path, stat)
        if node.role is Role.METADATA:
            return self._open_document(node)
        array = self.presentation.fresh(node.meta)
        assert isinstance(array, ArrayView)
        for _ in attempts():
            key, table, offset, nbytes = self.shards.locate(array, node.coords)
            try:
                pin = self.storage.pin(key, table.stat)
            except SourceChanged:
                continue  # replaced since its index was read: locate it again
            shard = array.layout.shard_of(node.coords)[0]
            chunk = Chunk(
                self.read_ahead,
                table,
                functools.partial(self.shards.next_shard, array, shard),
                None if self.storage.answering_as_of() else functools.partial(self.open, node),
            )
            v2 = array.v2
            serve = v2.serve if v2 is not None and not array.served_as_stored else None
            size = nbytes if serve is None else array.served_size(nbytes)
            return Reader(
                self.storage,
                node.path,
                table.stat,
                pin,
                offset,
                nbytes,
                size,
                decode=serve,
                chunk=chunk,
            )
        raise StorageError(f"{node.path} keeps changing while it is opened")

    def _open_document(self, node: Node) -> Reader:
        """A metadata document the view writes, rendered as the current version of its
        stored document shows it (whole: it is held by the open file)."""
        for _ in attempts():
            meta = self.presentation.fresh(node.meta)
            try:
                data, _ = self.presentation.document(meta, node.name)
            except SourceChanged:
                continue  # replaced since it was looked up: render the new one
            return Reader(self.storage, node.path, meta.metadata, None, data=data)
        raise StorageError(f"{node.path} keeps changing while it is opened")
