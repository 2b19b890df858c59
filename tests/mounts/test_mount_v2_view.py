"""The zarr v2 view (`-o view=v2`), read by zarr-python 2.18 and tensorstore's zarr2 driver.

The source is the read-path test set written by zarr-python 3 (every case of
tests/mounts/test_mount_zarr_python.py, with its groups and unsharded arrays), plus
inner chains that only the v2 view has to handle: blosc, a crc32c at the end,
and a checksum in the middle of the chain. It is mounted once with
`view=v2`; zarr-python 2 runs in its own virtual environment and hands the
values back as .npy files, which are compared with what was written.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec

from tests.conftest import Mounted, start_mount, stop_mount
from tests.mounts.test_mount_zarr_python import (
    CASES,
    NAN,
    PLAIN,
    WHOLE,
    Case,
    all_fill,
    build,
    custom,
    grid,
    random_data,
    region,
)
from tests.support.zarr2 import Zarr2

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

#: Chains the v2 view must translate (blosc, trailing crc32c) or decode (crc32c mid-chain).
EXTRA: list[Case] = [
    custom(
        "v2/blosc_shuffle",
        random_data((12, 10), "int32", 40),
        0,
        (6, 10),
        (3, 5),
        ShardingCodec(
            chunk_shape=(3, 5),
            codecs=[BytesCodec(), BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")],
        ),
        raw=None,
    ),
    custom(
        "v2/crc32c",
        random_data((9, 8), "uint16", 41),
        0,
        (4, 4),
        (2, 2),
        ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec(), GzipCodec(), Crc32cCodec()]),
        raw=None,
    ),
    custom(
        "v2/crc32c_mid_chain",
        random_data((7, 6), "float64", 42),
        NAN,
        (4, 6),
        (2, 3),
        ShardingCodec(chunk_shape=(2, 3), codecs=[BytesCodec(), Crc32cCodec(), GzipCodec()]),
        raw=None,
    ),
]
ALL = [*CASES, *EXTRA]
#: Arrays whose chains have a v2 form only after decoding (axis orders other than C or F).
DECODED = {"transpose_inside", "transpose_before_3d", "transpose_both", "v2/crc32c_mid_chain"}
#: Arrays read through a v2 `order: "F"`.
FORTRAN = {"transpose_before_2d"}
#: The unsharded arrays, shown as v2 too.
PLAIN_CASES = {name: spec for name, spec in PLAIN.items()}


@dataclass(frozen=True)
class Tree:
    source: Path
    mounted: Mounted
    zarr2_values: dict[str, np.ndarray]

    @property
    def view(self) -> Path:
        return self.mounted.path


READ_ALL = """
import numpy as np, zarr
root = zarr.open_consolidated(params["mount"], mode="r")
names = []
def visit(name, node):
    if isinstance(node, zarr.Array):
        np.save(f"{params['out']}/{name.replace('/', '__')}.npy", node[...])
        names.append(name)
