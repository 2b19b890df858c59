"""Write throughput through a read-write shardfs mount, side by side with the alternatives.

Why: a read-write mount lets a writer of plain chunk-per-file Zarr produce a
sharded array. This script measures what that costs in one run, on one
machine, writing the same array (uint8, 64^3 inner chunks, 256^3 shards, zstd)
with zarr-python 3 three ways:

  (a) into a read-write mount (v3 view) of a source that holds only the
      sharded array's metadata; timed up to the end of the unmount, because
      the daemon commits what it still buffers when it is unmounted (the data
      is in the source, fsynced, only then); the write call alone is shown too,
  (b) into a plain local directory as an unsharded array (same inner chunks
      and codecs), timed without and with a final os.sync(),
  (c) natively sharded into a local directory (same shards), likewise.

Each repetition runs all three back to back, in an order rotated per
repetition; every ratio is the median of per-repetition ratios, with its range.
Every write runs in a writer process of its own (started, loaded with the
data and only then timed), so that an interrupted run can kill it and unmount
cleanly; (a) is its write time plus the unmount, from `fusermount3 -u` to the
daemon's exit. Before each case the previous repetition's array is removed and
everything is flushed, so no case pays for another's write-back.
After every write a few random chunks are read back with zarr-python 3 and
compared; after (a) every shard file of the source is parsed to count the
writes that built it (the first whole write plus one per append: each append
ends in a new, checksummed index, and the previous index ends where the
append's first chunk begins). Needs root (FUSE).

    .venv/bin/python benchmarks/write_throughput.py [--size-mib 512] [--reps 3]
        [--mount-options write_buffer=1G,flush_interval=30] [--workdir DIR] [--keep]
        [--profile daemon.svg]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr
from common import Interrupts, machine, run
from zarr.codecs import ZstdCodec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from shardfs.errors import CorruptData  # noqa: E402
from shardfs.formats.shard_index import EMPTY, IndexCodec, check_entries  # noqa: E402
from shardfs.fuse.mounts import mount_type, unmount  # noqa: E402
from tests.conftest import Mounted, start_mount  # noqa: E402

CHUNK = 64
SHARD = 256
PLANE = (1024, 1024)  # one z plane of uint8 is 1 MiB
ARRAY = "data"
#: zarr-python 3's default compressor for numeric data, given explicitly so all three
#: cases are sure to use the same inner codecs.
COMPRESSOR = ZstdCodec(level=0, checksum=False)
#: Skewed small noise (P(0)=150/256 ... P(3)=16/256) on a slowly varying field, as in
#: read_throughput.py: zstd gets chunks of 64^3 bytes (256 KiB) down to about 90 KiB.
NOISE = np.repeat(np.arange(4, dtype=np.uint8), [150, 60, 30, 16])
TARGET = 0.7  #: a/b, the mount (unmount included) against a plain directory (no sync)
#: Random chunks read back and compared after every write (plus the first and the last).
CHECKED_CHUNKS = 8
#: The daemon's summary at unmount, when it writes one (newer versions do).
COMMIT_SUMMARY = re.compile(r"this mount: (\d+) shard appends, (\d+) whole writes")


# -- the data -----------------------------------------------------------------------


def shape_for(size_mib: int) -> tuple[int, int, int]:
    """(depth, 1024, 1024): at least `size_mib` MiB, a whole number of chunks deep."""
    return (math.ceil(size_mib / CHUNK) * CHUNK, *PLANE)


def generate(shape: tuple[int, int, int], seed: int = 1) -> np.ndarray:
    """A smooth field plus small skewed noise: compresses to roughly a third."""
    out = np.empty(shape, dtype=np.uint8)
    y, x = (np.arange(n, dtype=np.float32) for n in shape[1:])
    plane = 15 * np.sin(y / 310)[:, None] + 15 * np.cos(x / 170)[None, :] + 128
    rng = np.random.default_rng(seed)
    for z0 in range(0, shape[0], CHUNK):
        z = np.arange(z0, min(z0 + CHUNK, shape[0]), dtype=np.float32)
        smooth = (15 * np.sin(z / 230)[:, None, None] + plane[None]).astype(np.uint8)
        noise = NOISE[rng.integers(0, 256, size=smooth.shape, dtype=np.uint8)]
        out[z0 : z0 + len(z)] = smooth + noise
    return out


def create_array(path: Path, shape: tuple[int, ...], sharded: bool) -> None:
    """The array's metadata only (no chunk written), under group `path` as ARRAY."""
    group = zarr.open_group(path, mode="w")
    group.create_array(
        ARRAY,
        shape=shape,
        dtype="uint8",
        chunks=(CHUNK,) * 3,
        shards=(SHARD,) * 3 if sharded else None,
        compressors=COMPRESSOR,
        fill_value=0,
    )


