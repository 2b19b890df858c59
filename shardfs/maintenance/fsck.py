"""`fsck`: verify every shard index of a source and account for the space appends left dead.

Checks the outer index of every shard of every `sharding_indexed` array (its
size and crc32c, and that its entries lie inside the shard's data), and sums
per array the live bytes (what the index points to) and the dead bytes (the
rest, bar the index: old chunks and old indexes that appends left behind).
Torn appends of crashed writers are rolled back first unless `repair` is off.
Chunk contents are not decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm import tqdm

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
from shardfs.primitives.errors import CorruptData, StorageError
from shardfs.storage.base import Storage


@dataclass
class ArrayUsage:
    """The shards of one array and how the bytes of those that verify are used."""

    path: str
    shards: int = 0  #: found, whether they verify or not
    size: int = 0
    index: int = 0
    live: int = 0

    def add(self, shard: ShardIndex) -> None:
        self.size += shard.stat.size
        self.index += shard.index_size
        self.live += shard.live

    @property
    def dead(self) -> int:
        return self.size - self.index - self.live

    @property
    def dead_fraction(self) -> float:
        return self.dead / self.size if self.size else 0.0


@dataclass
class FsckReport:
    arrays: list[ArrayUsage] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    #: What recovery repaired (one line per torn or completed append it settled).
    recovery: list[str] = field(default_factory=list)
    #: Without repair: the shards that have an unfinished append.
    pending: list[str] = field(default_factory=list)
    #: Unfinished appends recovery leaves to a person (`Unsettled`), saying how to settle them.
    unsettled: list[str] = field(default_factory=list)
    #: Shards that failed verification (or could not be read), with the reason; left as they are.
    damaged: list[str] = field(default_factory=list)
    #: Shards not checked because writers kept changing them.
    unchecked: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """No damage is left (whatever recovery repaired), nor any shard possibly torn."""
        return not self.damaged and not self.unsettled

    def lines(self) -> list[str]:
        """The report for people: a table per array, then what needs attention."""
        total = ArrayUsage(
            "",
            sum(a.shards for a in self.arrays),
            sum(a.size for a in self.arrays),
            sum(a.index for a in self.arrays),
            sum(a.live for a in self.arrays),
        )
        rows = [_row(display(a.path), a) for a in self.arrays] + [_row("total", total)]
        lines = table(["array", "shards", "live", "dead", "dead%"], rows)
        lines += [f"skipped {display(s.path)}: {s.reason}" for s in self.skipped]
        lines += [f"repaired {line}" for line in self.recovery]
        lines += [f"unfinished append in {key}" for key in self.pending]
        lines += [f"POSSIBLY TORN {line}" for line in self.unsettled]
        lines += [f"not checked: {reason}" for reason in self.unchecked]
        lines += [f"DAMAGED {reason}" for reason in self.damaged]
        if self.damaged:
            lines.append(f"fsck: {len(self.damaged)} damaged shards, left as they are")
        if self.unsettled:
            lines.append(
                f"fsck: {len(self.unsettled)} possibly torn shards, left as they are "
                "(POSSIBLY TORN says how to settle each)"
            )
        if self.clean:
            lines.append("fsck: no damage" + (" left" if self.recovery else ""))
        return lines


def _row(name: str, usage: ArrayUsage) -> list[str]:
    dead = f"{usage.dead_fraction:.1%}"
    return [name, str(usage.shards), format_size(usage.live), format_size(usage.dead), dead]


def fsck(storage: Storage, repair: bool = True, progress: tqdm | None = None) -> FsckReport:
    """Check every shard of the source; see the module docstring. `progress` counts the
    shards found, then those checked."""
    progress = quiet() if progress is None else progress
    reader = IndexReader(storage, repair)
    inventory = find_shards(storage, progress)
    pending = [storage.describe(key) for key in reader.pending]
    report = FsckReport(skipped=inventory.skipped, pending=pending)
    walked(progress, inventory.shard_count)
    for array in inventory.arrays:
        usage = ArrayUsage(array.path, len(array.shards))
        for key in array.shards:
            try:
                shard = reader.read(key, array.level)
                if shard is not None:
                    usage.add(shard)
            except KeptChanging as e:
                report.unchecked.append(str(e))
            except (CorruptData, StorageError) as e:
                report.damaged.append(str(e))
            progress.update()
        report.arrays.append(usage)
    report.recovery, report.unsettled = split_recovery(reader.recovery)
    return report
