"""Bounds of the pure format layer against hostile metadata: JSON Python's decoder cannot
take (too deep, too big an integer) and layouts whose per-chunk structures would not fit
the metadata budget, refused from their shapes before anything is built."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

from shardfs.formats import jsondoc, metadata_write, precomputed, wkw, zarr_draft
from shardfs.formats.shard_index import EMPTY
from shardfs.formats.zarr_v3 import (
    Unshardable,
    level_slots,
    parse_node,
    parse_node_spans,
    plain_layout,
    render,
    sharded_layout,
)
from shardfs.primitives.errors import InvalidMetadata, InvalidWrite
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, Role
from tests.formats.test_formats import array_meta as array

DEEP = "[" * 2000 + "]" * 2000
BIG = "9" * 5000


def nested(depth: int) -> str:
    """A value nesting arrays and objects `depth` levels deep."""
    value = "0"
    for i in range(depth):
        value = f'{{"a": {value}}}' if i % 2 else f"[{value}]"
    return value


def sharding(chunk_shape: list[int], codecs: list | None = None) -> dict:
    config = {"chunk_shape": chunk_shape, "codecs": codecs or [{"name": "bytes"}]}
    return {"name": "sharding_indexed", "configuration": config}


# -- JSON ----------------------------------------------------------------------------


def test_nesting_up_to_the_bound_decodes_and_deeper_is_refused() -> None:
    assert jsondoc.loads(nested(jsondoc.MAX_DEPTH).encode()) == json.loads(nested(128))
    for raw in (nested(jsondoc.MAX_DEPTH + 1).encode(), DEEP.encode()):
        with pytest.raises(jsondoc.Refused, match="deeper than 128"):
            jsondoc.loads(raw)
        with pytest.raises(jsondoc.Refused, match="deeper than 128"):
            jsondoc.object_spans(raw)


@pytest.mark.parametrize(
    "text",
    [
        '{"s": "' + "[" * 500 + '", "t": ' + nested(100) + "}",  # brackets in a string
        '{"s": "\\"' + "{" * 300 + '"}',  # after an escaped quote, still in the string
        '{"s": "\\\\", "t": ' + nested(120) + "}",  # an escaped backslash ends no string
        '{"s": "\\\\\\"' + "[" * 300 + '"}',
        '["\u00e9' + "{" * 300 + '", ' + nested(100) + "]",  # not ASCII
    ],
)
def test_what_strings_hold_is_not_nesting(text: str) -> None:
    assert jsondoc.loads(text.encode()) == json.loads(text)


def test_an_integer_python_does_not_read_is_refused() -> None:
    with pytest.raises(jsondoc.Refused, match="4300 digits"):
        jsondoc.loads(('{"x": ' + BIG + "}").encode())
    with pytest.raises(jsondoc.Refused, match="4300 digits"):
        jsondoc.object_spans(('{"x": ' + BIG + "}").encode())
    assert jsondoc.loads(("[" + "9" * 4000 + "]").encode()) == [int("9" * 4000)]


def test_other_encodings_decode_as_json_loads_does() -> None:
    text = '{"a": [1, "\u00e9"]}'
    for raw in (text.encode("utf-16"), text.encode("utf-8-sig"), text.encode("utf-32-le")):
        assert jsondoc.loads(raw) == json.loads(raw)
    with pytest.raises(jsondoc.Refused):
        jsondoc.loads(DEEP.encode("utf-16"))


def test_what_is_decoded_renders_again_from_a_deep_stack() -> None:
    """The bound is what makes the view's documents renderable: `json.dumps` recurses
    (in Python with indent), from wherever a request is."""
    meta = parse_node(
        ('{"zarr_format": 3, "node_type": "group", "attributes": ' + nested(127) + "}").encode()
    )

    def deep(n: int) -> bytes:
        return render(meta) if n == 0 else deep(n - 1)

    assert json.loads(deep(600))["attributes"] == meta["attributes"]


@pytest.mark.parametrize("payload", [DEEP, BIG])
def test_every_parser_of_source_json_refuses_it_as_invalid(payload: str) -> None:
    doc = (
        '{"zarr_format": 3, "node_type": "group", "attributes": {"x": ' + payload + "}}"
    ).encode()
    with pytest.raises(InvalidMetadata, match="not valid JSON"):
        parse_node(doc)
    with pytest.raises(InvalidMetadata, match="not valid JSON"):
        parse_node_spans(doc)
    with pytest.raises(InvalidMetadata, match="info is not valid JSON"):
        precomputed.parse_info(doc)
    assert not precomputed.is_volume(doc)
    with pytest.raises(InvalidMetadata, match="not valid JSON"):
        wkw.parse_properties(doc)
    assert not zarr_draft.is_draft_entry_point(doc)
    with pytest.raises(InvalidWrite, match="not valid JSON"):
        metadata_write.parse_written(doc, "zarr.json")


# -- layouts -------------------------------------------------------------------------


def reference_slots(layout: Any) -> list[np.ndarray]:
    """`level_slots` one view chunk at a time, as the layout's definition reads."""
    result: list[list[int]] = [[] for _ in layout.levels]
    for local in np.ndindex(*layout.chunks_per_shard):
        offset = [i * c for i, c in zip(local, layout.chunk_shape, strict=True)]
        for slots, level in zip(result, layout.levels, strict=True):
            offset = [offset[p] for p in level.perm]
            within = [o // c for o, c in zip(offset, level.chunk_shape, strict=True)]
            offset = [o % c for o, c in zip(offset, level.chunk_shape, strict=True)]
            slots.append(int(np.ravel_multi_index(within, level.chunks_per_shard)))
    return [np.array(slots) for slots in result]


@pytest.mark.parametrize(
    ("shard", "codecs"),
    [
        ([12, 8], [sharding([3, 2])]),
        ([8, 12], [{"name": "transpose", "configuration": {"order": [1, 0]}}, sharding([6, 2])]),
        ([8, 8, 6], [sharding([4, 4, 3], [sharding([2, 1, 3])])]),
        (
            [6, 8, 4],
            [
                {"name": "transpose", "configuration": {"order": [2, 0, 1]}},
                sharding(
                    [2, 3, 4],
                    [
                        {"name": "transpose", "configuration": {"order": [1, 2, 0]}},
                        sharding([3, 2, 1]),
                    ],
                ),
            ],
        ),
    ],
)
def test_slots_are_each_view_chunks_place_at_each_level(shard: list[int], codecs: list) -> None:
    layout = sharded_layout(array([2 * s for s in shard], shard, codecs))
    assert layout is not None
    slots = level_slots(layout, 1 << 20)
    expected = reference_slots(layout)
    assert len(slots) == len(expected)
    for got, want in zip(slots, expected, strict=True):
        assert got.dtype == np.int64 and np.array_equal(got, want)
    assert sum(s.nbytes for s in slots) == layout.slots_nbytes


def test_a_layout_over_the_budget_is_refused_before_anything_is_built() -> None:
    inner = sharding([1, 1], [sharding([1, 1])])
    layout = sharded_layout(array([1 << 32, 1 << 16], [1 << 31, 1 << 15], [inner]))
    assert layout is not None
    assert layout.slots_nbytes == 8 * (1 << 46) * 2  # two levels: the size doubles
    tracemalloc.start()
    try:
        with pytest.raises(Unshardable, match="more than the 16777216 of metadata_cache"):
            level_slots(layout, 16 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    fits = sharded_layout(array([4096], [2048], [sharding([1])]))
    assert fits is not None and fits.slots_nbytes == 8 * 2048
    assert len(level_slots(fits, fits.slots_nbytes)[0]) == 2048
    with pytest.raises(Unshardable):
        level_slots(fits, fits.slots_nbytes - 1)


@pytest.mark.parametrize(
    ("shape", "shard", "inner"),
    [
        ([1 << 70, 4], [4, 4], [2, 2]),  # an extent numpy cannot hold
        ([4], [1 << 63], [1]),
        ([1 << 40, 1 << 40], [4, 4], [1, 1]),  # a grid of 2^80 chunks
    ],
)
def test_grids_numpy_cannot_number_are_refused(
    shape: list[int], shard: list[int], inner: list[int]
) -> None:
    with pytest.raises(Unshardable, match="2\\^63"):
        sharded_layout(array(shape, shard, [sharding(inner)]))
    with pytest.raises(Unshardable, match="2\\^63"):
        plain_layout(array(shape, shard, [{"name": "bytes"}]), b"")


def test_an_index_over_index_cache_is_shown_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its chunks would each read and decode the index again: the array is shown as
    stored, with one warning, before any index is read."""
    root = tmp_path / "src"
    (root / "c").mkdir(parents=True)
    (root / "zarr.json").write_text(json.dumps(array([1 << 16], [1 << 15], [sharding([1])])))
    index = np.full((1 << 15, 2), EMPTY, dtype="<u8").tobytes()
    (root / "c" / "0").write_bytes(index + crc32c.crc32c(index).to_bytes(4, "little"))
    cost = 32 * (1 << 15) + 256  # as the decoded index is charged in the cache
    served = Namespace(LocalStorage(root), index_cache=cost)
    assert served.resolve("").role is Role.ARRAY
    assert served.listdir(served.resolve("c")) == []  # its index read: no chunk stored
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        ns = Namespace(LocalStorage(root), index_cache=cost - 1)
        for _ in range(3):
            assert ns.resolve("").role is Role.DIR
            assert [name for name, _, _ in ns.listdir(ns.resolve("c"))] == ["0"]
    refused = [r.getMessage() for r in caplog.records if "shown unchanged" in r.getMessage()]
    assert len(refused) == 1 and f"more than the {cost - 1} of index_cache" in refused[0]
