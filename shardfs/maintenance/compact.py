"""`compact`: rewrite shards that appends have left mostly dead, to give the space back.

A read-write mount commits chunks as appends, so every commit leaves the
replaced chunks and the old index behind as dead bytes. Compacting a shard
writes it anew with only its live chunks, copied byte for byte in slot order
(`whole_shard`), its index where the array's metadata puts it.

Safe next to read-write mounts and other writers: the new shard is built from
the index read at one version and stored with `Storage.put` conditional on
that version, so if anyone changed the shard in between the put fails and the
shard is read again (a few times, then left for a later run). A shard whose
index does not verify is never rewritten, since that could turn damage into a
valid shard that silently lacks chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from shardfs.formats.shard_index import EMPTY
from shardfs.formats.shard_write import whole_shard
from shardfs.formats.zarr_v3 import ShardLevel
from shardfs.maintenance.progress import quiet, walked
from shardfs.maintenance.report import format_size, table
from shardfs.maintenance.scan import (
    IndexReader,
    KeptChanging,
    ShardIndex,
    Skipped,
    display,
    find_shards,
    split_recovery,
)
from shardfs.primitives.errors import CorruptData, SourceChanged, StorageError
from shardfs.primitives.retry import attempts
from shardfs.storage.base import Storage

#: Rewrite a shard only if more than this fraction of it is dead. At 0.5 a rewrite copies at
#: most as many live bytes as it frees, and no shard stays more than twice its live size.
DEFAULT_THRESHOLD = 0.5
#: ... and only if at least this many bytes are dead: below that, the fixed cost of a
#: rewrite (a new file, fsync, rename; a PUT on object stores) buys next to nothing.
DEFAULT_MIN_DEAD = 64 << 10
#: Live chunks closer than this are read in one request, dead bytes between them included.
_READ_GAP = 64 << 10


@dataclass(frozen=True)
class Policy:
    """Which shards are worth rewriting."""

    threshold: float = DEFAULT_THRESHOLD
    min_dead: int = DEFAULT_MIN_DEAD

    def __post_init__(self) -> None:
        if not 0 <= self.threshold < 1:
            raise ValueError(f"threshold {self.threshold} is not a fraction in [0, 1)")
        if self.min_dead < 0:
            raise ValueError(f"min_dead {self.min_dead} is negative")

    def wants(self, shard: ShardIndex) -> bool:
        dead = shard.dead
        return dead > 0 and dead >= self.min_dead and dead > self.threshold * shard.stat.size


@dataclass
class ArrayCompaction:
    path: str
    shards: int = 0
    rewritten: int = 0
    reclaimed: int = 0


@dataclass
class CompactReport:
    arrays: list[ArrayCompaction] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    #: What recovery repaired before compacting (torn appends of crashed writers).
    recovery: list[str] = field(default_factory=list)
    #: Unfinished appends recovery leaves to a person (see `fsck --settle`); not compacted.
    unsettled: list[str] = field(default_factory=list)
    #: Shards that failed verification, with the reason; never rewritten.
    corrupt: list[str] = field(default_factory=list)
    #: Shards that could not be read or written (I/O errors), with the reason.
    failed: list[str] = field(default_factory=list)
    #: Shards left for a later run because writers kept changing them.
    busy: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No shard was found corrupt or failed (busy ones are just left for later)."""
        return not self.corrupt and not self.failed

    def lines(self) -> list[str]:
        """The report for people: a table per array, then what needs attention."""
        rows = [
            [display(a.path), str(a.shards), str(a.rewritten), format_size(a.reclaimed)]
            for a in self.arrays
        ]
        rows.append(
            [
                "total",
                str(sum(a.shards for a in self.arrays)),
                str(sum(a.rewritten for a in self.arrays)),
                format_size(sum(a.reclaimed for a in self.arrays)),
            ]
        )
        lines = table(["array", "shards", "rewritten", "reclaimed"], rows)
        lines += [f"skipped {display(s.path)}: {s.reason}" for s in self.skipped]
        lines += [f"repaired {line}" for line in self.recovery]
        lines += [f"POSSIBLY TORN {line}" for line in self.unsettled]
        lines += [f"left for later: {reason}" for reason in self.busy]
        lines += [f"FAILED {reason}" for reason in self.failed]
        lines += [f"CORRUPT {reason} (not rewritten)" for reason in self.corrupt]
        if not self.ok:
            lines.append(
                f"compact: {len(self.corrupt)} corrupt and {len(self.failed)} failed shards "
                "left as they are"
            )
        return lines


