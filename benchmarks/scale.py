"""Scale: a mount of a 1,000,000-chunk array against the same tree as plain files.

Why: a reader walks a mounted array as it walks any directory tree (`find`,
`du`, `ls -l`, `tar`), and the daemon must serve a million chunk files without
its memory growing with them. This script measures, in one run and on one
machine, a sharded array written by tensorstore through a `-o ro` mount, and a
plain copy of its view (one file per chunk) on local disk. The array has one
of two layouts:

  2d     (the default) uint16, inner chunks 8 x 8, shards of 32 x 32 inner
         chunks, zstd; `--rows` x 10,000 inner chunks, so every chunk
         directory `c/<i>` of the view holds 10,000 files.
  dandi  the DANDI layout of the design notes: uint8, inner chunks 64^3,
         shards of 32^3 inner chunks (a 512 KiB index each), zstd, keys
         c/i/j/k; `--rows` x 100 x 100 inner chunks, so the view has
         `--rows` x 100 chunk directories `c/<i>/<j>` of 100 files each
         (1,000,000 chunks by default). Every chunk holds one value
         (1 + (i + 3j + k) % 251), so zstd packs its 256 KiB into 26 bytes:
         the 262 GB array takes 64 shards of up to 1.3 MiB, and the plain
         copy holds the view's files, compressed as the mount shows them.

The dandi layout has a third side, the FLOOR: `benchmarks.floor serve --noopen --tree
ROWS,100,100 --under data/c --size 26`, a pyfuse3 + trio daemon whose handlers
do nothing, serving the same chunk tree (`data/c/<i>/<j>/<k>`, files of the
plain chunks' size; no zarr.json) with the same 300 s timeouts and no open or
opendir requests, as the kernel-served `ro` mount. Why: part of the gap between
the mount and the plain tree may be any pyfuse3 mount's (the kernel making an
inode per READDIRPLUS entry, a FUSE file's open and read), which no shardfs
change can close; floor/plain shows that part, mount/floor what shardfs adds.

The steps, on every side:

  start-up  `shardfs mount SOURCE MOUNTPOINT -o ro` until the root answers (mount); the
            floor's start until its root answers (floor, once, not COLD)
  find      `find DIR -type f | wc -l`
  du        `du -sb DIR`
  ls        `ls -l` of one chunk directory (`DIR/data/c/0`, dandi `DIR/data/c/0/0`)
  read      `tar -cf - -C DIR . | wc -c` (every byte of every file)

each COLD (page cache, dentries and inodes dropped) and WARM (the same command
again at once). Per repetition each side runs all steps in this order, the
side that goes first rotating; the mount side uses one daemon for find to
read (started by the warm start-up), whose resident memory is sampled after
every step, so its peak (VmHWM) covers the whole walk and a full read; the
floor side one floor daemon. COLD drops the kernel's caches only: the daemon
keeps what earlier steps loaded, as a long-running mount does. The table shows
medians; each ratio (mount time / plain time; with the floor also floor / plain
and mount / floor) is the median of per-repetition ratios, with its range.
Needs root (drop_caches, FUSE). The targets checked are the issues', on mount /
plain: 2d find and du warm <= 3x; dandi (issue 21) find warm <= 1.5x and cold
<= 4x, du and tar warm <= 2x; both start-up < 1 s and a daemon peak below 256
MiB. A line after the table says what the floor reaches against plain at the
same targets, how long it took to start (SLOW above 3 s) and its peak memory.

    .venv/bin/python -m benchmarks.scale [--layout 2d|dandi] [--rows 100] [--data DIR]
        [--repeat 3] [--step-timeout 600] [--results PATH]

The result is `scale-2d` or `scale-dandi`.

Without --data, the data lives in a temporary directory that is removed at the
end; with it, the data is kept and reused by the next run with the same options.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorstore as ts
import zarr

from benchmarks.harness import results, runs
from benchmarks.harness.caches import drop_caches
from benchmarks.harness.daemons import Child, DataDir, DetachedMount, layout
from benchmarks.harness.data import tree_size
from benchmarks.harness.data.dandi import DANDI_CHUNK, DANDI_SHARD, DANDI_SIDE, dandi_value
from benchmarks.harness.machine import code_digest, revision
from benchmarks.harness.procs import cpu, memory
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, rotated, run
from shardfs.storage import LocalStorage
from shardfs.view import Namespace

#: The 2d layout: inner chunk edge (uint16), inner chunks per shard along each axis, and
#: chunk columns: each chunk directory c/<row> of the view holds COLUMNS files.
CHUNK = 8
SHARD = 32
COLUMNS = 10_000
ARRAY = "data"
#: The metadata documents of the view (root group, array), besides the chunk files.
DOCUMENTS = 2
#: Bumped whenever the generated data changes, so an old data set is not reused.
GENERATOR = 1
STARTUP_TARGET = 1.0  #: seconds
RSS_TARGET = 256  #: MiB, the daemon's peak
FLOOR = [sys.executable, "-m", "benchmarks.floor", "serve"]
FLOOR_SLOW = 3.0  #: seconds: a floor start-up above this is called out
#: The sides a run measures, in this order (the floor only where the layout has one).
SIDES = ("mount", "floor", "plain")
MODES = ("cold", "warm")


# -- the data set ---------------------------------------------------------------------


def write_source(source: Path, rows: int) -> None:  # the 2d layout
    """The sharded array, written by tensorstore (not shardfs) one row of shards at a
    time: a ramp that zstd packs small, never the fill value, so every chunk is stored."""
    zarr.open_group(source, mode="w")  # the root group, so the view is a hierarchy
    shape = (rows * CHUNK, COLUMNS * CHUNK)
    bytes_codec = {"name": "bytes", "configuration": {"endian": "little"}}
    sharding = {
        "chunk_shape": [CHUNK, CHUNK],
        "codecs": [bytes_codec, {"name": "zstd", "configuration": {"level": 3}}],
        "index_codecs": [bytes_codec, {"name": "crc32c"}],
        "index_location": "end",
    }
    array = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(source / ARRAY)},
            "metadata": {
                "shape": list(shape),
                "data_type": "uint16",
                "chunk_grid": {
                    "name": "regular",
                    "configuration": {"chunk_shape": [CHUNK * SHARD, CHUNK * SHARD]},
                },
                "chunk_key_encoding": {"name": "default"},
                "fill_value": 0,
                "codecs": [{"name": "sharding_indexed", "configuration": sharding}],
            },
            "create": True,
        }
    ).result()
    step = CHUNK * SHARD
    x = np.arange(shape[1], dtype=np.uint32)
    for start in range(0, shape[0], step):
        y = np.arange(start, min(start + step, shape[0]), dtype=np.uint32)
        ramp = (1 + (y[:, None] * 7 + x[None, :]) % 4093).astype(np.uint16)
        array[start : start + len(y)].write(ramp).result()


def check_layout(source: Path, array: zarr.Array, expected: dict[str, object]) -> None:
    """The array is laid out as `expected` (shape, chunks, shards, dtype, compressors), as
    zarr-python sees it: data written by an earlier run is checked before it is reused."""
    found = {
        "shape": array.shape,
        "chunks": array.chunks,
        "shards": array.shards,
        "dtype": array.dtype,
        "compressors": tuple(
            type(c).__name__.removesuffix("Codec").lower() for c in array.compressors
        ),
    }
    if found != expected:
        raise RuntimeError(f"{source}: zarr-python sees {found}, expected {expected}")


def check_source(source: Path, rows: int) -> None:  # the 2d layout
    """zarr-python must read it as the array asked for, with the values written."""
    array = zarr.open_array(source / ARRAY, mode="r")
    expected = {
        "shape": (rows * CHUNK, COLUMNS * CHUNK),
        "chunks": (CHUNK, CHUNK),
        "shards": (CHUNK * SHARD, CHUNK * SHARD),
        "dtype": np.dtype("uint16"),
        "compressors": ("zstd",),
    }
    check_layout(source, array, expected)
    y = np.arange(array.shape[0] - 3, array.shape[0], dtype=np.uint32)
    x = np.arange(array.shape[1] - 300, array.shape[1], dtype=np.uint32)
    ramp = (1 + (y[:, None] * 7 + x[None, :]) % 4093).astype(np.uint16)
    if not np.array_equal(array[-3:, -300:], ramp):
        raise RuntimeError(f"{source}: zarr-python reads other values than were written")


def dandi_array(source: Path, rows: int) -> ts.TensorStore:
    """The DANDI-layout array below `source`, created by tensorstore."""
    zarr.open_group(source, mode="w")  # the root group, so the view is a hierarchy
    bytes_codec = {"name": "bytes", "configuration": {"endian": "little"}}
    sharding = {
        "chunk_shape": [DANDI_CHUNK] * 3,
        "codecs": [bytes_codec, {"name": "zstd", "configuration": {"level": 3}}],
        "index_codecs": [bytes_codec, {"name": "crc32c"}],
        "index_location": "end",
    }
    shard = DANDI_CHUNK * DANDI_SHARD
    side = DANDI_SIDE * DANDI_CHUNK
    return ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(source / ARRAY)},
            "metadata": {
                "shape": [rows * DANDI_CHUNK, side, side],
                "data_type": "uint8",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shard] * 3}},
                "chunk_key_encoding": {"name": "default"},
                "fill_value": 0,
                "codecs": [{"name": "sharding_indexed", "configuration": sharding}],
            },
            "create": True,
        }
    ).result()


def write_dandi(source: Path, rows: int) -> None:
    """The DANDI-layout array, written by tensorstore one layer of chunks (64 planes) and
    one shard column at a time (256 MiB), a few writes in flight so both cores encode."""
    array = dandi_array(source, rows)
    c, s = DANDI_CHUNK, DANDI_SHARD
    started = time.perf_counter()
    for i in range(rows):
        writes: list[ts.Future] = []
        for j0 in range(0, DANDI_SIDE, s):
            for k0 in range(0, DANDI_SIDE, s):
                j = np.arange(j0, min(j0 + s, DANDI_SIDE))
                k = np.arange(k0, min(k0 + s, DANDI_SIDE))
                plane = np.repeat(np.repeat(dandi_value(i, j[:, None], k[None, :]), c, 0), c, 1)
                block = np.empty((c, *plane.shape), dtype=np.uint8)
                block[:] = plane
                region = array[
                    i * c : (i + 1) * c, j0 * c : (j0 + len(j)) * c, k0 * c : (k0 + len(k)) * c
                ]
                writes.append(region.write(block))
                while len(writes) > 2:
                    writes.pop(0).result()
        for write in writes:
            write.result()
        if (i + 1) % 10 == 0 or i + 1 == rows:
            elapsed = time.perf_counter() - started
            print(f"  {i + 1}/{rows} chunk layers, {elapsed:.0f} s", flush=True)


def check_dandi(source: Path, rows: int) -> None:
    """zarr-python must read it as the array asked for, with the values written."""
    array = zarr.open_array(source / ARRAY, mode="r")
    side = DANDI_SIDE * DANDI_CHUNK
    expected = {
        "shape": (rows * DANDI_CHUNK, side, side),
        "chunks": (DANDI_CHUNK,) * 3,
        "shards": (DANDI_CHUNK * DANDI_SHARD,) * 3,
        "dtype": np.dtype("uint8"),
        "compressors": ("zstd",),
    }
    check_layout(source, array, expected)
    c = DANDI_CHUNK
    for i, j, k in ((0, 0, 0), (rows // 2, 37, 70), (rows - 1, DANDI_SIDE - 1, DANDI_SIDE - 1)):
        chunk = array[i * c : (i + 1) * c, j * c : (j + 1) * c, k * c : (k + 1) * c]
        if not (chunk == dandi_value(i, j, k)).all():
            raise RuntimeError(f"{source}: zarr-python reads other values in chunk {i, j, k}")


@dataclass(frozen=True)
class Layout:
    """What differs between the layouts: the array, its chunk directories, the `ls -l`
    directory, and the issue's targets (mount time / plain time) per (step, mode)."""

    name: str
    #: inner chunks along the axes after the first (the first has --rows)
    sides: tuple[int, ...]
    #: below the array: the chunk directory `ls -l` lists
    ls_dir: str
    targets: dict[tuple[str, str], float]
    write: Callable[[Path, int], None]
    check: Callable[[Path, int], None]
    #: the description of the array
    describe: Callable[[int], str]
    #: whether a third side, the floor (benchmarks.floor serving the chunk tree's shape), is measured
    floor: bool = False

    def grid(self, rows: int) -> tuple[int, ...]:
        return (rows, *self.sides)

    def chunks(self, rows: int) -> int:
        return int(np.prod(self.grid(rows)))

    def per_dir(self) -> int:
        """Chunk files per chunk directory."""
        return self.sides[-1]

    def chunk_dirs(self, rows: int) -> list[str]:
        """Every directory below `c` of the array: `i`, and for 3-D also `i/j`."""
        if len(self.sides) == 1:
            return [str(i) for i in range(rows)]
        return [
            *(str(i) for i in range(rows)),
            *(f"{i}/{j}" for i in range(rows) for j in range(self.sides[0])),
        ]


