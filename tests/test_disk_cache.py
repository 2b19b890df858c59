"""The persistent disk cache (`-o cache_dir`): blocks of object versions kept across mounts.

First the cache alone, with a fetch function standing in for the store; then an
S3 storage and real mounts through the counting proxy: a remount sends no data
GET for what the first mount read, a replaced object is never served from the
cache, two mounts share one cache directory, damaged cache files are dropped.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.options import parse_options
from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import CorruptData, UsageError
from shardfs.storage.disk_cache import DiskCache
from shardfs.storage.s3 import S3Config, S3Storage
from tests.conftest import Mounted
from tests.s3 import S3Env

BLOCK = 64 << 10  # above diskcache's 32 KiB, so each block is a file of its own


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
    return sorted(directory.rglob("*.val"))


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


def test_a_full_disk_degrades_to_no_caching(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)], check=True)
    try:
        cache = DiskCache(str(small), 1 << 30, BLOCK)
        with caplog.at_level(logging.WARNING, logger="shardfs"):
            for n in range(4):
                source = Source(content(4 * BLOCK, n))  # 1 MiB each: the disk fills up
                assert cache.read(f"obj{n}", "v", 0, 4 * BLOCK, source.fetch) == source.data
        assert cache.stats.failures >= 1
        failed = [r for r in caplog.records if "disk cache" in r.getMessage()]
        assert len(failed) == 1, [r.getMessage() for r in failed]
        cache.close()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


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

#: 16 shards of 32 KiB and an index: each above diskcache's 32 KiB, so a file of its own
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
    assert result.returncode == 1 and "cache_dir is for S3 sources" in result.stderr
