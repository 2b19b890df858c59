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

With --small-chunks, many small chunk files instead (issue 21): there a mount's cost
per file (the requests of every create, write and rename) counts rather than its
bandwidth, and zarr-python 2.18 (which writes its chunks one at a time) is written
through the v2 view. The array is 512 x 512 x 256 uint16 (128 MiB; a ramp along every
axis plus small skewed noise, the same in every run) in 2048 chunks of 32^3, written
four ways, each in a writer process as above:

  (1) zarr-python 2.18 (tests/support/zarr2.py's .venv-zarr2; its default compressor, Blosc
      lz4) through a read-write mount `-o rw,view=v2,shard_new=8` of a source that
      holds only a root group: the array is made through the view and stored sharded
      (256^3 shards of 8^3 chunks); timed up to the end of the unmount, as (a),
  (2) zarr-python 2.18 into a plain local directory (v2), without and with os.sync(),
  (3) zarr-python 3 through a read-write mount (v3 view) of a source holding the array
      made by zarr-python 3 as sharded (32^3 inner chunks, 256^3 shards, zstd level 0),
      written as the view shows it (unsharded, 32^3 chunks); timed as (1),
  (4) zarr-python 3 into a plain local directory, unsharded (32^3 chunks, zstd level
      0), without and with os.sync().

zarr-python 2.18 makes its array itself (with its defaults) before it is timed; the
zarr-python 3 writers find theirs made. Each repetition runs the four in an order
rotated per repetition. The ratios plain time / mount time, (2)/(1) and (4)/(3), are
checked against the issue's targets (0.3 and 0.8) with the plain side synced, the
like-for-like comparison (both committed); without the sync they are shown too. After
every write the whole array is read back with zarr-python 3 (for (1) and (3) from the
source, after the unmount) and compared, and its layout checked. The daemon's CPU is
read from /proc just before the unmount and, for its whole life, after its exit. One
more, untimed, run of (1) and (3) with `-o debug` counts the FUSE requests per chunk
by handler (the debug log has a line per request; release and releasedir are not
logged, so they are counted as the creates, opens and opendirs they close, and forget
is not counted).

    .venv/bin/python -m benchmarks.write_throughput [--size-mib 512] [--reps 3]
        [--mount-options write_buffer=1G,flush_interval=30] [--workdir DIR] [--keep]
        [--profile daemon.svg] [--results PATH]
    .venv/bin/python -m benchmarks.write_throughput --small-chunks [--reps 3]
        [--mount-options ...] [--workdir DIR] [--keep] [--results PATH]

The result is `write_throughput` (`write_throughput-small` with --small-chunks).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from benchmarks.harness import results
from benchmarks.harness.daemons import WriteMounts as Mounts
from benchmarks.harness.machine import ROOT
from benchmarks.harness.procs import cpu as process_cpu
from benchmarks.harness.procs import cpu_children
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, rotated, run
from benchmarks.harness.writers import (
    ARRAY,
    CHUNK,
    COMPRESSOR,
    NOISE,
    PLANE,
    ROOT_GROUP,
    SHARD,
    SMALL_CHUNK,
    SMALL_MOUNT_OPTIONS,
    SMALL_SHAPE,
    ZARR3,
    Writer,
    create_array,
    generate_small,
    timed_write,
)
from shardfs.formats.shard_index import EMPTY, IndexCodec, check_entries
from shardfs.fuse.mounts import mount_type
from shardfs.primitives.errors import CorruptData
from tests.support.zarr2 import ensure_zarr2

#: A request in shardfs's debug log: `... DEBUG lookup(1, b'data', ...)`.
LOGGED_REQUEST = re.compile(rb" DEBUG (\w+)\(")
TARGET = 0.7  #: a/b, the mount (unmount included) against a plain directory (no sync)
#: Random chunks read back and compared after every write (plus the first and the last).
CHECKED_CHUNKS = 8
#: The daemon's summary at unmount, when it writes one (newer versions do).
COMMIT_SUMMARY = re.compile(r"this mount: (\d+) shard appends, (\d+) whole writes")
#: Metadata documents, not counted as stored data.
METADATA = frozenset(("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"))

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


