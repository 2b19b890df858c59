"""The draft Zarr v3 format of zarr-python 2.14-2.18: keys and translation to final v3.

The translation is proven on data written by zarr-python 2.18 itself: each
draft array's stored bytes are rearranged, untouched, into a final v3 layout
under the translated metadata and read back with zarr-python 3.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.zarr_draft import (
    DRAFT_FORMAT,
    DraftChunkKeys,
    data_prefix,
    is_draft_entry_point,
    metadata_keys,
    translate_array,
    translate_group,
)
from shardfs.formats.zarr_v3 import sharded_layout
from shardfs.primitives.errors import InvalidMetadata
from tests.support.zarr2 import Zarr2

# Translations name non-core codecs `numcodecs.<id>`, which zarr-python 3 reads with a warning.
pytestmark = pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3")

BLOSC = {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}


@dataclass(frozen=True)
class Case:
    """One array written by zarr-python 2.18; values cover `[0:n)` of each `region` axis."""

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    compressor: dict[str, Any] | None
    fill: Any  # as zarr-python 2 writes it in JSON ("NaN", [re, im], ...)
    region: tuple[int, ...]
    order: str = "C"
    separator: str | None = None  # None: zarr-python 2's default ("/")
    cps: tuple[int, ...] | None = None  # chunks_per_shard; None: not sharded
    filters: list[dict[str, Any]] = field(default_factory=list)
    subshape: tuple[int, ...] = ()  # sub-array data type: ("<i2", (3,)) gains a trailing axis
    ints: tuple[int, int] | None = None  # range of the generated integers (or float numerators)

    @property
    def full_shape(self) -> tuple[int, ...]:
        return self.shape + self.subshape

    def values(self) -> np.ndarray:
        """The values written into the region, generated deterministically."""
        rng = np.random.default_rng(len(self.path) * 7919 + sum(map(ord, self.path)))
        shape = self.region + self.subshape
        dtype = np.dtype(self.dtype)
        if dtype.kind == "b":
            return rng.random(shape) < 0.5
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = self.ints or (int(info.min), int(info.max))
            native = dtype.newbyteorder("=")
            return rng.integers(low, high, size=shape, dtype=native, endpoint=True).astype(dtype)
        low, high = self.ints or (-800, 800)
        # Multiples of 1/8 survive every lossy filter used here exactly.
        numerators = rng.integers(low, high, size=(*shape, 2), endpoint=True)
        fractions = numerators / 8
        if dtype.kind == "c":
            data = (fractions[..., 0] + 1j * fractions[..., 1]).astype(dtype)
        else:
            data = fractions[..., 0].astype(dtype)
        if not self.filters and data.size > 2:
            data.flat[1], data.flat[2] = np.nan, np.inf
        return data

    def fill_scalar(self) -> np.generic:
        """The fill value as a scalar; zarr-python 3 reads null as zero."""
        dtype = np.dtype(self.dtype)
        if self.fill is None:
            return dtype.type(0)
        if dtype.kind == "c":
            return dtype.type(complex(float(self.fill[0]), float(self.fill[1])))
        return dtype.type(float(self.fill) if dtype.kind == "f" else self.fill)

    def expected(self) -> np.ndarray:
        full = np.full(self.full_shape, self.fill_scalar(), dtype=self.dtype)
        full[tuple(slice(0, n) for n in self.region)] = self.values()
        return full


CASES = [
    Case("g/sub/sharded", (10, 7), (3, 2), "<i4", BLOSC, -1, (8, 7), separator="/", cps=(2, 2)),
    Case(
        "sharded_f",
        (9, 5, 4),
        (2, 3, 4),
        ">f8",
        {"id": "gzip", "level": 5},
        "NaN",
        (5, 5, 4),
        order="F",
        separator=".",
        cps=(2, 1, 1),
    ),
    Case("flags", (13,), (4,), "bool", {"id": "zstd", "level": 3, "checksum": True}, True, (9,)),
    Case(
        "g/plain_f",
        (6, 11),
        (4, 3),
        "<u2",
        {**BLOSC, "cname": "zstd", "shuffle": 2},
        7,
        (6, 8),
        order="F",
        separator=".",
    ),
    Case(
        "g/sub/complex",
        (5, 3),
        (2, 2),
        "<c16",
        {**BLOSC, "shuffle": -1},
        # Not an infinite imaginary part: zarr-python 2 decodes that fill as re + 1j * im,
        # which turns the real part into NaN.
        ["-Infinity", 2.5],
        (3, 3),
        cps=(1, 2),
    ),
    Case("codecs/zlib", (7,), (3,), "<i8", {"id": "zlib", "level": 4}, 0, (5,)),
    Case("codecs/bz2", (7, 2), (3, 2), ">i2", {"id": "bz2", "level": 2}, 5, (4, 2), cps=(2, 1)),
    Case("codecs/lz4", (5, 6), (2, 4), "<f4", {"id": "lz4", "acceleration": 1}, "NaN", (3, 6), "F"),
    Case(
        "codecs/lzma",
        (9,),
        (2,),
        "u1",
        {"id": "lzma", "format": 1, "check": -1, "preset": None, "filters": None},
        3,
        (6,),
        cps=(3,),
    ),
    Case("codecs/none", (4, 4), (3, 3), "<f2", None, "Infinity", (4, 2), separator="."),
    Case(
        "codecs/blosc_auto",
        (6, 5),
        (2, 2),
        "i1",
        {**BLOSC, "shuffle": -1},
        -3,
        (5, 5),
        order="F",
        cps=(2, 2),
    ),
    Case("codecs/u8", (5,), (2,), ">u8", BLOSC, 2**64 - 1, (3,), cps=(2,)),
    Case(
        "filters/delta",
        (10, 7),
        (3, 2),
        "<i4",
        {"id": "zstd", "level": 1, "checksum": False},
        0,
        (10, 5),
        order="F",
        separator=".",
        filters=[{"id": "delta", "dtype": "<i4", "astype": "<i2"}],
        ints=(-100, 100),
    ),
    Case(
        "filters/delta_big",
        (8, 5),
        (2, 2),
        ">i4",
        BLOSC,
        9,
        (5, 5),
        cps=(2, 2),
        filters=[{"id": "delta", "dtype": ">i4", "astype": ">i4"}],
        ints=(-100, 100),
    ),
    Case(
        "filters/fixedscaleoffset",
        (9, 4),
        (4, 3),
        "<f8",
        {**BLOSC, "shuffle": -1},
        0.5,
        (7, 4),
        order="F",
        cps=(1, 2),
        filters=[
            {"id": "fixedscaleoffset", "scale": 8, "offset": 0, "dtype": "<f8", "astype": "u1"}
        ],
        ints=(0, 255),
    ),
    Case(
        "filters/quantize_astype",
        (11,),
        (4,),
        "<f8",
        {"id": "gzip", "level": 1},
        -2.0,
        (9,),
        filters=[
            {"id": "quantize", "digits": 1, "dtype": "<f8", "astype": "<f8"},
            {"id": "astype", "encode_dtype": "<f4", "decode_dtype": "<f8"},
        ],
    ),
    Case(
        "filters/bitround",
        (3, 8),
        (2, 3),
        "<f4",
        {"id": "zstd", "level": 2, "checksum": False},
        1.0,
        (3, 7),
        separator="/",
        cps=(2, 2),
        filters=[{"id": "bitround", "keepbits": 10}],
    ),
    Case(
        "filters/packbits",
        (5, 7),
        (2, 3),
        "bool",
        {"id": "zstd", "level": 1, "checksum": False},
        True,
        (4, 7),
        order="F",
        filters=[{"id": "packbits"}],
    ),
    Case("scalar", (), (), "<f8", None, "NaN", ()),
    Case("scalar_sharded", (), (), "<i4", BLOSC, 4, (), cps=()),
    Case("subarray", (4,), (2,), "<i2", BLOSC, 0, (3,), cps=(2,), subshape=(3,)),
    Case("nofill", (5,), (2,), "u1", None, None, (5,)),
]

WRITER = """
import base64
import numcodecs
import numpy as np
import zarr
from zarr._storage.v3 import DirectoryStoreV3
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer


