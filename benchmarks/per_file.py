"""Per-file cost: N tiny chunk files opened, read and closed through a mount, beside the floor.

Why (issue 21): a tool that walks a chunk-per-file array (a copy, a checksum,
a DANDI upload) opens, reads and closes every file, so a mount's cost per file
decides how long that takes; for files of a few bytes nothing else counts.
The daemon answers several requests per file, and each request costs the
pyfuse3 + trio machinery before shardfs's own code runs: `floor.py` measures
that floor with handlers that do nothing. This script compares, in one run:

  floor         `floor.py serve`: N files of 64 bytes in directories of 100
  floor-noopen  the same with open and opendir answering ENOSYS (the kernel then
                sends no open or release); only with a patched pyfuse3 (see
                floor.py), skipped with a message otherwise
  shardfs-ro    `shardfs mount SOURCE MNT -f -o ro`: kernel-served where shardfs
                and pyfuse3 can (since 9d361f1, with the patched pyfuse3: open and
                opendir answer ENOSYS, as in floor-noopen)
  shardfs-ro-open  `-o ro,kernel_cache=no`: read-only with open and release
                requests (what `ro` was before 9d361f1); skipped, with a
                message, where shardfs has no such option
  shardfs-rw    `shardfs mount SOURCE MNT -f` (read-write) of the same source

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

    .venv/bin/python benchmarks/per_file.py [--files 20000] [--repeat 3] [--data DIR]
        [--kinds floor,floor-noopen,shardfs-ro,shardfs-ro-open,shardfs-rw]

Without --data, the data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr
from common import DataDir, Interrupts, machine, run
from floor import inode_fh_supported
from read_throughput import drop_caches
from scale import revision

from shardfs.fuse.mounts import mount_type, unmount
from shardfs.options import parse_options
from shardfs.primitives.errors import UsageError

HERE = Path(__file__).resolve().parent
ARRAY = "data"
CHUNK = 4  #: inner chunk edge: 4^3 uint8 = 64 bytes
SHARD = 8  #: inner chunks per shard along each axis
PER_DIR = 100  #: chunk files per chunk directory (the last axis)
FILE_BYTES = CHUNK**3
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
KINDS = ("floor", "floor-noopen", "shardfs-ro", "shardfs-ro-open", "shardfs-rw")
#: The mount options of each shardfs kind (`debug` is added for the counting run).
SHARDFS_OPTIONS = {
    "shardfs-ro": ["ro"],
    "shardfs-ro-open": ["ro", "kernel_cache=no"],
    "shardfs-rw": [],
}
PASSES = ("first", "second")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
#: A request in shardfs's debug log: `... DEBUG lookup(1, b'data', ...)`.
LOGGED_REQUEST = re.compile(rb" DEBUG (\w+)\(")


# -- the data set ---------------------------------------------------------------------


def grid_for(files: int) -> tuple[int, int, int]:
    """Chunks per axis: the last axis holds 100, so every chunk directory has 100 files."""
    directories = files // PER_DIR
    if directories <= PER_DIR:
        return (1, directories, PER_DIR)
    return (directories // PER_DIR, PER_DIR, PER_DIR)


def values(shape: tuple[int, ...]) -> np.ndarray:
    """The array's values: random, never the fill value, so every chunk is stored."""
    return np.random.default_rng(21).integers(1, 256, size=shape, dtype=np.uint8)


@dataclass
class Dataset(DataDir):
    files: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return grid_for(self.files)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(n * CHUNK for n in self.grid)  # type: ignore[return-value]

    @property
    def params(self) -> dict[str, object]:
        return {
            "grid": list(self.grid),
            "chunk": CHUNK,
            "shard": SHARD,
            "generator": GENERATOR,
            "zarr": zarr.__version__,
        }

    def ready(self) -> bool:
        return super().ready() and (self.source / ARRAY / "zarr.json").is_file()

    def build(self) -> None:
        self.marker.unlink(missing_ok=True)
        shutil.rmtree(self.source, ignore_errors=True)
        started = time.perf_counter()
        print(f"writing {self.source} with zarr-python {zarr.__version__} ...", flush=True)
        group = zarr.open_group(self.source, mode="w")
        array = group.create_array(
            ARRAY,
            shape=self.shape,
            dtype="u1",
            chunks=(CHUNK,) * 3,
            shards=(CHUNK * SHARD,) * 3,
            compressors=None,
            filters=None,
            fill_value=0,
        )
        array[:] = values(self.shape)
        print(f"  {time.perf_counter() - started:.1f} s", flush=True)
        check = zarr.open_array(self.source / ARRAY, mode="r")
        if check.chunks != (CHUNK,) * 3 or check.compressors or check.filters:
            raise RuntimeError(f"{self.source}: zarr-python wrote {check.info}")
        if not np.array_equal(check[:], values(self.shape)):
            raise RuntimeError(f"{self.source}: zarr-python reads other values than written")
        self.marker.write_text(json.dumps(self.params))

    def paths(self, top: Path, kind: str) -> list[bytes]:
        """Every file of a mount of `kind` at `top`, in key order (a directory's files together)."""
        if kind.startswith("floor"):
            names = (f"{i // PER_DIR}/{i % PER_DIR}" for i in range(self.files))
        else:
            _, rows, columns = self.grid
            names = (
                f"{ARRAY}/c/{d // rows}/{d % rows}/{k}"
                for d in range(self.files // columns)
                for k in range(columns)
            )
        return [os.fsencode(top / name) for name in names]


# -- the daemons ----------------------------------------------------------------------


def cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


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
        """The requests it has answered so far, per handler (a counting daemon only)."""
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
    """At most one daemon at a time; `stop` unmounts it (lazily if busy) and reaps it,
    killing it by PID only if it does not exit."""

    def __init__(self, dataset: Dataset, interrupts: Interrupts) -> None:
        self.dataset = dataset
        self.interrupts = interrupts
        self.current: Daemon | None = None

    def start(self, kind: str, counting: bool = False) -> Daemon:
        self.stop()
        path = self.dataset.data / f"mnt-{kind}"
        path.mkdir(exist_ok=True)
        log = self.dataset.data / f"{kind}.log"
        counts_file = None
        if kind.startswith("floor"):
            fstype = "fuse.floor"
            command = [sys.executable, str(HERE / "floor.py"), "serve", str(path)]
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
            if options:
                command += ["-o", ",".join(options)]
        with self.interrupts.deferred(), open(log, "wb") as out:  # never an untracked daemon
            # Its own session: a Ctrl-C reaches this script only, which then unmounts.
            process = subprocess.Popen(
                command, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
            )
            self.current = Daemon(kind, path, fstype, process, log, counts_file)
        deadline = time.monotonic() + 60
        while mount_type(str(path)) != fstype:
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{kind} did not mount: {log.read_text(errors='replace')}")
            time.sleep(0.02)
        os.stat(path)  # answered by the daemon
        return self.current

    def stop(self) -> None:
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            daemon, self.current = self.current, None
            if daemon is None:
                return
            path = str(daemon.path)
            if mount_type(path) == daemon.fstype and unmount(path).returncode != 0:
                unmount(path, lazy=True)
            try:
                daemon.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.process.kill()  # our own child, by PID
                daemon.process.wait(timeout=30)
            if mount_type(path) == daemon.fstype:
                unmount(path, lazy=True)


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
class Result:
    """Per pass: CPU µs per file and files/s of each repetition; requests of the counting run."""

    cpu: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PASSES})
    rate: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PASSES})
    requests: dict[str, collections.Counter[str]] = field(default_factory=dict)


