"""Per-file cost: N tiny chunk files opened, read and closed through a mount, beside the floor.

Why (issue 21): a tool that walks a chunk-per-file array (a copy, a checksum,
a DANDI upload) opens, reads and closes every file, so a mount's cost per file
decides how long that takes; for files of a few bytes nothing else counts.
The daemon answers several requests per file, and each request costs the
pyfuse3 + trio machinery before shardfs's own code runs: `benchmarks.floor`
measures that floor with handlers that do nothing. This script compares, in one run:

  floor         `benchmarks.floor serve`: N files of 64 bytes in directories of 100
  floor-noopen  the same with open and opendir answering ENOSYS (the kernel then
                sends no open or release); only with a patched pyfuse3 (see
                benchmarks/harness/floors.py), skipped with a message otherwise
  shardfs-ro    `shardfs mount SOURCE MNT -f -o ro`: kernel-served where shardfs
                and pyfuse3 can (since 9d361f1, with the patched pyfuse3: open and
                opendir answer ENOSYS, as in floor-noopen), with the native front
                answering what it can where it was built (the default)
  shardfs-ro-python  `-o ro,front=no`: the same, with Python answering everything
  shardfs-ro-open  `-o ro,kernel_cache=no`: read-only with open and release
                requests (what `ro` was before 9d361f1); skipped, with a
                message, where shardfs has no such option
  shardfs-rw    `shardfs mount SOURCE MNT -f` (read-write) of the same source
  shardfs-ro-metrics  `-o ro,metrics=127.0.0.1:PORT`: shardfs-ro serving metrics, so
                timing every request it answers (not scraped meanwhile)
  cfloor        the C floor, `--cfloor BINARY` (../shared/tools/cfloor.c, built outside
                the project as its header says) `-m`, serving a plain tree of the floor's
                shape from memory; skipped, with a message, without --cfloor
  cfloor-p      the same with `-p`: file data read with pread(2) from files it keeps open

The source is a uint8 array written by zarr-python 3: inner chunks 4 x 4 x 4
with the `bytes` codec alone (so every chunk file is 64 bytes), shards of
8 x 8 x 8 inner chunks, N chunks stored, laid out so that every chunk directory
`c/<i>/<j>` of the view holds 100 files, as in the DANDI layout.

Per kind and repetition: unmount, drop the kernel's caches, mount afresh; then
this process opens, reads and closes (os.open, os.read, os.close) every file
in key order (FIRST pass), and at once again on the same mount (SECOND pass).
Measured per pass: the daemon's CPU time, user + system, all threads (from
/proc/PID/stat), per file; the wall time, as files/s. The order of the kinds
rotates from one repetition to the next. Shown are medians with their range;
"CPU / floor" is the median of per-repetition ratios to the floor's CPU in
the same pass. Requests per file come from one more, untimed, run per kind,
whose daemon counts (the floor with --counts; shardfs with `-o debug`, whose
log has a line per request: release and releasedir are not logged, so they
are counted as the opens and opendirs they close, which is one too many where
an open is answered ENOSYS, and forget is not counted).
Needs root (drop_caches, FUSE).

    .venv/bin/python -m benchmarks.per_file [--files 20000] [--repeat 3] [--data DIR]
        [--kinds floor,floor-noopen,shardfs-ro,shardfs-ro-open,shardfs-rw] [--results PATH]
        [--cfloor BINARY]

Without --data, the data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import zarr

from benchmarks.harness import results
from benchmarks.harness.caches import drop_caches
from benchmarks.harness.daemons import Child
from benchmarks.harness.data.tiny import CHUNK, FILE_BYTES, PER_DIR, SHARD, Dataset
from benchmarks.harness.floors import inode_fh_supported
from benchmarks.harness.procs import cpu
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, rotated, run
from shardfs.options import parse_options
from shardfs.primitives.errors import UsageError

KINDS = (
    "floor",
    "floor-noopen",
    "shardfs-ro",
    "shardfs-ro-python",
    "shardfs-ro-open",
    "shardfs-rw",
    "shardfs-ro-metrics",
    "cfloor",
    "cfloor-p",
)
#: The C floor's mode of each of its kinds.
CFLOOR_MODES = {"cfloor": "-m", "cfloor-p": "-p"}
#: The mount options of each shardfs kind (`debug` is added for the counting run).
SHARDFS_OPTIONS = {
    "shardfs-ro": ["ro"],
    "shardfs-ro-python": ["ro", "front=no"],  # kernel-served, without the native front
    "shardfs-ro-open": ["ro", "kernel_cache=no"],
    "shardfs-rw": [],
    "shardfs-ro-metrics": ["ro", "metrics=127.0.0.1:{port}"],  # requests timed
}
PASSES = ("first", "second")
#: A request in shardfs's debug log: `... DEBUG lookup(1, b'data', ...)`.
LOGGED_REQUEST = re.compile(rb" DEBUG (\w+)\(")


# -- the daemons ----------------------------------------------------------------------


@dataclass
class Daemon:
    """One running daemon of a kind, mounted at `path` in the foreground as our child."""

    kind: str
    path: Path
    fstype: str
    process: subprocess.Popen[bytes]
    log: Path
    counts_file: Path | None = None

    def counts(self) -> collections.Counter[str]:
        """The requests it has answered so far, per handler (a counting daemon only; the C
        floor writes its counts when it is unmounted, so only then)."""
        if self.kind.startswith("cfloor"):
            assert self.counts_file is not None
            if not self.counts_file.exists():
                return collections.Counter()
            return collections.Counter(
                {k: v for k, v in json.loads(self.counts_file.read_text()).items() if v}
            )
        if self.kind.startswith("floor"):
            assert self.counts_file is not None
            self.counts_file.unlink(missing_ok=True)
            os.kill(self.process.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while not self.counts_file.exists():
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"the floor wrote no counts: {self.log.read_text()}")
                time.sleep(0.01)
            return collections.Counter(json.loads(self.counts_file.read_text()))
        counts = collections.Counter(
            m.group(1).decode() for m in LOGGED_REQUEST.finditer(self.log.read_bytes())
        )
        # Not logged (no wrapper in the adapter): one release per open, releasedir per opendir.
        counts["release"] = counts["open"]
        counts["releasedir"] = counts["opendir"]
        return counts


class Daemons:
    """At most one daemon at a time (a `Child`), of the kind asked for."""

    def __init__(self, dataset: Dataset, interrupts: Interrupts, cfloor: Path | None) -> None:
        self.dataset = dataset
        self.interrupts = interrupts
        self.cfloor = cfloor
        self.child: Child | None = None
        self.current: Daemon | None = None

    def start(self, kind: str, counting: bool = False) -> Daemon:
        self.stop()
        path = self.dataset.data / f"mnt-{kind}"
        log = self.dataset.data / f"{kind}.log"
        counts_file = None
        if kind.startswith("cfloor"):
            assert self.cfloor is not None
            fstype = "fuse.cfloor"
            command = [str(self.cfloor), CFLOOR_MODES[kind]]
            if counting:
                counts_file = self.dataset.data / f"{kind}.counts.json"
                counts_file.unlink(missing_ok=True)
                command += ["-c", str(counts_file)]
            command += [str(self.dataset.plain_tree()), str(path)]
        elif kind.startswith("floor"):
            fstype = "fuse.floor"
            command = [sys.executable, "-m", "benchmarks.floor", "serve", str(path)]
            command += [str(self.dataset.files), "--size", str(FILE_BYTES)]
            command += ["--per-dir", str(PER_DIR)]
            if kind == "floor-noopen":
                command.append("--noopen")
            if counting:
                counts_file = self.dataset.data / f"{kind}.counts.json"
                command += ["--counts", str(counts_file)]
        else:
            fstype = "fuse.shardfs"
            command = [sys.executable, "-m", "shardfs", "mount", str(self.dataset.source)]
            command += [str(path), "-f"]
            options = SHARDFS_OPTIONS[kind] + (["debug"] if counting else [])
            options = [option.format(port=free_port()) for option in options]
            if options:
                command += ["-o", ",".join(options)]
        self.child = Child(self.interrupts, path, log, fstype)
        self.child.start(command)
        assert self.child.process is not None
        self.current = Daemon(kind, path, fstype, self.child.process, log, counts_file)
        return self.current

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
        self.child = self.current = None


def descriptors_for(count: int) -> bool:
    """Whether our children may open `count` descriptors (the limit is inherited), raised
    as far as needed if it can be."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, count), max(hard, count)))
    except (ValueError, OSError):
        return False
    return True


