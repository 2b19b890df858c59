"""Crash-safe writes of the local storage: conditional put/append/delete and recovery.

The crash tests stop a writer at each step of the append protocol (and kill
real writer processes at random moments), then check that `recover()`
leaves every object either as before an append or with the whole append.
"""

from __future__ import annotations

import array
import errno
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path

import pytest

from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import NotFound, SourceChanged, StorageError
from shardfs.storage import LocalStorage, journal
from shardfs.storage.base import ABSENT

REPO = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct("<4sII")


class Crash(BaseException):
    """A writer's death: not an Exception, so no failure path of the writer handles it."""


def version(storage: LocalStorage, key: str) -> Hashable:
    stat = storage.stat(key)
    assert stat is not None
    return stat.version


def block(seq: int) -> bytes:
    """Append number `seq` of the crash test: a header with its number and length, then a fill."""
    length = (seq % 4 + 1) << 18  # 256 KiB to 1 MiB, so a kill often lands mid-write
    return _HEADER.pack(b"BLK!", seq, length) + bytes([seq % 251]) * length


def whole_blocks(data: bytes) -> int:
    """How many blocks `data` holds; fails unless it is exactly blocks 0, 1, ... each whole."""
    pos = seq = 0
    while pos < len(data):
        expected = block(seq)
        assert data[pos : pos + len(expected)] == expected, f"block {seq} at {pos} torn"
        pos += len(expected)
        seq += 1
    return seq


def append_records(storage: LocalStorage, key: str, writer: str, count: int) -> None:
    """Append `count` distinct lines, re-reading the version whenever another writer won."""
    for i in range(count):
        record = f"{writer}:{i}\n".encode()
        while True:
            try:
                storage.append(key, [record], version(storage, key))
                break
            except SourceChanged:
                continue


