"""The writable view: the source's view plus everything written through the mount.

This is what a read-write mount serves: `MergedView` answers reads, overlay first.
Writes land in the overlay, classified by the path they are written to (see
`Classifier`):

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

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shardfs.primitives.blocking import WouldBlock, may_block
from shardfs.primitives.errors import (
    AlreadyExists,
    CannotMove,
    InvalidWrite,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    ReadOnly,
    ShardfsError,
)
from shardfs.view.base import Reader
from shardfs.view.hierarchy import join
from shardfs.view.namespace import Attr, Namespace, Node, Role
from shardfs.writeback.buffer import WriteBuffer
from shardfs.writeback.classify import check_chunk
from shardfs.writeback.commit import Committer
from shardfs.writeback.merged import MergedView
from shardfs.writeback.overlay import STORED, Buffered, Kind, ShardRef, Whiteout
from shardfs.writeback.stores import Stores, snapshot

log = logging.getLogger("shardfs")


class Handle:
    """An open buffered file. It follows its entry through renames and unlinks."""

    #: A file of the write side (see `OpenFile.buffered`).
    buffered = True

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


class Workspace(MergedView):
    def __init__(
        self, namespace: Namespace, buffer: WriteBuffer, shard_new: int | None = None
    ) -> None:
        super().__init__(namespace)
        self.buffer = buffer
        self.committer = Committer(namespace, self.overlay)
        namespace.shards.guard = self.committer.wait_idle
        self.stores = Stores(namespace, shard_new)
        self._mutating = threading.Lock()

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

    # (`SourceView.writes` is a None attribute; the protocols `ViewInterface` and `Writes`
    # take any `WriteHandle` where this takes its own `Handle`: for the view layer to mend)
    @property
    def writes(self) -> Workspace:  # type: ignore[override]
        return self

    def stats(self) -> dict[str, Any]:
        """The view's figures (`SourceView.stats`), and the commits of this mount."""
        return {**super().stats(), "commits": self.committer.snapshot()}

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
            entry = self.overlay.pin(node.path)
            if isinstance(entry, Whiteout):
                raise NotFound(node.path)
            if entry is None:
                if not writing:
                    return self.ns.open(self._fresh_leaf(node))
                keep = not flags & os.O_TRUNC
                entry = self._copy_up(self._fresh_leaf(node), keep=keep, handles=1)
            elif flags & os.O_TRUNC:
                try:
                    self._truncate(entry, 0)
                except BaseException:
                    self.overlay.unpin(entry)
                    raise
            return Handle(entry)  # the pin is the handle's

    # -- changing the namespace -----------------------------------------------------------

    def create(self, parent: Node, name: str) -> tuple[Node, Attr, Handle]:
        with self._locked():
            node, kind, shard = self.classifier.classify(parent, name, writing=True)
            # Placed with its handle, so that no commit can take it out before it is written.
            entry = Buffered(node.path, self.buffer.new(), kind, shard, node.coords, handles=1)
            self.overlay.put(entry)
            return node, self.attr(node), Handle(entry)

    def mkdir(self, parent: Node, name: str) -> tuple[Node, Attr]:
        with self._locked():
            parent = self.classifier.current(parent)
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
            entry = self.overlay.entry(node.path)
            if self._removable(node, entry) is Kind.PASSTHROUGH:
                self.stores.delete(node.path)
            self._detach(node)
            return node

    def rename(
        self, parent: Node, name: str, new_parent: Node, new_name: str, noreplace: bool
    ) -> tuple[Node, Node, bool]:
        """Move a file; returns the nodes it was and is, and whether it replaced a file."""
        with self._locked():
            # Resolving both names reads only: one version of each metadata document.
            with self.ns.presentation.snapshot():
                node = self.lookup(parent, name)
                if node.is_dir:
                    raise CannotMove(f"{node.path}: directories cannot be renamed in the view")
                target, kind, shard = self.classifier.classify(new_parent, new_name, writing=True)
                if target.path == node.path:
                    return node, node, False
                replacing = self._check_target(new_parent, new_name, replace=not noreplace)
            pinned = self.overlay.pin(node.path)
            copy = None  # of a file of the source: freed unless it takes the target's place
            try:
                was = self._removable(node, pinned)
                if isinstance(pinned, Buffered):
                    entry = pinned
                else:
                    copy = entry = self._copy_up(node, keep=True, track=False)
                generation, content = snapshot(entry) if kind in STORED else (-1, b"")
                if kind is Kind.METADATA:
                    self.stores.metadata(target.path, content)
                elif kind is Kind.PASSTHROUGH:
                    self.stores.object(target.path, content)
                elif kind is Kind.CHUNK:
                    check_chunk(target.array, target.path, entry.blob.size)
                if was is Kind.PASSTHROUGH:
                    self.stores.delete(node.path)  # the file leaves its key in the source
                self._detach(node)
                # A stored file stays in the overlay only while it is open (see
                # `Overlay.unpin`): later writes through its descriptors are stored at close.
                if kind is not Kind.METADATA and (kind is not Kind.PASSTHROUGH or entry is pinned):
                    entry.path, entry.kind, entry.shard = target.path, kind, shard
                    entry.coords, entry.committed = target.coords, generation
                    self.overlay.discard(target.path)  # a file renamed over, freed if not open
                    self.overlay.put(entry)
                    copy = None
                elif kind is Kind.PASSTHROUGH:
                    self.overlay.discard(target.path)  # the source holds what stands there now
            finally:
                if isinstance(pinned, Buffered):
                    self.overlay.unpin(pinned)
                if copy is not None:
                    copy.blob.release()  # stored, refused, or to be made again after WouldBlock
            return node, target, replacing

    def link(self, node: Node, new_parent: Node, new_name: str) -> tuple[Node, Attr]:
        with self._locked():
            if node.is_dir:
                raise IsADirectory(node.path)
            target, kind, shard = self.classifier.classify(new_parent, new_name, writing=True)
            self._check_target(new_parent, new_name, replace=False)
            entry = self.overlay.pin(node.path)
            try:
                source = (
                    entry.blob.getvalue() if isinstance(entry, Buffered) else self._content(node)
                )
            finally:
                if isinstance(entry, Buffered):
                    self.overlay.unpin(entry)
            if kind in STORED:
                # I/O: never in a non-blocking attempt
                if kind is Kind.METADATA:
                    self.stores.metadata(target.path, source)
                else:
                    self.stores.object(target.path, source)
                target = self.lookup(new_parent, new_name)
            else:
                if kind is Kind.CHUNK:
                    check_chunk(target.array, target.path, len(source))
                copy = Buffered(target.path, self.buffer.new(source), kind, shard, target.coords)
                self.overlay.put(copy)
            return target, self.attr(target)

    def truncate(self, node: Node, size: int) -> Attr:
        with self._locked():
            entry = self.overlay.pin(node.path)
            if isinstance(entry, Whiteout):
                raise NotFound(node.path)
            if entry is None:
                entry = self._copy_up(self._fresh_leaf(node), keep=size > 0, handles=1)
            try:
                self._truncate(entry, size)
                if entry.kind is Kind.PASSTHROUGH and self.overlay.entry(entry.path) is entry:
                    self.stores.entry(entry)  # no close will come to store it
            finally:
                self.overlay.unpin(entry)
            return self.attr(node)

    def reopen(self, handle: Handle, flags: int) -> Handle:
        """Another handle on the file of `handle`, wherever (or whether) it is in the view."""
        with self._locked():
            # NotFound if its last descriptor was closed while this waited for a thread.
            self.overlay.hold(handle.entry)
            if flags & os.O_TRUNC:
                try:
                    self._truncate(handle.entry, 0)
                except BaseException:
                    self.overlay.unpin(handle.entry)  # WouldBlock: held again by the retry
                    raise
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
        if entry.kind in STORED and entry.dirty:
            with self._locked():
                if self.overlay.entry(entry.path) is not entry or not entry.dirty:
                    return
                if entry.kind is Kind.PASSTHROUGH:
                    self.stores.entry(entry)
                    return
                generation, content = snapshot(entry)
                self.stores.metadata(entry.path, content)
                entry.committed = generation
        elif entry.kind is Kind.CHUNK:
            self._check_open_chunk(entry)

    def release(self, handle: Handle) -> None:
        """On the event loop, outside the inline-then-thread rule: never raises WouldBlock;
        the last handle of a spilled file that left the view unlinks its spool file."""
        self.overlay.unpin(handle.entry, closing=True)

    def fsync(self, handle: Handle) -> None:
        """Make the file durable: commit a chunk's shard now, store a metadata document.
        A chunk that cannot be stored (see `check_chunk`) fails with InvalidWrite, as on
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
                        self.stores.entry(entry)
            except ShardfsError as e:
                log.error("%s: could not be stored: %s", self.storage.describe(entry.path), e)
                failed += 1
        return failed

    # -- helpers ------------------------------------------------------------------------

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

    def _kind(self, node: Node) -> tuple[Kind, ShardRef | None]:
        """What an existing file of the view is, for writing; ReadOnly for other source files."""
        parent_path, _, name = node.path.rpartition("/")
        _, kind, shard = self.classifier.classify(self.resolve(parent_path), name)
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

    def _removable(self, node: Node, entry: Buffered | Whiteout | None) -> Kind:
        """The kind of the file at `node` (`entry` in the overlay), if it may leave its path."""
        kind = entry.kind if isinstance(entry, Buffered) else self._kind(node)[0]
        if kind is Kind.METADATA:
            raise ReadOnly(f"{node.path}: metadata documents cannot be removed through the mount")
        return kind

    def _detach(self, node: Node) -> None:
        """Take the file at `node` out of the view, freed unless a handle has it open; a
        chunk is marked deleted for its shard."""
        entry = self.overlay.entry(node.path)
        chunk = entry.shard if isinstance(entry, Buffered) and entry.kind is Kind.CHUNK else None
        if chunk is None and node.role is Role.CHUNK:
            chunk = self._kind(node)[1]
        self.overlay.discard(node.path)
        if chunk is not None:
            # Even if the source does not hold it yet: a commit may be storing it right now.
            self.overlay.put(Whiteout(node.path, chunk, node.coords))

    def _check_open_chunk(self, entry: Buffered) -> None:
        """`check_chunk` for an open chunk file, unless it left the view (unlinked or
        renamed over while open: it will not be stored)."""
        if entry.shard is None or self.overlay.entry(entry.path) is not entry:
            return
        array = self.ns.presentation.array_at(entry.shard[0])
        if array is not None:
            check_chunk(array, entry.path, entry.blob.size)
