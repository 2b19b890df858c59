"""Where the time of a cold read and of a small-chunk write goes (issue 33).

Why: a cold read through a `-o ro` mount and a write of many small chunks through a
read-write one are what users still wait on. This script breaks both down beside
floors that show what any pyfuse3 + trio daemon costs for the same kernel requests:

reads (the read_throughput.py data set: uint8, 64^3 zstd chunks in 256^3 shards), each
case a whole-array zarr-python 3 read after the page cache was dropped, rotated per
repetition:

  plain     the plain unsharded copy on local disk,
  shardfs   a fresh `-o ro` mount of the sharded source,
  src-warm  the same, the shard files read into the page cache before (no disk I/O,
            no worker thread: what the cold read costs beyond the disk),
  floor     `serve-read`: a pyfuse3 + trio daemon with trivial handlers serving the
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

writes (write_throughput.py --small-chunks: 2048 chunk files of 32^3 uint16): zarr-python
2.18 through `-o rw,view=v2,shard_new=8` and zarr-python 3 through `-o rw`, each beside
the plain directory with os.sync() and `serve-write`, a read-write pyfuse3 + trio daemon
with trivial handlers keeping files in memory (1 s timeouts, getxattr ENODATA, like a
shardfs rw mount). Each repetition runs plain, floor, shardfs in that order; ratios are
plain time / time, per repetition. Then one profiled shardfs run of each.

Medians with their ranges; needs root (drop_caches, FUSE).

    .venv/bin/python benchmarks/cold_path.py reads [--size-mib 256] [--repeat 5] [--data DIR]
        [--variants]
    .venv/bin/python benchmarks/cold_path.py writes [--repeat 3] [--data DIR]

With --variants, the reads are plain and shardfs beside two experiments on the daemon
(PATCH_ENV: no thread hop, and the whole shard read ahead at open), nothing else.

(internal: `serve-read SRC MNT`, `serve-write MNT`, `daemon ARGS...`: the floors, and
`shardfs ARGS...` with the adapter's counters, written as JSON to $COLD_PATH_COUNTS at
exit and on SIGUSR2.)
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import errno
import functools
import itertools
import json
import os
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import read_throughput as rt
import write_throughput as wt
from common import Interrupts, machine, run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from shardfs.fuse import control  # noqa: E402
from tests.conftest import Mounted, wait_mounted  # noqa: E402

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


def serve_read(source: str, mountpoint: str) -> None:
    """The tree below `source`, loaded into memory, served read-only and kernel-served."""
    import pyfuse3
    import trio

    nodes: dict[int, bytes | None] = {1: None}  # None: a directory
    children: dict[int, dict[bytes, int]] = {1: {}}
    inode_of = {"": 1}
    for top, dirs, files in os.walk(source):
        rel = os.path.relpath(top, source).removeprefix(".")
        for name in sorted(dirs):
            ino = inode_of[os.path.join(rel, name)] = len(nodes) + 1
            nodes[ino], children[ino] = None, {}
            children[inode_of[rel]][name.encode()] = ino
        for name in sorted(files):
            ino = len(nodes) + 1
            nodes[ino] = Path(top, name).read_bytes()
            children[inode_of[rel]][name.encode()] = ino

    class Operations(pyfuse3.Operations):
        def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
            data = nodes[ino]
            entry = _entry(pyfuse3, ino, None if data is None else len(data), 300, 0o555)
            entry.st_blksize = 65536
            entry.st_blocks = -(-entry.st_size // 512)
            return entry

        async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
            return self._attr(inode)

        async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> Any:
            ino = children.get(parent, {}).get(name)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(ino)

        async def opendir(self, inode: int, ctx: Any) -> int:
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def readdir(self, fh: int, start: int, token: Any) -> None:
            _reply_entries(pyfuse3, children[fh], start, token, self._attr)

        async def open(self, inode: int, flags: int, ctx: Any) -> Any:
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def read(self, fh: int, off: int, size: int) -> bytes:
            return nodes[fh][off : off + size]  # type: ignore[index]

        async def flush(self, fh: int) -> None:
            raise pyfuse3.FUSEError(errno.ENOSYS)

    _serve(pyfuse3, trio, Operations(), mountpoint, {"fsname=floor-read", "subtype=floor", "ro"})


def serve_write(mountpoint: str) -> None:
    """An empty read-write tree in memory; every file a bytearray."""
    import pyfuse3
    import trio

    dirs: dict[int, dict[bytes, int]] = {1: {}}
    files: dict[int, bytearray] = {}
    handles: dict[int, int] = {}
    numbers, fhs = itertools.count(2), itertools.count(1)

    class Operations(pyfuse3.Operations):
        def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
            size = None if ino in dirs else len(files[ino])
            entry = _entry(pyfuse3, ino, size, 1.0, 0o755)
            entry.st_uid, entry.st_gid = os.getuid(), os.getgid()
            return entry

        async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
            return self._attr(inode)

        async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> Any:
            ino = dirs[parent].get(name)
            if ino is None:
                entry = pyfuse3.EntryAttributes()
                entry.st_ino, entry.entry_timeout = 0, 1.0
                return entry
            return self._attr(ino)

        async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
            if fields.update_size:
                del files[inode][attr.st_size :]
                files[inode].extend(bytes(attr.st_size - len(files[inode])))
            return self._attr(inode)

        async def mkdir(self, parent: int, name: bytes, mode: int, ctx: Any) -> Any:
            ino = dirs[parent][name] = next(numbers)
            dirs[ino] = {}
            return self._attr(ino)

        async def create(self, parent: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
            ino = dirs[parent][name] = next(numbers)
            files[ino] = bytearray()
            fh = next(fhs)
            handles[fh] = ino
            return pyfuse3.FileInfo(fh=fh), self._attr(ino)

        async def open(self, inode: int, flags: int, ctx: Any) -> Any:
            if flags & os.O_TRUNC:
                files[inode].clear()
            fh = next(fhs)
            handles[fh] = inode
            return pyfuse3.FileInfo(fh=fh)

        async def read(self, fh: int, off: int, size: int) -> bytes:
            return bytes(files[handles[fh]][off : off + size])

        async def write(self, fh: int, off: int, buf: bytes) -> int:
            data = files[handles[fh]]
            data.extend(bytes(max(0, off - len(data))))
            data[off : off + len(buf)] = buf
            return len(buf)

        async def flush(self, fh: int) -> None:
            pass

        async def release(self, fh: int) -> None:
            handles.pop(fh, None)

        async def rename(
            self, p0: int, n0: bytes, p1: int, n1: bytes, flags: int, ctx: Any
        ) -> None:
            dirs[p1][n1] = dirs[p0].pop(n0)

        async def unlink(self, parent: int, name: bytes, ctx: Any) -> None:
            dirs[parent].pop(name, None)

        async def rmdir(self, parent: int, name: bytes, ctx: Any) -> None:
            dirs[parent].pop(name, None)

        async def opendir(self, inode: int, ctx: Any) -> int:
            return inode

        async def readdir(self, fh: int, start: int, token: Any) -> None:
            _reply_entries(pyfuse3, dirs[fh], start, token, self._attr)

        async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
            raise pyfuse3.FUSEError(errno.ENODATA)

        async def statfs(self, ctx: Any) -> Any:
            data = pyfuse3.StatvfsData()
            data.f_bsize = data.f_frsize = 65536
            data.f_namemax = 255
            data.f_blocks = data.f_bfree = data.f_bavail = 1 << 30
            return data

    _serve(pyfuse3, trio, Operations(), mountpoint, {"fsname=floor-write", "subtype=floor"})


def _entry(pyfuse3: Any, ino: int, size: int | None, timeout: float, mode: int) -> Any:
    """A floor's attributes: a directory (`size` None) of `mode`, or a file of `size` bytes
    without the execute bits."""
    entry = pyfuse3.EntryAttributes()
    entry.st_ino = ino
    entry.entry_timeout = entry.attr_timeout = timeout
    if size is None:
        entry.st_mode, entry.st_nlink = stat.S_IFDIR | mode, 2
    else:
        entry.st_mode, entry.st_nlink = stat.S_IFREG | (mode & 0o666), 1
        entry.st_size = size
    return entry


def _reply_entries(
    pyfuse3: Any, entries: dict[bytes, int], start: int, token: Any, attr: Any
) -> None:
    """A floor's readdir: the entries of a directory from position `start`, as many as fit."""
    items = list(entries.items())
    for i in range(start, len(items)):
        if not pyfuse3.readdir_reply(token, items[i][0], attr(items[i][1]), i + 1):
            return


