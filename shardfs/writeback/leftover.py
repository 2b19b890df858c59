"""Pending chunks a mount could not commit before it stopped, kept on disk for the next mount.

A daemon commits everything it buffers before it exits. When the commit of a
shard fails (the store is unreachable, the shard is corrupt), its pending
chunks are written to a directory of the source's own, one file per shard, in
the form the shard stores them (whatever the view), so they are not lost. The
next read-write mount of the same source puts them back into its overlay:
readers see them, the committer commits them like any pending chunk, and newer
writes replace them.

Whatever commits a kept chunk forgets it (the commit loop, `fsync`, `fsyncdir`,
the final commit: `Leftovers` observes the committer). Before a commit stores
chunks whose coordinates a kept file holds, the file is rewritten (durably) to
hold what is being stored there (or the deletion); once the shard holds them,
those coordinates leave the file, and a file left with none is removed. So at
every instant a kept file holds, for each of its chunks, what the source holds
or something newer: a daemon killed at any moment loses nothing of them, and
the next mount never puts older bytes over newer ones. A chunk still pending
(open for writing, or its commit failed) stays in its file.

Only one running mount takes a source's kept chunks up (`claim`): two would both
commit them, and the later commit would put the kept bytes back over newer ones
that the other had committed since. Another read-write mount of the source
leaves them to the one that has them, and keeps what it cannot commit itself in
files of its own names, next to theirs; the next mount takes all of them up.

File layout: one JSON line `{"format": 1, "array": KEY, "chunks": [[COORDS,
SIZE], ...]}` (SIZE -1 for a deleted chunk), then the chunks' bytes in that
order. Files are written to a temporary name, made durable and renamed.

The directories are the daemon user's alone (0700, files 0600, never opened
through a symlink; `shardfs.primitives.private`): another user who could
change them could make the next mount commit bytes of their choosing. One that
is not is refused, and the mount with it, with one line saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

from shardfs.formats.shard_write import Buffer
from shardfs.primitives.errors import ShardfsError, StorageError
from shardfs.primitives.private import UnsafeState, open_private, private_dir
from shardfs.view.hierarchy import join
from shardfs.view.presentation import View
from shardfs.writeback.overlay import Buffered, Kind, ShardRef, Whiteout
from shardfs.writeback.workspace import Workspace

log = logging.getLogger("shardfs")

FORMAT = 1
SUFFIX = ".pending"

Coords = tuple[int, ...]
#: (chunk coordinates, stored bytes or None for a deleted chunk)
Chunk = tuple[Coords, bytes | None]


def _file_name(ref: ShardRef) -> str:
    return hashlib.sha256(json.dumps([ref[0], list(ref[1])]).encode()).hexdigest()[:24] + SUFFIX


@dataclass
class _Kept:
    """What one kept file taken up by this mount holds, as it is on disk."""

    key: str  #: the array
    chunks: dict[Coords, bytes | None]  #: stored bytes (None: deleted) by coordinates
    shards: dict[Coords, ShardRef]  #: the shard of each chunk taken up


class Leftovers:
    """The kept chunks of one source, in `directory` (made when something is kept).

    `restore` takes them up into a workspace and observes its committer from then on
    (`storing`, `stored`); `save` keeps what the final commit could not commit.
    """

    def __init__(self, directory: str, source: str) -> None:
        self.directory = directory
        self.source = source
        #: file name -> what it holds, for the files taken up (see `restore`)
        self._kept: dict[str, _Kept] = {}
        #: shard -> names of the files taken up that hold chunks of it
        self._shards: dict[ShardRef, set[str]] = {}
        self._lock = threading.Lock()  #: commits of different shards run at once
        #: the descriptor holding the claim (see `claim`), for the daemon's life
        self._claim: int | None = None

    def claim(self) -> bool:
        """Take this source's kept chunks for the daemon's life (an `flock` on a file next
        to their directory, which the kernel drops when the daemon ends); False if another
        running mount holds them."""
        path = self.directory + ".lock"
        while True:
            _private_dir(os.path.dirname(self.directory))
            if os.path.lexists(self.directory):
                _private_dir(self.directory)  # checked: what restore reads comes from it
            try:
                fd = open_private(path, os.O_RDWR | os.O_CREAT)
            except FileNotFoundError:
                continue  # its directory was removed as another mount left (see `save`)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                named = os.stat(path)
            except FileNotFoundError:
                named = None
            mine = os.fstat(fd)
            if named is not None and (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino):
                self._claim = fd
                return True
            os.close(fd)  # its holder removed it as it left (see `save`): take the new one

    def restore(self, workspace: Workspace) -> None:
        """Put every kept chunk back into the workspace's overlay (before it serves
        anything), and follow the workspace's commits from now on. Files that cannot be
        taken up are left as they are, with a log line."""
        for name in self._names():
            path = os.path.join(self.directory, name)
            try:
                key, chunks = _read(path)
            except (OSError, ValueError) as e:
                log.error("kept chunks %s cannot be read, left as they are: %s", path, e)
                continue
            shards = _put_back(workspace, key, chunks)
            if shards is None:
                log.error(
                    "kept chunks %s belong to %s, which is no longer an array; left as they are",
                    path,
                    key or "/",
                )
                continue
            kept = _Kept(key, {c: d for c, d in chunks if c in shards}, shards)
            self._kept[name] = kept
            for ref in set(shards.values()):
                self._shards.setdefault(ref, set()).add(name)
            log.warning(
                "chunks of %s that an earlier mount could not commit are pending again: %d",
                key or "/",
                len(kept.chunks),
            )
            if not kept.chunks:  # every one dropped: nothing of this file is pending
                try:
                    self._update(name, {})
                except OSError as e:
                    log.error("cannot remove %s: %s", path, e)
        workspace.committer.observers.append(self)

    # -- following the commits (see `shardfs.writeback.commit.CommitObserver`) -----------

    def storing(self, ref: ShardRef, chunks: Mapping[Coords, Buffer | None]) -> None:
        """Before shard `ref` gets `chunks`: every kept file holding some of these
        coordinates is rewritten to hold what is stored now, so that a kill during or
        after the commit leaves it holding nothing older than the source."""
        with self._lock:
            for name in sorted(self._shards.get(ref, ())):
                kept = self._kept[name]
                changed = {
                    coords: None if data is None else bytes(data)
                    for coords, data in chunks.items()
                    if coords in kept.chunks and kept.shards[coords] == ref
                }
                changed = {c: d for c, d in changed.items() if kept.chunks[c] != d}
                if not changed:
                    continue
                try:
                    self._update(name, {**kept.chunks, **changed})
                except OSError as e:
                    raise StorageError(
                        f"cannot update the kept chunks {os.path.join(self.directory, name)} "
                        f"before the commit: {e}"
                    ) from None

    def stored(self, ref: ShardRef, coords: Collection[Coords]) -> None:
        """Shard `ref` holds `coords` now: the kept files drop them (a file left with
        none is removed). If that fails the file keeps them, which is harmless: it holds
        what the source holds, and the next commit or unmount tries again."""
        with self._lock:
            for name in sorted(self._shards.get(ref, ())):
                kept = self._kept[name]
                done = {c for c in coords if c in kept.chunks and kept.shards[c] == ref}
                if not done:
                    continue
                try:
                    self._update(name, {c: d for c, d in kept.chunks.items() if c not in done})
                except OSError as e:
                    log.error(
                        "cannot drop committed chunks from %s (they are committed; it will be "
                        "tried again): %s",
                        os.path.join(self.directory, name),
                        e,
                    )

    # -- the end of the mount ---------------------------------------------------------------

    def save(self, workspace: Workspace) -> list[ShardRef]:
        """Keep the pending chunks of every shard still dirty (after the final commit);
        returns the shards kept. Kept chunks taken up that are no longer pending were
        committed and leave their files."""
        with self._lock:
            kept: list[ShardRef] = []
            pending = {ref for ref, _ in workspace.overlay.dirty_shards()}
            # What files taken up still hold and is still pending, by shard. A chunk whose
            # newer content has no stored form now (the v2 metadata cannot be read) keeps
            # the kept one: still newer than what the source holds.
            earlier: dict[ShardRef, dict[Coords, bytes | None]] = {}
            for kept_file in self._kept.values():
                for coords, data in kept_file.chunks.items():
                    ref = kept_file.shards[coords]
                    if ref in pending and coords in workspace.overlay.changes(ref):
                        earlier.setdefault(ref, {})[coords] = data
            written: set[str] = set()
            for ref in sorted(pending, key=repr):
                chunks = dict(earlier.get(ref, {}))
                chunks.update(_stored_chunks(workspace, ref))
                if not chunks:
                    continue
                _private_dir(self.directory)
                name = self._save_name(ref)
                _write(os.path.join(self.directory, name), ref[0], sorted(chunks.items()))
                written.add(name)
                kept.append(ref)
            if kept:
                fd = open_private(
                    os.path.join(self.directory, "source"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                )
                with open(fd, "w") as f:
                    f.write(self.source + "\n")
            for name in list(self._kept):
                if name not in written:  # all its chunks were committed
                    path = os.path.join(self.directory, name)
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                    except OSError as e:  # harmless: it holds what the source holds
                        log.error("cannot remove %s, whose chunks are committed: %s", path, e)
                self._forget(name)
            if not self._names():  # nothing kept any more: no trace of this source either
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, "source"))
                with contextlib.suppress(OSError):
                    os.rmdir(self.directory)
                if self._claim is not None:  # removed while held: see `claim`
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.directory + ".lock")
                    with contextlib.suppress(OSError):  # unless other sources keep some
                        os.rmdir(os.path.dirname(self.directory))
            return kept

    def _save_name(self, ref: ShardRef) -> str:
        """The file to keep shard `ref`'s chunks in: its own name, unless a file there holds
        chunks this mount did not take up (another mount's, which must not be overwritten);
        then a name of its own, made exclusively."""
        name = _file_name(ref)
        if name in self._kept:
            return name
        while True:
            try:
                path = os.path.join(self.directory, name)
                os.close(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
                return name
            except FileExistsError:
                name = f"{name.removesuffix(SUFFIX)}.{secrets.token_hex(4)}{SUFFIX}"

    def waiting(self) -> int:
        """How many shards have chunks kept here (for mounts that do not take them up)."""
        return len(self._names())

    def _update(self, name: str, chunks: dict[Coords, bytes | None]) -> None:
        """Make kept file `name` hold `chunks` (durably), or remove it if there are none.
        What is recorded follows the disk as soon as it changed there."""
        kept = self._kept[name]
        path = os.path.join(self.directory, name)
        if chunks:
            _write(path, kept.key, sorted(chunks.items()), on_renamed=lambda: _set(kept, chunks))
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._forget(name)
        _sync_dir(self.directory)

    def _forget(self, name: str) -> None:
        kept = self._kept.pop(name)
        for ref in set(kept.shards.values()):
            names = self._shards.get(ref)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._shards[ref]

    def _names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if n.endswith(SUFFIX))
        except FileNotFoundError:
            return []


def _set(kept: _Kept, chunks: dict[Coords, bytes | None]) -> None:
    kept.chunks = dict(chunks)


def _stored_chunks(workspace: Workspace, ref: ShardRef) -> Iterator[Chunk]:
    """The pending chunks of shard `ref` in stored form. The v3 view shows chunks as
    stored; only the v2 view needs the array (whose metadata may be unreachable now,
    the very reason the commit failed)."""
    array = None
    if workspace.ns.view is View.V2:
        try:
            array = workspace.ns.presentation.array_at(ref[0])
        except ShardfsError as e:
            log.error("the metadata of %s cannot be read: %s", ref[0] or "/", e)
    for coords, entry in sorted(workspace.overlay.changes(ref).items()):
        if isinstance(entry, Whiteout):
            yield coords, None
            continue
        content = entry.blob.getvalue()
        if workspace.ns.view is View.V2:
            if array is None or array.v2 is None:
                log.error("%s: lost, the stored form of this v2 chunk is unknown", entry.path)
                continue
            try:
                content = array.v2.store(content)
            except ValueError as e:
                log.error("%s: discarded, it cannot be stored: %s", entry.path, e)
                continue
        yield coords, content


def _put_back(workspace: Workspace, key: str, chunks: list[Chunk]) -> dict[Coords, ShardRef] | None:
    """Kept chunks of array `key` as pending entries of the overlay; the shard of each
    chunk put back, or None if `key` is not an array of the view any more."""
    array = workspace.ns.presentation.array_at(key)
    if array is None:
        return None
    layout, refs = array.layout, {}
    for coords, stored in chunks:
        if len(coords) != layout.ndim or not layout.in_bounds(coords):
            log.error("a kept chunk %s of %s lies outside the array now; dropped", coords, key)
            continue
        path = join(array.key, array.names.encode(coords))
        ref = (array.key, layout.shard_of(coords)[0])
        if stored is None:
            workspace.overlay.put(Whiteout(path, ref, coords))
        else:
            content = array.v2.serve(stored) if array.v2 is not None else stored
            blob = workspace.buffer.new(content)
            workspace.overlay.put(Buffered(path, blob, Kind.CHUNK, ref, coords))
        refs[coords] = ref
    return refs


def _write(
    path: str, key: str, chunks: list[Chunk], on_renamed: Callable[[], None] | None = None
) -> None:
    """Write a kept file durably: a temp file made durable, renamed over `path`, the
    directory made durable (`on_renamed` is called once the rename is done)."""
    header = {
        "format": FORMAT,
        "array": key,
        "chunks": [[list(c), -1 if d is None else len(d)] for c, d in chunks],
    }
    temp = path + ".tmp"
    with open(open_private(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        for _, data in chunks:
            if data is not None:
                f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(temp, path)
    if on_renamed is not None:
        on_renamed()
    _sync_dir(os.path.dirname(path))


def _private_dir(path: str) -> None:
    """Make directory `path` of kept chunks (0700) if it is missing; UnsafeState, naming it
    and why, if another user could change what is in it (and so what the next mount
    commits)."""
    try:
        private_dir(path)
    except UnsafeState as e:
        raise UnsafeState(f"directory of kept chunks {e}") from None


def _sync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str) -> tuple[str, list[Chunk]]:
    """(array key, chunks) of a kept file; ValueError if it is not one."""
    with open(open_private(path, os.O_RDONLY), "rb") as f:
        header = json.loads(f.readline())
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError("not a file of kept chunks (format 1)")
        chunks: list[Chunk] = []
        for coords, size in header["chunks"]:
            data = None if size < 0 else f.read(size)
            if data is not None and len(data) != size:
                raise ValueError("cut short")
            chunks.append((tuple(int(c) for c in coords), data))
    return str(header["array"]), chunks
