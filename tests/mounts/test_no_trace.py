"""A source that shardfs wrote to holds nothing of shardfs's own once the writers are done.

The private area of a local source (`.shardfs/`: the lock file, the append journal,
temp files) exists only while it is needed. A read-write mount removes it after its
final commit, `shardfs fsck` and `shardfs compact` when they exit; zarr-python then
lists the root group without warning about it, and `zarr_checksum` (DANDI, `aws s3
sync`) sees exactly what `shardfs checksum` sees. What a crashed writer leaves (a
journal entry, a temp file) stays for the next read-write mount, whose recovery
settles it and which then leaves no trace either.

Removing a lock file that other writers use is the delicate part: the library tests
below interleave lock takers with removals deterministically, and run writers,
removals and recoveries of one source at once, checking that no two writers ever
hold one key's lock together.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr_checksum import compute_zarr_checksum
from zarr_checksum.generators import yield_files_local

from shardfs.cli import main
from shardfs.storage import LocalStorage, journal
from shardfs.storage.base import ABSENT
from shardfs.storage.beneath import Tree
from tests.conftest import Mounted, stop_mount, wait_mounted
from tests.library.test_storage_writes import (
    CONCURRENT_APPENDERS,
    append_records,
    start_child,
    version,
)
from tests.mounts.test_mount_crash import (
    ARRAY,
    GRID,
    INNER,
    SHAPE,
    SHARD,
    make_source,
    read_chunk_values,
)
from tests.mounts.test_read_integrity import CRASHING_APPENDER

REPO = Path(__file__).resolve().parents[2]
#: An array of the source with no shard stored yet: a commit to it is a whole write.
EMPTY_ARRAY = "b"


class Crash(BaseException):
    """A writer's death: not an Exception, so no failure path of the writer handles it."""


# -- what "no trace" means ----------------------------------------------------------------


def traces(source: Path) -> list[str]:
    """What `find SOURCE -path '*/.shardfs*'` finds."""
    found = subprocess.run(
        ["find", str(source), "-path", "*/.shardfs*"], capture_output=True, text=True, check=True
    )
    return found.stdout.split()


