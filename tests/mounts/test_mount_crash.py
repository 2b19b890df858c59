"""Crashes and concurrency of read-write mounts, through real FUSE mounts and writer processes.

What a read-write mount promises, and what these tests hold it to:

- **A killed daemon loses only what was not fsynced, and never tears a shard.**
  Chunks written through the mount are buffered and committed as appends to
  their shards (every `flush_interval`, on `fsync`, at unmount), under a
  journal that the next read-write mount uses to roll back a torn append. So
  after a SIGKILL at any moment and a remount, every shard decodes, every
  chunk holds one whole value (its old one, or one that was written to it),
  and a chunk whose write was followed by a returned `fsync` holds that value
  or a later one. The kill test does this for many rounds at random moments,
  with writers that use both ways of writing a chunk file (temp file renamed
  over the key, and `O_TRUNC`).
- **Two mounts of one source can write different chunks of the same shards.**
  A commit reads the shard's current index and appends conditionally on the
  version it read, so neither mount's chunks are lost when both commit into a
  shard at once.
- **Readers of a shard being appended to are not disturbed.** Chunks that are
  not rewritten keep their place in the shard, so reading them through the
  mount while other chunks of that shard are committed always gives their
  exact bytes, never an error.

Writers and readers are separate processes (not threads): a process blocked on
a dead mount can still be killed, and the kernel sees ordinary clients. Every
check of the result reads the *source* directly, with zarr-python 3 and with
tensorstore.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr

from shardfs.fuse.mounts import unmount
from tests.conftest import Mounted, start_mount, stop_mount

pytestmark = [pytest.mark.fuse]

SHAPE = (64, 64)
SHARD = (16, 16)
INNER = (4, 4)
GRID = (SHAPE[0] // INNER[0], SHAPE[1] // INNER[1])  #: inner chunks per axis
ARRAY = "a"
OPTIONS = ("rw", "flush_interval=0.2")
#: Values written in round r are r * ROUND + n: unique across rounds, never the initial values.
ROUND = 1_000_000
#: Rounds of the kill test.
KILLS = 12

Chunk = tuple[int, int]

#: Writes chunk files through the mount as a plan says; logs each write once it (and its
#: fsync) returned. Stops at the first error (on a dead mount: ENOTCONN).
WRITER = r"""
import json, os, sys, uuid

params = json.load(open(sys.argv[1]))
array, elements = params["array"], params["elements"]
with open(params["log"], "w") as log:
    for value, i, j, style, sync in params["plan"]:
        key = f"{array}/c/{i}/{j}"
        data = value.to_bytes(4, "little") * elements
        if style == "rename":
            temp = f"{key}.{uuid.uuid4().hex}.partial"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            assert os.write(fd, data) == len(data)
            os.close(fd)
            os.rename(temp, key)
            if sync:
                fd = os.open(key, os.O_RDWR)
                os.fsync(fd)
                os.close(fd)
        else:
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            assert os.write(fd, data) == len(data)
            if sync:
                os.fsync(fd)
            os.close(fd)
        log.write(f"{value} {i} {j} {int(sync)}\n")
        log.flush()
        os.fsync(log.fileno())
"""

#: Reads chunk files through the mount until the stop file exists; any error, or any
#: content other than the expected bytes, ends it with a non-zero exit. Prints its reads.
READER = r"""
import json, os, sys

params = json.load(open(sys.argv[1]))
expected = {path: bytes.fromhex(content) for path, content in params["expected"].items()}
reads = 0
while not os.path.exists(params["stop"]):
    for path, want in expected.items():
        with open(path, "rb") as f:
            got = f.read()
        if got != want:
            sys.exit(f"{path}: read {len(got)} bytes {got[:8].hex()}..., expected {want[:8].hex()}...")
        reads += 1
print(reads)
"""


@dataclass(frozen=True)
class Write:
    """One chunk file written by a writer process: `value` in every element."""

    value: int
    chunk: Chunk
    style: str  #: "rename" (temp file renamed over the key) or "trunc" (O_TRUNC)
    fsync: bool

    def line(self) -> str:
        """The writer's log line for this write."""
        return f"{self.value} {self.chunk[0]} {self.chunk[1]} {int(self.fsync)}"


# -- the source -------------------------------------------------------------------------


def make_source(root: Path) -> np.ndarray:
    """A group holding one sharded uint32 array, inner chain `bytes` only, every chunk
    written by zarr-python 3 with its own value; returns the value of each chunk."""
    group = zarr.open_group(root, mode="w")
    array = group.create_array(
        ARRAY, shape=SHAPE, dtype="<u4", chunks=INNER, shards=SHARD, compressors=None
    )
    values = np.arange(1, GRID[0] * GRID[1] + 1, dtype="<u4").reshape(GRID)
    array[:] = np.kron(values, np.ones(INNER, dtype="<u4"))
    return values


def chunk_bytes(value: int) -> bytes:
    """The content of a chunk file holding `value` in every element."""
    return np.full(INNER, value, "<u4").tobytes()