LAYOUTS = {
    "2d": Layout(
        "2d",
        (COLUMNS,),
        "c/0",
        {("find", "warm"): 3.0, ("du", "warm"): 3.0},
        write_source,
        check_source,
        lambda rows: (
            f"array {rows * CHUNK} x {COLUMNS * CHUNK} uint16, chunks {CHUNK}^2, shards "
            f"{CHUNK * SHARD}^2, zstd, written by tensorstore: {rows * COLUMNS} chunks in "
            f"{rows} directories of {COLUMNS}"
        ),
    ),
    "dandi": Layout(
        "dandi",
        (DANDI_SIDE, DANDI_SIDE),
        "c/0/0",
        {("find", "warm"): 1.5, ("find", "cold"): 4.0, ("du", "warm"): 2.0, ("read", "warm"): 2.0},
        write_dandi,
        check_dandi,
        lambda rows: (
            f"DANDI layout: array {rows * DANDI_CHUNK} x {DANDI_SIDE * DANDI_CHUNK} x "
            f"{DANDI_SIDE * DANDI_CHUNK} uint8, chunks {DANDI_CHUNK}^3 (each one value), "
            f"shards of {DANDI_SHARD}^3 chunks, zstd, written by tensorstore: "
            f"{rows * DANDI_SIDE**2} chunks in {rows * DANDI_SIDE} directories of {DANDI_SIDE}"
        ),
        floor=True,
    ),
}