def stored_checksum(source: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`shardfs checksum SOURCE` (as stored), run in-process."""
    capsys.readouterr()
    assert main(["checksum", str(source)]) == 0
    return capsys.readouterr().out.strip()


def listed_by_zarr(source: Path) -> tuple[list[str], list[str]]:
    """The members zarr-python 3 lists in the root group, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        group = zarr.open_group(source, mode="r")
        members = sorted(name for name, _ in group.members())
        assert sorted(group.keys()) == members
    return members, [f"{w.category.__name__}: {w.message}" for w in caught]


def assert_no_trace(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing of shardfs's own in the source: `find` finds nothing, zarr_checksum agrees
    with `shardfs checksum`, zarr-python lists the root group without a warning."""
    assert traces(source) == []
    assert stored_checksum(source, capsys) == str(compute_zarr_checksum(yield_files_local(source)))
    members, caught = listed_by_zarr(source)
    assert caught == []
    assert members == sorted(p.name for p in source.iterdir() if p.is_dir())


def make_sources(root: Path) -> np.ndarray:
    """`tests.mounts.test_mount_crash`'s source (array `a`, every chunk stored with its own value)
    plus array `b` of the same layout with nothing stored; returns the values of `a`."""
    values = make_source(root)
    zarr.open_group(root, mode="a").create_array(
        EMPTY_ARRAY, shape=SHAPE, dtype="<u4", chunks=INNER, shards=SHARD, compressors=None
    )
    return values


def commits_of(mounted: Mounted) -> tuple[int, int]:
    """(shard appends, whole writes) that the mount's final log line counts."""
    found = re.search(r"this mount: (\d+) shard appends, (\d+) whole writes", mounted.log())
    assert found, mounted.log()
    return int(found[1]), int(found[2])


def commit_all(mounted: Mounted) -> None:
    """fsync of the mount's root: commits everything it buffers now."""
    fd = os.open(mounted.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def assert_healthy(mounted: Mounted) -> None:
    log = mounted.log()
    assert mounted.process.returncode == 0, log
    assert "ERROR" not in log and "Traceback" not in log, log


def child_env() -> dict[str, str]:
    """The environment of a Python child that must import this repository's shardfs."""
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def shardfs_command(*args: str) -> subprocess.CompletedProcess[str]:
    """`shardfs ARGS` as its own process: as a user runs it, ending with the interpreter's exit."""
    return subprocess.run(
        [sys.executable, "-m", "shardfs", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- 1. a clean unmount ---------------------------------------------------------------------


@pytest.mark.fuse
def test_a_clean_unmount_leaves_no_trace(
    tmp_path: Path, mount, capsys: pytest.CaptureFixture[str]
) -> None:
    """Appends and whole writes through a read-write mount, committed while it runs and at
    its unmount: the source is left as zarr-python would have left it. A read-only mount
    afterwards makes nothing."""
    source = tmp_path / "src"
    values = make_sources(source)
    expected_a = np.kron(values, np.ones(INNER, dtype="<u4"))
    expected_b = np.zeros(SHAPE, dtype="<u4")
    mounted = mount(source, "rw", "flush_interval=3600")
    a = zarr.open_array(mounted.path / ARRAY, mode="r+")
    b = zarr.open_array(mounted.path / EMPTY_ARRAY, mode="r+")
    a[0:8, 0:8] = 7  # chunks of a stored shard: an append
    expected_a[0:8, 0:8] = 7
    commit_all(mounted)
    assert (source / ".shardfs").is_dir()  # in use while the mount writes
    b[16:20, 0:4] = 9  # the first chunk of a shard: a whole write
    expected_b[16:20, 0:4] = 9
    a[20:28, 28:32] = 11  # at the unmount
    expected_a[20:28, 28:32] = 11
    mounted.stop()
    assert_healthy(mounted)
    appends, whole = commits_of(mounted)
    assert appends >= 2 and whole >= 1

    assert_no_trace(source, capsys)
    np.testing.assert_array_equal(zarr.open_array(source / ARRAY, mode="r")[...], expected_a)
    np.testing.assert_array_equal(read_chunk_values(source), expected_a[:: INNER[0], :: INNER[1]])
    np.testing.assert_array_equal(zarr.open_array(source / EMPTY_ARRAY, mode="r")[...], expected_b)

    reader = mount(source, "ro")
    np.testing.assert_array_equal(zarr.open_array(reader.path / ARRAY, mode="r")[...], expected_a)
    reader.stop()
    assert traces(source) == []


# -- 2. two mounts and compact writing at once ------------------------------------------

#: Writes chunk files through a mount, chunk after chunk of its list and each with a value of
#: its own, until it wrote `count` or the stop file exists; every other write is fsynced.
#: Logs each write once it returned, so the last logged value of a chunk is what it holds.
LOOP_WRITER = r"""
import json, os, sys

params = json.load(open(sys.argv[1]))
chunks, first, count = params["chunks"], params["first"], params["count"]
n = 0
with open(params["log"], "w") as log:
    while (count is None or n < count) and not os.path.exists(params["stop"]):
        i, j = chunks[n % len(chunks)]
        data = (first + n).to_bytes(4, "little") * params["elements"]
        fd = os.open(f"{params['array']}/c/{i}/{j}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        assert os.write(fd, data) == len(data)
        if n % 2 == 0:
            os.fsync(fd)
        os.close(fd)
        log.write(f"{first + n} {i} {j}\n")
        log.flush()
        n += 1
print(n)
"""


def start_loop_writer(
    mounted: Mounted, chunks: list[tuple[int, int]], first: int, count: int | None, work: Path
) -> subprocess.Popen[str]:
    work.mkdir()
    params = {
        "array": str(mounted.path / ARRAY),
        "elements": INNER[0] * INNER[1],
        "chunks": chunks,
        "first": first,
        "count": count,
        "log": str(work / "writes.log"),
        "stop": str(work / "stop"),
    }
    (work / "params.json").write_text(json.dumps(params))
    return subprocess.Popen(
        [sys.executable, "-c", LOOP_WRITER, str(work / "params.json")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], what: str) -> int:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, f"{what} failed: {err}"
    return int(out)


def apply_log(expected: np.ndarray, work: Path) -> None:
    for line in (work / "writes.log").read_text().splitlines():
        value, i, j = (int(n) for n in line.split())
        expected[i, j] = value


@pytest.mark.fuse
def test_mounts_and_compact_leaving_while_another_mount_commits(
    tmp_path: Path, mount, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mount B writes and commits all along (every other write fsynced). Meanwhile mounts
    A0, A1, A2 in turn write other chunks of the same shards and unmount, and `shardfs
    compact` rewrites the shards and exits: each of them leaves while B commits, and
    removes the private area whenever B holds no lock. B's commits go on serialised with
    theirs, and nothing is lost; once B unmounts too, no trace is left."""
    source = tmp_path / "src"
    values = make_sources(source)
    even = [(i, j) for i in range(GRID[0]) for j in range(GRID[1]) if j % 2 == 0]
    odd = [(i, j) for i in range(GRID[0]) for j in range(GRID[1]) if j % 2 == 1]
    b_work = tmp_path / "b"
    b = mount(source, "rw", "flush_interval=0.1")
    b_writer = start_loop_writer(b, even, 1_000_000, None, b_work)
    a_works = []
    try:
        for cycle in range(3):
            a = mount(source, "rw", "flush_interval=0.1")
            work = tmp_path / f"a{cycle}"
            a_works.append(work)
            first = (cycle + 2) * 1_000_000
            a_writer = start_loop_writer(a, odd[cycle::3], first, 40, work)
            compacted = shardfs_command("compact", str(source), "--threshold", "0")
            assert compacted.returncode == 0, compacted.stderr + compacted.stdout
            assert finish(a_writer, f"the writer of A{cycle}") == 40
            a.stop()
            assert_healthy(a)
            assert b_writer.poll() is None, "B's writer finished early: it must write throughout"
        time.sleep(0.3)  # B commits after the last of them left
    finally:
        (b_work / "stop").touch()
    assert finish(b_writer, "the writer of B") > 0
    b.stop()
    assert_healthy(b)

    expected = values.copy()
    for work in [*a_works, b_work]:
        apply_log(expected, work)
    np.testing.assert_array_equal(read_chunk_values(source), expected)
    assert_no_trace(source, capsys)


# -- 3. a daemon killed in the middle of a commit -----------------------------------------

#: `shardfs ARGS` whose commit of a shard stalls halfway through writing its bytes (an
#: append's tail, or a whole write's temp file), after creating the marker file; the
#: test kills it there by PID.
STALLING_DAEMON = r"""
import os, sys, time
from shardfs.storage import journal

marker, how = sys.argv[1], sys.argv[2]
real_write_all = journal.write_all

def stalling(fd, views, offset):
    if (offset > 0) == (how == "append"):  # a whole write fills its temp file from 0
        data = b"".join(bytes(v) for v in views)
        os.pwrite(fd, data[: len(data) // 2], offset)
        os.fsync(fd)
        open(marker, "w").close()
        time.sleep(600)
    real_write_all(fd, views, offset)

journal.write_all = stalling
from shardfs.cli import main
sys.exit(main(sys.argv[3:]))
"""


def start_stalling_mount(
    source: Path, mountpoint: Path, log_path: Path, marker: Path, how: str
) -> Mounted:
    mountpoint.mkdir()
    args = [sys.executable, "-c", STALLING_DAEMON, str(marker), how, "mount", str(source)]
    args += [str(mountpoint), "-f", "-o", "rw,flush_interval=0.1"]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=REPO, env=child_env()
        )
    return wait_mounted(Mounted(mountpoint, process, log_path))


@pytest.mark.fuse
@pytest.mark.parametrize("how", ["append", "whole write"])
def test_a_daemon_killed_mid_commit_is_recovered_then_no_trace(
    tmp_path: Path, mount, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """SIGKILL of the daemon halfway through a commit leaves a torn append and its journal
    entry, or a temp file. A read-only mount leaves them as they are; the next read-write
    mount settles them, and its clean unmount leaves no trace."""
    source = tmp_path / "src"
    values = make_sources(source)
    marker = tmp_path / "stalled"
    stalling = start_stalling_mount(source, tmp_path / "mnt", tmp_path / "killed.log", marker, how)
    array, shard = (ARRAY, "a/c/0/0") if how == "append" else (EMPTY_ARRAY, "b/c/0/0")
    size = (source / shard).stat().st_size if how == "append" else 0
    try:
        (stalling.path / array / "c/0").mkdir(parents=True, exist_ok=True)
        with open(stalling.path / array / "c/0/0", "wb") as f:
            f.write(np.full(INNER, 5, "<u4").tobytes())  # no fsync: the commit loop takes it
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, stalling.log()
            time.sleep(0.02)
        os.kill(stalling.process.pid, signal.SIGKILL)
        stalling.process.wait(timeout=30)
    finally:
        stop_mount(stalling)  # clears the stale mount
    private = source / ".shardfs"
    if how == "append":
        assert (source / shard).stat().st_size > size
        assert LocalStorage(source).pending_recovery() == [shard]
    else:
        assert not (source / shard).exists()
        assert len(os.listdir(private / "tmp")) == 1
    left = sorted(traces(source))
    assert left

    reader = mount(source, "ro")
    np.testing.assert_array_equal(
        zarr.open_array(reader.path / ARRAY, mode="r")[...], np.kron(values, np.ones(INNER))
    )
    reader.stop()
    assert sorted(traces(source)) == left  # a read-only mount repairs nothing

    recovering = mount(source, "rw")
    recovering.stop()
    assert_healthy(recovering)
    if how == "append":
        assert "recovery: " in recovering.log() and "rolled back a torn append" in recovering.log()
        assert (source / shard).stat().st_size == size
    else:
        assert "removed 1 temp files of crashed writers" in recovering.log()
    assert_no_trace(source, capsys)
    np.testing.assert_array_equal(read_chunk_values(source), values)
    assert not zarr.open_array(source / EMPTY_ARRAY, mode="r")[...].any()


# -- 4. fsck and compact ---------------------------------------------------------------


@pytest.mark.fuse
def test_fsck_and_compact_leave_no_trace(
    tmp_path: Path, mount, capsys: pytest.CaptureFixture[str]
) -> None:
    """`shardfs fsck` rolls back a torn append and removes the area it settled;
    `--dry-run` leaves both. `shardfs compact` makes the area for its rewrites and
    removes it when it is done."""
    source = tmp_path / "src"
    values = make_sources(source)
    shard = "a/c/1/1"
    size = (source / shard).stat().st_size
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_APPENDER, str(source), shard, "half"], env=child_env()
    )
    assert crashed.returncode == 9
    left = sorted(traces(source))
    assert left and (source / shard).stat().st_size > size

    checked = shardfs_command("fsck", "--dry-run", str(source))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert sorted(traces(source)) == left
    repaired = shardfs_command("fsck", str(source))
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "rolled back a torn append" in repaired.stdout
    assert (source / shard).stat().st_size == size
    assert_no_trace(source, capsys)

    mounted = mount(source, "rw")
    for value in (3, 4):  # stored twice: the first copies are dead space
        zarr.open_array(mounted.path / ARRAY, mode="r+")[0:16, 0:16] = value
        commit_all(mounted)
    mounted.stop()
    assert_healthy(mounted)
    assert traces(source) == []
    before = (source / "a/c/0/0").stat().st_size
    compacted = shardfs_command("compact", str(source), "--min-dead", "0")
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    assert (source / "a/c/0/0").stat().st_size < before  # rewritten
    assert_no_trace(source, capsys)
    expected = values.copy()
    expected[0:4, 0:4] = 4
    np.testing.assert_array_equal(read_chunk_values(source), expected)


# -- 5. the removal of the lock file, in the library ---------------------------------------


def private(root: Path) -> Path:
    return root / journal.PRIVATE


def test_tidy_removes_only_an_idle_empty_area(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "f").write_bytes(b"data")
    storage = LocalStorage(tmp_path)
    storage.tidy()
    assert os.listdir(tmp_path) == ["f"]  # nothing there, nothing made
    storage.append("f", [b"+"], version(storage, "f"))
    area = storage._journal
    assert private(tmp_path).is_dir()

    with area.locked("other key"):
        assert area.tidy() == "another writer of the source is at work"
    assert (private(tmp_path) / "lock").exists()

    def crash(fd: int, views: Sequence[memoryview], offset: int) -> None:
        raise Crash

    monkeypatch.setattr(journal, "write_all", crash)
    with pytest.raises(Crash):
        storage.append("f", [b"torn"], version(storage, "f"))
    monkeypatch.undo()
    assert area.tidy() == "it holds journal entries for recovery"
    dead = private(tmp_path) / "tmp" / f"{journal.lock_offset('dead')}.0a1b"
    dead.write_bytes(b"left by a crash")
    storage.recover()
    assert not dead.exists() and storage.pending_recovery() == []
    dead.write_bytes(b"left by another crash")
    assert area.tidy() == "it holds temp files of writers that crashed"
    dead.unlink()

    assert area.tidy() is None
    assert os.listdir(tmp_path) == ["f"]
    assert (tmp_path / "f").read_bytes() == b"data+"
    storage.put("g", [b"again"], ABSENT)  # writers make it again
    assert private(tmp_path).is_dir()
    storage.tidy()
    assert sorted(os.listdir(tmp_path)) == ["f", "g"]


def test_tidy_leaves_what_another_tool_put_there(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"x"], ABSENT)
    (private(tmp_path) / "notes").write_bytes(b"not ours")
    assert storage._journal.tidy() == "it holds files of another tool"
    assert os.listdir(private(tmp_path)) == ["notes"]


@contextlib.contextmanager
def paused_in_lock(
    monkeypatch: pytest.MonkeyPatch, thread: str
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Thread `thread`'s first lock request stops before it is made: (reached, go on)."""
    real_lock = journal._lock
    reached, go_on = threading.Event(), threading.Event()

    def paused(fd: int, offset: int, wait: bool, length: int = 1) -> bool:
        if threading.current_thread().name == thread and not reached.is_set():
            reached.set()
            assert go_on.wait(10)
        return real_lock(fd, offset, wait, length)

    monkeypatch.setattr(journal, "_lock", paused)
    yield reached, go_on


def holder(
    storage: LocalStorage, key: str, held: threading.Event, release: threading.Event
) -> threading.Thread:
    def run() -> None:
        with storage._journal.locked(key):
            held.set()
            release.wait(10)

    return threading.Thread(target=run, name="holder", daemon=True)


def test_a_lock_taken_on_a_lock_file_that_was_removed_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer opens the lock file; before it locks, a tidy removes the area and another
    writer makes it again and takes the same key's lock. The first writer's lock, on the
    removed file, excludes nobody: it must take the lock on the new file, after the other."""
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"x"], ABSENT)
    held, release = threading.Event(), threading.Event()
    with paused_in_lock(monkeypatch, "holder") as (reached, go_on):
        first = holder(storage, "k", held, release)
        first.start()
        assert reached.wait(10)  # the lock file is open, no lock taken
        assert journal.Journal(tmp_path).tidy() is None
        assert not private(tmp_path).exists()
        with storage._journal.locked("k"):  # makes the area again
            assert private(tmp_path).is_dir()
            go_on.set()
            assert not held.wait(0.5), "two writers hold the lock of one key"
        assert held.wait(10)
    release.set()
    first.join(10)
    assert not first.is_alive()
    assert storage._journal.tidy() is None


def test_a_writer_waiting_for_a_lock_while_a_tidy_removes_the_file_takes_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tidy holds the whole lock file; a writer waits on it. Once the tidy unlinked it and
    let go, the writer holds a lock on a removed file: it starts over, makes the area again,
    and writes."""
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"x"], ABSENT)
    real_remove = journal.remove_empty_dir
    removing, go_on = threading.Event(), threading.Event()

    def paused_remove(tree: Tree, rel: str) -> bool:
        if rel == journal.ENTRIES:
            removing.set()
            assert go_on.wait(10)
        return real_remove(tree, rel)

    monkeypatch.setattr(journal, "remove_empty_dir", paused_remove)
    tidy = threading.Thread(target=journal.Journal(tmp_path).tidy)
    tidy.start()
    assert removing.wait(10)  # holding the whole lock file
    writer = threading.Thread(target=storage.put, args=("k", [b"new"], version(storage, "k")))
    writer.start()
    writer.join(0.3)
    assert writer.is_alive()  # waiting for the tidy
    go_on.set()
    tidy.join(10)
    writer.join(10)
    assert not writer.is_alive() and not tidy.is_alive()
    assert (tmp_path / "k").read_bytes() == b"new"
    assert os.listdir(private(tmp_path) / "tmp") == []


def test_a_writer_whose_new_area_a_tidy_removes_makes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The area is removed between a writer making it and opening the lock file in it."""
    storage = LocalStorage(tmp_path)
    real_makedirs = journal.makedirs_durably
    tidied = []

    def makedirs_then_tidy(tree: Tree, rel: str) -> None:
        real_makedirs(tree, rel)
        if rel == journal.AREA and not tidied:
            tidied.append(journal.Journal(tmp_path).tidy())

    monkeypatch.setattr(journal, "makedirs_durably", makedirs_then_tidy)
    storage.put("k", [b"x"], ABSENT)
    assert tidied == [None]
    assert (tmp_path / "k").read_bytes() == b"x"
    storage.append("k", [b"y"], version(storage, "k"))
    assert (tmp_path / "k").read_bytes() == b"xy"


def test_writers_tidies_and_recoveries_at_once_never_share_a_lock(tmp_path: Path) -> None:
    """Threads and processes append and replace objects while other threads remove the
    area and run recovery in a loop: no two holders of one key's lock at any moment, no
    write fails, no append is lost; afterwards the area can go."""
    storage = LocalStorage(tmp_path)
    storage.put("log", [], ABSENT)
    count = 60
    stop = threading.Event()
    failures: list[str] = []
    inside: Counter[str] = Counter()
    most: Counter[str] = Counter()
    guard = threading.Lock()
    tidies: Counter[str | None] = Counter()

    def guarded(run):
        def wrapper(*args: object) -> None:
            try:
                run(*args)
            except BaseException:
                failures.append(traceback.format_exc())
                stop.set()

        return wrapper

    def hold(key: str) -> None:
        area = LocalStorage(tmp_path)._journal
        while not stop.is_set():
            with area.locked(key):
                with guard:
                    inside[key] += 1
                    most[key] = max(most[key], inside[key])
                time.sleep(0.0005)
                with guard:
                    inside[key] -= 1
            time.sleep(0.002)  # leave the tidies moments without any lock held

    def tidy() -> None:
        other = LocalStorage(tmp_path)
        while not stop.is_set():
            tidies[other._journal.tidy()] += 1
            other.recover()
            time.sleep(0.0002)

    def replace(key: str) -> None:
        for n in range(count):
            current = storage.stat(key)
            storage.put(key, [f"{n}".encode()], ABSENT if current is None else current.version)

    children = [
        start_child(CONCURRENT_APPENDERS, str(tmp_path), "log", name, str(count))
        for name in ("p0", "p1")
    ]
    background = [threading.Thread(target=guarded(hold), args=(k,)) for k in ("h0", "h0", "h1")]
    background += [threading.Thread(target=guarded(tidy)) for _ in range(2)]
    writers = [
        threading.Thread(target=guarded(append_records), args=(storage, "log", f"main.{t}", count))
        for t in range(2)
    ] + [threading.Thread(target=guarded(replace), args=(f"put{t}",)) for t in range(2)]
    for t in background + writers:
        t.start()
    try:
        for t in writers:
            t.join(120)
        for child in children:
            assert child.wait(120) == 0
    finally:
        stop.set()
        for t in background:
            t.join(30)
    assert not failures, "\n".join(failures)
    assert max(most.values()) == 1, most
    assert tidies[None] > 0, tidies  # the area was removed again and again
    lines = (tmp_path / "log").read_text().splitlines()
    writers_of_log = [f"{p}.{t}" for p in ("p0", "p1") for t in range(3)]
    writers_of_log += [f"main.{t}" for t in range(2)]
    assert sorted(lines) == sorted(f"{w}:{i}" for w in writers_of_log for i in range(count))
    for t in range(2):
        assert (tmp_path / f"put{t}").read_bytes() == f"{count - 1}".encode()
    assert storage._journal.tidy() is None
    assert sorted(os.listdir(tmp_path)) == ["log", "put0", "put1"]
