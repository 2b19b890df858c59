"""The writable view as a library, without FUSE: what writers do, buffered and committed.

Sources are written by zarr-python 3; the workspace gets the file operations
writers issue (temp file + rename, link + unlink, O_TRUNC, unlink, mkdir);
after a commit the source is read directly by zarr-python 3.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec

from shardfs.primitives.blocking import WouldBlock, may_block, nonblocking
from shardfs.primitives.errors import (
    AlreadyExists,
    CannotMove,
    InvalidWrite,
    MissingChunk,
    NotFound,
    ReadOnly,
)
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, Node, View
from shardfs.writeback import Handle, Workspace, WriteBuffer
from shardfs.writeback.overlay import Buffered, Kind

CHUNK = (4, 4)
T = TypeVar("T")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w")
    a = group.create_array(
        "a", shape=(16, 16), chunks=CHUNK, shards=(8, 8), dtype="<u4", compressors=None
    )
    a[:8, :8] = np.arange(64, dtype="<u4").reshape(8, 8)  # one shard of four
    mid = ShardingCodec(chunk_shape=CHUNK, codecs=[BytesCodec(), Crc32cCodec(), GzipCodec()])
    b = group.create_array(
        "b", shape=(8, 8), chunks=(8, 8), serializer=mid, dtype="<u4", compressors=None
    )
    b[:] = 1
    (root / "README").write_text("not a node")
    return root


def workspace(root: Path, view: View = View.V3, budget: int = 1 << 20) -> Workspace:
    storage = LocalStorage(root)
    namespace = Namespace(storage, view=view, serve_plain=True)
    return Workspace(namespace, WriteBuffer(budget, str(root.parent / "spool")))


def chunk(value: int) -> bytes:
    return np.full(CHUNK, value, dtype="<u4").tobytes()


def write_file(ws: Workspace, path: str, data: bytes) -> Node:
    """Create `path` (its directory must exist in the view), write it, close it."""
    parent_path, _, name = path.rpartition("/")
    node, _, handle = ws.create(ws.resolve(parent_path), name)
    ws.write(handle, 0, data)
    ws.flush(handle)
    ws.release(handle)
    return node


def read(ws: Workspace, path: str) -> bytes:
    node = ws.resolve(path)
    handle = ws.open(node, os.O_RDONLY)
    data = handle.read(0, ws.attr(node).size + 1)
    if isinstance(handle, Handle):
        ws.release(handle)
    return data


def attempt(call: Callable[..., T], *args: object) -> T:
    """`call` as the FUSE adapter runs it: inline without waiting, then again from the
    start where it may wait (see `Operations._run`)."""
    try:
        with nonblocking():
            return call(*args)
    except WouldBlock:
        return call(*args)


def test_rename_over_a_chunk_is_buffered_then_appended(source: Path) -> None:
    ws = workspace(source)
    shard = source / "a" / "c" / "0" / "0"
    before = shard.read_bytes()
    write_file(ws, "a/c/0/1.1234.partial", chunk(7))
    ws.rename(ws.resolve("a/c/0"), "1.1234.partial", ws.resolve("a/c/0"), "1", noreplace=False)
    assert read(ws, "a/c/0/1") == chunk(7)  # visible at once
    with pytest.raises(NotFound):
        ws.resolve("a/c/0/1.1234.partial")
    assert shard.read_bytes() == before  # nothing committed yet
    assert ws.sync() == 0
    after = shard.read_bytes()
    assert after.startswith(before) and len(after) > len(before)  # an append, not a rewrite
    values = zarr.open_array(source / "a", mode="r")[...]
    assert (values[0:4, 4:8] == 7).all()
    assert (values[4:8, 0:4] == np.arange(64).reshape(8, 8)[4:8, 0:4]).all()
    assert ws.committer.appends == 1


def test_link_then_unlink_creates_exclusively(source: Path) -> None:
    ws = workspace(source)
    directory = ws.resolve("a/c/0")
    write_file(ws, "a/c/0/2.tmp", chunk(3))
    with pytest.raises(AlreadyExists):
        ws.link(ws.resolve("a/c/0/2.tmp"), directory, "0")  # chunk (0, 0) exists
    ws.link(ws.resolve("a/c/0/2.tmp"), directory, "2")
    ws.unlink(directory, "2.tmp")
    assert ws.sync() == 0
    assert (zarr.open_array(source / "a", mode="r")[0:4, 8:12] == 3).all()


def test_truncating_open_and_unlink(source: Path) -> None:
    ws = workspace(source)
    handle = ws.open(ws.resolve("a/c/1/1"), os.O_WRONLY | os.O_TRUNC)
    assert ws.attr(ws.resolve("a/c/1/1")).size == 0
    ws.write(handle, 0, chunk(9))
    ws.release(handle)
    ws.unlink(ws.resolve("a/c/0"), "0")
    with pytest.raises(NotFound):
        ws.resolve("a/c/0/0")
    assert "0" not in [name for name, _, _ in ws.listing(ws.resolve("a/c/0")).items()]
    assert ws.sync() == 0
    values = zarr.open_array(source / "a", mode="r")[...]
    assert (values[4:8, 4:8] == 9).all() and (values[0:4, 0:4] == 0).all()


def test_mkdir_and_scratch_files_never_reach_the_source(source: Path) -> None:
    ws = workspace(source)
    ws.mkdir(ws.resolve("a/c"), "3")
    with pytest.raises(AlreadyExists):
        ws.mkdir(ws.resolve("a/c"), "3")
    ws.mkdir(ws.resolve("a/c/3"), "3")  # a chunk directory that holds no chunk yet
    ws.mkdir(ws.resolve(""), "tmp")
    write_file(ws, "tmp/notes.txt", b"scratch")
    write_file(ws, "a/c/3/3.partial", b"temp")
    assert read(ws, "tmp/notes.txt") == b"scratch"
    assert ws.sync() == 0
    assert not (source / "tmp").exists()
    assert not (source / "a" / "c" / "3").exists()
    with pytest.raises(CannotMove):
        ws.rename(ws.resolve(""), "tmp", ws.resolve(""), "tmp2", noreplace=False)


def test_source_files_and_metadata_are_protected(source: Path) -> None:
    ws = workspace(source)
    with pytest.raises(ReadOnly):
        ws.open(ws.resolve("README"), os.O_WRONLY)
    with pytest.raises(ReadOnly):
        ws.unlink(ws.resolve("a"), "zarr.json")


def test_v2_view_writes_get_back_the_source_codecs(source: Path) -> None:
    ws = workspace(source, View.V2)
    # "b" has crc32c in the middle of its chain: the v2 view serves it decoded.
    # Its v2 chunk keys are "i/j" (the source uses "/"), its chunks 4x4 raw values.
    directory = ws.resolve("b/1")
    write_file(ws, "b/1/0.tmp", b"short")
    with pytest.raises(InvalidWrite):
        ws.rename(directory, "0.tmp", directory, "0", noreplace=False)
    write_file(ws, "b/1/0.tmp", chunk(5))
    ws.rename(directory, "0.tmp", directory, "0", noreplace=False)
    assert read(ws, "b/1/0") == chunk(5)
    assert ws.sync() == 0
    values = zarr.open_array(source / "b", mode="r")[...]
    assert (values[4:8, 0:4] == 5).all() and (values[0:4, :] == 1).all()


def test_a_full_buffer_spills_and_loses_nothing(source: Path) -> None:
    ws = workspace(source, budget=200)
    ws.mkdir(ws.resolve("a/c"), "3")
    for j in range(4):
        write_file(ws, f"a/c/3/{j}", chunk(10 + j))  # 64 bytes each; a new shard row
    assert ws.buffer.spilled > 0 and ws.buffer.pressure.is_set()
    assert read(ws, "a/c/3/0") == chunk(10)
    assert ws.sync() == 0
    assert not os.listdir(ws.buffer.spool_dir)  # committed blobs free their spool files
    values = zarr.open_array(source / "a", mode="r")[12:16, :]
    assert all((values[:, 4 * j : 4 * j + 4] == 10 + j).all() for j in range(4))


def test_an_open_file_outlives_its_path_and_is_never_stored(source: Path) -> None:
    """Unlinked or renamed over while open: the handle goes on reading, writing and
    truncating its own bytes; nothing of it reaches the shard or the file now at its path."""
    ws = workspace(source)
    directory = ws.resolve("a/c/0")
    before = [read(ws, "a/c/0/0"), read(ws, "a/c/0/1")]
    unlinked = ws.open(ws.resolve("a/c/0/0"), os.O_RDWR)
    assert isinstance(unlinked, Handle)
    ws.unlink(directory, "0")
    write_file(ws, "a/c/0/1.tmp", chunk(5))
    replaced = ws.open(ws.resolve("a/c/0/1"), os.O_RDWR)
    assert isinstance(replaced, Handle)
    *_, was_there = ws.rename(directory, "1.tmp", directory, "1", noreplace=False)
    assert was_there
    for handle, old in zip((unlinked, replaced), before, strict=True):
        ws.write(handle, 0, b"x")
        assert ws.truncate_open(handle, 5).size == 5
        again = ws.reopen(handle, os.O_RDONLY)
        assert again.read(0, 100) == b"x" + old[1:5]
        ws.flush(handle)  # not stored: no error even though 5 bytes is no chunk
        for h in (handle, again):
            ws.release(h)
    assert ws.sync() == 0
    committed = zarr.open_array(source / "a", mode="r")[:8, :8]
    expected = np.arange(64, dtype="<u4").reshape(8, 8)
    expected[:4, :4] = 0  # unlinked: the fill value
    expected[:4, 4:8] = 5  # the file renamed over the open one
    np.testing.assert_array_equal(committed, expected)
    assert ws.rename(directory, "1", directory, "1", noreplace=False)[2] is False


def test_a_lookup_stats_each_metadata_document_once(source: Path) -> None:
    """A lookup sees one version of the metadata on its way (`Namespace.snapshot`): a
    writer's probe for a chunk it has not written yet, which goes through the overlay and
    the source, stats the array's `zarr.json` once, not at every step; and a document
    stored through the workspace is seen by the next lookup."""
    flat = zarr.create_array(  # chunk files right in the array's directory
        source / "f",
        shape=(16, 16),
        chunks=CHUNK,
        shards=(8, 8),
        dtype="<u4",
        chunk_key_encoding={"name": "v2", "separator": "."},
    )
    flat[:8, :8] = 3  # one shard of four
    ws = workspace(source)
    storage = ws.ns.storage
    stats: list[str] = []
    stat = storage.stat
    storage.stat = lambda key: stats.append(key) or stat(key)  # type: ignore[method-assign]
    parent = ws.resolve("f")
    stats.clear()
    with pytest.raises(MissingChunk):
        ws.entry(parent, "1.3")  # its shard does not exist
    assert stats.count("f/zarr.json") == 1, stats
    stats.clear()
    with pytest.raises(NotFound):
        ws.lookup(parent, "1.3.5678.partial")
    assert stats.count("f/zarr.json") == 1, stats
    # Not one snapshot across calls: a new shape shows at the next lookup.
    meta = json.loads((source / "f" / "zarr.json").read_text())
    meta["shape"] = [4, 16]
    (source / "f" / "zarr.json").write_text(json.dumps(meta))
    assert ws.entry(ws.resolve("f"), "0.1")[0].coords == (0, 1)
    with pytest.raises(NotFound):
        ws.entry(ws.resolve("f"), "1.1")


def test_a_rename_stats_each_metadata_document_once(source: Path) -> None:
    """A chunk writer's rename of its temp file over the key resolves both names and the
    file it may replace from one version of the array's metadata: one stat of its
    `zarr.json`, not one per step (it was 3). A document changed before the next rename is
    seen by it."""
    ws = workspace(source)
    storage = ws.ns.storage
    stats: list[str] = []
    stat = storage.stat
    storage.stat = lambda key: stats.append(key) or stat(key)  # type: ignore[method-assign]
    write_file(ws, "a/c/1/1.1234.partial", chunk(5))
    parent = ws.resolve("a/c/1")
    stats.clear()
    ws.rename(parent, "1.1234.partial", parent, "1", noreplace=False)
    assert stats.count("a/zarr.json") == 1, stats
    assert read(ws, "a/c/1/1") == chunk(5)
    # Not one snapshot across calls: in an array resized to one row of chunks, a file
    # renamed into the second row is no chunk (it is scratch there), at once.
    write_file(ws, "a/c/1/0.5678.partial", chunk(6))
    meta = json.loads((source / "a" / "zarr.json").read_text())
    meta["shape"] = [4, 16]
    (source / "a" / "zarr.json").write_text(json.dumps(meta))
    ws.rename(parent, "0.5678.partial", parent, "0", noreplace=False)
    renamed = ws.overlay.entry("a/c/1/0")
    assert isinstance(renamed, Buffered) and renamed.kind is Kind.SCRATCH


def test_a_file_written_whole_keeps_the_bytes_it_was_written_with(source: Path) -> None:
    """The bytes of a new file written in one request are kept as they came, not copied
    (a copy and its page faults were half the cost of a chunk's write request); later
    writes and truncations then change a copy, never those bytes."""
    ws = workspace(source)
    node, _, handle = ws.create(ws.resolve("a/c/0"), "1.1234.partial")
    data = chunk(7)
    ws.write(handle, 0, data)
    taken = handle.entry.blob.snapshot()
    assert taken is not None and taken[1] is data
    ws.write(handle, 4, b"\xff" * 4)
    ws.truncate_open(handle, len(data) + 8)
    assert data == chunk(7)
    assert read(ws, node.path) == data[:4] + b"\xff" * 4 + data[8:] + bytes(8)
    ws.release(handle)


def test_a_rename_frees_the_copy_it_made_whatever_happens(source: Path) -> None:
    """A file of the source renamed onto a file that is stored (a metadata document, a
    file stored as written) is copied into the buffer first: that copy is freed when the
    store is refused, and after an inline attempt that had to wait for the store."""
    zarr.create_array(source / "s", shape=(), dtype="f8", fill_value=0.0)[...] = 2.5
    ws = workspace(source)
    directory = ws.resolve("a/c/0")
    with pytest.raises(InvalidWrite):  # a chunk is no JSON
        ws.rename(directory, "0", ws.resolve("a"), "zarr.json", noreplace=False)
    assert ws.buffer.used == 0
    content = read(ws, "a/c/0/1")
    attempt(ws.rename, directory, "1", ws.resolve("s"), "c", False)
    assert (source / "s" / "c").read_bytes() == content
    assert ws.buffer.used == 0


def test_a_reopen_that_must_wait_takes_one_handle(source: Path) -> None:
    """`O_TRUNC` through /proc/PID/fd of an unlinked file whose blob is spilled: the
    inline attempt cannot cut the spool file, and must not count a handle for it."""
    ws = workspace(source, budget=100)
    handle = ws.open(ws.resolve("a/c/0/0"), os.O_RDWR)
    assert isinstance(handle, Handle)
    ws.unlink(ws.resolve("a/c/0"), "0")
    ws.write(handle, 64, bytes(100))
    assert handle.entry.blob.in_memory == 0  # spilled
    again = attempt(ws.reopen, handle, os.O_WRONLY | os.O_TRUNC)
    assert handle.entry.handles == 2 and again.attr().size == 0
    ws.release(again)
    ws.release(handle)
    assert not os.listdir(ws.buffer.spool_dir) and ws.buffer.used == 0


def test_a_reopen_after_the_last_close_finds_no_file(source: Path) -> None:
    """A reopen through /proc/PID/fd that had to wait for a thread, while the last
    descriptor of the unlinked file was closed: ENOENT, not a handle on a freed blob."""
    ws = workspace(source, budget=100)
    for flags in (os.O_RDONLY, os.O_WRONLY | os.O_TRUNC):
        handle = ws.open(ws.resolve("a/c/0/0"), os.O_RDWR)
        assert isinstance(handle, Handle)
        ws.unlink(ws.resolve("a/c/0"), "0")
        ws.write(handle, 64, bytes(100))  # spilled
        ws.release(handle)
        with pytest.raises(NotFound):
            ws.reopen(handle, flags)
        assert not os.listdir(ws.buffer.spool_dir) and ws.buffer.used == 0
        write_file(ws, "a/c/0/0", chunk(1))  # back for the next round
    assert ws.sync() == 0


def test_a_mkdir_that_must_wait_makes_the_directory(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mkdir whose inline attempt meets a source that must be asked (S3 without a
    fresh cached answer) makes the directory in the thread, not EEXIST."""
    ws = workspace(source)
    attr = ws.ns.attr

    def uncached(node: Node) -> object:
        if not may_block():
            raise WouldBlock
        return attr(node)

    monkeypatch.setattr(ws.ns, "attr", uncached)
    node, made = attempt(ws.mkdir, ws.resolve("a/c"), "3")
    assert node.path == "a/c/3" and made.is_dir
