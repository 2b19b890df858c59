"""Sharded arrays written by tensorstore, read through a shardfs mount as plain unsharded arrays.

tensorstore is an independent writer of `sharding_indexed`, so these tests check shardfs against
another implementation's byte layout: index at either end, with or without crc32c, partial edge
shards, sparse shards, nested sharding, transposes, endianness and every chunk key encoding. The
view is read back by tensorstore and zarr-python and compared with the numpy data written.
One source hierarchy and one mount per backend (a local directory, and S3 that tensorstore
writes to itself) are shared by the whole module to keep it fast.
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.storage import LocalStore

from tests.conftest import Mounted, start_mount, stop_mount
from tests.support.backends import BACKENDS, bucket

pytestmark = pytest.mark.fuse

GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}
Index = Any  # a numpy index expression


def sharding(
    chunk_shape: list[int],
    codecs: list[Any] | None = None,
    *,
    location: str | None = None,
    index_codecs: list[Any] | None = None,
) -> dict[str, Any]:
    """A `sharding_indexed` codec; unset options are left to the writer's defaults."""
    config: dict[str, Any] = {"chunk_shape": chunk_shape, "codecs": codecs or ["bytes"]}
    if location is not None:
        config["index_location"] = location
    if index_codecs is not None:
        config["index_codecs"] = index_codecs
    return {"name": "sharding_indexed", "configuration": config}


def transpose(order: list[int]) -> dict[str, Any]:
    return {"name": "transpose", "configuration": {"order": order}}


def endian_bytes(endian: str) -> dict[str, Any]:
    return {"name": "bytes", "configuration": {"endian": endian}}


@dataclass(frozen=True)
class Case:
    """One array: its metadata, the regions written, and the view chunk shape we expect.

    `chunks` is the innermost chunk shape in array axis order, worked out by hand
    (not by shardfs) so that the view's chunk grid and file names are checked
    independently.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: tuple[int, ...]
    codecs: list[Any]
    chunks: tuple[int, ...]
    fill: Any = 0
    keys: dict[str, Any] | None = None
    regions: tuple[Index, ...] = (...,)
    expected: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expected", self._values())

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "shape": list(self.shape),
            "data_type": self.dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(self.shard)}},
            "codecs": self.codecs,
            "fill_value": self.fill,
        }
        if self.keys is not None:
            meta["chunk_key_encoding"] = self.keys
        return meta

    def fill_scalar(self) -> np.ndarray:
        return np.array(np.nan if self.fill == "NaN" else self.fill, dtype=self.dtype)

    def _values(self) -> np.ndarray:
        """The array after the writes: random non-fill values in `regions`, fill elsewhere."""
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        dtype = np.dtype(self.dtype)
        if dtype.kind == "b":
            values = rng.random(self.shape) < 0.5
        elif dtype.kind == "f":
            values = (rng.random(self.shape) * 100 + 1).astype(dtype)
        else:
            values = rng.integers(10, 100, self.shape).astype(dtype)
        out = np.full(self.shape, self.fill_scalar(), dtype=dtype)
        for region in self.regions:
            out[region] = values[region]
        return out

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The view file name of a chunk, from the Zarr v3 spec's key encodings."""
        keys = self.keys or {"name": "default"}
        default_sep = "/" if keys["name"] == "default" else "."
        sep = keys.get("configuration", {}).get("separator", default_sep)
        parts = [str(i) for i in coords]
        return sep.join(["c", *parts] if keys["name"] == "default" else parts)

    def nonempty_chunks(self) -> set[str]:
        """Keys of the view chunks holding anything but the fill value (tensorstore stores only those)."""
        grid = [-(-n // c) for n, c in zip(self.shape, self.chunks, strict=True)]
        fill = self.fill_scalar()
        found = set()
        for coords in itertools.product(*map(range, grid)):
            block = self.expected[
                tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, self.chunks, strict=True))
            ]
            empty = np.isnan(block).all() if np.isnan(fill) else (block == fill).all()
            if not empty:
                found.add(self.chunk_key(coords))
        return found


