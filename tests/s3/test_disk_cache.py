"""The persistent disk cache (`-o cache_dir`): blocks of object versions kept across mounts.

First the cache alone, with a fetch function standing in for the store; then an
S3 storage and real mounts through the counting proxy: a remount sends no data
GET for what the first mount read, a replaced object is never served from the
cache, two mounts share one cache directory, damaged cache files are dropped.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
import zarr

from shardfs.fuse.mounts import mount_type
from shardfs.options import parse_options
from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import CorruptData, UsageError
from shardfs.sources import open_disk_cache
from shardfs.storage import disk_cache
from shardfs.storage.disk_cache import DiskCache
from shardfs.storage.s3 import S3Config, S3Storage
from tests.conftest import Mounted
from tests.mounts.test_cli import daemons_for, run, wait_gone
from tests.support.s3 import S3Env

BLOCK = 64 << 10  # small blocks: the tests read several of each object


def content(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


class Source:
    """An object to fetch from, counting the fetches."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fetches: list[tuple[int, int]] = []

    def fetch(self, offset: int, length: int) -> tuple[bytes, int]:
        self.fetches.append((offset, length))
        return self.data[offset : offset + length], len(self.data)


def value_files(directory: Path) -> list[Path]:
    """The block files of a cache directory."""
    return sorted(directory.glob("blocks/??/*"))


def test_reads_are_assembled_from_blocks_kept_across_instances(tmp_path: Path) -> None:
    data = content(5 * BLOCK + 123)
    source = Source(data)
    cache = DiskCache(str(tmp_path), 1 << 30, BLOCK)
    for offset, length in [(10, 100), (BLOCK - 5, 10), (0, len(data)), (len(data) - 7, 7)]:
        assert cache.read("obj", "v1", offset, length, source.fetch) == data[offset:][:length]
    # The first read fetched block 0, the second block 1, the third the rest in one run.
    assert source.fetches == [(0, BLOCK), (BLOCK, BLOCK), (2 * BLOCK, 4 * BLOCK)]
    cache.close()
    again = DiskCache(str(tmp_path), 1 << 30, BLOCK)  # a remount
    source.fetches.clear()
    assert again.read("obj", "v1", 0, len(data), source.fetch) == data
    assert source.fetches == []
    assert again.stats.hits == 6 and again.stats.misses == 0
    with pytest.raises(CorruptData):
        again.read("obj", "v1", len(data) - 1, 2, source.fetch)


def test_another_version_is_never_served_old_blocks(tmp_path: Path) -> None:
    cache = DiskCache(str(tmp_path), 1 << 30, BLOCK)
    old, new = Source(content(2 * BLOCK, 1)), Source(content(2 * BLOCK, 2))
    assert cache.read("obj", '"etag-1"', 0, 2 * BLOCK, old.fetch) == old.data
    assert cache.read("obj", '"etag-2"', 0, 2 * BLOCK, new.fetch) == new.data
    assert new.fetches == [(0, 2 * BLOCK)]
    assert cache.read("other", '"etag-1"', 0, 10, new.fetch) == new.data[:10]


