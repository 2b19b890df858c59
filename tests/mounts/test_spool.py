"""The spool: spill files are private to one daemon, made exclusively, removed at exit.

Several mounts may share one `spool=DIR`, and a daemon killed with SIGKILL leaves its
spill files behind: neither may ever make a daemon read bytes that are not its own.
Each buffer keeps its files in a private directory in DIR, which it locks for its life;
the next buffer on DIR removes those whose lock it can take (their daemon is gone).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest
import zarr

from shardfs.writeback.buffer import WriteBuffer
from tests.conftest import one_shard_array, stop_mount

CHUNK = 512 * 1024  # one inner chunk of the sources below (uint8, 512 x 1024)
OPTIONS = ("rw", "write_buffer=768K", "flush_interval=600")


def _source(path: Path) -> Path:
    """A source as zarr-python 3 writes it: one shard of 2 x 2 inner chunks, all 7."""
    one_shard_array(path, "a", (1024, 2048), (512, 1024), 7)
    return path


def _write(path: Path, value: int, size: int = CHUNK) -> None:
    with open(path, "wb") as f:
        f.write(bytes([value]) * size)


def _private_dirs(spool: Path) -> list[Path]:
    return sorted(p for p in spool.iterdir() if p.name.startswith("shardfs-spool-"))


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"\bERROR\b", line)]


# -- through real mounts ------------------------------------------------------------------


@pytest.mark.fuse
def test_mounts_sharing_a_spool_keep_their_own_bytes(tmp_path: Path, mount) -> None:
    """Two sources mounted with one `spool=DIR`: both spill, each reads back and stores
    its own bytes, and each removes only its own spool files at exit."""
    spool = tmp_path / "spool"
    (spool / "pending").mkdir(parents=True)
    (spool / "pending" / "other").write_bytes(b"kept chunks of other code")
    sources = {name: _source(tmp_path / f"src-{name}") for name in ("A", "B")}
    mounts = {name: mount(src, *OPTIONS, f"spool={spool}") for name, src in sources.items()}
    values = {"A": (0xA1, 0xA2), "B": (0xB1, 0xB2)}

    with contextlib.ExitStack() as stack:
        held = {}  # c/0/0 stays open, so its bytes stay buffered (and are spilled) until closed
        for name, mounted in mounts.items():
            first, second = values[name]
            chunks = mounted.path / "a" / "c" / "0"
            held[name] = stack.enter_context(open(chunks / "0", "w+b"))
            held[name].write(bytes([first]) * CHUNK)
            held[name].flush()
            _write(chunks / "1", second)  # 1 MiB buffered > 768 KiB: c/0/0 spills
        assert list(spool.rglob("*.blob")), "nothing was spilled"
        for name, mounted in mounts.items():
            first, second = values[name]
            chunks = mounted.path / "a" / "c" / "0"
            assert (chunks / "0").read_bytes() == bytes([first]) * CHUNK, name
            assert os.pread(held[name].fileno(), CHUNK, 0) == bytes([first]) * CHUNK, name
            assert (chunks / "1").read_bytes() == bytes([second]) * CHUNK, name

    for mounted in mounts.values():
        mounted.stop()
        assert mounted.process.returncode == 0, mounted.log()
        assert not _errors(mounted.log()), mounted.log()
    for name, src in sources.items():
        first, second = values[name]
        stored = zarr.open_array(str(src / "a"), mode="r")[...]
        assert (stored[:512, :1024] == first).all(), name
        assert (stored[:512, 1024:] == second).all(), name
        assert (stored[512:, :] == 7).all(), name
    assert not _private_dirs(spool)  # each daemon removed its own directory at exit
    assert (spool / "pending" / "other").read_bytes() == b"kept chunks of other code"


@pytest.mark.fuse
def test_a_killed_daemons_spill_files_are_never_reused(tmp_path: Path, mount) -> None:
    """After a SIGKILL the next daemon on the same spool never reads the dead one's spill
    files: a chunk file grown by truncate shows zeros, and the dead one's directory goes."""
    spool = tmp_path / "spool"
    src = _source(tmp_path / "src")
    killed = mount(src, *OPTIONS, f"spool={spool}")
    # Scratch files are never committed: both stay buffered, and the first one spills.
    _write(killed.path / "scratch-1", 0xEE)
    _write(killed.path / "scratch-2", 0xEF)
    stale = list(spool.rglob("*.blob"))
    assert stale, "nothing was spilled"
    before = _private_dirs(spool)
    killed.process.kill()
    killed.process.wait(timeout=15)
    stop_mount(killed)  # clears the mount the dead daemon left
    assert all(path.exists() for path in stale)  # SIGKILL: nothing was cleaned up

    again = mount(src, *OPTIONS, f"spool={spool}")
    chunk = again.path / "a" / "c" / "0" / "0"
    fd = os.open(chunk, os.O_RDWR | os.O_TRUNC)
    try:
        os.write(fd, b"\x33" * 100)
        _write(again.path / "scratch-3", 0x44)  # spills c/0/0, the least recently grown
        _write(again.path / "scratch-4", 0x45)
        assert list(spool.rglob("*.blob"))
        os.ftruncate(fd, CHUNK)
        grown = os.pread(fd, CHUNK, 0)
        assert grown[:100] == b"\x33" * 100
        assert grown[100:] == bytes(CHUNK - 100)  # zeros, not the dead daemon's bytes
        assert chunk.read_bytes() == grown
    finally:
        os.close(fd)
    now = _private_dirs(spool)
    assert len(now) == 1 and now[0] not in before  # the dead one's directory was swept
    assert not any(path.exists() for path in stale)
    again.stop()
    assert again.process.returncode == 0, again.log()
    assert not _private_dirs(spool)
    stored = zarr.open_array(str(src / "a"), mode="r")[...]
    assert (stored[:512, :1024].ravel()[:100] == 0x33).all()
    assert (stored[:512, :1024].ravel()[100:] == 0).all()
    assert (stored[512:, :] == 7).all()


