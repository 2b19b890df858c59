"""Neuroglancer precomputed sharding, without FUSE: ids, hashes, names, indexes, info.

Reference values come from outside shardfs: the published murmurhash3 and compressed
Morton code values, the `mmh3` package, and shard bytes built here by hand from the
sharded format's description.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections import Counter
from typing import Any

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfs.formats.precomputed import (
    Scale,
    Sharding,
    compressed_morton_code,
    gzip_size,
    is_volume,
    morton_bits,
    morton_positions,
    murmurhash3_x86_128,
    parse_info,
)
from shardfs.primitives.errors import CorruptData, InvalidMetadata

MURMUR = {
    "@type": "neuroglancer_uint64_sharded_v1",
    "preshift_bits": 0,
    "hash": "murmurhash3_x86_128",
    "minishard_bits": 3,
    "shard_bits": 5,
    "minishard_index_encoding": "gzip",
    "data_encoding": "gzip",
}
#: identity hash, 2 minishards, 2 shards: minishard = id & 1, shard = (id >> 1) & 1
IDENTITY = {
    "@type": "neuroglancer_uint64_sharded_v1",
    "preshift_bits": 0,
    "hash": "identity",
    "minishard_bits": 1,
    "shard_bits": 1,
}


def sharding(**changes: Any) -> Sharding:
    return Sharding.from_json({**IDENTITY, **changes})


def scale(
    size: tuple[int, int, int] = (20, 10, 5),
    chunk: tuple[int, int, int] = (8, 8, 4),
    offset: tuple[int, int, int] = (3, -2, 5),
    encoding: str = "raw",
    spec: Sharding | None = None,
    channels: int = 1,
    itemsize: int = 2,
) -> Scale:
    return Scale("s", size, offset, chunk, encoding, channels, itemsize, spec or sharding())


def info(*scales: dict[str, Any], **fields: Any) -> bytes:
    doc = {
        "@type": "neuroglancer_multiscale_volume",
        "type": "image",
        "data_type": "uint16",
        "num_channels": 1,
        "scales": list(scales),
        **fields,
    }
    return json.dumps(doc).encode()


def scale_doc(key: str = "8_8_8", sharded: dict[str, Any] | None = None, **fields: Any) -> dict:
    doc: dict[str, Any] = {
        "key": key,
        "size": [100, 60, 30],
        "voxel_offset": [0, 0, 0],
        "resolution": [8, 8, 8],
        "chunk_sizes": [[32, 32, 16]],
        "encoding": "raw",
    }
    if sharded is not None:
        doc["sharding"] = sharded
    doc.update(fields)
    return doc


# -- hash and Morton code --------------------------------------------------------------


def test_murmurhash3_published_values() -> None:
    hashes = murmurhash3_x86_128(np.array([0, 42], dtype=np.uint64))
    assert [int(h) for h in hashes] == [0x4772B084E028AE41, 0xC20B94F95119F47A]


def test_murmurhash3_matches_mmh3() -> None:
    rng = np.random.default_rng(5)
    keys = np.concatenate(
        [
            rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64, endpoint=True),
            np.array([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1], dtype=np.uint64),
        ]
    )
    expected = [
        mmh3.hash128(int(k).to_bytes(8, "little"), 0, x64arch=False, signed=False) & (2**64 - 1)
        for k in keys
    ]
    assert [int(h) for h in murmurhash3_x86_128(keys)] == expected


def test_morton_published_value() -> None:
    assert compressed_morton_code((9, 2, 1), (4, 2, 1)) == 0b1010101


def test_morton_bits_follow_the_grid() -> None:
    assert morton_bits((1, 2, 3)) == (0, 1, 2)
    assert morton_bits((16, 17, 4)) == (4, 5, 2)


@given(
    st.tuples(*[st.integers(1, 3000)] * 3).flatmap(
        lambda grid: st.tuples(
            st.just(grid), st.lists(st.tuples(*[st.integers(0, g - 1) for g in grid]), max_size=20)
        )
    )
)
def test_morton_round_trip(case: tuple[tuple[int, int, int], list[tuple[int, int, int]]]) -> None:
    grid, positions = case
    bits = morton_bits(grid)
    codes = [compressed_morton_code(p, bits) for p in positions]
    assert all(0 <= c < 2 ** sum(bits) for c in codes)
    assert len(set(codes)) == len(set(positions))  # one id per position
    back = morton_positions(np.array(codes, dtype=np.uint64), bits)
    assert [tuple(p) for p in back.tolist()] == positions


def test_morton_of_a_full_grid_is_a_permutation() -> None:
    grid = (5, 3, 7)
    bits = morton_bits(grid)
    codes = sorted(
        compressed_morton_code((x, y, z), bits)
        for x in range(grid[0])
        for y in range(grid[1])
        for z in range(grid[2])
    )
    assert len(set(codes)) == 105 and codes[-1] < 2 ** sum(bits)


# -- the sharding spec ----------------------------------------------------------------


def test_shard_and_minishard_from_the_hash() -> None:
    spec = Sharding.from_json({**MURMUR, "preshift_bits": 2})
    ids = np.array([0, 3, 4, 42 << 2, 1000], dtype=np.uint64)
    shards, minishards = spec.shard_and_minishard(ids)
    for chunk_id, shard, minishard in zip(ids.tolist(), shards, minishards, strict=True):
        h = mmh3.hash128((chunk_id >> 2).to_bytes(8, "little"), 0, False, False) & (2**64 - 1)
        assert (int(shard), int(minishard)) == ((h >> 3) & 31, h & 7)
        assert spec.locate(chunk_id) == (int(shard), int(minishard))
    assert spec.locate(42 << 2) == ((0xC20B94F95119F47A >> 3) & 31, 0xC20B94F95119F47A & 7)


def test_identity_hash_and_preshift() -> None:
    spec = sharding(preshift_bits=1, minishard_bits=2, shard_bits=3)
    assert spec.locate(0b1011_01_1) == (0b011, 0b01)
    assert sharding(preshift_bits=64).locate(2**64 - 1) == (0, 0)


@pytest.mark.parametrize(
    ("bits", "shard", "name"),
    [
        (0, 0, "0.shard"),
        (1, 1, "1.shard"),
        (4, 15, "f.shard"),
        (5, 3, "03.shard"),
        (9, 10, "00a.shard"),
    ],
)
def test_shard_names(bits: int, shard: int, name: str) -> None:
    spec = sharding(shard_bits=bits)
    assert spec.shard_name(shard) == name
    assert spec.parse_shard_name(name) == shard


@pytest.mark.parametrize("name", ["3.shard", "00a.shard", "A.shard", "a.shard.tmp", "x.shard", "0"])
def test_shard_names_that_are_not_canonical(name: str) -> None:
    spec = sharding(shard_bits=5)  # two digits, below 0x20
    assert spec.parse_shard_name(name) is None
    assert spec.parse_shard_name("1f.shard") == 31
    assert spec.parse_shard_name("20.shard") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"@type": "neuroglancer_uint64_sharded_v2"}, "@type"),
        ({"hash": "md5"}, "hash"),
        ({"data_encoding": "zstd"}, "data_encoding"),
        ({"minishard_index_encoding": "jpeg"}, "minishard_index_encoding"),
        ({"minishard_bits": 33}, "minishard_bits"),
        ({"shard_bits": -1}, "shard_bits"),
        ({"preshift_bits": "1"}, "preshift_bits"),
        ({"minishard_bits": 32, "shard_bits": 33}, "exceed 64"),
        ({"extra": 1}, "unknown sharding fields"),
    ],
)
def test_sharding_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidMetadata, match=message):
        Sharding.from_json({**MURMUR, **change})


def test_sharding_encodings_default_to_raw() -> None:
    spec = sharding()
    assert not spec.minishard_index_gzip and not spec.data_gzip
    assert spec.index_size == 32


# -- shard indexes ------------------------------------------------------------------------


#: The reader's bound on a decoded minishard index, where a test does not care.
CAP = 1 << 20


def fixed_index(entries: list[tuple[int, int]]) -> bytes:
    return np.asarray(entries, dtype="<u8").tobytes()


def minishard_index(entries: list[tuple[int, int, int]]) -> bytes:
    """(id, offset after the fixed index, size) per chunk, delta-coded as [3, n]."""
    ids, gaps, sizes = [], [], []
    previous_id, previous_end = 0, 0
    for chunk_id, offset, size in entries:
        ids.append(chunk_id - previous_id)
        gaps.append(offset - previous_end)
        sizes.append(size)
        previous_id, previous_end = chunk_id, offset + size
    rows = [[v % 2**64 for v in row] for row in (ids, gaps, sizes)]  # deltas wrap as uint64
    return np.asarray(rows, dtype="<u8").tobytes()


def test_fixed_index_is_made_absolute() -> None:
    spec = sharding()
    index = spec.decode_shard_index(fixed_index([(0, 0), (10, 58)]), 32 + 100)
    assert index.tolist() == [[32, 32], [42, 90]]


@pytest.mark.parametrize(
    ("entries", "message"),
    [([(5, 4), (0, 0)], "minishard 0"), ([(0, 0), (10, 101)], "minishard 1")],
)
def test_fixed_index_outside_the_shard(entries: list[tuple[int, int]], message: str) -> None:
    with pytest.raises(CorruptData, match=message):
        sharding().decode_shard_index(fixed_index(entries), 32 + 100)


def test_fixed_index_of_the_wrong_length() -> None:
    with pytest.raises(CorruptData, match="not 32"):
        sharding().decode_shard_index(b"\0" * 16, 1000)
    with pytest.raises(CorruptData, match="cannot hold its 32-byte index"):
        sharding().decode_shard_index(b"\0" * 32, 31)


def test_fixed_index_entries_decode_alone() -> None:
    """A reader of one entry (or a piece) of a big fixed index gets what the whole gives,
    and its errors name the minishard, not the entry's place in the piece."""
    spec = sharding(minishard_bits=2)  # 64 bytes of fixed index
    entries = [(0, 0), (10, 58), (58, 58), (58, 70)]
    whole = spec.decode_shard_index(fixed_index(entries), 64 + 100)
    assert spec.decode_shard_index(fixed_index(entries[1:2]), 64 + 100, 1, 1).tolist() == [
        whole[1].tolist()
    ]
    assert spec.decode_shard_index(fixed_index(entries[2:]), 64 + 100, 2).tolist() == (
        whole[2:].tolist()
    )
    with pytest.raises(CorruptData, match="minishard 3 index"):
        spec.decode_shard_index(fixed_index([(58, 170)]), 64 + 100, 3, 1)
    with pytest.raises(CorruptData, match="cannot hold"):  # too short, whichever entry is read
        spec.decode_shard_index(fixed_index([(0, 0)]), 40, 1, 1)


