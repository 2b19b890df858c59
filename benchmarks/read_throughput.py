"""Read throughput through a shardfs mount, side by side with the alternatives.

Why: the point of shardfs is that a reader of plain chunk-per-file Zarr loses
(almost) nothing by reading a sharded array through the mount instead of a
plain copy. This script measures exactly that in one run, on one machine:

  (a) zarr-python 3 reads the whole array through a `-o ro` mount,
  (b) zarr-python 3 reads a plain unsharded copy (byte-identical chunk files),
  (c) zarr-python 3 reads the sharded source natively,
  (d) `cat` of every virtual chunk file through the mount vs `cat` of the shards,

each COLD (page cache dropped and, for the mount, a fresh daemon) and WARM
(the same read repeated at once, mount kept), interleaved and repeated; the
table shows medians, and each ratio is the median of per-repetition ratios
with its range. Needs root (drop_caches, FUSE).

    .venv/bin/python benchmarks/read_throughput.py [--size-mib 512] [--data DIR] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr
from common import DataDir, Interrupts, MountManager, machine, run
from zarr.codecs import ZstdCodec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.conftest import Mounted  # noqa: E402

CHUNK = 64
SHARD = 256
PLANE = (1024, 1024)  # one z plane of uint8 is 1 MiB
ARRAY = "data"
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
#: Skewed small noise (P(0)=150/256 ... P(3)=16/256) on a slowly varying field:
#: zstd gets chunks of 64^3 bytes (256 KiB) down to roughly 70-100 KiB.
NOISE = np.repeat(np.arange(4, dtype=np.uint8), [150, 60, 30, 16])
TARGETS = {"cold": 0.9, "warm": 0.95}


# -- the data set ---------------------------------------------------------------------


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
        self.marker.unlink(missing_ok=True)
        for path in (self.source, self.plain):
            shutil.rmtree(path, ignore_errors=True)
        started = time.perf_counter()
        print(f"writing {self.source} {self.shape} ...", flush=True)
        write_source(self.source, self.shape)
        print(f"  {time.perf_counter() - started:.1f} s", flush=True)
        mounted = mounts.fresh()
        print(f"copying {self.plain} out of the mount ...", flush=True)
        subprocess.run(["cp", "-r", f"{mounted.path}/.", str(self.plain)], check=True)
        # Byte for byte, every file: the copy is what the mount serves.
        subprocess.run(["diff", "-rq", str(mounted.path), str(self.plain)], check=True)
        mounts.stop()
        self.marker.write_text(json.dumps(self.params))


# -- mounts and caches ----------------------------------------------------------------


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class ColdMounts(MountManager):
    """Mounts on empty caches."""

    def fresh(self) -> Mounted:
        """A new daemon on empty caches: unmount, drop the page cache, mount."""
        self.stop()
        drop_caches()
        return super().fresh()


# -- the cases ------------------------------------------------------------------------


@dataclass
class Case:
    """One way of reading the whole array, with its timings per mode."""

    key: str
    label: str
    unit: str  #: what the throughput counts: "uncompressed" or "stored"
    nbytes: int
    read: Callable[[], np.ndarray | None]
    mounted: bool  #: cold runs need a fresh mount
    times: dict[str, list[float]] = field(default_factory=lambda: {"cold": [], "warm": []})

    def mib_s(self, mode: str) -> float:
        return self.nbytes / (1 << 20) / statistics.median(self.times[mode])


def zarr_read(path: Path, sharded: bool) -> Callable[[], np.ndarray]:
    def read() -> np.ndarray:
        array = zarr.open_array(path, mode="r")
        if (array.shards is not None) != sharded:
            raise RuntimeError(f"{path}: expected sharded={sharded}, got shards={array.shards}")
        return array[...]

    return read


def cat_read(path: Path) -> Callable[[], None]:
    def read() -> None:
        subprocess.run(
            ["find", str(path), "-type", "f", "-exec", "cat", "{}", "+"],
            stdout=subprocess.DEVNULL,
            check=True,
        )

    return read


class Checker:
    """Every zarr read must give the same array, and that array the generated values."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.reference: np.ndarray | None = None

    def check(self, case: Case, result: np.ndarray | None) -> None:
        if result is None:
            return
        if self.reference is None:
            regions = list(shard_regions(self.shape))
            for region in (regions[0], regions[-1]):
                origin = tuple(s.start for s in region)
                expected = generate(origin, tuple(s.stop - s.start for s in region), GENERATOR)
                if not np.array_equal(result[region], expected):
                    raise RuntimeError(f"{case.label}: wrong values in {region}")
            self.reference = result
        elif not np.array_equal(result, self.reference):
            raise RuntimeError(f"{case.label}: read differs from the other zarr reads")