def check_chunks(array: zarr.Array, data: np.ndarray, rng: np.random.Generator) -> None:
    """Read the first, the last and a few random inner chunks back and compare."""
    grid = [math.ceil(n / CHUNK) for n in data.shape]
    picks = [(0,) * 3, tuple(g - 1 for g in grid)]
    picks += [tuple(int(rng.integers(g)) for g in grid) for _ in range(CHECKED_CHUNKS)]
    for pick in picks:
        region = tuple(slice(c * CHUNK, (c + 1) * CHUNK) for c in pick)
        if not np.array_equal(array[region], data[region]):
            raise RuntimeError(f"{array.store_path}: chunk {pick} differs from what was written")


def check_layout(path: Path, chunk: int, sharded: bool) -> zarr.Array:
    """The array at `path`, opened for reading, if it has the inner chunks and sharding
    (SHARD^3 shards) it should have."""
    array = zarr.open_array(path, mode="r")
    layout = (array.chunks, array.shards)
    if layout != ((chunk,) * 3, (SHARD,) * 3 if sharded else None):
        raise RuntimeError(f"{path}: unexpected layout (chunks, shards) {layout}")
    return array


def check_whole(array: zarr.Array, data: np.ndarray) -> None:
    """Read all of the array back and compare."""
    if not np.array_equal(array[...], data):
        raise RuntimeError(f"{array.store_path}: differs from what was written")


def stored_files(top: Path) -> list[Path]:
    """The chunk or shard files of the array at `top` (no metadata)."""
    return [p for p in sorted(top.rglob("*")) if p.is_file() and p.name not in METADATA]


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


# -- the cases ------------------------------------------------------------------------


@dataclass
class MountWrite:
    """One write through a mount, up to the daemon's exit."""

    write: float  #: the writer's write call (s)
    unmount: float  #: from `fusermount3 -u` to the daemon's exit (s)
    writer_cpu: float
    daemon_cpu: float  #: its whole life (and fusermount3's)
    daemon_cpu_writing: float  #: up to the unmount
    log: str  #: what the daemon logged

    def describe(self, histories: list[ShardHistory]) -> str:
        writes = [h.writes for h in histories if h.writes is not None]
        described = f"{len(histories)} shards"
        if writes:
            described += f", writes per shard {Spread.of(writes, 0)}"
        return (
            f"write {self.write:.3f} s + unmount {self.unmount:.3f} s; "
            f"CPU: writer {self.writer_cpu:.1f} s, daemon {self.daemon_cpu:.1f} s; {described}"
        )