def zarr_write(path: Path, data: np.ndarray, sharded: bool) -> None:
    """What is timed: open the existing array and write all of it."""
    array = zarr.open_array(path, mode="r+")
    if (array.shards is not None) != sharded or array.chunks != (CHUNK,) * 3:
        raise RuntimeError(f"{path}: unexpected layout shards={array.shards} chunks={array.chunks}")
    array[...] = data


def check_chunks(path: Path, data: np.ndarray, rng: np.random.Generator) -> None:
    """Read the first, the last and a few random inner chunks back and compare."""
    array = zarr.open_array(path, mode="r")
    grid = [math.ceil(n / CHUNK) for n in data.shape]
    picks = [(0,) * 3, tuple(g - 1 for g in grid)]
    picks += [tuple(int(rng.integers(g)) for g in grid) for _ in range(CHECKED_CHUNKS)]
    for pick in picks:
        region = tuple(slice(c * CHUNK, (c + 1) * CHUNK) for c in pick)
        if not np.array_equal(array[region], data[region]):
            raise RuntimeError(f"{path}: chunk {pick} differs from what was written")


def stored_files(top: Path) -> list[Path]:
    """The chunk or shard files of the array at `top` (no metadata)."""
    return [p for p in sorted(top.rglob("*")) if p.is_file() and p.name != "zarr.json"]


# -- what the commits left in the shards ----------------------------------------------


@dataclass
class ShardHistory:
    """One shard file: its size, its live chunk bytes, and the writes that built it."""

    size: int
    live: int
    index_size: int
    writes: int | None  #: 1 (whole) + appends; None if the file could not be parsed

    @property
    def dead(self) -> int:
        return self.size - self.live - self.index_size


def shard_history(path: Path, codec: IndexCodec, cps: tuple[int, ...]) -> ShardHistory:
    """Walk a shard's appends backwards, from its last index to its first write.

    An append writes its chunks contiguously from the old end of the shard and
    then a new index, so the old index ends exactly where the append's first
    chunk begins: among the offsets the current index points to (or just
    before the index itself, for an append of no chunk), the highest one that
    is preceded by a valid (checksummed, in-bounds) index and followed by
    exactly the current index's chunks up to the index is where the previous
    write ended. When no such offset exists, the current index belongs to the
    first write, which must then be a compact shard.
    """
    isz = codec.size(cps)
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size

        def index_ending_at(end: int) -> np.ndarray | None:
            if end < isz:
                return None
            try:
                index = codec.decode(os.pread(fd, isz, end - isz), cps).reshape(-1, 2)
                check_entries(index, 0, end - isz)
            except CorruptData:
                return None
            return index

        last = index_ending_at(size)
        if last is None:
            return ShardHistory(size, 0, isz, None)
        used = last[:, 1] != EMPTY
        live = int(last[used, 1].sum())
        writes, end, index = 1, size, last
        while True:
            used = index[:, 1] != EMPTY
            offsets, nbytes = index[used, 0].astype(np.int64), index[used, 1].astype(np.int64)
            data_end = end - isz
            previous = None
            for start in sorted({*offsets.tolist(), data_end}, reverse=True):
                tail = offsets >= start
                if int(nbytes[tail].sum()) != data_end - start:
                    continue
                found = index_ending_at(start)
                if found is not None:
                    previous = (start, found)
                    break
            if previous is None:
                compact = int(nbytes.sum()) == data_end and (
                    offsets.size == 0 or offsets.min() == 0
                )
                return ShardHistory(size, live, isz, writes if compact else None)
            writes += 1
            end, index = previous


