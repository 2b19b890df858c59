"""Writers that ask for sharded storage themselves, through a read-write mount.

The view shows every array unsharded. A writer that creates a sharded array
(zarr-python 3's `shards=`) would write whole shards at keys the mount takes for
inner chunks, and the mount would store them as garbage (issue 19, item 3). So the
mount refuses such a `zarr.json` at once with EINVAL and one log line that points
to `-o shard_new=N`, which stores arrays created unsharded through the mount
sharded. The same holds for a rewrite that adds, changes or removes the sharding of
an existing array. Everything runs through real mounts with zarr-python 3 as the
writer; the source is then read directly by zarr-python 3 and tensorstore, or
compared byte for byte with what it held before.

Writers of the other Zarr format than the view shows are refused the same way: their
metadata would be a scratch file and their chunks would land on keys the view does not
serve, so the whole array would vanish at unmount.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec

from tests.conftest import Mounted
from tests.mounts.test_mount_writes import assert_clean, assert_source

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

SHAPE, CHUNKS, SHARDS = (16, 24), (4, 6), (8, 12)
DATA = np.random.default_rng(19).integers(1, 60000, SHAPE).astype("uint16")


def make_source(root: Path) -> None:
    """A group holding a sharded array, an unsharded one, an empty group and a sharded
    array the view shows unchanged (zstd over whole shards), written by zarr-python 3."""
    group = zarr.open_group(root, mode="w")
    for name, options in {
        "sharded": {"chunks": CHUNKS, "shards": SHARDS},
        "plain": {"chunks": CHUNKS},
        # zarr-python adds its default zstd *after* sharding: whole-shard compression.
        "unchanged": {"serializer": ShardingCodec(chunk_shape=CHUNKS), "chunks": SHARDS},
    }.items():
        group.create_array(name, shape=SHAPE, dtype=DATA.dtype, fill_value=0, **options)[:] = DATA
    group.create_group("grp")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the source but the mount's private `.shardfs/` area, with its bytes."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.relative_to(root).parts[0] != ".shardfs"
    }


def assert_only_nodes(root: Path) -> None:
    """`assert_clean` for nested arrays too: only metadata and chunk (or shard) objects."""
    for name in snapshot(root):
        data = name.rpartition("/c/")[2]
        assert name.endswith("zarr.json") or ("/c/" in name and data.replace("/", "").isdigit()), (
            f"stray file in the source: {name}"
        )
    for area in ("journal", "tmp"):
        private = root / ".shardfs" / area
        assert not private.is_dir() or not any(private.iterdir()), f"left in .shardfs/{area}"


def refusals(mounted: Mounted) -> list[str]:
    """The log's error lines; each must point to `-o shard_new`."""
    lines = [line for line in mounted.log().splitlines() if " ERROR " in line]
    assert all("shard_new" in line for line in lines), lines
    return lines