def free_port() -> int:
    """A port of 127.0.0.1 free right now, for the metrics of `shardfs-ro-metrics`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kernel_cache_option() -> bool:
    """Whether the shardfs measured takes `-o kernel_cache=no`."""
    try:
        parse_options(["kernel_cache=no"])
    except UsageError:
        return False
    return True


# -- the passes -----------------------------------------------------------------------


def read_all(paths: list[bytes]) -> tuple[float, int]:
    """(seconds, bytes) to open, read and close every file of `paths`."""
    total = 0
    started = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            total += len(os.read(fd, 4096))
        finally:
            os.close(fd)
    return time.perf_counter() - started, total


@dataclass
class Result_:
    """Per pass: CPU µs per file and files/s of each repetition; requests of the counting run."""

    cpu: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PASSES})
    rate: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PASSES})
    requests: dict[str, collections.Counter[str]] = field(default_factory=dict)


def measure(daemons: Daemons, kind: str, result: Result_, tag: str) -> None:
    """Both passes on a fresh mount, caches dropped."""
    daemons.stop()
    drop_caches()
    daemon = daemons.start(kind)
    paths = daemons.dataset.paths(daemon.path, kind)
    for name in PASSES:
        before = cpu(daemon.process.pid)
        seconds, nbytes = read_all(paths)
        used = cpu(daemon.process.pid) - before
        if nbytes != len(paths) * FILE_BYTES:
            raise RuntimeError(f"{kind}: read {nbytes} bytes, not {len(paths) * FILE_BYTES}")
        result.cpu[name].append(used / len(paths) * 1e6)
        result.rate[name].append(len(paths) / seconds)
        print(
            f"{tag} {kind:<13} {name:<6}: {seconds:6.2f} s, {result.rate[name][-1]:7.0f} files/s, "
            f"daemon CPU {result.cpu[name][-1]:5.0f} µs/file",
            flush=True,
        )
    daemons.stop()


def count(daemons: Daemons, kind: str, result: Result_) -> None:
    """Both passes on a fresh counting daemon: the requests of each."""
    if kind.startswith("cfloor"):
        count_at_exit(daemons, kind, result)
        return
    daemons.stop()
    drop_caches()
    daemon = daemons.start(kind, counting=True)
    paths = daemons.dataset.paths(daemon.path, kind)
    last = daemon.counts()
    for name in PASSES:
        read_all(paths)
        time.sleep(0.5)  # the kernel sends releases after close returns
        now = daemon.counts()
        result.requests[name] = now - last
        last = now
    daemons.stop()


def count_at_exit(daemons: Daemons, kind: str, result: Result_) -> None:
    """`count` for a daemon that counts only once unmounted: the first pass on one mount,
    both on another, the second pass's counts being the difference."""
    totals = []
    for passes in (1, 2):
        daemons.stop()
        drop_caches()
        daemon = daemons.start(kind, counting=True)
        paths = daemons.dataset.paths(daemon.path, kind)
        for _ in range(passes):
            read_all(paths)
        time.sleep(0.5)  # the kernel sends releases after close returns
        daemons.stop()
        totals.append(daemon.counts())
    result.requests["first"] = totals[0]
    result.requests["second"] = totals[1] - totals[0]