@dataclass
class Bench:
    work: Path
    data: np.ndarray
    data_file: Path  #: the data as .npy, for the writer processes
    mounts: Mounts
    chunk: int = CHUNK
    #: Compare all of the array after every write (else a few chunks).
    whole: bool = False
    seed: int = 0
    #: Per measure, one value per repetition (seconds unless noted).
    times: dict[str, list[float]] = field(default_factory=dict)
    #: Per case written through a mount, the shard files it left, per repetition.
    shards: dict[str, list[list[ShardHistory]]] = field(default_factory=dict)
    #: (appends, whole writes) from the daemon's log, None where it logs no such summary.
    logged: list[tuple[int, int] | None] = field(default_factory=list)
    stored: dict[str, list[int]] = field(default_factory=dict)
    #: Per case, the compressors zarr-python 3 reads in its array's metadata.
    compressors: dict[str, str] = field(default_factory=dict)
    #: Per case written through a mount, the requests of its run with `-o debug`.
    requests: dict[str, collections.Counter[str]] = field(default_factory=dict)
    profiled: str | None = None

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

    def check(self, name: str, array_dir: Path, sharded: bool) -> None:
        array = check_layout(array_dir, self.chunk, sharded)
        self.compressors[name] = ", ".join(map(str, array.compressors))
        if self.whole:
            check_whole(array, self.data)
        else:
            rng = np.random.default_rng(self.seed)
            self.seed += 1
            check_chunks(array, self.data, rng)
        self.stored.setdefault(name, []).append(
            sum(p.stat().st_size for p in stored_files(array_dir))
        )

    def mount_write(
        self, source: Path, writer: Writer, options: list[str], profile: Path | None = None
    ) -> MountWrite:
        """Mount `source` read-write, write the array through it as ARRAY, unmount, and
        make sure the daemon committed everything."""
        log_start = self.mounts.log.stat().st_size if self.mounts.log.exists() else 0
        mounted = self.mounts.start(source, *options)
        spy = None
        if profile is not None:
            fmt = "flamegraph" if profile.suffix == ".svg" else "raw"
            command = [str(Path(sys.executable).parent / "py-spy"), "record", "-o", str(profile)]
            command += ["-f", fmt, "-p", str(mounted.process.pid)]
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1)  # py-spy attaches
        try:
            result = timed_write(
                self.mounts.mountpoint / ARRAY,
                self.data_file,
                sharded=False,
                sync=False,
                chunk=self.chunk,
                writer=writer,
            )
            daemon_writing = process_cpu(mounted.process.pid)
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
        with open(self.mounts.log, errors="replace") as f:
            f.seek(log_start)
            log = f.read()
        if " ERROR " in log or "all buffered chunks committed" not in log:
            raise RuntimeError(f"the daemon did not commit everything:\n{log}")
        return MountWrite(
            result["write"], unmounted - unmounting, result["cpu"], daemon_cpu, daemon_writing, log
        )

    def record_mount(self, key: str, done: MountWrite, array_dir: Path) -> list[ShardHistory]:
        self.record(key, done.write + done.unmount)
        self.record(f"{key}-write", done.write)
        self.record(f"{key}-unmount", done.unmount)
        self.record(f"{key}-client-cpu", done.writer_cpu)
        self.record(f"{key}-daemon-cpu", done.daemon_cpu)
        self.record(f"{key}-daemon-cpu-writing", done.daemon_cpu_writing)
        histories = shard_histories(array_dir)
        self.shards.setdefault(key, []).append(histories)
        return histories

    def case_a(self, profile: Path | None = None) -> str:
        source = self.fresh("a-source.zarr")
        create_array(source, self.data.shape, sharded=True)
        os.sync()
        done = self.mount_write(source, ZARR3, [], profile)
        if profile is not None:
            return f"profile of the daemon written to {profile}"
        self.check("a", source / ARRAY, sharded=True)
        histories = self.record_mount("a", done, source / ARRAY)
        summary = COMMIT_SUMMARY.findall(done.log)
        self.logged.append((int(summary[-1][0]), int(summary[-1][1])) if summary else None)
        return done.describe(histories)

    def case_plain(self, key: str, sharded: bool, writer: Writer = ZARR3) -> str:
        path = self.fresh(f"{key}.zarr")
        if not writer.creates:
            create_array(path, self.data.shape, sharded, self.chunk, self.data.dtype)
        os.sync()
        result = timed_write(path / ARRAY, self.data_file, sharded, True, self.chunk, writer)
        self.check(key, path / ARRAY, sharded)
        self.record(key, result["write"])
        self.record(f"{key}-sync", result["write"] + result["sync"])
        self.record(f"{key}-client-cpu", result["cpu"])
        return f"write {result['write']:.3f} s, + os.sync() {result['sync']:.3f} s"

    def case_small_mount(self, key: str, writer: Writer, counting: bool = False) -> str:
        """(1) or (3) of --small-chunks; `counting`: untimed, with `-o debug`, counting
        the requests."""
        source = self.fresh(f"{key}-source.zarr")
        if writer.creates:  # (1): made through the v2 view, in a source with a root group
            source.mkdir(parents=True)
            (source / "zarr.json").write_text(ROOT_GROUP)
        else:
            create_array(source, self.data.shape, True, self.chunk, self.data.dtype)
        os.sync()
        options = SMALL_MOUNT_OPTIONS[key] + (["debug"] if counting else [])
        done = self.mount_write(source, writer, options)
        self.check(f"{key}-counting" if counting else key, source / ARRAY, sharded=True)
        if counting:
            self.requests[key] = collections.Counter(
                m.group(1).decode() for m in LOGGED_REQUEST.finditer(done.log.encode())
            )
            return f"{self.requests[key].total()} requests logged"
        return done.describe(self.record_mount(key, done, source / ARRAY))

    def repetition(self, rep: int, reps: int, cases: list[tuple[str, Callable[[], str]]]) -> None:
        """The cases, in an order rotated per repetition."""
        for key, case in rotated(cases, rep):
            print(f"  rep {rep + 1}/{reps} {key}: {case()}", flush=True)

    def default_cases(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("a", self.case_a),
            ("b", lambda: self.case_plain("b", sharded=False)),
            ("c", lambda: self.case_plain("c", sharded=True)),
        ]

    def small_cases(self, zarr2: Writer) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("1 v2-mount", lambda: self.case_small_mount("v2-mount", zarr2)),
            ("2 v2-plain", lambda: self.case_plain("v2-plain", sharded=False, writer=zarr2)),
            ("3 v3-mount", lambda: self.case_small_mount("v3-mount", ZARR3)),
            ("4 v3-plain", lambda: self.case_plain("v3-plain", sharded=False)),
        ]


