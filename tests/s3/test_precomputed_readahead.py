"""Read-ahead of precomputed chunks on S3: a reader of chunk files walks minishards, and gets
each one's chunks in few ranged GETs instead of one GET per chunk.

The volumes are written by tensorstore, sharded straight into the bucket and unsharded to a
local reference, and read back through a real mount behind the counting proxy.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

from shardfs.formats.precomputed import Sharding, morton_positions
from shardfs.view.precomputed import PrecomputedNamespace
from tests.conftest import Mounted
from tests.mounts.test_mount_precomputed import (
    RecordingStorage,
    ScaleCase,
    VolumeCase,
    error_lines,
    files,
    local,
    read_scale,
    sharding,
)
from tests.support.s3 import S3Env

#: Identity hash with a preshift, as igneous shards images: each minishard holds blocks of
#: 8 consecutive chunk ids (Morton order), 4 minishards a shard, 4 shards; 256 chunks of 2 KiB.
IDENTITY = VolumeCase(
    "identity",
    "uint8",
    (ScaleCase("a", (128, 128, 32), (16, 16, 8), sharding("identity", 2, 2, "raw", "raw", 3)),),
)
#: murmurhash, gzip index and data, sizes in gzip trailers; 128 chunks.
HASHED = VolumeCase(
    "hashed",
    "uint32",
    (
        ScaleCase(
            "b",
            (64, 64, 16),
            (8, 8, 8),
            sharding("murmurhash3_x86_128", 2, 1, "gzip", "gzip"),
            encoding="compressed_segmentation",
        ),
    ),
    kind="segmentation",
)


class CountingStorage(RecordingStorage):
    """A local source that claims S3's request cost and records every read."""

    request_cost = 1 << 20


