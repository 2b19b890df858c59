"""Writes into arrays the view shows unchanged, through real read-write mounts.

The view shows some arrays as stored (their real shards or chunks and their own
`zarr.json`): whole-shard compression, zero-dimensional arrays, and more (see
docs/semantics.md, "Arrays shown unchanged"). Files written at their chunk keys
used to be scratch files: the writer got no error, and the source was left with
the metadata and without the data (zarr-python 3 writing a scalar, as xarray does
for every scalar variable, lost it at unmount). Now they are stored whole, as
written, at the same key: when they are closed, renamed or linked into place, or
fsynced; unlinking one removes the object. zarr-python 3 is the writer; the
source is then read directly by zarr-python 3 and compared byte for byte.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ShardingCodec, ZstdCodec

from tests.conftest import Mounted
from tests.support.backends import Source

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

SHAPE, CHUNKS, SHARDS = (16, 24), (4, 6), (8, 12)
DATA = np.random.default_rng(7).integers(1, 60000, SHAPE).astype("uint16")
#: zstd after `sharding_indexed`: whole-shard compression, which the view shows unchanged
WHOLE_SHARD = {
    "chunks": SHARDS,
    "serializer": ShardingCodec(chunk_shape=CHUNKS),
    "compressors": [ZstdCodec()],
    "fill_value": 0,
}


def make_source(store: object) -> None:
    """A group with an array of whole-shard compression (`w`, all four shards) and a
    zero-dimensional array (`s`), written directly by zarr-python 3."""
    group = zarr.open_group(store, mode="w")
    group.create_array("w", shape=SHAPE, dtype=DATA.dtype, **WHOLE_SHARD)[:] = DATA
    group.create_array("s", shape=(), dtype="f8", fill_value=0.0)[...] = 2.5


def errors(mounted: Mounted) -> list[str]:
    return [line for line in mounted.log().splitlines() if " ERROR " in line]


def assert_no_strays(source: Source, expected: set[str]) -> None:
    """The source holds exactly `expected` (no temp file of the writer, nothing else)."""
    assert set(source.files()) == expected


def test_zero_dimensional_arrays_created_through_the_mount_are_stored(src: Source, mount) -> None:
    zarr.open_group(src.zarr_store(), mode="w")
    mounted: Mounted = mount(src.url, *src.options)
    group = zarr.open_group(mounted.path, mode="a")
    # A scalar, as xarray writes one for every scalar variable: before the fix the source
    # got its zarr.json and not its value (zarr-python then read the fill value back).
    group.create_array("s", shape=(), dtype="f8", fill_value=0.0)[...] = 3.5
    v2keys = group.create_array(
        "v", shape=(), dtype="i4", fill_value=0, chunk_key_encoding={"name": "v2"}
    )
    v2keys[...] = -17
    # Stored at once (at the rename that put each in place), and read back as written.
    stored = {"zarr.json", "s/zarr.json", "s/c", "v/zarr.json", "v/0"}
    assert_no_strays(src, stored)
    for name in ("s/zarr.json", "s/c", "v/0"):
        assert src.read(name) == (mounted.path / name).read_bytes(), name
    assert zarr.open_array(mounted.path / "s")[...] == 3.5
    mounted.stop()
    assert not errors(mounted), mounted.log()
    assert_no_strays(src, stored)
    assert zarr.open_array(src.zarr_store("s"), mode="r")[...] == 3.5
    assert zarr.open_array(src.zarr_store("v"), mode="r")[...] == -17


def test_an_array_of_whole_shard_compression_created_through_the_mount_is_stored(
    src: Source, mount
) -> None:
    zarr.open_group(src.zarr_store(), mode="w")
    mounted: Mounted = mount(src.url, *src.options)
    group = zarr.open_group(mounted.path, mode="a")
    # The view shows such an array unchanged, so the writer's shards are not taken for
    # inner chunks and it may be created (before: EINVAL at its zarr.json).
    wide = group.create_array("w", shape=SHAPE, dtype=DATA.dtype, **WHOLE_SHARD)
    expected = DATA.copy()
    expected[8:, 12:] = 0  # shard c/1/1 is never written
    wide[:, :12] = DATA[:, :12]
    wide[:8, 12:] = DATA[:8, 12:]
    stored = {"zarr.json", "w/zarr.json", "w/c/0/0", "w/c/0/1", "w/c/1/0"}
    assert_no_strays(src, stored)
    for name in ("w/zarr.json", "w/c/0/1"):
        assert src.read(name) == (mounted.path / name).read_bytes(), name
    np.testing.assert_array_equal(zarr.open_array(mounted.path / "w")[...], expected)
    mounted.stop()
    assert not errors(mounted), mounted.log()
    assert_no_strays(src, stored)
    np.testing.assert_array_equal(zarr.open_array(src.zarr_store("w"), mode="r")[...], expected)


def test_chunks_of_existing_arrays_shown_unchanged_are_overwritten_and_deleted(
    src: Source, mount
) -> None:
    make_source(src.zarr_store())
    before = {key: src.read(key) for key in src.files()}
    mounted: Mounted = mount(src.url, *src.options)
    wide = zarr.open_array(mounted.path / "w", mode="a")
    expected = DATA.copy()
    wide[:8, :12] = 7  # shard c/0/0 rewritten whole
    expected[:8, :12] = 7
    wide[8:, 12:] = 0  # all fill value: zarr-python deletes shard c/1/1
    expected[8:, 12:] = 0
    os.unlink(mounted.path / "w" / "c" / "1" / "0")  # deleted by hand
    expected[8:, :12] = 0
    zarr.open_array(mounted.path / "s", mode="a")[...] = 9.25
    # In the source at once: rewritten, deleted, untouched.
    files = set(src.files())
    assert "w/c/1/1" not in files and "w/c/1/0" not in files
    assert src.read("w/c/0/0") != before["w/c/0/0"]
    assert src.read("w/c/0/1") == before["w/c/0/1"]
    assert src.read("s/c") == (mounted.path / "s" / "c").read_bytes() != before["s/c"]
    assert not (mounted.path / "w" / "c" / "1" / "1").exists()
    np.testing.assert_array_equal(zarr.open_array(mounted.path / "w")[...], expected)
    mounted.stop()
    assert not errors(mounted), mounted.log()
    assert_no_strays(src, set(before) - {"w/c/1/1", "w/c/1/0"})
    np.testing.assert_array_equal(zarr.open_array(src.zarr_store("w"), mode="r")[...], expected)
    assert zarr.open_array(src.zarr_store("s"), mode="r")[...] == 9.25


def test_plain_file_operations_on_chunk_keys_pass_through(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    make_source(source)
    shards = {
        f"{i}/{j}": (source / "w" / "c" / str(i) / str(j)).read_bytes()
        for i in (0, 1)
        for j in (0, 1)
    }
    mounted: Mounted = mount(source)
    keys = mounted.path / "w" / "c"
    # open(O_TRUNC) + write + close: stored at close (before: EROFS at open).
    (keys / "0" / "0").write_bytes(shards["0/1"])
    assert (source / "w" / "c" / "0" / "0").read_bytes() == shards["0/1"]
    # truncate(2) by path: stored at once (no close follows).
    os.truncate(keys / "1" / "1", 10)
    assert (source / "w" / "c" / "1" / "1").read_bytes() == shards["1/1"][:10]
    # A temp file (not a key: scratch) renamed into place: stored by the rename.
    temp = keys / "1" / "1.0123abcd.partial"
    temp.write_bytes(shards["1/1"])
    assert not (source / "w" / "c" / "1" / temp.name).exists()
    os.rename(temp, keys / "1" / "1")
    assert (source / "w" / "c" / "1" / "1").read_bytes() == shards["1/1"]
    # Exclusive creation by link + unlink, onto a key removed first.
    os.unlink(keys / "1" / "0")
    assert not (source / "w" / "c" / "1" / "0").exists()
    temp = mounted.path / "w" / "link.tmp"
    temp.write_bytes(shards["1/0"])
    os.link(temp, keys / "1" / "0")
    os.unlink(temp)
    assert (source / "w" / "c" / "1" / "0").read_bytes() == shards["1/0"]
    # A key renamed over another moves the object.
    os.rename(keys / "0" / "1", keys / "0" / "0")
    assert not (source / "w" / "c" / "0" / "1").exists()
    assert (source / "w" / "c" / "0" / "0").read_bytes() == shards["0/1"]
    # fsync of a file still open stores it; writes after it are stored at close.
    with open(keys / "0" / "1", "wb") as file:
        file.write(shards["0/0"][:100])
        file.flush()
        os.fsync(file.fileno())
        assert (source / "w" / "c" / "0" / "1").read_bytes() == shards["0/0"][:100]
        file.write(shards["0/0"][100:])
    assert (source / "w" / "c" / "0" / "1").read_bytes() == shards["0/0"]
    os.rename(keys / "0" / "0", keys / "0" / "2")  # a key outside the grid: still stored
    # A file that is not a key stays scratch, as elsewhere.
    (mounted.path / "w" / "notes.txt").write_text("not data")
    mounted.stop()
    assert not errors(mounted), mounted.log()
    assert {str(p.relative_to(source / "w")) for p in (source / "w").rglob("*") if p.is_file()} == {
        "zarr.json",
        "c/0/1",
        "c/0/2",
        "c/1/0",
        "c/1/1",
    }
    assert (source / "w" / "c" / "0" / "2").read_bytes() == shards["0/1"]
    expected = DATA.copy()
    expected[:8, 12:] = DATA[:8, :12]  # c/0/1 holds the bytes of c/0/0
    expected[:8, :12] = 0  # c/0/0 moved away
    np.testing.assert_array_equal(zarr.open_array(source / "w", mode="r")[...], expected)


def test_writes_below_an_array_with_unknown_chunk_keys_are_refused(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    make_source(source)
    doc = json.loads((source / "s" / "zarr.json").read_text())
    doc["shape"] = [4]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [2]
    doc["chunk_key_encoding"] = {"name": "someday"}  # shown unchanged: the keys are unknown
    (source / "odd").mkdir()
    (source / "odd" / "zarr.json").write_text(json.dumps(doc))
    mounted: Mounted = mount(source)
    for name in ("c", "c.0123abcd.partial"):
        with pytest.raises(OSError) as info:
            (mounted.path / "odd" / name).write_bytes(b"data")
        assert info.value.errno == errno.EROFS
    lines = errors(mounted)
    assert len(lines) == 2 and "odd/c: cannot be written" in lines[0], lines
    assert "unknown chunk_key_encoding" in lines[0]
    mounted.stop()
    assert sorted(p.name for p in (source / "odd").iterdir()) == ["zarr.json"]


def test_writes_to_arrays_shown_unchanged_in_the_v2_view_are_stored(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    make_source(source)
    mounted: Mounted = mount(source, "view=v2")
    assert (mounted.path / "w" / "zarr.json").exists()  # shown unchanged, as in the source
    wide = zarr.open_array(mounted.path / "w", mode="a")
    wide[8:, 12:] = 5
    zarr.open_array(mounted.path / "s", mode="a")[...] = -1.0
    mounted.stop()
    assert not errors(mounted), mounted.log()
    expected = DATA.copy()
    expected[8:, 12:] = 5
    np.testing.assert_array_equal(zarr.open_array(source / "w", mode="r")[...], expected)
    assert zarr.open_array(source / "s", mode="r")[...] == -1.0
