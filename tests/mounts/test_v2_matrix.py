"""The zarr v2 view of every array zarr-python 3 writes, and what v2 writers store (issue 19).

Pure tests check the one table of v2 forms (`shardfs.formats.codecs`: data types, fill
values, codecs) both ways. The mount tests write a matrix with zarr-python 3: every data
type (bool, integers, floats, complex, `str`, variable-length bytes, `<U`, `|S`,
datetime64, timedelta64) with its defaults, and every codec of `zarr.codecs.numcodecs`
that zarr-python 3 can write here, each unsharded and sharded, with edge chunks, fill
values and chunks left at the fill value. zarr-python 2.18 and xarray on zarr 2 read all
of it through one `view=v2` mount (one script), zarr-python 3 through one `view=v3`
mount, tensorstore through both (where it knows the types and codecs), and all must see
what zarr-python 3 reads from the source. Then xarray and zarr-python 2 write through
`rw,view=v2` mounts; after the unmount zarr-python 3, xarray on zarr 3 (and tensorstore,
for the types it knows) read the source and find what they wrote.
"""

from __future__ import annotations

import base64
import json
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import xarray as xr
import zarr
import zarr.codecs.numcodecs as nc
from zarr.dtype import VariableLengthBytes

from shardfs.formats import metadata_write as mw
from shardfs.formats.codecs import (
    NUMCODECS,
    v2_codec,
    v2_dtype,
    v2_fill,
    v3_codec,
    v3_data_type,
    v3_fill,
)
from shardfs.formats.zarr_v2 import Transform, Untranslatable, v2_array
from shardfs.primitives.errors import InvalidMetadata, InvalidWrite
from tests.conftest import Mounted, start_mount, stop_mount
from tests.support.zarr2 import Zarr2

#: zarr-python 3 warns about numcodecs codecs and unstable data types at every use.
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]

# =========================================================================================
# The table, pure
# =========================================================================================

#: (v3 data_type, bytes endian, v2 dtype, v3 fill, v2 fill)
DATA_TYPES: list[tuple[Any, str | None, str, Any, Any]] = [
    ("bool", None, "|b1", True, True),
    ("int8", None, "|i1", -3, -3),
    ("uint16", "big", ">u2", 7, 7),
    ("int64", "little", "<i8", 0, 0),
    ("float32", "little", "<f4", "NaN", "NaN"),
    ("complex128", "little", "<c16", [1.0, "-Infinity"], [1.0, "-Infinity"]),
    (
        {"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}},
        "little",
        "<U3",
        "ab",
        "ab",
    ),
    ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 4}}, "big", ">U1", "", ""),
    (
        {"name": "null_terminated_bytes", "configuration": {"length_bytes": 4}},
        None,
        "|S4",
        "YWI=",
        "YWI=",
    ),
    ({"name": "raw_bytes", "configuration": {"length_bytes": 2}}, None, "|V2", "AAE=", "AAE="),
    (
        {"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}},
        "little",
        "<M8[ns]",
        -(2**63),
        -(2**63),
    ),
    (
        {"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 10}},
        "big",
        ">M8[10s]",
        1000,
        1000,
    ),
    (
        {"name": "numpy.timedelta64", "configuration": {"unit": "ms", "scale_factor": 1}},
        "little",
        "<m8[ms]",
        5,
        5,
    ),
    ("string", None, "|O", "größe", "größe"),
    ("variable_length_bytes", None, "|O", "AGFi", "AGFi"),
]


@pytest.mark.parametrize("row", DATA_TYPES, ids=lambda r: str(r[2]))
def test_data_types_and_fill_values_map_both_ways(row: tuple) -> None:
    data_type, endian, v2, v3_value, v2_value = row
    dtype = v2_dtype(data_type, endian)
    assert dtype.str == v2
    object_codec = {"string": "vlen-utf8", "variable_length_bytes": "vlen-bytes"}.get(
        data_type if isinstance(data_type, str) else ""
    )
    assert v3_data_type(dtype, object_codec) == data_type
    if dtype.kind not in "biufc":
        assert v2_fill(v3_value, dtype) == v2_value
    assert v3_fill(v2_value, dtype, data_type) == v3_value


def test_zarr_python_2_fill_values_become_what_zarr_python_3_reads() -> None:
    """null, and the numbers zarr-python 2 wrote for `|O` arrays."""
    assert v3_fill(None, np.dtype("<U3"), None) == ""
    assert v3_fill(None, np.dtype("O"), "string") == ""
    assert v3_fill(0, np.dtype("O"), "string") == "0"
    assert v3_fill(None, np.dtype("O"), "variable_length_bytes") == ""
    assert v3_fill(0, np.dtype("O"), "variable_length_bytes") == ""
    assert v3_fill(None, np.dtype("<M8[ns]"), None) == -(2**63)
    assert v3_fill("NaT", np.dtype("<m8[s]"), None) == -(2**63)
    assert v3_fill(None, np.dtype("|V3"), None) == "AAAA"
    assert v3_fill(None, np.dtype("|S3"), None) == ""
    assert v3_fill(None, np.dtype("<c8"), "complex64") == [0.0, 0.0]
    assert v2_fill("NaT", np.dtype("<M8[D]")) == -(2**63)


def test_no_v2_dtype_for_unknown_data_types() -> None:
    for data_type in ("float8", {"name": "fixed_length_utf32", "configuration": {}}, 3):
        with pytest.raises(InvalidMetadata):
            v2_dtype(data_type, "little")
    for dtype in ("O", "<i4,<f8"):
        with pytest.raises(InvalidMetadata):
            v3_data_type(np.dtype(dtype), "pickle")


BLOSC = {
    "name": "blosc",
    "configuration": {
        "cname": "zstd",
        "clevel": 4,
        "shuffle": "bitshuffle",
        "typesize": 4,
        "blocksize": 0,
    },
}
#: (v3 codec, its v2 form, the v3 codec a v2 writer's form becomes)
CODECS: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (
        {"name": "gzip", "configuration": {"level": 3}},
        {"id": "gzip", "level": 3},
        {"name": "gzip", "configuration": {"level": 3}},
    ),
    (
        {"name": "zstd", "configuration": {"level": 2, "checksum": True}},
        {"id": "zstd", "level": 2, "checksum": True},
        {"name": "zstd", "configuration": {"level": 2, "checksum": True}},
    ),
    (
        BLOSC,
        {"id": "blosc", "cname": "zstd", "clevel": 4, "shuffle": 2, "blocksize": 0},
        BLOSC,
    ),
    (
        {"name": "numcodecs.zstd", "configuration": {"level": 2}},
        {"id": "zstd", "level": 2},
        {"name": "zstd", "configuration": {"level": 2, "checksum": False}},
    ),
    (
        {"name": "numcodecs.gzip", "configuration": {"level": 2}},
        {"id": "gzip", "level": 2},
        {"name": "gzip", "configuration": {"level": 2}},
    ),
    (
        {"name": "numcodecs.blosc", "configuration": {"cname": "lz4", "clevel": 2, "shuffle": 1}},
        {"id": "blosc", "cname": "lz4", "clevel": 2, "shuffle": 1},
        {
            "name": "blosc",
            "configuration": {
                "cname": "lz4",
                "clevel": 2,
                "shuffle": "shuffle",
                "typesize": 4,
                "blocksize": 0,
            },
        },
    ),
    *[
        (
            {"name": f"numcodecs.{cid}", "configuration": config},
            {"id": cid, **config},
            {"name": f"numcodecs.{cid}", "configuration": config},
        )
        for cid, config in [
            ("bz2", {"level": 3}),
            ("lzma", {}),
            ("lz4", {"acceleration": 1}),
            ("zlib", {"level": 2}),
            ("shuffle", {"elementsize": 4}),
            ("crc32", {}),
            ("adler32", {"location": "end"}),
            ("fletcher32", {}),
            ("jenkins_lookup3", {"initval": 0, "prefix": None}),
            ("delta", {"dtype": "<i4", "astype": "<i2"}),
            ("fixedscaleoffset", {"offset": 1, "scale": 10, "dtype": "<f8", "astype": "<i4"}),
            ("quantize", {"digits": 3, "dtype": "<f8"}),
            ("bitround", {"keepbits": 8}),
            ("packbits", {}),
            ("astype", {"encode_dtype": "<f4", "decode_dtype": "<f8"}),
            ("pcodec", {"level": 8}),
            ("zfpy", {"mode": 4, "tolerance": -1}),
        ]
    ],
    # In a chain the view strips it at the end, like crc32c (see the chain tests).
    ({"name": "numcodecs.crc32c", "configuration": {}}, {"id": "crc32c"}, {"name": "crc32c"}),
    (
        {"name": "vlen-utf8", "configuration": {}},
        {"id": "vlen-utf8"},
        {"name": "vlen-utf8", "configuration": {}},
    ),
    (
        {"name": "vlen-bytes", "configuration": {}},
        {"id": "vlen-bytes"},
        {"name": "vlen-bytes", "configuration": {}},
    ),
]


