"""DANDI zarr checksum of the unsharded view, side by side with `zarrsum` on a plain copy.

Why: to prove that a sharded array is the same data as an unsharded copy,
one compares their DANDI zarr checksums. `shardfs checksum --virtual` computes
the view's checksum from the shards (each read once, front to back) instead
of reading one file per chunk, and in memory that does not grow with the
number of files. This script measures, in one run and on one machine:

  (a) `shardfs checksum --virtual SOURCE` (the unsharded view, from the shards),
  (b) `zarrsum local COPY` (the `zarr_checksum` package's command, as DANDI users run it)
      on a plain copy of the view, materialized as one file per chunk,
  (c) `shardfs checksum COPY` (the same plain copy, as stored),
  (l) with --synthetic: `benchmarks/generated_listing.py`, the stored checksum of a plain copy that
      is only a generated listing (10M files without 10M inodes),

each COLD (page cache dropped) and WARM (the same command again at once), the
order rotated on every repetition, with the elapsed time and the peak resident
memory of the command's process (as GNU time reports it: ru_maxrss from wait4). The shardfs package
run is this checkout's, or with --shardfs TREE that of TREE (say, a `git
archive` of a commit, untouched by edits in progress); with --baseline TREE,
(a) and (c) run a second time with the package of TREE as (a0) and (c0). All cases must print the same
checksum. The tables show medians; each ratio is the median of per-repetition
ratios, with its range. Needs root (drop_caches) unless --warm-only.

The data, one of:
  default        an array of `--chunks` non-empty inner chunks written by zarr-python 3
                 (2-D uint16, chunks 8 x 8, shards of 32 x 32 chunks, zstd) and its
                 plain copy, made here;
  --source DIR   an existing sharded source, with --plain DIR its plain copy (say,
                 `benchmarks.scale --layout dandi`'s data set);
  --synthetic R  the DANDI layout (3-D uint8, keys c/i/j/k, shards of 32^3 chunks,
                 R x 100 x 100 chunks, so 100-file directories) with chunks of one byte
                 (shape 1^3, no compression): shards written here in seconds, where
                 64^3 chunks would take hours at 10M. No plain copy: case (l) instead.

    .venv/bin/python -m benchmarks.checksum [--chunks 1000000 | --source DIR [--plain DIR]
        | --synthetic ROWS] [--data DIR] [--repeat 3] [--warm-only] [--shardfs TREE]
        [--baseline TREE] [--results PATH]

Without --data, made data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import numpy as np
import zarr

from benchmarks.harness import results
from benchmarks.harness.caches import drop_caches
from benchmarks.harness.daemons import DataDir, layout
from benchmarks.harness.data import tree_size
from benchmarks.harness.data.dandi import DANDI_SHARD, DANDI_SIDE, dandi_value
from benchmarks.harness.machine import ROOT, revision
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import paired, rotated, run, step
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, Node

#: Inner chunk edge (uint16), and inner chunks per shard along each axis.
CHUNK = 8
SHARD = 32
ARRAY = "data"
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
TARGET = 5.0
SHARDFS = [sys.executable, "-m", "shardfs"]
ZARRSUM = str(Path(sys.executable).with_name("zarrsum"))
GENERATED_LISTING = [sys.executable, str(ROOT / "benchmarks" / "generated_listing.py")]
MODES = ("cold", "warm")
#: GNU time, which reports the peak RSS of the command it runs (`%M`, KiB).
TIME = "/usr/bin/time"


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
        return layout(list(self.grid), CHUNK, SHARD, GENERATOR, "zarr")

    def build(self) -> None:
        self.clear()
        with step(f"writing {self.source}, {self.grid[0]} x {self.grid[1]} chunks"):
            write_source(self.source, self.grid)
        with step(f"materializing the view as {self.plain}"):
            print(f"  {materialize(self.source, self.plain)} files", flush=True)
        self.made()


@dataclass
class Synthetic(DataDir):
    """The DANDI layout with chunks of one byte (see the module docstring): `rows` x 100 x
    100 chunks, chunk (i, j, k) holding `dandi_value(i, j, k)`; shards written here."""

    rows: int

    @property
    def params(self) -> dict[str, object]:
        return {"synthetic": "dandi", "rows": self.rows, "generator": GENERATOR}

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.rows, DANDI_SIDE, DANDI_SIDE)

    def build(self) -> None:
        self.clear()
        with step(f"writing {self.source}, {' x '.join(map(str, self.grid))} chunks"):
            write_synthetic(self.source, self.grid)
        check_synthetic(self.source, self.grid)
        self.made()


def write_synthetic(source: Path, grid: tuple[int, int, int]) -> None:
    """The root group and the array `ARRAY`, each shard assembled here: its chunks' bytes
    in C order of the shard's grid, then the index (offset, nbytes per slot, absent slots
    all ones) and its crc32c."""
    n = DANDI_SHARD
    (source / ARRAY).mkdir(parents=True)
    (source / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    sharding = {
        "chunk_shape": [1, 1, 1],
        "codecs": [{"name": "bytes"}],
        "index_codecs": [little, {"name": "crc32c"}],
        "index_location": "end",
    }
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(grid),
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [n, n, n]}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": sharding}],
    }
    (source / ARRAY / "zarr.json").write_text(json.dumps(meta))
    local = np.indices((n, n, n)).reshape(3, -1).T  # the slots' coordinates, in C order
    for shard in np.ndindex(*(-(-g // n) for g in grid)):
        coords = local + np.asarray(shard) * n
        inside = (coords < np.asarray(grid)).all(axis=1)
        entries = np.full((n**3, 2), np.iinfo(np.uint64).max, dtype="<u8")
        entries[inside, 0] = np.arange(int(inside.sum()))
        entries[inside, 1] = 1
        data = dandi_value(*coords[inside].T).tobytes()
        index = entries.tobytes()
        path = source / ARRAY / "c" / "/".join(map(str, shard))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data + index + crc32c.crc32c(index).to_bytes(4, "little"))


def check_synthetic(source: Path, grid: tuple[int, int, int]) -> None:
    """zarr-python must read the values written."""
    array = zarr.open_array(source / ARRAY, mode="r")
    if array.shape != grid or array.shards != (DANDI_SHARD,) * 3 or array.chunks != (1, 1, 1):
        raise RuntimeError(f"{source}: zarr-python sees {array.shape}, {array.shards}")
    last = tuple(g - 1 for g in grid)
    for i, j, k in ((0, 0, 0), (grid[0] // 2, 37, 70), last):
        if array[i, j, k] != dandi_value(i, j, k):
            raise RuntimeError(f"{source}: zarr-python reads another value at {i, j, k}")


# -- the cases ------------------------------------------------------------------------


@dataclass
class Case:
    key: str
    label: str
    command: list[str]
    #: where the shardfs package run comes from (PYTHONPATH, and the working directory,
    #: which `python -m` puts first on the path)
    tree: Path = ROOT
    times: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    #: peak resident memory of the command's process, MiB
    peaks: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})

    def run(self) -> tuple[float, float, str]:
        """(seconds, peak RSS in MiB, the checksum printed on the last line of stdout).

        The peak is the one GNU time reports (its child's ru_maxrss, from wait4). Not
        this process's own wait4: a child started by vfork (as subprocess does) takes
        the high-water mark of the process it was forked from along through exec, so
        it would never show less than this script's 80-odd MiB.
        """
        env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(self.tree)}
        with tempfile.NamedTemporaryFile() as peak, tempfile.TemporaryFile() as out:
            command = [TIME, "-f", "%M", "-o", peak.name, *self.command]
            started = time.perf_counter()
            done = subprocess.run(
                command, stdout=out, stderr=subprocess.PIPE, cwd=self.tree, env=env, check=False
            )
            elapsed = time.perf_counter() - started
            if done.returncode != 0:
                stderr = done.stderr.decode().strip()
                raise RuntimeError(f"{' '.join(self.command)} failed: {stderr}")
            out.seek(0)
            stdout = out.read().decode()
            kib = int(Path(peak.name).read_text().split()[-1])
        return elapsed, kib / 1024, stdout.strip().splitlines()[-1].strip()


def measure(cases: list[Case], repeat: int, modes: tuple[str, ...]) -> str:
    """Every mode for every case, the order rotated on every repetition; returns the
    checksum all of them printed."""
    seen: set[str] = set()
    for rep in range(repeat):
        for case in rotated(cases, rep):
            for mode in modes:
                if mode == "cold":
                    drop_caches()
                elapsed, peak, checksum = case.run()
                seen.add(checksum)
                if len(seen) != 1:
                    raise RuntimeError(f"checksums differ: {sorted(seen)} ({case.key} {mode})")
                case.times[mode].append(elapsed)
                case.peaks[mode].append(peak)
                print(
                    f"  rep {rep + 1}/{repeat} {case.key} {mode}: {elapsed:8.2f} s, "
                    f"peak {peak:6.0f} MiB",
                    flush=True,
                )
    return seen.pop()


# -- report ---------------------------------------------------------------------------


def report(cases: dict[str, Case], repeat: int, modes: tuple[str, ...], result: Result) -> None:
    table = result.table(
        f"Each case's elapsed time and peak resident memory, median (range) of {repeat}",
        ["case", *(f"{mode} s" for mode in modes), *(f"{mode} peak RSS MiB" for mode in modes)],
    )
    for case in cases.values():
        cells = [Spread.of(case.times[m], 2) for m in modes]
        cells += [Spread.of(case.peaks[m], 0) for m in modes]
        table.row(f"{case.key} {case.label}", *cells)
    pairs = [
        ("b", "a", "**b/a** (zarrsum on the copy / shardfs --virtual)", TARGET),
        ("c", "a", "c/a (shardfs on the copy / shardfs --virtual)", None),
        ("a0", "a", "a0/a (--virtual: baseline / this)", None),
        ("c0", "c", "c0/c (on the copy: baseline / this)", None),
        ("l", "a", "l/a (generated listing / --virtual)", None),
    ]
    table = result.table(
        "How many times faster, paired per repetition: median (range)",
        ["ratio", *modes, "target"],
    )
    for slow, fast, label, target in pairs:
        if slow in cases and fast in cases:
            ratios = [
                Spread.of(paired(cases[slow].times[m], cases[fast].times[m]), 1, "x") for m in modes
            ]
            verdict = None
            if target is not None:
                verdict = f">= {target:g}x: " + ", ".join(
                    f"{m} {'ok' if r.median >= target else 'BELOW'}"
                    for m, r in zip(modes, ratios, strict=True)
                )
            table.row(label, *ratios, verdict)


# -- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_set = parser.add_mutually_exclusive_group()
    data_set.add_argument("--chunks", type=int, default=1_000_000, help="inner chunks to write")
    data_set.add_argument("--source", type=Path, help="an existing sharded source")
    data_set.add_argument(
        "--synthetic", type=int, metavar="ROWS", help="DANDI layout, 1-byte chunks"
    )
    parser.add_argument("--plain", type=Path, help="with --source: its plain copy")
    parser.add_argument("--data", type=Path, help="keep made data here (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument("--warm-only", action="store_true", help="no cold runs (no root needed)")
    parser.add_argument(
        "--shardfs", type=Path, help="run the shardfs package of this tree (default: this one)"
    )
    parser.add_argument("--baseline", type=Path, help="also run (a), (c) with shardfs from here")
    results.add_option(parser, "checksum")
    args = parser.parse_args()
    if args.chunks < 1 or args.repeat < 1 or (args.synthetic is not None and args.synthetic < 1):
        parser.error("--chunks, --synthetic and --repeat must be positive")
    if args.plain is not None and args.source is None:
        parser.error("--plain goes with --source")
    modes = ("warm",) if args.warm_only else MODES
    if "cold" in modes and os.geteuid() != 0:
        parser.error("needs root: it drops the page cache (or --warm-only)")
    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-checksum-"))
    tree = ROOT if args.shardfs is None else args.shardfs.resolve()
    code = revision() if args.shardfs is None else str(tree)
    try:
        if args.source is not None:
            source, plain = args.source.resolve(), args.plain and args.plain.resolve()
        else:
            made: DataDir = (
                Dataset(data, grid_for(args.chunks))
                if args.synthetic is None
                else Synthetic(data, args.synthetic)
            )
            data.mkdir(parents=True, exist_ok=True)
            if made.ready():
                print(f"reusing {data}")
            else:
                made.build()
            source, plain = made.source, (made.plain if args.synthetic is None else None)
        shards, shard_bytes = tree_size(source)
        described = f"the source: {source}, {shards} files, {shard_bytes / (1 << 20):.1f} MiB"
        if plain is not None:
            files, nbytes = tree_size(plain)
            described += f"; the copy: {plain}, {files} files, {nbytes / (1 << 20):.1f} MiB"
        print(described, flush=True)
        virtual = [*SHARDFS, "checksum", "--virtual", str(source)]
        cases = [Case("a", "shardfs checksum --virtual (sharded source)", virtual, tree)]
        if plain is not None:
            zarrsum = [ZARRSUM, "local", str(plain)]
            cases.append(Case("b", "zarrsum local (plain copy)", zarrsum, tree))
            stored = [*SHARDFS, "checksum", str(plain)]
            cases.append(Case("c", "shardfs checksum (plain copy)", stored, tree))
        if args.synthetic is not None:
            listing = [*GENERATED_LISTING, str(source), str(args.synthetic)]
            cases.append(Case("l", "stored checksum of a generated listing", listing, tree))
        if args.baseline is not None:
            for case in [c for c in cases if c.key in ("a", "c")]:
                label = f"{case.label}, baseline"
                cases.append(Case(f"{case.key}0", label, case.command, args.baseline.resolve()))
        checksum = measure(cases, args.repeat, modes)
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    result = Result(
        "checksum",
        {
            "chunks": args.chunks if args.source is None and args.synthetic is None else None,
            "synthetic": args.synthetic,
            "repeat": args.repeat,
            "modes": list(modes),
        },
    )
    result.note(f"shardfs: {code}" + (f"; baseline: {args.baseline}" if args.baseline else ""))
    result.note(described)
    result.note(f"checksum (all cases): {checksum}")
    report({case.key: case for case in cases}, args.repeat, modes, result)
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
