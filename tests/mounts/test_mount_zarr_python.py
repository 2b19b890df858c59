"""Sharded arrays written by zarr-python 3, mounted for real, read as plain arrays.

One source group holds every case (index placement and codecs, partial edge
shards, sparse data, nested sharding, 1-D to 5-D, several dtypes and fill
values, big-endian chunks, transposes inside and before the shard, all four
chunk key spellings, unsharded arrays, attributes, whole-shard compression).
It is mounted once for the module; each test then checks one promise of the
view against the numpy data that was written, never against shardfs itself:
values read by zarr-python 3 and tensorstore, the rewritten `zarr.json`, the
exact set of chunk files, their bytes, sizes and mtimes, and byte-identical
passthrough of everything that is not a sharded array.

zarr-python 3.1.6 accepted every writer combination needed here. Two of its
habits shape the cases: `serializer=ShardingCodec(...)` adds a default zstd
*after* sharding unless `compressors=None` is given, and `filters=` together
with `shards=` puts the filters *inside* the shard; a transpose before
sharding therefore needs `serializer=` plus `filters=`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.codecs import (
    BytesCodec,
    Crc32cCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

from tests.conftest import Mounted, start_mount, stop_mount
from tests.support.backends import BACKENDS, bucket

pytestmark = [
    pytest.mark.fuse,
    # zarr-python's advice about sharding followed by other codecs; the point of some cases.
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

NAN = float("nan")


@dataclass(frozen=True)
class Case:
    """One sharded array: how zarr-python writes it and what the view must show.

    `chunks` is the innermost chunk shape in array axis order (the view's chunk
    shape). `raw` is set when the innermost chunks are stored uncompressed:
    (endian, transposes applied in order before `bytes`), so the exact bytes of
    each chunk file can be predicted from the data.
    """

    name: str
    data: np.ndarray = field(repr=False)
    fill: Any
    shards: tuple[int, ...]
    chunks: tuple[int, ...]
    options: dict[str, Any] = field(repr=False)
    keys: tuple[str, str] = ("default", "/")
    raw: tuple[str, tuple[tuple[int, ...], ...]] | None = None
    sparse: bool = False


def random_data(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Dense values; small integer ranges so some inner chunks equal the fill by chance."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.3
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype)


def with_holes(data: np.ndarray, fill: Any, *holes: tuple[slice, ...]) -> np.ndarray:
    """`data` with the given regions set to the fill value (empty inner chunks)."""
    data = data.copy()
    for hole in holes:
        data[hole] = fill
    return data


def sparse_data(shape: tuple[int, ...], dtype: str, fill: Any, points: dict) -> np.ndarray:
    """All fill except a few points: most inner chunks and whole shards stay unwritten."""
    data = np.full(shape, fill, dtype=dtype)
    for point, value in points.items():
        data[point] = value
    return data


def simple(
    name: str,
    data: np.ndarray,
    fill: Any,
    shards: tuple[int, ...],
    chunks: tuple[int, ...],
    sparse: bool = False,
) -> Case:
    """An array written with zarr-python's own defaults (`shards=`, inner bytes + zstd)."""
    options = {"shards": shards, "chunks": chunks}
    return Case(name, data, fill, shards, chunks, options, sparse=sparse)


def custom(
    name: str,
    data: np.ndarray,
    fill: Any,
    shards: tuple[int, ...],
    chunks: tuple[int, ...],
    serializer: ShardingCodec,
    raw: tuple[str, tuple[tuple[int, ...], ...]] | None = ("little", ()),
    keys: tuple[str, str] = ("default", "/"),
    sparse: bool = False,
    **options: Any,
) -> Case:
    """An array with an explicit `ShardingCodec` and nothing after it."""
    options = {"chunks": shards, "serializer": serializer, "compressors": None, **options}
    if keys != ("default", "/"):
        options["chunk_key_encoding"] = {"name": keys[0], "separator": keys[1]}
    return Case(name, data, fill, shards, chunks, options, keys, raw, sparse)