def write_files(directory: Path, files: list[tuple[str, bytes]]) -> None:
    """Create the files of one chunk directory (in a worker thread: the syscalls dominate)."""
    for name, data in files:
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def materialize(source: Path, copy: Path) -> int:
    """Write every file of the unsharded view of `source` below `copy`; returns the number
    of files. Chunk files come in bulk (`Namespace.listing`: per shard, their names and
    extents), so each shard's span is read once per directory and no node is made per
    chunk; threads create the files."""
    namespace = Namespace(LocalStorage(source))
    files = 0
    pending = [namespace.root()]
    with ThreadPoolExecutor(4) as pool:  # file creation releases the GIL
        writes: list[Future[None]] = []
        while pending:
            directory = pending.pop()
            target = copy / directory.path
            target.mkdir(parents=True, exist_ok=True)
            listing = namespace.listing(directory)
            for _, node, attr in listing.entries:
                if attr.is_dir:
                    pending.append(node)
                else:
                    reader = namespace.open(node)
                    (copy / node.path).write_bytes(reader.read(0, reader.size))
                    files += 1
            chunks = []
            for run in listing.runs:
                names = run.names()
                for i, (key, _) in enumerate(run.shards):
                    rows = np.flatnonzero(run.shard == i)
                    extents = run.extents[rows]
                    start = int(extents[:, 0].min())
                    length = int(extents.sum(axis=1).max()) - start
                    span = namespace.storage.read(key, start, length)
                    for row, (offset, nbytes) in zip(rows.tolist(), extents.tolist(), strict=True):
                        chunks.append((names[row], span[offset - start : offset - start + nbytes]))
            if chunks:
                writes.append(pool.submit(write_files, target, chunks))
                files += len(chunks)
            while len(writes) > 8:  # bounded memory: a few directories in flight
                writes.pop(0).result()
        for write in writes:
            write.result()
    return files