@pytest.mark.parametrize("row", CODECS, ids=lambda r: r[0]["name"])
def test_codecs_map_both_ways(row: tuple) -> None:
    v3, v2, back = row
    assert v2_codec(v3["name"], v3["configuration"]) == v2
    assert v3_codec(v2, 4) == back


def test_every_numcodecs_codec_of_zarr_python_3_is_in_the_table() -> None:
    """The table knows every `numcodecs.<id>` zarr-python 3 registers."""
    names = {c.codec_name.removeprefix("numcodecs.") for c in _numcodecs_classes()}
    assert names == set(NUMCODECS)
    mapped = {r[0]["name"].removeprefix("numcodecs.") for r in CODECS}
    assert names <= mapped


def _numcodecs_classes() -> list[type]:
    return [
        getattr(nc, n)
        for n in nc.__all__
        if not n.startswith("_") and isinstance(getattr(nc, n), type)
    ]


def _meta(data_type: Any, codecs: list[Any], fill: Any = 0, shape=(6, 4)) -> dict[str, Any]:
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
    }


BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}


def test_a_chain_becomes_filters_then_the_last_codec_as_compressor() -> None:
    codecs = [
        {"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}},
        BYTES_LE,
        {"name": "numcodecs.shuffle", "configuration": {"elementsize": 4}},
        {"name": "numcodecs.bz2", "configuration": {"level": 1}},
        {"name": "numcodecs.fletcher32", "configuration": {}},
    ]
    v2 = v2_array(_meta("int32", codecs))
    assert v2.transform is Transform.RAW
    assert v2.zarray["dtype"] == "<i4"
    assert v2.zarray["filters"] == [
        {"id": "delta", "dtype": "<i4"},
        {"id": "shuffle", "elementsize": 4},
        {"id": "bz2", "level": 1},
    ]
    assert v2.zarray["compressor"] == {"id": "fletcher32"}
    back = mw.v3_from_zarray(v2.zarray)
    assert back["codecs"] == [{**c, "configuration": c["configuration"]} for c in codecs]
    assert back["data_type"] == "int32"


def test_filters_alone_leave_the_compressor_null() -> None:
    codecs = [{"name": "numcodecs.bitround", "configuration": {"keepbits": 6}}, BYTES_LE]
    v2 = v2_array(_meta("float32", codecs, fill="NaN"))
    assert v2.zarray["filters"] == [{"id": "bitround", "keepbits": 6}]
    assert v2.zarray["compressor"] is None
    assert v2.zarray["fill_value"] == "NaN"


def test_string_arrays_are_object_arrays_with_a_vlen_utf8_filter() -> None:
    zstd = {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
    v2 = v2_array(_meta("string", [{"name": "vlen-utf8"}, zstd], fill=""))
    assert v2.zarray["dtype"] == "|O"
    assert v2.zarray["filters"] == [{"id": "vlen-utf8"}]
    assert v2.zarray["compressor"] == {"id": "zstd", "level": 0}
    assert v2.zarray["fill_value"] == ""
    bare = v2_array(_meta("string", [{"name": "vlen-utf8"}], fill="x"))
    assert bare.zarray["filters"] == [{"id": "vlen-utf8"}]
    assert bare.zarray["compressor"] is None
    checked = v2_array(_meta("string", [{"name": "vlen-utf8"}, zstd, {"name": "crc32c"}], 5))
    assert checked.zarray["fill_value"] == "5"  # zarr-python 3 reads numbers as strings
    assert checked.transform is Transform.STRIP_CRC32C
    assert checked.zarray["compressor"] == {"id": "zstd", "level": 0}
    assert checked.served_size(7) == 3


def test_bytes_arrays_are_object_arrays_with_a_vlen_bytes_filter() -> None:
    for name in ("variable_length_bytes", "bytes"):
        v2 = v2_array(_meta(name, [{"name": "vlen-bytes"}], fill=""))
        assert v2.zarray["dtype"] == "|O"
        assert v2.zarray["filters"] == [{"id": "vlen-bytes"}]


def test_a_numcodecs_checksum_at_the_end_like_crc32c_is_stripped() -> None:
    v2 = v2_array(_meta("int32", [BYTES_LE, {"name": "numcodecs.crc32c", "configuration": {}}]))
    assert v2.transform is Transform.STRIP_CRC32C
    assert v2.zarray["compressor"] is None and v2.zarray["filters"] is None


@pytest.mark.parametrize(
    "codecs, data_type",
    [
        # zarr-python 3 hands filters native (little-endian) arrays; v2 hands them `>i4`.
        (
            [
                {"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}},
                {"name": "bytes", "configuration": {"endian": "big"}},
            ],
            "int32",
        ),
        (
            [
                {"name": "numcodecs.delta", "configuration": {"dtype": "<i4", "astype": ">i2"}},
                BYTES_LE,
            ],
            "int32",
        ),
        (
            [
                {"name": "transpose", "configuration": {"order": [1, 0]}},
                {"name": "numcodecs.quantize", "configuration": {"digits": 2, "dtype": "<f8"}},
                BYTES_LE,
            ],
            "float64",
        ),
        ([{"name": "vlen-utf8"}, {"name": "crc32c"}, {"name": "gzip"}], "string"),
        ([{"name": "vlen-utf8"}], "int32"),
        ([BYTES_LE], "string"),
        ([{"name": "vlen-bytes"}], "string"),
        ([{"name": "numcodecs.pickle"}], "int32"),
    ],
    ids=[
        "big-endian-filter-input",
        "big-endian-filter-output",
        "transpose-filter",
        "vlen-crc32c-mid",
        "vlen-int",
        "string-bytes",
        "string-vlen-bytes",
        "unknown",
    ],
)
def test_chains_with_no_v2_form_are_untranslatable(codecs: list, data_type: str) -> None:
    with pytest.raises(Untranslatable):
        v2_array(_meta(data_type, codecs))


def test_numcodecs_codecs_that_need_decoding_are_decoded() -> None:
    """A transpose that is no C or F order: bz2 (numcodecs) is decoded, as gzip always was."""
    codecs = [
        {"name": "transpose", "configuration": {"order": [1, 0, 2]}},
        BYTES_LE,
        {"name": "numcodecs.bz2", "configuration": {"level": 1}},
    ]
    meta = _meta("uint16", codecs, shape=(2, 2, 2))
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [2, 2, 2]
    v2 = v2_array(meta)
    assert v2.transform is Transform.DECODE
    values = np.arange(8, dtype="<u2").reshape(2, 2, 2)
    stored = v2.store(values.tobytes())
    assert v2.serve(stored) == values.tobytes()


#: `.zarray` documents v2 writers make, and the v3 data type and codecs they become.
ZARRAYS: list[tuple[str, dict[str, Any], Any, list[dict[str, Any]], Any]] = [
    (
        "xarray-U3",
        {
            "dtype": "<U3",
            "fill_value": None,
            "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
        },
        {"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}},
        [
            BYTES_LE,
            {
                "name": "blosc",
                "configuration": {
                    "cname": "lz4",
                    "clevel": 5,
                    "shuffle": "shuffle",
                    "typesize": 12,
                    "blocksize": 0,
                },
            },
        ],
        "",
    ),
    (
        "object-str",
        {"dtype": "|O", "fill_value": 0, "filters": [{"id": "vlen-utf8"}], "compressor": None},
        "string",
        [{"name": "vlen-utf8", "configuration": {}}],
        "0",
    ),
    (
        "object-bytes",
        {
            "dtype": "|O",
            "fill_value": None,
            "filters": [{"id": "vlen-bytes"}, {"id": "crc32"}],
            "compressor": {"id": "lzma", "format": 1, "check": -1, "preset": None, "filters": None},
        },
        "variable_length_bytes",
        [
            {"name": "vlen-bytes", "configuration": {}},
            {"name": "numcodecs.crc32", "configuration": {}},
            {
                "name": "numcodecs.lzma",
                "configuration": {"format": 1, "check": -1, "preset": None, "filters": None},
            },
        ],
        "",
    ),
    (
        "datetime",
        {"dtype": "<M8[ns]", "fill_value": None, "compressor": {"id": "zstd", "level": 1}},
        {"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}},
        [BYTES_LE, {"name": "zstd", "configuration": {"level": 1, "checksum": False}}],
        -(2**63),
    ),
    (
        "timedelta-big",
        {"dtype": ">m8[10s]", "fill_value": 3, "compressor": None},
        {"name": "numpy.timedelta64", "configuration": {"unit": "s", "scale_factor": 10}},
        [{"name": "bytes", "configuration": {"endian": "big"}}],
        3,
    ),
    (
        "bytes-S",
        {"dtype": "|S3", "fill_value": "YWI=", "compressor": {"id": "crc32c"}},
        {"name": "null_terminated_bytes", "configuration": {"length_bytes": 3}},
        [{"name": "bytes", "configuration": {}}, {"name": "crc32c"}],
        "YWI=",
    ),
    (
        "filters",
        {
            "dtype": "<f8",
            "fill_value": "NaN",
            "filters": [
                {
                    "id": "fixedscaleoffset",
                    "offset": 0,
                    "scale": 10,
                    "dtype": "<f8",
                    "astype": "<i2",
                },
                {"id": "shuffle", "elementsize": 2},
            ],
            "compressor": {"id": "blosc", "cname": "zstd", "clevel": 1, "shuffle": -1},
        },
        "float64",
        [
            {
                "name": "numcodecs.fixedscaleoffset",
                "configuration": {"offset": 0, "scale": 10, "dtype": "<f8", "astype": "<i2"},
            },
            BYTES_LE,
            {"name": "numcodecs.shuffle", "configuration": {"elementsize": 2}},
            {
                "name": "blosc",
                "configuration": {
                    "cname": "zstd",
                    "clevel": 1,
                    "shuffle": "bitshuffle",
                    "typesize": 1,
                    "blocksize": 0,
                },
            },
        ],
        "NaN",
    ),
    (
        "pcodec",
        {"dtype": "<f4", "fill_value": 0.0, "compressor": {"id": "pcodec", "level": 8}},
        "float32",
        [{"name": "numcodecs.pcodec", "configuration": {"level": 8}}],
        0.0,
    ),
]


@pytest.mark.parametrize("row", ZARRAYS, ids=lambda r: r[0])
def test_v2_writers_zarray_becomes_a_v3_array(row: tuple, tmp_path: Path) -> None:
    _, fields, data_type, codecs, fill = row
    zarray = {"zarr_format": 2, "shape": [5], "chunks": [2], "order": "C", **fields}
    meta = mw.v3_from_zarray(zarray)
    assert meta["data_type"] == data_type
    assert meta["codecs"] == codecs
    assert meta["fill_value"] == fill
    (tmp_path / "zarr.json").write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = zarr.open_array(tmp_path, mode="r")
        assert array.dtype is not None and array.shape == (5,)
        array[...]  # no chunks: the fill value, as zarr-python 3 understands it
    # ...and the view shows the array as written.
    again = v2_array(meta).zarray
    for key in ("dtype", "order"):
        assert again[key] == zarray[key]


@pytest.mark.parametrize(
    "fields",
    [
        {"dtype": "<U3", "filters": [{"id": "vlen-utf8"}]},
        {"dtype": "|O", "filters": None},
        {"dtype": "|O", "filters": [{"id": "pickle"}]},
        {"dtype": "|O", "filters": [{"id": "json2"}]},
        {"dtype": [["a", "<i4"], ["b", "<f8"]]},
        {"dtype": "<i4", "filters": [{"id": "shuffle"}, {"id": "delta", "dtype": "<i4"}]},
        {"dtype": "<i4", "filters": [{"id": "delta", "dtype": ">i4"}]},
        {"dtype": ">i4", "filters": [{"id": "delta", "dtype": ">i4"}]},
        {"dtype": "|O", "filters": [{"id": "vlen-utf8"}], "order": "F"},
        {"dtype": "<i4", "compressor": {"id": "base64"}},
        {"dtype": "<i4", "compressor": {"id": "delta", "dtype": "<i4"}},
    ],
    ids=lambda f: json.dumps(f)[:60],
)
def test_zarray_with_no_v3_form_is_refused(fields: dict[str, Any]) -> None:
    zarray = {"zarr_format": 2, "shape": [5, 4], "chunks": [2, 2], "fill_value": None, **fields}
    zarray.setdefault("compressor", None)
    with pytest.raises(InvalidWrite):
        mw.v3_from_zarray(zarray)


def test_a_resize_may_spell_out_numcodecs_defaults() -> None:
    """zarr-python 2 writes every codec default back when it resizes (xarray's append)."""
    meta = _meta(
        "string",
        [{"name": "vlen-utf8"}, {"name": "numcodecs.lzma", "configuration": {}}],
        fill="",
    )
    view = v2_array(meta).zarray
    written = json.loads(json.dumps(view))
    written["shape"] = [9, 4]
    written["compressor"] = {
        "id": "lzma",
        "format": 1,
        "check": -1,
        "preset": None,
        "filters": None,
    }
    assert mw.updated_from_zarray(meta, view, written)["shape"] == [9, 4]
    written["compressor"]["preset"] = 9
    with pytest.raises(InvalidWrite):
        mw.updated_from_zarray(meta, view, written)


# =========================================================================================
# Mounts: zarr-python 3 writes a matrix, zarr-python 2 and xarray (zarr 2) read it
# =========================================================================================

SHAPE, CHUNKS, SHARDS = (7, 5), (3, 2), (6, 4)
RNG = np.random.default_rng(19)


def _words(n: int, width: int = 6) -> np.ndarray:
    alphabet = list("abcxyzäöüß€🙂 ")
    return np.array(
        ["".join(RNG.choice(alphabet, RNG.integers(0, width + 1))) for _ in range(n)], dtype=object
    )


def _blobs(n: int) -> np.ndarray:
    """Never empty: a chunk of empty blobs equals the fill value and is not stored, and
    zarr-python 2 reads an unstored chunk of a bytes array as text (see `Spec.sparse`)."""
    return np.array([RNG.bytes(int(RNG.integers(1, 7))) for _ in range(n)], dtype=object)


def _values(kind: str) -> np.ndarray:
    n = math.prod(SHAPE)
    if kind == "bool":
        flat: Any = RNG.random(n) < 0.5
    elif kind in ("str",):
        flat = _words(n)
    elif kind == "bytes":
        flat = _blobs(n)
    elif kind == "<U4":
        flat = np.array([w[:4] for w in _words(n)], dtype="<U4")
    elif kind == "|S3":
        flat = np.array([RNG.bytes(3).replace(b"\0", b"x") for _ in range(n)], dtype="|S3")
    elif kind.startswith("<M8") or kind.startswith("<m8"):
        flat = RNG.integers(-(10**6), 10**6, n).astype(kind)
        flat[3] = np.array("NaT", dtype=kind)
    else:
        dtype = np.dtype(kind)
        if dtype.kind == "f":
            flat = (RNG.integers(-500, 500, n) / 10).astype(dtype)
        elif dtype.kind == "c":
            flat = (RNG.integers(-50, 50, n) + 1j * RNG.integers(-50, 50, n)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            flat = RNG.integers(max(info.min, -100), min(info.max, 100), n).astype(dtype)
    return np.asarray(flat).reshape(SHAPE)


@dataclass
class Spec:
    """One array of the matrix: `create` options for zarr-python 3, and its values."""

    name: str
    kind: str  # the data kind given to `_values`
    options: dict[str, Any] = field(default_factory=dict)
    fill: Any = None  # None: zarr-python 3's default
    #: the v2 view's dtype, filter ids and compressor id expected in `.zarray`
    dtype: str = ""
    filters: list[str] | None = None
    compressor: str | None = "zstd"
    #: rows [6:] left at the fill value (no chunk stored for them)
    sparse: bool = True


def _dtype_arg(kind: str) -> Any:
    return {"str": str, "bytes": VariableLengthBytes()}.get(kind, kind)


#: Every data type, with zarr-python 3's default codecs.
TYPES: list[Spec] = [
    Spec("bool", "bool", fill=True, dtype="|b1"),
    Spec("int8", "int8", fill=-5, dtype="|i1"),
    Spec("uint16", "uint16", fill=7, dtype="<u2"),
    Spec("int32", "int32", dtype="<i4"),
    Spec("int64", "int64", fill=-(2**40), dtype="<i8"),
    Spec("uint64", "uint64", fill=2**63 + 5, dtype="<u8"),
    Spec("float16", "float16", fill=float("nan"), dtype="<f2"),
    Spec("float32", "float32", fill=float("-inf"), dtype="<f4"),
    Spec("float64", "float64", fill=2.5, dtype="<f8"),
    Spec("complex64", "complex64", fill=1 + 2j, dtype="<c8"),
    Spec("complex128", "complex128", dtype="<c16"),
    Spec("str", "str", dtype="|O", filters=["vlen-utf8"]),
    Spec("str_fill", "str", fill="zz", dtype="|O", filters=["vlen-utf8"]),
    # zarr-python 2 takes an `|O` array's fill value as it is: for bytes, the base64 text.
    Spec("bytes", "bytes", dtype="|O", filters=["vlen-bytes"], sparse=False),
    Spec("U4", "<U4", fill="ab", dtype="<U4"),
    Spec("S3", "|S3", dtype="|S3"),
    Spec("datetime64", "<M8[ns]", dtype="<M8[ns]"),
    Spec("datetime64_10s", "<M8[10s]", fill=np.datetime64(5, "10s"), dtype="<M8[10s]"),
    Spec("timedelta64", "<m8[ms]", dtype="<m8[ms]"),
]


def _codec_spec(name: str, kind: str, expect: list[str], **options: Any) -> Spec:
    *filters, compressor = expect
    return Spec(
        name,
        kind,
        options,
        dtype=np.dtype(kind).str,
        filters=filters or None,
        compressor=compressor,
    )


#: Every codec of zarr.codecs.numcodecs zarr-python 3 can write.
def _codec_specs() -> list[Spec]:
    with warnings.catch_warnings():  # zarr-python 3 warns at each numcodecs codec it makes
        warnings.simplefilter("ignore")
        return [
            _codec_spec("bz2", "int32", ["bz2"], compressors=[nc.BZ2(level=3)]),
            _codec_spec("lzma", "int32", ["lzma"], compressors=[nc.LZMA()]),
            _codec_spec("lz4", "float64", ["lz4"], compressors=[nc.LZ4()]),
            _codec_spec("zlib", "uint16", ["zlib"], compressors=[nc.Zlib(level=2)]),
            _codec_spec("gzip", "int64", ["gzip"], compressors=[nc.GZip(level=2)]),
            _codec_spec("zstd", "int32", ["zstd"], compressors=[nc.Zstd(level=3)]),
            _codec_spec(
                "blosc",
                "float32",
                ["blosc"],
                compressors=[nc.Blosc(cname="zstd", clevel=2, shuffle=2)],
            ),
            _codec_spec("shuffle", "int32", ["shuffle"], compressors=[nc.Shuffle()]),
            _codec_spec("crc32", "int32", ["crc32"], compressors=[nc.CRC32()]),
            _codec_spec("crc32c", "int32", [None], compressors=[nc.CRC32C()]),  # stripped
            _codec_spec("adler32", "int32", ["adler32"], compressors=[nc.Adler32()]),
            _codec_spec("fletcher32", "int32", ["fletcher32"], compressors=[nc.Fletcher32()]),
            _codec_spec("jenkins", "int32", ["jenkins_lookup3"], compressors=[nc.JenkinsLookup3()]),
            _codec_spec(
                "delta", "int32", ["delta", "zstd"], filters=[nc.Delta(dtype="<i4", astype="<i2")]
            ),
            _codec_spec(
                "fixedscaleoffset",
                "float64",
                ["fixedscaleoffset", "zstd"],
                filters=[nc.FixedScaleOffset(offset=1, scale=10, dtype="<f8", astype="<i4")],
            ),
            _codec_spec(
                "quantize",
                "float64",
                ["quantize", "zstd"],
                filters=[nc.Quantize(digits=2, dtype="<f8")],
            ),
            _codec_spec(
                "bitround", "float32", ["bitround", "zstd"], filters=[nc.BitRound(keepbits=6)]
            ),
            _codec_spec("packbits", "bool", ["packbits", "zstd"], filters=[nc.PackBits()]),
            _codec_spec(
                "astype",
                "float64",
                ["astype", "zstd"],
                filters=[nc.AsType(encode_dtype="<f4", decode_dtype="<f8")],
            ),
            _codec_spec(
                "chain",
                "int32",
                ["delta", "shuffle", "bz2", "fletcher32"],
                filters=[nc.Delta(dtype="<i4")],
                compressors=[nc.Shuffle(), nc.BZ2(), nc.Fletcher32()],
            ),
            _codec_spec("bytes_only", "float32", [None], compressors=None),
            _codec_spec(
                "pcodec", "float64", ["pcodec"], serializer=nc.PCodec(level=8), compressors=None
            ),
            _codec_spec("pcodec_zstd", "int32", ["pcodec", "zstd"], serializer=nc.PCodec()),
            _codec_spec("zfpy", "float64", ["zfpy"], serializer=nc.ZFPY(mode=4), compressors=None),
            Spec(
                "str_bz2",
                "str",
                {"compressors": [nc.BZ2()]},
                dtype="|O",
                filters=["vlen-utf8"],
                compressor="bz2",
            ),
            Spec(
                "str_crc32_lz4",
                "str",
                {"compressors": [nc.CRC32(), nc.LZ4()]},
                dtype="|O",
                filters=["vlen-utf8", "crc32"],
                compressor="lz4",
            ),
            Spec(
                "str_bare",
                "str",
                {"compressors": None},
                dtype="|O",
                filters=["vlen-utf8"],
                compressor=None,
            ),
            Spec(
                "bytes_lzma",
                "bytes",
                {"compressors": [nc.LZMA()]},
                dtype="|O",
                filters=["vlen-bytes"],
                compressor="lzma",
                sparse=False,
            ),
            Spec("U4_zlib", "<U4", {"compressors": [nc.Zlib()]}, dtype="<U4", compressor="zlib"),
            Spec(
                "datetime64_blosc",
                "<M8[ns]",
                {"compressors": [nc.Blosc(cname="lz4", clevel=1, shuffle=1)]},
                dtype="<M8[ns]",
                compressor="blosc",
            ),
        ]


CODEC_SPECS = _codec_specs()
SPECS = [*TYPES, *CODEC_SPECS]
#: name -> Spec, for each array of the matrix as it is stored: `plain/<name>/v` unsharded,
#: `sharded/<name>/v` sharded (shards of 2 x 2 inner chunks, edge shards and chunks).
LAYOUTS = ("plain", "sharded")
CASES = [f"{layout}/{spec.name}" for layout in LAYOUTS for spec in SPECS]
BY_NAME = {spec.name: spec for spec in SPECS}


def _spec(case: str) -> Spec:
    return BY_NAME[case.split("/", 1)[1]]


def build_matrix(source: Path) -> dict[str, np.ndarray]:
    """Write every case with zarr-python 3; return what zarr-python 3 reads back."""
    root = zarr.open_group(source, mode="w")
    expected = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in CASES:
            layout, _ = case.split("/")
            spec = _spec(case)
            group = root.require_group(case)
            options = dict(spec.options)
            if layout == "sharded":
                options["shards"] = SHARDS
            if spec.fill is not None:
                options["fill_value"] = spec.fill
            array = group.create_array(
                "v",
                shape=SHAPE,
                chunks=CHUNKS,
                dtype=_dtype_arg(spec.kind),
                dimension_names=["y", "x"],
                **options,
            )
            values = _values(spec.kind)
            if spec.sparse:
                values[6:] = array.fill_value  # the last chunk row: never stored
            array[...] = values
            expected[case] = np.asarray(zarr.open_array(source / case / "v", mode="r")[...])
    return expected


READ_V2 = """
import numpy as np, zarr, xarray as xr
root = zarr.open_consolidated(params["mount"], mode="r")
out, seen = params["out"], {}
for i, case in enumerate(params["cases"]):
    info = seen[case] = {}
    try:
        array = root[case + "/v"]
        info["dtype"] = array.dtype.str
        info["filters"] = [f.codec_id for f in array.filters or []]
        info["compressor"] = array.compressor.codec_id if array.compressor else None
        np.save(f"{out}/z{i}.npy", array[...], allow_pickle=True)
    except Exception as e:
        info["zarr_error"] = repr(e)
    try:
        # chunks=None: no dask (ome-zarr brings it), whose reads make numcodecs 0.15's
        # fletcher32 and jenkins_lookup3 fail on arrays zarr-python 2 wrote itself too
        ds = xr.open_zarr(
            params["mount"], group=case, consolidated=True, decode_cf=False, chunks=None
        )
        info["xarray_dims"] = list(ds["v"].dims)
        np.save(f"{out}/x{i}.npy", ds["v"].values, allow_pickle=True)
    except Exception as e:
        info["xarray_error"] = repr(e)
print(json.dumps(seen))
"""


@dataclass(frozen=True)
class Matrix:
    source: Path
    v2: Mounted
    expected: dict[str, np.ndarray]
    seen: dict[str, dict[str, Any]]
    zarr2_values: dict[str, np.ndarray]
    xarray_values: dict[str, np.ndarray]
    v3_values: dict[str, np.ndarray]
    #: case -> "source", "v3", "v2" -> what tensorstore read there (values, or its error)
    tensorstore: dict[str, dict[str, np.ndarray | str]]


def ts_read(driver: str, path: Path) -> np.ndarray | str:
    """The array at `path` as tensorstore's `driver` reads it, or why it could not."""
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(path)}}
    try:
        return ts.open(spec, read=True).result().read().result()
    except Exception as e:  # tensorstore raises ValueError and friends for unknown types
        return f"{type(e).__name__}: {e}"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2) -> Iterator[Matrix]:
    """The matrix written once, read through one v2 mount by one zarr-2 script and
    through one v3 mount by zarr-python 3."""
    base = tmp_path_factory.mktemp("v2_matrix")
    source = base / "src"
    expected = build_matrix(source)
    v2 = start_mount(source, base / "mnt2", base / "mnt2.log", "ro", "view=v2")
    v3 = None
    try:
        out = base / "out"
        out.mkdir()
        seen = zarr2.run(READ_V2, mount=str(v2.path), out=str(out), cases=CASES)

        def load(prefix: str) -> dict[str, np.ndarray]:
            return {
                case: np.load(out / f"{prefix}{i}.npy", allow_pickle=True)
                for i, case in enumerate(CASES)
                if (out / f"{prefix}{i}.npy").exists()
            }

        v3 = start_mount(source, base / "mnt3", base / "mnt3.log", "ro")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            v3_values = {
                case: np.asarray(zarr.open_array(v3.path / case / "v", mode="r")[...])
                for case in CASES
            }
            tensorstore = {
                case: {
                    "source": ts_read("zarr3", source / case / "v"),
                    "v3": ts_read("zarr3", v3.path / case / "v"),
                    "v2": ts_read("zarr", v2.path / case / "v"),
                }
                for case in CASES
            }
        assert "ERROR" not in v3.log()
        yield Matrix(source, v2, expected, seen, load("z"), load("x"), v3_values, tensorstore)
    finally:
        if v3 is not None:
            stop_mount(v3)
        stop_mount(v2)


def assert_same_values(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if expected.dtype.kind in "OT" or got.dtype.kind in "OT":
        assert np.asarray(got, dtype=object).tolist() == np.asarray(expected, dtype=object).tolist()
        return
    assert got.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), (
        got.dtype,
        expected.dtype,
    )
    if expected.dtype.kind in "Mm":
        got, expected = got.view("i8"), expected.view("i8")
    np.testing.assert_array_equal(got, expected)  # NaN == NaN here


by_case = pytest.mark.parametrize("case", CASES)


@pytest.mark.fuse
@by_case
def test_zarr_python_2_reads_every_array_through_the_v2_view(matrix: Matrix, case: str) -> None:
    info = matrix.seen[case]
    assert "zarr_error" not in info, info
    assert_same_values(matrix.zarr2_values[case], matrix.expected[case])


@pytest.mark.fuse
@by_case
def test_xarray_on_zarr_2_reads_every_array_through_the_v2_view(matrix: Matrix, case: str) -> None:
    info = matrix.seen[case]
    assert "xarray_error" not in info, info
    assert info["xarray_dims"] == ["y", "x"]
    assert_same_values(matrix.xarray_values[case], matrix.expected[case])


@pytest.mark.fuse
@by_case
def test_zarray_shows_the_v2_form(matrix: Matrix, case: str) -> None:
    spec = _spec(case)
    view = matrix.v2.path / case / "v"
    zarray = json.loads((view / ".zarray").read_text())
    assert not (view / "zarr.json").exists()
    assert zarray["dtype"] == spec.dtype
    assert zarray["chunks"] == list(CHUNKS) and zarray["shape"] == list(SHAPE)
    assert [f["id"] for f in zarray["filters"] or []] == (spec.filters or [])
    assert (zarray["compressor"] or {}).get("id") == spec.compressor
    assert matrix.seen[case]["dtype"] == spec.dtype
    assert json.loads((view / ".zattrs").read_text()) == {"_ARRAY_DIMENSIONS": ["y", "x"]}


@pytest.mark.fuse
@pytest.mark.parametrize("name", [s.name for s in SPECS])
def test_unsharded_chunks_are_the_stored_bytes(matrix: Matrix, name: str) -> None:
    """The v2 chunk is the stored chunk (for crc32c: without its last four bytes)."""
    view, stored = matrix.v2.path / "plain" / name / "v", matrix.source / "plain" / name / "v"
    chunks = sorted(p for p in (stored / "c").rglob("*") if p.is_file())
    assert chunks
    strip = 4 if name == "crc32c" else 0
    for path in chunks:
        key = "/".join(path.relative_to(stored / "c").parts)
        served = (view / key).read_bytes()
        assert served == path.read_bytes()[: len(path.read_bytes()) - strip]
    # The last chunk row, left at the fill value, is stored (and shown) only if written.
    assert (view / "2" / "0").exists() is not _spec(f"plain/{name}").sparse


@pytest.mark.fuse
@by_case
def test_the_v3_view_still_reads_every_array(matrix: Matrix, case: str) -> None:
    assert_same_values(matrix.v3_values[case], matrix.expected[case])


#: Arrays tensorstore must read: its own data types and v3 codecs (it knows no
#: `numcodecs.*` codec, nor zarr-python's string, bytes and datetime types) ...
TENSORSTORE_V3 = [
    "bool", "int8", "uint16", "int32", "int64", "uint64", "float16", "float32", "float64",
    "complex64", "complex128", "bytes_only",
]  # fmt: skip
#: ... and through the v2 view also arrays of `numcodecs.*` codecs, shown as the
#: v2 compressors it knows (crc32c cut off).
TENSORSTORE_V2 = [*TENSORSTORE_V3, "bz2", "zlib", "gzip", "zstd", "blosc", "crc32c"]


def _all_layouts(names: list[str]) -> list[str]:
    return [f"{layout}/{name}" for layout in LAYOUTS for name in names]


@pytest.mark.fuse
@by_case
def test_tensorstore_reads_the_v3_view_as_it_reads_the_source(matrix: Matrix, case: str) -> None:
    """Where tensorstore knows the data type and codecs, it reads what the source holds;
    where it does not, it refuses the view the way it refuses the source."""
    read = matrix.tensorstore[case]
    if isinstance(read["source"], str):
        assert case not in _all_layouts(TENSORSTORE_V3), read["source"]
        assert isinstance(read["v3"], str), "read through the view, not from the source"
        return
    assert not isinstance(read["v3"], str), read["v3"]
    assert_same_values(read["v3"], matrix.expected[case])


@pytest.mark.fuse
@pytest.mark.parametrize("case", _all_layouts(TENSORSTORE_V2))
def test_tensorstore_reads_the_v2_view(matrix: Matrix, case: str) -> None:
    read = matrix.tensorstore[case]["v2"]
    assert not isinstance(read, str), read
    assert_same_values(read, matrix.expected[case])


READ_NEWEST = """
import warnings
import numpy as np, zarr
warnings.simplefilter("ignore")
errors = {}
for i, case in enumerate(params["cases"]):
    for view in ("v3", "v2"):
        try:
            values = np.asarray(zarr.open_array(f"{params[view]}/{case}/v", mode="r")[...])
            if values.dtype.kind == "T":  # numpy's StringDType: compared as objects
                values = values.astype(object)
            np.save(f"{params['out']}/{view}{i}.npy", values, allow_pickle=True)
        except Exception as e:
            errors[f"{view}:{case}"] = repr(e)
print(json.dumps({"version": zarr.__version__, "errors": errors}))
"""


@pytest.fixture(scope="module")
def newest_reads(
    matrix: Matrix, newest_zarr: Zarr2, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Path]:
    """The newest zarr-python reads every array of the matrix through a v3 and a v2 mount."""
    base = tmp_path_factory.mktemp("newest")
    v3 = start_mount(matrix.source, base / "mnt3", base / "mnt3.log", "ro")
    try:
        out = base / "out"
        out.mkdir()
        seen = newest_zarr.run(
            READ_NEWEST, v3=str(v3.path), v2=str(matrix.v2.path), out=str(out), cases=CASES
        )
        assert "ERROR" not in v3.log(), v3.log()
    finally:
        stop_mount(v3)
    return seen, out


@pytest.mark.fuse
@pytest.mark.parametrize("view", ["v3", "v2"])
@by_case
def test_the_newest_zarr_python_reads_every_array(
    matrix: Matrix, newest_reads: tuple[dict[str, Any], Path], case: str, view: str
) -> None:
    seen, out = newest_reads
    major, minor = (int(n) for n in seen["version"].split(".")[:2])
    assert (major, minor) > (3, 1), f"not newer than the project's zarr: {seen['version']}"
    assert f"{view}:{case}" not in seen["errors"], seen["errors"][f"{view}:{case}"]
    got = np.load(out / f"{view}{CASES.index(case)}.npy", allow_pickle=True)
    assert_same_values(got, matrix.expected[case])


@pytest.mark.fuse
def test_every_array_is_translated_without_errors(matrix: Matrix) -> None:
    log = matrix.v2.log()
    assert "shown unchanged" not in log, log
    assert "ERROR" not in log, log
    zmetadata = json.loads((matrix.v2.path / ".zmetadata").read_text())["metadata"]
    assert {f"{case}/v/.zarray" for case in CASES} <= set(zmetadata)


# =========================================================================================
# Mounts: xarray and zarr-python 2 write through `rw,view=v2`
# =========================================================================================

XARRAY_WRITES = """
import numpy as np, pandas as pd, xarray as xr
path = params["mount"] + "/ds"
times = pd.date_range("2021-03-01", periods=6, freq="D")
temp = np.arange(6 * 3, dtype="float64").reshape(6, 3) / 4
temp[1, 1] = np.nan
def part(lo, hi):
    return xr.Dataset(
        {
            "temp": (("time", "station"), temp[lo:hi]),
            "flag": (("time",), np.array(["ok", "bad", "ok", "?", "ok", "no"], dtype=object)[lo:hi]),
        },
        coords={
            "time": times[lo:hi],
            "station": np.array(["abc", "de", "f"]),
            "label": ("station", np.array(["x", "yy", "zzz"], dtype=object)),
        },
        attrs={"title": "issue 19"},
    )
part(0, 4).to_zarr(path, mode="w", consolidated=True)
part(4, 6).to_zarr(path, mode="a", append_dim="time", consolidated=True)
region = part(1, 3)[["temp", "flag"]]
region["temp"] = region["temp"] * 100
region.drop_vars(["station", "label"]).to_zarr(path, region={"time": slice(1, 3)})
back = xr.open_zarr(path, consolidated=True).load()
print(json.dumps({
    "temp": np.where(np.isnan(back.temp.values), None, back.temp.values).tolist(),
    "flag": back.flag.values.tolist(),
    "time": [str(t) for t in back.time.values.astype("datetime64[D]")],
    "station": back.station.values.tolist(),
    "label": back.label.values.tolist(),
    "dtypes": {k: back[k].dtype.str for k in ("temp", "flag", "time", "station", "label")},
    "attrs": back.attrs,
}))
"""


def _expected_dataset() -> dict[str, Any]:
    temp = np.arange(6 * 3, dtype="float64").reshape(6, 3) / 4
    temp[1, 1] = np.nan
    temp[1:3] *= 100
    return {
        "temp": temp,
        "flag": ["ok", "bad", "ok", "?", "ok", "no"],
        "time": [f"2021-03-0{d}" for d in range(1, 7)],
        "station": ["abc", "de", "f"],
        "label": ["x", "yy", "zzz"],
    }


@pytest.mark.fuse
@pytest.mark.parametrize("options", [(), ("shard_new=2",)], ids=["unsharded", "shard_new"])
def test_xarray_on_zarr_2_writes_datasets_through_the_v2_view(
    tmp_path: Path, mount: Callable[..., Mounted], zarr2: Zarr2, options: tuple[str, ...]
) -> None:
    """mode="w", mode="a" with append_dim, and region= writes of a Dataset with string,
    object-string and datetime coordinates; zarr-python 3 reads the source after it
    (with `shard_new`, the arrays are stored sharded and the view shows them as written)."""
    source = tmp_path / "src"
    zarr.open_group(source, mode="w")
    mounted = mount(source, "rw", "view=v2", *options)
    back = zarr2.run(XARRAY_WRITES, mount=str(mounted.path))
    want = _expected_dataset()
    np.testing.assert_array_equal(np.array(back["temp"], dtype=float), want["temp"])
    for key in ("flag", "time", "station", "label"):
        assert back[key] == want[key], key
    assert back["dtypes"]["station"] == "<U3" and back["dtypes"]["time"] == "<M8[ns]"
    assert back["attrs"] == {"title": "issue 19"}
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()

    ds = source / "ds"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group = zarr.open_group(ds, mode="r")
        assert dict(group.attrs) == {"title": "issue 19"}
        station = group["station"]
        assert station.metadata.data_type.to_json(zarr_format=3) == {
            "name": "fixed_length_utf32",
            "configuration": {"length_bytes": 12},
        }
        assert station[...].tolist() == want["station"]
        assert group["label"].metadata.data_type.to_json(zarr_format=3) == "string"
        assert group["label"][...].tolist() == want["label"]
        assert group["flag"][...].tolist() == want["flag"]
        np.testing.assert_array_equal(group["temp"][...], want["temp"])
        assert group["temp"].metadata.dimension_names == ("time", "station")
        sharded = [c.to_dict()["name"] for c in group["label"].metadata.codecs]
        assert (sharded == ["sharding_indexed"]) is bool(options), sharded
        time = group["time"]
        units = time.attrs["units"]
        assert units.startswith("days since 2021-03-01")
        days = np.datetime64("2021-03-01") + time[...].astype("timedelta64[D]")
        assert [str(d) for d in days] == want["time"]
    # tensorstore reads the arrays of the types it knows.
    for name, expected in (("temp", want["temp"]), ("time", time[...])):
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(ds / name)}}
        np.testing.assert_array_equal(ts.open(spec, read=True).result().read().result(), expected)
    # xarray on zarr 3 reads the same Dataset back, CF decoding included.
    same = xr.open_zarr(ds, consolidated=False).load()
    assert same.attrs == {"title": "issue 19"}
    np.testing.assert_array_equal(same.temp.values, want["temp"])
    assert same.temp.dims == ("time", "station")
    assert same.station.values.tolist() == want["station"]
    assert same.label.values.tolist() == want["label"]
    assert same.flag.values.tolist() == want["flag"]
    assert [str(t)[:10] for t in same.time.values] == want["time"]


ZARR2_WRITES = """
import numpy as np, zarr, numcodecs
from numcodecs import (
    BZ2, LZ4, LZMA, Adler32, AsType, BitRound, Blosc, CRC32, Delta, FixedScaleOffset,
    Fletcher32, JenkinsLookup3, PackBits, Quantize, Shuffle, VLenBytes, VLenUTF8, Zlib, Zstd,
)
root = zarr.open_group(params["mount"], mode="a")
rng = np.random.default_rng(7)
words = np.array(["", "a", "größe", "🙂x", "abc", "q" * 9] * 4, dtype=object)
arrays = {
    "dt": dict(data=np.arange(24).astype("<M8[s]").astype("<M8[ns]"), dtype="<M8[ns]"),
    "td": dict(data=np.arange(24).astype("<m8[ms]"), dtype="<m8[ms]", compressor=Zstd(1)),
    "u": dict(data=words.astype("<U6"), dtype="<U6", compressor=LZ4()),
    "s": dict(data=np.array([b"ab", b"", b"xyz"] * 8, dtype="|S3"), dtype="|S3"),
    "vs": dict(data=words, dtype=object, object_codec=VLenUTF8(), compressor=LZMA(), fill_value=None),
    "vb": dict(
        data=np.array([w.encode() for w in words], dtype=object), dtype=object,
        filters=[VLenBytes(), CRC32()], compressor=BZ2(1), fill_value=None,
    ),
    "delta": dict(data=np.arange(24, dtype="<i4") * 3, dtype="<i4",
                  filters=[Delta(dtype="<i4", astype="<i2")], compressor=Zlib(1)),
    "fso": dict(data=np.arange(24) / 10, dtype="<f8",
                filters=[FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4"), Shuffle(4)],
                compressor=Fletcher32()),
    "quant": dict(data=np.arange(24) / 7, dtype="<f8", filters=[Quantize(3, dtype="<f8")],
                  compressor=Adler32()),
    "bitround": dict(data=np.arange(24, dtype="<f4") / 3, dtype="<f4", filters=[BitRound(5)],
                     compressor=JenkinsLookup3()),
    "pack": dict(data=np.arange(24) % 3 == 0, dtype="|b1", filters=[PackBits()]),
    "astype": dict(data=np.arange(24) / 4, dtype="<f8",
                   filters=[AsType(encode_dtype="<f4", decode_dtype="<f8")],
                   compressor=Blosc("zstd", 1, Blosc.BITSHUFFLE)),
    "big": dict(data=np.arange(24, dtype=">u4"), dtype=">u4", compressor=None, fill_value=9),
}
for name, spec in arrays.items():
    data = spec.pop("data")
    a = root.create_dataset(name, shape=(30,), chunks=(7,), **spec)
    a[:24] = data
# mode "a" grows a string array: zarr-python 2 writes `.zarray` back with every default
vs = zarr.open_array(params["mount"] + "/vs", mode="a")
vs.resize(36)
vs[30:] = np.array(["more"] * 6, dtype=object)
out = {}
for name in arrays:
    a = zarr.open_array(params["mount"] + "/" + name, mode="r")
    written = a[:24] if name != "vs" else np.concatenate([a[:24], a[30:]])
    np.save(params["out"] + f"/{name}.npy", written, allow_pickle=True)
    out[name] = a.dtype.str
print(json.dumps(out))
"""


@pytest.mark.fuse
def test_zarr_python_2_writes_every_type_and_codec_through_the_v2_view(
    tmp_path: Path, mount: Callable[..., Mounted], zarr2: Zarr2
) -> None:
    source = tmp_path / "src"
    zarr.open_group(source, mode="w")
    out = tmp_path / "out"
    out.mkdir()
    mounted = mount(source, "rw", "view=v2")
    dtypes = zarr2.run(ZARR2_WRITES, mount=str(mounted.path), out=str(out))
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()
    assert dtypes["vs"] == "|O" and dtypes["u"] == "<U6" and dtypes["dt"] == "<M8[ns]"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in dtypes:
            written = np.load(out / f"{name}.npy", allow_pickle=True)
            stored = np.asarray(zarr.open_array(source / name, mode="r")[...])
            # What was written (elements never written: zarr-python 2 has no fill for them)
            stored = np.concatenate([stored[:24], stored[30:]]) if name == "vs" else stored[:24]
            assert_same_values(stored, written)
    meta = json.loads((source / "vs" / "zarr.json").read_text())
    assert meta["data_type"] == "string" and meta["shape"] == [36]
    assert [c["name"] for c in meta["codecs"]] == ["vlen-utf8", "numcodecs.lzma"]
    vb = json.loads((source / "vb" / "zarr.json").read_text())
    assert vb["data_type"] == "variable_length_bytes"
    assert [c["name"] for c in vb["codecs"]] == ["vlen-bytes", "numcodecs.crc32", "numcodecs.bz2"]


def test_zarr_python_3_writes_bytes_fill_values_as_base64_in_both_formats() -> None:
    """Fill values of bytes types are base64 in both formats, as zarr-python 3 writes them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = VariableLengthBytes()
        assert dtype.to_json_scalar(b"\0ab", zarr_format=3) == base64.b64encode(b"\0ab").decode()
        assert dtype.to_json_scalar(b"\0ab", zarr_format=2) == dtype.to_json_scalar(
            b"\0ab", zarr_format=3
        )