# -- report ---------------------------------------------------------------------------


def report(results_: dict[str, Result_], files: int, repeat: int, result: Result) -> None:
    """The tables: per kind and pass, CPU and files/s (medians, ranges), requests per file,
    and the CPU over the floor's (both passes) and the no-open floor's (first pass: its
    second costs nothing)."""
    floors = [(name, p) for name in ("floor", "floor-noopen") if name in results_ for p in PASSES]
    floors = [(name, p) for name, p in floors if name == "floor" or p == "first"]
    table = result.table(
        f"Every file opened, read and closed, after a fresh mount on dropped caches (FIRST) "
        f"and at once again (SECOND); median (range) of {repeat}",
        [
            "mount",
            "first µs CPU/file",
            "second µs CPU/file",
            "first files/s",
            "second files/s",
            "first requests/file",
            "second requests/file",
            *(f"{p} CPU / {name}" for name, p in floors),
        ],
    )
    for kind, found in results_.items():
        cells: list[str | float | Spread | None] = [Spread.of(found.cpu[p], 0) for p in PASSES]
        cells += [Spread.of(found.rate[p], 0) for p in PASSES]
        cells += [
            round(sum(found.requests[p].values()) / files, 2) if found.requests else None
            for p in PASSES
        ]
        for name, p in floors:
            if all(f > 0 for f in results_[name].cpu[p]):
                cells.append(Spread.of(paired(found.cpu[p], results_[name].cpu[p]), 2, "x"))
            else:
                cells.append("n/a")
        table.row(kind, *cells)
    table = result.table(
        "Requests per file, from one more, untimed run with the daemon counting",
        ["mount", "pass", "requests per file"],
        detail=True,
    )
    for kind, found in results_.items():
        for p in PASSES:
            counts = found.requests.get(p, collections.Counter())
            text = ", ".join(f"{name} {n / files:.2f}" for name, n in counts.most_common() if n)
            table.row(kind, p, text or "none")