def index_cases() -> list[Case]:
    """index_location x index_codecs (with/without crc32c, little/big endian), partial edges."""
    cases = []
    for location in ("start", "end"):
        for endian in ("little", "big"):
            for crc in (True, False):
                name = f"index_{location}_{endian}_{'crc' if crc else 'nocrc'}"
                codecs = [BytesCodec(endian=endian), *([Crc32cCodec()] if crc else [])]
                sharding = ShardingCodec(
                    chunk_shape=(2, 3), index_location=location, index_codecs=codecs
                )
                data = with_holes(random_data((10, 9), "int16", len(cases)), 0, (slice(0, 2),))
                cases.append(custom(name, data, 0, (4, 6), (2, 3), sharding))
    return cases


def nested(
    chunk_shape: tuple[int, ...], inner: ShardingCodec | None = None, **kw: Any
) -> ShardingCodec:
    """A ShardingCodec whose inner codecs are `inner` (another ShardingCodec) or plain bytes."""
    return ShardingCodec(chunk_shape=chunk_shape, codecs=[inner or BytesCodec()], **kw)


CASES: list[Case] = [
    *index_cases(),
    # 1-D to 5-D, dtypes, fill values; zarr-python's default inner codecs (bytes + zstd).
    simple("d1_bool", random_data((37,), "bool", 1), False, (8,), (4,)),
    simple(
        "d2_int8",
        with_holes(random_data((13, 11), "int8", 2), 0, (slice(6, 9), slice(0, 4))),
        0,
        (6, 4),
        (3, 2),
    ),
    simple(
        "d3_uint16",
        with_holes(random_data((7, 9, 5), "uint16", 3), 3, (slice(4, 7), slice(0, 4))),
        3,
        (4, 4, 4),
        (2, 2, 2),
    ),
    simple(
        "d4_int64",
        with_holes(random_data((5, 6, 3, 4), "int64", 4), -1, (slice(0, 2), slice(2, 4))),
        -1,
        (4, 4, 2, 4),
        (2, 2, 1, 2),
    ),
    simple(
        "d5_float64",
        with_holes(random_data((3, 4, 5, 2, 3), "float64", 5), 0.5, (slice(0, 1), slice(0, 2))),
        0.5,
        (2, 4, 4, 2, 3),
        (1, 2, 2, 1, 3),
    ),
    custom(
        "d3_float32_nan",
        with_holes(random_data((9, 10, 11), "float32", 6), NAN, (slice(4, 9), slice(0, 4))),
        NAN,
        (4, 4, 6),
        (2, 2, 3),
        ShardingCodec(chunk_shape=(2, 2, 3)),
    ),
    # Sparse: empty inner chunks and entirely missing shards.
    custom(
        "sparse_float64",
        sparse_data((24, 20), "float64", 0.0, {(0, 0): 1.5, (9, 13): -2.0, (23, 19): 3.0}),
        0.0,
        (8, 8),
        (2, 4),
        ShardingCodec(chunk_shape=(2, 4)),
        sparse=True,
    ),
    custom(
        "sparse_uint16_fill7",
        sparse_data((16, 16, 4), "uint16", 7, {(1, 2, 3): 0, (12, 5, 0): 9}),
        7,
        (8, 8, 4),
        (4, 4, 2),
        ShardingCodec(chunk_shape=(4, 4, 2), index_location="start"),
        sparse=True,
    ),
    simple(
        "sparse_float32_nan",
        sparse_data((30,), "float32", NAN, {3: 0.0, 27: 1.0}),
        NAN,
        (10,),
        (5,),
        sparse=True,
    ),
    # Nested sharding, flattened to the innermost chunks.
    custom(
        "nested2",
        with_holes(random_data((12, 10), "int32", 7), 0, (slice(0, 4), slice(0, 4))),
        0,
        (8, 8),
        (2, 2),
        nested((4, 4), nested((2, 2))),
    ),
    custom(
        "nested_mixed_index",
        with_holes(random_data((6, 8, 9), "uint16", 8), 0, (slice(0, 3), slice(4, 8))),
        0,
        (6, 8, 8),
        (3, 2, 2),
        nested(
            (3, 4, 8),
            ShardingCodec(chunk_shape=(3, 2, 2), codecs=[BytesCodec(endian="big")]),
            index_location="start",
            index_codecs=[BytesCodec()],
        ),
        raw=("big", ()),
    ),
    custom(
        "nested3",
        sparse_data((16, 16), "float32", 0.0, {(0, 0): 1.0, (5, 9): 2.0, (15, 15): 3.0}),
        0.0,
        (16, 16),
        (2, 2),
        nested((8, 8), nested((4, 4), nested((2, 2)), index_location="start")),
    ),
    # Big-endian inner chunks.
    custom(
        "big_endian_uint16",
        random_data((10, 10), "uint16", 9),
        0,
        (4, 4),
        (2, 2),
        ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec(endian="big")]),
        raw=("big", ()),
    ),
    custom(
        "big_endian_float64_zstd",
        random_data((9, 7), "float64", 10),
        0.0,
        (4, 4),
        (2, 2),
        ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec(endian="big"), ZstdCodec()]),
        raw=None,
    ),
    # Transposes inside the shard, before sharding, and both.
    custom(
        "transpose_inside",
        random_data((6, 8, 10), "int16", 11),
        0,
        (3, 4, 10),
        (3, 2, 5),
        ShardingCodec(
            chunk_shape=(3, 2, 5), codecs=[TransposeCodec(order=(2, 0, 1)), BytesCodec()]
        ),
        raw=("little", ((2, 0, 1),)),
    ),
    custom(
        "transpose_before_2d",
        random_data((14, 9), "uint16", 12),
        0,
        (6, 6),
        (2, 3),
        ShardingCodec(chunk_shape=(3, 2)),
        raw=("little", ((1, 0),)),
        filters=[TransposeCodec(order=(1, 0))],
    ),
    custom(
        "transpose_before_3d",
        with_holes(random_data((7, 8, 9), "float32", 13), 0.0, (slice(0, 3), slice(0, 2))),
        0.0,
        (6, 6, 6),
        (3, 2, 6),
        ShardingCodec(chunk_shape=(6, 3, 2)),
        raw=("little", ((2, 0, 1),)),
        filters=[TransposeCodec(order=(2, 0, 1))],
    ),
    custom(
        "transpose_both",
        random_data((5, 8, 8), "int64", 14),
        0,
        (4, 4, 4),
        (1, 2, 4),
        ShardingCodec(
            chunk_shape=(2, 4, 1),
            codecs=[TransposeCodec(order=(2, 0, 1)), BytesCodec(endian="big")],
        ),
        raw=("big", ((1, 2, 0), (2, 0, 1))),
        filters=[TransposeCodec(order=(1, 2, 0))],
    ),
    # All four chunk key spellings; one shard of each is entirely missing.
    *(
        custom(
            f"keys_{name}_{'slash' if sep == '/' else 'dot'}",
            with_holes(
                random_data((9, 7, 5), "int32", 15),
                0,
                (slice(4, 8), slice(0, 4)),
                (slice(0, 2), slice(0, 2), slice(0, 5)),
            ),
            0,
            (4, 4, 5),
            (2, 2, 5),
            ShardingCodec(chunk_shape=(2, 2, 5)),
            keys=(name, sep),
            sparse=True,
        )
        for name in ("default", "v2")
        for sep in ("/", ".")
    ),
    # A sharded array inside a group, with attributes and dimension names.
    custom(
        "meta/sharded",
        random_data((6, 5), "float32", 16),
        0.0,
        (4, 4),
        (2, 2),
        ShardingCodec(chunk_shape=(2, 2)),
        attributes={"units": "K", "scale": [1, 2.5], "note": "größe"},
        dimension_names=["y", "x"],
    ),
]