@dataclass
class Dataset(DataDir):
    rows: int
    layout: Layout = LAYOUTS["2d"]

    @property
    def chunks(self) -> int:
        return self.layout.chunks(self.rows)

    @property
    def params(self) -> dict[str, object]:
        if self.layout.name == "2d":  # as before the layouts: its data sets stay usable
            return layout([self.rows, COLUMNS], CHUNK, SHARD, GENERATOR, "tensorstore")
        grid = list(self.layout.grid(self.rows))
        dandi = layout(grid, DANDI_CHUNK, DANDI_SHARD, GENERATOR, "tensorstore")
        return {"layout": self.layout.name, **dandi}

    def ready(self) -> bool:
        return super().ready() and all(
            (d / ARRAY / "zarr.json").is_file() for d in (self.source, self.plain)
        )

    def build(self) -> None:
        self.clear()
        grid = " x ".join(map(str, self.layout.grid(self.rows)))
        with runs.step(f"writing {self.source} with tensorstore, {grid} chunks"):
            self.layout.write(self.source, self.rows)
        self.layout.check(self.source, self.rows)
        with runs.step(f"materializing the view as {self.plain}"):
            files = materialize(self.source, self.plain)
            print(f"  {files} files", flush=True)
        if files != self.chunks + DOCUMENTS:
            raise RuntimeError(f"the copy has {files} files, expected {self.chunks + DOCUMENTS}")
        self.made()

    def chunk_bytes(self) -> int:
        """The size of the plain copy's first chunk file (in the DANDI layout, every one's)."""
        first = Path(*["0"] * len(self.layout.grid(self.rows)))
        return (self.plain / ARRAY / "c" / first).stat().st_size

    def document_bytes(self) -> int:
        """The size of the plain copy's metadata documents (the zarr.json files)."""
        return sum((self.plain / p / "zarr.json").stat().st_size for p in (".", ARRAY))

    def directories(self, top: Path) -> list[Path]:
        """Every directory of the view below `top`, whose sizes `du -sb` adds to the files'."""
        return [
            top,
            top / ARRAY,
            top / ARRAY / "c",
            *(top / ARRAY / "c" / d for d in self.layout.chunk_dirs(self.rows)),
        ]


