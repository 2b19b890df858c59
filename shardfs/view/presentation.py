"""How a Zarr view presents each node of its source: as Zarr v3 with sharded arrays
unsharded, as zarr v2 (`View.V2`), or unchanged (passed through), and the metadata
documents it renders for it.

Every decision that depends on the view (v3 or v2) or on the source layout (a
hierarchy whose directories pass through, or one translated node by node) is
taken here; `Namespace` asks, and `Shards` never needs to know.

Parsed metadata lives in one bounded LRU cache (`nodes`): per node, only what
lookups need (its layout, chunk naming, v2 transform and the sizes of its
documents), so that what a chunk costs does not grow with the node's attributes.
The documents the view renders (`zarr.json`, `.zarray`, `.zattrs`, `.zmetadata`)
have a cache of their own (`documents`) and are rendered again, from the same
version of the stored document, when they do not fit. Both key on the version of
the stored document, so a node changed behind the mount's back is reread, never
mixed with old state.

A group's `.zmetadata` is made from the documents of every node below it, but shown
with the owner and mode of the group's own, to every user alike: so where other users
read through the mount (`allow_other`), it holds only the nodes that every user that
mode lets read could find and read as the mount shows them (`Presentation.covers`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from enum import Enum

from shardfs.formats import ome
from shardfs.formats.zarr_v2 import (
    ZARRAY,
    ZATTRS,
    ZGROUP,
    ZMETADATA,
    Untranslatable,
    consolidated,
    render,
    v2_array,
    zattrs,
)
from shardfs.formats.zarr_v3 import (
    Unshardable,
    level_slots,
    plain_layout,
    sharded_layout,
    size_with_attributes,
    with_attributes,
)
from shardfs.formats.zarr_v3 import render as render_v3
from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import InvalidMetadata, NotFound, SourceChanged, StorageError
from shardfs.primitives.retry import attempts
from shardfs.storage.base import READ, SEARCH, Access, Entry, Need, Storage
from shardfs.view.hierarchy import METADATA, Hierarchy, NodeDoc, join
from shardfs.view.nodes import ArrayView, Attr, GroupView, Node, NodeView, Role
from shardfs.view.shards import table_cost

log = logging.getLogger("shardfs")


#: Whether every user who may read a file shown from an access may also do, as the mount
#: shows them, what each need asks (`shardfs.fuse.owners.Owners.covers`).
Covers = Callable[[Access | None, list[Need]], bool]


class View(Enum):
    V3 = "v3"  #: Zarr v3, sharded arrays unsharded
    V2 = "v2"  #: zarr v2, for readers that know only v2


#: Stored metadata documents up to this size are rendered into the view's documents as
#: soon as they are parsed, so that they are read once per version; bigger ones only
#: when a metadata file is stat'ed, listed or read (see `Presentation._load_meta`).
EAGER_RENDER = 1 << 20


class Presentation:
    """What the view shows of each node of one source. Thread-safe; every method may
    block on storage."""

    def __init__(
        self,
        storage: Storage,
        tree: Hierarchy,
        view: View,
        serve_plain: bool,
        metadata_cache: int,
        document_cache: int,
        index_cache: int,
        covers: Covers | None = None,
    ) -> None:
        self.storage = storage
        self.tree = tree
        self.view = view
        #: What decides the nodes a `.zmetadata` may hold (see the module's docstring);
        #: None where no other user reads through the mount: then it holds them all.
        self.covers = covers
        #: Serve unsharded arrays' chunks through the view too (a writable view routes
        #: writes by array), rather than passing them through.
        self.serve_plain = serve_plain
        #: Parsed metadata, by the version of each node's stored document: its view, what
        #: lookups need (layout, chunk naming, v2 transform: a few KB whatever its
        #: attributes), and apart the sizes of the documents the view shows for it, what
        #: stats and listings need (see `_load_meta`, `_sizes`).
        self.nodes: LruCache[NodeView | dict[str, int] | int | None] = LruCache(
            metadata_cache, _metadata_cost
        )
        #: The documents the view renders (`zarr.json`, `.zarray`, `.zattrs`, `.zmetadata`),
        #: needed only to read them. One bigger than the budget is rendered again from
        #: the stored document for each open of it (see `_rendered`).
        self.documents: LruCache[dict[str, bytes] | bytes] = LruCache(
            document_cache, lambda d: (len(d) if isinstance(d, bytes) else _size(d)) + 256
        )
        #: The budget of decoded shard indexes (`Shards.indexes`): an array one of whose
        #: shard indexes would not fit is shown unchanged (see `_array_view`).
        self.index_cache = index_cache
        self._snapshots = threading.local()

    @property
    def passthrough(self) -> bool:
        """Whether the source's own files and directories beside a node's document are
        shown (a hierarchy that keeps each node in its directory), rather than only
        the nodes below a group (a translated one)."""
        return self.tree.passthrough

    def names(self, meta: NodeView) -> tuple[str, ...]:
        """The metadata documents the view shows in the directory of `meta`."""
        if isinstance(meta, GroupView) and self.view is View.V2:
            return (*meta.docs, ZMETADATA)
        return meta.docs

    def snapshot(self) -> _Snapshot:
        """Within this block (on this thread), each metadata document is stat'ed once and
        its view looked up once: a lookup or a stat sees one version of every node on its
        path, and does not ask the source (or the metadata cache) again at each step. For
        calls that change nothing: one that stores a document must not see the version
        from before it. Nested blocks share the outer one's snapshot."""
        return _Snapshot(self._snapshots)

    def _find(self, key: str) -> NodeDoc | None:
        docs: dict[str, NodeDoc | None] | None = getattr(self._snapshots, "docs", None)
        if docs is None:
            return self.tree.find(key)
        if key not in docs:
            docs[key] = self.tree.find(key)
        return docs[key]

    def meta_at(self, key: str) -> NodeView | None:
        """The array or group at view directory `key` whose view differs from the source."""
        views: dict[str, NodeView | None] | None = getattr(self._snapshots, "views", None)
        if views is not None and key in views:
            return views[key]
        doc = self._find(key)
        view = None
        if doc is not None:
            found = self.nodes.get((key, doc.version), lambda: self._load_meta(key, doc))
            assert found is None or isinstance(found, ArrayView | GroupView)
            view = found
        if views is not None:
            views[key] = view
        return view

    def _load_meta(self, key: str, doc: NodeDoc) -> NodeView | None:
        """The view of version `doc` of the node at `key`, or None if it is shown unchanged.

        The document is read and parsed here, once per version. What is kept
        is what lookups need: the layout, chunk naming and v2 transform, however
        big the attributes. The documents the view shows for it are rendered
        now if the stored document is small (so that it is read once); a bigger
        one only when they are stat'ed, listed or read (see `_sizes`,
        `_rendered`), never for a chunk.
        """
        name = self.storage.describe(doc.key if doc.key is not None else key)
        try:
            raw = self.tree.read(doc)
            meta, span = self.tree.parse_spans(raw)
            view: NodeView | None
            if meta["node_type"] == "group":
                view = self._group_view(key, doc, meta)
            else:
                view = self._array_view(key, doc, meta, span)
            if view is None:
                return None
            docs = None
            if raw is None or len(raw) <= EAGER_RENDER:
                docs = self._render(view, raw, meta)
        except (InvalidMetadata, Unshardable, Untranslatable) as e:
            log.warning("%s: shown unchanged: %s", name, e)
            return None
        if view.cost > self.nodes.budget:
            log.warning(
                "%s: shown unchanged: its view takes %d bytes, more than the %d of metadata_cache",
                name,
                view.cost,
                self.nodes.budget,
            )
            return None
        if docs is not None:
            self.nodes.put((key, view.version, "sizes"), {n: len(d) for n, d in docs.items()})
            self.documents.put((key, view.version), docs)
        return view

    def _group_view(self, key: str, doc: NodeDoc, meta: dict) -> GroupView | None:
        if self.view is View.V2:
            shown_ome = ome.is_v05(meta.get("attributes"))
            return GroupView(key, doc.stat, (ZGROUP, ZATTRS), doc.key, shown_ome)
        if self.tree.translates:
            return GroupView(key, doc.stat, (METADATA,), doc.key)
        return None

    def _array_view(
        self, key: str, doc: NodeDoc, meta: dict, span: tuple[int, int] | None
    ) -> ArrayView | None:
        bare = _without_attributes(meta)
        layout = sharded_layout(bare)
        if (
            layout is None
            and self.view is View.V3
            and not (self.tree.translates or self.serve_plain)
        ):
            return None  # a plain v3 array: it passes through
        v2 = None
        if self.view is View.V2:
            v2 = v2_array(json.loads(layout.view_metadata) if layout is not None else bare)
            if not v2.keys.nested and self._in_ome(key):
                log.warning(
                    "%s: shown with the '.' dimension separator it is stored with: "
                    "OME-Zarr 0.4 readers need '/'",
                    self.storage.describe(doc.key if doc.key is not None else key),
                )
        if layout is None:
            layout = plain_layout(bare, render_v3(bare))
        names = layout.keys if v2 is None else v2.keys
        docs = (METADATA,) if v2 is None else (ZARRAY, ZATTRS)
        stored = replace(layout, keys=self.tree.chunk_keys(layout.keys))
        data = self.tree.data_dir(key)
        slots = level_slots(stored, self.nodes.budget)  # bounded before it is built
        if stored.levels and table_cost(stored) > self.index_cache:  # before one is read
            raise Unshardable(
                f"the index of one of its shards takes {table_cost(stored)} bytes decoded "
                f"(32 per inner chunk), more than the {self.index_cache} of index_cache"
            )
        # A sharded array's zarr.json in the v3 view holds the stored attributes as they are.
        spliced = span if v2 is None and stored.levels else None
        return ArrayView(key, data, stored, doc.stat, names, docs, v2, slots, doc.key, spliced)

    def _in_ome(self, key: str) -> bool:
        """Whether the array at `key` lies in an OME-Zarr 0.5 hierarchy (a group above it
        holds OME metadata)."""
        while key:
            key = key.rpartition("/")[0]
            group = self.meta_at(key)
            if isinstance(group, GroupView) and group.ome:
                return True
        return False

    def _render(self, view: NodeView, raw: bytes | None, meta: dict | None) -> dict[str, bytes]:
        """The documents the view shows for `view`, from its stored document `raw`, parsed
        as `meta` (parsed here if None and needed)."""
        if (
            isinstance(view, ArrayView)
            and view.v2 is None
            and not view.layout.levels
            and raw is not None
            and not self.tree.translates
        ):
            return {METADATA: raw}  # a plain array served by the view: its document as stored
        if isinstance(view, ArrayView) and view.attributes is not None and raw is not None:
            return {METADATA: with_attributes(view.layout.view_metadata, raw, view.attributes)}
        if meta is None:
            meta = self.tree.parse(raw)
        if isinstance(view, GroupView):
            if self.view is View.V2:
                return {ZGROUP: render({"zarr_format": 2}), ZATTRS: self._zattrs(view, meta)}
            return {METADATA: render_v3(meta)}
        if view.v2 is not None:
            return {ZARRAY: render(view.v2.zarray), ZATTRS: self._zattrs(view, meta)}
        if not view.layout.levels:
            return {METADATA: render_v3(meta)}
        shown = json.loads(view.layout.view_metadata)  # the layout's, without attributes
        if "attributes" in meta:
            shown["attributes"] = meta["attributes"]
        return {METADATA: render_v3(shown)}

    def _zattrs(self, view: NodeView, meta: dict) -> bytes:
        """`.zattrs` of a node; one log line (per version rendered) names what of its
        OME-Zarr 0.5 metadata the 0.4 form cannot show."""
        attrs, dropped = zattrs(meta)
        if dropped:
            name = self.storage.describe(view.source if view.source is not None else view.key)
            log.warning("%s: OME-Zarr 0.4 form leaves out %s", name, "; ".join(dropped))
        return render(attrs)

    def _rendered(self, view: NodeView) -> dict[str, bytes]:
        """The documents the view shows for `view`: cached, or rendered again from the
        version of the stored document `view` was made from (SourceChanged if it is
        gone)."""
        docs = self.documents.get((view.key, view.version), lambda: self._rerender(view))
        assert isinstance(docs, dict)
        return docs

    def _rerender(self, view: NodeView) -> dict[str, bytes]:
        raw = self.tree.read(NodeDoc(view.source, view.metadata))
        return self._render(view, raw, None)

    def _sizes(self, view: NodeView) -> dict[str, int]:
        """The sizes of the documents the view shows for `view` (rendered to learn them,
        once per version: see `_load_meta`, unless the stored attributes are spliced in
        as they are); SourceChanged as `_rendered`."""
        if isinstance(view, ArrayView) and view.attributes is not None:
            return {METADATA: size_with_attributes(view.layout.view_metadata, view.attributes)}
        sizes = self.nodes.get(
            (view.key, view.version, "sizes"),
            lambda: {name: len(data) for name, data in self._rendered(view).items()},
        )
        assert isinstance(sizes, dict)
        return sizes

    def array_at(self, key: str) -> ArrayView | None:
        """The array the view serves at directory `key`, if there is one."""
        meta = self.meta_at(key)
        return meta if isinstance(meta, ArrayView) else None

    def fresh(self, meta: NodeView | None) -> NodeView:
        """`meta` as it is now: the metadata may have changed since the node was made."""
        assert meta is not None
        current = self.meta_at(meta.key)
        if type(current) is not type(meta):
            raise NotFound(meta.key)
        assert current is not None
        return current

    def fresh_array(self, node: Node) -> ArrayView:
        current = self.fresh(node.meta)
        assert isinstance(current, ArrayView)
        return current

    def _child_node(self, group: NodeView, name: str) -> Node:
        """A child of a group of a translated hierarchy: a node, or the stored document
        of a child that has no translation (shown unchanged, under its own name)."""
        path = join(group.key, name)
        for suffix in (".array.json", ".group.json"):
            child = join(group.key, name.removesuffix(suffix))
            if child != path:
                doc = self.tree.find(child)
                key = doc.key if doc is not None else None
                if key is not None and key.endswith("/" + name) and self.meta_at(child) is None:
                    return Node(path, Role.FILE, source=key)
                raise NotFound(path)
        node = self.dir_node(path)
        if node.meta is None:
            raise NotFound(path)
        return node

    def _children(self, group: NodeView) -> list[tuple[str, Node, Attr]]:
        """The entries below a group of a translated hierarchy (see `_child_node`)."""
        listing = []
        for name in self.tree.children(group.key):
            path = join(group.key, name)
            meta = self.meta_at(path)
            if meta is not None:
                node = self._node_of(path, meta)
                access = self.dir_access(meta)
                listing.append((name, node, Attr(True, 0, meta.metadata.mtime_ns, None, access)))
                continue
            doc = self.tree.find(path)
            if doc is not None and doc.key is not None:
                shown = doc.key.rpartition("/")[2]
                node = Node(join(group.key, shown), Role.FILE, source=doc.key)
                listing.append((shown, node, Attr.of(doc.stat)))
        return listing

    def dir_access(self, meta: NodeView) -> Access | None:
        """The mode and owner of the directory of a node of a translated hierarchy, which
        is not stored: its nearest stored directory's, the one its document is in (an
        implicit group's is its directory)."""
        if meta.metadata.is_dir:
            return meta.metadata.access
        stat = self.storage.stat((meta.source or METADATA).rpartition("/")[0])
        return stat.access if stat is not None and stat.is_dir else None

    def dir_node(self, key: str) -> Node:
        """The node of source directory `key` as it is now: a plain directory, group or array."""
        return self._node_of(key, self.meta_at(key))

    @staticmethod
    def _node_of(key: str, meta: NodeView | None) -> Node:
        if isinstance(meta, ArrayView):
            return Node(key, Role.ARRAY, meta)
        if isinstance(meta, GroupView):
            return Node(key, Role.GROUP, meta)
        return Node(key, Role.DIR)

    def document(self, meta: NodeView, name: str) -> tuple[bytes, int]:
        """(content, mtime) of a metadata document the view writes; SourceChanged if the
        stored document changed since `meta` was made."""
        if name == ZMETADATA:
            assert isinstance(meta, GroupView)
            data, mtime_ns = self._consolidate(meta)
            assert isinstance(data, bytes)
            return data, mtime_ns
        return self._rendered(meta)[name], meta.metadata.mtime_ns

    def document_size(self, meta: NodeView, name: str) -> tuple[int, int]:
        """(size, mtime) of a metadata document the view writes, as the current version
        of its stored document shows it (rendered only if its size is not known yet)."""
        if name == ZMETADATA:
            assert isinstance(meta, GroupView)
            size, mtime_ns = self._consolidate(meta, content=False)
            assert isinstance(size, int)
            return size, mtime_ns
        for _ in attempts():
            try:
                return self._sizes(meta)[name], meta.metadata.mtime_ns
            except SourceChanged:  # replaced since it was looked up: the new one's size
                meta = self.fresh(meta)
        raise StorageError(f"{join(meta.key, name)} keeps changing while it is rendered")

    def _consolidate(self, group: GroupView, content: bool = True) -> tuple[bytes | int, int]:
        """The group's `.zmetadata` (or only its size): the v2 documents of every node
        below it, and the latest of their mtimes.

        Only groups are descended into, so the cost is one listing per group
        of the subtree, whatever the number of chunks. The document, and apart
        its size, is cached under the versions of all their stored documents.
        """
        for _ in attempts():
            key, members, mtime_ns = self._consolidation(group)
            try:
                if content:
                    return self._consolidated(key, members), mtime_ns
                size = self.nodes.get(
                    (*key, "size"),
                    lambda k=key, m=members: len(self._consolidated(k, m)),  # type: ignore[misc]
                )
                assert isinstance(size, int)
                return size, mtime_ns
            except SourceChanged:  # a node changed while it was walked: walk it again
                current = self.fresh(group)
                assert isinstance(current, GroupView)
                group = current
        raise StorageError(f"{group.key}: its nodes keep changing while they are consolidated")

    def _consolidation(
        self, group: GroupView
    ) -> tuple[tuple[str, str, bytes], list[tuple[str, NodeView]], int]:
        """What the group's `.zmetadata` is made of: its cache key (the versions of every
        node's stored document), the nodes by relative prefix, and its mtime. A node
        left out (`_shown_in`) is left out with what is below it."""
        members: list[tuple[str, NodeView]] = []
        pending: list[tuple[str, NodeView]] = [("", group)]
        while pending:
            prefix, meta = pending.pop()
            members.append((prefix, meta))
            if isinstance(meta, GroupView) and self._listable(group, meta):
                for name in self.tree.children(meta.key):
                    child = self.meta_at(join(meta.key, name))
                    if child is not None and self._shown_in(group, meta, child):
                        pending.append((f"{prefix}{name}/", child))
        versions = repr([(prefix, meta.version) for prefix, meta in members])
        digest = hashlib.sha256(versions.encode()).digest()
        mtime_ns = max(meta.metadata.mtime_ns for _, meta in members)
        return (ZMETADATA, group.key, digest), members, mtime_ns

    def _listable(self, group: GroupView, parent: GroupView) -> bool:
        """Whether every user who may read `group`'s `.zmetadata` may list and search the
        directory that names the children of `parent` (a group in it): else it names none."""
        if self.covers is None:
            return True
        stat = self.storage.stat(self.tree.listed(parent.key))
        if stat is None or not stat.is_dir:
            return False  # nothing to list (a draft group with no children), or gone
        return self.covers(group.metadata.access, [(True, stat.access, READ | SEARCH)])

    def _shown_in(self, group: GroupView, parent: GroupView, child: NodeView) -> bool:
        """Whether every user who may read `group`'s `.zmetadata` may read the stored
        document of `child` (a child of `parent`, in it) and search every directory from
        the one listed to find it down to that document."""
        if self.covers is None:
            return True
        if child.source is None:  # an implicit group of a draft source: its directory
            return self.covers(group.metadata.access, [(True, child.metadata.access, SEARCH)])
        needs: list[Need] = [(False, child.metadata.access, READ)]
        for directory in _directories_to(self.tree.listed(parent.key), child.source):
            stat = self.storage.stat(directory)
            if stat is None or not stat.is_dir:
                return False  # changed meanwhile: left out this time
            needs.append((True, stat.access, SEARCH))
        return self.covers(group.metadata.access, needs)

    def _consolidated(
        self, key: tuple[str, str, bytes], members: list[tuple[str, NodeView]]
    ) -> bytes:
        def make() -> bytes:
            documents: dict[str, dict] = {}
            for prefix, meta in members:
                for name, data in self._rendered(meta).items():
                    documents[prefix + name] = json.loads(data)
            return render(consolidated(documents))

        data = self.documents.get(key, make)
        assert isinstance(data, bytes)
        return data

    def _documents(self, meta: NodeView) -> list[tuple[str, Node, Attr]]:
        """The metadata documents shown in the directory of `meta`, as listing entries."""
        listing = []
        for name in self.names(meta):
            size, mtime_ns = self.document_size(meta, name)
            node = Node(join(meta.key, name), Role.METADATA, meta)
            listing.append((name, node, Attr(False, size, mtime_ns, None, meta.metadata.access)))
        return listing

    def group_member(self, group: GroupView, name: str) -> Node:
        """What `name` in a group's directory is: one of its documents, a child of a
        translated hierarchy, or what the source holds there; NotFound if nothing."""
        path = join(group.key, name)
        if name in self.names(group):
            return Node(path, Role.METADATA, group)
        if name == METADATA:
            raise NotFound(path)  # replaced by the view's documents
        if not self.tree.passthrough:
            return self._child_node(group, name)
        return self.source_node(path)

    def array_member(self, array: ArrayView, name: str) -> Node | None:
        """What `name` in an array's directory is if it is no chunk key: one of its
        documents, or what the source holds there; NotFound if nothing (or a shard,
        replaced by the view's chunks); None for a chunk key (see `Shards.key_node`)."""
        path = join(array.key, name)
        layout = array.layout
        if name in array.docs:
            return Node(path, Role.METADATA, array)
        if name == METADATA:
            raise NotFound(path)
        if array.names.owns(name, layout.ndim):
            return None
        if not self.tree.passthrough or layout.keys.owns(name, layout.ndim):
            raise NotFound(path)  # a shard: replaced by the view's chunks
        return self.source_node(path, inside_array=True)

    def source_node(self, path: str, inside_array: bool = False) -> Node:
        """The node of source object `path`, passed through: a file, or a directory that
        may hold a node (none inside an array); NotFound if there is none."""
        stat = self.storage.stat(path)
        if stat is None:
            raise NotFound(path)
        if not stat.is_dir:
            return Node(path, Role.FILE)
        return Node(path, Role.DIR) if inside_array else self.dir_node(path)

    def group_entries(self, group: NodeView) -> list[tuple[str, Node, Attr]]:
        """The entries of a group's directory: its documents, then its children (in a
        translated hierarchy) or whatever else the source holds there."""
        listing = self._documents(group)
        if not self.tree.passthrough:
            return listing + self._children(group)
        for entry in self.storage.list(group.key):
            if entry.name != METADATA and entry.name not in group.docs:
                listing.append(self.source_entry(group.key, entry))
        return listing

    def array_entries(self, array: ArrayView, data: list[Entry]) -> list[tuple[str, Node, Attr]]:
        """The entries of an array's directory other than its chunks, given the entries of
        its source directory `data`: its documents, and what else the source holds there
        that passes through (not its stored document, shards or chunk keys)."""
        listing = self._documents(array)
        layout, names = array.layout, array.names
        for entry in data if self.tree.passthrough else ():
            if (
                entry.name == METADATA
                or entry.name in array.docs
                or layout.keys.owns(entry.name, layout.ndim)
                or names.owns(entry.name, layout.ndim)
            ):
                continue  # replaced by the view's documents and chunks
            path = join(array.key, entry.name)
            role = Role.DIR if entry.stat.is_dir else Role.FILE
            listing.append((entry.name, Node(path, role), Attr.of(entry.stat)))
        return listing

    def source_entry(self, parent: str, entry: Entry) -> tuple[str, Node, Attr]:
        """Source entry `entry` of directory `parent`, passed through: a file, or a
        directory that may hold a node."""
        path = join(parent, entry.name)
        node = self.dir_node(path) if entry.stat.is_dir else Node(path, Role.FILE)
        return entry.name, node, Attr.of(entry.stat)