def start_child(code: str, *args: str) -> subprocess.Popen[str]:
    """A Python process running `code` with this repository importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True
    )


def test_put_creates_and_replaces(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    stat = storage.put("a/b/c", [b"ab", memoryview(b"cd")], ABSENT)
    path = tmp_path / "a/b/c"
    assert path.read_bytes() == b"abcd"
    assert stat == storage.stat("a/b/c")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask

    stat = storage.put("a/b/c", [b"new"], stat.version)
    assert path.read_bytes() == b"new"
    assert stat == storage.stat("a/b/c")


def test_put_refuses_a_stale_version(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    old = storage.put("k", [b"one"], ABSENT)
    storage.put("k", [b"two"], old.version)
    with pytest.raises(SourceChanged):
        storage.put("k", [b"three"], old.version)
    with pytest.raises(SourceChanged):
        storage.put("k", [b"three"], ABSENT)
    assert (tmp_path / "k").read_bytes() == b"two"
    assert os.listdir(tmp_path / ".shardfs/tmp") == []


def test_put_refuses_a_directory_and_maps_os_errors(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.makedirs("d/e")
    storage.makedirs("d/e")  # exists: fine
    assert (tmp_path / "d/e").is_dir()
    with pytest.raises(StorageError, match="not a regular file"):
        storage.put("d", [b"x"], ABSENT)
    storage.put("f", [b"x"], ABSENT)
    with pytest.raises(StorageError, match="File exists") as info:
        storage.put("f/g", [b"x"], ABSENT)  # a file where a directory must go
    assert not isinstance(info.value, SourceChanged)


def test_put_falls_back_to_a_temp_file_next_to_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the key's directory is another file system, rename from .shardfs/tmp fails with EXDEV."""
    storage = LocalStorage(tmp_path)
    real_rename = os.rename
    temps = str(tmp_path / ".shardfs/tmp")

    def rename(src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{src_dir_fd}") == temps:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "rename", rename)
    storage.put("d/k", [b"content"], ABSENT)
    assert (tmp_path / "d/k").read_bytes() == b"content"
    assert os.listdir(tmp_path / "d") == ["k"]
    assert os.listdir(temps) == []


def test_append(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    first = storage.put("k", [b"head"], ABSENT)
    second = storage.append("k", [b"-", memoryview(b"tail")], first.version)
    assert (tmp_path / "k").read_bytes() == b"head-tail"
    assert second == storage.stat("k")
    with pytest.raises(SourceChanged):
        storage.append("k", [b"!"], first.version)
    assert (tmp_path / "k").read_bytes() == b"head-tail"
    assert storage.append("k", [], second.version) == second
    with pytest.raises(NotFound):
        storage.append("missing", [b"x"], ABSENT)
    storage.delete("k", second.version)
    with pytest.raises(SourceChanged):
        storage.append("k", [b"x"], second.version)
    assert storage.pending_recovery() == []


def test_append_survives_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many parts (more than one pwritev takes), wide memoryviews, and writes of 3 bytes at most."""
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"head"], ABSENT)
    parts: list[bytes | memoryview] = [os.urandom(i % 7) for i in range(1500)]
    parts.append(memoryview(array.array("I", [1, 2, 3])))
    real_pwritev = os.pwritev

    def short_pwritev(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        assert len(buffers) <= os.sysconf("SC_IOV_MAX")
        return real_pwritev(fd, [bytes(buffers[0][:3])], offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    storage.append("k", parts, version(storage, "k"))
    monkeypatch.undo()
    assert (tmp_path / "k").read_bytes() == b"head" + b"".join(bytes(p) for p in parts)
    assert storage.recover() == []


def test_only_one_of_racing_creators_wins(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    outcomes: list[str] = []

    def create(name: str) -> None:
        try:
            storage.put("k", [name.encode()], ABSENT)
            outcomes.append("won")
        except SourceChanged:
            outcomes.append("lost")

    threads = [threading.Thread(target=create, args=(f"writer {i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    assert (tmp_path / "k").read_bytes().startswith(b"writer ")


def test_delete(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    old = storage.put("k", [b"one"], ABSENT)
    new = storage.put("k", [b"two"], old.version)
    with pytest.raises(SourceChanged):
        storage.delete("k", old.version)
    assert (tmp_path / "k").exists()
    storage.delete("k", new.version)
    assert storage.stat("k") is None
    with pytest.raises(NotFound):
        storage.delete("k", ABSENT)


def test_writes_never_run_in_nonblocking_mode(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    with nonblocking(), pytest.raises(WouldBlock):
        storage.put("k", [b"x"], ABSENT)
    with nonblocking(), pytest.raises(WouldBlock):
        storage.recover()
    assert not (tmp_path / "k").exists()


def test_private_area_is_invisible_and_made_only_by_writers(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    storage = LocalStorage(tmp_path)
    assert storage.read("f", 0, 4) == b"data"
    assert [e.name for e in storage.list("")] == ["f"]
    assert storage.pending_recovery() == []
    assert storage.recover() == []
    assert os.listdir(tmp_path) == ["f"]  # read-only use left no trace

    storage.append("f", [b"!"], version(storage, "f"))
    assert (tmp_path / ".shardfs/lock").exists()
    for key in (".shardfs", ".shardfs/lock", "./.shardfs/journal"):
        assert storage.stat(key) is None
        assert storage.version(key) is None
        with pytest.raises(NotFound):
            storage.read(key, 0, 1)
    with pytest.raises(NotFound):
        storage.list(".shardfs")
    assert [e.name for e in storage.list("")] == ["f"]


def test_a_version_is_a_files_stat_version_and_is_recorded_only_when_noted(
    tmp_path: Path,
) -> None:
    """`Storage.version` (what a prepared chunk directory asks at every lookup) answers
    what `stat` answers of a file, and None for anything else; it leaves recordings to
    `noted`, so that its caller records the versions it relied on."""
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    storage = LocalStorage(tmp_path)
    with storage.recording() as seen:
        first = storage.version("f")
        assert [storage.version(key) for key in ("d", "link", "missing")] == [None] * 3
    assert seen == {}
    assert first == storage.stat("f").version  # type: ignore[union-attr]
    (tmp_path / "f.new").write_bytes(b"other")
    os.replace(tmp_path / "f.new", tmp_path / "f")
    assert storage.version("f") not in (None, first)
    stat = storage.stat("f")
    with storage.recording() as seen:
        storage.noted({"f": stat, "missing": None})
    assert seen == {"f": stat, "missing": None}


STEPS = ["entry written", "part of the tail written", "tail written, not synced", "not cleared"]


@pytest.mark.parametrize("step", STEPS)
def test_recover_after_a_writer_died_at_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    old, tail = os.urandom(3000), os.urandom(5000)
    storage = LocalStorage(tmp_path)
    storage.put("k", [old], ABSENT)
    real_write_all = journal.write_all

    def die_in_write(fd: int, views: Sequence[memoryview], offset: int) -> None:
        data = b"".join(views)
        if step == "part of the tail written":
            real_write_all(fd, [memoryview(data[:1234])], offset)
        elif step == "tail written, not synced":
            real_write_all(fd, views, offset)
        raise Crash

    def die(*args: object) -> None:
        raise Crash

    if step == "not cleared":
        monkeypatch.setattr(journal.Journal, "discard", die)
    else:
        monkeypatch.setattr(journal, "write_all", die_in_write)
    with pytest.raises(Crash):
        storage.append("k", [tail[:100], tail[100:]], version(storage, "k"))
    monkeypatch.undo()
    assert storage.pending_recovery() == ["k"]

    lines = LocalStorage(tmp_path).recover()
    whole = step in ("tail written, not synced", "not cleared")
    assert (tmp_path / "k").read_bytes() == (old + tail if whole else old)
    expected = {
        "entry written": "dropped the record of an append that had written nothing",
        "part of the tail written": "rolled back a torn append (kept 3000 of 4234 bytes)",
        "tail written, not synced": "kept a completed append (5000 bytes)",
        "not cleared": "kept a completed append (5000 bytes)",
    }[step]
    assert lines == [f"{storage.describe('k')}: {expected}"]
    assert storage.pending_recovery() == []
    assert storage.recover() == []


def test_next_writer_settles_a_crashed_append_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put based on the torn version must fail, or the entry would later cut the new content."""
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"old"], ABSENT)

    def die_in_write(fd: int, views: Sequence[memoryview], offset: int) -> None:
        os.pwrite(fd, b"to", offset)
        raise Crash

    monkeypatch.setattr(journal, "write_all", die_in_write)
    with pytest.raises(Crash):
        storage.append("k", [b"torn"], version(storage, "k"))
    monkeypatch.undo()
    torn = version(storage, "k")
    assert (tmp_path / "k").read_bytes() == b"oldto"

    with pytest.raises(SourceChanged):
        storage.put("k", [b"new"], torn)
    assert (tmp_path / "k").read_bytes() == b"old"
    storage.put("k", [b"new content"], version(storage, "k"))
    assert storage.recover() == []
    assert (tmp_path / "k").read_bytes() == b"new content"


