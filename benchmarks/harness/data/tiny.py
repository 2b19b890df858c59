"""The tiny-files data set: a uint8 array of 4^3 chunks stored with the `bytes` codec
alone (every chunk file 64 bytes) in shards of 8^3 chunks, written by zarr-python 3, laid
out so that every chunk directory `c/<i>/<j>` of the view holds 100 files, as in the DANDI
layout. Read by `per_file` and `handler_cost`."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from benchmarks.harness.daemons import DataDir, layout
from benchmarks.harness.runs import step

ARRAY = "data"
CHUNK = 4  #: inner chunk edge: 4^3 uint8 = 64 bytes
SHARD = 8  #: inner chunks per shard along each axis
PER_DIR = 100  #: chunk files per chunk directory (the last axis)
FILE_BYTES = CHUNK**3
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1


def grid_for(files: int) -> tuple[int, int, int]:
    """Chunks per axis: the last axis holds 100, so every chunk directory has 100 files."""
    directories = files // PER_DIR
    if directories <= PER_DIR:
        return (1, directories, PER_DIR)
    return (directories // PER_DIR, PER_DIR, PER_DIR)


def values(shape: tuple[int, ...]) -> np.ndarray:
    """The array's values: random, never the fill value, so every chunk is stored."""
    return np.random.default_rng(21).integers(1, 256, size=shape, dtype=np.uint8)


@dataclass
class Dataset(DataDir):
    files: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return grid_for(self.files)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(n * CHUNK for n in self.grid)  # type: ignore[return-value]

    @property
    def params(self) -> dict[str, object]:
        return layout(list(self.grid), CHUNK, SHARD, GENERATOR, "zarr")

    def ready(self) -> bool:
        return super().ready() and (self.source / ARRAY / "zarr.json").is_file()

    def build(self) -> None:
        self.clear()
        with step(f"writing {self.source} with zarr-python {zarr.__version__}"):
            group = zarr.open_group(self.source, mode="w")
            array = group.create_array(
                ARRAY,
                shape=self.shape,
                dtype="u1",
                chunks=(CHUNK,) * 3,
                shards=(CHUNK * SHARD,) * 3,
                compressors=None,
                filters=None,
                fill_value=0,
            )
            array[:] = values(self.shape)
        check = zarr.open_array(self.source / ARRAY, mode="r")
        if check.chunks != (CHUNK,) * 3 or check.compressors or check.filters:
            raise RuntimeError(f"{self.source}: zarr-python wrote {check.info}")
        if not np.array_equal(check[:], values(self.shape)):
            raise RuntimeError(f"{self.source}: zarr-python reads other values than written")
        self.made()

    def plain_tree(self) -> Path:
        """The plain copy, of the floors' shape (`paths` of a floor), made once (whole, or
        not at all): the C floor serves it."""
        if not self.plain.is_dir():
            making = self.plain.with_name(self.plain.name + ".making")
            shutil.rmtree(making, ignore_errors=True)
            payload = values((FILE_BYTES,)).tobytes()
            for i in range(self.files):
                path = making / str(i // PER_DIR) / str(i % PER_DIR)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(payload)
            making.rename(self.plain)
        return self.plain

    def paths(self, top: Path, kind: str) -> list[bytes]:
        """Every file of a mount of `kind` at `top`, in key order (a directory's files together)."""
        if kind.startswith(("floor", "cfloor")):
            names = (f"{i // PER_DIR}/{i % PER_DIR}" for i in range(self.files))
        else:
            _, rows, columns = self.grid
            names = (
                f"{ARRAY}/c/{d // rows}/{d % rows}/{k}"
                for d in range(self.files // columns)
                for k in range(columns)
            )
        return [os.fsencode(top / name) for name in names]