# -- the daemons ----------------------------------------------------------------------


class Daemon(DetachedMount):
    """The mount side's daemon, detached as a user starts it."""

    def status(self, field_name: str) -> int:
        """A memory figure of the daemon (see `memory`)."""
        assert self.pid is not None
        return memory(self.pid, field_name)


class FloorDaemon(Child):
    """At most one floor at a time: `benchmarks.floor serve --noopen` serving the view's
    chunk tree in its shape (`data/c/<i>/<j>/<k>`, files of the plain chunks' size)."""

    def __init__(self, dataset: Dataset, interrupts: Interrupts) -> None:
        super().__init__(interrupts, dataset.data / "mnt-floor", dataset.data / "floor.log")
        self.dataset = dataset

    def command(self) -> list[str]:
        grid = ",".join(map(str, self.dataset.layout.grid(self.dataset.rows)))
        size = str(self.dataset.chunk_bytes())
        tree = ["--tree", grid, "--under", f"{ARRAY}/c", "--size", size]
        return [*FLOOR, str(self.mountpoint), "--noopen", *tree]

    def start(self) -> float:  # type: ignore[override]
        """Serve; the seconds from starting the floor until its root answers."""
        return super().start(self.command())


# -- the steps ------------------------------------------------------------------------


def run_shell(script: str, timeout: float) -> tuple[float, str]:
    """(seconds, stdout) of a `bash -o pipefail` pipeline, run in its own process group
    so that a timeout or an interrupt ends all of it, and nothing keeps the mount busy."""
    started = time.perf_counter()
    process = subprocess.Popen(
        ["bash", "-o", "pipefail", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)  # the group this call started
        process.wait()
        raise
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"`{script}` failed ({process.returncode}): {err.strip()}")
    return elapsed, out.strip()


@dataclass
class Step:
    key: str
    label: str
    #: the pipeline, with {dir} for the top of the tree
    script: str
    #: per side (SIDES), per mode: seconds per repetition
    times: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {side: {m: [] for m in MODES} for side in SIDES}
    )
    #: per side: what the command printed (the same every time)
    output: dict[str, str] = field(default_factory=dict)
    #: per daemon side (mount, floor): its CPU seconds in the COLD run, per repetition
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"mount": [], "floor": []})


def steps(layout: Layout) -> list[Step]:
    """The walks, in the order each side runs them; labels are table cells."""
    ls = f"{ARRAY}/{layout.ls_dir}"
    return [
        Step("find", "`find DIR -type f | wc -l`", "find {dir} -type f | wc -l"),
        Step("du", "`du -sb DIR`", "du -sb {dir} | cut -f1"),
        Step("ls", f"`ls -l DIR/{ls} | wc -l`", f"ls -l {{dir}}/{ls} | wc -l"),
        Step("read", "`tar -cf - -C DIR . | wc -c`", "tar -cf - -C {dir} . | wc -c"),
    ]


