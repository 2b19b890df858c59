"""What the mount has been told but the source does not hold yet, by view path.

The overlay sits on top of the source's view: buffered files (chunks waiting
for their commit, files being written that are stored as written when closed,
and scratch files that never reach the source), deleted
chunks waiting for theirs, and directories made by `mkdir` that exist only in
the view. It also tracks which shards have uncommitted changes and since
when, which is what the committer works from, and how many handles have each
buffered file: the last one out frees it. One lock guards it all; the methods
are short and do no I/O but unlink the spool file of a spilled blob they free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, auto

from shardfs.primitives.errors import NotFound
from shardfs.view.hierarchy import join
from shardfs.writeback.buffer import Blob

#: (array key, shard coordinates): one shard, or one chunk object of an unsharded array.
ShardRef = tuple[str, tuple[int, ...]]


class Kind(Enum):
    SCRATCH = auto()  #: a file only the mount holds (temp files, anything not a node or chunk)
    CHUNK = auto()  #: a chunk of an array, committed into its shard
    METADATA = auto()  #: a metadata document, stored when it is closed or renamed into place
    #: a file at a chunk key of an array the view shows unchanged: stored whole, as written,
    #: at the same key when it is closed, renamed into place, linked or fsynced
    PASSTHROUGH = auto()


#: Kinds of files stored in the source when they are closed, renamed into place or fsynced.
STORED = (Kind.METADATA, Kind.PASSTHROUGH)


@dataclass(eq=False)
class Buffered:
    """A file whose content is a blob. A chunk is dirty while `committed` is not the
    blob's generation; open handles keep even a clean entry in the overlay, so
    their later writes are not lost."""

    path: str
    blob: Blob
    kind: Kind
    shard: ShardRef | None = None
    coords: tuple[int, ...] = ()
    handles: int = 0
    committed: int = -1

    @property
    def dirty(self) -> bool:
        return self.committed != self.blob.generation


@dataclass(eq=False)
class Whiteout:
    """A chunk deleted through the mount whose shard still holds it."""

    path: str
    shard: ShardRef
    coords: tuple[int, ...]


Entry = Buffered | Whiteout


@dataclass
class Dirty:
    """The uncommitted changes of one shard, by chunk coordinates."""

    since: float = field(default_factory=time.monotonic)
    chunks: dict[tuple[int, ...], Entry] = field(default_factory=dict)


class Overlay:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._dirs: dict[str, int] = {}
        self._children: dict[str, set[str]] = {}
        self._dirty: dict[ShardRef, Dirty] = {}

    # -- paths ------------------------------------------------------------------

    def entry(self, path: str) -> Entry | None:
        return self._entries.get(path)

    def is_dir(self, path: str) -> bool:
        return path in self._dirs

    def dir_mtime(self, path: str) -> int:
        return self._dirs[path]

    def names(self, path: str) -> set[str]:
        """Names the overlay holds directly below `path` (files, whiteouts, directories)."""
        return set(self._children.get(path, ()))

    def has_children(self, path: str) -> bool:
        return any(
            not isinstance(self._entries.get(join(path, n)), Whiteout)
            for n in self._children.get(path, ())
        )

    def put(self, entry: Entry) -> Entry | None:
        """Place `entry` at its path; returns the entry it replaces (no longer tracked)."""
        with self.lock:
            old = self._entries.get(entry.path)
            if old is not None:
                self._untrack(old)
            self._entries[entry.path] = entry
            self._link(entry.path)
            self.mark(entry)
            return old

    def remove(self, path: str) -> Entry | None:
        with self.lock:
            entry = self._entries.pop(path, None)
            if entry is not None:
                self._untrack(entry)
                if path not in self._dirs:
                    self._unlink(path)
            return entry

    def add_dir(self, path: str) -> None:
        with self.lock:
            self._dirs[path] = time.time_ns()
            self._link(path)

    def remove_dir(self, path: str) -> None:
        with self.lock:
            self._dirs.pop(path, None)
            if path not in self._entries:
                self._unlink(path)

    def _link(self, path: str) -> None:
        parent, _, name = path.rpartition("/")
        self._children.setdefault(parent, set()).add(name)

    def _unlink(self, path: str) -> None:
        parent, _, name = path.rpartition("/")
        names = self._children.get(parent)
        if names is not None:
            names.discard(name)
            if not names:
                del self._children[parent]

    # -- handles ------------------------------------------------------------------

    def pin(self, path: str) -> Entry | None:
        """The entry at `path`; a buffered one with one handle more, taken in the same
        step, so that neither a commit nor the last close of another handle frees it while
        a change works on it. Every pin is undone by `unpin` (or kept by a handle)."""
        with self.lock:
            entry = self._entries.get(path)
            if isinstance(entry, Buffered):
                entry.handles += 1
            return entry

    def hold(self, entry: Buffered) -> None:
        """One handle more on an entry an open handle had, wherever (or whether) it is in
        the overlay; NotFound if its last handle was closed since and it left the overlay
        (its blob is freed)."""
        with self.lock:
            if not entry.handles and self._entries.get(entry.path) is not entry:
                raise NotFound(entry.path)
            entry.handles += 1

    def unpin(self, entry: Buffered, closing: bool = False) -> None:
        """One handle fewer. After the last one, a clean chunk or file stored as written
        (and, `closing` a file, a metadata document or a file stored as written whose store
        failed: its writer was told at close) leaves the overlay: the source holds it. An
        entry no longer in the overlay is freed."""
        with self.lock:
            entry.handles -= 1
            if entry.handles:
                return
            tracked = self._entries.get(entry.path) is entry
            if tracked and (
                (closing and entry.kind in STORED)
                or (entry.kind in (Kind.CHUNK, Kind.PASSTHROUGH) and not entry.dirty)
            ):
                self.remove(entry.path)
                tracked = False
            if not tracked:
                entry.blob.release()

    def discard(self, path: str) -> Entry | None:
        """`remove`, and free the blob of a buffered file no handle has open."""
        with self.lock:
            entry = self.remove(path)
            if isinstance(entry, Buffered) and entry.handles == 0:
                entry.blob.release()
            return entry

    # -- dirty shards ---------------------------------------------------------------

    def mark(self, entry: Entry) -> None:
        """Record that `entry` (a chunk) has changes its shard does not hold yet."""
        if entry.shard is None:
            return
        with self.lock:
            if self._entries.get(entry.path) is not entry:
                return  # unlinked while open: its writes go nowhere
            dirty = self._dirty.get(entry.shard)
            if dirty is None:
                dirty = self._dirty[entry.shard] = Dirty()
            dirty.chunks[entry.coords] = entry

    def _untrack(self, entry: Entry) -> None:
        if entry.shard is None:
            return
        dirty = self._dirty.get(entry.shard)
        if dirty is not None and dirty.chunks.get(entry.coords) is entry:
            del dirty.chunks[entry.coords]
            if not dirty.chunks:
                del self._dirty[entry.shard]

    def dirty_shards(self) -> list[tuple[ShardRef, float]]:
        """Every shard with uncommitted changes and when it first got them."""
        with self.lock:
            return [(ref, d.since) for ref, d in self._dirty.items()]

    def changes(self, shard: ShardRef) -> dict[tuple[int, ...], Entry]:
        """A snapshot of the uncommitted chunks of `shard`."""
        with self.lock:
            dirty = self._dirty.get(shard)
            return dict(dirty.chunks) if dirty is not None else {}

    def committed(self, shard: ShardRef, done: dict[tuple[int, ...], tuple[Entry, int]]) -> None:
        """The shard now holds `done` (coords -> entry and the generation stored).

        Entries changed since their snapshot stay dirty; clean ones leave the
        overlay unless a handle still has them open. Entries that are no longer
        the change of these coordinates (removed, replaced, or renamed elsewhere
        while the commit wrote) are left alone: what now stands there is still
        pending, and a renamed entry is still to be stored at its new place.
        """
        with self.lock:
            dirty = self._dirty.get(shard)
            for coords, (entry, generation) in done.items():
                if dirty is None or dirty.chunks.get(coords) is not entry:
                    continue
                if isinstance(entry, Buffered):
                    entry.committed = generation
                    if entry.dirty:
                        continue
                del dirty.chunks[coords]
                if self._entries.get(entry.path) is entry and (
                    isinstance(entry, Whiteout) or entry.handles == 0
                ):
                    del self._entries[entry.path]
                    if entry.path not in self._dirs:
                        self._unlink(entry.path)
                    if isinstance(entry, Buffered):
                        entry.blob.release()
            if dirty is not None and not dirty.chunks:
                del self._dirty[shard]

    def __iter__(self) -> Iterator[Entry]:
        with self.lock:
            return iter(list(self._entries.values()))
