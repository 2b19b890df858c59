"""Chunks kept for the next mount: whatever commits them forgets them, and no kill lets them
overwrite newer data.

A mount whose final commit fails keeps the shard's pending chunks on disk; the next
read-write mount takes them up. Once that mount commits newer data to the same chunks (by
`fsync`, by `fsync` of a directory, by its commit loop), the kept (older) bytes must never
reach the source again, even if the daemon is killed right after the commit, or between
the commit and the update of the kept file. The library tests crash a commit exactly there
(an exception out of the kept file's update); the mount tests SIGKILL the daemon after
the commit returned. Sources are written by zarr-python 3 and read back with it.

Also: in the v2 view, `fsync` of a chunk served uncompressed with the wrong size fails
with EINVAL (as `close` does) and stores nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec, TransposeCodec

from shardfs.fuse.mounts import unmount
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, View
from shardfs.writeback import Workspace, WriteBuffer
from shardfs.writeback.leftover import Leftovers
from tests.conftest import Mounted, one_shard_array, start_mount, stop_mount

OLD, NEW, OTHER = 0x11, 0x22, 0x33  #: kept, written after it was taken up, still open
INITIAL = 7
KEY = "a/c/0/0"  #: chunk (0, 0) of `a`; its shard holds (0, 0), (0, 1), (1, 0), (1, 1)


def make_source(root: Path) -> None:
    """As the repro (mk_lo.py): one shard of 2x2 raw chunks of 4x4 bytes, all 7; and `b`,
    the same with crc32c after the bytes, so that its stored chunks differ from what the
    v2 view serves."""
    one_shard_array(root, "a", (8, 8), (4, 4), INITIAL)
    one_shard_array(root, "b", (8, 8), (4, 4), INITIAL, compressors=Crc32cCodec())


def chunk_values(root: Path, name: str = "a") -> np.ndarray:
    """The value of every chunk of array `name` (2x2), read from the source by zarr-python;
    -1 for a chunk that does not hold one value."""
    data = zarr.open_array(root / name, mode="r")[...]
    out = np.full((2, 2), -1)
    for i in range(2):
        for j in range(2):
            values = np.unique(data[4 * i : 4 * i + 4, 4 * j : 4 * j + 4])
            if len(values) == 1:
                out[i, j] = int(values[0])
    return out


def filled(value: int) -> bytes:
    return bytes([value]) * 16


def kept_files(spool: Path) -> list[Path]:
    return sorted(spool.glob("pending/*/*.pending"))


def break_index(shard: Path) -> bytes:
    """Flip one byte of the shard's index (at its end) so that it fails its checksum;
    returns the intact shard."""
    intact = shard.read_bytes()
    broken = bytearray(intact)
    broken[-8] ^= 0xFF
    shard.write_bytes(bytes(broken))
    return intact


# -- through real mounts -----------------------------------------------------------------


def kill(mounted: Mounted) -> None:
    """SIGKILL the daemon (a child of this test, by its PID) and clear its dead mount."""
    mounted.process.kill()
    mounted.process.wait(timeout=30)
    unmount(str(mounted.path), lazy=True)


def keep_chunks(tmp_path: Path, source: Path, spool: Path, keys: list[str]) -> bytes:
    """Mount A writes the chunks `keys` of `a` as OLD; their shard's index is broken when
    A's final commit runs, so they are kept in `spool`. Returns the intact shard."""
    shard = source / "a" / "c" / "0" / "0"
    mounted = start_mount(
        source, tmp_path / "mntA", tmp_path / "A.log", "rw", "flush_interval=600", f"spool={spool}"
    )
    try:
        for key in keys:
            (mounted.path / key).write_bytes(filled(OLD))
        intact = break_index(shard)
    finally:
        stop_mount(mounted)
    assert mounted.process.returncode == 1, mounted.log()
    assert "their chunks are kept in" in mounted.log()
    assert len(kept_files(spool)) == 1
    return intact