@dataclass
class Run:
    dataset: Dataset
    daemon: Daemon
    floor: FloorDaemon
    timeout: float
    steps: list[Step] = field(default_factory=list)
    startup: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    #: per repetition: VmRSS (KiB) after the start and after each step, and VmHWM ("peak")
    rss: list[dict[str, int]] = field(default_factory=list)
    #: per side: the bytes `du -sb` counted for the files alone (its total less directories)
    file_bytes: dict[str, int] = field(default_factory=dict)
    #: the floor's, per repetition: seconds until its root answered, and VmHWM (KiB)
    floor_startup: list[float] = field(default_factory=list)
    floor_peak: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.steps = self.steps or steps(self.dataset.layout)
        self.sides = [s for s in SIDES if s != "floor" or self.dataset.layout.floor]

    def side(self, side: str, rep: int, repeat: int) -> None:
        """Every step, COLD then WARM, on one side."""
        tops = {"mount": self.dataset.mountpoint, "floor": self.floor.mountpoint}
        top = tops.get(side, self.dataset.plain)
        pids: dict[str, Callable[[], int | None]] = {
            "mount": lambda: self.daemon.pid,
            "floor": lambda: self.floor.pid,
        }
        tag = f"  rep {rep + 1}/{repeat} {side}"
        rss: dict[str, int] = {}
        if side == "mount":
            for mode in MODES:
                if mode == "cold":
                    self.daemon.stop()
                    drop_caches()
                self.startup[mode].append(self.daemon.start())
                print(f"{tag} start-up {mode}: {self.startup[mode][-1]:8.2f} s", flush=True)
            rss["start"] = self.daemon.status("VmRSS")
        elif side == "floor":  # it reads nothing: one start-up, whatever the caches hold
            self.floor_startup.append(self.floor.start())
            print(f"{tag} start-up: {self.floor_startup[-1]:8.2f} s", flush=True)
        for step in self.steps:
            for mode in MODES:
                if mode == "cold":
                    drop_caches()
                pid = pids[side]() if side in pids and mode == "cold" else None
                before = cpu(pid) if pid is not None else 0.0
                elapsed, out = run_shell(step.script.format(dir=top), self.timeout)
                if pid is not None:
                    step.cpu[side].append(cpu(pid) - before)
                if step.output.setdefault(side, out) != out:
                    raise RuntimeError(
                        f"{step.key} on {top} printed {out}, before {step.output[side]}"
                    )
                step.times[side][mode].append(elapsed)
                print(f"{tag} {step.key:<8} {mode}: {elapsed:8.2f} s  ({out})", flush=True)
            if step.key == "du":
                dirs = sum(d.stat().st_size for d in self.dataset.directories(top))
                self.file_bytes[side] = int(step.output[side]) - dirs
            if side == "mount":
                rss[step.key] = self.daemon.status("VmRSS")
        if side == "mount":
            rss["peak"] = self.daemon.status("VmHWM")
            self.rss.append(rss)
            self.daemon.stop()
        elif side == "floor":
            assert self.floor.process is not None
            self.floor_peak.append(memory(self.floor.process.pid, "VmHWM"))
            self.floor.stop()

    def measure(self, repeat: int) -> None:
        sides = self.sides
        for rep in range(repeat):
            for side in rotated(sides, rep):
                self.side(side, rep, repeat)
            if rep == 0:  # every later run must print the same: a wrong tree fails early
                self.check()

    def check(self) -> None:
        """The mount and the plain copy must show the same tree: the right file counts, the
        same file bytes, the same tar stream; the floor the same chunk files, without the
        metadata documents (so the same bytes less theirs)."""
        out = {step.key: step.output for step in self.steps}
        for side in self.sides:
            files = self.dataset.chunks + (DOCUMENTS if side != "floor" else 0)
            if int(out["find"][side]) != files:
                raise RuntimeError(
                    f"find on the {side} side counted {out['find'][side]}, not {files}"
                )
            if int(out["ls"][side]) != self.dataset.layout.per_dir() + 1:  # and "total"
                raise RuntimeError(f"ls -l on the {side} side printed {out['ls'][side]} lines")
        if out["read"]["mount"] != out["read"]["plain"]:
            raise RuntimeError(f"tar streams differ in length: {out['read']}")
        if self.file_bytes["mount"] != self.file_bytes["plain"]:
            raise RuntimeError(f"du of the files differs: {self.file_bytes} ({out['du']} in all)")
        if "floor" in self.sides:
            chunk_bytes = self.file_bytes["plain"] - self.dataset.document_bytes()
            if self.file_bytes["floor"] != chunk_bytes:
                raise RuntimeError(
                    f"du of the floor's files: {self.file_bytes['floor']}, of the plain "
                    f"chunk files: {chunk_bytes}"
                )


# -- report ---------------------------------------------------------------------------