# -- report ---------------------------------------------------------------------------


CASES = [
    ("a", "shardfs mount: write + unmount (committed, fsynced)"),
    ("a-write", "shardfs mount: the write call alone"),
    ("b", "plain local dir, unsharded (no sync)"),
    ("b-sync", "plain local dir, unsharded, + os.sync()"),
    ("c", "native sharded local dir (no sync)"),
    ("c-sync", "native sharded local dir, + os.sync()"),
]

#: (mount time, plain time, label, target): a target is (its name, the least ratio), or
#: (None, the ratio) for a comparison with a target that is checked on another ratio.
Ratio = tuple[str, str, str, tuple[str | None, float] | None]

RATIOS: list[Ratio] = [
    ("a", "b", "**a/b** (headline: mount incl. unmount / plain, no sync)", ("a/b", TARGET)),
    ("a", "b-sync", "a/b_sync (mount incl. unmount / plain + os.sync())", None),
    ("a-write", "b", "a_write/b (write call alone / plain, no sync)", None),
    ("a", "c", "a/c (mount incl. unmount / native sharded, no sync)", None),
    ("a", "c-sync", "a/c_sync (mount incl. unmount / native sharded + os.sync())", None),
]

SMALL_CASES = [
    ("v2-mount", "1 zarr-python 2.18, rw mount, v2 view, shard_new=8: write + unmount"),
    ("v2-mount-write", "1 the write call alone"),
    ("v2-mount-unmount", "1 the unmount (commits what is still buffered)"),
    ("v2-plain", "2 zarr-python 2.18, plain local dir (no sync)"),
    ("v2-plain-sync", "2 zarr-python 2.18, plain local dir + os.sync()"),
    ("v3-mount", "3 zarr-python 3, rw mount, v3 view of the sharded array: write + unmount"),
    ("v3-mount-write", "3 the write call alone"),
    ("v3-mount-unmount", "3 the unmount (commits what is still buffered)"),
    ("v3-plain", "4 zarr-python 3, plain local dir, unsharded (no sync)"),
    ("v3-plain-sync", "4 zarr-python 3, plain local dir, unsharded + os.sync()"),
]

SMALL_RATIOS: list[Ratio] = [
    (
        "v2-mount",
        "v2-plain-sync",
        "**2_sync/1** zarr-python 2.18: plain + os.sync() / v2 view mount (both committed)",
        ("2_sync/1", 0.3),
    ),
    ("v2-mount", "v2-plain", "2/1 zarr-python 2.18: plain, no sync / v2 view mount", (None, 0.3)),
    (
        "v3-mount",
        "v3-plain-sync",
        "**4_sync/3** zarr-python 3: plain + os.sync() / v3 view mount (both committed)",
        ("4_sync/3", 0.8),
    ),
    ("v3-mount", "v3-plain", "4/3 zarr-python 3: plain, no sync / v3 view mount", (None, 0.8)),
]


def ratio_rows(table: results.Table, t: dict[str, list[float]], ratios: list[Ratio]) -> None:
    for num, den, label, target in ratios:
        # Throughput ratio = inverse time ratio; the two ran close together in one repetition.
        values = paired(t[den], t[num])
        median = statistics.median(values)
        verdict = None
        if target is not None:
            name, least = target
            if name is None:
                verdict = f"{'above' if median >= least else 'below'} {least} (for reference)"
            else:
                verdict = f"target {name} >= {least}: {'met' if median >= least else 'NOT met'}"
        table.row(label, Spread.of(values), verdict)


def ratio_table(result: Result) -> results.Table:
    return result.table(
        "Ratios of throughput: median (range) of per-repetition ratios",
        ["ratio", "value", "target"],
    )