# -- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--files",
        type=int,
        default=20_000,
        help="chunk files (a multiple of 100, above 10,000 of 10,000; default 20000)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument("--data", type=Path, help="keep the data here (default: a temp dir)")
    default = ",".join(kind for kind in KINDS if kind != "shardfs-ro-metrics")  # asked for
    parser.add_argument("--kinds", default=default, help="which mounts, in this order")
    parser.add_argument(
        "--cfloor",
        type=Path,
        help="the C floor's binary (../shared/tools/cfloor.c, built as its header says)",
    )
    results.add_option(parser, "per_file")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds takes some of {', '.join(KINDS)}")
    if args.files < PER_DIR or args.files % (PER_DIR if args.files <= 10_000 else 10_000):
        parser.error("--files must be a multiple of 100 up to 10,000, of 10,000 above")
    if args.repeat < 1:
        parser.error("--repeat must be positive")
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache and mounts")
    skipped = []
    if "floor-noopen" in kinds and not inode_fh_supported():
        kinds.remove("floor-noopen")
        skipped.append(
            "floor-noopen skipped: this pyfuse3 does not pass the inode as fh when the "
            "kernel sends fh 0 (no pyfuse3.SHARDFS_INODE_AS_FH: scripts/setup builds it)"
        )
    if "shardfs-ro-open" in kinds and not kernel_cache_option():
        kinds.remove("shardfs-ro-open")
        skipped.append(
            "shardfs-ro-open skipped: this shardfs has no `-o kernel_cache=no` (before "
            "9d361f1 its `ro` mounts always answer open and opendir: shardfs-ro is that)"
        )
    if args.cfloor is None or not os.access(args.cfloor, os.X_OK):
        for kind in [k for k in kinds if k.startswith("cfloor")]:
            kinds.remove(kind)
            skipped.append(f"{kind} skipped: no --cfloor BINARY (an executable) was given")
    if "cfloor-p" in kinds and not descriptors_for(args.files + 1024):
        kinds.remove("cfloor-p")
        skipped.append(
            f"cfloor-p skipped: it keeps {args.files} files open, above this host's limit"
        )
    for line in skipped:
        print(line, flush=True)
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too
    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-files-"))
    dataset = Dataset(data, args.files)
    daemons = Daemons(dataset, interrupts, args.cfloor)
    found = {kind: Result_() for kind in kinds}
    started = time.perf_counter()
    try:
        data.mkdir(parents=True, exist_ok=True)
        if dataset.ready():
            print(f"reusing {data}")
        else:
            dataset.build()
        for rep in range(args.repeat):
            for kind in rotated(kinds, rep):
                measure(daemons, kind, found[kind], f"  rep {rep + 1}/{args.repeat}")
        for kind in kinds:
            count(daemons, kind, found[kind])
            print(f"  counted {kind}", flush=True)
    finally:
        daemons.stop()
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    a, b, c = dataset.grid
    result = Result("per_file", {"files": args.files, "repeat": args.repeat, "kinds": kinds})
    result.note(
        f"{args.files} files of {FILE_BYTES} bytes in {args.files // PER_DIR} directories of "
        f"{PER_DIR}; shardfs: uint8 {a * CHUNK} x {b * CHUNK} x {c * CHUNK} by zarr-python "
        f"{zarr.__version__}, chunks {CHUNK}^3 (bytes codec only), shards of {SHARD}^3 chunks; "
        f"pyfuse3 patched for inode fh: {'yes' if inode_fh_supported() else 'no'}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    for line in skipped:
        result.note(line)
    report(found, args.files, args.repeat, result)
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
