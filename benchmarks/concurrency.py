"""Random chunk reads by 1, 2, 4 and 8 processes at once, through a mount and on a plain copy.

Why: one mount serves every process of a machine, so what matters is whether
its throughput grows with the number of readers, up to the number of cores,
as it does for plain chunk files on a local disk. This script measures both
sides in one run, on one array (uint16, 32 x 32 inner chunks, 512 x 512 shards,
zstd, written by tensorstore):

  mount: N reader processes read random chunks through a `-o ro` mount of the
         sharded array,
  plain: the same readers on a plain unsharded copy (tensorstore wrote the same
         data unsharded with the same codecs; its chunk files are byte-identical
         to the view's, checked on a sample when the data set is built),

for N = 1, 2, 4, 8 and two kinds of read: `raw` opens and reads one whole chunk
file, `zarr` has zarr-python 3 read and decode one chunk (checked against the
formula the data was made from). Every measurement is warm: shards and plain
copy are in the page cache, and the daemon holds every shard index. Yet no read
is answered by the kernel's cache of the mount: each mount measurement starts a
fresh daemon, and the readers of a measurement read disjoint random chunks.
Readers start together and read for `--seconds`; the order of the measurements
is rotated per repetition; a measurement during which another job dropped the
caches is made again. Shown are medians, and ratios (N readers / 1 reader per
side, mount / plain) as medians of per-repetition ratios with their range; also
the daemon's CPU time per chunk (all threads), the share of the time its event
loop thread, which serves every request that needs no waiting I/O, was running
or runnable but waiting for a CPU (together near 100%: the loop is saturated),
the readers' CPU (100% = one core) and how busy all cores were, other jobs
included. Needs root (FUSE).

    .venv/bin/python benchmarks/concurrency.py [--chunks 160000] [--data DIR] [--repeat 3]
        [--seconds 3] [--readers 1,2,4,8] [--kinds raw,zarr]

Without --data, the data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import numpy as np
import tensorstore as ts
import zarr
from common import DataDir, Interrupts, MountManager, machine, run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.conftest import Mounted  # noqa: E402

#: Inner chunk edge (uint16), and inner chunks per shard along each axis.
CHUNK = 32
SHARD = 16
ARRAY = "data"
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
#: Chunk files compared between the mount and the plain copy when the data set is built.
SAMPLE = 1000
#: Attempts at a measurement during which other jobs keep dropping the caches.
RETRIES = 3
KINDS = {
    "raw": "open and read one whole chunk file",
    "zarr": "zarr-python 3 reads and decodes one chunk",
}
SIDES = ("mount", "plain")
GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


# -- the data set ---------------------------------------------------------------------


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
        return {
            "grid": self.grid,
            "chunk": CHUNK,
            "shard": SHARD,
            "generator": GENERATOR,
            "tensorstore": version("tensorstore"),
        }

    def build(self, mounts: Mounts) -> None:
        """Write both arrays, give the copy the view's `zarr.json`, and compare a sample of
        chunk files through a mount."""
        self.marker.unlink(missing_ok=True)
        for path in (self.source, self.plain):
            shutil.rmtree(path, ignore_errors=True)
        for path, sharded in ((self.source, True), (self.plain, False)):
            started = time.perf_counter()
            print(f"writing {path}, {self.grid} x {self.grid} chunks ...", flush=True)
            write_array(path, self.grid, sharded)
            print(f"  {time.perf_counter() - started:.1f} s", flush=True)
        view = mounts.fresh().path / ARRAY
        shutil.copyfile(view / "zarr.json", self.plain / ARRAY / "zarr.json")
        rng = random.Random(GENERATOR)
        for index in rng.sample(range(self.grid**2), min(SAMPLE, self.grid**2)):
            key = chunk_key(index, self.grid)
            if (view / key).read_bytes() != (self.plain / ARRAY / key).read_bytes():
                raise RuntimeError(f"{key}: the plain copy differs from the view")
        mounts.stop()
        self.marker.write_text(json.dumps(self.params))


def warm(top: Path) -> None:
    """Read every file below `top` once: page cache and dentries warm."""
    for directory, _, names in os.walk(top):
        for name in names:
            with open(os.path.join(directory, name), "rb") as file:
                while file.read(1 << 20):
                    pass


def cache_drops() -> tuple[int, ...]:
    """How often anyone dropped the page cache or dentries (`drop_caches`) since boot."""
    with open("/proc/vmstat") as f:
        return tuple(int(line.split()[1]) for line in f if line.startswith("drop_"))


class Warmth:
    """Both trees kept warm on a shared machine, whose other jobs drop the caches now and
    then: warmed again whenever /proc/vmstat counts a drop since the last warming."""

    def __init__(self, *tops: Path) -> None:
        self.tops = tops
        self.warmed: tuple[int, ...] | None = None

    def ensure(self) -> None:
        while (drops := cache_drops()) != self.warmed:  # again if dropped while warming
            for top in self.tops:
                warm(top)
            self.warmed = drops


# -- mounts ---------------------------------------------------------------------------


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


# -- the readers ----------------------------------------------------------------------


@dataclass
class Reading:
    """What one reader process did."""

    reads: int
    seconds: float
    cpu: float
    wrapped: bool  #: it read all its chunks and started over


def read_chunks(
    top: str,
    kind: str,
    chunks: list[int],
    grid: int,
    start: Barrier,
    seconds: float,
    results: Queue[Reading | str],
) -> None:
    """One reader process: its `chunks` in order, for `seconds` after the common start."""
    try:
        array = zarr.open_array(top, mode="r") if kind == "zarr" else None
        start.wait(timeout=120)
        cpu0, began = sum(os.times()[:2]), time.perf_counter()
        reads, deadline = 0, began + seconds
        while (now := time.perf_counter()) < deadline:
            index = chunks[reads % len(chunks)]
            if array is None:
                with open(f"{top}/{chunk_key(index, grid)}", "rb") as file:
                    file.read()
            else:
                region = chunk_region(index, grid)
                if not np.array_equal(array[region], values(*region)):
                    raise RuntimeError(f"{top}: wrong values in chunk {index}")
            reads += 1
        cpu = sum(os.times()[:2]) - cpu0
        results.put(Reading(reads, now - began, cpu, reads > len(chunks)))
    except BaseException as e:
        start.abort()  # nobody waits for a reader that will never come
        results.put(f"reader failed: {e!r}")
        raise


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / CLOCK_TICK, int(fields[12]) / CLOCK_TICK


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far."""
    return sum(cpu_split(pid))


