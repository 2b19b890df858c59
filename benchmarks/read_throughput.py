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

    .venv/bin/python benchmarks/read_throughput.py [--size-mib 512 1024] [--data DIR]
        [--repeat 5] [--readers 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr
from common import DataDir, Interrupts, MountManager, machine, run
from zarr.codecs import ZstdCodec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from shardfs.fuse import control  # noqa: E402
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


def daemon_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) process `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


class Runner:
    """Times reads, COLD after dropping the page cache (and, for the mount, with a fresh
    daemon), WARM at once."""

    def __init__(self, mounts: ColdMounts, checker: Checker, rep: str) -> None:
        self.mounts = mounts
        self.checker = checker
        self.rep = rep

    def time(self, case: Case, mode: str) -> float:
        if mode == "cold":
            if case.mounted:
                self.mounts.fresh()
            else:
                self.mounts.stop()  # no daemon beside a plain read
                drop_caches()
        pid = self.mounts.current.process.pid if case.mounted and self.mounts.current else None
        cpu = daemon_cpu(pid) if pid else 0.0
        started = time.perf_counter()
        result = case.read()
        elapsed = time.perf_counter() - started
        if pid:
            case.cpu[mode].append(daemon_cpu(pid) - cpu)
            if mode == "cold":
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

    def alone(self, case: Case) -> None:
        for mode in ("cold", "warm"):
            self.time(case, mode)


def measure(pairs: list[Pair], alone: list[Case], repeat: int, runner: Runner) -> None:
    """Every pair COLD then WARM, the pair order rotated on every repetition; then the
    cases measured alone."""
    for rep in range(repeat):
        runner.rep = f"{rep + 1}/{repeat}"
        for pair in pairs[rep % len(pairs) :] + pairs[: rep % len(pairs)]:
            runner.pair(pair)
        for case in alone:
            runner.alone(case)


# -- report ---------------------------------------------------------------------------


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """The median of `values` with their range."""
    ordered = sorted(values)
    median = fmt.format(statistics.median(ordered))
    return f"{median} ({fmt.format(ordered[0])}-{fmt.format(ordered[-1])})"


def ratio_row(pair: Pair) -> str:
    cells = []
    for mode in ("cold", "warm"):
        ratios = pair.ratios(mode)
        cell = spread(ratios)
        if pair.target is not None:
            verdict = "ok" if statistics.median(ratios) >= pair.target[mode] else "BELOW"
            cell += f", target >= {pair.target[mode]}: {verdict}"
        cells.append(cell)
    each = " / ".join(" ".join(f"{r:.2f}" for r in pair.ratios(m)) for m in ("cold", "warm"))
    return f"| {pair.label} | {cells[0]} | {cells[1]} | {each} |"


def stats_row(case: Case, files: int) -> str | None:
    """FUSE requests and source requests per chunk file of the last cold read."""
    if case.stats is None:
        return None
    fuse = case.stats["fuse"]["requests"]
    source = case.stats["source"]["requests"]
    kinds = ", ".join(f"{k} {n / files:.2f}" for k, n in fuse.items() if n)
    stored = ", ".join(f"{k} {n / files:.2f}" for k, n in source.items() if n)
    return f"{case.key}: per chunk file, FUSE: {kinds}; source: {stored}"


def report(cases: dict[str, Case], pairs: list[Pair], repeat: int, files: int) -> str:
    lines = [
        f"| case (median of {repeat}) | cold MiB/s | cold s | warm MiB/s | warm s "
        "| daemon CPU s cold / warm |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in cases.values():
        cold, warm = (statistics.median(case.times[m]) for m in ("cold", "warm"))
        cpu = (
            " / ".join(f"{statistics.median(case.cpu[m]):.2f}" for m in ("cold", "warm"))
            if case.mounted
            else ""
        )
        lines.append(
            f"| {case.key} {case.label} ({case.unit}) "
            f"| {case.mib_s('cold'):.0f} | {cold:.3f} | {case.mib_s('warm'):.0f} | {warm:.3f} "
            f"| {cpu} |"
        )
    lines += [
        "",
        "| ratio, plain time / mount time, per pair | cold: median (range) "
        "| warm: median (range) | each repetition, cold / warm |",
        "|---|---|---|---|",
    ]
    lines += [ratio_row(pair) for pair in pairs]
    native = Pair("a/c (mount / native sharded, not adjacent)", cases["c"], cases["a"])
    lines.append(ratio_row(native))
    rows = [stats_row(case, files) for case in cases.values()]
    lines += ["", *(row for row in rows if row)]
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------


def run_size(size_mib: int, args: argparse.Namespace, interrupts: Interrupts) -> str:
    """One run on the data set of `size_mib`: its report."""
    dataset = Dataset(args.data.resolve() / f"read-{size_mib}mib", shape_for(size_mib))
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
        runner = Runner(mounts, Checker(dataset.shape), "")
        measure(pairs, [cases["c"]], args.repeat, runner)
    finally:
        mounts.stop()
    return "\n".join([summary, "", report(cases, pairs, args.repeat, len(chunks))])


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
    args = parser.parse_args()
    if min(args.size_mib) < 1 or args.repeat < 1 or args.readers < 2:
        parser.error("--size-mib and --repeat must be positive, --readers at least 2")
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache")
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too
    reports = [run_size(size, args, interrupts) for size in args.size_mib]
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    for text in reports:
        print()
        print(text)
    return 0


if __name__ == "__main__":
    run(main)
