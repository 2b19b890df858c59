"""Wall time per chunk file opened and read through a mount, under a 64 MiB `zarr.json`.

Why: an array whose `zarr.json` holds more than the parsed-metadata budget
(16 MiB) had its document read and parsed again on every lookup and open of
one of its chunks (issue 19, item 6). This script writes one source with two
arrays of the same layout, `big` (a `zarr.json` of about --mib MiB of
attributes: records as a catalogue of cells would hold) and `small` (a few
hundred bytes), and mounts it (`-o ro`) with two versions of shardfs in turn:
"before", the package of a git revision (`--before`), and "after", this
working tree (or `--after`). For each it opens and reads --reads distinct chunk files of
each array (their shard indexes already cached) and prints the median wall
time per chunk, the ratio big / small, the ratio before / after, and the
daemon's peak memory (VmHWM) after those reads; then it reads big's
`zarr.json` once through the mount (what a reader opening the array does
first) and prints that time and the peak memory after it. Needs root (FUSE).

    .venv/bin/python -m benchmarks.metadata_cost --before REV [--after REV] [--mib 64]
        [--reads 10] [--results PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from benchmarks.harness import results
from benchmarks.harness.daemons import start_shardfs
from benchmarks.harness.machine import ROOT as REPO
from benchmarks.harness.procs import memory
from benchmarks.harness.results import Result
from benchmarks.harness.runs import Interrupts, run
from tests.conftest import Mounted, stop_mount

SHAPE, SHARDS, CHUNKS = (128, 128), (64, 64), (8, 8)
ARRAYS = ("small", "big")


def write_source(root: Path, mib: int) -> dict[str, int]:
    """The two arrays; the size of each one's `zarr.json`."""
    group = zarr.open_group(root, mode="w")
    records = mib * (1 << 20) // 95  # about 95 bytes each as zarr-python writes them
    cells = [{"id": i, "score": i * 0.25, "label": f"c{i:08d}"} for i in range(records)]
    values = np.arange(np.prod(SHAPE), dtype="uint16").reshape(SHAPE)
    for name, attributes in (("small", {"title": "small"}), ("big", {"cells": cells})):
        array = group.create_array(
            name, shape=SHAPE, dtype="uint16", shards=SHARDS, chunks=CHUNKS, attributes=attributes
        )
        array[...] = values
    return {name: (root / name / "zarr.json").stat().st_size for name in ARRAYS}


def extract(revision: str, target: Path) -> Path:
    """The `shardfs` package of git `revision`, in a directory of its own."""
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "shardfs"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def start(code: Path, source: Path, mountpoint: Path, log: Path) -> Mounted:
    """`shardfs mount -f -o ro` running the package in directory `code`."""
    env = dict(os.environ, PYTHONPATH=str(code))
    return start_shardfs(source, mountpoint, log, "ro", env=env, cwd=code, timeout=60)


def peak_memory(pid: int) -> int:
    return memory(pid, "VmHWM") << 10


def chunk_files(reads: int) -> list[str]:
    """`reads` distinct chunks, none of those `measure` stats first (the kernel knows them)."""
    grid, per_shard = SHAPE[0] // CHUNKS[0], SHARDS[0] // CHUNKS[0]
    keys = [(i, j) for i in range(grid) for j in range(grid) if i % per_shard or j % per_shard]
    keys.sort(key=lambda k: (abs(k[0] - k[1]), k))
    return [f"c/{i}/{j}" for i, j in keys[:reads]]


def measure(view: Path, reads: int) -> dict[str, list[float]]:
    """Seconds per chunk file opened and read, by array; every shard index cached first
    (one chunk of each shard is stat'ed before the clock starts)."""
    per_shard = SHARDS[0] // CHUNKS[0]
    grid = SHAPE[0] // SHARDS[0]
    times: dict[str, list[float]] = {}
    for name in ARRAYS:
        for i in range(grid):
            for j in range(grid):
                os.stat(view / name / f"c/{i * per_shard}/{j * per_shard}")
        times[name] = []
        for key in chunk_files(reads):
            start_time = time.perf_counter()
            with open(view / name / key, "rb") as file:
                assert file.read()
            times[name].append(time.perf_counter() - start_time)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--after", help="git revision to measure (default: the working tree)")
    parser.add_argument("--mib", type=int, default=64, help="size of big's zarr.json (MiB)")
    parser.add_argument("--reads", type=int, default=10, help="distinct chunks per array")
    results.add_option(parser, "metadata_cost")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root: FUSE mounts")
    interrupts = Interrupts()
    work = Path(tempfile.mkdtemp(prefix="shardfs-metadata-cost-"))
    results_: dict[str, dict[str, list[float]]] = {}
    memory_: dict[str, int] = {}
    document: dict[str, tuple[float, int]] = {}
    mounted: Mounted | None = None
    try:
        sizes = write_source(work / "src", args.mib)
        versions = {f"before ({args.before})": extract(args.before, work / "before")}
        if args.after:
            versions[f"after ({args.after})"] = extract(args.after, work / "after")
        else:
            versions["after (working tree)"] = REPO
        for label, code in versions.items():
            with interrupts.deferred():
                mounted = start(code, work / "src", work / "mnt", work / "mount.log")
            print(f"  {label}: measuring", flush=True)
            results_[label] = measure(mounted.path, args.reads)
            memory_[label] = peak_memory(mounted.process.pid)
            start_time = time.perf_counter()
            assert len((mounted.path / "big" / "zarr.json").read_bytes()) > sizes["big"] // 2
            seconds = time.perf_counter() - start_time
            document[label] = (seconds, peak_memory(mounted.process.pid))
            with interrupts.deferred():
                stop_mount(mounted)
                mounted = None
    finally:
        if mounted is not None:
            with interrupts.deferred():
                stop_mount(mounted)
        shutil.rmtree(work, ignore_errors=True)

    result = Result(
        "metadata_cost",
        {"before": args.before, "after": args.after, "mib": args.mib, "reads": args.reads},
    )
    small, big = (
        f"{sizes[n] / (1 << 20):.1f} MiB" if sizes[n] > 1 << 20 else f"{sizes[n]} B" for n in ARRAYS
    )
    table = result.table(
        f"{args.reads} distinct chunk files per array, opened and read through a -o ro mount, "
        "shard indexes cached; median wall time per chunk",
        ["shardfs", f"small zarr.json ({small}) ms", f"big zarr.json ({big}) ms", "big / small",
         "daemon peak MiB", "big zarr.json read once s", "peak MiB after it"],
    )  # fmt: skip
    median = {
        label: {name: statistics.median(times[name]) for name in ARRAYS}
        for label, times in results_.items()
    }
    for label, row in median.items():
        table.row(
            label,
            round(row["small"] * 1e3, 2),
            round(row["big"] * 1e3, 2),
            f"{row['big'] / row['small']:.1f}x",
            round(memory_[label] / (1 << 20)),
            round(document[label][0], 1),
            round(document[label][1] / (1 << 20)),
        )
    before, after = median.values()
    table.row(
        "before / after",
        f"{before['small'] / after['small']:.1f}x",
        f"{before['big'] / after['big']:.0f}x",
        None,
        None,
        None,
        None,
    )
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