def fill_value(value, kind):
    if value is None or kind == "b":
        return value
    if kind == "c":
        return complex(float(value[0]), float(value[1]))
    return float(value) if kind == "f" else value


root = zarr.open_group(DirectoryStoreV3(params["path"]), mode="w", zarr_version=3, path="/")
root.attrs["level"] = "root"
root.create_group("g").attrs["level"] = "g"
root.create_group("g/sub")  # "codecs" and "filters" stay implicit groups
out = {}
for case in params["cases"]:
    dtype = np.dtype(case["dtype"])
    extra = {}
    if case["cps"] is not None:
        extra["storage_transformers"] = [ShardingStorageTransformer("indexed", case["cps"])]
    array = root.create_dataset(
        case["path"],
        shape=case["shape"],
        chunks=case["chunks"],
        dtype=(dtype, tuple(case["subshape"])) if case["subshape"] else dtype,
        compressor=numcodecs.get_codec(case["compressor"]) if case["compressor"] else None,
        filters=[numcodecs.get_codec(f) for f in case["filters"]] or None,
        fill_value=fill_value(case["fill"], dtype.kind),
        order=case["order"],
        dimension_separator=case["separator"],
        **extra,
    )
    array.attrs["name"] = case["path"]
    shape = tuple(case["region"]) + tuple(case["subshape"])
    values = np.frombuffer(base64.b64decode(case["values"]), dtype=dtype).reshape(shape)
    array[tuple(slice(0, n) for n in case["region"])] = values
    read = np.ascontiguousarray(np.asarray(array[...]), dtype=dtype)
    out[case["path"]] = base64.b64encode(read.tobytes()).decode()