def thread_sched(pid: int) -> tuple[float, float]:
    """(seconds running, seconds runnable but waiting for a CPU) of the main thread of `pid`:
    the daemon's event loop, where it serves every request that needs no waiting I/O."""
    with open(f"/proc/{pid}/schedstat") as f:
        running, waiting, _ = (int(n) for n in f.read().split())
    return running / 1e9, waiting / 1e9


def daemon_times(daemon: Mounted | None) -> tuple[float, float, float]:
    """(CPU seconds of all its threads, seconds its loop thread ran, seconds that thread
    waited for a CPU) so far; zeros without a daemon."""
    if daemon is None:
        return 0.0, 0.0, 0.0
    return (process_cpu(daemon.process.pid), *thread_sched(daemon.process.pid))


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        jiffies = [int(n) for n in f.readline().split()[1:]]
    return jiffies[0] + jiffies[1] + jiffies[2] + sum(jiffies[5:8]), sum(jiffies[:8])


# -- the cases ------------------------------------------------------------------------


@dataclass
class Sample:
    """One measurement: chunks/s summed over the readers, and where the CPU went."""

    rate: float
    reader_cpu: float  #: all readers together, 100% = one core
    busy: float  #: all cores, other jobs included, 100% = all busy
    daemon_per_chunk: float | None = None  #: CPU seconds of all its threads per chunk
    loop_running: float | None = None  #: the daemon's loop thread, % of the time
    loop_waiting: float | None = None  #: ... runnable, but waiting for a CPU


@dataclass
class Case:
    """One side, kind of read and number of readers, with a sample per repetition."""

    side: str
    kind: str
    readers: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.side} {self.kind} x{self.readers}"

    def median(self, attribute: str) -> float:
        return statistics.median(getattr(s, attribute) for s in self.samples)


