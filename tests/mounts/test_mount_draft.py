"""Draft v3 sources (zarr-python 2.14-2.18, sharding storage transformer), mounted for real.

zarr-python 2.18 writes the source itself, in its experimental v3 mode. The
default view must show it as final Zarr v3, read by zarr-python 3 and
tensorstore; the v2 view as zarr v2, read by zarr-python 2.18. Values are
compared with what was written.
"""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.conftest import Mounted, start_mount, stop_mount
from tests.support.zarr2 import Zarr2

pytestmark = pytest.mark.fuse

#: name -> (shape, chunks, chunks_per_shard or None, dtype, order, separator, compressor, fill)
ARRAYS = {
    "image": ((10, 7), (3, 2), (2, 2), "<i4", "C", "/", "blosc", -1),
    "deep/sub/volume": ((9, 8, 5), (2, 3, 5), (2, 1, 1), ">u2", "F", "/", "gzip", 0),
    "deep/dotted": ((13,), (4,), (3,), "<f8", "C", ".", "zstd", "nan"),
    "deep/plain": ((6, 5), (4, 4), None, "|b1", "C", "/", None, False),
    "deep/sparse": ((16, 16), (4, 4), (2, 2), "<f4", "C", "/", "blosc", 0),
}

WRITE = """
import numpy as np, zarr, numcodecs
from zarr._storage.v3 import DirectoryStoreV3
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer
root = zarr.open_group(DirectoryStoreV3(params["path"]), mode="w", zarr_version=3, path="/")
root.attrs["title"] = "draft"
compressors = {"blosc": numcodecs.Blosc(cname="zstd", shuffle=1), "gzip": numcodecs.GZip(3),
               "zstd": numcodecs.Zstd(5), None: None}
for name, (shape, chunks, cps, dtype, order, sep, comp, fill) in params["arrays"].items():
    transformers = [ShardingStorageTransformer("indexed", chunks_per_shard=cps)] if cps else []
    fill = float("nan") if fill == "nan" else fill
    array = root.create_dataset(name, shape=shape, chunks=chunks, dtype=dtype, order=order,
                                dimension_separator=sep, compressor=compressors[comp],
                                fill_value=fill, storage_transformers=transformers)
    data = np.load(f"{params['data']}/{name.replace('/', '__')}.npy")
    if name == "deep/sparse":
        array[0:4, 0:4] = data[0:4, 0:4]
        array[12:16, 12:16] = data[12:16, 12:16]
    else:
        array[...] = data
    array.attrs["name"] = name
root["deep"].attrs["level"] = 1
print(json.dumps(sorted(str(p) for p in __import__("pathlib").Path(params["path"]).rglob("*"))))
"""


def values(name: str) -> np.ndarray:
    shape, _, _, dtype, *_ = ARRAYS[name]
    rng = np.random.default_rng(len(name))
    if dtype == "|b1":
        return rng.random(shape) < 0.5
    data = rng.integers(0, 1000, shape).astype(dtype)
    if name == "deep/sparse":
        expected = np.zeros(shape, dtype)
        expected[0:4, 0:4], expected[12:16, 12:16] = data[0:4, 0:4], data[12:16, 12:16]
        return expected
    return data


@dataclass(frozen=True)
class Source:
    path: Path
    v3: Mounted
    v2: Mounted
    zarr2: Zarr2


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2) -> Iterator[Source]:
    base = tmp_path_factory.mktemp("draft")
    path, data = base / "src", base / "data"
    data.mkdir()
    for name in ARRAYS:
        np.save(data / f"{name.replace('/', '__')}.npy", values(name))
    written = zarr2.run(WRITE, draft=True, path=str(path), data=str(data), arrays=ARRAYS)
    assert f"{path}/data/root/image/c1/1" in written  # shards, named the draft way
    v3 = start_mount(path, base / "mnt3", base / "mnt3.log", "ro")
    try:
        v2 = start_mount(path, base / "mnt2", base / "mnt2.log", "ro", "view=v2")
        try:
            yield Source(path, v3, v2, zarr2)
        finally:
            stop_mount(v2)
    finally:
        stop_mount(v3)


by_array = pytest.mark.parametrize("name", list(ARRAYS))


