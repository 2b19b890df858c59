"""The DANDI layout's grid and values: uint8, chunks of 64^3, shards of 32^3 chunks,
keys c/i/j/k, every chunk one value. Written by `scale --layout dandi` and, with chunks of
one byte, `checksum --synthetic`."""

from __future__ import annotations

import numpy as np

#: The dandi layout: inner chunk edge (uint8), inner chunks per shard along each axis,
#: and chunks along the second and third axes: each directory c/<i>/<j> holds DANDI_SIDE.
DANDI_CHUNK = 64
DANDI_SHARD = 32
DANDI_SIDE = 100


def dandi_value(i: np.ndarray | int, j: np.ndarray | int, k: np.ndarray | int) -> np.ndarray:
    """The one value of chunk (i, j, k): never the fill value, so every chunk is stored."""
    return np.asarray(1 + (i + 3 * j + k) % 251, dtype=np.uint8)