def report(bench: Bench, reps: int, nbytes: int, result: Result) -> None:
    mib = nbytes / (1 << 20)
    t = bench.times
    table = result.table(
        f"Each case's write, median (range) of {reps}, {mib:.0f} MiB uncompressed",
        ["case", "MiB/s", "s", "writer CPU s"],
        detail=True,
    )
    for key, label in CASES:
        cpu = t.get(f"{key}-client-cpu")
        table.row(
            f"{key} {label}",
            Spread.of([mib / s for s in t[key]], 0),
            round(statistics.median(t[key]), 3),
            round(statistics.median(cpu), 1) if cpu else None,
        )
    ratio_rows(ratio_table(result), t, RATIOS)


def small_report(bench: Bench, reps: int, result: Result) -> None:
    mib = bench.data.nbytes / (1 << 20)
    t = bench.times
    table = result.table(
        f"Each case's write, median (range) of {reps}; {mib:.0f} MiB uncompressed",
        [
            "case",
            "s",
            "MiB/s",
            "writer CPU s",
            "daemon CPU s: up to the unmount, in all",
            "stored MiB",
        ],
        detail=True,
    )
    for key, label in SMALL_CASES:
        rate = None if key.endswith("-unmount") else round(mib / statistics.median(t[key]))
        cells: list[str | float | Spread | None] = [Spread.of(t[key], 3), rate]
        if key in bench.stored:
            cells.append(round(statistics.median(t[f"{key}-client-cpu"]), 1))
            daemon = t.get(f"{key}-daemon-cpu")
            writing = t.get(f"{key}-daemon-cpu-writing")
            cells.append(
                f"{statistics.median(writing):.1f}, {statistics.median(daemon):.1f}"
                if daemon and writing
                else None
            )
            cells.append(round(statistics.median(bench.stored[key]) / (1 << 20), 1))
        else:
            cells += [None, None, None]
        table.row(label, *cells)
    ratio_rows(ratio_table(result), t, SMALL_RATIOS)


def requests_report(bench: Bench) -> list[str]:
    """Requests per chunk of the counting runs, by handler, most first."""
    chunks = math.prod(math.ceil(n / bench.chunk) for n in bench.data.shape)
    lines = []
    for key, logged in bench.requests.items():
        counts = logged.copy()
        # Not logged (no wrapper in the adapter): one release per create or open.
        counts["release"] = counts["create"] + counts["open"]
        counts["releasedir"] = counts["opendir"]
        per_chunk = ", ".join(
            f"{name} {n / chunks:.2f}" if n >= chunks / 200 else f"{name} {n} in all"
            for name, n in counts.most_common()
            if n
        )
        lines.append(f"{key}: {counts.total() / chunks:.2f} in all: {per_chunk}")
    return lines


def shard_report(bench: Bench, result: Result) -> None:
    table = result.table(
        "Shard files written through the mount (case a), per repetition, median (range) over "
        "shards",
        [
            "rep",
            "shards",
            "writes per shard (1 whole + appends)",
            "appends, whole writes (from the files; daemon log)",
            "size / compact size",
            "dead KiB per shard",
            "dead total MiB",
            "stored total MiB",
        ],
        detail=True,
    )
    for rep, histories in enumerate(bench.shards["a"]):
        writes = [h.writes for h in histories if h.writes is not None]
        unparsed = len(histories) - len(writes)
        ratio = [h.size / (h.live + h.index_size) for h in histories]
        dead = [h.dead / 1024 for h in histories]
        cell = str(Spread.of(writes, 0)) if writes else "-"
        if unparsed:
            cell += f" ({unparsed} shards not parsed)"
        counts = f"{sum(writes) - len(writes)}, {len(writes)}; "
        logged = bench.logged[rep]
        counts += "not logged" if logged is None else f"{logged[0]}, {logged[1]}"
        table.row(
            rep + 1,
            len(histories),
            cell,
            counts,
            Spread.of(ratio),
            Spread.of(dead, 0),
            round(sum(h.dead for h in histories) / (1 << 20), 1),
            round(sum(h.size for h in histories) / (1 << 20), 1),
        )
    result.note(
        "writes per shard are read from the shard files: each append ends in a new "
        "checksummed index, and the one before it ends where the append's first chunk starts; "
        "the daemon logs only totals (appends, whole writes) at unmount, if at all"
    )