def measure(daemons: Daemons, kind: str, result: Result, tag: str) -> None:
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


def count(daemons: Daemons, kind: str, result: Result) -> None:
    """Both passes on a fresh counting daemon: the requests of each."""
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


# -- report ---------------------------------------------------------------------------


def cell(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def ratio_cell(ratios: list[float]) -> str:
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def report(results: dict[str, Result], files: int, repeat: int) -> str:
    """The table: per kind and pass, CPU and files/s (medians, ranges), requests per file,
    and the CPU over the floor's (both passes) and the no-open floor's (first pass: its
    second costs nothing)."""
    floors = [(name, p) for name in ("floor", "floor-noopen") if name in results for p in PASSES]
    floors = [(name, p) for name, p in floors if name == "floor" or p == "first"]
    lines = [
        f"| mount (median of {repeat}, range) | first µs CPU/file | second µs CPU/file "
        "| first files/s | second files/s | first requests/file | second requests/file | "
        + " | ".join(f"{p} CPU / {name}" for name, p in floors)
        + " |",
        "|---|" + "---:|" * (6 + len(floors)),
    ]
    for kind, result in results.items():
        cells = [cell(result.cpu[p], ".0f") for p in PASSES]
        cells += [cell(result.rate[p], ".0f") for p in PASSES]
        cells += [
            f"{sum(result.requests[p].values()) / files:.2f}" if result.requests else ""
            for p in PASSES
        ]
        for name, p in floors:
            pairs = list(zip(result.cpu[p], results[name].cpu[p], strict=True))
            if all(f > 0 for _, f in pairs):
                cells.append(ratio_cell([k / f for k, f in pairs]))
            else:
                cells.append("n/a")
        lines.append(f"| {kind} | {' | '.join(cells)} |")
    lines += ["", "| mount | pass | requests per file (counting run) |", "|---|---|---|"]
    for kind, result in results.items():
        for p in PASSES:
            counts = result.requests.get(p, collections.Counter())
            text = ", ".join(f"{name} {n / files:.2f}" for name, n in counts.most_common() if n)
            lines.append(f"| {kind} | {p} | {text or 'none'} |")
    return "\n".join(lines)


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
    parser.add_argument("--kinds", default=",".join(KINDS), help="which mounts, in this order")
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
    for line in skipped:
        print(line, flush=True)
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too
    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-files-"))
    dataset = Dataset(data, args.files)
    daemons = Daemons(dataset, interrupts)
    results = {kind: Result() for kind in kinds}
    code = revision()
    print(f"shardfs at {code}", flush=True)
    started = time.perf_counter()
    try:
        data.mkdir(parents=True, exist_ok=True)
        if dataset.ready():
            print(f"reusing {data}")
        else:
            dataset.build()
        for rep in range(args.repeat):
            for kind in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:
                measure(daemons, kind, results[kind], f"  rep {rep + 1}/{args.repeat}")
        for kind in kinds:
            count(daemons, kind, results[kind])
            print(f"  counted {kind}", flush=True)
    finally:
        daemons.stop()
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    a, b, c = dataset.grid
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    print(f"shardfs at {code}")
    print(
        f"{args.files} files of {FILE_BYTES} bytes in {args.files // PER_DIR} directories of "
        f"{PER_DIR}; shardfs: uint8 {a * CHUNK} x {b * CHUNK} x {c * CHUNK} by zarr-python "
        f"{zarr.__version__}, chunks {CHUNK}^3 (bytes codec only), shards of {SHARD}^3 chunks; "
        f"pyfuse3 patched for inode fh: {'yes' if inode_fh_supported() else 'no'}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    for line in skipped:
        print(line)
    print()
    print(report(results, args.files, args.repeat))
    return 0


if __name__ == "__main__":
    run(main)