def chunk_file(mounted: Mounted, chunk: Chunk) -> Path:
    """The file of `chunk` in the mount (default chunk key encoding: `c/i/j`)."""
    return mounted.path / ARRAY / "c" / str(chunk[0]) / str(chunk[1])


def read_chunk_values(root: Path) -> np.ndarray:
    """The value of each chunk of the source, read by zarr-python 3 and by tensorstore
    (which must agree); fails if a shard does not decode or a chunk mixes values."""
    data = zarr.open_array(root / ARRAY, mode="r")[...]
    store = ts.open({"driver": "zarr3", "kvstore": f"file://{root}/{ARRAY}"}).result()
    np.testing.assert_array_equal(store.read().result(), data, "zarr-python 3 vs tensorstore")
    blocks = data.reshape(GRID[0], INNER[0], GRID[1], INNER[1]).transpose(0, 2, 1, 3)
    values = blocks[:, :, 0, 0]
    mixed = [
        (i, j, np.unique(blocks[i, j]).tolist())
        for i in range(GRID[0])
        for j in range(GRID[1])
        if (blocks[i, j] != values[i, j]).any()
    ]
    assert not mixed, f"chunks holding more than one value: {mixed}"
    return values


def assert_settled(root: Path) -> None:
    """No journal entry and no temp file left in the private area."""
    private = root / ".shardfs"
    for name in ("journal", "tmp"):
        if (private / name).exists():
            left = sorted(p.name for p in (private / name).iterdir())
            assert not left, f".shardfs/{name} not empty after a clean mount: {left}"


# -- writer and reader processes --------------------------------------------------------


def plan_writes(
    rng: random.Random, chunks: list[Chunk], count: int, first_value: int, fsync_share: float
) -> list[Write]:
    """`count` writes of random chunks of `chunks`, each with a new value."""
    return [
        Write(
            first_value + n,
            rng.choice(chunks),
            rng.choice(("rename", "trunc")),
            rng.random() < fsync_share,
        )
        for n in range(count)
    ]


def start_process(script: str, params: dict[str, object], path: Path) -> subprocess.Popen[bytes]:
    """Run `script` in a new Python process, with `params` passed as a JSON file at `path`."""
    path.write_text(json.dumps(params))
    return subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@contextmanager