print(json.dumps(out))
"""


def case_params(case: Case) -> dict[str, Any]:
    values = np.ascontiguousarray(case.values())
    return {
        "path": case.path,
        "shape": case.shape,
        "chunks": case.chunks,
        "dtype": case.dtype,
        "compressor": case.compressor,
        "filters": case.filters,
        "fill": case.fill,
        "order": case.order,
        "separator": case.separator,
        "cps": case.cps,
        "subshape": case.subshape,
        "region": case.region,
        "values": base64.b64encode(values.tobytes()).decode(),
    }


def convert(draft: Path, out: Path) -> None:
    """Lay out a draft hierarchy as final v3, copying every stored file byte for byte."""
    assert is_draft_entry_point((draft / "zarr.json").read_bytes())
    nodes: dict[str, tuple[str, Any]] = {}
    for file in sorted((draft / "meta").rglob("*.json")):
        rel = file.relative_to(draft).as_posix()
        match = re.fullmatch(r"meta/root(?:/(.+))?\.(array|group)\.json", rel)
        assert match is not None, rel
        path, kind = match.group(1) or "", match.group(2)
        assert metadata_keys(path)[kind == "group"] == rel
        nodes[path] = (kind, json.loads(file.read_bytes()))
    # Final v3 has no implicit groups: every ancestor needs a document.
    for path in list(nodes):
        parts = path.split("/") if path else []
        for depth in range(len(parts)):
            nodes.setdefault("/".join(parts[:depth]), ("group", {"attributes": {}}))

    for path, (kind, doc) in nodes.items():
        target = out / path
        target.mkdir(parents=True, exist_ok=True)
        meta = translate_group(doc) if kind == "group" else translate_array(doc)
        (target / "zarr.json").write_text(json.dumps(meta, indent=2))
        if kind == "group":
            continue
        separator = meta["chunk_key_encoding"]["configuration"]["separator"]
        keys, final = DraftChunkKeys(separator), ChunkKeyEncoding("default", separator)
        ndim = len(meta["shape"])
        source = draft / data_prefix(path)
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            key = file.relative_to(source).as_posix()
            coords = keys.decode(key, ndim)
            assert coords is not None, f"{path}: stray key {key!r}"
            assert keys.encode(coords) == key
            if separator == "/" and coords:
                assert source / keys.dir_path(coords[:-1]) == file.parent
            destination = target / final.encode(coords)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, destination)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2) -> tuple[Path, Path, dict]:
    """(draft hierarchy, its final v3 layout, what zarr-python 2 reads back per array)."""
    base = tmp_path_factory.mktemp("draft")
    draft, final = base / "draft", base / "final"
    cases = [case_params(case) for case in CASES]
    read_back = zarr2.run(WRITER, draft=True, path=str(draft), cases=cases)
    convert(draft, final)
    return draft, final, read_back


@pytest.mark.parametrize("case", CASES, ids=[c.path for c in CASES])
def test_zarr3_reads_translated_draft(written: tuple[Path, Path, dict], case: Case) -> None:
    draft, final, read_back = written
    expected = case.expected()
    by_zarr2 = np.frombuffer(base64.b64decode(read_back[case.path]), dtype=case.dtype)
    np.testing.assert_array_equal(by_zarr2.reshape(case.full_shape), expected)

    doc = json.loads((draft / metadata_keys(case.path)[0]).read_bytes())
    meta = translate_array(doc)
    store = zarr.storage.LocalStore(final, read_only=True)
    array = zarr.open_array(store, path=case.path, mode="r")
    assert array.attrs.asdict() == {"name": case.path}
    np.testing.assert_array_equal(array[...], expected)
    assert array.shape == case.full_shape
    np.testing.assert_array_equal(array.fill_value, case.fill_scalar())

    codecs = meta["codecs"]
    chunk_shape = list(case.chunks + case.subshape)
    if case.cps is None:
        assert meta["chunk_grid"]["configuration"]["chunk_shape"] == chunk_shape
        assert all(c["name"] != "sharding_indexed" for c in codecs)
        return
    # zarr-python 3 reached the values through the translated shard index.
    (sharding,) = codecs
    assert sharding["name"] == "sharding_indexed"
    assert sharding["configuration"]["chunk_shape"] == chunk_shape
    cps = list(case.cps) + [1] * (len(chunk_shape) - len(case.cps))
    shard = [c * n for c, n in zip(chunk_shape, cps, strict=True)]
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == shard
    if case.shape:
        layout = sharded_layout(meta)
        assert layout is not None
        assert layout.chunk_shape == tuple(chunk_shape)
        assert layout.levels[0].index_size == 16 * np.prod(cps)


def test_groups_translate(written: tuple[Path, Path, dict]) -> None:
    draft, final, _ = written
    root = zarr.open_group(zarr.storage.LocalStore(final, read_only=True), mode="r")
    assert root.attrs.asdict() == {"level": "root"}
    assert root["g"].attrs.asdict() == {"level": "g"}
    assert not (draft / metadata_keys("codecs")[1]).exists()  # implicit in the draft
    assert sorted(root.group_keys()) == ["codecs", "filters", "g"]


def test_translated_codecs(written: tuple[Path, Path, dict]) -> None:
    """Spot checks of the chains that the reads above exercised."""
    draft = written[0]

    def codecs(path: str) -> list[dict[str, Any]]:
        meta = translate_array(json.loads((draft / metadata_keys(path)[0]).read_bytes()))
        chain = meta["codecs"]
        if chain[0]["name"] == "sharding_indexed":
            return chain[0]["configuration"]["codecs"]
        return chain

    assert codecs("sharded_f") == [
        {"name": "transpose", "configuration": {"order": [2, 1, 0]}},
        {"name": "bytes", "configuration": {"endian": "big"}},
        {"name": "gzip", "configuration": {"level": 5}},
    ]
    assert codecs("flags") == [
        {"name": "bytes"},
        {"name": "zstd", "configuration": {"level": 3, "checksum": True}},
    ]
    blosc = codecs("g/sub/complex")[-1]["configuration"]
    assert (blosc["shuffle"], blosc["typesize"]) == ("shuffle", 16)
    blosc = codecs("filters/fixedscaleoffset")[-1]["configuration"]
    assert (blosc["shuffle"], blosc["typesize"]) == ("bitshuffle", 1)
    assert codecs("filters/delta") == [
        {"name": "transpose", "configuration": {"order": [1, 0]}},
        {"name": "numcodecs.delta", "configuration": {"dtype": "<i4", "astype": "<i2"}},
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "zstd", "configuration": {"level": 1, "checksum": False}},
    ]
    assert codecs("filters/packbits")[1:3] == [
        {"name": "numcodecs.packbits", "configuration": {}},
        {"name": "bytes"},
    ]
    assert codecs("codecs/lz4")[-1] == {
        "name": "numcodecs.lz4",
        "configuration": {"acceleration": 1},
    }


# -- keys ----------------------------------------------------------------------------


def test_metadata_keys_and_data_prefix() -> None:
    assert metadata_keys("") == ("meta/root.array.json", "meta/root.group.json")
    assert metadata_keys("a/b") == ("meta/root/a/b.array.json", "meta/root/a/b.group.json")
    assert data_prefix("") == "data/root"
    assert data_prefix("a/b") == "data/root/a/b"


@pytest.mark.parametrize(
    ("separator", "coords", "key"),
    [
        ("/", (0, 1), "c0/1"),
        (".", (0, 1), "c0.1"),
        ("/", (3,), "c3"),
        (".", (12, 0, 7), "c12.0.7"),
        ("/", (), "c0"),  # zarr-python 2.18 names a 0-d array's chunk as if it had one axis
        (".", (), "c0"),
    ],
)
def test_chunk_key_round_trip(separator: str, coords: tuple[int, ...], key: str) -> None:
    keys = DraftChunkKeys(separator)
    assert keys.encode(coords) == key
    assert keys.decode(key, len(coords)) == coords


@pytest.mark.parametrize(
    ("separator", "key", "ndim"),
    [
        ("/", "c00/1", 2),
        ("/", "c+1/2", 2),
        ("/", "c-1/2", 2),
        ("/", "c 1/2", 2),
        ("/", "c0/1/2", 2),
        ("/", "c0", 2),
        ("/", "c0.1", 2),
        (".", "c0/1", 2),
        ("/", "c/0/1", 2),  # final v3 spelling
        ("/", "0/1", 2),
        ("/", "d0/1", 2),
        ("/", "c0/", 2),
        ("/", "c\u0661/0", 2),  # a non-ASCII digit
        ("/", "c", 0),
        ("/", "c00", 0),
        ("/", "c1", 0),
        ("/", "c", 1),
        (".", "c0.0", 1),
    ],
)
def test_chunk_key_rejects(separator: str, key: str, ndim: int) -> None:
    assert DraftChunkKeys(separator).decode(key, ndim) is None


def test_dir_path() -> None:
    keys = DraftChunkKeys("/")
    assert keys.dir_path(()) == ""
    assert keys.dir_path((0,)) == "c0"
    assert keys.dir_path((0, 1)) == "c0/1"
    assert keys.encode((0, 1, 5)).startswith(keys.dir_path((0, 1)) + "/")


# -- entry point and groups ------------------------------------------------------------

ENTRY = {
    "extensions": [],
    "metadata_encoding": DRAFT_FORMAT,
    "metadata_key_suffix": ".json",
    "zarr_format": DRAFT_FORMAT,
}


def test_entry_point() -> None:
    assert is_draft_entry_point(json.dumps(ENTRY).encode())
    final = {"zarr_format": 3, "node_type": "group", "attributes": {}}
    assert not is_draft_entry_point(json.dumps(final).encode())
    for garbage in (b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"zarr_format": 2}'):
        assert not is_draft_entry_point(garbage)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metadata_key_suffix": ".js"}, "metadata_key_suffix '.js'"),
        ({"metadata_encoding": "other"}, "metadata_encoding 'other'"),
        ({"extensions": ["x"]}, r"extensions \['x'\]"),
    ],
)
def test_entry_point_refuses_unsupported_drafts(change: dict, message: str) -> None:
    with pytest.raises(InvalidMetadata, match=message):
        is_draft_entry_point(json.dumps(ENTRY | change).encode())


def test_translate_group() -> None:
    assert translate_group({"attributes": {"a": [1]}}) == {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {"a": [1]},
    }
    assert translate_group({})["attributes"] == {}
    with pytest.raises(InvalidMetadata, match="not a JSON object"):
        translate_group([])
    with pytest.raises(InvalidMetadata, match="attributes are not a JSON object"):
        translate_group({"attributes": 3})


# -- array translation -------------------------------------------------------------------

DOC = {
    "attributes": {"x": "y"},
    "chunk_grid": {"chunk_shape": [3, 2], "separator": "/", "type": "regular"},
    "chunk_memory_layout": "C",
    "compressor": {
        "codec": "https://purl.org/zarr/spec/codec/blosc/1.0",
        "configuration": {"blocksize": 0, "clevel": 5, "cname": "lz4", "shuffle": 1},
    },
    "data_type": "<i4",
    "extensions": [],
    "fill_value": -1,
    "shape": [10, 7],
    "storage_transformers": [
        {
            "configuration": {"chunks_per_shard": [2, 2]},
            "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
            "type": "indexed",
        }
    ],
}


def test_translate_sharded_array() -> None:
    assert translate_array(DOC) == {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [10, 7],
        "data_type": "int32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [6, 4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": -1,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [3, 2],
                    "codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {
                            "name": "blosc",
                            "configuration": {
                                "cname": "lz4",
                                "clevel": 5,
                                "shuffle": "shuffle",
                                "typesize": 4,
                                "blocksize": 0,
                            },
                        },
                    ],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_location": "end",
                },
            }
        ],
        "attributes": {"x": "y"},
    }
    assert DOC["attributes"] == {"x": "y"}  # the input is not modified


@pytest.mark.parametrize(
    ("data_type", "fill", "name", "v3_fill"),
    [
        ("bool", False, "bool", False),
        ("i1", -5, "int8", -5),
        ("u1", 255, "uint8", 255),
        (">u2", 1, "uint16", 1),
        ("<i8", -(2**63), "int64", -(2**63)),
        ("<u8", 2**64 - 1, "uint64", 2**64 - 1),
        ("<f2", 1.5, "float16", 1.5),
        (">f4", "Infinity", "float32", "Infinity"),
        ("<f8", "-Infinity", "float64", "-Infinity"),
        ("<f8", float("nan"), "float64", "NaN"),  # a bare NaN parsed by a lenient reader
        ("<c8", [1.0, "NaN"], "complex64", [1.0, "NaN"]),
        (">c16", [0.0, -2.5], "complex128", [0.0, -2.5]),
        ("<i4", None, "int32", 0),
        ("<c8", None, "complex64", [0.0, 0.0]),
    ],
)
def test_data_types_and_fill_values(data_type: str, fill: Any, name: str, v3_fill: Any) -> None:
    doc = {k: v for k, v in DOC.items() if k not in ("compressor", "storage_transformers")}
    meta = translate_array(doc | {"data_type": data_type, "fill_value": fill})
    assert (meta["data_type"], meta["fill_value"]) == (name, v3_fill)
    bytes_codec = meta["codecs"][-1]
    endian = {"<": "little", ">": "big"}.get(data_type[0])
    assert bytes_codec == (
        {"name": "bytes", "configuration": {"endian": endian}} if endian else {"name": "bytes"}
    )


def test_one_dimensional_f_order_has_no_transpose() -> None:
    doc = DOC | {
        "shape": [10],
        "chunk_grid": {"chunk_shape": [3], "separator": ".", "type": "regular"},
        "chunk_memory_layout": "F",
        "storage_transformers": [],
    }
    meta = translate_array(doc)
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "blosc"]
    assert meta["chunk_key_encoding"]["configuration"]["separator"] == "."


def changed(path: str, value: Any) -> dict:
    """DOC with the field at the dotted `path` replaced (or removed if value is ...)."""
    doc = copy.deepcopy(DOC)
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "not a JSON object"),
        (changed("data_type", "<U4"), "unsupported data type '<U4'"),
        (changed("data_type", "|i2"), r"unsupported data type '\|i2'"),
        (changed("data_type", "<f16"), "unsupported data type '<f16'"),
        (
            changed("data_type", {"extension": "TODO: object array protocol URL", "type": "|O"}),
            "'|O' of extension 'TODO: object array protocol URL' has no Zarr v3 equivalent",
        ),
        (
            changed("data_type", {"extension": "https://x/datetime/v1.0.html", "type": "<M8[s]"}),
            "has no Zarr v3 equivalent",
        ),
        (
            changed("compressor.codec", "https://purl.org/zarr/spec/codec/snappy/1.0"),
            "unknown compressor",
        ),
        (
            changed("compressor.codec", "https://purl.org/zarr/spec/codec/blosc/2.0"),
            "unknown compressor",
        ),
        (changed("compressor.configuration.shuffle", 3), "blosc shuffle 3"),
        (changed("compressor.configuration.cname", "lz5"), "unknown blosc cname 'lz5'"),
        (changed("compressor.configuration.typo", 1), r"unknown \['typo'\]"),
        (
            changed(
                "compressor",
                {"codec": "https://purl.org/zarr/spec/codec/gzip/1.0", "configuration": {}},
            ),
            r"gzip configuration \{\}: missing \['level'\]",
        ),
        (
            changed("storage_transformers.0.extension", "https://x/other"),
            "unknown storage transformer",
        ),
        (changed("storage_transformers.0.type", "hashed"), "type 'hashed' is not 'indexed'"),
        (
            changed("storage_transformers.0.configuration.chunks_per_shard", [2, 2, 2]),
            r"chunks_per_shard \[2, 2, 2\] has more axes than the array \(2\)",
        ),
        (
            changed("storage_transformers.0.configuration.chunks_per_shard", [2, 0]),
            "chunks_per_shard",
        ),
        (
            changed("storage_transformers", [DOC["storage_transformers"][0]] * 2),
            "2 storage transformers",
        ),
        (changed("extensions", ["https://x/ext"]), "requires extensions"),
        (changed("must_understand", True), r"unknown fields \['must_understand'\]"),
        (changed("chunk_grid.type", "rectilinear"), "not a regular grid"),
        (changed("chunk_grid.chunk_shape", [3]), "differ in rank"),
        (changed("chunk_grid.chunk_shape", [3, 0]), "chunk_shape must be a list of integers >= 1"),
        (changed("chunk_grid.separator", "-"), "separator '-'"),
        (changed("dimension_separator", "."), "contradicts the chunk grid separator"),
        (changed("chunk_memory_layout", "K"), "chunk_memory_layout 'K'"),
        (changed("shape", [10, -1]), "shape must be"),
        (changed("fill_value", 1.5), "fill_value 1.5 is not an integer of type int32"),
        (changed("fill_value", 2**31), "is not an integer of type int32"),
        (changed("fill_value", True), "is not an integer of type int32"),
        (
            changed("attributes.filters", [{"id": "categorize"}]),
            "filter 'categorize' has no array-to-array",
        ),
        (changed("attributes.filters", [{"id": "shuffle", "elementsize": 4}]), "filter 'shuffle'"),
        (changed("attributes.filters", [{"dtype": "<i4"}]), "malformed filter"),
        (changed("attributes.filters", [{"id": "packbits"}]), "'packbits' receives <i4, not bool"),
        (
            changed("attributes.filters", [{"id": "delta", "dtype": "<i2", "astype": "<i2"}]),
            "filter 'delta' declares dtype <i2, but receives <i4",
        ),
        (
            changed("attributes.filters", [{"id": "delta", "dtype": "<i4", "astype": "<U2"}]),
            "unsupported data type '<U2'",
        ),
        (
            changed(
                "attributes.filters",
                [{"id": "quantize", "digits": 1, "dtype": "<i4", "astype": "<f4"}],
            ),
            "'quantize' with astype <f4",
        ),
    ],
)
def test_untranslatable_arrays_are_refused(doc: Any, message: str) -> None:
    with pytest.raises(InvalidMetadata, match=message):
        translate_array(doc)


def test_bool_and_float_fill_values_are_checked() -> None:
    plain = {k: v for k, v in DOC.items() if k != "storage_transformers"}
    with pytest.raises(InvalidMetadata, match="fill_value 1 is not a boolean"):
        translate_array(plain | {"data_type": "bool", "fill_value": 1})
    with pytest.raises(InvalidMetadata, match="fill_value 'nan' is not a number"):
        translate_array(plain | {"data_type": "<f4", "fill_value": "nan"})
    with pytest.raises(InvalidMetadata, match=r"complex fill_value 1.0 is not \[real, imaginary\]"):
        translate_array(plain | {"data_type": "<c8", "fill_value": 1.0})
