"""Unit tests of the pure format layer: key encodings, index codec, metadata rewrite."""

from __future__ import annotations

import json

import crc32c
import numpy as np
import pytest

from shardfs.formats.keys import ChunkKeyEncoding, parse_index
from shardfs.formats.shard_index import EMPTY, IndexCodec, check_entries
from shardfs.formats.zarr_v3 import Unshardable, level_slots, parse_node, sharded_layout
from shardfs.primitives.errors import CorruptData, InvalidMetadata

BYTES = {"name": "bytes", "configuration": {"endian": "little"}}


def sharding(chunk_shape: list[int], codecs: list | None = None, **extra: object) -> dict:
    config = {
        "chunk_shape": chunk_shape,
        "codecs": codecs or [BYTES],
        "index_codecs": [BYTES, {"name": "crc32c"}],
        **extra,
    }
    return {"name": "sharding_indexed", "configuration": config}


def array_meta(shape: list[int], shard: list[int], codecs: list, **extra: object) -> dict:
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": codecs,
        "attributes": {"answer": 42},
        **extra,
    }


# -- chunk keys ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "sep", "coords", "key"),
    [
        ("default", "/", (1, 22, 0), "c/1/22/0"),
        ("default", ".", (1, 22, 0), "c.1.22.0"),
        ("v2", ".", (1, 22, 0), "1.22.0"),
        ("v2", "/", (1, 22, 0), "1/22/0"),
        ("v2", ".", (), "0"),
        ("default", "/", (), "c"),
    ],
)
def test_key_round_trip(name: str, sep: str, coords: tuple[int, ...], key: str) -> None:
    keys = ChunkKeyEncoding(name, sep)
    assert keys.encode(coords) == key
    assert keys.decode(key, len(coords)) == coords


@pytest.mark.parametrize(
    "key", ["c/1/2", "c/1/02/3", "c/1/x/3", "d/1/2/3", "c/1/2/3/4", "c/-1/2/3"]
)
def test_key_rejects_non_keys(key: str) -> None:
    assert ChunkKeyEncoding("default", "/").decode(key, 3) is None


def test_parse_index_is_canonical() -> None:
    assert parse_index("0") == 0 and parse_index("10") == 10
    assert (
        parse_index("010") is None and parse_index("+1") is None and parse_index("\u0661") is None
    )


def test_key_encoding_from_metadata() -> None:
    assert ChunkKeyEncoding.from_metadata(None) == ChunkKeyEncoding("default", "/")
    assert ChunkKeyEncoding.from_metadata({"name": "v2"}) == ChunkKeyEncoding("v2", ".")
    with pytest.raises(InvalidMetadata):
        ChunkKeyEncoding.from_metadata({"name": "v2", "configuration": {"separator": "-"}})


def test_key_space_ownership() -> None:
    default, flat_v2 = ChunkKeyEncoding("default", "/"), ChunkKeyEncoding("v2", ".")
    assert default.owns("c", 2) and not default.owns("zarr.json", 2) and not default.owns("cc", 2)
    assert (
        flat_v2.owns("3.4", 2) and not flat_v2.owns("3.4.5", 2) and not flat_v2.owns(".zattrs", 2)
    )
    assert default.dir_depth(["c", "3"], 3) == (3,)
    assert default.dir_depth(["c", "3", "4", "5"], 3) is None


# -- index codec -----------------------------------------------------------------------


def reference_index(entries: np.ndarray, big: bool, checksums: int) -> bytes:
    """Encode an index without our own encoder, as the spec describes it."""
    raw = entries.astype(">u8" if big else "<u8").tobytes()
    for _ in range(checksums):
        raw += crc32c.crc32c(raw).to_bytes(4, "little")
    return raw


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("checksums", [0, 1, 2])
def test_index_decode_matches_spec_encoding(big: bool, checksums: int) -> None:
    entries = np.arange(2 * 3 * 2, dtype=np.uint64).reshape(2, 3, 2)
    entries[1, 2] = EMPTY
    codec = IndexCodec(big_endian=big, checksums=checksums)
    raw = reference_index(entries, big, checksums)
    assert len(raw) == codec.size((2, 3))
    assert np.array_equal(codec.decode(raw, (2, 3)), entries)
    assert codec.encode(entries) == raw


def test_index_codec_from_codecs() -> None:
    assert IndexCodec.from_codecs([BYTES, "crc32c"]) == IndexCodec(False, 1)
    big = {"name": "bytes", "configuration": {"endian": "big"}}
    assert IndexCodec.from_codecs([big]) == IndexCodec(True, 0)
    with pytest.raises(InvalidMetadata):
        IndexCodec.from_codecs([BYTES, {"name": "gzip", "configuration": {"level": 1}}])


def test_index_checksum_mismatch_is_corrupt() -> None:
    raw = bytearray(reference_index(np.zeros((4, 2), np.uint64), False, 1))
    raw[3] ^= 1
    with pytest.raises(CorruptData, match="checksum"):
        IndexCodec(False, 1).decode(bytes(raw), (4,))


@pytest.mark.parametrize(
    ("offset", "nbytes", "ok"),
    [
        (0, 10, True),
        (90, 10, True),
        (91, 10, False),
        (100, 0, True),
        (101, 0, False),
        (2**64 - 2, 5, False),
        (5, 2**64 - 2, False),
        (int(EMPTY), 4, False),
        (4, int(EMPTY), False),
    ],
)
def test_check_entries_bounds(offset: int, nbytes: int, ok: bool) -> None:
    index = np.array([[offset, nbytes], [EMPTY, EMPTY]], dtype=np.uint64)
    if ok:
        check_entries(index, 0, 100)
    else:
        with pytest.raises(CorruptData):
            check_entries(index, 0, 100)