def test_minishard_index_decodes() -> None:
    spec = sharding()
    s = scale(size=(100, 100, 100), chunk=(10, 10, 10), offset=(0, 0, 0), spec=spec)
    # shard 1, minishard 0: ids with id & 3 == 2
    raw = minishard_index([(2, 0, 10), (6, 10, 5), (30, 40, 7)])
    found = s.decode_minishard(raw, 1, 0, 32 + 47, CAP)
    assert found.ids.tolist() == [2, 6, 30]
    assert found.offsets.tolist() == [32, 42, 72]
    assert found.sizes.tolist() == [10, 5, 7]
    bits = s.bits
    assert [compressed_morton_code(tuple(p), bits) for p in found.positions.tolist()] == [2, 6, 30]
    assert found.find(6) == (42, 5) and found.find(7) is None and found.find(31) is None
    gzipped = Sharding.from_json({**IDENTITY, "minishard_index_encoding": "gzip"})
    s = scale(size=(100, 100, 100), chunk=(10, 10, 10), spec=gzipped)
    assert s.decode_minishard(gzip.compress(raw), 1, 0, 32 + 47, CAP).ids.tolist() == [2, 6, 30]


@pytest.mark.parametrize(
    ("entries", "size", "message"),
    [
        ([(2, 0, 10), (2, 10, 5)], 100, "do not ascend"),
        ([(6, 0, 10), (2, 10, 5)], 100, "do not ascend"),  # wraps around 2^64
        ([(2, 0, 10), (6, 10, 5)], 32 + 14, "outside the shard"),
        ([(2, 90, 20)], 32 + 100, "outside the shard"),
        ([(3, 0, 10)], 200, "does not hash"),  # minishard 1
        ([(0, 0, 10)], 200, "does not hash"),  # shard 0
        ([(2, 2**64 - 5, 10), (6, 3, 1)], 200, "outside the shard"),  # a gap wraps
    ],
)
def test_minishard_index_corrupt(
    entries: list[tuple[int, int, int]], size: int, message: str
) -> None:
    s = scale(size=(100, 100, 100), chunk=(10, 10, 10))
    raw = minishard_index(entries)
    with pytest.raises(CorruptData, match=message):
        s.decode_minishard(raw, 1, 0, size, CAP)