def layout_cases() -> Iterator[Case]:
    """Index location x crc32c x key encoding, on a sparse 2-D array with partial edge shards.

    Shards are 4x4 of 2x2 chunks over a 7x10 array (2x3 shards, the last row and
    column partial). The writes leave three shards missing and half of the
    chunks of shard (0, 1) empty.
    """
    key_encodings = {
        "default-slash": {"name": "default", "configuration": {"separator": "/"}},
        "default-dot": {"name": "default", "configuration": {"separator": "."}},
        "v2-dot": {"name": "v2", "configuration": {"separator": "."}},
        "v2-slash": {"name": "v2", "configuration": {"separator": "/"}},
    }
    checksums = {"crc": [endian_bytes("little"), "crc32c"], "nocrc": [endian_bytes("little")]}
    for location, (crc, index_codecs), (key_name, keys) in itertools.product(
        ["start", "end"], checksums.items(), key_encodings.items()
    ):
        yield Case(
            f"layout/{location}-{crc}-{key_name}",
            (7, 10),
            "int32",
            (4, 4),
            [sharding([2, 2], location=location, index_codecs=index_codecs)],
            (2, 2),
            keys=keys,
            regions=(np.s_[0:3, 0:5], np.s_[6:7, 9:10]),
        )


def dims_cases() -> Iterator[Case]:
    """1-D to 5-D, fully written, with partial edge shards along every axis."""
    specs = [
        ((37,), (8,), (2,)),
        ((9, 11), (4, 6), (2, 3)),
        ((5, 6, 7), (4, 4, 4), (2, 2, 2)),
        ((3, 5, 4, 6), (2, 4, 2, 4), (1, 2, 2, 2)),
        ((3, 3, 4, 2, 5), (2, 2, 2, 2, 2), (1, 2, 1, 2, 1)),
    ]
    for shape, shard, inner in specs:
        yield Case(f"dims/{len(shape)}d", shape, "uint16", shard, [sharding(list(inner))], inner)


def dtype_cases() -> Iterator[Case]:
    """Data types and fill values, including NaN fill with sparse writes and big-endian chunks."""
    sparse = (np.s_[0:3, 0:2], np.s_[5:6, 4:7])
    yield Case("dtype/bool", (6, 7), "bool", (4, 4), [sharding([2, 2])], (2, 2), fill=False)
    yield Case("dtype/int8", (6, 7), "int8", (4, 4), [sharding([2, 2])], (2, 2), fill=-5)
    yield Case("dtype/uint32", (6, 7), "uint32", (4, 4), [sharding([2, 2])], (2, 2), fill=1)
    yield Case("dtype/int64", (6, 7), "int64", (4, 4), [sharding([2, 2])], (2, 2))
    yield Case("dtype/float16", (6, 7), "float16", (4, 4), [sharding([2, 2])], (2, 2))
    for dtype in ["float32", "float64"]:
        yield Case(
            f"dtype/{dtype}-nan",
            (6, 7),
            dtype,
            (4, 4),
            [sharding([2, 2])],
            (2, 2),
            fill="NaN",
            regions=sparse,
        )
    for dtype in ["int32", "float64", "uint16"]:
        yield Case(
            f"dtype/{dtype}-big-endian",
            (6, 7),
            dtype,
            (4, 4),
            [sharding([2, 2], [endian_bytes("big")])],
            (2, 2),
            regions=sparse,
        )


