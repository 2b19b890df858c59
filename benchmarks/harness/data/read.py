"""The read data set: a uint8 array of 64^3 zstd chunks in 256^3 shards, written by
zarr-python 3, and its plain copy (byte-identical chunk files, copied out of a mount).
Read by `read_throughput` and `cold_path`."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from benchmarks.harness.daemons import DataDir, MountManager
from benchmarks.harness.runs import step

CHUNK = 64
SHARD = 256
PLANE = (1024, 1024)  # one z plane of uint8 is 1 MiB
ARRAY = "data"
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
#: Skewed small noise (P(0)=150/256 ... P(3)=16/256) on a slowly varying field:
#: zstd gets chunks of 64^3 bytes (256 KiB) down to roughly 70-100 KiB.
NOISE = np.repeat(np.arange(4, dtype=np.uint8), [150, 60, 30, 16])


def shape_for(size_mib: int) -> tuple[int, int, int]:
    """(depth, 1024, 1024): at least `size_mib` MiB, a whole number of chunks deep."""
    depth = math.ceil(size_mib / CHUNK) * CHUNK
    return (depth, *PLANE)


def generate(origin: tuple[int, ...], shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The values of the block at `origin`; deterministic, so any region can be checked."""
    z, y, x = (np.arange(o, o + n, dtype=np.float32) for o, n in zip(origin, shape, strict=True))
    smooth = (
        15 * np.sin(z / 230)[:, None, None]
        + 15 * np.sin(y / 310)[None, :, None]
        + 15 * np.cos(x / 170)[None, None, :]
        + 128
    ).astype(np.uint8)
    rng = np.random.default_rng([seed, *origin])
    return smooth + NOISE[rng.integers(0, 256, size=shape, dtype=np.uint8)]


def shard_regions(shape: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    for z in range(0, shape[0], SHARD):
        for y in range(0, shape[1], SHARD):
            for x in range(0, shape[2], SHARD):
                yield tuple(
                    slice(o, min(o + SHARD, n)) for o, n in zip((z, y, x), shape, strict=True)
                )


def write_source(source: Path, shape: tuple[int, ...]) -> None:
    """The sharded array, written by zarr-python 3 one whole shard at a time."""
    group = zarr.open_group(source, mode="w")
    array = group.create_array(
        ARRAY,
        shape=shape,
        dtype="uint8",
        chunks=(CHUNK,) * 3,
        shards=(SHARD,) * 3,
        compressors=ZstdCodec(level=3),
        fill_value=0,
    )
    for region in shard_regions(shape):
        origin = tuple(s.start for s in region)
        array[region] = generate(origin, tuple(s.stop - s.start for s in region), GENERATOR)


def file_sizes(top: Path) -> dict[str, int]:
    """Every regular file below `top` (relative path -> bytes), to count what a cat reads."""
    return {
        str(p.relative_to(top)): p.stat().st_size for p in sorted(top.rglob("*")) if p.is_file()
    }


@dataclass
class Dataset(DataDir):
    """The benchmark's files under the data directory."""

    shape: tuple[int, int, int]

    @property
    def params(self) -> dict[str, object]:
        return {
            "shape": list(self.shape),
            "chunks": CHUNK,
            "shards": SHARD,
            "generator": GENERATOR,
            "zarr": zarr.__version__,
        }

    def ready(self) -> bool:
        return super().ready() and all(
            (d / ARRAY / "zarr.json").is_file() for d in (self.source, self.plain)
        )

    def build(self, mounts: MountManager) -> None:
        """Write the sharded source, then copy the plain array out of a mount of it."""
        self.clear()
        with step(f"writing {self.source} {self.shape}"):
            write_source(self.source, self.shape)
        mounted = mounts.fresh()
        print(f"copying {self.plain} out of the mount ...", flush=True)
        subprocess.run(["cp", "-r", f"{mounted.path}/.", str(self.plain)], check=True)
        # Byte for byte, every file: the copy is what the mount serves.
        subprocess.run(["diff", "-rq", str(mounted.path), str(self.plain)], check=True)
        mounts.stop()
        self.made()


def zarr_read(path: Path, sharded: bool, readers: int = 1) -> Callable[[], np.ndarray]:
    """The whole array read by zarr-python 3; with `readers` > 1, by that many threads at
    once, each reading its own slab along y (whole shards where the shape allows)."""

    def open_checked() -> zarr.Array:
        array = zarr.open_array(path, mode="r")
        if (array.shards is not None) != sharded:
            raise RuntimeError(f"{path}: expected sharded={sharded}, got shards={array.shards}")
        return array

    def read() -> np.ndarray:
        return open_checked()[...]

    def read_parallel() -> np.ndarray:
        array = open_checked()
        out = np.empty(array.shape, dtype=array.dtype)
        height = array.shape[1]
        step = max(SHARD, math.ceil(height / readers / SHARD) * SHARD)
        slabs = [slice(y, min(y + step, height)) for y in range(0, height, step)]

        def part(slab: slice) -> None:
            out[:, slab, :] = array[:, slab, :]

        with ThreadPoolExecutor(readers) as pool:
            for done in [pool.submit(part, slab) for slab in slabs]:
                done.result()
        return out

    return read if readers == 1 else read_parallel