def in_id_order(case: VolumeCase) -> list[str]:
    """The chunk names of a volume's first scale in chunk id order."""
    scale = case.scales[0]
    grid = [-(-n // c) for n, c in zip(scale.size, scale.chunk, strict=True)]
    bits = tuple((n - 1).bit_length() for n in grid)
    codes = np.arange(1 << sum(bits), dtype=np.uint64)
    names = []
    for position in morton_positions(codes, bits).tolist():  # type: ignore[arg-type]
        if all(p < g for p, g in zip(position, grid, strict=True)):
            begin = [p * c for p, c in zip(position, scale.chunk, strict=True)]
            end = [min(b + c, n) for b, c, n in zip(begin, scale.chunk, scale.size, strict=True)]
            names.append("_".join(f"{b}-{e}" for b, e in zip(begin, end, strict=True)))
    return names


def places(case: VolumeCase) -> list[tuple[int, int]]:
    """(shard, minishard) of each chunk, in chunk id order (every id is in the grid)."""
    spec = Sharding.from_json(case.scales[0].sharding)
    shards, minishards = spec.shard_and_minishard(np.arange(len(in_id_order(case))))
    return list(zip(shards.tolist(), minishards.tolist(), strict=True))


class Walker:
    """Reads chunk files of a local volume's first scale through a PrecomputedNamespace on a
    store that counts its reads."""

    def __init__(self, case: VolumeCase, root: Path) -> None:
        case.write(local(root / "src"), sharded=True)
        case.write(local(root / "ref"), sharded=False)
        self.key = case.scales[0].key
        self.expected = files(root / "ref" / self.key)
        self.storage = CountingStorage(root / "src")
        self.namespace = PrecomputedNamespace(self.storage)
        self.names = in_id_order(case)
        assert sorted(self.names) == sorted(self.expected)

    def read(self, *ids: int) -> None:
        for i in ids:
            name = self.names[i]
            node = self.namespace.resolve(f"{self.key}/{name}")
            data = self.namespace.open(node).read(0, len(self.expected[name]) + 1)
            assert data == self.expected[name], name

    def settle(self) -> list[tuple[str, int, int]]:
        """The shard reads so far, once fetches ahead have stopped coming."""
        deadline = time.monotonic() + 10
        seen = -1
        while seen != len(self.storage.reads):
            assert time.monotonic() < deadline
            seen = len(self.storage.reads)
            time.sleep(0.2)
        return [r for r in self.storage.reads if r[0].endswith(".shard")]


# -- the view without FUSE -------------------------------------------------------------------


def test_a_walker_finds_the_next_minishards_in_memory(tmp_path: Path) -> None:
    walker = Walker(IDENTITY, tmp_path)
    assert places(IDENTITY)[:24:8] == [(0, 0), (0, 1), (0, 2)]
    walker.read(0, 1)  # minishard 0 of shard 0: fetched whole, and walked
    fetched = walker.settle()
    # Its walker's next two minishards (ids 8-23) came in the background: indexes and chunks.
    assert len(fetched) == 1 + 2 * 3, fetched
    walker.read(*range(8, 24))
    later = walker.settle()[len(fetched) :]
    # Found in memory; only the minishards that follow them are fetched ahead now.
    assert later and not any(
        key == k and start < s + n and s < start + length
        for key, start, length in later
        for k, s, n in fetched
    ), (fetched, later)
    # The rest of the scale in id order: two requests a minishard (index, chunks), not one a chunk.
    walker.read(*range(2, len(walker.names)))
    assert len(walker.settle()) <= 4 + 2 * 16, walker.storage.reads


def test_next_minishards_go_on_in_the_next_shard_file_and_stop_after_the_last(
    tmp_path: Path,
) -> None:
    walker = Walker(IDENTITY, tmp_path)
    where = places(IDENTITY)
    assert where[24] == (0, 3) and where[32] == (1, 0) and where[120] == (3, 3)
    walker.read(24, 25)  # the last minishard of shard 0
    first = walker.settle()
    ahead = [r for r in first if r[0] == "a/1.shard"]
    assert len(ahead) == 1 + 2 * 2, first  # shard 1: its index, minishards 0 and 1
    walker.read(120, 121)  # the last minishard of the last shard: nothing follows
    last = walker.settle()[len(first) :]
    assert {r[0] for r in last} == {"a/3.shard"} and len(last) == 3, last


def test_a_murmurhash_predicts_no_next_minishard(tmp_path: Path) -> None:
    walker = Walker(HASHED, tmp_path)
    where = places(HASHED)
    ids = [i for i, place in enumerate(where) if place == where[0]]
    walker.read(*ids[:3])
    reads = walker.settle()
    # One shard: its index, one minishard index, the first chunk's gzip trailer, one fetch.
    assert {r[0] for r in reads} == {f"b/{where[0][0]}.shard"} and len(reads) == 4, reads


# -- through a mount, on S3 ------------------------------------------------------------------


def shard_index_ranges(s3: S3Env, prefix: str, spec: Sharding) -> dict[str, set[str]]:
    """The Range headers of the index reads of every shard below `prefix`: the fixed index
    and each minishard index."""
    ranges = {}
    for key, (size, _) in s3.keys(prefix).items():
        data = s3.get(key)
        index = spec.decode_shard_index(data[: spec.index_size], size)
        found = {f"bytes=0-{spec.index_size - 1}"}
        found |= {f"bytes={start}-{end - 1}" for start, end in index.tolist() if end > start}
        ranges[key] = found
    return ranges


def data_gets(s3: S3Env, prefix: str, spec: Sharding) -> list[tuple[str, str | None]]:
    """The GETs of shard bytes other than their indexes (chunks, gzip trailers)."""
    indexes = shard_index_ranges(s3, prefix, spec)
    return [
        (key, byte_range)
        for method, key, byte_range, _ in s3.proxy.log()
        if method == "GET" and key in indexes and byte_range not in indexes[key]
    ]


def index_gets(s3: S3Env, prefix: str, spec: Sharding) -> int:
    indexes = shard_index_ranges(s3, prefix, spec)
    return sum(
        1
        for method, key, byte_range, _ in s3.proxy.log()
        if method == "GET" and key in indexes and byte_range in indexes[key]
    )


def ts_direct(s3: S3Env, prefix: str) -> np.ndarray:
    """What tensorstore reads from the sharded volume in the bucket, bypassing the mount."""
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": s3.tensorstore_kvstore(prefix, direct=True),
            "scale_index": 0,
            "open": True,
        }
    ).result()
    return store.translate_to[0].read().result()


