"""Committing buffered chunks into their shards: one append (or one whole write) per shard.

A commit works from the shard as it is in the source at that moment, not
from a cached index: it reads the current index, adds the new chunks and a new
index after the old end (`shardfs.formats.shard_write`), and hands that to the
storage as an append conditional on the version it read. If another writer
(a second mount) changed the shard in between, the storage refuses and the
commit starts again from the new index, so neither writer's chunks are lost.
Shards that do not exist yet, shards with their index at the start and the
chunk objects of unsharded arrays are written whole instead.

Observers (`CommitObserver`) hear of every commit, whoever asked for it (the
commit loop, `fsync`, `fsyncdir`, the final commit): what is about to be
stored into a shard, before the storage is touched, and which chunks the shard
holds once it is durable. The chunks kept for the next mount
(`shardfs.writeback.leftover`) follow the commits that way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Hashable, Mapping
from typing import Protocol

import numpy as np

from shardfs.formats.shard_index import EMPTY
from shardfs.formats.shard_write import Buffer, ShardUpdate, append_update, whole_shard
from shardfs.formats.zarr_v3 import ShardLevel
from shardfs.primitives.blocking import WouldBlock, may_block
from shardfs.primitives.errors import (
    CorruptData,
    InvalidWrite,
    ReadOnly,
    SourceChanged,
    StorageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import ABSENT, Stat
from shardfs.view.namespace import ArrayView, Namespace
from shardfs.writeback.overlay import Buffered, Entry, Overlay, ShardRef

log = logging.getLogger("shardfs")

#: Chunk coordinates (of the whole array, not within the shard).
Coords = tuple[int, ...]


class CommitObserver(Protocol):
    """Told about every commit of a shard, under that shard's commit lock."""

    def storing(self, ref: ShardRef, chunks: Mapping[Coords, Buffer | None]) -> None:
        """The commit is about to store `chunks` (stored bytes; None for a deleted chunk)
        into shard `ref`. Whatever this raises ends the commit before the storage is
        touched (a `StorageError` fails it like any storage error)."""

    def stored(self, ref: ShardRef, coords: Collection[Coords]) -> None:
        """Shard `ref` now holds, durably, what `storing` announced for `coords` (or
        these chunks were discarded, unstorable, and will never be). Must not raise."""