def print_default(bench: Bench, reps: int, options: list[str]) -> Result:
    shape = bench.data.shape
    nbytes = bench.data.nbytes
    stored = {k: statistics.median(v) / (1 << 20) for k, v in bench.stored.items()}
    result = Result(
        "write_throughput",
        {"size_mib": round(nbytes / (1 << 20)), "reps": reps, "mount_options": options[:-1]},
    )
    result.note(
        f"array {shape} uint8 = {nbytes / (1 << 20):.0f} MiB, chunks {CHUNK}^3, shards "
        f"{SHARD}^3, zstd level 0; stored MiB (median): a {stored['a']:.1f} (shards, dead "
        f"bytes included), b {stored['b']:.1f} (chunk files), c {stored['c']:.1f} (shards); "
        f"mount options: {','.join(options[:-1]) or 'defaults'}"
    )
    report(bench, reps, nbytes, result)
    result.note(
        "headline a/b: (a) is timed up to the end of the unmount, the first moment its data "
        "is in the source, committed with fsync; (b) without sync, the way a writer of a "
        "plain directory works (its data still in the page cache). a/b_sync, with b's data "
        "flushed by os.sync(), is the like-for-like durability comparison."
    )
    a = bench.times
    result.note(
        f"case a, median: write call {statistics.median(a['a-write']):.3f} s, unmount "
        f"(commits still buffered) {statistics.median(a['a-unmount']):.3f} s; CPU: writer "
        f"{statistics.median(a['a-client-cpu']):.1f} s (b: "
        f"{statistics.median(a['b-client-cpu']):.1f} s), daemon "
        f"{statistics.median(a['a-daemon-cpu']):.1f} s"
    )
    shard_report(bench, result)
    if bench.profiled:
        result.note(bench.profiled)
    return result


def print_small(bench: Bench, reps: int, options: list[str]) -> Result:
    shape = bench.data.shape
    chunks = math.prod(math.ceil(n / bench.chunk) for n in shape)
    result = Result("write_throughput-small", {"reps": reps, "mount_options": options[:-1]})
    result.note(
        f"array {shape} {bench.data.dtype} = {bench.data.nbytes / (1 << 20):.0f} MiB in "
        f"{chunks} chunks of {bench.chunk}^3; compressors: (1), (2) zarr-python 2.18's "
        f"default, {bench.compressors.get('v2-plain')}; (3), (4) {COMPRESSOR}; (1) and (3) "
        f"stored in shards of {SHARD}^3; mount options: (1) "
        f"{','.join([*options[:-1], *SMALL_MOUNT_OPTIONS['v2-mount']])}, (3) "
        f"{','.join([*options[:-1], *SMALL_MOUNT_OPTIONS['v3-mount']])}"
    )
    small_report(bench, reps, result)
    result.note(
        "targets: plain time / mount time, the mount timed up to the end of its "
        "unmount (its data committed, fsynced, in the source), checked against the plain "
        "write with os.sync() (committed too: like for like); the plain write without sync "
        "(its data still in the page cache) is shown for reference. Stored MiB: chunk or "
        "shard files, dead bytes of appends included."
    )
    for key in SMALL_MOUNT_OPTIONS:
        writes = [h.writes for run in bench.shards[key] for h in run if h.writes is not None]
        shards = statistics.median(len(run) for run in bench.shards[key])
        result.note(
            f"{key}: {shards:.0f} shards, writes per shard (1 whole + appends) "
            f"{Spread.of(writes, 0) if writes else '-'}; "
            f"written and compared whole with zarr-python 3 from the source after every run"
        )
    result.note(
        f"FUSE requests per chunk ({chunks} chunks), from one more, untimed run of each mount "
        "with -o debug (release and releasedir are not logged: counted as one per create or "
        "open and per opendir; forget is not counted):"
    )
    for line in requests_report(bench):
        result.note(line)
    return result


# -- main -----------------------------------------------------------------------------


#: What a run may leave in its work directory.
WRITTEN = (
    "a-source.zarr",
    "b.zarr",
    "c.zarr",
    *(f"{key}-source.zarr" for key in SMALL_MOUNT_OPTIONS),
    "v2-plain.zarr",
    "v3-plain.zarr",
    "mnt",
    "mount.log",
    "data.npy",
)


def clean_up(work: Path, created: bool, mountpoint: Path, keep: bool) -> None:
    """Remove what this run wrote (never while something is mounted in it)."""
    if keep:
        print(f"kept {work}")
        return
    if mount_type(str(mountpoint)) is not None:
        print(f"{mountpoint} is still mounted: {work} left in place", file=sys.stderr)
        return
    for name in WRITTEN:
        path = work / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if created:
        with contextlib.suppress(OSError):
            work.rmdir()