# -- the buffer alone ---------------------------------------------------------------------


def _spilled(buffer: WriteBuffer, value: int) -> list:
    """Three blobs of 100 bytes in a buffer of 150: the first two spill."""
    blobs = [buffer.new(bytes([value + i]) * 100) for i in range(3)]
    assert buffer.spilled == 200
    return blobs


def test_buffers_on_one_spool_never_share_files(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    foreign = {
        "0.blob": b"left by an older shardfs",
        "1.blob": b"x" * 1000,
        "pending/ID/abc.pending": b"kept chunks",
        "shardfs-spool-old/0.blob": b"an older shardfs's own directory",
    }
    for name, data in foreign.items():
        (spool / name).parent.mkdir(parents=True, exist_ok=True)
        (spool / name).write_bytes(data)

    one, two = WriteBuffer(150, str(spool)), WriteBuffer(150, str(spool))
    blobs_one, blobs_two = _spilled(one, 0x10), _spilled(two, 0x20)
    paths_one = {blob._spool for blob in blobs_one[:2]}
    paths_two = {blob._spool for blob in blobs_two[:2]}
    assert None not in paths_one | paths_two
    assert not paths_one & paths_two
    assert one.spool_dir != two.spool_dir
    assert {os.path.dirname(p) for p in paths_one} == {one.spool_dir}
    assert {os.path.dirname(p) for p in paths_two} == {two.spool_dir}
    assert os.stat(one.spool_dir).st_mode & 0o777 == 0o700
    for blobs, value in ((blobs_one, 0x10), (blobs_two, 0x20)):
        for i, blob in enumerate(blobs):
            assert blob.getvalue() == bytes([value + i]) * 100

    # Grown by truncate, a spilled blob shows zeros, never what a file there held before.
    blobs_one[0].truncate(1000)
    assert blobs_one[0].getvalue() == b"\x10" * 100 + bytes(900)
    blobs_two[1].write(0, b"\x99" * 10)
    assert blobs_one[1].getvalue() == b"\x11" * 100
    assert blobs_two[1].getvalue() == b"\x99" * 10 + b"\x21" * 90

    one.close()
    assert not os.path.exists(one.spool_dir)
    assert os.path.isdir(two.spool_dir)
    for blob, value in zip(blobs_two, (0x20, 0x21, 0x22), strict=True):
        assert blob.getvalue()[-1:] == bytes([value])  # the other buffer goes on
    two.close()
    assert not os.path.exists(two.spool_dir)
    for name, data in foreign.items():  # nothing that is not a buffer's own was touched
        assert (spool / name).read_bytes() == data
    assert sorted(p.name for p in spool.iterdir()) == [
        "0.blob",
        "1.blob",
        "pending",
        "shardfs-spool-old",
    ]


def test_a_dead_buffers_directory_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    live, dead = WriteBuffer(150, str(spool)), WriteBuffer(150, str(spool))
    _spilled(live, 0x10)
    _spilled(dead, 0x20)
    os.close(dead._dir_fd)  # as if its daemon were killed: its lock goes, its files stay
    assert os.listdir(dead.spool_dir)

    new = WriteBuffer(150, str(spool))
    assert not os.path.exists(dead.spool_dir)  # swept
    assert os.listdir(live.spool_dir)  # its owner still holds the lock
    assert {p.name for p in _private_dirs(spool)} == {
        os.path.basename(live.spool_dir),
        os.path.basename(new.spool_dir),
    }
    live.close()
    new.close()
    assert not _private_dirs(spool)


def test_a_spool_file_that_vanished_is_an_error(tmp_path: Path) -> None:
    """A spill file must never be made again behind a blob's back (it would read zeros)."""
    from shardfs.primitives.errors import StorageError

    buffer = WriteBuffer(150, str(tmp_path / "spool"))
    blob = _spilled(buffer, 0x10)[0]
    assert blob._spool is not None
    os.unlink(blob._spool)
    with pytest.raises(StorageError, match="spool file"):
        blob.write(0, b"x")
    with pytest.raises(StorageError, match="spool file"):
        blob.read(0, 10)
    buffer.close()