#: Unsharded arrays (data, fill, options) next to the sharded ones; with the groups they
#: must pass through unchanged.
PLAIN: dict[str, tuple[np.ndarray, Any, dict[str, Any]]] = {
    "meta/plain": (
        np.arange(100, dtype="int32").reshape(10, 10),
        0,
        {"chunks": (3, 3), "attributes": {"units": "m", "valid": [0, 99]}},
    ),
    "meta/plain_v2": (
        sparse_data((9, 8), "float32", NAN, {(0, 0): 1.0, (8, 7): 2.0}),
        NAN,
        {"chunks": (4, 4), "chunk_key_encoding": {"name": "v2", "separator": "."}},
    ),
}

#: Whole-shard compression: zstd after sharding_indexed. The view must show it unchanged.
WHOLE = "whole_shard_zstd"
WHOLE_DATA = random_data((10, 10), "uint8", 17)
WHOLE_OPTIONS = {
    "chunks": (4, 4),
    "serializer": ShardingCodec(chunk_shape=(2, 2)),
    "compressors": [ZstdCodec()],
}

SHARDED = {case.name for case in CASES}
RAW_CASES = [case for case in CASES if case.raw is not None]


def build(source: Path) -> None:
    """Write every array with zarr-python 3 into one hierarchy."""
    root = zarr.open_group(source, mode="w", attributes={"title": "shardfs", "n": 3})
    root.create_group("meta", attributes={"level": 1, "title": "café"})
    arrays = [(c.name, c.data, c.fill, c.options) for c in CASES]
    arrays += [(name, *spec) for name, spec in PLAIN.items()]
    arrays.append((WHOLE, WHOLE_DATA, 0, WHOLE_OPTIONS))
    for name, data, fill, options in arrays:
        parent, _, leaf = name.rpartition("/")
        group = root[parent] if parent else root
        assert isinstance(group, zarr.Group)
        array = group.create_array(
            leaf, shape=data.shape, dtype=data.dtype, fill_value=fill, **options
        )
        array[...] = data