root.visititems(visit)
print(json.dumps(sorted(names)))
"""


def add_v2_chains(source: Path) -> None:
    """Write the EXTRA arrays (chains the v2 view serves other bytes for) into group `v2`."""
    v2 = zarr.open_group(source, mode="r+").create_group(
        "v2", attributes={"about": "chains for the v2 view"}
    )
    for case in EXTRA:
        array = v2.create_array(
            case.name.split("/")[1],
            shape=case.data.shape,
            dtype=case.data.dtype,
            fill_value=case.fill,
            **case.options,
        )
        array[...] = case.data


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2) -> Iterator[Tree]:
    base = tmp_path_factory.mktemp("v2_view")
    source = base / "src"
    build(source)
    add_v2_chains(source)
    mounted = start_mount(source, base / "mnt", base / "mnt.log", "ro", "view=v2")
    try:
        out = base / "zarr2"
        out.mkdir()
        names = zarr2.run(READ_ALL, mount=str(mounted.path), out=str(out))
        values = {name: np.load(out / f"{name.replace('/', '__')}.npy") for name in names}
        yield Tree(source, mounted, values)
    finally:
        stop_mount(mounted)


def assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)  # NaN == NaN here


by_case = pytest.mark.parametrize("case", ALL, ids=lambda c: c.name)


@by_case
def test_zarr_python_2_reads_the_values_written(tree: Tree, case: Case) -> None:
    assert case.name in tree.zarr2_values, "missing from the consolidated metadata"
    assert_same(tree.zarr2_values[case.name], case.data)


@pytest.mark.parametrize("name", list(PLAIN_CASES))
def test_unsharded_arrays_are_shown_as_v2_too(tree: Tree, name: str) -> None:
    data, _, options = PLAIN_CASES[name]
    assert_same(tree.zarr2_values[name], data)
    zattrs = json.loads((tree.view / name / ".zattrs").read_text())
    assert zattrs == options.get("attributes", {})


@by_case
def test_tensorstore_zarr2_reads_the_values_written(tree: Tree, case: Case) -> None:
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(tree.view / case.name)}}
    store = ts.open(spec, read=True).result()
    assert_same(store.read().result(), case.data)


@by_case
def test_zarray_describes_the_inner_chunks(tree: Tree, case: Case) -> None:
    zarray = json.loads((tree.view / case.name / ".zarray").read_text())
    assert zarray["zarr_format"] == 2
    assert zarray["shape"] == list(case.data.shape)
    assert zarray["chunks"] == list(case.chunks)
    assert np.dtype(zarray["dtype"]).newbyteorder("=") == case.data.dtype.newbyteorder("=")
    assert zarray["filters"] is None
    assert zarray["dimension_separator"] == case.keys[1]
    assert zarray["order"] == ("F" if case.name in FORTRAN else "C")
    if case.name in DECODED:
        assert zarray["compressor"] is None
    fill = zarray["fill_value"]
    if isinstance(case.fill, float) and math.isnan(case.fill):
        assert fill == "NaN"
    else:
        assert fill == case.fill
    assert not (tree.view / case.name / "zarr.json").exists()


@by_case
def test_chunk_files_are_the_nonempty_chunks_by_v2_key(tree: Tree, case: Case) -> None:
    separator = case.keys[1]
    expected = {
        separator.join(str(i) for i in c)
        for c in grid(case)
        if not all_fill(region(case, c), case.fill)
    }
    found = set()
    top = tree.view / case.name
    for parent, _, names in os.walk(top):
        for name in names:
            found.add((Path(parent) / name).relative_to(top).as_posix())
    found -= {".zarray", ".zattrs"}
    assert expected == found
    for key in sorted(found)[:5]:
        path = top / key
        assert path.stat().st_size == len(path.read_bytes())


def test_crc32c_is_verified_and_stripped(tree: Tree) -> None:
    """Each served chunk is the stored inner chunk without its last 4 bytes (its crc32c)."""
    case = next(c for c in EXTRA if c.name == "v2/crc32c")
    served = (tree.view / case.name / "0" / "0").read_bytes()
    # What is left is a gzip stream of the chunk's values, as the v2 compressor says.
    values = np.frombuffer(gzip.decompress(served), dtype="<u2").reshape(case.chunks)
    assert_same(values, region(case, (0, 0)))


def test_decoded_chunks_are_raw_values_of_exact_size(tree: Tree) -> None:
    case = next(c for c in CASES if c.name == "transpose_inside")
    path = tree.view / case.name / "1" / "2" / "1"
    raw = path.read_bytes()
    assert path.stat().st_size == len(raw) == math.prod(case.chunks) * case.data.itemsize
    block = np.frombuffer(raw, dtype="<i2").reshape(case.chunks)
    assert_same(block, region(case, (1, 2, 1)))


def test_attributes_and_dimension_names_reach_zattrs(tree: Tree) -> None:
    zattrs = json.loads((tree.view / "meta/sharded/.zattrs").read_text())
    assert zattrs == {
        "units": "K",
        "scale": [1, 2.5],
        "note": "größe",
        "_ARRAY_DIMENSIONS": ["y", "x"],
    }
    assert json.loads((tree.view / ".zgroup").read_text()) == {"zarr_format": 2}
    assert json.loads((tree.view / ".zattrs").read_text()) == {"title": "shardfs", "n": 3}
    assert json.loads((tree.view / "meta/.zattrs").read_text()) == {"level": 1, "title": "café"}


def test_consolidated_metadata_lists_every_translated_node(tree: Tree) -> None:
    zmetadata = json.loads((tree.view / ".zmetadata").read_text())
    assert zmetadata["zarr_consolidated_format"] == 1
    metadata: dict[str, Any] = zmetadata["metadata"]
    for case in ALL:
        assert metadata[f"{case.name}/.zarray"] == json.loads(
            (tree.view / case.name / ".zarray").read_text()
        )
    assert metadata["meta/.zgroup"] == {"zarr_format": 2}
    sub = json.loads((tree.view / "meta" / ".zmetadata").read_text())["metadata"]
    assert set(sub) == {k.removeprefix("meta/") for k in metadata if k.startswith("meta/")}


def test_arrays_without_a_v2_form_are_shown_unchanged_with_a_log_line(tree: Tree) -> None:
    """Whole-shard compression has no v2 form: the source directory passes through."""
    assert (tree.view / WHOLE / "zarr.json").read_bytes() == (
        tree.source / WHOLE / "zarr.json"
    ).read_bytes()
    assert not (tree.view / WHOLE / ".zarray").exists()
    assert f"{WHOLE}/zarr.json: shown unchanged" in tree.mounted.log()
    assert f"{WHOLE}/.zarray" not in json.loads((tree.view / ".zmetadata").read_text())["metadata"]


def test_corrupt_chunk_checksum_gives_eio_and_one_log_line(tmp_path: Path, mount: Any) -> None:
    source = tmp_path / "src"
    array = zarr.create_array(
        source,
        shape=(4, 4),
        chunks=(2, 2),
        dtype="uint8",
        compressors=None,
        serializer=BytesCodec(),
        filters=None,
    )
    array[...] = np.arange(16, dtype="uint8").reshape(4, 4)
    zarr_json = json.loads((source / "zarr.json").read_text())
    zarr_json["codecs"] = [{"name": "bytes"}, {"name": "crc32c"}]
    (source / "zarr.json").write_text(json.dumps(zarr_json))
    for chunk in (source / "c").rglob("*"):
        if chunk.is_file():
            body = chunk.read_bytes()
            chunk.write_bytes(body + crc32c.crc32c(body).to_bytes(4, "little"))
    bad = source / "c" / "1" / "1"
    bad.write_bytes(bad.read_bytes()[:-1] + b"\0")
    mounted = mount(source, "ro", "view=v2")
    assert (mounted.path / "0" / "1").read_bytes() == bytes([2, 3, 6, 7])
    with pytest.raises(OSError) as error:
        (mounted.path / "1" / "1").read_bytes()
    assert error.value.errno == 5
    lines = [line for line in mounted.log().splitlines() if "ERROR" in line]
    assert len(lines) == 1 and "crc32c" in lines[0], lines