def test_check_entries_respects_index_at_start() -> None:
    with pytest.raises(CorruptData):
        check_entries(np.array([[10, 5]], dtype=np.uint64), 20, 100)


# -- metadata rewrite ----------------------------------------------------------------------


def test_unsharded_array_is_left_alone() -> None:
    assert sharded_layout(array_meta([10], [5], [BYTES])) is None


def test_rewrite_keeps_everything_but_grid_and_codecs() -> None:
    zstd = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}
    meta = array_meta(
        [10, 20],
        [4, 10],
        [sharding([2, 5], [BYTES, zstd])],
        dimension_names=["y", "x"],
        chunk_key_encoding={"name": "v2", "configuration": {"separator": "."}},
        extension_thing={"must_understand": False, "value": 1},
    )
    layout = sharded_layout(meta)
    assert layout is not None
    view = json.loads(layout.view_metadata)
    assert view["chunk_grid"] == {"name": "regular", "configuration": {"chunk_shape": [2, 5]}}
    assert view["codecs"] == [BYTES, zstd]
    for field in meta:
        if field not in ("chunk_grid", "codecs"):
            assert view[field] == meta[field], field
    assert list(view) == list(meta)  # field order kept
    assert layout.chunks_per_shard == (2, 2)
    assert layout.grid == (5, 4)
    assert layout.shard_grid == (3, 2)


def test_bare_string_codecs_and_default_index_codecs() -> None:
    config = {"chunk_shape": [2], "codecs": ["bytes"]}
    layout = sharded_layout(
        array_meta([8], [4], [{"name": "sharding_indexed", "configuration": config}])
    )
    assert layout is not None
    assert layout.levels[0].index == IndexCodec(False, 1)
    assert not layout.levels[0].index_at_start


def test_transpose_before_sharding_maps_chunks_to_array_axes() -> None:
    transpose = {"name": "transpose", "configuration": {"order": [1, 0]}}
    # Shards are 4x6 in array order; after the transpose they are 6x4, split into 3x2 chunks.
    layout = sharded_layout(array_meta([8, 12], [4, 6], [transpose, sharding([3, 2])]))
    assert layout is not None
    assert layout.chunk_shape == (2, 3)
    assert json.loads(layout.view_metadata)["codecs"] == [transpose, BYTES]
    (slots,) = level_slots(layout, 1 << 20)
    # View chunk (i, j) of a shard covers array rows 2i.., columns 3j..; in the
    # transposed shard that is chunk (j, i) of a 2x2 grid.
    cps = layout.chunks_per_shard
    assert cps == (2, 2)
    for m, (i, j) in enumerate(np.ndindex(cps)):
        assert slots[m] == np.ravel_multi_index((j, i), (2, 2))


def test_nested_sharding_flattens_to_innermost_chunks() -> None:
    inner = sharding([2, 2], [BYTES], index_location="start")
    layout = sharded_layout(array_meta([16, 16], [8, 8], [sharding([4, 4], [inner])]))
    assert layout is not None
    assert layout.chunk_shape == (2, 2)
    assert layout.chunks_per_shard == (4, 4)
    assert len(layout.levels) == 2 and layout.levels[1].index_at_start
    outer, innermost = level_slots(layout, 1 << 20)
    # View chunk (3, 1) lies in level-0 chunk (1, 0), at level-1 position (1, 1).
    m = np.ravel_multi_index((3, 1), (4, 4))
    assert outer[m] == np.ravel_multi_index((1, 0), (2, 2))
    assert innermost[m] == np.ravel_multi_index((1, 1), (2, 2))


@pytest.mark.parametrize(
    ("codecs", "extra", "reason"),
    [
        ([sharding([2]), {"name": "gzip", "configuration": {"level": 1}}], {}, "whole-shard"),
        ([sharding([2])], {"storage_transformers": [{"name": "x"}]}, "storage transformers"),
        ([sharding([2])], {"mystery": {"must_understand": True}}, "mystery"),
        ([sharding([2])], {"mystery": 1}, "mystery"),
        (
            [{"name": "scale_offset", "configuration": {}}, sharding([2])],
            {},
            "scale_offset",
        ),
    ],
)
def test_unservable_arrays_are_refused_with_a_reason(
    codecs: list, extra: dict, reason: str
) -> None:
    with pytest.raises(Unshardable, match=reason):
        sharded_layout(array_meta([8], [4], codecs, **extra))


@pytest.mark.parametrize(
    "codecs",
    [
        [sharding([3])],  # does not divide the shard
        [sharding([2], index_location="middle")],
        [{"name": "transpose", "configuration": {"order": [0, 0]}}, sharding([2])],
    ],
)
def test_invalid_sharding_metadata(codecs: list) -> None:
    with pytest.raises(InvalidMetadata):
        sharded_layout(array_meta([8], [4], codecs))


def test_parse_node_rejects_non_v3() -> None:
    with pytest.raises(InvalidMetadata):
        parse_node(b'{"zarr_format": 2}')
    with pytest.raises(InvalidMetadata):
        parse_node(b"\xff not json")
    assert parse_node(b'{"zarr_format": 3, "node_type": "group"}')["node_type"] == "group"