@dataclass(frozen=True)
class Tree:
    """The written hierarchy and its one mount."""

    source: Path
    mounted: Mounted
    #: how shardfs names the source (a path, or an s3:// URL) in its log lines
    url: str

    @property
    def view(self) -> Path:
        return self.mounted.path


@pytest.fixture(scope="module", params=BACKENDS)
def tree(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tree]:
    """The whole hierarchy, written once per backend and mounted once for the module.

    On S3, zarr-python writes straight into the bucket, and `source` is a copy
    of what it stored there, for the checks of stored bytes.
    """
    base = tmp_path_factory.mktemp("zarr_python")
    source = base / "src"
    with ExitStack() as stack:
        if request.param == "local":
            build(source)
            url, options = str(source), []
        else:
            s3 = stack.enter_context(bucket(request.getfixturevalue("moto_server"), "zarr-python"))
            build(s3.zarr_store("src"))
            s3.download_tree("src", source)
            pages = s3.admin.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket)
            for item in (item for page in pages for item in page.get("Contents", ())):
                when = item["LastModified"].timestamp()  # the mtime S3 reports
                os.utime(source / item["Key"].removeprefix("src/"), (when, when))
            url, options = s3.url("src"), s3.mount_options()
        mounted = start_mount(url, base / "mnt", base / "mnt.log", *options)
        stack.callback(stop_mount, mounted)
        yield Tree(source, mounted, url)


# -- the oracle: what the view must show, derived from the written data ------------------


def encode(coords: tuple[int, ...], keys: tuple[str, str]) -> str:
    """A chunk (or shard) key, as the chunk key encoding spells it."""
    name, separator = keys
    parts = [str(i) for i in coords]
    return separator.join(["c", *parts] if name == "default" else parts)


def region(case: Case, coords: tuple[int, ...]) -> np.ndarray:
    """The in-bounds values of the view chunk at `coords`."""
    return case.data[
        tuple(slice(i * n, (i + 1) * n) for i, n in zip(coords, case.chunks, strict=True))
    ]


