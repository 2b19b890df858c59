"""Building shard updates: an append of new chunks plus a new index, or a whole shard.

Pure: callers pass the shard's current index (flat, absolute offsets) and the
changed inner chunks by slot; they get back the bytes to append (or to write
whole) and the new index. The sharding spec allows dead bytes and any chunk
order, so an update never moves chunks it does not change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from shardfs.formats.shard_index import EMPTY
from shardfs.formats.zarr_v3 import ShardLevel

Buffer = bytes | memoryview


@dataclass(frozen=True)
class ShardUpdate:
    """What to write for one shard. `parts` are appended to the shard (`whole` False)
    or make up the whole new shard (`whole` True). `index` is the new flat index."""

    parts: list[Buffer]
    index: np.ndarray
    whole: bool

    @property
    def nbytes(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def empty(self) -> bool:
        """Every slot is empty: the shard holds no chunk and can be removed."""
        return bool((self.index[:, 1] == EMPTY).all())


def empty_index(level: ShardLevel) -> np.ndarray:
    """A flat (n, 2) index with every slot empty."""
    return np.full((math.prod(level.chunks_per_shard), 2), EMPTY, dtype=np.uint64)


def append_update(
    level: ShardLevel, index: np.ndarray, size: int, changes: Mapping[int, Buffer | None]
) -> ShardUpdate:
    """The append for a shard of `size` bytes with its index at the end.

    `index` is the current flat index; `changes` maps slots to new chunk bytes,
    or None to mark the slot empty. The new chunks follow the old end in slot
    order, then the new index; the old index and replaced chunks become dead space.
    """
    assert not level.index_at_start
    new = index.copy()
    parts: list[Buffer] = []
    position = size
    for slot in sorted(changes):
        data = changes[slot]
        if data is None:
            new[slot] = EMPTY
            continue
        new[slot] = (position, len(data))
        parts.append(data)
        position += len(data)
    parts.append(level.index.encode(new.reshape((*level.chunks_per_shard, 2))))
    return ShardUpdate(parts, new, whole=False)


def whole_shard(level: ShardLevel, chunks: Mapping[int, Buffer]) -> ShardUpdate:
    """A compact shard holding `chunks` (slot -> bytes) in slot order, index where `level` wants it."""
    index = empty_index(level)
    position = level.index_size if level.index_at_start else 0
    parts: list[Buffer] = []
    for slot in sorted(chunks):
        data = chunks[slot]
        index[slot] = (position, len(data))
        parts.append(data)
        position += len(data)
    encoded = level.index.encode(index.reshape((*level.chunks_per_shard, 2)))
    parts = [encoded, *parts] if level.index_at_start else [*parts, encoded]
    return ShardUpdate(parts, index, whole=True)
