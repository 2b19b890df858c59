"""Read throughput through a shardfs mount, side by side with the alternatives.

Why: the point of shardfs is that a reader of plain chunk-per-file Zarr loses
(almost) nothing by reading a sharded array through the mount instead of a
plain copy. This script measures exactly that in one run, on one machine, as
users read: whole arrays, the first read after the page cache was dropped
(COLD) and the same read repeated at once (WARM), one reader and several.

Pairs, each run plain first, then through the mount:

  b  / a   zarr-python 3 reads the whole array from a plain unsharded copy
           (byte-identical chunk files) / through a `-o ro` mount,
  b4 / a4  the same with READERS threads at once, each reading its own slab of
           the array (whole shards): a cluster job's readers in parallel,
  d-shard / d-mount  `cat` of the shard files / of every virtual chunk file;

and on its own, after them, c: zarr-python 3 reads the sharded source natively.
With `--cfloor BINARY` (../shared/tools/cfloor.c, built outside the project as its
header says), two more pairs: b / e and b4 / e4, zarr-python 3 reading the plain copy
through the C floor in `-p` mode (every file opened at its start, read with pread(2),
not preloaded): what any FUSE daemon reaches on this host, in the same run.

Per repetition and pair: the page cache is dropped and the plain side read
(COLD), then the page cache is dropped, a fresh daemon started and the mount
read (COLD); then both are read again at once (WARM: plain, then the mount it
just read). Every ratio is plain time / mount time of one pair (the two ran
back to back, so a noisy neighbour slows both), printed per pair as it is
measured and summed up as the median with its range; 1 is parity, above 1 the
mount is faster. The daemon's CPU time (user + system, all threads, from
/proc) is taken over every mount read, and its FUSE and source request counts
(`shardfs stats`) after the last cold read. The pair order rotates per
repetition. Each size given runs as a run of its own, on a data set of its own;
the large one keeps start-up (the mount's, zarr's) from dominating the ratio.
Needs root (drop_caches, FUSE).

    .venv/bin/python -m benchmarks.read_throughput [--size-mib 512 1024] [--data DIR]
        [--repeat 5] [--readers 4] [--results PATH] [--cfloor BINARY] [--read-ahead-kb K]

Each size writes its own result, `read_throughput-<size>mib` (`--results` names the
directory then, where more than one size is given).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.harness import results
from benchmarks.harness.caches import drop_caches, set_read_ahead
from benchmarks.harness.daemons import Child, MountManager
from benchmarks.harness.data.read import (
    ARRAY,
    CHUNK,
    GENERATOR,
    SHARD,
    Dataset,
    file_sizes,
    generate,
    shape_for,
    shard_regions,
    zarr_read,
)
from benchmarks.harness.machine import ROOT
from benchmarks.harness.procs import cpu as daemon_cpu
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, rotated, run
from shardfs.fuse import control

TARGETS = {"cold": 0.9, "warm": 0.95}


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
    #: daemon CPU seconds per read (mounted cases)
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"cold": [], "warm": []})
    #: `shardfs stats` after the last cold read (mounted cases)
    stats: dict | None = None
    #: another daemon it reads through (the C floor): started afresh for a cold read
    daemon: CFloor | None = None

    def mib_s(self, mode: str) -> float:
        return self.nbytes / (1 << 20) / statistics.median(self.times[mode])


@dataclass
class Pair:
    """A plain read and the same read through the mount, run in that order."""

    label: str
    plain: Case
    mount: Case
    target: dict[str, float] | None = None

    def ratios(self, mode: str) -> list[float]:
        """plain time / mount time, per repetition (the same as mount throughput over
        plain throughput where both count the same bytes)."""
        return [
            (self.mount.nbytes / t_mount) / (self.plain.nbytes / t_plain)
            for t_plain, t_mount in zip(self.plain.times[mode], self.mount.times[mode], strict=True)
        ]


def cat_read(path: Path) -> Callable[[], None]:
    def read() -> None:
        subprocess.run(
            ["find", str(path), "-type", "f", "-exec", "cat", "{}", "+"],
            stdout=subprocess.DEVNULL,
            check=True,
        )

    return read


class CFloor:
    """The C floor serving the plain copy (`cfloor -p`): a fresh daemon per cold read."""

    def __init__(self, binary: Path, tree: Path, mountpoint: Path, interrupts: Interrupts) -> None:
        self.command = [str(binary), "-p", str(tree), str(mountpoint)]
        self.child = Child(interrupts, mountpoint, mountpoint.with_suffix(".log"), "fuse.cfloor")

    def fresh(self) -> int:
        """Start it again, then drop the page cache (it opens every file at start)."""
        self.child.start(self.command)
        drop_caches()
        return self.child.pid

    def stop(self) -> None:
        self.child.stop()


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


class Runner:
    """Times reads, COLD after dropping the page cache (and, for the mount, with a fresh
    daemon), WARM at once."""

    def __init__(
        self,
        mounts: MountManager,
        checker: Checker,
        rep: str,
        options: tuple[str, ...] = (),
        read_ahead_kb: int | None = None,
    ) -> None:
        self.mounts = mounts
        self.checker = checker
        self.rep = rep
        #: mount options beyond `ro` (`--options`)
        self.options = options
        #: the mount's read-ahead set after each start (`--read-ahead-kb`), if given
        self.read_ahead_kb = read_ahead_kb

    def time(self, case: Case, mode: str) -> float:
        pid = None
        if case.daemon is not None:
            if mode == "cold":
                self.mounts.stop()
                pid = case.daemon.fresh()
            else:
                pid = case.daemon.child.pid
        elif mode == "cold":
            if case.mounted:
                mounted = self.mounts.fresh(*self.options)
                if self.read_ahead_kb is not None:
                    set_read_ahead(mounted.path, self.read_ahead_kb)
            else:
                self.mounts.stop()  # no daemon beside a plain read
                drop_caches()
        if case.mounted and self.mounts.current:
            pid = self.mounts.current.process.pid
        cpu = daemon_cpu(pid) if pid else 0.0
        started = time.perf_counter()
        result = case.read()
        elapsed = time.perf_counter() - started
        if pid:
            case.cpu[mode].append(daemon_cpu(pid) - cpu)
            if mode == "cold" and case.mounted:
                with contextlib.suppress(OSError, ValueError):
                    case.stats = control.query(str(self.mounts.dataset.mountpoint))
        self.checker.check(case, result)
        case.times[mode].append(elapsed)
        extra = f" (daemon CPU {case.cpu[mode][-1]:.2f} s)" if pid else ""
        print(f"  rep {self.rep} {case.key:<7} {mode}: {elapsed:7.3f} s{extra}", flush=True)
        return elapsed

    def pair(self, pair: Pair) -> None:
        for mode in ("cold", "warm"):
            plain = self.time(pair.plain, mode)
            mount = self.time(pair.mount, mode)
            print(
                f"  rep {self.rep} {pair.mount.key}/{pair.plain.key} {mode}: "
                f"plain/mount {pair.ratios(mode)[-1]:.2f} ({plain:.3f} s / {mount:.3f} s)",
                flush=True,
            )

    def done(self, case: Case) -> None:
        """After a pair's reads: no other daemon beside the next case's."""
        if case.daemon is not None:
            case.daemon.stop()

    def alone(self, case: Case) -> None:
        for mode in ("cold", "warm"):
            self.time(case, mode)


def measure(pairs: list[Pair], alone: list[Case], repeat: int, runner: Runner) -> None:
    """Every pair COLD then WARM, the pair order rotated on every repetition; then the
    cases measured alone."""
    for rep in range(repeat):
        runner.rep = f"{rep + 1}/{repeat}"
        for pair in rotated(pairs, rep):
            runner.pair(pair)
        for case in alone:
            runner.alone(case)


# -- report ---------------------------------------------------------------------------


def ratio_row(pair: Pair) -> list:
    """A ratio row: per mode the median (range), and the verdict against the target."""
    cells: list = [pair.label]
    for mode in ("cold", "warm"):
        ratios = pair.ratios(mode)
        cells.append(Spread.of(ratios))
        verdict = None
        if pair.target is not None:
            ok = statistics.median(ratios) >= pair.target[mode]
            verdict = f">= {pair.target[mode]}: {'ok' if ok else 'BELOW'}"
        cells.append(verdict)
    return cells


def per_file(requests: dict[str, int], files: int) -> str:
    """Requests by kind, per chunk file."""
    return ", ".join(f"{k} {n / files:.2f}" for k, n in requests.items() if n)


def report(
    cases: dict[str, Case], pairs: list[Pair], repeat: int, files: int, result: Result
) -> None:
    table = result.table(
        f"Each case's whole read, median of {repeat}",
        ["case", "cold MiB/s", "cold s", "warm MiB/s", "warm s", "daemon CPU s cold / warm"],
        detail=True,
    )
    for case in cases.values():
        cold, warm = (statistics.median(case.times[m]) for m in ("cold", "warm"))
        cpu = (
            " / ".join(f"{statistics.median(case.cpu[m]):.2f}" for m in ("cold", "warm"))
            if case.mounted or case.daemon is not None
            else None
        )
        table.row(
            f"{case.key} {case.label} ({case.unit})",
            round(case.mib_s("cold")),
            round(cold, 3),
            round(case.mib_s("warm")),
            round(warm, 3),
            cpu,
        )
    table = result.table(
        f"Ratios plain time / mount time, per pair, median (range) of {repeat}; 1 is parity",
        ["ratio", "cold", "cold target", "warm", "warm target"],
    )
    for pair in pairs:
        table.row(*ratio_row(pair))
    native = Pair("a/c (mount / native sharded, not adjacent)", cases["c"], cases["a"])
    table.row(*ratio_row(native))
    table = result.table(
        "Requests per chunk file of the last cold read (`shardfs stats`)",
        ["case", "FUSE", "source"],
        detail=True,
    )
    for case in cases.values():
        if case.stats is not None:
            fuse, source = (case.stats[part]["requests"] for part in ("fuse", "source"))
            table.row(case.key, per_file(fuse, files), per_file(source, files))


# -- main -----------------------------------------------------------------------------


def run_size(size_mib: int, args: argparse.Namespace, interrupts: Interrupts) -> Result:
    """One run on the data set of `size_mib`: its result."""
    dataset = Dataset(args.data.resolve() / f"read-{size_mib}mib", shape_for(size_mib))
    dataset.data.mkdir(parents=True, exist_ok=True)
    dataset.log.write_text("")
    mounts = MountManager(dataset, interrupts, cold=True)
    floors: list[CFloor] = []
    try:
        if dataset.ready():
            print(f"reusing {dataset.data}")
        else:
            dataset.build(mounts)
        plain_files = file_sizes(dataset.plain / ARRAY)
        chunks = [n for name, n in plain_files.items() if name != "zarr.json"]
        source_bytes = sum(file_sizes(dataset.source / ARRAY).values())
        nbytes = math.prod(dataset.shape)
        summary = (
            f"array {dataset.shape} uint8 = {nbytes / (1 << 20):.0f} MiB, chunks {CHUNK}^3, "
            f"shards {SHARD}^3, zstd: {len(chunks)} chunk files, average chunk "
            f"{statistics.mean(chunks) / 1024:.1f} KiB (min {min(chunks) / 1024:.1f}, "
            f"max {max(chunks) / 1024:.1f}), stored {sum(chunks) / (1 << 20):.1f} MiB"
        )
        print(summary, flush=True)
        view, plain = dataset.mountpoint / ARRAY, dataset.plain / ARRAY
        n = args.readers
        cases = {
            case.key: case
            for case in [
                Case(
                    "a",
                    "zarr via shardfs mount",
                    "uncompressed",
                    nbytes,
                    zarr_read(view, False),
                    True,
                ),
                Case(
                    "b", "zarr plain copy", "uncompressed", nbytes, zarr_read(plain, False), False
                ),
                Case(
                    f"a{n}",
                    f"zarr via mount, {n} threads",
                    "uncompressed",
                    nbytes,
                    zarr_read(view, False, n),
                    True,
                ),
                Case(
                    f"b{n}",
                    f"zarr plain copy, {n} threads",
                    "uncompressed",
                    nbytes,
                    zarr_read(plain, False, n),
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
        }
        pairs = [
            Pair("**a/b** zarr, mount / plain copy", cases["b"], cases["a"], TARGETS),
            Pair(f"**a{n}/b{n}** zarr, {n} threads", cases[f"b{n}"], cases[f"a{n}"], TARGETS),
            Pair("d (cat, throughput mount / shards)", cases["d-shard"], cases["d-mount"]),
        ]
        if args.cfloor is not None:  # each pair with a plain read of its own, just before
            for key, threads in (("e", 1), (f"e{n}", n)):
                mountpoint = dataset.data / f"mnt-cfloor-{key}"
                floor = CFloor(args.cfloor, dataset.plain, mountpoint, interrupts)
                floors.append(floor)
                along = f", {n} threads" if threads > 1 else ""
                plain_case = Case(
                    f"b-{key}", f"zarr plain copy{along}", "uncompressed", nbytes,
                    zarr_read(plain, False, threads), False,
                )  # fmt: skip
                floor_case = Case(
                    key, f"zarr via the C floor (cfloor -p){along}", "uncompressed", nbytes,
                    zarr_read(mountpoint / ARRAY, False, threads), False, daemon=floor,
                )  # fmt: skip
                cases[plain_case.key], cases[key] = plain_case, floor_case
                pairs.append(
                    Pair(f"{key}/b zarr, C floor / plain copy{along}", plain_case, floor_case)
                )
        options = tuple(o for o in args.options.split(",") if o)
        runner = Runner(mounts, Checker(dataset.shape), "", options, args.read_ahead_kb)
        measure(pairs, [cases["c"]], args.repeat, runner)
    finally:
        mounts.stop()
        for floor in floors:
            floor.stop()
    result = Result(
        f"read_throughput-{size_mib}mib",
        {
            "size_mib": size_mib,
            "repeat": args.repeat,
            "readers": args.readers,
            "options": args.options,
            "cfloor": args.cfloor is not None,
            "read_ahead_kb": args.read_ahead_kb,
        },
    )
    result.note(summary)
    report(cases, pairs, args.repeat, len(chunks), result)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size-mib",
        type=int,
        nargs="+",
        default=[512, 1024],
        help="uncompressed size (MiB) of each run's array",
    )
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data", help="data directory")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median reported)")
    parser.add_argument("--readers", type=int, default=4, help="threads of the parallel pair")
    parser.add_argument(
        "--options", default="", help="mount options beyond ro, e.g. front=no (comma-separated)"
    )
    parser.add_argument(
        "--read-ahead-kb",
        type=int,
        help="the mount's read-ahead (KiB), set after each start: READs up to this size "
        "(default: the kernel's, 128)",
    )
    parser.add_argument(
        "--results",
        help="where each size's result goes: a file for one size, else a directory "
        "(default benchmarks/results/read_throughput-<size>mib.json; 'none': nowhere)",
    )
    parser.add_argument(
        "--cfloor",
        type=Path,
        help="the C floor's binary (../shared/tools/cfloor.c, built as its header says)",
    )
    args = parser.parse_args()
    if args.cfloor is not None and not os.access(args.cfloor, os.X_OK):
        parser.error(f"--cfloor {args.cfloor}: not an executable")
    if min(args.size_mib) < 1 or args.repeat < 1 or args.readers < 2:
        parser.error("--size-mib and --repeat must be positive, --readers at least 2")
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache")
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too
    for result in [run_size(size, args, interrupts) for size in args.size_mib]:
        target = args.results
        if target is None or (target != "none" and len(args.size_mib) > 1):
            folder = results.RESULTS if target is None else Path(target)
            target = str(folder / f"{result.workload}.json")
        result.write(results.results_path(target))
    return 0


if __name__ == "__main__":
    run(main)