def test_minishard_index_with_an_id_outside_the_grid() -> None:
    s = scale(size=(30, 10, 10), chunk=(10, 10, 10))  # grid (3, 1, 1): bits (2, 0, 0)
    assert s.decode_minishard(minishard_index([(2, 0, 1)]), 1, 0, 100, CAP).positions.tolist() == [
        [2, 0, 0]
    ]
    with pytest.raises(CorruptData, match="outside the grid"):
        s.decode_minishard(minishard_index([(6, 0, 1)]), 1, 0, 100, CAP)
    with pytest.raises(CorruptData, match="outside the grid"):
        s.decode_minishard(minishard_index([(3 + 4 * 0, 0, 1)]), 1, 1, 100, CAP)


def test_minishard_index_bad_length_gzip_and_size() -> None:
    s = scale(size=(100, 100, 100), chunk=(10, 10, 10))
    with pytest.raises(CorruptData, match="not 24n"):
        s.decode_minishard(b"\0" * 25, 1, 0, 100, CAP)
    gzipped = scale(spec=Sharding.from_json({**IDENTITY, "minishard_index_encoding": "gzip"}))
    with pytest.raises(CorruptData, match="gzip"):
        gzipped.decode_minishard(b"not gzip at all", 1, 0, 100, CAP)
    with pytest.raises(CorruptData, match="truncated"):
        gzipped.decode_minishard(gzip.compress(minishard_index([(2, 0, 1)]))[:-3], 1, 0, 100, CAP)
    # (20, 10, 5) / (8, 8, 4): 3 * 2 * 2 chunks, and one minishard can hold 4 of them (ids
    # 2, 6, 10, 14: 96 bytes of index), so 13 entries cannot be right
    thirteen = minishard_index([(2 + 4 * i, i, 1) for i in range(13)])
    with pytest.raises(CorruptData, match="more than"):
        gzipped.decode_minishard(gzip.compress(thirteen), 1, 0, 1000, CAP)
    with pytest.raises(CorruptData, match="beyond the 96 bytes"):
        scale().decode_minishard(thirteen, 1, 0, 1000, CAP)


