"""Pending chunks a mount could not commit before it stopped, kept on disk for the next mount.

A daemon commits everything it buffers before it exits. When the commit of a
shard fails (the store is unreachable, the shard is corrupt), its pending
chunks are written to a directory of the source's own, one file per shard, in
the form the shard stores them (whatever the view), so they are not lost. The
next read-write mount of the same source puts them back into its overlay:
readers see them, the committer commits them like any pending chunk, and newer
writes replace them. A file is removed once its shard has no pending change
left; until then it stays, so a killed daemon loses nothing of it either.

File layout: one JSON line `{"format": 1, "array": KEY, "chunks": [[COORDS,
SIZE], ...]}` (SIZE -1 for a deleted chunk), then the chunks' bytes in that
order. Files are written to a temporary name, made durable and renamed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator

from shardfs.errors import ShardfsError
from shardfs.view.hierarchy import join
from shardfs.view.namespace import View
from shardfs.writeback.overlay import Buffered, Kind, ShardRef, Whiteout
from shardfs.writeback.workspace import Workspace

log = logging.getLogger("shardfs")

FORMAT = 1
SUFFIX = ".pending"

#: (chunk coordinates, stored bytes or None for a deleted chunk)
Chunk = tuple[tuple[int, ...], bytes | None]


def _file_name(ref: ShardRef) -> str:
    return hashlib.sha256(json.dumps([ref[0], list(ref[1])]).encode()).hexdigest()[:24] + SUFFIX


class Leftovers:
    """The kept chunks of one source, in `directory` (made when something is kept)."""

    def __init__(self, directory: str, source: str) -> None:
        self.directory = directory
        self.source = source
        #: file name -> the shards its chunks were put back into (see `restore`)
        self._files: dict[str, set[ShardRef]] = {}

    def restore(self, workspace: Workspace) -> None:
        """Put every kept chunk back into the workspace's overlay (before it serves
        anything). Files that cannot be taken up are left as they are, with a log line."""
        for name in self._names():
            path = os.path.join(self.directory, name)
            try:
                key, chunks = _read(path)
            except (OSError, ValueError) as e:
                log.error("kept chunks %s cannot be read, left as they are: %s", path, e)
                continue
            refs = _put_back(workspace, key, chunks)
            if refs is None:
                log.error(
                    "kept chunks %s belong to %s, which is no longer an array; left as they are",
                    path,
                    key or "/",
                )
                continue
            self._files[name] = refs
            log.warning(
                "chunks of %s that an earlier mount could not commit are pending again: %d",
                key or "/",
                len(chunks),
            )

    def prune(self, workspace: Workspace) -> None:
        """Remove the files whose shards have all been committed since they were taken up."""
        dirty = {ref for ref, _ in workspace.overlay.dirty_shards()}
        for name, refs in list(self._files.items()):
            if not refs & dirty:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, name))
                del self._files[name]

    def save(self, workspace: Workspace) -> list[ShardRef]:
        """Keep the pending chunks of every shard still dirty (after the final commit) and
        drop the files of shards committed since; returns the shards kept."""
        kept: list[ShardRef] = []
        written: set[str] = set()
        for ref, _ in workspace.overlay.dirty_shards():
            chunks = list(_stored_chunks(workspace, ref))
            if not chunks:
                continue
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            name = _file_name(ref)
            _write(os.path.join(self.directory, name), ref[0], chunks)
            written.add(name)
            kept.append(ref)
        if kept:
            with open(os.path.join(self.directory, "source"), "w") as f:
                f.write(self.source + "\n")
        for name in self._names():
            if name not in written and name in self._files:
                os.unlink(os.path.join(self.directory, name))
        if not self._names():  # nothing kept any more: no trace of this source either
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, "source"))
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)
        return kept

    def waiting(self) -> int:
        """How many shards have chunks kept here (for mounts that do not take them up)."""
        return len(self._names())

    def _names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if n.endswith(SUFFIX))
        except FileNotFoundError:
            return []


def _stored_chunks(workspace: Workspace, ref: ShardRef) -> Iterator[Chunk]:
    """The pending chunks of shard `ref` in stored form. The v3 view shows chunks as
    stored; only the v2 view needs the array (whose metadata may be unreachable now,
    the very reason the commit failed)."""
    array = None
    if workspace.ns.view is View.V2:
        try:
            array = workspace.ns.array_at(ref[0])
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


def _put_back(workspace: Workspace, key: str, chunks: list[Chunk]) -> set[ShardRef] | None:
    """Kept chunks of array `key` as pending entries of the overlay; the shards they fall
    in, or None if `key` is not an array of the view any more."""
    array = workspace.ns.array_at(key)
    if array is None:
        return None
    layout, refs = array.layout, set()
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
        refs.add(ref)
    return refs


def _write(path: str, key: str, chunks: list[Chunk]) -> None:
    header = {
        "format": FORMAT,
        "array": key,
        "chunks": [[list(c), -1 if d is None else len(d)] for c, d in chunks],
    }
    temp = path + ".tmp"
    with open(temp, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        for _, data in chunks:
            if data is not None:
                f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(temp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str) -> tuple[str, list[Chunk]]:
    """(array key, chunks) of a kept file; ValueError if it is not one."""
    with open(path, "rb") as f:
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