class Bench:
    """Runs measurements: a fresh, warmed mount for each on the mount side, and the reader
    processes, started together."""

    def __init__(self, dataset: Dataset, mounts: Mounts, interrupts: Interrupts, seconds: float):
        self.dataset = dataset
        self.mounts = mounts
        self.interrupts = interrupts
        self.seconds = seconds
        # Readers are not forks of this process (its mount, its threads); each imports this
        # script, before the common start.
        self.context = multiprocessing.get_context("forkserver")

    def run(self, case: Case, chunks: list[int]) -> Sample:
        """One measurement; `chunks` is this measurement's share of a random permutation."""
        daemon = None
        if case.side == "mount":
            daemon = self.mounts.warmed()
            top = daemon.path / ARRAY
        else:
            top = self.dataset.plain / ARRAY
        start = self.context.Barrier(case.readers + 1)
        results = self.context.Queue()
        readers = [
            self.context.Process(
                target=read_chunks,
                args=(
                    str(top),
                    case.kind,
                    chunks[k :: case.readers],
                    self.dataset.grid,
                    start,
                    self.seconds,
                    results,
                ),
            )
            for k in range(case.readers)
        ]
        try:
            with self.interrupts.deferred():  # every started reader is in `readers`
                for reader in readers:
                    reader.start()
            # Every reader is ready; or one failed, and `results` says why.
            with contextlib.suppress(threading.BrokenBarrierError):
                start.wait(timeout=120)
            busy0, times0 = machine_busy(), daemon_times(daemon)
            time.sleep(self.seconds)
            busy1, times1 = machine_busy(), daemon_times(daemon)
            got = [results.get(timeout=self.seconds + 60) for _ in readers]
            for reader in readers:
                reader.join(timeout=30)
        finally:
            for reader in readers:
                if reader.is_alive():
                    reader.kill()
                    reader.join()
            self.mounts.stop()
        failed = [r for r in got if isinstance(r, str)]
        if failed:
            raise RuntimeError(f"{case.label}: {'; '.join(sorted(set(failed)))}")
        readings = [r for r in got if isinstance(r, Reading)]
        if daemon is not None and any(r.wrapped for r in readings):
            raise RuntimeError(f"{case.label}: readers ran out of chunks; use a larger --chunks")
        rate = sum(r.reads / r.seconds for r in readings)
        sample = Sample(
            rate=rate,
            reader_cpu=100 * sum(r.cpu / r.seconds for r in readings),
            busy=100 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
        )
        if daemon is not None:
            cpu, running, waiting = (b - a for a, b in zip(times0, times1, strict=True))
            sample.daemon_per_chunk = cpu / (rate * self.seconds)
            sample.loop_running = 100 * running / self.seconds
            sample.loop_waiting = 100 * waiting / self.seconds
        return sample


def measure(bench: Bench, cases: list[Case], repeat: int) -> int:
    """Every case once per repetition, the order rotated, each repetition reading a new
    permutation cut into disjoint shares, one per case of a side. A measurement during which another
    job dropped the caches is made again, after warming (up to RETRIES times). Returns how
    many measurements were kept although a drop disturbed them."""
    dataset = bench.dataset
    warmth = Warmth(dataset.source, dataset.plain)
    total = dataset.grid**2
    share = total // sum(case.side == "mount" for case in cases)
    disturbed = 0
    for rep in range(repeat):
        permutation = np.random.default_rng([GENERATOR, rep]).permutation(total).tolist()
        order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
        for case in order:
            slot = [c for c in cases if c.side == case.side].index(case)
            chunks = permutation[slot * share : (slot + 1) * share]
            for attempt in range(1, RETRIES + 1):
                warmth.ensure()
                drops = cache_drops()
                sample = bench.run(case, chunks)
                if cache_drops() == drops:
                    break
                print(f"  caches dropped during {case.label} (attempt {attempt})", flush=True)
            else:
                disturbed += 1
            case.samples.append(sample)
            extra = ""
            if sample.daemon_per_chunk is not None:
                extra = (
                    f", daemon {1e6 * sample.daemon_per_chunk:4.0f} µs CPU/chunk, loop thread "
                    f"running {sample.loop_running:3.0f}% + waiting for a CPU "
                    f"{sample.loop_waiting:3.0f}%"
                )
            print(
                f"  rep {rep + 1}/{repeat} {case.label:<15} {sample.rate:9.0f} chunks/s, "
                f"readers {sample.reader_cpu:3.0f}% CPU, cores {sample.busy:3.0f}% busy{extra}",
                flush=True,
            )
    return disturbed


# -- report ---------------------------------------------------------------------------