@settings(max_examples=60, deadline=None)
@given(
    grid=st.tuples(*[st.integers(1, 9)] * 3),
    hashed=st.booleans(),
    preshift=st.integers(0, 7),
    minishard_bits=st.integers(0, 4),
    shard_bits=st.integers(0, 4),
)
def test_minishard_capacity_bounds_every_minishard(
    grid: tuple[int, int, int], hashed: bool, preshift: int, minishard_bits: int, shard_bits: int
) -> None:
    """Every chunk of the grid, placed by its id's hash: no minishard holds more than
    `minishard_capacity`, and under the identity hash of a grid of powers of two, the
    fullest holds exactly that many (the bound is as tight as the grid allows)."""
    spec = Sharding.from_json(
        {
            **IDENTITY,
            "hash": "murmurhash3_x86_128" if hashed else "identity",
            "preshift_bits": preshift,
            "minishard_bits": minishard_bits,
            "shard_bits": shard_bits,
        }
    )
    s = scale(size=grid, chunk=(1, 1, 1), offset=(0, 0, 0), spec=spec)
    bits = morton_bits(grid)
    ids = np.array([compressed_morton_code(p, bits) for p in np.ndindex(*grid)], dtype=np.uint64)
    shards, minishards = spec.shard_and_minishard(ids)
    fullest = max(Counter(zip(shards.tolist(), minishards.tolist(), strict=True)).values())
    assert fullest <= s.minishard_capacity <= s.chunk_count
    if not hashed and all(n & (n - 1) == 0 for n in grid):
        assert fullest == s.minishard_capacity
    assert s.minishard_limit(1 << 30) == 24 * s.minishard_capacity
    assert s.minishard_limit(100) == min(24 * s.minishard_capacity, 96)  # in whole entries