def atomic_write(path: Path, text: str) -> None:
    """What zarr-python 3.1's LocalStore does: a temp file renamed over the key, removed
    again if the rename fails."""
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
    tmp.write_text(text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink()
        raise


def in_place_write(path: Path, text: str) -> None:
    """`open(O_TRUNC)` + `write` + close: the document is stored (or refused) at close."""
    path.write_text(text)


WRITES = pytest.mark.parametrize(
    "write", [atomic_write, in_place_write], ids=["rename", "in_place"]
)


def test_a_sharded_create_is_refused_and_leaves_no_trace(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    make_source(source)
    before = snapshot(source)
    mounted: Mounted = mount(source)
    group = zarr.open_group(mounted.path, mode="a")
    # Before the fix the create and the writes were accepted, and the source then held
    # one shard of the writer's shards taken as inner chunks: "Zstd decompression error".
    with pytest.raises(OSError) as info:
        array = group.create_array(
            "new", shape=SHAPE, dtype=DATA.dtype, chunks=CHUNKS, shards=SHARDS
        )
        array[:] = DATA
    assert info.value.errno == errno.EINVAL
    lines = refusals(mounted)
    assert len(lines) == 1, mounted.log()
    assert "new/zarr.json" in lines[0] and "sharded array cannot be created" in lines[0]
    assert not (mounted.path / "new" / "zarr.json").exists()
    assert [p.name for p in (mounted.path / "new").iterdir()] == []  # zarr-python cleaned up
    # The mount goes on serving the rest.
    np.testing.assert_array_equal(zarr.open_array(mounted.path / "sharded")[...], DATA)
    mounted.stop()
    assert mounted.log().count("ERROR") == 1, mounted.log()
    assert not (source / "new").exists()
    assert snapshot(source) == before
    assert_clean(source)


def test_shard_new_stores_the_same_array_written_unsharded_sharded(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    zarr.open_group(source, mode="w")
    mounted: Mounted = mount(source, "shard_new=2")
    group = zarr.open_group(mounted.path, mode="a")
    # A writer asking for shards of its own is refused here too: its shards would be
    # taken for inner chunks of the mount's shards just the same.
    with pytest.raises(OSError) as info:
        group.create_array("new", shape=SHAPE, dtype=DATA.dtype, chunks=CHUNKS, shards=SHARDS)
    assert info.value.errno == errno.EINVAL
    lines = refusals(mounted)
    assert len(lines) == 1 and "-o shard_new=2" in lines[0], mounted.log()

    array = group.create_array("new", shape=SHAPE, dtype=DATA.dtype, chunks=CHUNKS)
    array[:] = DATA
    view = json.loads((mounted.path / "new" / "zarr.json").read_text())
    assert view["chunk_grid"]["configuration"]["chunk_shape"] == list(CHUNKS)
    assert all(codec["name"] != "sharding_indexed" for codec in view["codecs"])
    np.testing.assert_array_equal(zarr.open_array(mounted.path / "new")[...], DATA)
    mounted.stop()
    assert mounted.log().count("ERROR") == 1, mounted.log()

    stored = json.loads((source / "new" / "zarr.json").read_text())
    assert stored["chunk_grid"]["configuration"]["chunk_shape"] == list(SHARDS)
    [sharding] = stored["codecs"]
    assert sharding["name"] == "sharding_indexed"
    assert sharding["configuration"]["chunk_shape"] == list(CHUNKS)
    assert sharding["configuration"]["codecs"] == view["codecs"]
    shards = sorted(str(p.relative_to(source / "new" / "c")) for p in source.rglob("new/c/*/*"))
    assert shards == ["0/0", "0/1", "1/0", "1/1"]
    assert_source(source, {"new": DATA})
    assert_clean(source)


def zarr_python_metadata(chunks: tuple[int, ...], **options: Any) -> dict[str, Any]:
    """The `zarr.json` zarr-python 3 writes for SHAPE with `options` (in a scratch store)."""
    array = zarr.create_array(
        zarr.storage.MemoryStore(), shape=SHAPE, dtype=DATA.dtype, chunks=chunks, **options
    )
    return json.loads(json.dumps(array.metadata.to_dict(), default=str))


def add_inner_sharding(view: dict[str, Any]) -> dict[str, Any]:
    """The view's document with each of its chunks made a shard of 2 x 2 inner chunks."""
    doc = dict(view)
    inner = [c // 2 for c in view["chunk_grid"]["configuration"]["chunk_shape"]]
    doc["codecs"] = [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": inner,
                "codecs": view["codecs"],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_location": "end",
            },
        }
    ]
    return doc


def as_stored(view: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The writer writes the sharding the source has (copied from elsewhere)."""
    return source


def other_shards(view: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(source))
    doc["chunk_grid"]["configuration"]["chunk_shape"] = list(SHAPE)
    return doc


def unsharded(view: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The sharding removed: each shard's inner chunk becomes a chunk."""
    doc = dict(source)
    sharding = source["codecs"][0]["configuration"]
    doc["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": list(CHUNKS)}}
    doc["codecs"] = sharding["codecs"]
    return doc


def zarr_sharded(view: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """What zarr-python 3 writes for the same shape, sharded."""
    return zarr_python_metadata(CHUNKS, shards=SHARDS, fill_value=0)


#: name -> (node, the document written over its zarr.json, from (view's, source's))
CHANGES: dict[str, tuple[str, Callable[[dict, dict], dict]]] = {
    "sharded_add": ("sharded", lambda view, source: add_inner_sharding(view)),
    "sharded_as_stored": ("sharded", as_stored),
    "sharded_other_shards": ("sharded", other_shards),
    "plain_add": ("plain", lambda view, source: add_inner_sharding(view)),
    "plain_zarr_python": ("plain", zarr_sharded),
    "group_to_sharded_array": ("grp", zarr_sharded),
    "unchanged_remove": ("unchanged", unsharded),
    "unchanged_other_shards": ("unchanged", other_shards),
}


@WRITES
@pytest.mark.parametrize("change", list(CHANGES))
def test_changing_the_sharding_of_an_existing_node_is_refused(
    tmp_path: Path, mount, change: str, write: Callable[[Path, str], None]
) -> None:
    source = tmp_path / "src"
    make_source(source)
    before = snapshot(source)
    node, make = CHANGES[change]
    mounted: Mounted = mount(source)
    path = mounted.path / node / "zarr.json"
    shown = path.read_text()
    doc = make(json.loads(shown), json.loads((source / node / "zarr.json").read_text()))
    with pytest.raises(OSError) as info:
        write(path, json.dumps(doc))
    assert info.value.errno == errno.EINVAL
    assert path.read_text() == shown
    assert sorted(os.listdir(path.parent)) == sorted(os.listdir(source / node))  # no temp file
    lines = refusals(mounted)
    assert len(lines) == 1, mounted.log()
    assert f"{node}/zarr.json" in lines[0]
    mounted.stop()
    assert snapshot(source) == before
    assert_source(source, {"sharded": DATA, "plain": DATA})


@pytest.mark.parametrize("chunks", [SHARDS, (2, 3), (4, 12)])
def test_changing_the_chunks_of_a_sharded_array_in_the_v2_view_is_refused(
    tmp_path: Path, mount, chunks: tuple[int, int]
) -> None:
    source = tmp_path / "src"
    make_source(source)
    before = snapshot(source)
    mounted: Mounted = mount(source, "view=v2")
    path = mounted.path / "sharded" / ".zarray"
    shown = path.read_text()
    zarray = json.loads(shown)
    assert zarray["chunks"] == list(CHUNKS)
    zarray["chunks"] = list(chunks)
    for write in (atomic_write, in_place_write):
        with pytest.raises(OSError) as info:
            write(path, json.dumps(zarray))
        assert info.value.errno == errno.EINVAL
        assert path.read_text() == shown
    mounted.stop()
    assert snapshot(source) == before
    assert_source(source, {"sharded": DATA})


def test_unsharded_creates_and_groups_are_stored_as_written(tmp_path: Path, mount) -> None:
    source, reference = tmp_path / "src", tmp_path / "reference"
    make_source(source)
    mounted: Mounted = mount(source)
    expected = {}
    for root in (mounted.path, reference):  # the same writes through the mount and directly
        group = zarr.open_group(root, mode="a")
        sub = group.create_group("sub", attributes={"made": "through the mount"})
        for name, options in {
            "zstd": {"chunks": CHUNKS},
            "raw": {"chunks": CHUNKS, "compressors": None},
            "sub/nested": {"chunks": (5, 7), "serializer": BytesCodec(endian="big")},
        }.items():
            array = group.create_array(name, shape=SHAPE, dtype=DATA.dtype, **options)
            array[:] = DATA
            array.attrs["unit"] = "nm"
            expected[name] = DATA
        sub.attrs["edited"] = True
    # Attributes of arrays kept as stored (unsharded, shown unchanged) change as written.
    for name in ("plain", "unchanged"):
        zarr.open_array(mounted.path / name, mode="r+").attrs["unit"] = "nm"
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()
    for name in ("sub", *expected):
        assert (source / name / "zarr.json").read_bytes() == (
            reference / name / "zarr.json"
        ).read_bytes(), name
    for name in ("plain", "unchanged"):
        meta = json.loads((source / name / "zarr.json").read_text())
        assert meta["attributes"] == {"unit": "nm"}
    assert_source(source, {**expected, "sharded": DATA, "plain": DATA})
    # tensorstore cannot read whole-shard compression; zarr-python can.
    np.testing.assert_array_equal(zarr.open_array(source / "unchanged")[...], DATA)
    assert_only_nodes(source)


def format_refusals(mounted: Mounted) -> list[str]:
    return [line for line in mounted.log().splitlines() if " ERROR " in line]


@pytest.mark.parametrize(
    ("view", "zarr_format", "documents"),
    [((), 2, (".zarray", ".zattrs")), (("view=v2",), 3, ("zarr.json",))],
    ids=["v2_writer_in_v3_view", "v3_writer_in_v2_view"],
)
def test_a_writer_of_the_other_format_is_refused_at_once(
    tmp_path: Path, mount, view: tuple[str, ...], zarr_format: int, documents: tuple[str, ...]
) -> None:
    """Before, zarr-python 3 wrote the whole array, saw it, and the source never got it."""
    source = tmp_path / "src"
    make_source(source)
    before = snapshot(source)
    mounted: Mounted = mount(source, *view)
    with pytest.raises(OSError) as info:
        zarr.create_array(
            mounted.path / "grp" / "new",
            shape=SHAPE,
            chunks=CHUNKS,
            dtype=DATA.dtype,
            zarr_format=zarr_format,
        )[:] = DATA
    assert info.value.errno == errno.EINVAL
    # zarr-python 3 writes `.zarray` and `.zattrs` at once: either may be refused first,
    # and the other then too, or never tried.
    lines = format_refusals(mounted)
    assert 1 <= len(lines) <= 2, lines
    assert all(any(f"grp/new/{name}" in line for name in documents) for line in lines), lines
    assert all("grp/new/" in line and "-o view=v2" in line for line in lines), lines
    mounted.stop()
    assert snapshot(source) == before
    assert_only_nodes(source)


@pytest.mark.parametrize(
    ("view", "name"),
    [((), ".zattrs"), ((), ".zgroup"), ((), ".zmetadata"), (("view=v2",), "zarr.json")],
)
@WRITES
def test_metadata_of_the_other_format_is_never_taken(
    tmp_path: Path, mount, view: tuple[str, ...], name: str, write
) -> None:
    source = tmp_path / "src"
    make_source(source)
    before = snapshot(source)
    mounted: Mounted = mount(source, "rw", *view)
    for directory in ("", "grp", "plain"):
        with pytest.raises(OSError) as info:
            write(mounted.path / directory / name, "{}")
        assert info.value.errno == errno.EINVAL
    assert len(format_refusals(mounted)) == 3, mounted.log()
    mounted.stop()
    assert snapshot(source) == before