def ratios(step: Step, mode: str, pair: tuple[str, str]) -> list[float]:
    """Side a's time / side b's of `pair` (a, b), per repetition (the sides ran close
    together, so a noisy neighbour slows both)."""
    a, b = pair
    return paired(step.times[a][mode], step.times[b][mode])


def ratio_cell(ratio_list: list[float], target: float | None) -> str:
    """The median ratio, its range, and the verdict against `target`."""
    cell = str(Spread.of(ratio_list, 2, "x"))
    if target is not None:
        ratio = statistics.median(ratio_list)
        cell += f", target <= {target:g}x: {'ok' if ratio <= target else 'ABOVE'}"
    return cell


def report(run: Run, repeat: int, result: Result) -> None:
    targets = run.dataset.layout.targets
    sides = run.sides
    pairs = [("mount", "plain")]  # the issues' ratios, with their targets
    if "floor" in sides:
        pairs += [("floor", "plain"), ("mount", "floor")]
    columns = [(side, mode) for mode in MODES for side in sides]
    heads = [f"{side} {mode} s" for side, mode in columns]
    heads += [f"{mode} {a}/{b}" for a, b in pairs for mode in MODES]
    table = result.table(
        f"Each step on each side, median s of {repeat}; ratios per repetition, median (range)",
        ["step", *heads],
    )

    def row(label: str, times: dict[tuple[str, str], float], cells: dict[str, str]) -> None:
        """A table row: `times` by (side, mode), `cells` by ratio column (blank if absent)."""
        figures: list[str | float | None] = [times.get(column) for column in columns]
        figures += [cells.get(f"{mode} {a}/{b}") for a, b in pairs for mode in MODES]
        table.row(label, *figures)

    startup = {mode: statistics.median(run.startup[mode]) for mode in MODES}
    verdicts = {
        f"{mode} mount/plain": f"target < {STARTUP_TARGET:g} s: "
        + ("ok" if t < STARTUP_TARGET else "ABOVE")
        for mode, t in startup.items()
    }
    row("mount start-up", {("mount", m): round(t, 2) for m, t in startup.items()}, verdicts)
    if run.floor_startup:  # it starts once, on whatever the caches hold
        row(
            "floor start-up",
            {("floor", "warm"): round(statistics.median(run.floor_startup), 2)},
            {},
        )
    for step in run.steps:
        medians = {
            (side, mode): round(statistics.median(step.times[side][mode]), 2)
            for side, mode in columns
        }
        cells = {}
        for a, b in pairs:
            for mode in MODES:
                target = targets.get((step.key, mode)) if (a, b) == ("mount", "plain") else None
                cells[f"{mode} {a}/{b}"] = ratio_cell(ratios(step, mode, (a, b)), target)
        targeted = any(key == step.key for key, _ in targets)
        row(f"**{step.label}**" if targeted else step.label, medians, cells)
    table = result.table(
        "The daemon's resident memory after each step, MiB",
        ["daemon RSS, MiB", *(f"rep {i + 1}" for i in range(repeat))],
        detail=True,
    )
    for what in ("start", *(step.key for step in run.steps)):
        table.row(f"after {what} (VmRSS)", *(round(rss[what] / 1024) for rss in run.rss))
    table.row("**peak** (VmHWM)", *(round(rss["peak"] / 1024) for rss in run.rss))
    if "floor" in sides:
        table = result.table(
            "The daemons' CPU in each COLD step (user + system), median ms of "
            f"{repeat}; mount/floor per repetition, median (range)",
            ["step", "mount ms", "floor ms", "mount/floor"],
        )
        for step in run.steps:
            mount, floor = step.cpu["mount"], step.cpu["floor"]
            if mount and floor:
                per_rep = [m / f for m, f in zip(mount, floor, strict=False) if f]
                table.row(
                    step.label,
                    round(statistics.median(mount) * 1000),
                    round(statistics.median(floor) * 1000),
                    ratio_cell(per_rep, None) if per_rep else "",  # (below a clock tick)
                )
    peak = max(rss["peak"] for rss in run.rss) / 1024
    verdict = "ok" if peak < RSS_TARGET else "ABOVE"
    result.note(f"peak RSS of the daemon: {peak:.0f} MiB, target < {RSS_TARGET} MiB: {verdict}")
    if "floor" in sides:
        result.note(floor_summary(run))


