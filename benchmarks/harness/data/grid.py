"""The grid data set: a uint16 array of grid x grid 32^2 zstd chunks in 512^2 shards,
written by tensorstore sharded and (the plain copy) unsharded, with byte-identical chunk
files. Read by `concurrency` and `chunk_cost`."""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorstore as ts

from benchmarks.harness.daemons import DataDir, MountManager, layout
from benchmarks.harness.runs import step
from tests.conftest import Mounted

#: Inner chunk edge (uint16), and inner chunks per shard along each axis.
CHUNK = 32
SHARD = 16
ARRAY = "data"
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
#: Chunk files compared between the mount and the plain copy when the data set is built.
SAMPLE = 1000
GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}


def values(rows: slice, cols: slice) -> np.ndarray:
    """The array's content, from its coordinates alone (never the fill value 0)."""
    y = np.arange(rows.start, rows.stop, dtype=np.uint32)[:, None]
    x = np.arange(cols.start, cols.stop, dtype=np.uint32)[None, :]
    return (1 + (y * 131 + x * 7 + (y ^ x)) % 65521).astype(np.uint16)


def chunk_region(index: int, grid: int) -> tuple[slice, slice]:
    i, j = divmod(index, grid)
    return slice(i * CHUNK, (i + 1) * CHUNK), slice(j * CHUNK, (j + 1) * CHUNK)


def chunk_key(index: int, grid: int) -> str:
    return "c/{}/{}".format(*divmod(index, grid))


def write_array(path: Path, grid: int, sharded: bool) -> None:
    """The array (grid x grid chunks) written by tensorstore, one row of shards at a time."""
    inner = ["bytes", {"name": "zstd", "configuration": {"level": 3}}]
    codecs = inner
    if sharded:
        config = {
            "chunk_shape": [CHUNK, CHUNK],
            "codecs": inner,
            "index_codecs": ["bytes", "crc32c"],
        }
        codecs = [{"name": "sharding_indexed", "configuration": config}]
    edge = CHUNK * SHARD if sharded else CHUNK
    metadata = {
        "shape": [grid * CHUNK] * 2,
        "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [edge, edge]}},
        "codecs": codecs,
        "fill_value": 0,
    }
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(GROUP))
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": f"{path / ARRAY}/"},
        "metadata": metadata,
        "context": {"file_io_sync": False},  # the benchmark needs no durability
    }
    array = ts.open(spec, create=True).result()
    side, rows = grid * CHUNK, CHUNK * SHARD
    for start in range(0, side, rows):
        region = (slice(start, min(start + rows, side)), slice(0, side))
        array[region] = values(*region)


@dataclass
class Dataset(DataDir):
    grid: int

    @property
    def params(self) -> dict[str, object]:
        return layout(self.grid, CHUNK, SHARD, GENERATOR, "tensorstore")

    def build(self, mounts: Mounts) -> None:
        """Write both arrays, give the copy the view's `zarr.json`, and compare a sample of
        chunk files through a mount."""
        self.clear()
        for path, sharded in ((self.source, True), (self.plain, False)):
            with step(f"writing {path}, {self.grid} x {self.grid} chunks"):
                write_array(path, self.grid, sharded)
        view = mounts.fresh().path / ARRAY
        shutil.copyfile(view / "zarr.json", self.plain / ARRAY / "zarr.json")
        rng = random.Random(GENERATOR)
        for index in rng.sample(range(self.grid**2), min(SAMPLE, self.grid**2)):
            key = chunk_key(index, self.grid)
            if (view / key).read_bytes() != (self.plain / ARRAY / key).read_bytes():
                raise RuntimeError(f"{key}: the plain copy differs from the view")
        mounts.stop()
        self.made()


class Mounts(MountManager):
    """Mounts of the data set, warmed."""

    def warmed(self) -> Mounted:
        """A fresh mount whose daemon has read every shard index (a stat of one chunk file
        per shard), as a long-running one would have."""
        mounted = self.fresh()
        grid = self.dataset.grid
        for i in range(0, grid, SHARD):
            for j in range(0, grid, SHARD):
                os.stat(mounted.path / ARRAY / f"c/{i}/{j}")
        return mounted