@by_array
def test_zarr_python_3_reads_the_final_v3_view(source: Source, name: str) -> None:
    array = zarr.open_array(source.v3.path / name, mode="r")
    assert array.shards is None
    assert array.chunks == ARRAYS[name][1]
    np.testing.assert_array_equal(array[...], values(name))
    assert array.attrs["name"] == name


@by_array
def test_tensorstore_reads_the_final_v3_view(source: Source, name: str) -> None:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(source.v3.path / name)}}
    np.testing.assert_array_equal(ts.open(spec, read=True).result().read().result(), values(name))


READ_V2 = """
import numpy as np, zarr
root = zarr.open_consolidated(params["mount"], mode="r")
out = {}
for name in params["names"]:
    np.save(f"{params['out']}/{name.replace('/', '__')}.npy", root[name][...])
    out[name] = [dict(root[name].attrs), root[name].order]
print(json.dumps(out))
"""


def test_zarr_python_2_reads_the_v2_view(source: Source, tmp_path: Path) -> None:
    got = source.zarr2.run(
        READ_V2, mount=str(source.v2.path), out=str(tmp_path), names=list(ARRAYS)
    )
    for name, (_, _, _, _, order, _, _, _) in ARRAYS.items():
        read = np.load(tmp_path / f"{name.replace('/', '__')}.npy")
        np.testing.assert_array_equal(read, values(name))
        assert got[name] == [{"name": name}, order if len(ARRAYS[name][0]) > 1 else "C"]


def test_every_parent_is_a_v3_group(source: Source) -> None:
    view = source.v3.path
    assert sorted(p.name for p in view.iterdir()) == ["deep", "image", "zarr.json"]
    assert json.loads((view / "zarr.json").read_text())["attributes"] == {"title": "draft"}
    for group in ("deep", "deep/sub"):
        meta = json.loads((view / group / "zarr.json").read_text())
        assert meta["zarr_format"] == 3 and meta["node_type"] == "group"
    assert json.loads((view / "deep" / "zarr.json").read_text())["attributes"] == {"level": 1}
    assert not (view / "meta").exists() and not (view / "data").exists()


def test_chunk_files_are_the_inner_chunks_under_c(source: Source) -> None:
    view = source.v3.path
    dotted = sorted(p.name for p in (view / "deep" / "dotted").iterdir())
    assert dotted == ["c.0", "c.1", "c.2", "c.3", "zarr.json"]
    sparse = {
        p.relative_to(view / "deep/sparse").as_posix()
        for p in (view / "deep/sparse").rglob("*")
        if p.is_file()
    }
    assert sparse == {"zarr.json", "c/0/0", "c/3/3"}  # empty inner chunks have no file


def test_untranslatable_document_is_shown_unchanged_with_a_log_line(
    source: Source, tmp_path: Path, mount: Any
) -> None:
    copy = tmp_path / "src"
    shutil.copytree(source.path, copy)
    doc_path = copy / "meta/root/image.array.json"
    doc = json.loads(doc_path.read_text())
    doc["compressor"] = {
        "codec": "https://purl.org/zarr/spec/codec/unknown/1.0",
        "configuration": {},
    }
    doc_path.write_text(json.dumps(doc))
    mounted = mount(copy, "ro")
    assert sorted(p.name for p in mounted.path.iterdir()) == [
        "deep",
        "image.array.json",
        "zarr.json",
    ]
    assert (mounted.path / "image.array.json").read_bytes() == doc_path.read_bytes()
    assert not (mounted.path / "image").exists()
    warnings = [line for line in mounted.log().splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "image.array.json: shown unchanged" in warnings[0], warnings
    np.testing.assert_array_equal(
        zarr.open_array(mounted.path / "deep/plain", mode="r")[...], values("deep/plain")
    )


def test_draft_sources_are_mounted_read_only(source: Source, tmp_path: Path, mount: Any) -> None:
    mounted = mount(source.path)  # no option: read-only, with a warning
    with pytest.raises(OSError) as info:
        (mounted.path / "image" / "zarr.json").write_text("{}")
    assert info.value.errno == errno.EROFS
    assert "draft Zarr v3 source: mounted read-only" in mounted.log()
    with pytest.raises(RuntimeError, match="cannot be written"):
        mount(source.path, "rw")
