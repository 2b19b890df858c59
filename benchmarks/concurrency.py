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

    .venv/bin/python -m benchmarks.concurrency [--chunks 160000] [--data DIR] [--repeat 3]
        [--seconds 3] [--readers 1,2,4,8] [--kinds raw,zarr] [--results PATH]

Without --data, the data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import numpy as np
import zarr

from benchmarks.harness import results
from benchmarks.harness.caches import Warmth, cache_drops
from benchmarks.harness.data.grid import (
    ARRAY,
    CHUNK,
    GENERATOR,
    SAMPLE,
    SHARD,
    Dataset,
    Mounts,
    chunk_key,
    chunk_region,
    values,
)
from benchmarks.harness.procs import cpu, machine_busy, thread_sched
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, rotated, run
from tests.conftest import Mounted

#: Attempts at a measurement during which other jobs keep dropping the caches.
RETRIES = 3
KINDS = {
    "raw": "open and read one whole chunk file",
    "zarr": "zarr-python 3 reads and decodes one chunk",
}
SIDES = ("mount", "plain")
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


def daemon_times(daemon: Mounted | None) -> tuple[float, float, float]:
    """(CPU seconds of all its threads, seconds its loop thread ran, seconds that thread
    waited for a CPU) so far; zeros without a daemon."""
    if daemon is None:
        return 0.0, 0.0, 0.0
    return (cpu(daemon.process.pid), *thread_sched(daemon.process.pid))


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
        order = rotated(cases, rep)
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


def ratio(num: Case, den: Case) -> Spread:
    """num/den throughput, paired per repetition (the two ran close together, so a noisy
    neighbour slows both): the median, and the range."""
    return Spread.of(paired([n.rate for n in num.samples], [d.rate for d in den.samples]))


def report(
    cases: dict[tuple[str, str, int], Case], readers: list[int], repeat: int, result: Result
) -> None:
    for kind in dict.fromkeys(k for _, k, _ in cases):
        table = result.table(
            f"{kind}: {KINDS[kind]}; chunks/s of all readers together, median of {repeat}",
            [
                "readers",
                "mount chunks/s",
                "plain chunks/s",
                "mount N/1",
                "plain N/1",
                "mount/plain",
                "daemon CPU µs per chunk",
                "daemon loop: running + waiting for a CPU",
                "readers CPU mount / plain",
                "cores busy mount / plain",
            ],
        )
        for n in readers:
            mount, plain = cases["mount", kind, n], cases["plain", kind, n]
            table.row(
                n,
                round(mount.median("rate")),
                round(plain.median("rate")),
                ratio(mount, cases["mount", kind, readers[0]]),
                ratio(plain, cases["plain", kind, readers[0]]),
                ratio(mount, plain),
                round(1e6 * mount.median("daemon_per_chunk")),
                f"{mount.median('loop_running'):.0f}% + {mount.median('loop_waiting'):.0f}%",
                f"{mount.median('reader_cpu'):.0f}% / {plain.median('reader_cpu'):.0f}%",
                f"{mount.median('busy'):.0f}% / {plain.median('busy'):.0f}%",
            )


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
    results.add_option(parser, "concurrency")
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
        described = (
            f"array {dataset.grid * CHUNK} x {dataset.grid * CHUNK} uint16, chunks {CHUNK}^2, "
            f"shards {CHUNK * SHARD}^2, zstd: {dataset.grid**2} chunks, about "
            f"{statistics.mean(sizes) / 1024:.2f} KiB each stored"
        )
        print(described)
        bench = Bench(dataset, mounts, interrupts, args.seconds)
        disturbed = measure(bench, list(cases.values()), args.repeat)
        mounts.stop()
        log = dataset.log.read_text(errors="replace").splitlines()
        errors = [line for line in log if "ERROR" in line or "Traceback" in line]
    finally:
        mounts.stop()
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    result = Result(
        "concurrency",
        {
            "chunks": dataset.grid**2,
            "repeat": args.repeat,
            "seconds": args.seconds,
            "readers": readers,
            "kinds": kinds,
        },
    )
    result.note(described)
    result.note(
        f"{args.seconds:g} s per measurement; daemon log: {len(errors)} ERROR/Traceback lines; "
        f"measurements disturbed by cache drops: {disturbed}"
    )
    report(cases, readers, args.repeat, result)
    result.write(results.results_path(args.results))
    return 1 if errors else 0


if __name__ == "__main__":
    run(main)
