"""`info`: what a source holds, node by node, without changing anything.

For every group and array of a Zarr v3 hierarchy: an array's format (sharded
or not), shape, data type, shard and inner chunk shapes; for a sharded array
the shards found, its non-empty inner chunks (from the shard indexes) and the
space appends left dead in them (as `fsck` counts it); for an unsharded array
its chunk objects. Shard indexes are read fresh, like fsck does, but nothing
is repaired. Then the OME-Zarr structure, where the source holds OME-Zarr 0.5
(`shardfs.formats.ome.describe`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from shardfs.formats import ome
from shardfs.formats.shard_index import EMPTY
from shardfs.formats.zarr_v3 import ShardedLayout, Unshardable, plain_layout, sharded_layout
from shardfs.maintenance.fsck import ArrayUsage
from shardfs.maintenance.progress import quiet, walked
from shardfs.maintenance.report import format_size, table
from shardfs.maintenance.scan import (
    IndexReader,
    KeptChanging,
    NodeMeta,
    Skipped,
    display,
    find_nodes,
    shard_keys,
)
from shardfs.primitives.errors import CorruptData, InvalidMetadata, StorageError
from shardfs.storage.base import Storage


@dataclass
class NodeInfo:
    """One group or array. Counts are None where they do not apply (a group, the shards
    of an unsharded array) or could not be had (nested sharding, an irregular grid)."""

    path: str
    node_type: str
    format: str = ""
    data_type: str = ""
    shape: list[int] | None = None
    shard_shape: list[int] | None = None
    chunk_shape: list[int] | None = None
    shards: int | None = None
    #: non-empty inner chunks (sharded), or chunk objects (unsharded)
    chunks: int | None = None
    #: the inner chunks the array's grid has
    grid_chunks: int | None = None
    stored_bytes: int | None = None
    live_bytes: int | None = None
    dead_bytes: int | None = None
    #: shards that failed verification or could not be read, with the reason
    damaged: list[str] = field(default_factory=list)


@dataclass
class InfoReport:
    source: str
    nodes: list[NodeInfo] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    #: shards not read because writers kept changing them
    unchecked: list[str] = field(default_factory=list)
    #: shards with an unfinished append (a writer at work, or one that crashed)
    pending: list[str] = field(default_factory=list)
    #: the OME-Zarr structure (images, levels, channels, labels, plate), if any
    ome: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "nodes": [{**asdict(n), "path": display(n.path)} for n in self.nodes],
            "skipped": [{"path": display(s.path), "reason": s.reason} for s in self.skipped],
            "unchecked": self.unchecked,
            "pending": self.pending,
            "ome": self.ome,
        }

    def lines(self) -> list[str]:
        """The report for people: one row per node, then what needs attention."""
        header = ["node", "format", "data type", "shape", "shard", "chunk", "shards", "chunks"]
        rows = [_row(n) for n in self.nodes]
        sharded = [n for n in self.nodes if n.stored_bytes is not None]
        if sharded:
            stored = sum(n.stored_bytes or 0 for n in sharded)
            dead = sum(n.dead_bytes or 0 for n in sharded)
            shards = sum(n.shards or 0 for n in sharded)
            total = ["total", "", "", "", "", "", str(shards), "", format_size(stored)]
            rows.append([*total, _dead(dead, stored)])
        lines = table([*header, "stored", "dead"], rows, left=3)
        lines += ["", "OME-Zarr:", *(f"  {line}" for line in self.ome)] if self.ome else []
        lines += [f"skipped {display(s.path)}: {s.reason}" for s in self.skipped]
        lines += [f"unfinished append in {key}" for key in self.pending]
        lines += [f"not read: {reason}" for reason in self.unchecked]
        lines += [f"DAMAGED {reason}" for n in self.nodes for reason in n.damaged]
        return lines


def _shape(shape: list[int] | None) -> str:
    return "x".join(map(str, shape)) if shape else "-"


def _dead(dead: int, stored: int) -> str:
    return f"{format_size(dead)} ({dead / stored:.1%})" if stored else format_size(dead)


def _row(node: NodeInfo) -> list[str]:
    if node.node_type == "group":
        return [display(node.path), "group", *[""] * 8]
    chunks = "-" if node.chunks is None else str(node.chunks)
    if node.chunks is not None and node.grid_chunks is not None:
        chunks = f"{node.chunks}/{node.grid_chunks}"
    stored = "-" if node.stored_bytes is None else format_size(node.stored_bytes)
    dead = "-" if node.dead_bytes is None else _dead(node.dead_bytes, node.stored_bytes or 0)
    return [
        display(node.path),
        node.format,
        node.data_type,
        _shape(node.shape),
        _shape(node.shard_shape),
        _shape(node.chunk_shape),
        "-" if node.shards is None else str(node.shards),
        chunks,
        stored,
        dead,
    ]


def survey(storage: Storage, progress: tqdm | None = None) -> InfoReport:
    """Describe every node of the source; see the module docstring. `progress` counts the
    shards found, then the shard indexes read."""
    progress = quiet() if progress is None else progress
    reader = IndexReader(storage, repair=False)
    nodes, skipped = find_nodes(storage)
    report = InfoReport(storage.describe(""), skipped=skipped)
    report.pending = [storage.describe(key) for key in reader.pending]
    if reader.unfinished_unknown:
        report.unchecked.append(f"unfinished appends: {reader.unfinished_unknown}")
    report.ome = ome.describe({node.path: node.meta for node in nodes})
    arrays: list[tuple[NodeInfo, ShardedLayout, list[str]]] = []
    for node in nodes:
        info = _describe(storage, node, report, arrays, progress)
        report.nodes.append(info)
    walked(progress, sum(len(keys) for _, _, keys in arrays))
    for info, layout, keys in arrays:
        _read_indexes(reader, info, layout, keys, report, progress)
    return report


def _describe(
    storage: Storage,
    node: NodeMeta,
    report: InfoReport,
    arrays: list[tuple[NodeInfo, ShardedLayout, list[str]]],
    progress: tqdm,
) -> NodeInfo:
    """A node's NodeInfo from its metadata; the shards of a sharded array are added to
    `arrays`, to be read afterwards (and counted by `progress`)."""
    meta = node.meta
    info = NodeInfo(node.path, meta["node_type"])
    if info.node_type != "array":
        return info
    data_type = meta.get("data_type")
    info.data_type = data_type.get("name", "?") if isinstance(data_type, dict) else str(data_type)
    info.shape = list(meta.get("shape", []))
    try:
        layout = sharded_layout(meta)
    except (InvalidMetadata, Unshardable) as e:
        info.format = "sharded, shown as stored"
        report.skipped.append(Skipped(node.path, f"not unsharded by the view: {e}"))
        return info
    if layout is None:
        info.format = "unsharded"
        try:
            plain = plain_layout(meta, b"")
        except InvalidMetadata:
            return info  # an irregular grid: its chunks are not counted
        info.chunk_shape = list(plain.chunk_shape)
        info.grid_chunks = math.prod(plain.grid)
        info.chunks = len(shard_keys(storage, node.path, plain))
        return info
    nested = len(layout.levels) > 1
    info.format = f"sharded ({len(layout.levels)} levels)" if nested else "sharded"
    info.shard_shape = list(layout.shard_shape)
    info.chunk_shape = list(layout.chunk_shape)
    info.grid_chunks = math.prod(layout.grid)
    keys = shard_keys(storage, node.path, layout, progress)
    info.shards = len(keys)
    arrays.append((info, layout, keys))
    return info


def _read_indexes(
    reader: IndexReader,
    info: NodeInfo,
    layout: ShardedLayout,
    keys: list[str],
    report: InfoReport,
    progress: tqdm,
) -> None:
    """Count the non-empty chunks and the live and dead bytes of one array's shards."""
    usage = ArrayUsage(info.path, len(keys))
    chunks = 0
    level = layout.levels[0]
    for key in keys:
        try:
            shard = reader.read(key, level)
            if shard is not None:
                usage.add(shard)
                chunks += int(np.count_nonzero(shard.entries[:, 1] != EMPTY))
        except KeptChanging as e:
            report.unchecked.append(str(e))
        except (CorruptData, StorageError) as e:
            info.damaged.append(str(e))
        progress.update()
    # With nested sharding an outer entry is a sub-shard, not an inner chunk.
    info.chunks = None if len(layout.levels) > 1 else chunks
    info.stored_bytes, info.live_bytes, info.dead_bytes = usage.size, usage.live, usage.dead
