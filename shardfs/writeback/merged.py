"""The read side of a read-write mount: the source's view with the overlay on top.

Lookups, attributes and listings ask the overlay first (buffered files, deleted
chunks, directories made by `mkdir`) and then the source's view, so written data
is visible at once. `Workspace` adds the calls that change things.
"""

from __future__ import annotations

import time

import numpy as np

from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import NotFound
from shardfs.view.base import SourceView
from shardfs.view.hierarchy import join
from shardfs.view.namespace import Attr, Namespace, Node, Role
from shardfs.view.nodes import Listing
from shardfs.view.readahead import ReadAhead
from shardfs.writeback.classify import Classifier
from shardfs.writeback.overlay import Buffered, Overlay, Whiteout


class MergedView(SourceView):
    def __init__(self, namespace: Namespace) -> None:
        self.ns = namespace
        self.storage = namespace.storage
        self.overlay = Overlay()
        self.classifier = Classifier(namespace)

    def _root(self) -> Node:
        return self.classifier.current(Node("", Role.DIR))

    def caches(self) -> dict[str, LruCache | ReadAhead]:
        return self.ns.caches()

    def digest_source(self, node: Node) -> Namespace | None:
        """Chunks written through the mount and not yet committed have no stored bytes."""
        if node.role is not Role.CHUNK or self.overlay.entry(node.path) is not None:
            return None
        return self.ns

    def chunk_directory(self, path: str) -> None:
        return None  # chunk files may be renamed or written here: each found the long way

    def lookup(self, parent: Node, name: str) -> Node:
        with self.ns.presentation.snapshot():
            return self._lookup(parent, name)

    def _lookup(self, parent: Node, name: str) -> Node:
        parent = self.classifier.current(parent)
        path = join(parent.path, name)
        entry = self.overlay.entry(path)
        if isinstance(entry, Whiteout):
            raise NotFound(path)
        if isinstance(entry, Buffered):
            return self.classifier.classify(parent, name)[0]
        try:
            return self.ns.lookup(parent, name)
        except NotFound:
            if not self._virtual(path):
                raise
            return self._dir_in(parent, name)

    def entry(self, parent: Node, name: str) -> tuple[Node, Attr]:
        """`lookup` and `attr` in one step; in one step of the namespace for a file only
        the source holds (see `Namespace.entry`). Either sees one version of each
        metadata document on its way (see `Presentation.snapshot`)."""
        with self.ns.presentation.snapshot():
            current = self.classifier.current(parent)
            path = join(current.path, name)
            if self.overlay.entry(path) is None:
                try:
                    return self.ns.entry(current, name)
                except NotFound:
                    if not self._virtual(path):
                        raise
            node = self._lookup(parent, name)
            return node, self.attr(node)

    def attr(self, node: Node) -> Attr:
        entry = self.overlay.entry(node.path)
        if isinstance(entry, Buffered):
            return Attr(False, entry.blob.size, entry.blob.mtime_ns)
        if isinstance(entry, Whiteout):
            raise NotFound(node.path)
        node = self._fresh_leaf(node)
        try:
            return self.ns.attr(node)
        except NotFound:
            if not (node.is_dir and self._virtual(node.path)):
                raise
            return Attr(True, 0, self._dir_mtime(node.path))

    def listing(self, node: Node) -> Listing:
        """The source's listing with the overlay's files and whiteouts applied."""
        node = self.classifier.current(node)
        try:
            listing = self.ns.listing(node)
        except NotFound:
            if not self._virtual(node.path):
                raise
            listing = Listing([])
        names = self.overlay.names(node.path)
        if not names:
            return listing
        entries = [item for item in listing.entries if item[0] not in names]
        runs = [
            run.keep(np.array([name not in names for name in run.names()], dtype=bool))
            for run in listing.runs
        ]
        for name in names:
            if isinstance(self.overlay.entry(join(node.path, name)), Whiteout):
                continue
            try:
                child = self.lookup(node, name)
                entries.append((name, child, self.attr(child)))
            except NotFound:
                continue  # gone since the names were taken
        entries.sort(key=lambda item: item[0])
        return Listing(entries, [run for run in runs if len(run)])

    def _virtual(self, path: str) -> bool:
        """Whether `path` is a directory only the overlay holds (made by `mkdir`, or
        holding written files)."""
        return self.overlay.is_dir(path) or self.overlay.has_children(path)

    def _dir_mtime(self, path: str) -> int:
        return self.overlay.dir_mtime(path) if self.overlay.is_dir(path) else time.time_ns()

    def _dir_in(self, parent: Node, name: str) -> Node:
        """The node of a directory that exists only in the overlay."""
        if parent.role in (Role.ARRAY, Role.CHUNK_DIR):
            node = self.ns.shards.key_node(self.ns.refresh(parent), name)
            if node is not None and node.role is Role.CHUNK_DIR:
                return node
        return Node(join(parent.path, name), Role.DIR)

    def _fresh_leaf(self, node: Node) -> Node:
        """A file node classified again: a new `zarr.json` turns its directory into a node."""
        if node.role in (Role.FILE, Role.METADATA) and node.source is None:
            parent_path, _, name = node.path.rpartition("/")
            return self.ns.lookup(self.resolve(parent_path), name)
        return node

    def _exists(self, parent: Node, name: str) -> bool:
        try:
            self.lookup(parent, name)
        except NotFound:
            return False
        return True