def all_fill(values: np.ndarray, fill: Any) -> bool:
    if isinstance(fill, float) and math.isnan(fill):
        return bool(np.isnan(values).all())
    return bool((values == fill).all())


def grid(case: Case) -> list[tuple[int, ...]]:
    """Every in-bounds view chunk."""
    return list(
        np.ndindex(*(-(-s // n) for s, n in zip(case.data.shape, case.chunks, strict=True)))
    )


def nonempty_chunks(case: Case) -> list[tuple[int, ...]]:
    """The chunks zarr-python stores: those not entirely equal to the fill value."""
    return [c for c in grid(case) if not all_fill(region(case, c), case.fill)]


def shard_of(case: Case, coords: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i // (s // n) for i, s, n in zip(coords, case.shards, case.chunks, strict=True))


def chunk_keys(case: Case) -> set[str]:
    return {encode(c, case.keys) for c in nonempty_chunks(case)}


def raw_chunk(case: Case, coords: tuple[int, ...]) -> bytes:
    """The stored bytes of an uncompressed chunk: padded with the fill, transposed, encoded."""
    assert case.raw is not None
    endian, transposes = case.raw
    block = np.full(case.chunks, case.fill, dtype=case.data.dtype)
    values = region(case, coords)
    block[tuple(slice(0, n) for n in values.shape)] = values
    for order in transposes:
        block = block.transpose(order)
    order_char = "<" if endian == "little" else ">"
    return block.astype(block.dtype.newbyteorder(order_char)).tobytes()


def files_below(directory: Path) -> set[str]:
    """Relative paths of all regular files below `directory`, except its own zarr.json."""
    found = set()
    for parent, _, names in os.walk(directory):
        for name in names:
            found.add((Path(parent) / name).relative_to(directory).as_posix())
    found.discard("zarr.json")
    return found


def tensorstore_open(path: Path) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return ts.open(spec, read=True).result()


by_case = pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)


# -- tests -------------------------------------------------------------------------------


@by_case
def test_source_holds_exactly_the_nonempty_shards(tree: Tree, case: Case) -> None:
    """Precondition: the oracle agrees with what zarr-python actually wrote."""
    chunks = nonempty_chunks(case)
    shards = {shard_of(case, c) for c in chunks}
    assert files_below(tree.source / case.name) == {encode(s, case.keys) for s in shards}
    assert chunks, "every case stores something"
    if case.sparse:
        shard_grid = tuple(-(-s // n) for s, n in zip(case.data.shape, case.shards, strict=True))
        assert len(shards) < math.prod(shard_grid), "some shard is entirely missing"
        assert any(shard_of(case, c) in shards and c not in chunks for c in grid(case)), (
            "some existing shard has an empty inner chunk"
        )


@by_case
def test_view_metadata_is_unsharded(tree: Tree, case: Case) -> None:
    source = json.loads((tree.source / case.name / "zarr.json").read_bytes())
    view = json.loads((tree.view / case.name / "zarr.json").read_bytes())
    assert "sharding_indexed" in json.dumps(source["codecs"])
    assert "sharding_indexed" not in json.dumps(view["codecs"])
    assert view["chunk_grid"] == {
        "name": "regular",
        "configuration": {"chunk_shape": list(case.chunks)},
    }
    assert set(view) == set(source)
    for key in set(source) - {"chunk_grid", "codecs"}:
        assert view[key] == source[key], key


@by_case
def test_zarr_python_reads_the_view_as_unsharded(tree: Tree, case: Case) -> None:
    array = zarr.open_array(tree.view / case.name, mode="r")
    assert array.shards is None
    assert not any(isinstance(c, ShardingCodec) for c in array.metadata.codecs)
    assert array.chunks == case.chunks
    values = array[...]
    assert values.dtype == case.data.dtype
    np.testing.assert_array_equal(values, case.data)


@by_case
def test_tensorstore_reads_the_view_as_unsharded(tree: Tree, case: Case) -> None:
    store = tensorstore_open(tree.view / case.name)
    assert tuple(store.chunk_layout.read_chunk.shape) == case.chunks
    values = store.read().result()
    assert values.dtype == case.data.dtype
    np.testing.assert_array_equal(values, case.data)


@by_case
def test_chunk_files_are_the_nonempty_inner_chunks(tree: Tree, case: Case) -> None:
    assert files_below(tree.view / case.name) == chunk_keys(case)


@pytest.mark.parametrize("case", RAW_CASES, ids=lambda c: c.name)
def test_chunk_files_hold_the_stored_bytes(tree: Tree, case: Case) -> None:
    for coords in nonempty_chunks(case):
        key = encode(coords, case.keys)
        assert (tree.view / case.name / key).read_bytes() == raw_chunk(case, coords), key


@by_case
def test_shard_files_are_hidden(tree: Tree, case: Case) -> None:
    """A shard name is either absent from the view or is a chunk's name with the chunk's bytes."""
    keys = chunk_keys(case)
    shards = files_below(tree.source / case.name)
    for shard in shards:
        shown = tree.view / case.name / shard
        if shard in keys:
            assert shown.read_bytes() != (tree.source / case.name / shard).read_bytes(), shard
        else:
            assert not os.path.lexists(shown), shard
    assert not any(name in shards for name in os.listdir(tree.view / case.name) if name not in keys)


@by_case
def test_chunk_stat_matches_bytes_and_shard_mtime(tree: Tree, case: Case) -> None:
    for coords in nonempty_chunks(case):
        key = encode(coords, case.keys)
        shown = tree.view / case.name / key
        shard = tree.source / case.name / encode(shard_of(case, coords), case.keys)
        stat = os.stat(shown)
        assert stat.st_size == len(shown.read_bytes()), key
        assert stat.st_mtime_ns == os.stat(shard).st_mtime_ns, key


def test_groups_and_unsharded_arrays_pass_through_byte_identical(tree: Tree) -> None:
    compared = 0
    for parent, dirs, names in os.walk(tree.source):
        rel = Path(parent).relative_to(tree.source)
        if rel.as_posix() in SHARDED:
            dirs.clear()
            continue
        assert sorted(os.listdir(tree.view / rel)) == sorted([*dirs, *names]), rel
        for name in names:
            assert (tree.view / rel / name).read_bytes() == (Path(parent) / name).read_bytes()
            compared += 1
    assert compared > len(PLAIN) + 2  # the groups, plain arrays and their chunks
    for path, (data, _, _) in PLAIN.items():
        np.testing.assert_array_equal(zarr.open_array(tree.view / path, mode="r")[...], data)
        np.testing.assert_array_equal(tensorstore_open(tree.view / path).read().result(), data)
    view_group = zarr.open_group(tree.view / "meta", mode="r")
    assert dict(view_group.attrs) == {"level": 1, "title": "café"}


def test_whole_shard_compression_is_shown_unchanged(tree: Tree) -> None:
    source, view = tree.source / WHOLE, tree.view / WHOLE
    codecs = json.loads((source / "zarr.json").read_bytes())["codecs"]
    assert [c["name"] for c in codecs] == ["sharding_indexed", "zstd"]
    assert (view / "zarr.json").read_bytes() == (source / "zarr.json").read_bytes()
    shards = files_below(source)
    assert shards and files_below(view) == shards
    for shard in shards:
        assert (view / shard).read_bytes() == (source / shard).read_bytes()
    array = zarr.open_array(view, mode="r")
    assert isinstance(array.metadata.codecs[0], ShardingCodec)
    np.testing.assert_array_equal(array[...], WHOLE_DATA)
    named = f"{tree.url}/{WHOLE}"
    lines = [line for line in tree.mounted.log().splitlines() if named in line]
    assert len(lines) == 1 and "zstd" in lines[0], lines