class _Snapshot:
    """`Presentation.snapshot`: a plain class, as it is entered several times per request
    (a generator-based context manager costs a few µs each time)."""

    __slots__ = ("_local", "_outer")

    def __init__(self, local: threading.local) -> None:
        self._local = local
        self._outer = False

    def __enter__(self) -> None:
        self._outer = getattr(self._local, "docs", None) is None
        if self._outer:
            self._local.docs, self._local.views = {}, {}

    def __exit__(self, *exc: object) -> None:
        if self._outer:
            self._local.docs = self._local.views = None


def _metadata_cost(value: NodeView | dict[str, int] | int | None) -> int:
    """What an entry of `Presentation.nodes` holds: a view, the sizes of a node's documents,
    the size of a `.zmetadata`, or None (a node shown unchanged)."""
    if value is None or isinstance(value, int):
        return 256
    if isinstance(value, dict):
        return 64 * len(value) + 256
    return value.cost


def _directories_to(top: str, key: str) -> list[str]:
    """The directories on the way to `key` below directory `top` (all of them from the
    root, if `key` is not below `top`)."""
    names = key.split("/")[:-1]
    directories = ["/".join(names[: i + 1]) for i in range(len(names))]
    if not top:
        return directories
    if top in directories:
        return directories[directories.index(top) + 1 :]
    return directories


def _size(docs: dict[str, bytes]) -> int:
    return sum(len(data) for data in docs.values())


def _without_attributes(meta: dict) -> dict:
    """`meta` with empty attributes (in their place): what an array's view is made from,
    so that what lookups keep of it does not grow with its attributes."""
    return {**meta, "attributes": {}} if meta.get("attributes") else meta
