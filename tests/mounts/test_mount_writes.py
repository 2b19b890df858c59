"""Writes through a real read-write mount, by zarr-python 3 (v3 view) and zarr-python 2 (v2 view).

The sources are written by zarr-python 3 (sharded arrays with the index at
the end and at the start, crc32c and gzip inner chains, v2 chunk keys, an
unsharded array). Writers then create, overwrite, partially update and delete
chunks through the mount, and check what they read back through it. After
the unmount the *source* is read directly by zarr-python 3 and tensorstore
and compared with numpy arrays the tests updated alongside; the source must
hold only metadata, shards and the private `.shardfs/` area.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec

from tests.conftest import Mounted
from tests.support.backends import Source
from tests.support.zarr2 import Zarr2

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

SHAPE = (40, 36)


def _initial(seed: int, dtype: str = "uint16") -> np.ndarray:
    data = np.random.default_rng(seed).integers(1, 1000, SHAPE).astype(dtype)
    data[24:, :] = 0  # the last shard row is never written: writes must create those shards
    return data


#: name -> (zarr.create_array options, initial data)
ARRAYS: dict[str, tuple[dict[str, Any], np.ndarray]] = {
    "end": ({"chunks": (4, 6), "shards": (8, 12)}, _initial(1)),
    "start": (
        {
            "serializer": ShardingCodec(
                chunk_shape=(4, 6), codecs=[BytesCodec(), GzipCodec()], index_location="start"
            ),
            "chunks": (8, 12),
            "compressors": None,
        },
        _initial(2),
    ),
    "crc": (
        {
            "serializer": ShardingCodec(
                chunk_shape=(4, 6), codecs=[BytesCodec(), GzipCodec(), Crc32cCodec()]
            ),
            "chunks": (8, 12),
            "compressors": None,
        },
        _initial(3),
    ),
    "mid": (
        {
            "serializer": ShardingCodec(
                chunk_shape=(4, 6), codecs=[BytesCodec(), Crc32cCodec(), GzipCodec()]
            ),
            "chunks": (8, 12),
            "compressors": None,
        },
        _initial(4, "float32"),
    ),
    "dots": (
        {
            "chunks": (4, 6),
            "shards": (8, 12),
            "chunk_key_encoding": {"name": "v2", "separator": "."},
        },
        _initial(5),
    ),
    "plain": ({"chunks": (4, 6)}, _initial(6)),
}


#: (region, value) written in turn by every writer test.
UPDATES: list[tuple[tuple[slice, slice], int]] = [
    ((slice(0, 4), slice(0, 6)), 7),  # one whole chunk overwritten
    ((slice(2, 11), slice(5, 20)), 9),  # partial updates across chunks and shards
    ((slice(4, 8), slice(6, 12)), 0),  # a chunk set to the fill value: deleted
    ((slice(28, 32), slice(30, 36)), 5),  # a chunk of a shard that does not exist yet
]


def make_source(root: Path | Source) -> dict[str, np.ndarray]:
    store = root.zarr_store() if isinstance(root, Source) else root
    group = zarr.open_group(store, mode="w", attributes={"made_by": "zarr-python 3"})
    expected = {}
    for name, (options, data) in ARRAYS.items():
        array = group.create_array(name, shape=SHAPE, dtype=data.dtype, fill_value=0, **options)
        array[:] = data
        expected[name] = data.copy()
    return expected


def assert_clean(source: Path | Source) -> None:
    """Only metadata and shards (or plain chunk objects) in the source; no commit left open."""
    if not isinstance(source, Source):
        source = Source(str(source))
    for path in source.files():
        name = path.rpartition("/")[2]
        key = path.partition("/")[2].replace(".", "/")
        assert name == "zarr.json" or all(p.isdigit() or p == "c" for p in key.split("/")), (
            f"stray file in the source: {path}"
        )
    private = Path(source.root, ".shardfs")
    if source.s3 is None and private.exists():
        assert not any((private / "journal").iterdir()), "a journal entry was left behind"
        assert not any((private / "tmp").iterdir()), "a temp file was left behind"
    if source.s3 is not None:
        uploads = source.s3.admin.list_multipart_uploads(Bucket=source.s3.bucket)
        assert not uploads.get("Uploads"), "a multipart upload was left behind"


def assert_source(source: Path | Source, expected: dict[str, np.ndarray]) -> None:
    """The source read directly, by zarr-python 3 and by tensorstore, holds `expected`."""
    if not isinstance(source, Source):
        source = Source(str(source))
    for name, data in expected.items():
        array = zarr.open_array(source.zarr_store(name), mode="r")
        np.testing.assert_array_equal(array[...], data, name)
        store = ts.open({"driver": "zarr3", "kvstore": source.kvstore(name)}).result()
        np.testing.assert_array_equal(store.read().result(), data, name)


def test_zarr_python_3_writes_through_the_v3_view(src: Source, mount) -> None:
    expected = make_source(src)
    before = {key: src.read(key) for key in src.files() if key.startswith("end/c/")}
    mounted: Mounted = mount(src.url, *src.options)
    for name, data in expected.items():
        array = zarr.open_array(mounted.path / name, mode="r+")
        for region, value in UPDATES:
            array[region] = value
            data[region] = value
        # Seen through the mount at once, before any commit.
        np.testing.assert_array_equal(zarr.open_array(mounted.path / name, mode="r")[...], data)
    assert not (mounted.path / "end" / "c" / "1" / "1").exists()  # deleted chunk: no file
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()
    assert_source(src, expected)
    assert_clean(src)
    changed = {key: src.read(key) for key in before if src.read(key) != before[key]}
    assert changed
    for key, new in changed.items():  # index-at-end shards were appended to, not rewritten
        old = before[key]
        assert len(new) > len(old) and new.startswith(old[: len(old) - 4 * 16 - 4]), key


def test_zarr_python_2_writes_through_the_v2_view(src: Source, mount, zarr2: Zarr2) -> None:
    expected = make_source(src)
    mounted: Mounted = mount(src.url, *src.options, "view=v2")
    script = """
        import zarr, numpy as np
        out = {}
        for name in params["names"]:
            a = zarr.open_array(params["root"] + "/" + name, mode="r+")
            a[0:4, 0:6] = 7
            a[2:11, 5:20] = 9
            a[4:8, 6:12] = 0
            a[28:32, 30:36] = 5
            b = zarr.open_array(params["root"] + "/" + name, mode="r")
            out[name] = b[...].tolist()
        print(json.dumps(out))
    """
    seen = zarr2.run(script, root=str(mounted.path), names=list(expected))
    for name, data in expected.items():
        for region, value in UPDATES:
            data[region] = value
        np.testing.assert_array_equal(np.asarray(seen[name], dtype=data.dtype), data, name)
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()
    assert_source(src, expected)
    assert_clean(src)


def test_metadata_changes_are_stored_in_the_sharded_metadata(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    expected = make_source(source)
    mounted: Mounted = mount(source)
    array = zarr.open_array(mounted.path / "end", mode="r+")
    array.attrs["unit"] = "nm"
    array.resize((48, 36))
    array[40:48, :] = 3
    data = np.zeros((48, 36), dtype="uint16")
    data[:40] = expected["end"]
    data[40:] = 3
    expected["end"] = data
    group = zarr.open_group(mounted.path, mode="r+")
    group.attrs["edited"] = True

    # Another chunk shape cannot be expressed without rewriting every shard.
    view = json.loads((mounted.path / "end" / "zarr.json").read_text())
    view["chunk_grid"]["configuration"]["chunk_shape"] = [8, 6]
    with pytest.raises(OSError) as info:
        (mounted.path / "end" / "zarr.json").write_text(json.dumps(view))
    assert info.value.errno == errno.EINVAL
    mounted.stop()

    stored = json.loads((source / "end" / "zarr.json").read_text())
    assert stored["shape"] == [48, 36]
    assert stored["attributes"] == {"unit": "nm"}
    assert stored["codecs"][0]["name"] == "sharding_indexed"  # still sharded
    assert stored["chunk_grid"]["configuration"]["chunk_shape"] == [8, 12]
    assert json.loads((source / "zarr.json").read_text())["attributes"]["edited"] is True
    assert "chunk_shape" in mounted.log() and "cannot change" in mounted.log()
    assert_source(source, expected)


def test_new_arrays_are_stored_sharded_with_shard_new(tmp_path: Path, mount, zarr2: Zarr2) -> None:
    source = tmp_path / "src"
    zarr.open_group(source, mode="w")
    data = np.arange(30 * 20, dtype="int32").reshape(30, 20)
    v3 = mount(source, "shard_new=2")
    array = zarr.create_array(v3.path / "new3", shape=data.shape, chunks=(5, 4), dtype="int32")
    array[:] = data
    v3.stop()
    v2 = mount(source, "shard_new=3", "view=v2")
    zarr2.run(
        """
        import zarr, numpy as np
        a = zarr.open_array(params["path"], mode="w", shape=(30, 20), chunks=(5, 4), dtype="<i4")
        a[:] = np.arange(600, dtype="<i4").reshape(30, 20)
        g = zarr.open_group(params["group"], mode="w")
        g.attrs["x"] = 1
        """,
        path=str(v2.path / "new2"),
        group=str(v2.path / "sub"),
    )
    v2.stop()
    for name, per_shard in (("new3", 2), ("new2", 3)):
        meta = json.loads((source / name / "zarr.json").read_text())
        assert meta["codecs"][0]["name"] == "sharding_indexed", name
        assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [5 * per_shard, 4 * per_shard]
    assert json.loads((source / "sub" / "zarr.json").read_text())["attributes"] == {"x": 1}
    assert_source(source, {"new3": data, "new2": data})
    assert_clean(source)


def test_file_operations_of_plain_tools(tmp_path: Path, mount) -> None:
    """What shells and legacy writers do, through the kernel: O_TRUNC, O_APPEND, link,
    mkdir -p, fsync (durable at once), and scratch files that never reach the source."""
    source = tmp_path / "src"
    group = zarr.open_group(source, mode="w")
    array = group.create_array(
        "a", shape=(16, 16), chunks=(4, 4), shards=(8, 8), dtype="<u4", compressors=None
    )
    array[:] = 1
    array[0:4, 4:8] = 0  # chunk (0, 1) does not exist
    mounted: Mounted = mount(source, "flush_interval=3600")
    root = mounted.path

    def chunk(value: int) -> bytes:
        return np.full((4, 4), value, dtype="<u4").tobytes()

    # O_APPEND: two halves make one chunk.
    with open(root / "a/c/0/0", "wb") as f:
        f.write(chunk(2)[:32])
    with open(root / "a/c/0/0", "ab") as f:
        f.write(chunk(2)[32:])
    # link + unlink, as zarr-python 3's exclusive create does.
    (root / "a/c/0/1.tmp").write_bytes(chunk(3))
    with pytest.raises(FileExistsError):
        os.link(root / "a/c/0/1.tmp", root / "a/c/0/0")
    os.link(root / "a/c/0/1.tmp", root / "a/c/0/1")
    os.unlink(root / "a/c/0/1.tmp")
    # mkdir -p of chunk directories that already exist, and scratch files.
    os.makedirs(root / "a/c/3", exist_ok=True)
    os.makedirs(root / "scratch/deeper")
    (root / "scratch/deeper/notes.txt").write_text("never stored")
    assert (root / "scratch/deeper/notes.txt").read_text() == "never stored"
    assert sorted(os.listdir(root / "a/c/0")) == ["0", "1", "2", "3"]

    # fsync of a chunk commits its shard before it returns.
    shard = source / "a/c/0/0"
    size = shard.stat().st_size
    fd = os.open(root / "a/c/0/0", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert shard.stat().st_size > size
    assert (zarr.open_array(source / "a", mode="r")[0:4, 0:8] == [[2] * 4 + [3] * 4] * 4).all()

    # O_TRUNC through `shardfs umount`, which commits before unmounting.
    (root / "a/c/3/3").write_bytes(chunk(9))
    os.unlink(root / "a/c/1/1")
    from shardfs.cli import main

    assert main(["umount", str(root)]) == 0
    mounted.process.wait(timeout=30)
    values = zarr.open_array(source / "a", mode="r")[...]
    assert (values[12:16, 12:16] == 9).all() and (values[4:8, 4:8] == 0).all()
    assert not (source / "scratch").exists()
    assert_clean(source)