def structure_cases() -> Iterator[Case]:
    """Nested sharding, transposes inside and before the shard, inner compression, index codecs."""
    yield Case(
        "nested/two-levels",
        (17, 13),
        "int16",
        (8, 8),
        [sharding([4, 4], [sharding([2, 2], location="start")], location="end")],
        (2, 2),
        regions=(np.s_[0:5, 0:3], np.s_[9:17, 8:13]),
    )
    yield Case(
        "nested/three-levels-nocrc",
        (16, 12),
        "uint8",
        (8, 8),
        [
            sharding(
                [4, 4],
                [
                    sharding(
                        [2, 2],
                        [sharding([1, 2], location="end", index_codecs=[endian_bytes("big")])],
                        location="start",
                        index_codecs=[endian_bytes("little")],
                    )
                ],
            )
        ],
        (1, 2),
        regions=(np.s_[0:3, 1:6], np.s_[12:16, 8:12]),
    )
    yield Case(
        "nested/transposed-levels",
        (6, 8, 5),
        "float32",
        (4, 4, 4),
        # Level 0 space is (z, x, y) of a (4, 4, 4) shard; its (2, 2, 4) chunk is reordered
        # to axes (y, z, x), shape (4, 2, 2); the innermost (2, 1, 2) in that order is
        # (x, y, z) = (2, 2, 1) in array axes.
        [
            transpose([2, 0, 1]),
            sharding([2, 2, 4], [transpose([2, 0, 1]), sharding([2, 1, 2])]),
        ],
        (2, 2, 1),
        fill="NaN",
        regions=(np.s_[0:5, 1:7, 0:3],),
    )
    yield Case(
        "transpose/inside",
        (5, 6, 7),
        "int32",
        (4, 4, 4),
        [sharding([2, 2, 2], [transpose([2, 0, 1]), endian_bytes("little")])],
        (2, 2, 2),
    )
    yield Case(
        "transpose/inside-big-endian",
        (5, 7),
        "float64",
        (4, 6),
        [sharding([2, 3], [transpose([1, 0]), endian_bytes("big")])],
        (2, 3),
    )
    yield Case(
        "transpose/before",
        (5, 7),
        "int16",
        (4, 6),
        [transpose([1, 0]), sharding([3, 2])],  # (3, 2) in the transposed space
        (2, 3),
    )
    yield Case(
        "codec/zstd-crc32c",
        (6, 7),
        "int16",
        (4, 4),
        [sharding([2, 2], ["bytes", {"name": "zstd", "configuration": {"level": 1}}, "crc32c"])],
        (2, 2),
    )
    yield Case(
        "codec/gzip",
        (6, 7),
        "int16",
        (4, 4),
        [sharding([2, 2], ["bytes", {"name": "gzip", "configuration": {"level": 5}}])],
        (2, 2),
        regions=(np.s_[0:2, 0:3],),
    )
    yield Case(
        "index/big-endian-crc",
        (6, 7),
        "int16",
        (4, 4),
        [sharding([2, 2], index_codecs=[endian_bytes("big"), "crc32c"], location="start")],
        (2, 2),
    )
    yield Case(
        "index/two-crc",
        (6, 7),
        "int16",
        (4, 4),
        [sharding([2, 2], index_codecs=["bytes", "crc32c", "crc32c"])],
        (2, 2),
    )


CASES = [*layout_cases(), *dims_cases(), *dtype_cases(), *structure_cases()]


def write_with_tensorstore(kvstore: dict[str, Any], case: Case) -> str | None:
    """Write `case` into `kvstore` with tensorstore; the error text if tensorstore refuses."""
    spec = {"driver": "zarr3", "kvstore": kvstore, "metadata": case.metadata()}
    try:
        array = ts.open(spec, create=True, delete_existing=True).result()
        for region in case.regions:
            array[region].write(case.expected[region]).result()
    except (ValueError, RuntimeError) as e:
        return str(e)
    return None


@dataclass
class Source:
    mounted: Mounted
    refused: dict[str, str]
    #: The stored bytes of a key of the source, read directly.
    stored: Callable[[str], bytes]


