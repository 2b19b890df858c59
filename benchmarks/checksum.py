"""DANDI zarr checksum of the unsharded view, side by side with `zarrsum` on a plain copy.

Why: to prove that a sharded array is the same data as an unsharded copy,
one compares their DANDI zarr checksums. `shardfs checksum --virtual` computes
the view's checksum from the shards (each read once, sequentially) instead
of reading one file per chunk. This script measures, in one run and on one
machine, an array of `--chunks` non-empty inner chunks written by zarr-python 3:

  (a) `shardfs checksum --virtual SOURCE` (the unsharded view, from the shards),
  (b) `zarrsum local COPY` (the `zarr_checksum` package's command, as DANDI users run it)
      on a plain copy of the view, materialized as one file per chunk,
  (c) `shardfs checksum COPY` (the same plain copy, as stored),

each COLD (page cache dropped) and WARM (the same command again at once), the
order rotated on every repetition. All three must print the same checksum.
The table shows medians; each ratio is the median of per-repetition ratios,
with its range. Needs root (drop_caches).

    .venv/bin/python benchmarks/checksum.py [--chunks 1000000] [--data DIR] [--repeat 3]

Without --data, the data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
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
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr
from common import DataDir, machine
from read_throughput import drop_caches

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from shardfs.storage import LocalStorage  # noqa: E402
from shardfs.view import Namespace, Node  # noqa: E402

#: Inner chunk edge (uint16), and inner chunks per shard along each axis.
CHUNK = 8
SHARD = 32
ARRAY = "data"
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
TARGET = 5.0
SHARDFS = [sys.executable, "-m", "shardfs"]
ZARRSUM = str(Path(sys.executable).with_name("zarrsum"))


# -- the data set ---------------------------------------------------------------------


def grid_for(chunks: int) -> tuple[int, int]:
    """A chunk grid of about `chunks` chunks, as square as possible."""
    cols = math.isqrt(chunks)
    return -(-chunks // cols), cols


def write_source(source: Path, grid: tuple[int, int]) -> None:
    """The sharded array: a ramp that zstd packs small, never the fill value (every chunk
    is stored)."""
    shape = tuple(n * CHUNK for n in grid)
    array = zarr.create_array(
        store=source,
        name=ARRAY,
        shape=shape,
        chunks=(CHUNK, CHUNK),
        shards=(CHUNK * SHARD, CHUNK * SHARD),
        dtype="uint16",
        fill_value=0,
    )
    rows = CHUNK * SHARD
    x = np.arange(shape[1], dtype=np.uint32)
    for start in range(0, shape[0], rows):  # one row of shards at a time: bounded memory
        y = np.arange(start, min(start + rows, shape[0]), dtype=np.uint32)
        array[start : start + len(y)] = (1 + (y[:, None] * 7 + x[None, :]) % 4093).astype(np.uint16)


def materialize(source: Path, copy: Path) -> int:
    """Write every file of the unsharded view of `source` below `copy`: the plain copy
    a reader of the mount would make. Returns the number of files."""
    namespace = Namespace(LocalStorage(source))

    def write(node: Node) -> None:
        reader = namespace.open(node)
        (copy / node.path).write_bytes(reader.read(0, reader.size))

    files = 0
    pending = [namespace.root()]
    with ThreadPoolExecutor(4) as pool:
        while pending:
            directory = pending.pop()
            (copy / directory.path).mkdir(parents=True, exist_ok=True)
            leaves = []
            for _, node, _ in namespace.listdir(directory):
                (pending if node.is_dir else leaves).append(node)
            files += len(leaves)
            list(pool.map(write, leaves))
    return files


@dataclass
class Dataset(DataDir):
    grid: tuple[int, int]

    @property
    def params(self) -> dict[str, object]:
        return {
            "grid": list(self.grid),
            "chunk": CHUNK,
            "shard": SHARD,
            "generator": GENERATOR,
            "zarr": zarr.__version__,
        }

    def build(self) -> None:
        self.marker.unlink(missing_ok=True)
        for path in (self.source, self.plain):
            shutil.rmtree(path, ignore_errors=True)
        started = time.perf_counter()
        print(f"writing {self.source}, {self.grid[0]} x {self.grid[1]} chunks ...", flush=True)
        write_source(self.source, self.grid)
        print(f"  {time.perf_counter() - started:.1f} s", flush=True)
        started = time.perf_counter()
        print(f"materializing the view as {self.plain} ...", flush=True)
        files = materialize(self.source, self.plain)
        print(f"  {files} files, {time.perf_counter() - started:.1f} s", flush=True)
        self.marker.write_text(json.dumps(self.params))


def tree_size(top: Path) -> tuple[int, int]:
    """(files, bytes) below `top`."""
    files = nbytes = 0
    for directory, _, names in os.walk(top):
        files += len(names)
        nbytes += sum(os.stat(os.path.join(directory, name)).st_size for name in names)
    return files, nbytes


# -- the cases ------------------------------------------------------------------------


@dataclass
class Case:
    key: str
    label: str
    command: list[str]
    times: dict[str, list[float]] = field(default_factory=lambda: {"cold": [], "warm": []})

    def run(self) -> tuple[float, str]:
        """(seconds, the checksum printed on the last line of stdout)."""
        started = time.perf_counter()
        done = subprocess.run(
            self.command, capture_output=True, text=True, check=False, cwd=ROOT, env=_env()
        )
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(self.command)} failed: {done.stderr.strip()}")
        return elapsed, done.stdout.strip().splitlines()[-1].strip()


def _env() -> dict[str, str]:
    return {**os.environ, "TQDM_DISABLE": "1"}  # zarrsum's bar would only cost it time


def measure(cases: list[Case], repeat: int) -> str:
    """COLD then WARM for every case, the order rotated on every repetition; returns the
    checksum all of them printed."""
    seen: set[str] = set()
    for rep in range(repeat):
        for case in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
            for mode in ("cold", "warm"):
                if mode == "cold":
                    drop_caches()
                elapsed, checksum = case.run()
                seen.add(checksum)
                if len(seen) != 1:
                    raise RuntimeError(f"checksums differ: {sorted(seen)} ({case.key} {mode})")
                case.times[mode].append(elapsed)
                print(f"  rep {rep + 1}/{repeat} {case.key} {mode}: {elapsed:8.2f} s", flush=True)
    return seen.pop()


# -- report ---------------------------------------------------------------------------


def ratio_row(label: str, slow: Case, fast: Case, target: float | None) -> str:
    """How many times faster `fast` is than `slow`, paired per repetition (the two ran close
    together, so a noisy neighbour slows both): the median, and the range."""
    cells = []
    for mode in ("cold", "warm"):
        ratios = sorted(s / f for s, f in zip(slow.times[mode], fast.times[mode], strict=True))
        ratio = statistics.median(ratios)
        cell = f"{ratio:.1f}x ({ratios[0]:.1f}-{ratios[-1]:.1f})"
        if target is not None:
            cell += f", target >= {target:g}x: {'ok' if ratio >= target else 'BELOW'}"
        cells.append(cell)
    return f"| {label} | {cells[0]} | {cells[1]} |"


def report(cases: dict[str, Case], repeat: int) -> str:
    lines = [f"| case (median of {repeat}) | cold s | warm s |", "|---|---:|---:|"]
    for case in cases.values():
        cold, warm = (statistics.median(case.times[m]) for m in ("cold", "warm"))
        lines.append(f"| {case.key} {case.label} | {cold:.2f} | {warm:.2f} |")
    headline = "**b/a** (zarrsum on the copy / shardfs --virtual)"
    lines.append(ratio_row(headline, cases["b"], cases["a"], TARGET))
    lines.append(
        ratio_row("c/a (shardfs on the copy / shardfs --virtual)", cases["c"], cases["a"], None)
    )
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000, help="inner chunks of the array")
    parser.add_argument("--data", type=Path, help="keep the data here (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    args = parser.parse_args()
    if args.chunks < 1 or args.repeat < 1:
        parser.error("--chunks and --repeat must be positive")
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache")
    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-checksum-"))
    try:
        dataset = Dataset(data, grid_for(args.chunks))
        data.mkdir(parents=True, exist_ok=True)
        if dataset.ready():
            print(f"reusing {data}")
        else:
            dataset.build()
        files, nbytes = tree_size(dataset.plain)
        shards, shard_bytes = tree_size(dataset.source)
        grid = dataset.grid
        print(
            f"array {grid[0] * CHUNK} x {grid[1] * CHUNK} uint16, chunks {CHUNK}^2, shards "
            f"{CHUNK * SHARD}^2, zstd: {grid[0] * grid[1]} chunks; the copy: {files} files, "
            f"{nbytes / (1 << 20):.1f} MiB; the source: {shards} files, "
            f"{shard_bytes / (1 << 20):.1f} MiB"
        )
        case_list = [
            Case(
                "a",
                "shardfs checksum --virtual (sharded source)",
                [*SHARDFS, "checksum", "--virtual", str(dataset.source)],
            ),
            Case("b", "zarrsum local (plain copy)", [ZARRSUM, "local", str(dataset.plain)]),
            Case("c", "shardfs checksum (plain copy)", [*SHARDFS, "checksum", str(dataset.plain)]),
        ]
        checksum = measure(case_list, args.repeat)
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    print(f"checksum (all cases): {checksum}")
    print(report({case.key: case for case in case_list}, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