@pytest.mark.fuse
@pytest.mark.parametrize("case", [IDENTITY, HASHED], ids=lambda c: c.name)
def test_reading_every_chunk_file_costs_few_gets(
    case: VolumeCase, s3: S3Env, mount, tmp_path: Path
) -> None:
    case.write(s3.tensorstore_kvstore("src", direct=True), sharded=True)
    case.write(local(tmp_path / "ref"), sharded=False)
    key = case.scales[0].key
    spec = Sharding.from_json(case.scales[0].sharding)
    expected = files(tmp_path / "ref" / key)
    s3.proxy.reset_counts()
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro")
    for name in sorted(expected):  # by name, as `cp` would; no listing: each a lookup
        assert (mounted.path / key / name).read_bytes() == expected[name], name
    shards = len(s3.keys(f"src/{key}/"))
    minishards = shards << spec.minishard_bits
    fetches = data_gets(s3, f"src/{key}/", spec)
    # Without read-ahead: a GET a chunk (and one a gzip trailer). With it: a few a minishard.
    assert len(fetches) <= 3 * minishards < len(expected) / 2, fetches
    assert index_gets(s3, f"src/{key}/", spec) <= shards + minishards, s3.proxy.log()
    np.testing.assert_array_equal(read_scale(mounted.path, 0), case.expected[0])
    np.testing.assert_array_equal(ts_direct(s3, "src"), case.expected[0])
    assert not error_lines(mounted), mounted.log()


@pytest.mark.fuse
def test_a_replaced_shard_is_never_served_from_cached_bytes(
    s3: S3Env, mount, tmp_path: Path
) -> None:
    """Shards replaced behind the mount by ones of the same layout (the same chunks at the same
    offsets) but other values: reads after the replacement get the new bytes, though the read
    cache holds the old ones at the same places; a file opened before gets the old or EIO."""
    new_case = VolumeCase("identity-new", IDENTITY.dtype, IDENTITY.scales)
    IDENTITY.write(s3.tensorstore_kvstore("src", direct=True), sharded=True)
    new_case.write(s3.tensorstore_kvstore("new", direct=True), sharded=True)
    IDENTITY.write(local(tmp_path / "old"), sharded=False)
    new_case.write(local(tmp_path / "new"), sharded=False)
    old, new = files(tmp_path / "old" / "a"), files(tmp_path / "new" / "a")
    spec = Sharding.from_json(IDENTITY.scales[0].sharding)
    shards = {key.removeprefix("src/"): s3.get(key) for key in s3.keys("src/a/")}
    for name, data in shards.items():  # the same indexes, other chunk bytes
        replacement = s3.get(f"new/{name}")
        assert len(replacement) == len(data) and replacement != data
        for byte_range in shard_index_ranges(s3, f"src/{name}", spec)[f"src/{name}"]:
            first, last = (int(v) for v in byte_range.removeprefix("bytes=").split("-"))
            assert replacement[first : last + 1] == data[first : last + 1]
    options = ["ro", "kernel_cache=no", "cache_timeout=0.2", "metadata_ttl=0.2"]
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), *options)
    names = in_id_order(IDENTITY)
    view = mounted.path / "a"
    for name in names[:64]:  # shards 0 and 1, and minishards of 2 fetched ahead
        assert (view / name).read_bytes() == old[name], name
    held = os.open(view / names[70], os.O_RDONLY)  # in memory, of the old version
    try:
        for name in shards:
            s3.put(f"src/{name}", s3.get(f"new/{name}"))
        time.sleep(1)  # the mount's listings and the kernel's entries expire
        try:
            data = os.read(held, 1 << 20)
        except OSError as e:
            assert e.errno == errno.EIO
        else:
            assert data == old[names[70]] != new[names[70]]
    finally:
        os.close(held)
    s3.proxy.reset_counts()
    for name in names:
        if name != names[70]:  # whose old pages the kernel keeps (see docs/semantics.md)
            assert (view / name).read_bytes() == new[name], name
    fetches = data_gets(s3, "src/a/", spec)
    assert 0 < len(fetches) < len(names) / 4, fetches  # the new version is read ahead too


@pytest.mark.fuse
def test_read_cache_zero_reads_each_chunk_by_itself(s3: S3Env, mount, tmp_path: Path) -> None:
    IDENTITY.write(s3.tensorstore_kvstore("src", direct=True), sharded=True)
    IDENTITY.write(local(tmp_path / "ref"), sharded=False)
    expected = files(tmp_path / "ref" / "a")
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro", "read_cache=0")
    names = in_id_order(IDENTITY)[:32]
    for name in names:
        assert (mounted.path / "a" / name).read_bytes() == expected[name], name
    spec = Sharding.from_json(IDENTITY.scales[0].sharding)
    assert len(data_gets(s3, "src/a/", spec)) == len(names)
