"""Maintenance of a source, outside any mount: `fsck` checks shards, `compact` rewrites them.

Plain library code against the `Storage` interface; the `shardfs fsck` and
`shardfs compact` commands only parse arguments, print the reports and pick
the exit status.
"""

from shardfs.maintenance.compact import (
    DEFAULT_MIN_DEAD,
    DEFAULT_THRESHOLD,
    CompactReport,
    Policy,
    compact,
)
from shardfs.maintenance.fsck import FsckReport, fsck
from shardfs.maintenance.progress import progress_bar
from shardfs.maintenance.scan import Inventory, find_shards

__all__ = [
    "DEFAULT_MIN_DEAD",
    "DEFAULT_THRESHOLD",
    "CompactReport",
    "FsckReport",
    "Inventory",
    "Policy",
    "compact",
    "find_shards",
    "fsck",
    "progress_bar",
]