def compact(
    storage: Storage, policy: Policy | None = None, progress: tqdm | None = None
) -> CompactReport:
    """Rewrite the shards of the source that `policy` wants; see the module docstring.
    `progress` counts the shards found, then those done."""
    policy = policy or Policy()
    progress = quiet() if progress is None else progress
    reader = IndexReader(storage, repair=True)
    inventory = find_shards(storage, progress)
    report = CompactReport(skipped=inventory.skipped)
    walked(progress, inventory.shard_count)
    for array in inventory.arrays:
        done = ArrayCompaction(array.path, len(array.shards))
        for key in array.shards:
            try:
                reclaimed = _compact_shard(reader, key, array.level, policy)
                if reclaimed:
                    done.rewritten += 1
                    done.reclaimed += reclaimed
            except KeptChanging as e:
                report.busy.append(str(e))
            except CorruptData as e:
                report.corrupt.append(str(e))
            except StorageError as e:
                report.failed.append(str(e))
            progress.update()
        report.arrays.append(done)
    report.recovery, report.unsettled = split_recovery(reader.recovery)
    return report


def _compact_shard(reader: IndexReader, key: str, level: ShardLevel, policy: Policy) -> int:
    """Rewrite one shard if the policy wants it; returns the bytes reclaimed (0: untouched)."""
    storage = reader.storage
    for _ in attempts():
        shard = reader.read(key, level)
        if shard is None or not policy.wants(shard):
            return 0
        try:
            chunks = _live_chunks(storage, key, shard)
            update = whole_shard(level, chunks)
            if update.nbytes >= shard.stat.size:
                return 0  # entries share bytes: written apart they would not be smaller
            if update.empty:
                storage.delete(key, shard.stat.version)  # no chunk left, as zarr-python does
                return shard.stat.size
            storage.put(key, update.parts, shard.stat.version)
        except SourceChanged:
            continue  # changed since its index was read: start over from the new version
        return shard.stat.size - update.nbytes
    raise KeptChanging(f"{storage.describe(key)} kept changing; not compacted")


def _live_chunks(storage: Storage, key: str, shard: ShardIndex) -> dict[int, memoryview]:
    """The stored bytes of every non-empty slot, read at the index's version.

    Chunks that lie close together are read in one request (runs of the file
    in offset order), so a shard costs few reads however many chunks it holds.
    """
    entries = shard.entries
    slots = np.flatnonzero(entries[:, 1] != EMPTY)
    slots = slots[np.argsort(entries[slots, 0], kind="stable")]
    runs: list[tuple[int, int, list[int]]] = []
    for slot in slots.tolist():
        offset, nbytes = (int(v) for v in entries[slot])
        if runs and offset <= runs[-1][1] + _READ_GAP:
            start, end, members = runs[-1]
            members.append(slot)
            runs[-1] = (start, max(end, offset + nbytes), members)
        else:
            runs.append((offset, offset + nbytes, [slot]))
    chunks: dict[int, memoryview] = {}
    for start, end, members in runs:
        data = memoryview(storage.read(key, start, end - start, shard.stat.version))
        for slot in members:
            offset, nbytes = (int(v) for v in entries[slot])
            chunks[slot] = data[offset - start : offset - start + nbytes]
    return chunks
