"""The writable view: the source's view plus everything written through the mount.

This is what a read-write mount serves. Reads go to the overlay first
(buffered files, deleted chunks, directories made by `mkdir`) and then to the
source's view, so written data is visible at once. Writes land in the
overlay, classified by the path they are written to:

- a chunk of an array (its key in the view) becomes a pending chunk, which the
  committer appends to its shard;
- a metadata document (`zarr.json`, or `.zarray`/`.zattrs`/`.zgroup` in the
  v2 view) is translated back and stored when it is closed or renamed into
  place; errors reach the writer as EINVAL;
- a file at a chunk key of an array the view shows unchanged (whole-shard
  compression, a zero-dimensional array, ...) is stored whole, as written, at
  the same key when it is closed, renamed or linked into place, or fsynced: the
  view shows that array as stored, so writes pass through as they are;
- anything else (temp files, stray files) is a scratch file that only the
  mount holds and that never reaches the source.

The operations writers use are covered: temp file + rename over the key,
`link` + `unlink` for exclusive creation, `O_TRUNC`, `O_APPEND`, `unlink` of
a chunk, and `mkdir -p` of chunk directories (which creates nothing in the
source). Mutations are serialised by one lock and may block; reads never wait
for a mutation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from shardfs.errors import (
    AlreadyExists,
    CannotMove,
    InvalidMetadata,
    InvalidWrite,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    ReadOnly,
    ShardfsError,
)
from shardfs.formats import metadata_write as mw
from shardfs.formats import ome
from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.zarr_v2 import ZARRAY, ZATTRS, ZGROUP, ZMETADATA, Transform
from shardfs.formats.zarr_v3 import Unshardable, parse_node, plain_layout, render, sharded_layout
from shardfs.storage.base import ABSENT
from shardfs.storage.blocking import WouldBlock, may_block
from shardfs.view.base import Reader
from shardfs.view.hierarchy import METADATA, NodeDoc, join
from shardfs.view.namespace import ArrayView, Attr, Namespace, Node, Role, View
from shardfs.view.nodes import Listing
from shardfs.writeback.buffer import WriteBuffer
from shardfs.writeback.commit import Committer
from shardfs.writeback.overlay import Buffered, Kind, Overlay, ShardRef, Whiteout

log = logging.getLogger("shardfs")

V2_DOCS = (ZARRAY, ZATTRS, ZGROUP, ZMETADATA)
#: Kinds of files stored in the source when they are closed, renamed into place or fsynced.
STORED = (Kind.METADATA, Kind.PASSTHROUGH)
#: Bound on `Workspace._unchanged` (arrays shown unchanged, by document version).
UNCHANGED_CACHE = 4096


class Handle:
    """An open buffered file. It follows its entry through renames and unlinks."""

    def __init__(self, entry: Buffered) -> None:
        self.entry = entry

    def read(self, offset: int, size: int) -> bytes:
        return self.entry.blob.read(offset, size)

    def attr(self) -> Attr:
        """The open file as it is now, wherever (or whether) it is in the view."""
        return Attr(False, self.entry.blob.size, self.entry.blob.mtime_ns)

    @property
    def stores_on_close(self) -> bool:
        return self.entry.kind in STORED


class Workspace:
    def __init__(
        self, namespace: Namespace, buffer: WriteBuffer, shard_new: int | None = None
    ) -> None:
        self.ns = namespace
        self.storage = namespace.storage
        self.buffer = buffer
        self.overlay = Overlay()
        self.committer = Committer(namespace, self.overlay)
        namespace.guard = self.committer.wait_idle
        self.shard_new = shard_new
        self._mutating = threading.Lock()
        #: (directory, document version) -> what files below the node there are: see
        #: `_unchanged_keys`
        self._unchanged: dict[tuple[str, object], tuple[ChunkKeyEncoding, int] | str | None] = {}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the mutation lock; in a non-blocking attempt, never wait for it.

        Every mutation does all its I/O (which may raise WouldBlock) before it
        changes anything, so a non-blocking attempt can always be retried.
        """
        if not self._mutating.acquire(blocking=may_block()):
            raise WouldBlock
        try:
            yield
        finally:
            self._mutating.release()

    # -- reading ------------------------------------------------------------------------

    @property
    def writes(self) -> Workspace:
        return self

    def digest_source(self, node: Node) -> Namespace | None:
        """Chunks written through the mount and not yet committed have no stored bytes."""
        if node.role is not Role.CHUNK or self.overlay.entry(node.path) is not None:
            return None
        return self.ns

    def stats(self) -> dict[str, Any]:
        """The view's figures (`Namespace.stats`), and the commits of this mount."""
        return {**self.ns.stats(), "commits": self.committer.snapshot()}

    def root(self) -> Node:
        return self.ns.root()

    def resolve(self, path: str) -> Node:
        node = self.root()
        for name in filter(None, path.split("/")):
            node = self.lookup(node, name)
        return node

    def current(self, node: Node) -> Node:
        """A directory node as it is now: writes turn directories into groups and arrays."""
        if node.role in (Role.DIR, Role.GROUP, Role.ARRAY):
            return self.ns.dir_node(node.path)
        return node

    def lookup(self, parent: Node, name: str) -> Node:
        with self.ns.snapshot():
            return self._lookup(parent, name)

    def _lookup(self, parent: Node, name: str) -> Node:
        parent = self.current(parent)
        path = join(parent.path, name)
        entry = self.overlay.entry(path)
        if isinstance(entry, Whiteout):
            raise NotFound(path)
        if isinstance(entry, Buffered):
            return self._classify(parent, name)[0]
        try:
            return self.ns.lookup(parent, name)
        except NotFound:
            if not self._virtual(path):
                raise
            return self._dir_in(parent, name)

    def entry(self, parent: Node, name: str) -> tuple[Node, Attr]:
        """`lookup` and `attr` in one step; in one step of the namespace for a file only
        the source holds (see `Namespace.entry`). Either sees one version of each
        metadata document on its way (see `Namespace.snapshot`)."""
        with self.ns.snapshot():
            current = self.current(parent)
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

    def listdir(self, node: Node) -> list[tuple[str, Node, Attr]]:
        """The entries of a directory with a node each, sorted by name."""
        return sorted(self.listing(node).items(), key=lambda item: item[0])

    def listing(self, node: Node) -> Listing:
        """The source's listing with the overlay's files and whiteouts applied."""
        node = self.current(node)
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
            path = join(node.path, name)
            entry = self.overlay.entry(path)
            if isinstance(entry, Whiteout):
                continue
            try:
                child = self.lookup(node, name)
                entries.append((name, child, self.attr(child)))
            except NotFound:
                continue  # gone since the names were taken
        entries.sort(key=lambda item: item[0])
        return Listing(entries, [run for run in runs if len(run)])

    def open(self, node: Node, flags: int = os.O_RDONLY) -> Reader | Handle:
        """Open for reading from the source, or for writing into the buffer."""
        entry = self.overlay.entry(node.path)
        if isinstance(entry, Whiteout):
            raise NotFound(node.path)
        writing = flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC
        if entry is None and not writing:
            return self.ns.open(self._fresh_leaf(node))
        with self._locked():
            # Again, pinned: a commit or a last close may have taken the entry out meanwhile.
            entry = self._pin(node.path)
            if isinstance(entry, Whiteout):
                raise NotFound(node.path)
            if entry is None:
                if not writing:
                    return self.ns.open(self._fresh_leaf(node))
                keep = not flags & os.O_TRUNC
                entry = self._copy_up(self._fresh_leaf(node), keep=keep, handles=1)
            elif flags & os.O_TRUNC:
                try:
                    entry.blob.truncate(0)
                except BaseException:
                    self._unpin(entry)
                    raise
                self.overlay.mark(entry)
            return Handle(entry)  # the pin is the handle's

    # -- changing the namespace -----------------------------------------------------------

    def create(self, parent: Node, name: str) -> tuple[Node, Attr, Handle]:
        with self._locked():
            node, kind, shard = self._classify(parent, name, writing=True)
            # Placed with its handle, so that no commit can take it out before it is written.
            entry = Buffered(node.path, self.buffer.new(), kind, shard, node.coords, handles=1)
            self.overlay.put(entry)
            return node, self.attr(node), Handle(entry)

    def mkdir(self, parent: Node, name: str) -> tuple[Node, Attr]:
        with self._locked():
            parent = self.current(parent)
            if self._exists(parent, name):
                raise AlreadyExists(join(parent.path, name))
            node = self._dir_in(parent, name)
            self.overlay.add_dir(node.path)  # the last step: nothing after it reads
            return node, Attr(True, 0, self.overlay.dir_mtime(node.path))

    def rmdir(self, parent: Node, name: str) -> Node:
        """Remove an empty directory; returns the node it was."""
        with self._locked():
            node = self.lookup(parent, name)
            if not node.is_dir:
                raise NotADirectory(node.path)
            if len(self.listing(node)):
                raise NotEmpty(node.path)
            if not self.overlay.is_dir(node.path) and node.role is not Role.CHUNK_DIR:
                raise ReadOnly(f"{node.path}: directories of the source are not removed")
            self.overlay.remove_dir(node.path)
            return node

    def unlink(self, parent: Node, name: str) -> Node:
        """Remove a file; returns the node it was."""
        with self._locked():
            node = self.lookup(parent, name)
            if node.is_dir:
                raise IsADirectory(node.path)
            self._remove(node)
            return node

    def rename(
        self, parent: Node, name: str, new_parent: Node, new_name: str, noreplace: bool
    ) -> tuple[Node, Node, bool]:
        """Move a file; returns the nodes it was and is, and whether it replaced a file."""
        with self._locked():
            node = self.lookup(parent, name)
            if node.is_dir:
                raise CannotMove(f"{node.path}: directories cannot be renamed in the view")
            target, kind, shard = self._classify(new_parent, new_name, writing=True)
            if target.path == node.path:
                return node, node, False
            replacing = self._check_target(new_parent, new_name, replace=not noreplace)
            pinned = self._pin(node.path)
            copy = None  # of a file of the source: freed unless it takes the target's place
            try:
                if isinstance(pinned, Buffered):
                    entry = pinned
                    was = self._check_removable(node, entry)
                else:
                    was = self._check_removable(node, None)
                    copy = entry = self._copy_up(node, keep=True, track=False)
                generation, content = -1, b""
                if kind in STORED:
                    generation, content = self._snapshot(entry)
                if kind is Kind.METADATA:
                    self._store_metadata(target, content)
                elif kind is Kind.PASSTHROUGH:
                    self._store_object(target.path, content)
                elif kind is Kind.CHUNK:
                    self._check_chunk(target.array, target.path, entry.blob.size)
                if was is Kind.PASSTHROUGH:
                    self._delete_object(node.path)  # the file leaves its key in the source
                # A stored file stays in the overlay only while it is open (see `_unpin`):
                # later writes through its descriptors are stored at their close.
                moving = kind is not Kind.METADATA and (
                    kind is not Kind.PASSTHROUGH or entry is pinned
                )
                self._detach(node, release=not moving)
                if moving:
                    entry.path, entry.kind, entry.shard = target.path, kind, shard
                    entry.coords, entry.committed = target.coords, generation
                    replaced = self.overlay.put(entry)
                    copy = None
                    if isinstance(replaced, Buffered) and replaced.handles == 0:
                        replaced.blob.release()  # a file renamed over, open nowhere
                elif kind is Kind.PASSTHROUGH:
                    self._drop(target.path)  # the source holds what stands there now
            finally:
                if isinstance(pinned, Buffered):
                    self._unpin(pinned)
                if copy is not None:
                    copy.blob.release()  # stored, refused, or to be made again after WouldBlock
            return node, target, replacing

    def link(self, node: Node, new_parent: Node, new_name: str) -> tuple[Node, Attr]:
        with self._locked():
            if node.is_dir:
                raise IsADirectory(node.path)
            target, kind, shard = self._classify(new_parent, new_name, writing=True)
            self._check_target(new_parent, new_name, replace=False)
            entry = self._pin(node.path)
            try:
                if isinstance(entry, Buffered):
                    source = entry.blob.getvalue()
                else:
                    source = self._content(node)
            finally:
                if isinstance(entry, Buffered):
                    self._unpin(entry)
            if kind in STORED:
                # I/O: never in a non-blocking attempt
                if kind is Kind.METADATA:
                    self._store_metadata(target, source)
                else:
                    self._store_object(target.path, source)
                target = self.lookup(new_parent, new_name)
            else:
                if kind is Kind.CHUNK:
                    self._check_chunk(target.array, target.path, len(source))
                copy = Buffered(target.path, self.buffer.new(source), kind, shard, target.coords)
                self.overlay.put(copy)
            return target, self.attr(target)

    def truncate(self, node: Node, size: int) -> Attr:
        with self._locked():
            entry = self._pin(node.path)
            if isinstance(entry, Whiteout):
                raise NotFound(node.path)
            if entry is None:
                entry = self._copy_up(self._fresh_leaf(node), keep=size > 0, handles=1)
            try:
                self._truncate(entry, size)
                if entry.kind is Kind.PASSTHROUGH and self.overlay.entry(entry.path) is entry:
                    self._store_entry(entry)  # no close will come to store it
            finally:
                self._unpin(entry)
            return self.attr(node)

    def reopen(self, handle: Handle, flags: int) -> Handle:
        """Another handle on the file of `handle`, wherever (or whether) it is in the view."""
        with self._locked():
            if flags & os.O_TRUNC:
                self._truncate(handle.entry, 0)  # idempotent: may raise WouldBlock
            with self.overlay.lock:
                handle.entry.handles += 1
            return Handle(handle.entry)

    def truncate_open(self, handle: Handle, size: int) -> Attr:
        """`ftruncate`: the open file, even if its path was unlinked or now names another."""
        with self._locked():
            self._truncate(handle.entry, size)
            return handle.attr()

    def _truncate(self, entry: Buffered, size: int) -> None:
        entry.blob.truncate(size)
        self.overlay.mark(entry)  # nothing if the entry left the view

    # -- open files ---------------------------------------------------------------------

    def write(self, handle: Handle, offset: int, data: bytes) -> int:
        handle.entry.blob.write(offset, data)
        self.overlay.mark(handle.entry)
        return len(data)

    def flush(self, handle: Handle) -> None:
        """On close: store a metadata document or a file stored as written; tell the writer
        of a chunk that cannot be stored."""
        entry = handle.entry
        if entry.kind is Kind.METADATA and entry.dirty:
            with self._locked():
                if self.overlay.entry(entry.path) is entry:
                    generation = entry.blob.generation
                    node = self._classify_path(entry.path)
                    self._store_metadata(node, entry.blob.getvalue())
                    entry.committed = generation
        elif entry.kind is Kind.PASSTHROUGH and entry.dirty:
            with self._locked():
                if self.overlay.entry(entry.path) is entry and entry.dirty:
                    self._store_entry(entry)
        elif entry.kind is Kind.CHUNK:
            self._check_open_chunk(entry)

    def release(self, handle: Handle) -> None:
        self._unpin(handle.entry, closing=True)

    def _pin(self, path: str) -> Buffered | Whiteout | None:
        """The overlay's entry at `path`; a buffered one with one handle more, taken in the
        same step, so that neither a commit nor the last close of another handle frees it
        while a change works on it. Every pin is undone by `_unpin` (or kept by a handle)."""
        with self.overlay.lock:
            entry = self.overlay.entry(path)
            if isinstance(entry, Buffered):
                entry.handles += 1
            return entry

    def _unpin(self, entry: Buffered, closing: bool = False) -> None:
        """One handle fewer. After the last one, a clean chunk or file stored as written
        (and, `closing` a file, a metadata document or a file stored as written whose store
        failed: its writer was told at close) leaves the overlay: the source holds it. An
        entry no longer in the overlay is freed."""
        with self.overlay.lock:
            entry.handles -= 1
            if entry.handles:
                return
            tracked = self.overlay.entry(entry.path) is entry
            if tracked and (
                (closing and entry.kind in STORED)
                or (entry.kind in (Kind.CHUNK, Kind.PASSTHROUGH) and not entry.dirty)
            ):
                self.overlay.remove(entry.path)
                tracked = False
            if not tracked:
                entry.blob.release()

    def fsync(self, handle: Handle) -> None:
        """Make the file durable: commit a chunk's shard now, store a metadata document.
        A chunk that cannot be stored (see `_check_chunk`) fails with InvalidWrite, as on
        close, and nothing of it is stored."""
        entry = handle.entry
        if entry.kind is Kind.CHUNK and entry.shard is not None:
            self._check_open_chunk(entry)
            if entry in self.committer.commit(entry.shard):
                # Changed to a wrong size between the check and the commit: discarded.
                error = InvalidWrite(f"{entry.path}: cannot be stored, discarded")
                error.logged = True  # the commit logged why
                raise error
        elif entry.kind in STORED:
            self.flush(handle)

    def sync(self) -> int:
        """Commit everything, and store the files stored as written that are still open;
        returns the number of shards and files that failed (each logged)."""
        failed = self.committer.commit_all(include_open=True)
        for entry in self.overlay:
            if not (isinstance(entry, Buffered) and entry.kind is Kind.PASSTHROUGH):
                continue
            try:
                with self._locked():
                    if self.overlay.entry(entry.path) is entry and entry.dirty:
                        self._store_entry(entry)
            except ShardfsError as e:
                log.error("%s: could not be stored: %s", self.storage.describe(entry.path), e)
                failed += 1
        return failed

    # -- helpers ------------------------------------------------------------------------

    def _virtual(self, path: str) -> bool:
        return self.overlay.is_dir(path) or self.overlay.has_children(path)

    def _dir_mtime(self, path: str) -> int:
        return self.overlay.dir_mtime(path) if self.overlay.is_dir(path) else time.time_ns()

    def _dir_in(self, parent: Node, name: str) -> Node:
        """The node of a directory that exists only in the overlay."""
        if parent.role in (Role.ARRAY, Role.CHUNK_DIR):
            node = self.ns.key_node(self.ns.refresh(parent), name)
            if node is not None and node.role is Role.CHUNK_DIR:
                return node
        return Node(join(parent.path, name), Role.DIR)

    def _fresh_leaf(self, node: Node) -> Node:
        """A file node classified again: a new `zarr.json` turns its directory into a node."""
        if node.role in (Role.FILE, Role.METADATA) and node.source is None:
            return self._classify_path(node.path, lookup=True)
        return node

    def _classify_path(self, path: str, lookup: bool = False) -> Node:
        parent_path, _, name = path.rpartition("/")
        parent = self.resolve(parent_path)
        return self.ns.lookup(parent, name) if lookup else self._classify(parent, name)[0]

    def _exists(self, parent: Node, name: str) -> bool:
        try:
            self.lookup(parent, name)
        except NotFound:
            return False
        return True

    def _check_target(self, parent: Node, name: str, replace: bool) -> bool:
        """Whether a file is at `name` to be replaced; an error if it may not be."""
        try:
            existing = self.lookup(parent, name)
        except NotFound:
            return False
        if not replace:
            raise AlreadyExists(existing.path)
        if existing.is_dir:
            raise IsADirectory(existing.path)
        return True

    def _classify(
        self, parent: Node, name: str, writing: bool = False
    ) -> tuple[Node, Kind, ShardRef | None]:
        """What a file written at `name` in `parent` is, and where it will be stored.
        `writing` (a file created, renamed or linked there): ReadOnly where it could be
        neither stored nor kept as scratch (see `_stored_as_written`)."""
        parent = self.current(parent)
        path = join(parent.path, name)
        if writing:
            _check_format(path, name, self.ns.view)
        if parent.role in (Role.ARRAY, Role.CHUNK_DIR):
            if parent.role is Role.CHUNK_DIR:
                parent = self.ns.refresh(parent)  # `current` made only an array's fresh
            array = parent.array
            if parent.role is Role.ARRAY and name in array.docs:
                return Node(path, Role.METADATA, array), Kind.METADATA, None
            node = self.ns.key_node(parent, name)
            # A key outside the chunk grid names no chunk: committed, it would land where
            # the view never shows it (a shard or chunk object past the grid, a slot past
            # the edge of a partial shard). Like any name that is not a key, it is scratch.
            if node is not None and node.role is Role.CHUNK and array.layout.in_bounds(node.coords):
                shard, _ = array.layout.shard_of(node.coords)
                return node, Kind.CHUNK, (array.key, shard)
            return Node(path, Role.FILE), Kind.SCRATCH, None
        if parent.role is Role.GROUP and name in parent.meta.docs:  # type: ignore[union-attr]
            return Node(path, Role.METADATA, parent.meta), Kind.METADATA, None
        documents = V2_DOCS if self.ns.view is View.V2 else (METADATA,)
        if parent.role in (Role.DIR, Role.GROUP) and name in documents:
            return Node(path, Role.FILE), Kind.METADATA, None
        if parent.role is Role.DIR and self._stored_as_written(path, writing):
            return Node(path, Role.FILE), Kind.PASSTHROUGH, None
        return Node(path, Role.FILE), Kind.SCRATCH, None

    def _stored_as_written(self, path: str, writing: bool) -> bool:
        """Whether a file at `path`, in a plain directory of the view, lies at a chunk key of
        an array the view shows unchanged (real shards or chunks and its own `zarr.json`):
        such a file is stored whole, as written (kind PASSTHROUGH). The array is the nearest
        node above the file. Below a node whose `zarr.json` does not tell its chunk keys
        (not Zarr v3 metadata, an unknown chunk key encoding), nothing is known to be
        scratch: `writing` there is refused (ReadOnly, logged), never taken and dropped."""
        if self.ns.tree.translates:
            return False  # translated sources are mounted read-only
        directory = path.rpartition("/")[0]
        while True:
            doc = self.ns.tree.find(directory)
            if doc is not None:
                break
            if not directory:
                return False
            directory = directory.rpartition("/")[0]
        keys = self._unchanged_keys(directory, doc)
        if isinstance(keys, str):
            if not writing:
                return False
            error = ReadOnly(
                f"{path}: cannot be written: {join(directory, METADATA)} is shown unchanged and "
                f"does not tell which files are its chunks ({keys})"
            )
            log.error("%s", error)
            error.logged = True
            raise error
        if keys is None:
            return False
        encoding, ndim = keys
        key = path[len(directory) + 1 :] if directory else path
        return encoding.decode(key, ndim) is not None

    def _unchanged_keys(
        self, directory: str, doc: NodeDoc
    ) -> tuple[ChunkKeyEncoding, int] | str | None:
        """The chunk key encoding and rank of the array at `directory` if the view shows it
        unchanged; None if the node there is a group or an array the view serves; a
        reason if its document does not tell. Kept per version of the document."""
        cached = self._unchanged.get((directory, doc.version), False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        result: tuple[ChunkKeyEncoding, int] | str | None = None
        if self.ns.dir_node(directory).role is Role.DIR:
            try:
                meta = parse_node(self.ns.tree.read(doc) or b"")
                if meta["node_type"] == "array":
                    shape = meta.get("shape")
                    if not isinstance(shape, list):
                        raise InvalidMetadata(f"shape is {shape!r}")
                    result = (
                        ChunkKeyEncoding.from_metadata(meta.get("chunk_key_encoding")),
                        len(shape),
                    )
            except InvalidMetadata as e:
                result = str(e)
        if len(self._unchanged) >= UNCHANGED_CACHE:
            self._unchanged.clear()
        self._unchanged[(directory, doc.version)] = result
        return result

    def _kind(self, node: Node) -> tuple[Kind, ShardRef | None]:
        """What an existing file of the view is, for writing; ReadOnly for other source files."""
        parent_path, _, name = node.path.rpartition("/")
        _, kind, shard = self._classify(self.resolve(parent_path), name)
        if kind is Kind.SCRATCH and node.role is not Role.CHUNK:
            raise ReadOnly(f"{node.path}: only chunks and metadata of the source can be changed")
        return kind, shard

    def _copy_up(self, node: Node, keep: bool, track: bool = True, handles: int = 0) -> Buffered:
        """A buffered copy of a file of the source, to be changed (placed with `handles`)."""
        kind, shard = self._kind(node)
        content = self._content(node) if keep else b""
        entry = Buffered(node.path, self.buffer.new(content), kind, shard, node.coords, handles)
        if kind is Kind.PASSTHROUGH and keep:
            entry.committed = entry.blob.generation  # as stored: nothing to store on close
        if track:
            self.overlay.put(entry)
        return entry

    def _content(self, node: Node) -> bytes:
        reader = self.ns.open(node)
        return reader.read(0, reader.size)

    def _check_removable(self, node: Node, entry: Buffered | None) -> Kind:
        """The kind of the file at `node` (buffered as `entry`), if it may leave its path."""
        kind = entry.kind if entry is not None else self._kind(node)[0]
        if kind is Kind.METADATA:
            raise ReadOnly(f"{node.path}: metadata documents cannot be removed through the mount")
        return kind

    def _remove(self, node: Node) -> None:
        entry = self.overlay.entry(node.path)
        kind = self._check_removable(node, entry if isinstance(entry, Buffered) else None)
        if kind is Kind.PASSTHROUGH:
            self._delete_object(node.path)
        self._detach(node, release=True)

    def _detach(self, node: Node, release: bool) -> None:
        """Take the file at `node` out of the view; a chunk is marked deleted for its shard.
        Its buffer is freed if `release` and no handle has it open."""
        entry = self.overlay.entry(node.path)
        chunk = entry.shard if isinstance(entry, Buffered) and entry.kind is Kind.CHUNK else None
        if chunk is None and node.role is Role.CHUNK:
            chunk = self._kind(node)[1]
        self.overlay.remove(node.path)
        if release and isinstance(entry, Buffered) and entry.handles == 0:
            entry.blob.release()
        if chunk is not None:
            # Even if the source does not hold it yet: a commit may be storing it right now.
            self.overlay.put(Whiteout(node.path, chunk, node.coords))

    def _check_open_chunk(self, entry: Buffered) -> None:
        """`_check_chunk` for an open chunk file, unless it left the view (unlinked or
        renamed over while open: it will not be stored)."""
        if entry.shard is None or self.overlay.entry(entry.path) is not entry:
            return
        array = self.ns.array_at(entry.shard[0])
        if array is not None:
            self._check_chunk(array, entry.path, entry.blob.size)

    @staticmethod
    def _check_chunk(array: ArrayView, path: str, size: int) -> None:
        """A chunk the v2 view serves uncompressed must be written back whole."""
        v2 = array.v2
        if v2 is not None and v2.transform is Transform.DECODE:
            assert v2.encoder is not None
            if size != v2.encoder.nbytes:
                raise InvalidWrite(
                    f"{path}: an uncompressed chunk of this array has {v2.encoder.nbytes} "
                    f"bytes, not {size}"
                )

    # -- files stored as written ----------------------------------------------------------

    @staticmethod
    def _snapshot(entry: Buffered) -> tuple[int, bytes]:
        """(generation, content) of a buffered file that is pinned or not yet placed."""
        snapshot = entry.blob.snapshot()
        assert snapshot is not None, "a pinned blob is never released"
        return snapshot

    def _store_entry(self, entry: Buffered) -> None:
        """Store a buffered file of kind PASSTHROUGH at its key, as it is now."""
        generation, content = self._snapshot(entry)
        self._store_object(entry.path, content)
        entry.committed = generation

    def _store_object(self, key: str, content: bytes) -> None:
        """Put `content` at `key` in the source, whole and durably, over what is there."""
        stat = self.storage.stat(key)
        if stat is not None and stat.is_dir:
            raise IsADirectory(key)
        self.storage.put(key, [content], ABSENT if stat is None else stat.version)

    def _delete_object(self, key: str) -> None:
        """Remove the object at `key` from the source, if there is one."""
        stat = self.storage.stat(key)
        if stat is not None and not stat.is_dir:
            with contextlib.suppress(NotFound):  # removed by someone else meanwhile
                self.storage.delete(key, stat.version)

    def _drop(self, path: str) -> None:
        """Take the buffered file at `path` out of the view (the source holds what stands
        there now); it lives on for the descriptors that have it open."""
        entry = self.overlay.remove(path)
        if isinstance(entry, Buffered) and entry.handles == 0:
            entry.blob.release()

    # -- metadata -----------------------------------------------------------------------

    def _store_metadata(self, node: Node, raw: bytes) -> None:
        """Translate a written metadata document back and store it in the source."""
        directory, _, name = node.path.rpartition("/")
        source, version = self._read_metadata(directory)
        if self.ns.view is View.V3:
            data = self._v3_document(directory, source, raw)
        else:
            data = self._v2_document(directory, name, source, raw)
        if data is None:
            return
        self.storage.put(join(directory, METADATA), [data], version)
        if self.ns.view is View.V2:
            attributes = json.loads(data).get("attributes") or {}
            for path, names in ome.dimension_names(attributes).items():
                self._name_axes(join(directory, path), names)

    def _read_metadata(self, directory: str) -> tuple[dict | None, object]:
        """The stored `zarr.json` of `directory` (None if none) and its version (ABSENT if
        none), to store the next one over it."""
        stat = self.storage.stat(join(directory, METADATA))
        if stat is None or stat.is_dir:
            return None, ABSENT
        raw = self.storage.read(join(directory, METADATA), 0, stat.size, stat.version)
        return json.loads(raw), stat.version

    def _name_axes(self, directory: str, names: list[str]) -> None:
        """Give the level array at `directory` of an OME-Zarr image the dimension names
        0.5 requires (its image's axes): a 0.4 writer has no words for them."""
        meta, version = self._read_metadata(directory)
        named = mw.with_dimension_names(meta, names) if meta is not None else None
        if named is not None:
            self.storage.put(join(directory, METADATA), [render(named)], version)

    def _image_axes(self, directory: str) -> list[str] | None:
        """The axes names of the OME-Zarr image (above `directory`) whose level it is."""
        group = directory
        while group:
            group = group.rpartition("/")[0]
            meta, _ = self._read_metadata(group)
            if meta is not None and ome.is_v05(meta.get("attributes")):
                level = directory[len(group) + 1 :] if group else directory
                return ome.dimension_names(meta["attributes"]).get(level)
        return None

    def _v3_document(self, directory: str, source: dict | None, raw: bytes) -> bytes:
        """What the source stores for a `zarr.json` written in the v3 view. A document that
        asks for sharding the view did not show (a new sharded array, the sharding of an
        array added, changed or removed) is refused: see `mw.check_sharding`."""
        what = join(directory, METADATA)
        if source is None:
            # An array the view will show unchanged (whole-shard compression, say) is stored
            # as written, its sharding included: its shards pass through as written too.
            return mw.new_v3(raw, self.shard_new, shown=_shown_unchanged(raw), what=what)
        written = mw.parse_written(raw, "zarr.json")
        array = self.ns.array_at(directory)
        if array is None or not array.layout.levels:
            # A group, an unsharded array or an array shown unchanged: stored as written.
            return mw.new_v3(raw, self.shard_new, shown=source, what=what)
        view = json.loads(array.layout.view_metadata)
        return render(mw.updated_v3(source, view, written, self.shard_new, what))

    def _v2_document(
        self, directory: str, name: str, source: dict | None, raw: bytes
    ) -> bytes | None:
        written = mw.parse_written(raw, name)
        if name == ZMETADATA:
            return None  # the view consolidates by itself
        if name == ZGROUP:
            if source is None:
                return render({"zarr_format": 3, "node_type": "group", "attributes": {}})
            if source.get("node_type") != "group":
                raise InvalidWrite(f"{directory}: .zgroup written over an array")
            return None
        if source is None:
            if name == ZATTRS:
                raise InvalidWrite(f"{directory}: .zattrs written before .zarray or .zgroup")
            meta = mw.v3_from_zarray(written)
            names = self._image_axes(directory)
            meta = (mw.with_dimension_names(meta, names) if names else None) or meta
            return render(mw.shard(meta, self.shard_new) if self.shard_new else meta)
        if name == ZATTRS:
            return render(mw.updated_from_zattrs(source, written))
        array = self.ns.array_at(directory)
        if array is None or array.v2 is None:
            raise InvalidWrite(f"{directory}: .zarray written over a group")
        return render(mw.updated_from_zarray(source, array.v2.zarray, written))


def _check_format(path: str, name: str, view: View) -> None:
    """Refuse a metadata document of the other Zarr format than the view shows. Taken as a
    scratch file, it would vanish at unmount, and the chunks written after it would land
    at keys the view does not serve: a writer's whole array would be lost unseen."""
    if view is View.V2 and name == METADATA:
        raise InvalidWrite(
            f"{path}: Zarr v3 metadata cannot be written in the v2 view "
            "(mount without -o view=v2 to write Zarr v3)"
        )
    if view is View.V3 and name in V2_DOCS:
        raise InvalidWrite(
            f"{path}: Zarr v2 metadata cannot be written in the v3 view "
            "(mount with -o view=v2 to write Zarr v2)"
        )


def _shown_unchanged(raw: bytes) -> dict | None:
    """The metadata of a new `zarr.json` if it makes an array that the v3 view shows
    unchanged (see `Namespace._array_view`), else None."""
    try:
        meta = parse_node(raw)
        if meta["node_type"] != "array":
            return None
        if sharded_layout(meta) is None:
            plain_layout(meta, raw)
    except Unshardable:
        return meta
    except Exception:
        return None  # refused or stored by `mw.new_v3`, which tells why
    return None