def wait_for(condition, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.fuse
@pytest.mark.parametrize("commit", ["fsync", "fsyncdir", "commit_loop"])
def test_kept_chunks_committed_again_are_not_rolled_back_by_a_kill(
    tmp_path: Path, commit: str
) -> None:
    """The repro: A keeps (0, 0) as OLD; B takes it up, writes NEW, commits it and is
    killed; C must leave NEW in the source. With the commit loop, A keeps (0, 1) too, and B
    holds it open for writing, so the shard still has a pending change when B is killed:
    C commits the kept (0, 1), never the kept (0, 0)."""
    source, spool = tmp_path / "src", tmp_path / "spool"
    make_source(source)
    shard = source / "a" / "c" / "0" / "0"
    keys = [KEY, "a/c/0/1"] if commit == "commit_loop" else [KEY]
    intact = keep_chunks(tmp_path, source, spool, keys)
    if commit != "commit_loop":
        shard.write_bytes(intact)  # repaired before B mounts, as in the repro

    interval = "flush_interval=0.2" if commit == "commit_loop" else "flush_interval=600"
    b = start_mount(source, tmp_path / "mntB", tmp_path / "B.log", "rw", interval, f"spool={spool}")
    held = None
    try:
        assert (b.path / KEY).read_bytes() == filled(OLD)  # taken up
        if commit == "fsync":
            fd = os.open(b.path / KEY, os.O_WRONLY | os.O_TRUNC)
            try:
                assert os.write(fd, filled(NEW)) == 16
                os.fsync(fd)
            finally:
                os.close(fd)
        elif commit == "fsyncdir":
            (b.path / KEY).write_bytes(filled(NEW))
            fd = os.open(b.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            # The shard is still broken, so the loop cannot commit the kept chunks before
            # (0, 1) is open for writing; once repaired, it commits (0, 0) = NEW alone.
            held = os.open(b.path / "a" / "c" / "0" / "1", os.O_WRONLY | os.O_TRUNC)
            assert os.write(held, filled(OTHER)) == 16
            (b.path / KEY).write_bytes(filled(NEW))
            shard.write_bytes(intact)
            wait_for(lambda: chunk_values(source)[0, 0] == NEW, "the commit loop")
            time.sleep(0.5)  # a few more ticks: the shard has a change pending still
        assert chunk_values(source)[0, 0] == NEW  # committed
        kill(b)
    finally:
        if held is not None:
            with contextlib.suppress(OSError):
                os.close(held)  # on the dead mount
        stop_mount(b)

    c = start_mount(source, tmp_path / "mntC", tmp_path / "C.log", "rw", f"spool={spool}")
    stop_mount(c)
    assert c.process.returncode == 0, c.log()
    values = chunk_values(source)
    assert values[0, 0] == NEW, f"the kept chunk rolled back committed data: {values}"
    # B's write to the open (0, 1) was never committed; the kept one is, by C.
    assert values[0, 1] == (OLD if commit == "commit_loop" else INITIAL), values
    assert values[1, 0] == values[1, 1] == INITIAL, values
    assert kept_files(spool) == []


@pytest.mark.fuse
def test_fsync_of_a_wrong_size_chunk_in_the_v2_view_fails_with_einval(tmp_path: Path) -> None:
    """A chunk the v2 view serves decoded (a transpose that is neither C nor F order) must be
    written back whole: fsync says EINVAL, as close does, and nothing reaches the source."""
    source = tmp_path / "src"
    array = zarr.open_group(source, mode="w").create_array(
        "t",
        shape=(4, 4, 4),
        dtype="u1",
        chunks=(2, 2, 2),
        shards=(4, 4, 4),
        filters=[TransposeCodec(order=(1, 0, 2))],
        compressors=None,
        fill_value=0,
    )
    array[:] = INITIAL
    shard = source / "t" / "c" / "0" / "0" / "0"
    before = shard.read_bytes()
    mounted = start_mount(source, tmp_path / "mnt", tmp_path / "log", "rw", "view=v2")
    try:
        chunk = mounted.path / "t" / "0" / "0" / "0"
        assert chunk.read_bytes() == bytes([INITIAL]) * 8  # decoded: 2x2x2 raw values
        fd = os.open(chunk, os.O_WRONLY | os.O_TRUNC)
        try:
            assert os.write(fd, b"\x01\x02\x03") == 3
            with pytest.raises(OSError) as fsynced:
                os.fsync(fd)
            assert fsynced.value.errno == errno.EINVAL
        finally:
            with pytest.raises(OSError) as closed:
                os.close(fd)
            assert closed.value.errno == errno.EINVAL
        assert shard.read_bytes() == before
    finally:
        stop_mount(mounted)
    assert shard.read_bytes() == before
    np.testing.assert_array_equal(zarr.open_array(source / "t", mode="r")[...], INITIAL)


# -- the workspace as a library: a crash between the commit and the kept file's update ------


class Killed(BaseException):
    """The daemon dies here (nothing after it runs, no handler catches it)."""


def workspace(root: Path, view: View) -> Workspace:
    namespace = Namespace(LocalStorage(root), view=view, serve_plain=True)
    return Workspace(namespace, WriteBuffer(1 << 20, str(root.parent / "buffer")))


def put(ws: Workspace, path: str, data: bytes, close: bool = True):
    """Write `path` whole (O_TRUNC); returns the handle if it is left open."""
    handle = ws.open(ws.resolve(path), os.O_WRONLY | os.O_TRUNC)
    ws.write(handle, 0, data)
    if not close:
        return handle
    ws.flush(handle)
    ws.release(handle)
    return None


@pytest.mark.parametrize("commit", ["fsync", "sync", "commit_loop"])
@pytest.mark.parametrize("view", [View.V3, View.V2])
def test_a_crash_between_the_commit_and_the_kept_file_update_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit: str, view: View
) -> None:
    """Kept: chunks (0, 0) and (1, 1) as OLD. The next mount writes NEW to (0, 0), commits
    it and dies before the kept file is updated (with the commit loop, (1, 1) is open for
    writing and stays out of the commit). The mount after that must leave NEW in (0, 0)
    and commit the kept OLD to (1, 1). In the v2 view `b` is used: its kept files hold the
    stored chunks (with crc32c), the view serves them without."""
    source = tmp_path / "src"
    make_source(source)
    name = "a" if view is View.V3 else "b"
    key = (lambda i, j: f"a/c/{i}/{j}") if view is View.V3 else (lambda i, j: f"b/{i}/{j}")
    kept_dir = str(tmp_path / "kept")
    shard = source / name / "c" / "0" / "0"

    a = workspace(source, view)
    put(a, key(0, 0), filled(OLD))
    put(a, key(1, 1), filled(OLD))
    intact = break_index(shard)
    assert a.sync() == 1
    assert len(Leftovers(kept_dir, str(source)).save(a)) == 1
    shard.write_bytes(intact)

    b = workspace(source, view)
    Leftovers(kept_dir, str(source)).restore(b)
    crashed: list[object] = []

    def killed(*args: object) -> None:
        crashed.append(args)
        raise Killed

    monkeypatch.setattr(Leftovers, "stored", killed, raising=False)
    assert b.overlay.changes((name, (0, 0)))  # taken up
    with contextlib.suppress(Killed):
        if commit == "fsync":
            handle = b.open(b.resolve(key(0, 0)), os.O_WRONLY | os.O_TRUNC)
            b.write(handle, 0, filled(NEW))
            b.fsync(handle)
        elif commit == "sync":
            put(b, key(0, 0), filled(NEW))
            b.sync()
        else:
            put(b, key(1, 1), filled(OTHER), close=False)  # open: left for later
            put(b, key(0, 0), filled(NEW))
            b.committer.commit_due(0)
    assert chunk_values(source, name)[0, 0] == NEW  # the commit was durable
    monkeypatch.undo()

    c = workspace(source, view)
    leftovers = Leftovers(kept_dir, str(source))
    leftovers.restore(c)
    assert c.sync() == 0
    assert leftovers.save(c) == []
    values = chunk_values(source, name)
    assert values[0, 0] == NEW, f"the kept chunk rolled back committed data: {values}"
    assert values[1, 1] == OLD, values  # kept, committed by C (or already by B)
    assert values[0, 1] == values[1, 0] == INITIAL
    assert not list(Path(kept_dir).glob("*.pending"))
    assert crashed, "B was never killed between its commit and the kept file's update"


@pytest.mark.parametrize("commit", ["fsync", "sync", "commit_loop"])
def test_whatever_commits_kept_chunks_forgets_them(tmp_path: Path, commit: str) -> None:
    """No kill: once (0, 0) is committed, the kept file holds only what is still pending,
    (1, 1) while it is open for writing (commit loop), nothing otherwise (no file)."""
    source = tmp_path / "src"
    make_source(source)
    kept_dir = tmp_path / "kept"
    shard = source / "a" / "c" / "0" / "0"
    a = workspace(source, View.V3)
    put(a, "a/c/0/0", filled(OLD))
    put(a, "a/c/1/1", filled(OLD))
    intact = break_index(shard)
    assert a.sync() == 1
    Leftovers(str(kept_dir), str(source)).save(a)
    shard.write_bytes(intact)

    b = workspace(source, View.V3)
    Leftovers(str(kept_dir), str(source)).restore(b)
    if commit == "fsync":
        handle = b.open(b.resolve("a/c/0/0"), os.O_WRONLY | os.O_TRUNC)
        b.write(handle, 0, filled(NEW))
        b.fsync(handle)
        b.release(handle)
    elif commit == "sync":
        put(b, "a/c/0/0", filled(NEW))
        assert b.sync() == 0
    else:
        put(b, "a/c/1/1", filled(OTHER), close=False)  # still open when B is killed
        put(b, "a/c/0/0", filled(NEW))
        assert b.committer.commit_due(0) == 0
    files = list(kept_dir.glob("*.pending"))
    if commit != "commit_loop":
        assert files == []
        return
    assert len(files) == 1
    # B is killed now: the next mount commits the kept (1, 1), never the kept (0, 0).
    c = workspace(source, View.V3)
    Leftovers(str(kept_dir), str(source)).restore(c)
    assert c.sync() == 0
    values = chunk_values(source)
    assert values[0, 0] == NEW and values[1, 1] == OLD, values


@pytest.mark.fuse
def test_only_one_running_mount_takes_kept_chunks_up(tmp_path: Path) -> None:
    """Two read-write mounts of one source, kept chunks waiting: only the first takes them
    up. Were both to, the second would commit the kept (older) bytes at its unmount, over
    what the first committed since. The second keeps what it cannot commit itself in a file
    of its own, never over the first's; the next mount takes both up."""
    source, spool = tmp_path / "src", tmp_path / "spool"
    make_source(source)
    shard = source / "a" / "c" / "0" / "0"
    shard.write_bytes(keep_chunks(tmp_path, source, spool, [KEY]))
    options = ("rw", "flush_interval=600", f"spool={spool}")
    first = start_mount(source, tmp_path / "mntB", tmp_path / "B.log", *options)
    second = start_mount(source, tmp_path / "mntC", tmp_path / "C.log", *options)
    try:
        assert (first.path / KEY).read_bytes() == filled(OLD)
        assert (second.path / KEY).read_bytes() == filled(INITIAL), "taken up twice"
        assert "are with another running mount of this source" in second.log()
        with open(first.path / KEY, "r+b") as f:
            f.write(filled(NEW))
            f.flush()
            os.fsync(f.fileno())
        assert chunk_values(source)[0, 0] == NEW
        assert not kept_files(spool), "committed kept chunks leave their file"
        # The second mount writes another chunk of the same shard, which it cannot commit.
        (second.path / "a/c/1/1").write_bytes(filled(OTHER))
        (first.path / "a/c/0/1").write_bytes(filled(OLD))
        intact = break_index(shard)
        stop_mount(second)
        assert second.process.returncode == 1, second.log()
        shard.write_bytes(intact)
        stop_mount(first)  # commits (0, 1)
        assert first.process.returncode == 0, first.log()
    finally:
        stop_mount(second)
        stop_mount(first)
    assert len(kept_files(spool)) == 1
    assert chunk_values(source).tolist() == [[NEW, OLD], [INITIAL, INITIAL]]
    last = start_mount(source, tmp_path / "mntD", tmp_path / "D.log", *options)
    stop_mount(last)
    assert last.process.returncode == 0, last.log()
    assert chunk_values(source).tolist() == [[NEW, OLD], [INITIAL, OTHER]]
    assert not kept_files(spool)