def shard_histories(array_dir: Path) -> list[ShardHistory]:
    meta = json.loads((array_dir / "zarr.json").read_text())
    (sharding,) = [c for c in meta["codecs"] if c["name"] == "sharding_indexed"]
    config = sharding["configuration"]
    if any(c["name"] == "sharding_indexed" for c in config["codecs"]):
        raise RuntimeError("nested sharding is not analysed")
    if config.get("index_location", "end") != "end":
        raise RuntimeError("shards with the index at the start are rewritten, never appended")
    shard = meta["chunk_grid"]["configuration"]["chunk_shape"]
    cps = tuple(s // c for s, c in zip(shard, config["chunk_shape"], strict=True))
    codec = IndexCodec.from_codecs(config["index_codecs"])
    return [shard_history(p, codec, cps) for p in stored_files(array_dir)]


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    """median (min-max)"""
    return (
        f"{fmt.format(statistics.median(values))} "
        f"({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


# -- mounts ---------------------------------------------------------------------------


class Mounts:
    """At most one read-write `shardfs mount -f` child at a time, always reaped by `stop`."""

    #: How long the daemon may take to commit what it buffers after the unmount.
    EXIT_TIMEOUT = 600.0

    def __init__(self, mountpoint: Path, log: Path, options: list[str], interrupts: Interrupts):
        self.mountpoint = mountpoint
        self.log = log
        self.options = options
        self.interrupts = interrupts
        self.current: Mounted | None = None

    def start(self, source: Path) -> Mounted:
        self.stop()
        with self.interrupts.deferred():  # a daemon must never start without being recorded
            self.current = start_mount(source, self.mountpoint, self.log, *self.options)
        return self.current

    def stop(self) -> None:
        """`fusermount3 -u` (lazily if that fails), then wait for the daemon to commit and
        exit; it is killed, by its PID, only if it does not exit in EXIT_TIMEOUT."""
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            mounted, self.current = self.current, None
            if mounted is None:
                return
            path = str(mounted.path)
            problem = None
            if mount_type(path) == "fuse.shardfs":
                result = unmount(path)
                if result.returncode != 0:
                    problem = f"fusermount3 -u failed: {result.stderr.strip()}; unmounted lazily"
                    unmount(path, lazy=True)
            try:
                mounted.process.wait(timeout=self.EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                mounted.process.kill()
                mounted.process.wait(timeout=30)
                problem = f"the daemon did not exit in {self.EXIT_TIMEOUT:.0f} s; killed"
            if mount_type(path) == "fuse.shardfs":
                unmount(path, lazy=True)
            if problem is None and mounted.process.returncode != 0:
                problem = f"the daemon exited with status {mounted.process.returncode}"
            if problem is not None:
                raise RuntimeError(f"{problem} (see {self.log})")


# -- the cases ------------------------------------------------------------------------


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    """CPU of this process's reaped children (e.g. the daemon, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def writer_main(target: str, data_file: str, sharded: str, sync: str) -> int:
    """The writer process (`--writer`): load the data, say "ready", and on "go" open the
    array and write it all; report the time and CPU of that (and of a following
    os.sync() if asked) as one JSON line."""
    data = np.load(data_file)
    print("ready", flush=True)
    if sys.stdin.readline() != "go\n":
        return 1
    cpu0 = cpu_self()
    started = time.perf_counter()
    zarr_write(Path(target), data, sharded=sharded == "sharded")
    written = time.perf_counter()
    cpu1 = cpu_self()
    if sync == "sync":
        os.sync()
    synced = time.perf_counter()
    result = {"write": written - started, "sync": synced - written, "cpu": cpu1 - cpu0}
    print(json.dumps(result), flush=True)
    return 0


def timed_write(target: Path, data_file: Path, sharded: bool, sync: bool) -> dict[str, float]:
    """Write the array in a writer process of its own.

    A process, not a call: if the benchmark is interrupted, killing the writer
    (by its PID) closes every file it has open in the mount, so the unmount
    that follows is not refused as busy, and no write outlives it. The writer
    runs in its own session, so a Ctrl-C reaches only this process, which kills it.
    """
    command = [sys.executable, str(Path(__file__).resolve()), "--writer", str(target)]
    command += [str(data_file), "sharded" if sharded else "plain", "sync" if sync else "-"]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        if process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the writer of {target} did not start")
        process.stdin.write(b"go\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the writer of {target} failed (exit status {process.wait()})")
        process.wait(timeout=60)
        return json.loads(line)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@dataclass
class Bench:
    work: Path
    data: np.ndarray
    data_file: Path  #: the data as .npy, for the writer processes
    mounts: Mounts
    seed: int = 0
    #: Per measure, one value per repetition (seconds unless noted).
    times: dict[str, list[float]] = field(default_factory=dict)
    shards: list[list[ShardHistory]] = field(default_factory=list)
    #: (appends, whole writes) from the daemon's log, None where it logs no such summary.
    logged: list[tuple[int, int] | None] = field(default_factory=list)
    stored: dict[str, list[int]] = field(default_factory=dict)

    def record(self, name: str, value: float) -> None:
        self.times.setdefault(name, []).append(value)

    def fresh(self, name: str) -> Path:
        """An empty place for a case's array, with the previous repetition's removed and
        everything flushed, so no case pays for another's write-back."""
        path = self.work / name
        if mount_type(str(self.mounts.mountpoint)) is not None:
            raise RuntimeError(f"{self.mounts.mountpoint} is still mounted")
        shutil.rmtree(path, ignore_errors=True)
        os.sync()
        return path

    def check(self, name: str, array_dir: Path) -> None:
        rng = np.random.default_rng(self.seed)
        self.seed += 1
        check_chunks(array_dir, self.data, rng)
        self.stored.setdefault(name, []).append(
            sum(p.stat().st_size for p in stored_files(array_dir))
        )

    def case_a(self, profile: Path | None = None) -> str:
        source = self.fresh("a-source.zarr")
        create_array(source, self.data.shape, sharded=True)
        os.sync()
        log_start = self.mounts.log.stat().st_size if self.mounts.log.exists() else 0
        mounted = self.mounts.start(source)
        spy = None
        if profile is not None:
            fmt = "flamegraph" if profile.suffix == ".svg" else "raw"
            command = [str(Path(sys.executable).parent / "py-spy"), "record", "-o", str(profile)]
            command += ["-f", fmt, "-p", str(mounted.process.pid)]
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1)  # py-spy attaches
        try:
            result = timed_write(
                self.mounts.mountpoint / ARRAY, self.data_file, sharded=False, sync=False
            )
            daemon0 = cpu_children()  # the writer is reaped; the daemon not yet
            unmounting = time.perf_counter()
        finally:
            self.mounts.stop()
        unmounted = time.perf_counter()
        daemon_cpu = cpu_children() - daemon0  # its whole life (and fusermount3's)
        if spy is not None:
            _, err = spy.communicate(timeout=120)
            if spy.returncode != 0:
                print(f"  py-spy failed: {err.decode(errors='replace').strip()}", flush=True)
            return f"profile of the daemon written to {profile}"
        with open(self.mounts.log, errors="replace") as f:
            f.seek(log_start)
            log = f.read()
        if " ERROR " in log or "all buffered chunks committed" not in log:
            raise RuntimeError(f"the daemon did not commit everything:\n{log}")
        self.check("a", source / ARRAY)
        write, unmount_s = result["write"], unmounted - unmounting
        self.record("a", write + unmount_s)
        self.record("a-write", write)
        self.record("a-unmount", unmount_s)
        self.record("a-client-cpu", result["cpu"])
        self.record("a-daemon-cpu", daemon_cpu)
        histories = shard_histories(source / ARRAY)
        self.shards.append(histories)
        summary = COMMIT_SUMMARY.findall(log)
        self.logged.append((int(summary[-1][0]), int(summary[-1][1])) if summary else None)
        writes = [h.writes for h in histories if h.writes is not None]
        described = f"{len(histories)} shards"
        if writes:
            described += f", writes per shard {spread(writes)}"
        return (
            f"write {write:.3f} s + unmount {unmount_s:.3f} s; "
            f"CPU: writer {result['cpu']:.1f} s, daemon {daemon_cpu:.1f} s; {described}"
        )

    def case_plain(self, key: str, sharded: bool) -> str:
        path = self.fresh(f"{key}.zarr")
        create_array(path, self.data.shape, sharded=sharded)
        os.sync()
        result = timed_write(path / ARRAY, self.data_file, sharded=sharded, sync=True)
        self.check(key, path / ARRAY)
        self.record(key, result["write"])
        self.record(f"{key}-sync", result["write"] + result["sync"])
        self.record(f"{key}-client-cpu", result["cpu"])
        return f"write {result['write']:.3f} s, + os.sync() {result['sync']:.3f} s"

    def repetition(self, rep: int, reps: int) -> None:
        cases = [
            ("a", self.case_a),
            ("b", lambda: self.case_plain("b", sharded=False)),
            ("c", lambda: self.case_plain("c", sharded=True)),
        ]
        order = cases[rep % 3 :] + cases[: rep % 3]
        for key, case in order:
            print(f"  rep {rep + 1}/{reps} {key}: {case()}", flush=True)


# -- report ---------------------------------------------------------------------------


CASES = [
    ("a", "shardfs mount: write + unmount (committed, fsynced)"),
    ("a-write", "shardfs mount: the write call alone"),
    ("b", "plain local dir, unsharded (no sync)"),
    ("b-sync", "plain local dir, unsharded, + os.sync()"),
    ("c", "native sharded local dir (no sync)"),
    ("c-sync", "native sharded local dir, + os.sync()"),
]

RATIOS = [
    ("a", "b", "**a/b** (headline: mount incl. unmount / plain, no sync)", TARGET),
    ("a", "b-sync", "a/b_sync (mount incl. unmount / plain + os.sync())", None),
    ("a-write", "b", "a_write/b (write call alone / plain, no sync)", None),
    ("a", "c", "a/c (mount incl. unmount / native sharded, no sync)", None),
    ("a", "c-sync", "a/c_sync (mount incl. unmount / native sharded + os.sync())", None),
]


def report(bench: Bench, reps: int, nbytes: int) -> tuple[str, bool]:
    mib = nbytes / (1 << 20)
    t = bench.times
    lines = [
        f"| case (median of {reps}, {mib:.0f} MiB uncompressed) | MiB/s (range) | s | writer CPU s |",
        "|---|---:|---:|---:|",
    ]
    for key, label in CASES:
        rates = [mib / s for s in t[key]]
        cpu = t.get(f"{key}-client-cpu")
        cpu_cell = f"{statistics.median(cpu):.1f}" if cpu else ""
        lines.append(
            f"| {key} {label} | {spread(rates)} | {statistics.median(t[key]):.3f} | {cpu_cell} |"
        )
    lines += ["", "| ratio (throughput, median of per-repetition ratios) | value (range) |"]
    lines.append("|---|---:|")
    met = False
    for num, den, label, target in RATIOS:
        # Throughput ratio = inverse time ratio; the two ran close together in one repetition.
        ratios = sorted(d / n for n, d in zip(t[num], t[den], strict=True))
        cell = f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        if target is not None:
            met = statistics.median(ratios) >= target
            cell += f", target a/b >= {target}: {'met' if met else 'NOT met'}"
        lines.append(f"| {label} | {cell} |")
    return "\n".join(lines), met


def shard_report(bench: Bench, reps: int) -> str:
    lines = [
        "shard files written through the mount (case a), per repetition, "
        "median (min-max) over shards:",
        "| rep | shards | writes per shard (1 whole + appends) | appends, whole writes "
        "(from the files; daemon log) | size / compact size | dead bytes per shard "
        "| dead total | stored total |",
        "|---|---:|---|---|---|---|---:|---:|",
    ]
    for rep, histories in enumerate(bench.shards):
        writes = [h.writes for h in histories if h.writes is not None]
        unparsed = len(histories) - len(writes)
        ratio = [h.size / (h.live + h.index_size) for h in histories]
        dead = [h.dead / 1024 for h in histories]
        cell = spread(writes) if writes else "-"
        if unparsed:
            cell += f" ({unparsed} shards not parsed)"
        counts = f"{sum(writes) - len(writes)}, {len(writes)}; "
        logged = bench.logged[rep]
        counts += "not logged" if logged is None else f"{logged[0]}, {logged[1]}"
        lines.append(
            f"| {rep + 1} | {len(histories)} | {cell} | {counts} | {spread(ratio, '{:.2f}')} "
            f"| {spread(dead)} KiB | {sum(h.dead for h in histories) / (1 << 20):.1f} MiB "
            f"| {sum(h.size for h in histories) / (1 << 20):.1f} MiB |"
        )
    lines.append(
        "writes per shard are read from the shard files: each append ends in a new "
        "checksummed index, and the one before it ends where the append's first chunk starts; "
        "the daemon logs only totals (appends, whole writes) at unmount, if at all"
    )
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------


def clean_up(work: Path, created: bool, mountpoint: Path, keep: bool) -> None:
    """Remove what this run wrote (never while something is mounted in it)."""
    if keep:
        print(f"kept {work}")
        return
    if mount_type(str(mountpoint)) is not None:
        print(f"{mountpoint} is still mounted: {work} left in place", file=sys.stderr)
        return
    for name in ("a-source.zarr", "b.zarr", "c.zarr", "mnt", "mount.log", "data.npy"):
        path = work / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if created:
        with contextlib.suppress(OSError):
            work.rmdir()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="uncompressed size (MiB)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument(
        "--mount-options",
        default="",
        help="more options for the mount of case a, e.g. write_buffer=1G,flush_interval=30",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / "bench-data" / "write",
        help="where the arrays are written (default: bench-data/write, git-ignored; "
        "not bench-data itself, which holds read_throughput.py's data set)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the written arrays")
    parser.add_argument(
        "--profile",
        type=Path,
        help="after the measured repetitions, run case a once more (untimed) with py-spy "
        "recording the daemon into this file (.svg: flame graph, else raw collapsed stacks)",
    )
    args = parser.parse_args()
    if args.size_mib < 1 or args.reps < 1:
        parser.error("--size-mib and --reps must be positive")
    if os.geteuid() != 0:
        parser.error("needs root (FUSE mounts, os.sync)")
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too

    work = args.workdir.resolve()
    if mount_type(str(work / "mnt")) is not None:
        parser.error(f"{work / 'mnt'} is mounted already (left by another run?)")
    created = not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "mount.log"
    log.write_text("")
    options = [o for o in args.mount_options.split(",") if o.strip()] + [f"log={log}"]
    mounts = Mounts(work / "mnt", log, options, interrupts)
    shape = shape_for(args.size_mib)
    nbytes = math.prod(shape)
    profiled = None
    try:
        print(f"generating {shape} uint8 ({nbytes / (1 << 20):.0f} MiB) ...", flush=True)
        data = generate(shape)
        data_file = work / "data.npy"
        np.save(data_file, data)
        bench = Bench(work, data, data_file, mounts)
        print(
            f"array {shape} uint8, chunks {CHUNK}^3, shards {SHARD}^3 "
            f"({math.prod(math.ceil(n / SHARD) for n in shape)} shards, "
            f"{math.prod(math.ceil(n / CHUNK) for n in shape)} chunks), {COMPRESSOR}; "
            f"mount options: {','.join(options)}",
            flush=True,
        )
        for rep in range(args.reps):
            bench.repetition(rep, args.reps)
        if args.profile is not None:
            profiled = bench.case_a(profile=args.profile.resolve())
    finally:
        try:
            mounts.stop()
        finally:
            clean_up(work, created, mounts.mountpoint, args.keep)

    table, _met = report(bench, args.reps, nbytes)
    stored = {k: statistics.median(v) / (1 << 20) for k, v in bench.stored.items()}
    print()
    print(f"$ {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(machine())
    print(
        f"array {shape} uint8 = {nbytes / (1 << 20):.0f} MiB, chunks {CHUNK}^3, shards "
        f"{SHARD}^3, zstd level 0; stored MiB (median): a {stored['a']:.1f} (shards, dead "
        f"bytes included), b {stored['b']:.1f} (chunk files), c {stored['c']:.1f} (shards); "
        f"mount options: {','.join(options[:-1]) or 'defaults'}"
    )
    print(table)
    print(
        "headline a/b: (a) is timed up to the end of the unmount, the first moment its data "
        "is in the source, committed with fsync; (b) without sync, the way a writer of a "
        "plain directory works (its data still in the page cache). a/b_sync, with b's data "
        "flushed by os.sync(), is the like-for-like durability comparison."
    )
    a = bench.times
    print(
        f"case a, median: write call {statistics.median(a['a-write']):.3f} s, unmount "
        f"(commits still buffered) {statistics.median(a['a-unmount']):.3f} s; CPU: writer "
        f"{statistics.median(a['a-client-cpu']):.1f} s (b: "
        f"{statistics.median(a['b-client-cpu']):.1f} s), daemon "
        f"{statistics.median(a['a-daemon-cpu']):.1f} s"
    )
    print(shard_report(bench, args.reps))
    if profiled:
        print(profiled)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--writer"]:
        sys.exit(writer_main(*sys.argv[2:]))
    run(main)