def _serve(pyfuse3: Any, trio: Any, operations: Any, mountpoint: str, options: set[str]) -> None:
    pyfuse3.init(operations, mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


class Floor:
    """A floor daemon mounted at `mountpoint` while in the block."""

    def __init__(self, interrupts: Interrupts, mountpoint: Path, *args: str) -> None:
        self.interrupts = interrupts
        self.mountpoint = mountpoint
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Floor:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with self.interrupts.deferred():
            self.process = subprocess.Popen(
                [sys.executable, __file__, *self.args, str(self.mountpoint)],
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 60
        while os.stat(self.mountpoint).st_dev == os.stat(self.mountpoint.parent).st_dev:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the floor {self.args[0]} did not mount")
            time.sleep(0.02)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __exit__(self, *exc: object) -> None:
        with self.interrupts.deferred():
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
            if self.process is not None:
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()


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
    """`shardfs mount -f` under `daemon`, like tests.conftest.start_mount."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, __file__, "daemon", "mount", str(source), str(mountpoint), "-f"]
    args += ["-o", ",".join(options)]
    env = dict(os.environ, **{COUNTS_ENV: str(counts or os.devnull), PATCH_ENV: variant})
    with open(log, "ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
    return wait_mounted(Mounted(mountpoint, process, log, options))


# -- measuring ----------------------------------------------------------------------------


def cpu_of(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process `pid`, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    ordered = sorted(values)
    low, mid, high = (fmt.format(v) for v in (ordered[0], statistics.median(ordered), ordered[-1]))
    return f"{mid} ({low}-{high})"


def resident_mib(paths: list[Path]) -> float:
    """MiB of `paths` in the page cache."""
    found = subprocess.run(
        ["fincore", "-b", "-n", "-o", "RES", *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(int(x) for x in found.stdout.split()) / (1 << 20)


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
        self.mounts = rt.ColdMounts(dataset, interrupts)
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
            rt.drop_caches()
            return self._timed(None, work, self.ds.plain / rt.ARRAY)
        if case == "floor":
            self.mounts.stop()
            with Floor(self.interrupts, self.floor_mnt, "serve-read", str(self.ds.plain)) as fl:
                rt.drop_caches()
                return self._timed(fl.pid, work, self.floor_mnt / rt.ARRAY)
        self.mounts.stop()
        rt.drop_caches()
        variant = case if case in VARIANTS else ""
        if counts is None and not variant:
            mounted = self.mounts.fresh()
        else:
            with self.interrupts.deferred():
                mounted = self.mounts.current = start_daemon(
                    self.ds.source, self.ds.mountpoint, self.ds.log, counts, "ro", variant=variant
                )
        rt.drop_caches()
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


def measure_reads(args: argparse.Namespace, interrupts: Interrupts) -> list[str]:
    size = args.size_mib
    dataset = rt.Dataset(args.data.resolve() / f"read-{size}mib", rt.shape_for(size))
    dataset.data.mkdir(parents=True, exist_ok=True)
    if not dataset.ready():
        builder = rt.ColdMounts(dataset, interrupts)
        try:
            dataset.build(builder)
        finally:
            builder.stop()
    reads = Reads(dataset, interrupts)
    n = len(reads.files)
    out: list[str] = []
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
            for case in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
                wall, cpu, _, system, extra = reads.run(case, reads.zarr)
                walls[case].append(wall)
                cpus[case].append(1e6 * cpu / n)
                syss[case].append(1e6 * system / n)
                seen.setdefault(case, extra.get("requests"))
                print(f"  rep {rep + 1} {case:<9} {wall:.3f} s, daemon {1e6 * cpu / n:.0f} µs/file")
        out += [
            f"zarr-python 3 reads the whole array ({n} chunk files), page cache dropped; "
            f"median (range) of {args.repeat}",
            "",
            "| case | s | plain s / s | daemon CPU µs per chunk file | of it system |",
            "|---|---:|---:|---:|---:|",
        ]
        for case in cases:
            ratios = [p / w for p, w in zip(walls["plain"], walls[case], strict=True)]
            cpu = spread(cpus[case]) if case != "plain" else ""
            system = spread(syss[case]) if case != "plain" else ""
            out.append(
                f"| {case} | {spread(walls[case], '{:.3f}')} | {spread(ratios, '{:.2f}')} "
                f"| {cpu} | {system} |"
            )
        if args.variants:
            return out
        for case in ("shardfs", "src-warm"):
            got = seen[case]
            out.append(
                f"\n{case}: requests per chunk file: FUSE "
                + ", ".join(f"{k} {v / n:.2f}" for k, v in got["fuse"].items())
                + "; source "
                + ", ".join(f"{k} {v / n:.2f}" for k, v in got["source"].items())
            )
        out += measure_kinds(reads, args.repeat)
        out += profiled(reads, args.data.resolve() / "cold-path-counts.json")
    finally:
        reads.mounts.stop()
    return out


def measure_kinds(reads: Reads, repeat: int) -> list[str]:
    cases = ["shardfs", "src-warm", "floor"]
    got: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    for rep in range(repeat):
        for case in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
            got[case].append(reads.run(case, reads.kinds)[4])
    rows = [
        "",
        "Per request kind: 10 threads stat every chunk file, then open, read and close each; "
        f"daemon CPU µs per chunk file, median (range) of {repeat}",
        "",
        "| daemon | stat phase (lookups) | read phase (IOCTL + READ) | both |",
        "|---|---:|---:|---:|",
    ]
    for case in cases:
        stats = [g["stat"] for g in got[case]]
        reads_ = [g["read"] for g in got[case]]
        both = [a + b for a, b in zip(stats, reads_, strict=True)]
        rows.append(f"| {case} | {spread(stats)} | {spread(reads_)} | {spread(both)} |")
    return rows


def profiled(reads: Reads, counts: Path) -> list[str]:
    n = len(reads.files)
    rows = ["", "One profiled run each (the counters cost some CPU of their own):", ""]
    for case in ("shardfs", "src-warm"):
        wall, cpu, _, system, extra = reads.run(case, reads.zarr, counts)
        handlers = extra["counts"]["handlers"]
        rows.append(
            f"\n{case}: {wall:.3f} s, daemon {1e6 * cpu / n:.0f} µs/file (system "
            f"{1e6 * system / n:.0f}), at most {extra['counts']['threads']} worker threads; "
            f"page cache after: shard files {extra['shard pages']:.1f} MiB, chunk files "
            f"{extra['chunk file pages']:.1f} MiB"
        )
        rows += handler_rows(handlers, n, "chunk file")
    return rows


def handler_cpu(handlers: dict[str, dict[str, float]]) -> float:
    """About the CPU seconds the handlers took: each at the mean CPU of those that ran
    inline, plus what the worker threads did for them."""
    return sum(
        c["n"] * c.get("inline_cpu", 0) / max(c.get("inline_n", 0), 1) + c.get("thread_cpu", 0)
        for c in handlers.values()
    )


def handler_rows(handlers: dict[str, dict[str, float]], n: int, unit: str) -> list[str]:
    rows = [
        f"handlers in all: about {1e6 * handler_cpu(handlers) / n:.0f} µs per {unit}",
        "",
        f"| handler | per {unit} | CPU µs, inline (no hop) | hops | per hop: hand-off µs, "
        "worker wall µs, worker CPU µs |",
        "|---|---:|---:|---:|---|",
    ]
    for name, c in sorted(handlers.items(), key=lambda item: -item[1]["n"]):
        if c["n"] < n / 100:
            continue
        hops = c.get("thread", 0)
        per_hop = (
            f"{1e6 * c['handoff'] / hops:.0f}, {1e6 * c['thread_wall'] / hops:.0f}, "
            f"{1e6 * c['thread_cpu'] / hops:.0f}"
            if hops
            else ""
        )
        inline = 1e6 * c.get("inline_cpu", 0) / max(c.get("inline_n", 0), 1)
        rows.append(
            f"| {name} | {c['n'] / n:.2f} | {inline:.0f} | {hops / c['n']:.0%} | {per_hop} |"
        )
    return rows


# -- writes ------------------------------------------------------------------------------


class Writes:
    def __init__(self, work: Path, interrupts: Interrupts) -> None:
        self.work = work
        self.interrupts = interrupts
        self.data_file = work / "data.npy"
        if not self.data_file.exists():
            np.save(self.data_file, wt.generate_small(wt.SMALL_SHAPE))
        from tests.support.zarr2 import ensure_zarr2

        self.writers = {"v2": wt.Writer(str(ensure_zarr2().python), creates=True), "v3": wt.ZARR3}

    def plain(self, key: str) -> tuple[float, float | None, dict[str, Any]]:
        writer, path = self.writers[key], self.fresh("plain.zarr")
        if not writer.creates:
            wt.create_array(path, wt.SMALL_SHAPE, False, wt.SMALL_CHUNK, "uint16")
        os.sync()
        done = wt.timed_write(path / wt.ARRAY, self.data_file, False, True, wt.SMALL_CHUNK, writer)
        return done["write"] + done["sync"], None, {}

    def floor(self, key: str) -> tuple[float, float | None, dict[str, Any]]:
        writer, mnt = self.writers[key], self.work / "floor-mnt"
        with Floor(self.interrupts, mnt, "serve-write") as fl:
            top = mnt
            if not writer.creates:  # zarr-python 3 replaces its group's directory
                top = mnt / "g"
                top.mkdir()
                wt.create_array(top, wt.SMALL_SHAPE, False, wt.SMALL_CHUNK, "uint16")
            before = sum(cpu_of(fl.pid))
            done = wt.timed_write(
                top / wt.ARRAY, self.data_file, False, False, wt.SMALL_CHUNK, writer
            )
            return done["write"], sum(cpu_of(fl.pid)) - before, {}

    def shardfs(self, key: str, counts: Path | None = None):
        writer, source = self.writers[key], self.fresh("source.zarr")
        if writer.creates:
            source.mkdir(parents=True)
            (source / "zarr.json").write_text(wt.ROOT_GROUP)
        else:
            wt.create_array(source, wt.SMALL_SHAPE, True, wt.SMALL_CHUNK, "uint16")
        os.sync()
        mounts = wt.Mounts(self.work / "mnt", self.work / "mount.log", [], self.interrupts)
        options = wt.SMALL_MOUNT_OPTIONS[f"{key}-mount"]
        if counts is None:
            mounted = mounts.start(source, *options)
        else:
            with self.interrupts.deferred():
                mounted = mounts.current = start_daemon(
                    source, mounts.mountpoint, mounts.log, counts, *options
                )
        pid = mounted.process.pid
        before = sum(cpu_of(pid))
        done = wt.timed_write(
            mounted.path / wt.ARRAY, self.data_file, False, False, wt.SMALL_CHUNK, writer
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


def measure_writes(args: argparse.Namespace, interrupts: Interrupts) -> list[str]:
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
    out = [
        f"{chunks} chunk files of 32^3 uint16 written; median (range) of {args.repeat}; "
        "plain with os.sync(), shardfs up to the end of its unmount",
        "",
        "| writer | case | s | plain s / s | daemon CPU µs per chunk |",
        "|---|---|---:|---:|---:|",
    ]
    for key, label in (("v2", "zarr-python 2.18, v2 view"), ("v3", "zarr-python 3")):
        plain = [s for s, _ in got[(key, "plain")]]
        for kind in kinds:
            seconds = [s for s, _ in got[(key, kind)]]
            cpus = [1e6 * c / chunks for _, c in got[(key, kind)] if c is not None]
            ratios = [p / s for p, s in zip(plain, seconds, strict=True)]
            out.append(
                f"| {label} | {kind} | {spread(seconds, '{:.3f}')} | {spread(ratios, '{:.2f}')} "
                f"| {spread(cpus) if cpus else ''} |"
            )
    for key in ("v2", "v3"):
        seconds, cpu, extra = writes.shardfs(key, work / "counts.json")
        out += [
            "",
            f"{key}, one profiled run: {seconds:.3f} s, daemon CPU while writing "
            f"{1e6 * cpu / chunks:.0f} µs per chunk",
        ]
        out += handler_rows(extra["handlers"], chunks, "chunk")
    return out


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("serve-read", "serve-write", "daemon"):
        command, rest = sys.argv[1], sys.argv[2:]
        if command == "serve-read":
            serve_read(*rest)
        elif command == "serve-write":
            serve_write(*rest)
        else:
            return daemon(rest)
        return 0
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
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache")
    interrupts = Interrupts()
    lines = (measure_reads if args.what == "reads" else measure_writes)(args, interrupts)
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run(main)