def test_a_big_grid_bounds_no_minishard_but_the_cap_does() -> None:
    """2^60 chunks: the spec allows a minishard index of 24 * 2^60 bytes; the reader's cap
    is what bounds it."""
    spec = Sharding.from_json({**IDENTITY, "minishard_bits": 0, "shard_bits": 0})
    s = scale(size=(1 << 20,) * 3, chunk=(1, 1, 1), spec=spec)
    assert s.minishard_capacity == 1 << 60
    assert s.minishard_limit(1 << 20) == (1 << 20) - (1 << 20) % 24


def gzip_of_zeros(n: int) -> bytes:
    """A gzip member of `n` zero bytes, built a piece at a time."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(4 << 20)
    out = [stream.compress(piece[: min(len(piece), n - i)]) for i in range(0, n, len(piece))]
    return b"".join([*out, stream.flush()])


def test_a_gzip_minishard_index_bomb_is_inflated_no_further_than_the_limit() -> None:
    """64 MiB of zeros in 64 KiB of gzip, in a scale of 2^60 chunks: inflating stops past
    the 1 MiB cap (a few MiB allocated at most), never at the end of the bomb."""
    spec = Sharding.from_json(
        {**IDENTITY, "minishard_bits": 0, "shard_bits": 0, "minishard_index_encoding": "gzip"}
    )
    s = scale(size=(1 << 20,) * 3, chunk=(1, 1, 1), spec=spec)
    bomb = gzip_of_zeros(64 << 20)
    assert len(bomb) < 1 << 17
    tracemalloc.start()
    try:
        with pytest.raises(CorruptData, match="minishard 0 index: gzip data decompresses to more"):
            s.decode_minishard(bomb, 0, 0, 1 << 40, 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_minishard_index_stored_beyond_the_limit_is_refused_before_it_is_read() -> None:
    s = scale()  # one minishard holds at most 4 chunks: 96 bytes
    limit = s.minishard_limit(CAP)
    assert limit == 96
    s.sharding.check_minishard_stored(0, 96, limit)
    with pytest.raises(CorruptData, match="97 bytes stored, beyond the 96 bytes"):
        s.sharding.check_minishard_stored(0, 97, limit)
    gzipped = scale(spec=Sharding.from_json({**IDENTITY, "minishard_index_encoding": "gzip"}))
    gzipped.sharding.check_minishard_stored(0, 96 + 4096, limit)  # deflate and header room
    with pytest.raises(CorruptData, match="beyond"):
        gzipped.sharding.check_minishard_stored(0, 1 << 20, limit)


# -- chunk data -------------------------------------------------------------------------


def test_decode_data() -> None:
    payload = bytes(range(200)) * 3
    assert sharding().decode_data(payload, 600) == payload
    with pytest.raises(CorruptData, match="600 bytes"):
        sharding().decode_data(payload, 601)
    spec = sharding(data_encoding="gzip")
    member = gzip.compress(payload)
    assert spec.decode_data(member, 600) == payload
    assert gzip_size(member) == 600
    with pytest.raises(CorruptData, match="more than 599"):
        spec.decode_data(member, 599)
    with pytest.raises(CorruptData, match="600 bytes, its file size says 601"):
        spec.decode_data(member, 601)
    with pytest.raises(CorruptData, match="trailing"):
        spec.decode_data(member + gzip.compress(b"x"), 600)
    with pytest.raises(CorruptData, match="truncated"):
        spec.decode_data(member[:-1], 600)
    bad_crc = bytearray(member)
    bad_crc[-5] ^= 1
    with pytest.raises(CorruptData, match="gzip"):
        spec.decode_data(bytes(bad_crc), 600)
    with pytest.raises(CorruptData, match="gzip"):
        spec.decode_data(zlib.compress(payload), 600)


# -- chunk names and sizes ----------------------------------------------------------------


def test_chunk_names_include_the_offset_and_are_clipped() -> None:
    s = scale()  # size (20, 10, 5), chunk (8, 8, 4), offset (3, -2, 5): grid (3, 2, 2)
    assert s.grid == (3, 2, 2)
    assert s.chunk_name((0, 0, 0)) == "3-11_-2-6_5-9"
    assert s.chunk_name((2, 1, 1)) == "19-23_6-8_9-10"
    for position in [(0, 0, 0), (2, 1, 1), (1, 0, 1)]:
        assert s.parse_chunk_name(s.chunk_name(position)) == position


@pytest.mark.parametrize(
    "name",
    [
        "03-11_-2-6_5-9",  # leading zero
        "+3-11_-2-6_5-9",
        "3-11_-2-6_5-9_",
        "3-11_-2-6",
        "3-10_-2-6_5-9",  # not the chunk's end
        "4-12_-2-6_5-9",  # not on the grid
        "27-35_-2-6_5-9",  # outside the grid
        "19-27_6-8_9-10",  # not clipped
        "3-11_-2-6_5-9.gz",
        "3-11_-02-6_5-9",
        "3-11_-0-6_5-9",
        "٣-11_-2-6_5-9",  # another script's digit
        "info",
    ],
)
def test_chunk_names_that_are_not_canonical(name: str) -> None:
    assert scale().parse_chunk_name(name) is None


def test_file_sizes() -> None:
    s = scale(channels=3, itemsize=8)
    assert s.raw_size((0, 0, 0)) == 8 * 8 * 4 * 3 * 8
    assert s.raw_size((2, 1, 1)) == 4 * 2 * 1 * 3 * 8
    assert s.file_size((2, 1, 1), 999) == 4 * 2 * 1 * 3 * 8  # raw: computed, whatever is stored
    segmentation = scale(encoding="compressed_segmentation")
    assert segmentation.file_size((0, 0, 0), 123) == 123 and not segmentation.gzip_sizes
    gzipped = scale(encoding="compressed_segmentation", spec=sharding(data_encoding="gzip"))
    assert gzipped.gzip_sizes
    assert gzipped.file_size((0, 0, 0), 40, gzip.compress(b"x" * 70000)[-4:]) == 70000


# -- info ----------------------------------------------------------------------------------


def test_info_rewritten_without_understood_sharding() -> None:
    raw = info(
        scale_doc("a", MURMUR),
        scale_doc("b"),
        scale_doc("c", {**MURMUR, "hash": "sha1"}),
        scale_doc("d", None, sharding=None),
        mesh="mesh",
    )
    volume = parse_info(raw)
    assert sorted(volume.scales) == ["a"]
    assert len(volume.unchanged) == 1 and "'c'" in volume.unchanged[0]
    expected = json.loads(raw)
    del expected["scales"][0]["sharding"]
    assert json.loads(volume.info) == expected
    assert list(json.loads(volume.info)) == list(expected)  # the order of the fields too
    a = volume.scales["a"]
    assert (a.size, a.chunk_size, a.grid, a.itemsize) == ((100, 60, 30), (32, 32, 16), (4, 2, 2), 2)


@pytest.mark.parametrize(
    ("scales", "reason"),
    [
        ([scale_doc("a", MURMUR, chunk_sizes=[[32, 32, 16], [64, 64, 8]])], "one chunk size"),
        ([scale_doc("a", MURMUR), scale_doc("a/", IDENTITY)], "same directory"),
        ([scale_doc("../up", MURMUR)], "inside the volume"),
        ([scale_doc("a", MURMUR, size=[10, 0, 10])], "size"),
        ([scale_doc("a", MURMUR, voxel_offset=[1.5, 0, 0])], "voxel_offset"),
        ([scale_doc("a", MURMUR, size=[2**22, 2**22, 2**22], chunk_sizes=[[1, 1, 1]])], "64 bits"),
    ],
)
def test_sharded_scales_shown_unchanged(scales: list[dict], reason: str) -> None:
    volume = parse_info(info(*scales))
    assert not volume.scales
    assert volume.unchanged and reason in volume.unchanged[0]
    assert json.loads(volume.info) == json.loads(info(*scales))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "not a neuroglancer_multiscale_volume"),
        (json.dumps({"@type": "neuroglancer_skeletons"}).encode(), "not a neuroglancer"),
        (info(scale_doc(), data_type="complex64"), "data_type"),
        (info(scale_doc(), num_channels=0), "num_channels"),
        (info(), "scales"),
        (info(scale_doc(), scales="x"), "scales"),
    ],
)
def test_info_refused(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidMetadata, match=message):
        parse_info(raw)


def test_is_volume() -> None:
    assert is_volume(info(scale_doc()))
    legacy = json.loads(info(scale_doc()))
    del legacy["@type"]
    assert is_volume(json.dumps(legacy).encode())
    assert parse_info(json.dumps(legacy).encode()).scales == {}
    assert not is_volume(b'{"@type": "neuroglancer_legacy_mesh"}')
    assert not is_volume(b"\xff")
    assert not is_volume(b'"info"')