def floor_summary(run: Run) -> str:
    """What the floor reaches against plain where the mount has a target; its start-up and
    peak memory."""
    reached = []
    for step in run.steps:
        for mode in MODES:
            target = run.dataset.layout.targets.get((step.key, mode))
            if target is not None:
                ratio = statistics.median(ratios(step, mode, ("floor", "plain")))
                verdict = "within" if ratio <= target else "ABOVE"
                reached.append(
                    f"{step.key} {mode} {ratio:.2f}x ({verdict} the mount's {target:g}x)"
                )
    startup = statistics.median(run.floor_startup)
    slow = f", more than {FLOOR_SLOW:g} s: SLOW" if startup > FLOOR_SLOW else ""
    return (
        "the floor (benchmarks.floor --noopen: this chunk tree, pyfuse3 + trio handlers that do "
        f"nothing) against plain, at the mount's targets: {'; '.join(reached)}\n"
        f"floor start-up {startup:.2f} s{slow}; floor peak RSS "
        f"{max(run.floor_peak) / 1024:.0f} MiB"
    )


def outputs(run: Run) -> str:
    out = {step.key: step.output for step in run.steps}
    return (
        f"find: {out['find']['mount']} files on both sides ({run.dataset.chunks} chunks + "
        f"{DOCUMENTS} zarr.json); ls -l: {out['ls']['mount']} lines "
        f"({run.dataset.layout.per_dir():,} entries + total); "
        f"du -sb: mount {out['du']['mount']}, plain {out['du']['plain']} "
        f"(files alone: {run.file_bytes['plain']} on both; the rest is directory sizes); "
        f"tar: {out['read']['mount']} bytes on both sides"
        + (
            f"; the floor: find {out['find']['floor']} files (the chunks alone), du -sb "
            f"{out['du']['floor']} (files alone: {run.file_bytes['floor']}), tar "
            f"{out['read']['floor']} bytes"
            if "floor" in run.sides
            else ""
        )
    )


# -- main -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default="2d",
        help="2d (default): 10,000-file directories; dandi: 3-D, 100-file directories",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=100,
        help=(
            f"chunks along the first axis: rows of {COLUMNS} chunks (2d), layers of "
            f"{DANDI_SIDE} x {DANDI_SIDE} chunks (dandi); default 100: 1M chunks"
        ),
    )
    parser.add_argument("--data", type=Path, help="keep the data here (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument(
        "--options", default="", help="mount options beyond ro, e.g. front=no (comma-separated)"
    )
    parser.add_argument(
        "--step-timeout", type=float, default=600, help="seconds one command may take"
    )
    parser.add_argument(
        "--results",
        help="where the result goes (default benchmarks/results/scale-LAYOUT.json; 'none': nowhere)",
    )
    args = parser.parse_args()
    if args.rows < 1 or args.repeat < 1:
        parser.error("--rows and --repeat must be positive")
    if os.geteuid() != 0:
        parser.error("needs root: it drops the page cache and mounts")
    interrupts = Interrupts()  # so `finally` unmounts on SIGTERM too
    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-scale-"))
    dataset = Dataset(data, args.rows, LAYOUTS[args.layout])
    daemon = Daemon(dataset, interrupts, tuple(o for o in args.options.split(",") if o))
    floor = FloorDaemon(dataset, interrupts)
    run = Run(dataset, daemon, floor, args.step_timeout)
    digest = code_digest()
    try:
        data.mkdir(parents=True, exist_ok=True)
        dataset.log.write_text("")
        if dataset.ready():
            print(f"reusing {data}")
        else:
            dataset.build()
        shards, shard_bytes = tree_size(dataset.source)
        described = (
            f"{dataset.layout.describe(args.rows)}; the source: {shards} files, "
            f"{shard_bytes / (1 << 20):.1f} MiB"
        )
        if "floor" in run.sides:
            python, *rest = floor.command()
            described += f"\nthe floor: {' '.join([os.path.relpath(python), *rest])}"
        print(described, flush=True)
        run.measure(args.repeat)
        run.check()
        summary = outputs(run)
        if code_digest() != digest:
            summary += f"\nWARNING: shardfs/ changed during the run: now at {revision()}"
    finally:
        daemon.stop()
        floor.stop()
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    result = Result(
        f"scale-{args.layout}",
        {"layout": args.layout, "rows": args.rows, "chunks": dataset.chunks, "repeat": args.repeat},
    )
    for line in [*described.splitlines(), *summary.splitlines()]:
        result.note(line)
    report(run, args.repeat, result)
    result.write(
        results.results_path(args.results or str(results.RESULTS / f"{result.workload}.json"))
    )
    return 0


if __name__ == "__main__":
    run(main)
