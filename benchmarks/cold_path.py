"""Where the time of a cold read and of a small-chunk write goes (issue 33).

Why: a cold read through a `-o ro` mount and a write of many small chunks through a
read-write one are what users still wait on. This script breaks both down beside
floors that show what any pyfuse3 + trio daemon costs for the same kernel requests:

reads (the read_throughput data set: uint8, 64^3 zstd chunks in 256^3 shards), each
case a whole-array zarr-python 3 read after the page cache was dropped, rotated per
repetition:

  plain     the plain unsharded copy on local disk,
  shardfs   a fresh `-o ro` mount of the sharded source,
  src-warm  the same, the shard files read into the page cache before (no disk I/O,
            no worker thread: what the cold read costs beyond the disk),
  floor     `benchmarks.floor serve-read`: a pyfuse3 + trio daemon with trivial handlers serving the
            plain copy's files from memory, kernel-served as `-o ro` (ENOSYS to open
            and opendir, 300 s timeouts): the least any pyfuse3 daemon costs;

with the daemon's CPU (user + system, all threads, from /proc) and, for shardfs, the
FUSE and source requests per chunk file (`shardfs stats`). Then per request kind: ten
threads stat every chunk file (lookups), then open, read and close each (an IOCTL,
from Python's isatty at open, and a READ), through shardfs (source cold, and warm) and
the floor. Then one profiled run of shardfs (source cold, and warm): the daemon runs
under `daemon`, which counts in the adapter per handler its CPU (the thread CPU of
handlers that ran inline, no await), its inline calls and WouldBlock retries (thread
hops) with their hand-off and I/O times, and the most worker threads at once; and the
page cache held after the read (fincore) of the shard files and of the chunk files.

writes (write_throughput --small-chunks: 2048 chunk files of 32^3 uint16): zarr-python
2.18 through `-o rw,view=v2,shard_new=8` and zarr-python 3 through `-o rw`, each beside
the plain directory with os.sync() and `benchmarks.floor serve-write`, a read-write pyfuse3 + trio daemon
with trivial handlers keeping files in memory (1 s timeouts, getxattr ENODATA, like a
shardfs rw mount). Each repetition runs plain, floor, shardfs in that order; ratios are
plain time / time, per repetition. Then one profiled shardfs run of each.

Medians with their ranges; needs root (drop_caches, FUSE).

    .venv/bin/python -m benchmarks.cold_path reads [--size-mib 256] [--repeat 5] [--data DIR]
        [--variants] [--results PATH]
    .venv/bin/python -m benchmarks.cold_path writes [--repeat 3] [--data DIR] [--results PATH]

The result is `cold_path-reads` (`cold_path-variants` with --variants) or `cold_path-writes`.

With --variants, the reads are plain and shardfs beside two experiments on the daemon
(PATCH_ENV: no thread hop, and the whole shard read ahead at open), nothing else.

(internal: `daemon ARGS...`: `shardfs ARGS...` with the adapter's counters, written as
JSON to $COLD_PATH_COUNTS at exit and on SIGUSR2.)
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import results, writers
from benchmarks.harness.caches import drop_caches, resident_mib
from benchmarks.harness.daemons import Child, MountManager, WriteMounts, start_shardfs
from benchmarks.harness.data import read as rt
from benchmarks.harness.machine import ROOT
from benchmarks.harness.procs import cpu_split as cpu_of
from benchmarks.harness.results import Result, Spread, Table
from benchmarks.harness.runs import Interrupts, paired, rotated, run
from shardfs.fuse import control
from tests.conftest import Mounted

COUNTS_ENV = "COLD_PATH_COUNTS"
#: Experiments on the daemon (`--variants`), not shardfs's behaviour: "nohop" runs every
#: core call at once on the event loop, blocking it on a cold read instead of retrying in
#: a worker thread; "willneed" has the kernel read each local shard file whole into the
#: page cache (POSIX_FADV_WILLNEED) as soon as shardfs opens it, before its chunks are read.
PATCH_ENV = "COLD_PATH_PATCH"
VARIANTS = ("nohop", "willneed")


def patch(variant: str) -> None:
    """Apply experiment `variant` (see PATCH_ENV) to this daemon."""
    from shardfs.fuse import adapter
    from shardfs.storage import local

    if variant == "nohop":

        async def blocking(self: Any, fn: Callable[..., Any], *args: Any) -> Any:
            return fn(*args)

        adapter.Operations._run = blocking  # type: ignore[method-assign]
    elif variant == "willneed":
        opened = local._FilePin.__init__

        def willneed(self: Any, *args: Any) -> None:
            opened(self, *args)
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_WILLNEED)

        local._FilePin.__init__ = willneed  # type: ignore[method-assign]
    elif variant:
        raise ValueError(f"unknown variant {variant!r}")


# -- the floors -------------------------------------------------------------------------


def floor(interrupts: Interrupts, mountpoint: Path, *args: str) -> Child:
    """`benchmarks.floor ARGS MOUNTPOINT` (serve-read SOURCE, or serve-write), started."""
    command = [sys.executable, "-m", "benchmarks.floor", *args, str(mountpoint)]
    return Child(interrupts, mountpoint, mountpoint.with_suffix(".log")).started(command)


# -- the adapter's counters -------------------------------------------------------------


def daemon(argv: list[str]) -> int:
    """`shardfs ARGV` with counters in the adapter (see the module docstring)."""
    from shardfs.cli import main
    from shardfs.fuse import adapter
    from shardfs.primitives.blocking import WouldBlock, nonblocking

    path = os.environ.get(COUNTS_ENV, os.devnull)
    handler: contextvars.ContextVar[str] = contextvars.ContextVar("handler", default="?")
    hopped: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("hopped")
    counts: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    threads = {"now": 0, "most": 0}
    lock = threading.Lock()

    def dump(*_: object) -> None:
        Path(path).write_text(json.dumps({"handlers": counts, "threads": threads["most"]}))

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def wrapper(self: Any, *args: Any) -> Any:
            token, hop = handler.set(name), hopped.set([False])
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return await fn(self, *args)
            finally:
                c = counts[name]
                c["n"] += 1
                c["wall"] += time.perf_counter() - started
                if not hopped.get()[0]:  # ran at once: the thread's CPU is the handler's
                    c["inline_n"] += 1
                    c["inline_cpu"] += time.thread_time() - cpu
                handler.reset(token)
                hopped.reset(hop)

        return wrapper

    async def _run(self: Any, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            with nonblocking():
                return fn(*args)
        except WouldBlock:
            counts[handler.get()]["wouldblock"] += 1
            return await self._thread(fn, *args)

    async def _thread(self: Any, fn: Callable[..., Any], *args: Any) -> Any:
        import trio

        c = counts[handler.get()]
        with contextlib.suppress(LookupError):
            hopped.get()[0] = True
        box: dict[str, float] = {}

        def call() -> Any:
            box["start"], cpu = time.perf_counter(), time.thread_time()
            with lock:
                threads["now"] += 1
                threads["most"] = max(threads["most"], threads["now"])
            try:
                return fn(*args)
            finally:
                with lock:
                    threads["now"] -= 1
                box["cpu"], box["end"] = time.thread_time() - cpu, time.perf_counter()

        submitted = time.perf_counter()
        try:
            return await trio.to_thread.run_sync(call, limiter=self._limiter)
        finally:
            c["thread"] += 1
            if "end" in box:
                c["handoff"] += box["start"] - submitted + time.perf_counter() - box["end"]
                c["thread_wall"] += box["end"] - box["start"]
                c["thread_cpu"] += box["cpu"]

    if path != os.devnull:  # counters cost CPU: only where they are read
        operations = adapter.Operations
        for name in ("lookup", "getattr", "read", "readdir", "open", "create", "write", "flush"):
            setattr(operations, name, counted(name, getattr(operations, name)))
        for name in ("release", "rename", "unlink", "getxattr", "setattr", "mkdir", "forget"):
            setattr(operations, name, counted(name, getattr(operations, name)))
        operations._run = _run  # type: ignore[method-assign]
        operations._thread = _thread  # type: ignore[method-assign]
    patch(os.environ.get(PATCH_ENV, ""))
    signal.signal(signal.SIGUSR2, dump)
    try:
        return main(argv)
    finally:
        dump()


def start_daemon(
    source: Path, mountpoint: Path, log: Path, counts: Path | None, *options: str, variant: str = ""
) -> Mounted:
    """`shardfs mount -f` under `daemon`, like `start_shardfs`."""
    env = dict(os.environ, **{COUNTS_ENV: str(counts or os.devnull), PATCH_ENV: variant})
    command = [sys.executable, "-m", "benchmarks.cold_path", "daemon"]
    return start_shardfs(source, mountpoint, log, *options, command=command, env=env, cwd=ROOT)


# -- measuring ----------------------------------------------------------------------------


def requests(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, int]]:
    """FUSE and source requests between two `shardfs stats`."""
    return {
        part: {
            kind: n - before[part]["requests"].get(kind, 0)
            for kind, n in after[part]["requests"].items()
            if n - before[part]["requests"].get(kind, 0)
        }
        for part in ("fuse", "source")
    }


#: A read of the array or files below a directory, given the pid of the daemon serving it
#: (None: a plain directory); what it found.
Work = Callable[[Path, "int | None"], dict[str, Any]]
#: wall s, daemon CPU s, of it user, of it system, what the work found
Timed = tuple[float, float, float, float, dict[str, Any]]


class Reads:
    """The read cases on one data set."""

    def __init__(self, dataset: rt.Dataset, interrupts: Interrupts) -> None:
        self.ds = dataset
        self.interrupts = interrupts
        self.mounts = MountManager(dataset, interrupts, cold=True)
        plain = dataset.plain / rt.ARRAY
        self.files = sorted(p.relative_to(plain) for p in plain.rglob("*") if p.is_file())
        self.files = [f for f in self.files if f.name != "zarr.json"]
        self.shards = [p for p in (dataset.source / rt.ARRAY).rglob("*") if p.is_file()]
        self.floor_mnt = dataset.data / "floor-mnt"

    def warm_source(self) -> None:
        for shard in self.shards:
            shard.read_bytes()

    def run(self, case: str, work: Work, counts: Path | None = None) -> Timed:
        """One run of `work` on a fresh daemon: (wall, daemon CPU s, user, sys, extra)."""
        if case == "plain":
            self.mounts.stop()
            drop_caches()
            return self._timed(None, work, self.ds.plain / rt.ARRAY)
        if case == "floor":
            self.mounts.stop()
            with floor(self.interrupts, self.floor_mnt, "serve-read", str(self.ds.plain)) as fl:
                drop_caches()
                return self._timed(fl.pid, work, self.floor_mnt / rt.ARRAY)
        self.mounts.stop()
        drop_caches()
        variant = case if case in VARIANTS else ""
        if counts is None and not variant:
            mounted = self.mounts.fresh()
        else:
            with self.interrupts.deferred():
                mounted = self.mounts.current = start_daemon(
                    self.ds.source, self.ds.mountpoint, self.ds.log, counts, "ro", variant=variant
                )
        drop_caches()
        if case == "src-warm":
            self.warm_source()
        before = control.query(str(mounted.path))
        result = self._timed(mounted.process.pid, work, mounted.path / rt.ARRAY)
        result[4]["requests"] = requests(before, control.query(str(mounted.path)))
        if counts is not None:
            result[4]["shard pages"] = resident_mib(self.shards)
            result[4]["chunk file pages"] = resident_mib(
                [mounted.path / rt.ARRAY / f for f in self.files]
            )
            os.kill(mounted.process.pid, signal.SIGUSR2)
            time.sleep(0.5)
            result[4]["counts"] = json.loads(counts.read_text())
        return result

    @staticmethod
    def _timed(pid: int | None, work: Work, top: Path) -> Timed:
        user0, sys0 = cpu_of(pid) if pid else (0.0, 0.0)
        started = time.perf_counter()
        extra = work(top, pid)
        wall = time.perf_counter() - started
        user1, sys1 = cpu_of(pid) if pid else (0.0, 0.0)
        return wall, user1 - user0 + sys1 - sys0, user1 - user0, sys1 - sys0, extra

    def zarr(self, top: Path, pid: int | None) -> dict[str, Any]:
        rt.zarr_read(top, False)()
        return {}

    def kinds(self, top: Path, pid: int | None) -> dict[str, Any]:
        """Stat every chunk file, then open, read and close each, ten threads at once; the
        CPU of the daemon serving `top` in each phase, in µs per file."""
        assert pid is not None
        out: dict[str, Any] = {}
        with ThreadPoolExecutor(10) as pool:
            before = sum(cpu_of(pid))
            list(pool.map(lambda f: os.stat(top / f), self.files))
            middle = sum(cpu_of(pid))
            list(pool.map(lambda f: (top / f).read_bytes(), self.files))
            after = sum(cpu_of(pid))
        out["stat"] = 1e6 * (middle - before) / len(self.files)
        out["read"] = 1e6 * (after - middle) / len(self.files)
        return out


def measure_reads(args: argparse.Namespace, interrupts: Interrupts, result: Result) -> None:
    size = args.size_mib
    dataset = rt.Dataset(args.data.resolve() / f"read-{size}mib", rt.shape_for(size))
    dataset.data.mkdir(parents=True, exist_ok=True)
    if not dataset.ready():
        builder = MountManager(dataset, interrupts, cold=True)
        try:
            dataset.build(builder)
        finally:
            builder.stop()
    reads = Reads(dataset, interrupts)
    n = len(reads.files)
    try:
        cases = (
            ["plain", "shardfs", *VARIANTS]
            if args.variants
            else ["plain", "shardfs", "src-warm", "floor"]
        )
        walls: dict[str, list[float]] = {c: [] for c in cases}
        cpus: dict[str, list[float]] = {c: [] for c in cases}
        syss: dict[str, list[float]] = {c: [] for c in cases}
        seen: dict[str, Any] = {}
        for rep in range(args.repeat):
            for case in rotated(cases, rep):
                wall, cpu, _, system, extra = reads.run(case, reads.zarr)
                walls[case].append(wall)
                cpus[case].append(1e6 * cpu / n)
                syss[case].append(1e6 * system / n)
                seen.setdefault(case, extra.get("requests"))
                print(f"  rep {rep + 1} {case:<9} {wall:.3f} s, daemon {1e6 * cpu / n:.0f} µs/file")
        table = result.table(
            f"zarr-python 3 reads the whole array ({n} chunk files), page cache dropped; "
            f"median (range) of {args.repeat}",
            ["case", "s", "plain s / s", "daemon CPU µs per chunk file", "of it system"],
        )
        for case in cases:
            mounted = case != "plain"
            table.row(
                case,
                Spread.of(walls[case], 3),
                Spread.of(paired(walls["plain"], walls[case])),
                Spread.of(cpus[case], 0) if mounted else None,
                Spread.of(syss[case], 0) if mounted else None,
            )
        if args.variants:
            return
        table = result.table(
            "Requests per chunk file (`shardfs stats`)", ["case", "FUSE", "source"], detail=True
        )
        for case in ("shardfs", "src-warm"):
            table.row(
                case,
                *(
                    ", ".join(f"{k} {v / n:.2f}" for k, v in seen[case][part].items())
                    for part in ("fuse", "source")
                ),
            )
        measure_kinds(reads, args.repeat, result)
        profiled(reads, args.data.resolve() / "cold-path-counts.json", result)
    finally:
        reads.mounts.stop()


def measure_kinds(reads: Reads, repeat: int, result: Result) -> None:
    cases = ["shardfs", "src-warm", "floor"]
    got: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    for rep in range(repeat):
        for case in rotated(cases, rep):
            got[case].append(reads.run(case, reads.kinds)[4])
    table = result.table(
        "Per request kind: 10 threads stat every chunk file, then open, read and close each; "
        f"daemon CPU µs per chunk file, median (range) of {repeat}",
        ["daemon", "stat phase (lookups)", "read phase (IOCTL + READ)", "both"],
    )
    for case in cases:
        stats = [g["stat"] for g in got[case]]
        reads_ = [g["read"] for g in got[case]]
        both = [a + b for a, b in zip(stats, reads_, strict=True)]
        table.row(case, Spread.of(stats, 0), Spread.of(reads_, 0), Spread.of(both, 0))


def profiled(reads: Reads, counts: Path, result: Result) -> None:
    n = len(reads.files)
    for case in ("shardfs", "src-warm"):
        wall, cpu, _, system, extra = reads.run(case, reads.zarr, counts)
        handlers = extra["counts"]["handlers"]
        handler_table(
            result,
            handlers,
            n,
            "chunk file",
            f"{case}, one profiled run (the counters cost some CPU of their own): {wall:.3f} s, "
            f"daemon {1e6 * cpu / n:.0f} µs/file (system {1e6 * system / n:.0f}), at most "
            f"{extra['counts']['threads']} worker threads; page cache after: shard files "
            f"{extra['shard pages']:.1f} MiB, chunk files {extra['chunk file pages']:.1f} MiB",
        )


def handler_cpu(handlers: dict[str, dict[str, float]]) -> float:
    """About the CPU seconds the handlers took: each at the mean CPU of those that ran
    inline, plus what the worker threads did for them."""
    return sum(
        c["n"] * c.get("inline_cpu", 0) / max(c.get("inline_n", 0), 1) + c.get("thread_cpu", 0)
        for c in handlers.values()
    )


def handler_table(
    result: Result, handlers: dict[str, dict[str, float]], n: int, unit: str, title: str
) -> Table:
    table = result.table(
        f"{title}; handlers in all: about {1e6 * handler_cpu(handlers) / n:.0f} µs per {unit}",
        [
            "handler",
            f"per {unit}",
            "CPU µs, inline (no hop)",
            "hops",
            "per hop: hand-off µs, worker wall µs, worker CPU µs",
        ],
        detail=True,
    )
    for name, c in sorted(handlers.items(), key=lambda item: -item[1]["n"]):
        if c["n"] < n / 100:
            continue
        hops = c.get("thread", 0)
        per_hop = (
            f"{1e6 * c['handoff'] / hops:.0f}, {1e6 * c['thread_wall'] / hops:.0f}, "
            f"{1e6 * c['thread_cpu'] / hops:.0f}"
            if hops
            else None
        )
        inline = 1e6 * c.get("inline_cpu", 0) / max(c.get("inline_n", 0), 1)
        table.row(name, round(c["n"] / n, 2), round(inline), f"{hops / c['n']:.0%}", per_hop)
    return table


# -- writes ------------------------------------------------------------------------------


class Writes:
    def __init__(self, work: Path, interrupts: Interrupts) -> None:
        self.work = work
        self.interrupts = interrupts
        self.data_file = work / "data.npy"
        if not self.data_file.exists():
            np.save(self.data_file, writers.generate_small(writers.SMALL_SHAPE))
        from tests.support.zarr2 import ensure_zarr2

        self.writers = {
            "v2": writers.Writer(str(ensure_zarr2().python), creates=True),
            "v3": writers.ZARR3,
        }

    def plain(self, key: str) -> tuple[float, float | None, dict[str, Any]]:
        writer, path = self.writers[key], self.fresh("plain.zarr")
        if not writer.creates:
            writers.create_array(path, writers.SMALL_SHAPE, False, writers.SMALL_CHUNK, "uint16")
        os.sync()
        done = writers.timed_write(
            path / writers.ARRAY, self.data_file, False, True, writers.SMALL_CHUNK, writer
        )
        return done["write"] + done["sync"], None, {}

    def floor(self, key: str) -> tuple[float, float | None, dict[str, Any]]:
        writer, mnt = self.writers[key], self.work / "floor-mnt"
        with floor(self.interrupts, mnt, "serve-write") as fl:
            top = mnt
            if not writer.creates:  # zarr-python 3 replaces its group's directory
                top = mnt / "g"
                top.mkdir()
                writers.create_array(top, writers.SMALL_SHAPE, False, writers.SMALL_CHUNK, "uint16")
            before = sum(cpu_of(fl.pid))
            done = writers.timed_write(
                top / writers.ARRAY, self.data_file, False, False, writers.SMALL_CHUNK, writer
            )
            return done["write"], sum(cpu_of(fl.pid)) - before, {}

    def shardfs(self, key: str, counts: Path | None = None):
        writer, source = self.writers[key], self.fresh("source.zarr")
        if writer.creates:
            source.mkdir(parents=True)
            (source / "zarr.json").write_text(writers.ROOT_GROUP)
        else:
            writers.create_array(source, writers.SMALL_SHAPE, True, writers.SMALL_CHUNK, "uint16")
        os.sync()
        mounts = WriteMounts(self.work / "mnt", self.work / "mount.log", [], self.interrupts)
        options = writers.SMALL_MOUNT_OPTIONS[f"{key}-mount"]
        if counts is None:
            mounted = mounts.start(source, *options)
        else:
            with self.interrupts.deferred():
                mounted = mounts.current = start_daemon(
                    source, mounts.mountpoint, mounts.log, counts, *options
                )
        pid = mounted.process.pid
        before = sum(cpu_of(pid))
        done = writers.timed_write(
            mounted.path / writers.ARRAY, self.data_file, False, False, writers.SMALL_CHUNK, writer
        )
        cpu = sum(cpu_of(pid)) - before
        if counts is not None:
            os.kill(pid, signal.SIGUSR2)
            time.sleep(0.5)
        unmounting = time.perf_counter()
        mounts.stop()
        extra = json.loads(counts.read_text()) if counts is not None else {}
        return done["write"] + time.perf_counter() - unmounting, cpu, extra

    def fresh(self, name: str) -> Path:
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        return path


def measure_writes(args: argparse.Namespace, interrupts: Interrupts, result: Result) -> None:
    work = args.data.resolve() / "cold-path-writes"
    work.mkdir(parents=True, exist_ok=True)
    writes = Writes(work, interrupts)
    kinds = ("plain", "floor", "shardfs")
    got: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for rep in range(args.repeat):
        for key in ("v2", "v3"):
            for kind in kinds:
                seconds, cpu, _ = getattr(writes, kind)(key)
                got[(key, kind)].append((seconds, cpu))
                extra = f", daemon CPU {cpu:.2f} s" if cpu is not None else ""
                print(f"  rep {rep + 1} {key} {kind}: {seconds:.3f} s{extra}", flush=True)
    chunks = 2048
    table = result.table(
        f"{chunks} chunk files of 32^3 uint16 written; median (range) of {args.repeat}; "
        "plain with os.sync(), shardfs up to the end of its unmount",
        ["writer", "case", "s", "plain s / s", "daemon CPU µs per chunk"],
    )
    for key, label in (("v2", "zarr-python 2.18, v2 view"), ("v3", "zarr-python 3")):
        plain = [s for s, _ in got[(key, "plain")]]
        for kind in kinds:
            seconds = [s for s, _ in got[(key, kind)]]
            cpus = [1e6 * c / chunks for _, c in got[(key, kind)] if c is not None]
            table.row(
                label,
                kind,
                Spread.of(seconds, 3),
                Spread.of(paired(plain, seconds)),
                Spread.of(cpus, 0) if cpus else None,
            )
    for key in ("v2", "v3"):
        seconds, cpu, extra = writes.shardfs(key, work / "counts.json")
        handler_table(
            result,
            extra["handlers"],
            chunks,
            "chunk",
            f"{key}, one profiled run: {seconds:.3f} s, daemon CPU while writing "
            f"{1e6 * cpu / chunks:.0f} µs per chunk",
        )


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "daemon":
        return daemon(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["reads", "writes"])
    parser.add_argument("--size-mib", type=int, default=256, help="reads: the array's size")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (medians reported)")
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data", help="data directory")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="reads: plain and shardfs beside experiments on the daemon (see PATCH_ENV)",
    )
    parser.add_argument(
        "--results",
        help="where the result goes (default benchmarks/results/cold_path-WHAT.json; "
        "'none': nowhere)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache")
    interrupts = Interrupts()
    name = "variants" if args.what == "reads" and args.variants else args.what
    if args.what == "reads":
        result = Result(
            f"cold_path-{name}",
            {"size_mib": args.size_mib, "repeat": args.repeat, "variants": args.variants},
        )
        measure_reads(args, interrupts, result)
    else:
        result = Result("cold_path-writes", {"repeat": args.repeat})
        measure_writes(args, interrupts, result)
    result.write(
        results.results_path(args.results or str(results.RESULTS / f"{result.workload}.json"))
    )
    return 0


if __name__ == "__main__":
    run(main)