@pytest.mark.parametrize("damage", ["truncate", "flip", "extend", "remove"])
def test_a_damaged_block_is_dropped_and_fetched_again(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    data = content(3 * BLOCK, 3)
    source = Source(data)
    DiskCache(str(tmp_path), 1 << 30, BLOCK).read("obj", "v", 0, len(data), source.fetch)
    files = value_files(tmp_path)
    assert len(files) == 3
    victim = files[1]
    if damage == "truncate":  # a power loss before the file's pages were written
        os.truncate(victim, victim.stat().st_size // 2)
    elif damage == "flip":
        raw = bytearray(victim.read_bytes())
        raw[-1] ^= 0xFF
        victim.write_bytes(bytes(raw))
    elif damage == "extend":  # a file reused or written twice: right bytes, then more
        victim.write_bytes(victim.read_bytes() + b"\0")
    else:
        victim.unlink()
    source.fetches.clear()
    cache = DiskCache(str(tmp_path), 1 << 30, BLOCK)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        assert cache.read("obj", "v", 0, len(data), source.fetch) == data
    assert len(source.fetches) == 1, "only the damaged block is fetched again"
    dropped = [r for r in caplog.records if "damaged block" in r.getMessage()]
    assert len(dropped) == (0 if damage == "remove" else 1)
    source.fetches.clear()
    assert cache.read("obj", "v", 0, len(data), source.fetch) == data
    assert source.fetches == [], "the block fetched again was kept"


def test_held_spans_are_whole_blocks_all_held(tmp_path: Path) -> None:
    """`held_span` tells a reader which blocks it can read without a request, and counts
    nothing: it is a question, not a read."""
    data = content(4 * BLOCK + 10, 4)
    cache = DiskCache(str(tmp_path), 1 << 30, BLOCK)
    assert cache.held_span("obj", "v", 0, 10) is None
    source = Source(data)
    cache.read("obj", "v", BLOCK + 5, 10, source.fetch)  # block 1
    cache.read("obj", "v", 3 * BLOCK, BLOCK + 10, source.fetch)  # blocks 3 and 4
    assert cache.held_span("obj", "v", BLOCK + 100, 50) == (BLOCK, 2 * BLOCK)
    assert cache.held_span("obj", "v", 3 * BLOCK - 1, 2) is None  # block 2 is missing
    assert cache.held_span("obj", "v", 3 * BLOCK + 1, BLOCK + 9) == (3 * BLOCK, 5 * BLOCK)
    assert cache.held_span("obj", "v2", BLOCK, 1) is None  # another version
    assert cache.held_span("obj", "v", BLOCK, 0) is None
    assert (cache.stats.hits, cache.stats.misses) == (0, 3)  # the three blocks fetched
    # What a reader then reads of a held span comes from disk, exact.
    assert cache.read("obj", "v", 3 * BLOCK, BLOCK + 10, Source(b"").fetch) == data[3 * BLOCK :]


def test_the_size_is_respected(tmp_path: Path) -> None:
    size = 20 * BLOCK
    cache = DiskCache(str(tmp_path), size, BLOCK)
    for n in range(10):
        source = Source(content(8 * BLOCK, n))
        assert cache.read(f"obj{n}", "v", 0, 8 * BLOCK, source.fetch) == source.data
        on_disk = sum(f.stat().st_size for f in value_files(tmp_path))
        assert on_disk <= size + BLOCK, (n, on_disk)
    # The least recently used went first: the last object is whole.
    last = Source(content(8 * BLOCK, 9))
    assert cache.read("obj9", "v", 0, 8 * BLOCK, last.fetch) == last.data
    assert last.fetches == []


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small file system of our own at `path` (mode 0700), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill_up(directory: Path) -> None:
    """Write a file in `directory` until its file system is full."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


def cache_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]


def test_a_full_disk_degrades_to_no_caching_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Full is reported as full (never as damage), once per pause, and reads stay right;
    the next open of the full directory reads what it holds."""
    with tmpfs(tmp_path / "small", "512k") as small:
        cache = DiskCache(str(small), 1 << 30, BLOCK)
        sources = [Source(content(4 * BLOCK, n)) for n in range(4)]  # 1 MiB in all
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            for n, source in enumerate(sources):
                assert cache.read(f"obj{n}", "v", 0, 4 * BLOCK, source.fetch) == source.data
        assert cache.stats.failures >= 1
        lines = cache_lines(caplog)
        assert len(lines) == 1, lines
        assert f"disk cache {small}: writing failed: the file system is full" in lines[0]
        assert "no caching for 60 s" in lines[0]
        cache.close()
        assert not list((small / "tmp").iterdir()), "no temporary file is left"
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            again = DiskCache(str(small), 1 << 30, BLOCK)
            for n, source in enumerate(sources):
                assert again.read(f"obj{n}", "v", 0, 4 * BLOCK, source.fetch) == source.data
        assert again.stats.hits >= 1, "what the first one kept is read"
        assert not any("damaged" in line for line in cache_lines(caplog))
        again.close()


def test_a_cache_on_a_full_file_system_is_refused_as_full(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "small", "64k") as small:
        fill_up(small)
        options = parse_options([f"cache_dir={small / 'cache'}"])
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            assert open_disk_cache(options) is None
        assert cache_lines(caplog) == [
            f"cache_dir {small / 'cache'}: the file system is full; going on without the disk cache"
        ]


def test_a_cache_on_a_read_only_file_system_is_refused_as_read_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only file system is reported as read-only, both for a cache that is there
    already and for one that cannot be made."""
    with tmpfs(tmp_path / "ro", "4m") as fs:
        source = Source(content(2 * BLOCK))
        held = DiskCache(str(fs / "held"), 1 << 30, BLOCK)
        held.read("obj", "v", 0, 10, source.fetch)
        held.close()
        remount_read_only(fs)
        for name in ("held", "new"):
            options = parse_options([f"cache_dir={fs / name}"])
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="shardfs"):
                assert open_disk_cache(options) is None
            lines = cache_lines(caplog)
            assert len(lines) == 1 and lines[0].startswith(f"cache_dir {fs / name}: "), lines
            assert "read-only" in lines[0].lower() and "damaged" not in lines[0], lines
            assert lines[0].endswith("; going on without the disk cache")


def rows(directory: Path) -> list[tuple]:
    db = sqlite3.connect(directory / "blocks.db")
    try:
        return db.execute("SELECT key, crc, length, size, used FROM block").fetchall()
    finally:
        db.close()


def tamper(directory: Path, *statements: tuple) -> None:
    """Change the database behind the cache's back, as someone who can write it could."""
    db = sqlite3.connect(directory / "blocks.db")
    try:
        for statement in statements:
            db.execute(*statement)
        db.commit()
    finally:
        db.close()


class Planted:
    """A pickle that, if anyone ever unpickled it, would leave a file behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_nothing_read_back_from_the_database_is_executed_or_used_as_a_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """t4 D and E on our schema: rows holding pickles, keys like `../victim` or of the
    wrong length, text where integers belong. Nothing is run, no file outside the cache
    is touched, reads stay right, and such rows go when evicted or tidied."""
    cache_dir, victim = tmp_path / "cache", tmp_path / "victim"
    victim.write_text("important")
    (tmp_path / "victim-dir").mkdir()
    marker = tmp_path / "PWNED"
    data = content(6 * BLOCK, 6)
    source = Source(data)
    cache = DiskCache(str(cache_dir), 8 * BLOCK, BLOCK)
    assert cache.read("obj", "v", 0, len(data), source.fetch) == data
    cache.close()
    pickled = pickle.dumps(Planted(marker))
    tamper(
        cache_dir,
        # Real rows with a pickle, text or a float where integers belong.
        ("UPDATE block SET crc = ? WHERE key IN (SELECT key FROM block LIMIT 1)", (pickled,)),
        (
            "UPDATE block SET length = 'os.system' WHERE key IN (SELECT key FROM block LIMIT 1 OFFSET 1)",
        ),
        ("UPDATE block SET size = 1.5 WHERE key IN (SELECT key FROM block LIMIT 1 OFFSET 2)",),
        # Rows no key makes, the oldest of all, so eviction meets them first.
        *[
            ("INSERT INTO block VALUES (?, 1, 1, 1, 0)", (key,))
            for key in (b"../victim", "../victim", b"../../" + b"x" * 26, b"\0" * 31, pickled)
        ],
        ("INSERT INTO block VALUES (?, 1, ?, 1, 0)", (b"\xff" * 33, pickled)),
        ("INSERT INTO block VALUES (?, ?, 1, 1, 'text')", (b"\xee" * 32, pickled)),
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    again = DiskCache(str(cache_dir), 8 * BLOCK, BLOCK)
    source.fetches.clear()
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        assert again.read("obj", "v", 0, len(data), source.fetch) == data
        # Enough new blocks to evict everything that was there, the odd rows first.
        for n in range(3):
            other = Source(content(4 * BLOCK, 10 + n))
            assert again.read(f"other{n}", "v", 0, 4 * BLOCK, other.fetch) == other.data
    dropped = [line for line in cache_lines(caplog) if "damaged block" in line]
    assert len(dropped) == 3, dropped  # the three real rows with odd values
    assert len(source.fetches) == 1
    assert not marker.exists(), "nothing was unpickled"
    assert victim.read_text() == "important" and (tmp_path / "victim-dir").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    again.close()
    odd = [row for row in rows(cache_dir) if not (type(row[0]) is bytes and len(row[0]) == 32)]
    assert odd == [], "eviction deleted the rows whose keys are no key of ours"
    # Tidying deletes what eviction did not reach: a row with text for its recency.
    tamper(cache_dir, ("UPDATE meta SET value = 0 WHERE name = 'tidied'",))
    DiskCache(str(cache_dir), 8 * BLOCK, BLOCK).close()
    assert all(all(type(v) is int for v in row[1:]) for row in rows(cache_dir))
    assert not marker.exists()


@pytest.mark.parametrize("forgery", ["other-bytes", "forged-header", "symlink", "fifo"])
def test_a_forged_block_file_is_dropped_and_fetched_again(
    tmp_path: Path, forgery: str, caplog: pytest.LogCaptureFixture
) -> None:
    """t4 C on our schema: the CRC32C and length are in the row, so a block file with
    other bytes (with a header claiming their CRC32C, as the old format had) does not
    check out; a symlink at a block's name is not followed, even to the right bytes;
    a FIFO there does not hang the read."""
    cache_dir = tmp_path / "cache"
    data = content(2 * BLOCK, 7)
    source = Source(data)
    DiskCache(str(cache_dir), 1 << 30, BLOCK).read("obj", "v", 0, len(data), source.fetch)
    target = value_files(cache_dir)[0]
    elsewhere = tmp_path / "elsewhere"
    if forgery == "other-bytes":
        target.write_bytes(b"A" * target.stat().st_size)
    elif forgery == "forged-header":
        fake = b"A" * (target.stat().st_size - 12)
        target.write_bytes(struct.pack("<IQ", crc32c.crc32c(fake), len(data)) + fake)
    elif forgery == "symlink":
        elsewhere.write_bytes(target.read_bytes())  # the right bytes, but not ours
        target.unlink()
        target.symlink_to(elsewhere)
    else:
        target.unlink()
        os.mkfifo(target)
    source.fetches.clear()
    cache = DiskCache(str(cache_dir), 1 << 30, BLOCK)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        assert cache.read("obj", "v", 0, len(data), source.fetch) == data
    assert len(source.fetches) == 1 and cache.stats.dropped == 1
    assert len([line for line in cache_lines(caplog) if "damaged block" in line]) == 1
    if forgery == "symlink":
        assert elsewhere.exists(), "the file it pointed to is left alone"
    assert target.is_file() and not target.is_symlink()
    source.fetches.clear()
    assert cache.read("obj", "v", 0, len(data), source.fetch) == data
    assert source.fetches == [] and cache.stats.hits == 3


def modes(directory: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(directory.stat().st_mode)}
    for path in directory.rglob("*"):
        found[str(path.relative_to(directory))] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.mark.parametrize("umask", [0, 0o022, 0o277])
def test_what_the_cache_makes_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    """t7 b: directories 0700, files 0600 (the database, its WAL and shared memory, the
    lock, the blocks), so no other user can read cached objects."""
    old = os.umask(umask)
    try:
        cache = DiskCache(str(tmp_path / "a" / "cache"), 1 << 30, BLOCK)
        source = Source(content(3 * BLOCK, 8))
        cache.read("obj", "v", 0, 3 * BLOCK, source.fetch)
        found = modes(tmp_path / "a" / "cache")
        cache.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert {"blocks.db", "blocks.db-wal", "blocks.db-shm", "lock", "blocks", "tmp"} <= set(found)
    assert len(value_files(tmp_path / "a" / "cache")) == 3
    for name, mode in found.items():
        is_dir = (tmp_path / "a" / "cache" / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), (name, oct(mode))


def test_a_cache_dir_anyone_else_could_change_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A group- or other-writable directory of our own, one below such a directory, and a
    symlink: one line naming the path and the reason, and no disk cache; nothing is
    made in them."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o770)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    cases = {
        shared: "is writable by group or others (mode 0770)",
        open_to_all
        / "cache": f"the directory {open_to_all} above it is writable by group or others",
        link: "is a symbolic link",
    }
    for path, reason in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            assert open_disk_cache(parse_options([f"cache_dir={path}"])) is None
        lines = cache_lines(caplog)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"cache_dir {path}: ") and reason in lines[0], lines
        assert lines[0].endswith("; going on without the disk cache")
    assert os.listdir(shared) == [] and os.listdir(real) == []
    assert os.listdir(open_to_all / "cache") == [], "nothing is made in it"


def test_a_cache_dir_another_user_made_first_is_refused(
    users, public_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """t7 a / t11: another user makes the directory first (in a directory like /tmp, or
    one of their own they let us into): the daemon (root here) does not use it."""
    _, attacker = users
    squat = public_dir / "shardfs-cache"
    private = public_dir / "private"
    for path, mode in ((squat, 0o777), (private, 0o700)):
        done = attacker.run(f"import os; os.mkdir({str(path)!r}); os.chmod({str(path)!r}, {mode})")
        assert done.returncode == 0, done.stderr
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            assert open_disk_cache(parse_options([f"cache_dir={path}"])) is None
        lines = cache_lines(caplog)
        assert len(lines) == 1, lines
        assert (
            f"cache_dir {path}: is owned by uid {attacker.uid}, not by the daemon's user"
            in lines[0]
        )
        assert os.listdir(path) == [], "nothing is made in it"
    # A cache of ours, as another user sees it: nothing to list, nothing to read.
    mine = public_dir / "mine"
    cache = DiskCache(str(mine), 1 << 30, BLOCK)
    cache.read("obj", "v", 0, 10, Source(content(BLOCK, 9)).fetch)
    block = value_files(mine)[0]
    cache.close()
    done = attacker.run(
        f"""
import os
for path in ({str(mine)!r}, {str(block)!r}):
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").read()
        print("read", path)
    except PermissionError:
        print("refused")
"""
    )
    assert done.stdout.split() == ["refused", "refused"], (done.stdout, done.stderr)


def test_a_damaged_database_starts_the_cache_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """t4 F: a database that is not SQLite, or SQLite with another schema (a trigger
    added, diskcache's tables): one line saying so, and the cache starts afresh,
    removing only its own files."""
    cache_dir = tmp_path / "cache"
    data = content(3 * BLOCK, 11)
    for damage in ("garbage", "trigger", "other-schema"):
        source = Source(data)
        DiskCache(str(cache_dir), 1 << 30, BLOCK).read("obj", "v", 0, len(data), source.fetch)
        (cache_dir / "blocks" / "notes.txt").write_text("not ours")
        if damage == "garbage":
            for suffix in ("-wal", "-shm"):
                (cache_dir / f"blocks.db{suffix}").unlink(missing_ok=True)
            with open(cache_dir / "blocks.db", "r+b") as file:
                file.write(os.urandom(4096))
        elif damage == "trigger":
            tamper(
                cache_dir,
                ("CREATE TRIGGER t AFTER INSERT ON block BEGIN DELETE FROM meta; END",),
            )
        else:
            tamper(cache_dir, ("DROP TABLE block",), ("CREATE TABLE Cache (key, value)",))
        caplog.clear()
        source.fetches.clear()
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            cache = DiskCache(str(cache_dir), 1 << 30, BLOCK)
            assert value_files(cache_dir) == [], "its blocks went with it"
            assert cache.read("obj", "v", 0, len(data), source.fetch) == data
        lines = cache_lines(caplog)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"cache_dir {cache_dir}: its database ")
        assert lines[0].endswith("; starting the cache afresh"), lines
        assert "damaged" in lines[0] or "another schema" in lines[0]
        assert len(source.fetches) == 1
        assert (cache_dir / "blocks" / "notes.txt").read_text() == "not ours"
        cache.close()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            again = DiskCache(str(cache_dir), 1 << 30, BLOCK)
            assert again.read("obj", "v", 0, len(data), source.fetch) == data
        assert cache_lines(caplog) == [] and again.stats.hits == 3
        again.close()


def test_a_database_damaged_while_running_ends_caching_and_the_next_open_starts_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir = tmp_path / "cache"
    data = content(2 * BLOCK, 12)
    cache = DiskCache(str(cache_dir), 1 << 30, BLOCK)
    source = Source(data)
    cache.read("obj", "v", 0, BLOCK, source.fetch)
    cache._drop_connections()  # as a fork does: the next call connects again
    for suffix in ("-wal", "-shm"):
        (cache_dir / f"blocks.db{suffix}").unlink(missing_ok=True)
    with open(cache_dir / "blocks.db", "r+b") as file:
        file.write(os.urandom(4096))
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        for _ in range(3):
            assert cache.read("obj", "v", 0, len(data), source.fetch) == data
    lines = cache_lines(caplog)
    assert len(lines) == 1 and "damaged" in lines[0], lines
    assert "going on without the disk cache (the next mount starts it afresh)" in lines[0]
    cache.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        again = DiskCache(str(cache_dir), 1 << 30, BLOCK)
        assert again.read("obj", "v", 0, len(data), source.fetch) == data
    assert [line for line in cache_lines(caplog) if "afresh" in line], cache_lines(caplog)
    again.close()


def test_hits_write_their_recency_seldom_and_eviction_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hit writes nothing at once; recency is written at most once per TOUCH seconds,
    and the least recently used (read, not written) block is evicted first."""
    cache = DiskCache(str(tmp_path), 3 * BLOCK, BLOCK)
    sources = {name: Source(content(BLOCK, n)) for n, name in enumerate("abcd")}
    for name in "abc":
        cache.read(name, "v", 0, BLOCK, sources[name].fetch)
    written = rows(tmp_path)
    for _ in range(20):
        cache.read("a", "v", 0, BLOCK, sources["a"].fetch)
    assert rows(tmp_path) == written, "hits within TOUCH seconds wrote nothing"
    cache.close()
    monkeypatch.setattr(disk_cache, "TOUCH", 0.0)
    cache = DiskCache(str(tmp_path), 3 * BLOCK, BLOCK)
    cache.read("a", "v", 0, BLOCK, sources["a"].fetch)  # "a" is now the most recent
    cache.read("d", "v", 0, BLOCK, sources["d"].fetch)  # evicts one: "b"
    for name in "acd":
        sources[name].fetches.clear()
        assert cache.read(name, "v", 0, BLOCK, sources[name].fetch) == sources[name].data
        assert sources[name].fetches == [], name
    assert cache.held_span("b", "v", 0, 1) is None
    cache.close()


def _fill_until_killed(directory: str, reads: Any) -> None:
    cache = DiskCache(directory, 24 * BLOCK, BLOCK)  # smaller than what is read: evictions
    n = 0
    while True:
        source = Source(content(5 * BLOCK, n % 40))
        cache.read(f"obj{n % 40}", "v", 0, 5 * BLOCK, source.fetch)
        n += 1
        reads.value = n  # a plain store: a lock held at the kill would hang the test


def test_killed_writers_leave_nothing_wrong_and_tidying_removes_their_debris(
    tmp_path: Path,
) -> None:
    """A process killed at any instant while it fills and evicts: the next reads are
    right; files no row names and temporary files are removed by tidying once old
    enough; the byte total is the sum of the rows again."""
    context = multiprocessing.get_context("spawn")
    reads = context.Value("i", 0, lock=False)  # one writer, killed at any instant
    for attempt in range(4):
        reads.value = 0
        process = context.Process(target=_fill_until_killed, args=(str(tmp_path), reads))
        process.start()
        deadline = time.monotonic() + 60
        while reads.value < 8 and time.monotonic() < deadline:
            time.sleep(0.01)  # until it is filling (and evicting, after the first round)
        time.sleep(0.05 + 0.13 * attempt)
        os.kill(process.pid, signal.SIGKILL)  # ours, by PID
        process.join(30)
    stray = tmp_path / "tmp" / ("0" * 32)  # what a kill while writing leaves
    stray.write_bytes(b"partial")
    orphan = tmp_path / "blocks" / "00" / ("1" * 62)  # a kill between rename and insert
    orphan.parent.mkdir(mode=0o700, exist_ok=True)
    orphan.write_bytes(b"x" * BLOCK)
    cache = DiskCache(str(tmp_path), 24 * BLOCK, BLOCK)
    for n in range(40):
        source = Source(content(5 * BLOCK, n))
        assert cache.read(f"obj{n}", "v", 0, 5 * BLOCK, source.fetch) == source.data
    cache.close()
    assert stray.exists() and orphan.exists(), "too young to be debris"
    old = time.time() - 2 * disk_cache.GRACE
    for path in [stray, *value_files(tmp_path)]:
        os.utime(path, (old, old))
    tamper(tmp_path, ("UPDATE meta SET value = 0 WHERE name = 'tidied'",))
    DiskCache(str(tmp_path), 24 * BLOCK, BLOCK).close()
    assert not stray.exists() and not orphan.exists()
    held = {row[0].hex() for row in rows(tmp_path)}
    on_disk = {p.parent.name + p.name for p in value_files(tmp_path)}
    assert on_disk <= held, "every block file has its row"
    db = sqlite3.connect(tmp_path / "blocks.db")
    total = db.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()[0]
    assert total == db.execute("SELECT sum(length) FROM block").fetchone()[0] <= 24 * BLOCK
    db.close()


def test_the_cache_of_an_earlier_version_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """python-diskcache's database and value files go (once); nothing else does."""
    (tmp_path / "cache.db").write_bytes(b"SQLite format 3\0")
    (tmp_path / "cache.db-wal").write_bytes(b"")
    values = tmp_path / "ab" / "cd"
    values.mkdir(parents=True)
    for n in range(3):
        (values / f"{n:028x}.val").write_bytes(b"old")
    (values / "keep.txt").write_text("not ours")
    (tmp_path / "ef" / "01").mkdir(parents=True)
    ((tmp_path / "ef" / "01") / f"{9:028x}.val").write_bytes(b"old")
    with caplog.at_level(logging.INFO, logger="shardfs"):
        DiskCache(str(tmp_path), 1 << 30, BLOCK).close()
    assert [line for line in cache_lines(caplog) if "earlier shardfs" in line] == [
        f"disk cache {tmp_path}: removed the cache of an earlier shardfs (python-diskcache: "
        "its database and 4 blocks)"
    ]
    left = sorted(p.name for p in tmp_path.iterdir() if "-" not in p.name)  # not -wal, -shm
    assert left == ["ab", "blocks", "blocks.db", "lock", "tmp"]
    assert [p.name for p in values.iterdir()] == ["keep.txt"]


def _reader(directory: str, rounds: int, errors: multiprocessing.Queue) -> None:
    cache = DiskCache(directory, 12 * BLOCK, BLOCK)  # smaller than what is read: evictions
    try:
        for n in range(rounds):
            seed = n % 5
            source = Source(content(3 * BLOCK + 17, seed))
            offset = (n * 7919) % len(source.data)
            length = min(2 * BLOCK, len(source.data) - offset)
            got = cache.read(f"obj{seed}", "v", offset, length, source.fetch)
            if got != source.data[offset : offset + length]:
                errors.put(f"wrong bytes of obj{seed} at {offset}")
    except Exception as e:  # reported to the test
        errors.put(repr(e))


def test_two_processes_share_one_directory(tmp_path: Path) -> None:
    errors: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    context = multiprocessing.get_context("spawn")
    readers = [context.Process(target=_reader, args=(str(tmp_path), 60, errors)) for _ in range(2)]
    for process in readers:
        process.start()
    for process in readers:
        process.join(120)
        assert process.exitcode == 0
    assert errors.empty(), errors.get()


# -- S3 ---------------------------------------------------------------------------------------


def s3_storage(s3: S3Env, directory: Path, block: int = BLOCK) -> S3Storage:
    config = S3Config(endpoint_url=s3.endpoint, region=s3.region, metadata_ttl=60.0)
    return S3Storage(s3.bucket, "root", config, DiskCache(str(directory), 1 << 30, block))


def data_gets(s3: S3Env) -> list[tuple[str, str, str | None, int]]:
    return [entry for entry in s3.proxy.log() if entry[0] == "GET" and entry[1].startswith("root/")]


def test_s3_reads_of_a_version_come_from_disk_after_a_restart(s3: S3Env, tmp_path: Path) -> None:
    data = content(3 * BLOCK + 5, 4)
    s3.put("root/shard", data)
    first = s3_storage(s3, tmp_path)
    stat = first.stat("shard")
    assert stat is not None
    s3.proxy.reset_counts()
    assert first.read_tail("shard", 100, stat.size, stat.version) == data[-100:]
    assert first.read("shard", 10, BLOCK, stat.version) == data[10 : 10 + BLOCK]
    assert len(data_gets(s3)) == 2
    assert first.read("shard", 5, 20, None) == data[5:25], "unversioned reads pass by"
    again = s3_storage(s3, tmp_path)
    s3.proxy.reset_counts()
    assert again.read_tail("shard", 100, stat.size, stat.version) == data[-100:]
    assert again.read("shard", 10, BLOCK, stat.version) == data[10 : 10 + BLOCK]
    assert data_gets(s3) == []
    # What it holds, it says so (the tail's blocks 2 and 3, and 0 and 1): readers size
    # their reads by it.
    assert again.local_span("shard", 10, BLOCK, stat.version) == (0, 2 * BLOCK)
    assert again.local_span("shard", 0, len(data), stat.version) == (0, 4 * BLOCK)
    assert again.local_span("shard", 10, 20, '"another"') is None
    assert s3_storage(s3, tmp_path / "elsewhere").local_span("shard", 10, 20, stat.version) is None
    with nonblocking(), pytest.raises(WouldBlock):  # it asks SQLite: never on the event loop
        again.local_span("shard", 10, 20, stat.version)
    # Replaced behind the cache: the new version is fetched, the old one is refused.
    s3.put("root/shard", content(len(data), 5))
    fresh = s3_storage(s3, tmp_path)
    new = fresh.stat("shard")
    assert new is not None and new.version != stat.version
    assert fresh.read("shard", 10, BLOCK, new.version) == content(len(data), 5)[10 : 10 + BLOCK]
    assert len(data_gets(s3)) == 1


# -- mounts -----------------------------------------------------------------------------------

#: 16 shards of 32 KiB and an index: each object one block of its own
SHAPE = (512, 512)


def write_array(s3: S3Env, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 60000, SHAPE).astype("uint16")
    group = zarr.open_group(s3.zarr_store("root"), mode="w")
    array = group.create_array(
        "a", shape=SHAPE, dtype="uint16", chunks=(32, 32), shards=(128, 128), compressors=None
    )
    array[...] = data
    return data


def chunk_by_chunk(mounted: Mounted) -> np.ndarray:
    """The array as a legacy reader gets it: one chunk file at a time, through zarr 3."""
    return zarr.open_array(mounted.path / "a", mode="r")[...]


@pytest.mark.fuse
def test_a_remount_reads_what_the_first_mount_fetched_from_disk(
    s3: S3Env, mount, tmp_path: Path
) -> None:
    data = write_array(s3, 1)
    options = [*s3.mount_options(), "ro", f"cache_dir={tmp_path / 'cache'}"]
    s3.proxy.reset_counts()
    first = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(chunk_by_chunk(first), data)
    assert any("/c/" in entry[1] for entry in data_gets(s3))
    first.stop()
    s3.proxy.reset_counts()
    second = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(chunk_by_chunk(second), data)
    assert data_gets(s3) == [], "no GET at all: shards, indexes and metadata come from disk"
    second.stop()
    # Replaced behind the cache: the remount serves the new array.
    new = write_array(s3, 2)
    third = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(chunk_by_chunk(third), new)


@pytest.mark.fuse
def test_a_remount_drops_damaged_cache_files_and_serves_the_right_bytes(
    s3: S3Env, mount, tmp_path: Path
) -> None:
    data = write_array(s3, 4)
    cache = tmp_path / "cache"
    options = [*s3.mount_options(), "ro", f"cache_dir={cache}"]
    np.testing.assert_array_equal(chunk_by_chunk(mount(s3.url("root"), *options)), data)
    damaged = value_files(cache)
    assert damaged
    for n, path in enumerate(damaged):  # as a power loss or a full disk leaves them
        if n % 2:
            os.truncate(path, 0)
        else:
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x55
            path.write_bytes(bytes(raw))
    s3.proxy.reset_counts()
    again = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(chunk_by_chunk(again), data)
    assert len([line for line in again.log().splitlines() if "damaged block" in line]) == len(
        damaged
    )
    assert any("/c/" in entry[1] for entry in data_gets(s3)), "fetched again"


@pytest.mark.fuse
def test_two_mounts_share_one_cache_directory(s3: S3Env, mount, tmp_path: Path) -> None:
    data = write_array(s3, 3)
    cache = f"cache_dir={tmp_path / 'cache'}"
    mounts = [mount(s3.url("root"), *s3.mount_options(), "ro", cache) for _ in range(2)]
    results: dict[int, np.ndarray] = {}

    def read(n: int) -> None:
        results[n] = chunk_by_chunk(mounts[n])

    threads = [threading.Thread(target=read, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for n in range(2):
        np.testing.assert_array_equal(results[n], data)


@pytest.mark.fuse
def test_a_mount_with_its_cache_on_a_full_then_read_only_file_system_says_so(
    s3: S3Env, mount, tmp_path: Path
) -> None:
    """t5 and t7 c through mounts: the cache's file system fills up (the log says it is
    full, never damaged), the next mount reads what it holds, and on a read-only file
    system a mount says so and goes on without the cache. Every read is right."""
    data = write_array(s3, 5)  # 16 shards of 32 KiB: more than the file system holds
    with tmpfs(tmp_path / "small", "256k") as small:
        options = [*s3.mount_options(), "ro", f"cache_dir={small}"]
        s3.proxy.reset_counts()
        first = mount(s3.url("root"), *options)
        np.testing.assert_array_equal(chunk_by_chunk(first), data)
        first.stop()
        fetched = {entry[1] for entry in data_gets(s3)}
        lines = [line for line in first.log().splitlines() if "WARNING" in line]
        assert len(lines) == 1, lines
        assert f"disk cache {small}: writing failed: the file system is full" in lines[0]
        s3.proxy.reset_counts()
        second = mount(s3.url("root"), *options)
        np.testing.assert_array_equal(chunk_by_chunk(second), data)
        second.stop()
        assert "damaged" not in second.log()
        again = {entry[1] for entry in data_gets(s3)}
        assert again < fetched, "what the first mount kept is read from disk"
        remount_read_only(small)
        third = mount(s3.url("root"), *options)
        np.testing.assert_array_equal(chunk_by_chunk(third), data)
        third.stop()
        lines = [line for line in third.log().splitlines() if "WARNING" in line]
        assert len(lines) == 1 and lines[0].endswith(
            f"WARNING cache_dir {small}: the file system is read-only; "
            "going on without the disk cache"
        ), lines


@pytest.mark.fuse
def test_a_detached_mount_shows_why_it_goes_without_a_cache_dir_another_user_made(
    s3: S3Env, users, public_dir: Path, tmp_path: Path
) -> None:
    """t11 through a mount: another user makes the cache_dir first, in a directory like
    /tmp. `shardfs mount` (detaching) says on its stderr, and in the daemon's log, that
    it goes on without it; it reads right; it puts nothing in that directory."""
    _, attacker = users
    data = write_array(s3, 6)
    squat = public_dir / "shardfs-cache"
    done = attacker.run(f"import os; os.mkdir({str(squat)!r}); os.chmod({str(squat)!r}, 0o777)")
    assert done.returncode == 0, done.stderr
    mountpoint, log_file = tmp_path / "mnt", tmp_path / "daemon.log"
    mountpoint.mkdir()
    options = ",".join([*s3.mount_options(), "ro", f"cache_dir={squat}", f"log={log_file}"])
    result = run("mount", s3.url("root"), str(mountpoint), "-o", options)
    pids = daemons_for(mountpoint)
    try:
        assert result.returncode == 0, result.stderr
        line = (
            f"cache_dir {squat}: is owned by uid {attacker.uid}, not by the daemon's user "
            "(uid 0); refused (another user could change it); going on without the disk cache"
        )
        assert result.stderr.splitlines() == [f"shardfs: WARNING: {line}"]
        np.testing.assert_array_equal(zarr.open_array(mountpoint / "a", mode="r")[...], data)
        logged = [entry for entry in log_file.read_text().splitlines() if "WARNING" in entry]
        assert len(logged) == 1 and logged[0].endswith(f"WARNING {line}"), logged
        assert os.listdir(squat) == []
    finally:
        if mount_type(str(mountpoint)) is not None:
            assert run("umount", str(mountpoint)).returncode == 0
        assert wait_gone(pids), "daemon still running after umount"


def test_cache_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cache_size needs cache_dir"):
        parse_options(["cache_size=1G"])
    options = parse_options([f"cache_dir={tmp_path}", "cache_size=2G"])
    assert options.cache_dir == str(tmp_path) and options.cache_size == 2 << 30
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardfs",
            "mount",
            str(tmp_path),
            str(tmp_path / "m"),
            "-o",
            f"cache_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "cache_dir is for S3 sources" in result.stderr