@pytest.fixture(scope="module", params=BACKENDS)
def source(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Source]:
    """Every case written by tensorstore into one hierarchy (groups written by hand) on each
    backend, mounted once, read-only."""
    base = tmp_path_factory.mktemp("tensorstore")
    root = base / "src"
    with ExitStack() as stack:
        if request.param == "local":

            def kvstore(path: str) -> dict[str, Any]:
                return {"driver": "file", "path": f"{root / path}/"}

            def put(key: str, data: bytes) -> None:
                (root / key).parent.mkdir(parents=True, exist_ok=True)
                (root / key).write_bytes(data)

            def stored(key: str) -> bytes:
                return (root / key).read_bytes()

            url, options = str(root), []
        else:
            s3 = stack.enter_context(bucket(request.getfixturevalue("moto_server"), "tensorstore"))

            def kvstore(path: str) -> dict[str, Any]:
                return s3.tensorstore_kvstore(f"src/{path}")

            def put(key: str, data: bytes) -> None:
                s3.put(f"src/{key}", data)

            def stored(key: str) -> bytes:
                return s3.get(f"src/{key}")

            url, options = s3.url("src"), s3.mount_options()
        refused = {}
        groups: set[str] = set()
        for case in CASES:
            error = write_with_tensorstore(kvstore(case.name), case)
            if error is not None:
                refused[case.name] = error
            groups.update(str(group) for group in Path(case.name).parents)
        for group in groups:
            put(str(Path(group, "zarr.json")), json.dumps(GROUP).encode())
        mounted = start_mount(url, base / "mnt", base / "mnt.log", *options, "ro")
        stack.callback(stop_mount, mounted)
        yield Source(mounted, refused, stored)


def case_path(source: Source, case: Case) -> Path:
    if case.name in source.refused:
        pytest.skip(f"tensorstore refuses to write this: {source.refused[case.name]}")
    return source.mounted.path / case.name


ids = [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_view_metadata_is_unsharded(source: Source, case: Case) -> None:
    """The view's zarr.json has the inner chunk grid, no sharding, and everything else unchanged."""
    view = json.loads((case_path(source, case) / "zarr.json").read_text())
    original = json.loads(source.stored(f"{case.name}/zarr.json"))
    assert view["chunk_grid"] == {
        "name": "regular",
        "configuration": {"chunk_shape": list(case.chunks)},
    }
    assert "sharding_indexed" not in json.dumps(view["codecs"])
    unchanged = set(original) - {"chunk_grid", "codecs"}
    assert {k: view[k] for k in unchanged} == {k: original[k] for k in unchanged}


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_one_file_per_nonempty_inner_chunk(source: Source, case: Case) -> None:
    """Exactly the inner chunks holding data are files; shards and empty chunks are not shown."""
    path = case_path(source, case)
    files = {
        os.path.relpath(os.path.join(d, f), path)
        for d, _, names in os.walk(path)
        for f in names
        if f != "zarr.json" or d != str(path)
    }
    assert files == case.nonempty_chunks()


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_zarr_python_reads_the_values_written(source: Source, case: Case) -> None:
    array = zarr.open_array(LocalStore(case_path(source, case), read_only=True), mode="r")
    assert array.chunks == case.chunks
    assert array.shards is None
    np.testing.assert_array_equal(array[...], case.expected, strict=True)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_tensorstore_reads_the_values_written(source: Source, case: Case) -> None:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{case_path(source, case)}/"}}
    array = ts.open(spec, open=True, read=True).result()
    assert tuple(array.chunk_layout.read_chunk.shape) == case.chunks
    np.testing.assert_array_equal(array.read().result(), case.expected, strict=True)


def test_daemon_logs_no_errors_or_warnings(source: Source) -> None:
    """Healthy data from another implementation must not trip any shardfs check."""
    for path in source.mounted.path.rglob("*"):
        if path.is_file():
            path.read_bytes()
    log = source.mounted.log()
    assert " ERROR " not in log
    assert " WARNING " not in log
    assert source.mounted.process.poll() is None