def test_recovery_leaves_alone_a_file_that_replaced_a_torn_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal entry names the inode it was written for: a shard that another tool renamed
    into place after a writer died mid-append (zarr-python, tensorstore) is never cut back
    to the dead append's old size; and a reader meanwhile trusts the shard only up to it."""
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"x" * 3000], ABSENT)

    def die_in_write(fd: int, views: Sequence[memoryview], offset: int) -> None:
        os.pwrite(fd, b"torn", offset)
        raise Crash

    monkeypatch.setattr(journal, "write_all", die_in_write)
    with pytest.raises(Crash):
        storage.append("k", [b"t" * 5000], version(storage, "k"))
    monkeypatch.undo()
    torn = storage.stat("k")
    assert torn is not None and storage.append_in_progress("k", torn) == 3000
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"r" * 4000)  # between the dead append's old and new size
    replacement.replace(tmp_path / "k")
    replaced = storage.stat("k")
    assert replaced is not None and storage.append_in_progress("k", replaced) is None
    lines = LocalStorage(tmp_path).recover()
    assert lines == [
        f"{storage.describe('k')}: left as is: another file replaced it since an interrupted append"
    ]
    assert (tmp_path / "k").read_bytes() == b"r" * 4000
    assert storage.pending_recovery() == []


def test_recover_removes_malformed_entries(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"x"], ABSENT)
    entries = tmp_path / ".shardfs/journal"
    (entries / ("0" * 40)).write_bytes(b"{not json")
    mismatched = journal.JournalEntry("other", 0, 1, 0, (1, 2))
    (entries / journal.entry_name("k")).write_bytes(mismatched.encode())
    assert storage.pending_recovery() == []
    lines = storage.recover()
    assert len(lines) == 2
    assert all("removed a malformed journal entry" in line for line in lines)
    assert "its name does not match its key" in lines[1]
    assert os.listdir(entries) == []
    assert (tmp_path / "k").read_bytes() == b"x"