def writer(mounted: Mounted, plan: list[Write], work: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A writer process carrying out `plan` through `mounted`, logging to `work`/writer.log;
    killed (by PID) if it is still running when the block ends."""
    params = {
        "array": str(mounted.path / ARRAY),
        "elements": INNER[0] * INNER[1],
        "log": str(work / "writer.log"),
        "plan": [[w.value, *w.chunk, w.style, w.fsync] for w in plan],
    }
    with killed_at_exit(start_process(WRITER, params, work / "writer.json")) as process:
        yield process


@contextmanager
def killed_at_exit(process: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """`process`, killed by its PID if it still runs when the block ends, and reaped."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def logged_writes(work: Path) -> list[str]:
    """The lines of the writer's log: the writes that returned, in order."""
    path = work / "writer.log"
    return path.read_text().splitlines() if path.exists() else []


def finish(process: subprocess.Popen[bytes], what: str, timeout: float = 60) -> str:
    """Wait for a writer or reader that must succeed; returns its stdout."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"{what} failed ({process.returncode}): {err.decode()}"
    return out.decode()


@contextmanager
def mounted_at(source: Path, mountpoint: Path, log: Path) -> Iterator[Mounted]:
    """A read-write mount that is unmounted (or cleared, if its daemon was killed) at the end."""
    mounted = start_mount(source, mountpoint, log, *OPTIONS)
    try:
        yield mounted
    finally:
        stop_mount(mounted)


# -- 1. SIGKILL of the daemon at random moments -----------------------------------------


def allowed_values(before: int, history: list[tuple[Write, bool]]) -> list[int]:
    """What a chunk may hold after a crash, given the writes to it in order, each with
    whether it returned (the last one may have been in progress): its value before or
    any value written since; from its last returned fsync on, that value or a later one."""
    synced = [n for n, (w, returned) in enumerate(history) if w.fsync and returned]
    if synced:
        return [w.value for w, _ in history[synced[-1] :]]
    return [before] + [w.value for w, _ in history]


def check_round(before: np.ndarray, after: np.ndarray, plan: list[Write], returned: int) -> None:
    """`after` is what a crash during `plan` may leave, given that `returned` writes returned."""
    attempted = plan[: returned + 1]  # the writes that returned, and the one in progress
    problems = []
    for i in range(GRID[0]):
        for j in range(GRID[1]):
            history = [(w, n < returned) for n, w in enumerate(attempted) if w.chunk == (i, j)]
            allowed = allowed_values(int(before[i, j]), history)
            if int(after[i, j]) not in allowed:
                writes = [(w.value, w.style, w.fsync, done) for w, done in history]
                problems.append(
                    f"chunk ({i}, {j}) holds {after[i, j]}, allowed {allowed}; "
                    f"(value, style, fsync, returned) written: {writes}"
                )
    assert not problems, "\n".join(problems)


def kill_round(
    source: Path, work: Path, rng: random.Random, number: int, before: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """Mount, write, SIGKILL the daemon at a random moment, remount (recovery) and unmount,
    then check the source. Returns the chunk values read back and the recovery log lines."""
    work.mkdir()
    mountpoint = work.parent / "mnt"
    chunks = [(i, j) for i in range(GRID[0]) for j in range(GRID[1])]
    plan = plan_writes(rng, chunks, 20_000, number * ROUND, fsync_share=0.3)
    with (
        mounted_at(source, mountpoint, work / "mount.log") as mounted,
        writer(mounted, plan, work) as process,
    ):
        time.sleep(rng.uniform(0.05, 0.6))
        mounted.process.kill()
        mounted.process.wait(timeout=30)
        process.kill()
        process.communicate(timeout=30)
        unmount(str(mountpoint), lazy=True)
    lines = logged_writes(work)
    assert lines == [w.line() for w in plan[: len(lines)]], "the writer's log is not its plan"
    assert len(lines) < len(plan), "the writer finished before the kill: make the plan longer"

    with mounted_at(source, mountpoint, work / "recovery.log") as recovery:
        pass
    log = recovery.log()
    assert "Traceback" not in log, log
    assert_settled(source)
    after = read_chunk_values(source)
    check_round(before, after, plan, len(lines))
    return after, [line for line in log.splitlines() if "recovery:" in line]


def test_a_killed_daemon_loses_only_what_was_not_fsynced(tmp_path: Path) -> None:
    source = tmp_path / "src"
    values = make_source(source)
    rng = random.Random(20240611)
    recovered: dict[int, list[str]] = {}
    for number in range(1, KILLS + 1):
        values, lines = kill_round(source, tmp_path / f"round{number}", rng, number, values)
        if lines:
            recovered[number] = lines
    # Which kills interrupted a commit (visible only through the output of `pytest -s`).
    print(f"\n{len(recovered)} of {KILLS} kills interrupted a commit:")
    for number, lines in recovered.items():
        print(f"  round {number}: " + "; ".join(line.split("recovery: ")[1] for line in lines))


# -- 2. two mounts writing into the same shards -----------------------------------------


def test_two_mounts_writing_the_same_shards_lose_nothing(tmp_path: Path) -> None:
    source = tmp_path / "src"
    expected = make_source(source)
    rng = random.Random(7)
    halves = {
        parity: [(i, j) for i in range(GRID[0]) for j in range(GRID[1]) if j % 2 == parity]
        for parity in (0, 1)
    }
    plans = {
        parity: plan_writes(rng, chunks, 200, (parity + 1) * ROUND, fsync_share=0.5)
        for parity, chunks in halves.items()
    }
    works = {parity: tmp_path / f"writer{parity}" for parity in plans}
    with (
        mounted_at(source, tmp_path / "mnt0", tmp_path / "mnt0.log") as mount0,
        mounted_at(source, tmp_path / "mnt1", tmp_path / "mnt1.log") as mount1,
    ):
        for work in works.values():
            work.mkdir()
        with (
            writer(mount0, plans[0], works[0]) as writer0,
            writer(mount1, plans[1], works[1]) as writer1,
        ):
            finish(writer0, "the writer of mount 0")
            finish(writer1, "the writer of mount 1")
    for mounted in (mount0, mount1):
        assert "ERROR" not in mounted.log() and "Traceback" not in mounted.log(), mounted.log()
    for plan in plans.values():
        for w in plan:
            expected[w.chunk] = w.value
    np.testing.assert_array_equal(read_chunk_values(source), expected)
    assert_settled(source)


# -- 3. reading a shard while it is appended to -----------------------------------------


def test_reads_of_a_shard_being_appended_to_are_undisturbed(tmp_path: Path) -> None:
    source = tmp_path / "src"
    expected = make_source(source)
    per_shard = (SHARD[0] // INNER[0], SHARD[1] // INNER[1])
    shard = [(i, j) for i in range(per_shard[0]) for j in range(per_shard[1])]
    written = [(i, j) for i, j in shard if j < per_shard[1] // 2]
    read = [chunk for chunk in shard if chunk not in written]
    plan = plan_writes(random.Random(3), written, 80, ROUND, fsync_share=1.0)
    stop = tmp_path / "stop"
    with mounted_at(source, tmp_path / "mnt", tmp_path / "mnt.log") as mounted:
        params: dict[str, object] = {
            "expected": {
                str(chunk_file(mounted, chunk)): chunk_bytes(int(expected[chunk])).hex()
                for chunk in read
            },
            "stop": str(stop),
        }
        with killed_at_exit(start_process(READER, params, tmp_path / "reader.json")) as reader:
            with writer(mounted, plan, tmp_path) as process:
                finish(process, "the writer")
            stop.touch()
            reads = int(finish(reader, "the reader"))
    assert reads > len(read), f"the reader read only {reads} chunks"
    log = mounted.log()
    assert not [line for line in log.splitlines() if "ERROR" in line], log
    assert "Traceback" not in log, log
    for w in plan:
        expected[w.chunk] = w.value
    np.testing.assert_array_equal(read_chunk_values(source), expected)