def measure_default(args: argparse.Namespace, work: Path, mounts: Mounts) -> Bench:
    shape = shape_for(args.size_mib)
    nbytes = math.prod(shape)
    print(f"generating {shape} uint8 ({nbytes / (1 << 20):.0f} MiB) ...", flush=True)
    data = generate(shape)
    data_file = work / "data.npy"
    np.save(data_file, data)
    bench = Bench(work, data, data_file, mounts)
    print(
        f"array {shape} uint8, chunks {CHUNK}^3, shards {SHARD}^3 "
        f"({math.prod(math.ceil(n / SHARD) for n in shape)} shards, "
        f"{math.prod(math.ceil(n / CHUNK) for n in shape)} chunks), {COMPRESSOR}; "
        f"mount options: {','.join(mounts.options)}",
        flush=True,
    )
    for rep in range(args.reps):
        bench.repetition(rep, args.reps, bench.default_cases())
    if args.profile is not None:
        bench.profiled = bench.case_a(profile=args.profile.resolve())
    return bench


def measure_small(args: argparse.Namespace, work: Path, mounts: Mounts) -> Bench:
    zarr2 = Writer(str(ensure_zarr2().python), creates=True)
    print(f"generating {SMALL_SHAPE} uint16 ...", flush=True)
    data = generate_small(SMALL_SHAPE)
    data_file = work / "data.npy"
    np.save(data_file, data)
    bench = Bench(work, data, data_file, mounts, chunk=SMALL_CHUNK, whole=True)
    for rep in range(args.reps):
        bench.repetition(rep, args.reps, bench.small_cases(zarr2))
    for key, writer in (("v2-mount", zarr2), ("v3-mount", ZARR3)):
        counted = bench.case_small_mount(key, writer, counting=True)
        print(f"  {key} once more with -o debug (untimed): {counted}", flush=True)
    return bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--small-chunks",
        action="store_true",
        help="issue 21's case of many small chunks: zarr-python 2.18 and 3 through "
        "read-write mounts (v2 and v3 view) and into plain directories (see above)",
    )
    parser.add_argument(
        "--size-mib", type=int, help="uncompressed size (MiB; default 512; not --small-chunks)"
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument(
        "--mount-options",
        default="",
        help="more options for the mounts (case a; with --small-chunks (1) and (3)), "
        "e.g. write_buffer=1G,flush_interval=30",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the arrays are written (default: bench-data/write, with --small-chunks "
        "bench-data/write-small, git-ignored; not bench-data itself, which holds "
        "read_throughput's data set)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the written arrays")
    parser.add_argument(
        "--results",
        help="where the result goes (default benchmarks/results/write_throughput.json, "
        "with --small-chunks write_throughput-small.json; 'none': nowhere)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="after the measured repetitions, run case a once more (untimed) with py-spy "
        "recording the daemon into this file (.svg: flame graph, else raw collapsed stacks)",
    )
    args = parser.parse_args()
    if args.small_chunks and (args.size_mib is not None or args.profile is not None):
        parser.error("--size-mib and --profile do not go with --small-chunks")
    if args.size_mib is None:
        args.size_mib = 512
    if args.size_mib < 1 or args.reps < 1:
        parser.error("--size-mib and --reps must be positive")
    if os.geteuid() != 0:
        parser.error("needs root (FUSE mounts, os.sync)")
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too

    if args.workdir is None:
        args.workdir = ROOT / "bench-data" / ("write-small" if args.small_chunks else "write")
    work = args.workdir.resolve()
    if mount_type(str(work / "mnt")) is not None:
        parser.error(f"{work / 'mnt'} is mounted already (left by another run?)")
    created = not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "mount.log"
    log.write_text("")
    options = [o for o in args.mount_options.split(",") if o.strip()] + [f"log={log}"]
    mounts = Mounts(work / "mnt", log, options, interrupts)
    measure, show = (
        (measure_small, print_small) if args.small_chunks else (measure_default, print_default)
    )
    try:
        bench = measure(args, work, mounts)
    finally:
        try:
            mounts.stop()
        finally:
            clean_up(work, created, mounts.mountpoint, args.keep)
    result = show(bench, args.reps, options)
    result.write(
        results.results_path(args.results or str(results.RESULTS / f"{result.workload}.json"))
    )
    return 0


if __name__ == "__main__":
    run(main)