def measure(cases: list[Case], repeat: int, mounts: MountManager, checker: Checker) -> None:
    """COLD then WARM for every case, the case order rotated on every repetition."""
    for rep in range(repeat):
        order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
        for case in order:
            for mode in ("cold", "warm"):
                if mode == "cold":
                    if case.mounted:
                        mounts.fresh()
                    else:
                        drop_caches()
                started = time.perf_counter()
                result = case.read()
                elapsed = time.perf_counter() - started
                checker.check(case, result)
                case.times[mode].append(elapsed)
                print(
                    f"  rep {rep + 1}/{repeat} {case.key:<7} {mode}: {elapsed:7.3f} s",
                    flush=True,
                )


# -- report ---------------------------------------------------------------------------


def ratio_row(label: str, num: Case, den: Case, targets: dict[str, float] | None) -> str:
    """Throughput ratios num/den, paired per repetition (the two ran close together, so a
    noisy neighbour slows both), as the median and the range over repetitions."""
    cells = []
    for mode in ("cold", "warm"):
        ratios = sorted(
            (num.nbytes / t_num) / (den.nbytes / t_den)
            for t_num, t_den in zip(num.times[mode], den.times[mode], strict=True)
        )
        ratio = statistics.median(ratios)
        cell = f"{ratio:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        if targets is not None:
            verdict = "ok" if ratio >= targets[mode] else "BELOW"
            cell += f", target >= {targets[mode]}: {verdict}"
        cells.append(cell)
    return f"| {label} | {cells[0]} | | {cells[1]} | |"


def report(cases: dict[str, Case], repeat: int) -> str:
    lines = [
        f"| case (median of {repeat}) | cold MiB/s | cold s | warm MiB/s | warm s |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in cases.values():
        cold, warm = (statistics.median(case.times[m]) for m in ("cold", "warm"))
        lines.append(
            f"| {case.key} {case.label} ({case.unit}) "
            f"| {case.mib_s('cold'):.0f} | {cold:.3f} | {case.mib_s('warm'):.0f} | {warm:.3f} |"
        )
    lines.append(ratio_row("**a/b** (mount / plain copy)", cases["a"], cases["b"], TARGETS))
    lines.append(ratio_row("a/c (mount / native sharded)", cases["a"], cases["c"], None))
    lines.append(
        ratio_row("**d** (cat mount / cat shards)", cases["d-mount"], cases["d-shard"], None)
    )
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="uncompressed size (MiB)")
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data", help="data directory")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median reported)")
    args = parser.parse_args()
    if args.size_mib < 1 or args.repeat < 1:
        parser.error("--size-mib and --repeat must be positive")
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache")
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too

    dataset = Dataset(args.data.resolve(), shape_for(args.size_mib))
    dataset.data.mkdir(parents=True, exist_ok=True)
    dataset.log.write_text("")
    mounts = ColdMounts(dataset, interrupts)
    try:
        if dataset.ready():
            print(f"reusing {dataset.data}")
        else:
            dataset.build(mounts)
        plain_files = file_sizes(dataset.plain / ARRAY)
        chunks = [n for name, n in plain_files.items() if name != "zarr.json"]
        source_bytes = sum(file_sizes(dataset.source / ARRAY).values())
        nbytes = math.prod(dataset.shape)
        print(
            f"array {dataset.shape} uint8 = {nbytes / (1 << 20):.0f} MiB, chunks {CHUNK}^3, "
            f"shards {SHARD}^3, zstd: {len(chunks)} chunk files, average chunk "
            f"{statistics.mean(chunks) / 1024:.1f} KiB (min {min(chunks) / 1024:.1f}, "
            f"max {max(chunks) / 1024:.1f}), stored {sum(chunks) / (1 << 20):.1f} MiB"
        )
        view = dataset.mountpoint / ARRAY
        case_list = [
            Case(
                "a", "zarr via shardfs mount", "uncompressed", nbytes, zarr_read(view, False), True
            ),
            Case(
                "b",
                "zarr plain copy",
                "uncompressed",
                nbytes,
                zarr_read(dataset.plain / ARRAY, False),
                False,
            ),
            Case(
                "c",
                "zarr sharded native",
                "uncompressed",
                nbytes,
                zarr_read(dataset.source / ARRAY, True),
                False,
            ),
            Case(
                "d-mount",
                "cat chunk files via mount",
                "stored",
                sum(plain_files.values()),
                cat_read(view),
                True,
            ),
            Case(
                "d-shard",
                "cat shard files",
                "stored",
                source_bytes,
                cat_read(dataset.source / ARRAY),
                False,
            ),
        ]
        measure(case_list, args.repeat, mounts, Checker(dataset.shape))
    finally:
        mounts.stop()
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    print(report({case.key: case for case in case_list}, args.repeat))
    return 0


if __name__ == "__main__":
    run(main)