class Committer:
    """Moves the overlay's dirty chunks into the source, one shard at a time.

    Commits of one shard are serialised in this process by a lock per shard;
    readers of the view wait for a shard that is being written (`wait_idle`)
    so they never read a half-written tail.
    """

    def __init__(self, namespace: Namespace, overlay: Overlay) -> None:
        self.ns = namespace
        self.storage = namespace.storage
        self.overlay = overlay
        self._locks: dict[ShardRef, threading.Lock] = {}
        self._writing: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._retry_at: dict[ShardRef, float] = {}  #: back-off of shards whose commit failed
        self._backoff: dict[ShardRef, float] = {}
        self.appends = 0  #: shard appends done (for benchmarks and tests)
        self.rewrites = 0  #: whole shards or chunk objects written
        #: chunks stored (or deleted) by commits, and the bytes of those stored
        self.chunks = 0
        self.chunk_bytes = 0
        #: told about every commit (see `CommitObserver`)
        self.observers: list[CommitObserver] = []

    def _count(self, what: str) -> None:
        with self._guard:  # commits of different shards run at once
            setattr(self, what, getattr(self, what) + 1)

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats`."""
        with self._guard:
            return {
                "appends": self.appends,
                "rewrites": self.rewrites,
                "chunks": self.chunks,
                "chunk_bytes": self.chunk_bytes,
            }

    # -- readers ---------------------------------------------------------------------

    def wait_idle(self, key: str) -> None:
        """Return once no commit of this process is writing storage object `key`."""
        lock = self._writing.get(key)
        if lock is None:
            return
        if not lock.acquire(blocking=may_block()):
            raise WouldBlock
        lock.release()

    # -- commits -----------------------------------------------------------------------

    def commit(self, ref: ShardRef, include_open: bool = True) -> list[Buffered]:
        """Store the dirty chunks of shard `ref`. Chunks a writer still holds open are
        left for later unless `include_open` (an fsync). Returns the chunks discarded
        because they cannot be stored (each logged)."""
        with self._guard:
            lock = self._locks.setdefault(ref, threading.Lock())
        with lock:
            changes = self.overlay.changes(ref)
            if not include_open:
                changes = {
                    c: e for c, e in changes.items() if not (isinstance(e, Buffered) and e.handles)
                }
            if not changes:
                return []
            array = self.ns.presentation.array_at(ref[0])
            if array is None:
                raise InvalidWrite(
                    f"{ref[0]} is no longer an array; its buffered chunks cannot be stored"
                )
            done, chunks, discarded = self._snapshot(array, changes)
            if chunks:
                for observer in self.observers:
                    observer.storing(ref, chunks)
                data = {self._slot(array, coords): d for coords, d in chunks.items()}
                self._store(array, ref[1], data)
                with self._guard:
                    self.chunks += len(data)
                    self.chunk_bytes += sum(memoryview(d).nbytes for d in data.values() if d)
            self.overlay.committed(ref, done)
            for observer in self.observers:
                observer.stored(ref, list(done))
            return discarded

    def commit_all(self, include_open: bool = True) -> int:
        """Commit every dirty shard now; returns the number that failed (each logged)."""
        return self._commit_many([ref for ref, _ in self.overlay.dirty_shards()], include_open)

    def due(self, age: float) -> bool:
        """Whether some shard's oldest change is `age` seconds old (and not in back-off)."""
        return bool(self._due(age))

    def commit_due(self, age: float) -> int:
        """Commit the shards that are `due`, leaving chunks still open for writing."""
        return self._commit_many(self._due(age), include_open=False)

    def _due(self, age: float) -> list[ShardRef]:
        now = time.monotonic()
        return [
            ref
            for ref, since in self.overlay.dirty_shards()
            if now - since >= age and self._retry_at.get(ref, 0.0) <= now
        ]

    def _commit_many(self, refs: list[ShardRef], include_open: bool) -> int:
        failed = 0
        for ref in refs:
            try:
                self.commit(ref, include_open)
                self._retry_at.pop(ref, None)
                self._backoff.pop(ref, None)
            except (StorageError, InvalidWrite, ReadOnly, CorruptData) as e:
                failed += 1
                delay = self._back_off(ref)
                if not e.logged:
                    log.error(
                        "commit of %s failed (next try in %.0f s): %s",
                        self._describe(ref),
                        delay,
                        e,
                    )
            except Exception:
                # A bug must not end the commit loop (and with it the daemon, losing every
                # buffered chunk): it fails this shard like any other error, with its traceback.
                failed += 1
                delay = self._back_off(ref)
                log.exception(
                    "commit of shard %s of %s failed unexpectedly (next try in %.0f s)",
                    ref[1],
                    ref[0],
                    delay,
                )
        return failed

    def _back_off(self, ref: ShardRef) -> float:
        """Put off the next commit of `ref` (doubling each time, up to a minute)."""
        delay = min(60.0, self._backoff.get(ref, 0.5) * 2)
        self._backoff[ref] = delay
        self._retry_at[ref] = time.monotonic() + delay
        return delay

    def _describe(self, ref: ShardRef) -> str:
        array = self.ns.presentation.array_at(ref[0])
        if array is None:
            return f"a shard of {ref[0]}"
        return self.storage.describe(self.ns.shards.key(array, ref[1]))

    @staticmethod
    def _slot(array: ArrayView, coords: Coords) -> int:
        """The level-0 index slot of chunk `coords` in its shard (0 for a chunk object)."""
        layout = array.layout
        if not layout.levels:
            return 0
        cps = layout.chunks_per_shard
        local = tuple(c % n for c, n in zip(coords, cps, strict=True))
        return int(array.slots[0][int(np.ravel_multi_index(local, cps))])

    def _snapshot(
        self, array: ArrayView, changes: dict[Coords, Entry]
    ) -> tuple[dict[Coords, tuple[Entry, int]], dict[Coords, Buffer | None], list[Buffered]]:
        """(entries with the generation stored, stored bytes or None by coordinates, the
        chunks discarded because they cannot be stored)."""
        done: dict[Coords, tuple[Entry, int]] = {}
        chunks: dict[Coords, Buffer | None] = {}
        discarded: list[Buffered] = []
        for coords, entry in changes.items():
            if not isinstance(entry, Buffered):
                done[coords], chunks[coords] = (entry, 0), None
                continue
            taken = entry.blob.snapshot()
            if taken is None:
                continue  # removed or replaced since the changes were listed: nothing to store
            generation, content = taken
            if array.v2 is not None:
                try:
                    content = array.v2.store(content)
                except ValueError as e:
                    log.error(
                        "%s: discarded, it cannot be stored: %s", entry.path, e
                    )  # the writer got EINVAL when it closed or fsynced the file
                    done[coords] = (entry, generation)
                    discarded.append(entry)
                    continue
            done[coords], chunks[coords] = (entry, generation), content
        return done, chunks, discarded

    def _store(
        self, array: ArrayView, shard: tuple[int, ...], data: dict[int, Buffer | None]
    ) -> None:
        key = self.ns.shards.key(array, shard)
        layout = array.layout
        if len(layout.levels) > 1:
            raise ReadOnly(f"{array.key}: writes to arrays with nested sharding are not supported")
        with self._guard:
            writing = self._writing.setdefault(key, threading.Lock())
        for _ in attempts():
            stat = self.storage.stat(key)
            if stat is not None and stat.is_dir:
                raise InvalidWrite(f"{self.storage.describe(key)} is a directory, not a shard")
            try:
                with writing:
                    self._write(key, layout.levels[0] if layout.levels else None, stat, data)
                return
            except SourceChanged:
                continue
        raise StorageError(f"{self.storage.describe(key)} kept changing; commit not done")

    def _write(
        self, key: str, level: ShardLevel | None, stat: Stat | None, data: dict[int, Buffer | None]
    ) -> None:
        expect: Hashable = ABSENT if stat is None else stat.version
        if level is None:  # an unsharded array: the object is the chunk
            content = data[0]
            if content is not None:
                self.storage.put(key, [content], expect)
                self._count("rewrites")
            elif stat is not None:
                self.storage.delete(key, expect)
            return
        if stat is None:
            chunks = {s: d for s, d in data.items() if d is not None}
            if chunks:
                self.storage.put(key, whole_shard(level, chunks).parts, expect)
                self._count("rewrites")
            return
        index = self._index(key, level, stat)
        data = {s: d for s, d in data.items() if d is not None or index[s, 1] != EMPTY}
        if not data:
            return  # only deletions of chunks the shard does not hold
        if level.index_at_start:
            update = self._rewrite(key, level, stat, index, data)
        else:
            update = append_update(level, index, stat.size, data)
        if update.empty:
            self.storage.delete(key, expect)  # no chunk left: like zarr-python, drop the shard
        elif update.whole:
            self.storage.put(key, update.parts, expect)
            self._count("rewrites")
        else:
            self.storage.append(key, update.parts, expect)
            self._count("appends")

    def _index(self, key: str, level: ShardLevel, stat: Stat) -> np.ndarray:
        """The shard's current level-0 index, flat, read now (never from a cache)."""
        try:
            at = level.index_offset(stat.size)
            raw = self.storage.read(key, at, level.index_size, stat.version)
            index = level.decode_index(raw, stat.size)
        except CorruptData as e:
            raise CorruptData(
                f"{self.storage.describe(key)}: corrupt shard, not written to: {e}"
            ) from None
        return index

    def _rewrite(
        self,
        key: str,
        level: ShardLevel,
        stat: Stat,
        index: np.ndarray,
        data: dict[int, Buffer | None],
    ) -> ShardUpdate:
        """The shard rewritten whole with `data` applied (its index is at the start)."""
        old = memoryview(self.storage.read(key, 0, stat.size, stat.version))
        chunks: dict[int, Buffer] = {}
        for slot, (offset, nbytes) in enumerate(index.tolist()):
            if nbytes != int(EMPTY) and slot not in data:
                chunks[slot] = old[offset : offset + nbytes]
        chunks.update({s: d for s, d in data.items() if d is not None})
        return whole_shard(level, chunks)