def ratio(num: Case, den: Case) -> str:
    """num/den throughput, paired per repetition (the two ran close together, so a noisy
    neighbour slows both): the median, and the range."""
    ratios = sorted(n.rate / d.rate for n, d in zip(num.samples, den.samples, strict=True))
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def report(cases: dict[tuple[str, str, int], Case], readers: list[int], repeat: int) -> str:
    lines = []
    for kind in dict.fromkeys(k for _, k, _ in cases):
        lines += [
            "",
            f"{kind}: {KINDS[kind]}; chunks/s of all readers together, median of {repeat}",
            "",
            "| readers | mount chunks/s | plain chunks/s | mount N/1 | plain N/1 | mount/plain "
            "| daemon CPU per chunk | daemon loop: running + waiting for a CPU "
            "| readers CPU mount / plain | cores busy mount / plain |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for n in readers:
            mount, plain = cases["mount", kind, n], cases["plain", kind, n]
            lines.append(
                f"| {n} | {mount.median('rate'):.0f} | {plain.median('rate'):.0f} "
                f"| {ratio(mount, cases['mount', kind, readers[0]])} "
                f"| {ratio(plain, cases['plain', kind, readers[0]])} "
                f"| {ratio(mount, plain)} "
                f"| {1e6 * mount.median('daemon_per_chunk'):.0f} µs "
                f"| {mount.median('loop_running'):.0f}% + {mount.median('loop_waiting'):.0f}% "
                f"| {mount.median('reader_cpu'):.0f}% / {plain.median('reader_cpu'):.0f}% "
                f"| {mount.median('busy'):.0f}% / {plain.median('busy'):.0f}% |"
            )
    return "\n".join(lines)


def stored_sizes(top: Path, grid: int, sample: int) -> Iterator[int]:
    """Sizes of `sample` random chunk files of the array at `top`."""
    for index in random.Random(0).sample(range(grid * grid), min(sample, grid * grid)):
        yield (top / chunk_key(index, grid)).stat().st_size


# -- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=160_000, help="inner chunks (about)")
    parser.add_argument("--data", type=Path, help="keep the data here (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    parser.add_argument("--readers", default="1,2,4,8", help="reader counts, the first the base")
    parser.add_argument("--kinds", default="raw,zarr", help=f"kinds of read: {','.join(KINDS)}")
    args = parser.parse_args()
    readers = [int(n) for n in args.readers.split(",")]
    kinds = args.kinds.split(",")
    if args.chunks < 1 or args.repeat < 1 or args.seconds <= 0 or min(readers) < 1:
        parser.error("--chunks, --repeat, --seconds and --readers must be positive")
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    if os.geteuid() != 0:
        parser.error("needs root: FUSE mounts")
    interrupts = Interrupts()  # so `finally` unmounts and kills the readers on SIGTERM too

    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-conc-"))
    dataset = Dataset(data, math.isqrt(args.chunks - 1) + 1)
    data.mkdir(parents=True, exist_ok=True)
    dataset.log.write_text("")
    mounts = Mounts(dataset, interrupts)
    cases = {
        (side, kind, n): Case(side, kind, n) for kind in kinds for n in readers for side in SIDES
    }
    try:
        if dataset.ready():
            print(f"reusing {data}")
        else:
            dataset.build(mounts)
        sizes = list(stored_sizes(dataset.plain / ARRAY, dataset.grid, SAMPLE))
        print(
            f"array {dataset.grid * CHUNK} x {dataset.grid * CHUNK} uint16, chunks {CHUNK}^2, "
            f"shards {CHUNK * SHARD}^2, zstd: {dataset.grid**2} chunks, about "
            f"{statistics.mean(sizes) / 1024:.2f} KiB each stored"
        )
        bench = Bench(dataset, mounts, interrupts, args.seconds)
        disturbed = measure(bench, list(cases.values()), args.repeat)
        mounts.stop()
        log = dataset.log.read_text(errors="replace").splitlines()
        errors = [line for line in log if "ERROR" in line or "Traceback" in line]
    finally:
        mounts.stop()
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    print(
        f"{args.seconds:g} s per measurement; daemon log: {len(errors)} ERROR/Traceback lines; "
        f"measurements disturbed by cache drops: {disturbed}"
    )
    print(report(cases, readers, args.repeat))
    return 1 if errors else 0


if __name__ == "__main__":
    run(main)