def test_recover_removes_only_temp_files_of_dead_writers(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"x"], ABSENT)
    assert journal.lock_offset("dead") != journal.lock_offset("live")
    temps = tmp_path / ".shardfs/tmp"
    (temps / f"{journal.lock_offset('dead')}.0a1b").write_bytes(b"left by a crash")
    (temps / f"{journal.lock_offset('live')}.2c3d").write_bytes(b"being written")
    with storage._journal.locked("live"):  # a live writer: another open file description
        lines = storage.recover()
    assert lines == [f"{temps}: removed 1 temp files of crashed writers"]
    assert os.listdir(temps) == [f"{journal.lock_offset('live')}.2c3d"]


def test_recover_waits_for_a_live_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("k", [b"old"], ABSENT)
    writing, release = threading.Event(), threading.Event()
    real_write_all = journal.write_all

    def slow_write(fd: int, views: Sequence[memoryview], offset: int) -> None:
        writing.set()
        release.wait(10)
        real_write_all(fd, views, offset)

    monkeypatch.setattr(journal, "write_all", slow_write)
    writer = threading.Thread(target=storage.append, args=("k", [b"+new"], version(storage, "k")))
    writer.start()
    result: list[list[str]] = []
    recovery = threading.Thread(target=lambda: result.append(LocalStorage(tmp_path).recover()))
    try:
        assert writing.wait(10)
        assert storage.pending_recovery() == ["k"]  # the entry of a write in progress
        recovery.start()
        recovery.join(0.2)
        assert recovery.is_alive()  # waiting for the writer's lock, not mistaking it for a crash
    finally:
        release.set()
    writer.join(10)
    recovery.join(10)
    assert result == [[]]
    assert (tmp_path / "k").read_bytes() == b"old+new"


KILLED_APPENDER = """
import sys
from shardfs.storage import LocalStorage
from tests.library.test_storage_writes import block, version

root, key, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
storage = LocalStorage(root)
print("ready", flush=True)
while True:
    storage.append(key, [block(seq)], version(storage, key))
    seq += 1
"""


def test_recover_after_kill_9_leaves_whole_appends(tmp_path: Path) -> None:
    rng = random.Random(1234)
    storage = LocalStorage(tmp_path)
    storage.put("log", [], ABSENT)
    count = 0
    for _ in range(10):
        child = start_child(KILLED_APPENDER, str(tmp_path), "log", str(count))
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.1))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
        LocalStorage(tmp_path).recover()
        previous, count = count, whole_blocks((tmp_path / "log").read_bytes())
        assert count >= previous
        assert os.listdir(tmp_path / ".shardfs/journal") == []
        assert os.listdir(tmp_path / ".shardfs/tmp") == []
    assert count > 0


CONCURRENT_APPENDERS = """
import sys, threading
from shardfs.storage import LocalStorage
from tests.library.test_storage_writes import append_records

root, key, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
storage = LocalStorage(root)
threads = [
    threading.Thread(target=append_records, args=(storage, key, f"{name}.{t}", count))
    for t in range(3)
]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_concurrent_appends_from_processes_and_threads(tmp_path: Path) -> None:
    count = 40
    storage = LocalStorage(tmp_path)
    storage.put("log", [], ABSENT)
    children = [
        start_child(CONCURRENT_APPENDERS, str(tmp_path), "log", name, str(count))
        for name in ("p0", "p1")
    ]
    threads = [
        threading.Thread(target=append_records, args=(storage, "log", f"main.{t}", count))
        for t in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for child in children:
        assert child.wait(30) == 0
    lines = (tmp_path / "log").read_text().splitlines()
    writers = [f"{p}.{t}" for p in ("p0", "p1") for t in range(3)] + [f"main.{t}" for t in range(3)]
    assert sorted(lines) == sorted(f"{w}:{i}" for w in writers for i in range(count))


def test_symlinks_are_not_part_of_the_source(tmp_path: Path) -> None:
    """A link back to a parent would make every walk of the source endless."""
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "loop").symlink_to(tmp_path)
    (tmp_path / "alias").symlink_to(tmp_path / "file")
    storage = LocalStorage(tmp_path)
    assert [e.name for e in storage.list("")] == ["file"]
    assert storage.stat("loop") is None and storage.stat("alias") is None
