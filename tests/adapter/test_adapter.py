"""The FUSE adapter in-process: errnos at the boundary and readdir paging, with no kernel.

Like s3ql's t3 tests, these call `Operations`' handlers directly under trio,
over views of sources that zarr-python 3 wrote, with `pyfuse3.readdir_reply`
replaced by a recorder that takes a few entries per call, as the kernel's
reply buffer does. Every error a handler can answer is checked against the
errno a client must see.
"""

from __future__ import annotations

import errno
import logging
import os
import stat as stat_mod
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyfuse3
import pytest
import trio
import zarr

from shardfs.fuse.adapter import WINDOW, MountConfig, Operations
from shardfs.fuse.kernel_served import serving
from shardfs.storage import LocalStorage
from shardfs.view import Namespace
from shardfs.writeback import Workspace, WriteBuffer

ROOT = pyfuse3.ROOT_INODE


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w")
    image = group.create_array(
        "image", shape=(32, 32), dtype="u2", chunks=(8, 8), shards=(16, 16), fill_value=0,
        compressors=None,
    )  # fmt: skip
    image[:24, :] = np.arange(24 * 32, dtype="u2").reshape(24, 32)  # the last row of chunks empty
    # A 1-D array of more chunk files than a window of prepared rows.
    line = group.create_array(
        "line", shape=(WINDOW + 904,), dtype="u1", chunks=(1,), shards=(1000,), fill_value=0,
        compressors=None,
    )  # fmt: skip
    line[:] = 1
    return root


def operations(source: Path, *, writable: bool = False, **config: Any) -> Operations:
    namespace = Namespace(LocalStorage(source), serve_plain=writable)
    view = Workspace(namespace, WriteBuffer(1 << 20, None)) if writable else namespace
    return Operations(view, MountConfig(read_only=not writable, **config))


def run(call: Callable[[], Awaitable[Any]]) -> Any:
    return trio.run(call)


def errno_of(call: Callable[[], Awaitable[Any]]) -> int:
    with pytest.raises(pyfuse3.FUSEError) as raised:
        run(call)
    return raised.value.errno


async def inode_of(ops: Operations, path: str) -> int:
    ino = ROOT
    for name in path.split("/"):
        ino = (await ops.lookup(ino, name.encode(), None)).st_ino  # type: ignore[arg-type]
    return ino


class Replies:
    """`pyfuse3.readdir_reply` as the kernel's buffer takes it: `room` entries per request."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.left = room
        self.names: list[str] = []
        self.inos: list[int] = []
        self.next_ids: list[int] = []

    def __call__(
        self, token: object, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int
    ) -> bool:
        if not self.left:
            return False
        self.left -= 1
        self.names.append(os.fsdecode(name))
        self.inos.append(attr.st_ino)
        self.next_ids.append(next_id)
        return True


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], Replies]]:
    def install(room: int) -> Replies:
        recorder = Replies(room)
        monkeypatch.setattr(pyfuse3, "readdir_reply", recorder)
        return recorder

    yield install


def read_dir(ops: Operations, replies: Replies, ino: int) -> list[str]:
    """Every entry of a directory, over as many readdir requests as the room asks for,
    each starting where the kernel would: at the next_id of the last entry taken."""

    async def main() -> list[str]:
        fh = ino if ops.config.kernel_served else await ops.opendir(ino, None)  # type: ignore[arg-type]
        start = 0
        while True:
            replies.left = replies.room
            before = len(replies.names)
            await ops.readdir(fh, start, None)  # type: ignore[arg-type]
            if len(replies.names) == before:
                break
            start = replies.next_ids[-1]
        if not ops.config.kernel_served:
            await ops.releasedir(fh)
        return replies.names

    return run(main)


@pytest.mark.parametrize("kernel_served", [False, True])
@pytest.mark.parametrize("room", [1, 7, 1000])
def test_readdir_pages_every_entry_once_in_order(
    source: Path, replies: Callable[[int], Replies], kernel_served: bool, room: int
) -> None:
    ops = operations(source, kernel_served=kernel_served)
    names = read_dir(ops, replies(room), run(lambda: inode_of(ops, "line/c")))
    assert names == [str(i) for i in range(WINDOW + 904)]
    root = read_dir(ops, replies(room), ROOT)
    assert root == ["image", "line", "zarr.json"]
    rows = read_dir(ops, replies(room), run(lambda: inode_of(ops, "image/c/1")))
    assert rows == ["0", "1", "2", "3"]
    assert read_dir(ops, replies(room), run(lambda: inode_of(ops, "image/c/3"))) == []


def test_errnos_of_a_read_only_view(source: Path) -> None:
    ops = operations(source)

    async def lookup(path: str) -> Any:
        return await inode_of(ops, path)

    image = run(lambda: lookup("image"))
    chunk = run(lambda: lookup("image/c/0/0"))
    assert errno_of(lambda: lookup("nothing")) == errno.ENOENT
    assert errno_of(lambda: lookup("image/c/0/0/below")) == errno.ENOTDIR
    # A chunk of the grid that holds nothing: a negative entry the kernel may keep.
    empty_row = run(lambda: lookup("image/c/3"))
    absent = run(lambda: ops.lookup(empty_row, b"0", None))  # type: ignore[arg-type]
    assert absent.st_ino == 0 and absent.entry_timeout == ops.config.timeout
    # A node id never given out: a defect, never a missing file (readers take ENOENT for one).
    assert errno_of(lambda: ops.getattr(123456789, None)) == errno.EIO  # type: ignore[arg-type]
    assert errno_of(lambda: ops.open(chunk, os.O_WRONLY, None)) == errno.EROFS  # type: ignore[arg-type]
    assert errno_of(lambda: ops.create(image, b"x", 0o100644, os.O_WRONLY, None)) == errno.EROFS  # type: ignore[arg-type]
    assert errno_of(lambda: ops.mkdir(image, b"d", 0o755, None)) == errno.EROFS  # type: ignore[arg-type]
    assert errno_of(lambda: ops.unlink(image, b"zarr.json", None)) == errno.EROFS  # type: ignore[arg-type]
    assert errno_of(lambda: ops.mknod(image, b"n", 0o20644, 0, None)) == errno.EPERM  # type: ignore[arg-type]
    assert errno_of(lambda: ops.symlink(image, b"s", b"t", None)) == errno.EPERM  # type: ignore[arg-type]
    assert errno_of(lambda: ops.setxattr(chunk, b"user.x", b"1", None)) == errno.ENOTSUP  # type: ignore[arg-type]
    assert errno_of(lambda: ops.removexattr(chunk, b"user.x", None)) == errno.ENOTSUP  # type: ignore[arg-type]
    assert errno_of(lambda: ops.getxattr(chunk, b"user.other", None)) == errno.ENODATA  # type: ignore[arg-type]
    assert run(lambda: ops.getxattr(chunk, b"user.md5", None))  # type: ignore[arg-type]
    assert errno_of(lambda: ops.getxattr(image, b"user.md5", None)) == errno.ENODATA  # type: ignore[arg-type]
    handle = run(lambda: ops.open(chunk, os.O_RDONLY, None))  # type: ignore[arg-type]
    assert errno_of(lambda: ops.flush(handle.fh)) == errno.ENOSYS, "no flushes on read-only"
    assert errno_of(lambda: ops.write(handle.fh, 0, b"x")) == errno.EBADF
    assert ops.errors["ENOENT"] >= 1 and ops.errors["EIO"] == 1 and "ENOSYS" not in ops.errors
    assert ops.requests["lookup"] >= 5


def test_errnos_of_a_kernel_served_view(source: Path) -> None:
    ops = operations(source, kernel_served=True)
    chunk = run(lambda: inode_of(ops, "image/c/0/0"))
    assert errno_of(lambda: ops.open(chunk, os.O_RDONLY, None)) == errno.ENOSYS  # type: ignore[arg-type]
    assert errno_of(lambda: ops.opendir(ROOT, None)) == errno.ENOSYS  # type: ignore[arg-type]
    data = run(lambda: ops.read(chunk, 0, 1 << 16))
    assert data == np.arange(24 * 32, dtype="u2").reshape(24, 32)[:8, :8].tobytes()


def test_errnos_of_a_writable_view(source: Path) -> None:
    ops = operations(source, writable=True)
    image = run(lambda: inode_of(ops, "image"))
    chunks = run(lambda: inode_of(ops, "image/c/0"))
    exchange = pyfuse3.RENAME_EXCHANGE if hasattr(pyfuse3, "RENAME_EXCHANGE") else 2
    assert errno_of(lambda: ops.rename(chunks, b"0", chunks, b"1", exchange, None)) == errno.EINVAL  # type: ignore[arg-type]
    assert errno_of(lambda: ops.mknod(image, b"n", 0o20644, 0, None)) == errno.EPERM  # type: ignore[arg-type]
    assert errno_of(lambda: ops.create(image, b"fifo", 0o10644, os.O_WRONLY, None)) == errno.EPERM  # type: ignore[arg-type]
    assert errno_of(lambda: ops.rmdir(ROOT, b"image", None)) == errno.ENOTEMPTY  # type: ignore[arg-type]
    assert errno_of(lambda: ops.mkdir(image, b"zarr.json", 0o755, None)) == errno.EEXIST  # type: ignore[arg-type]
    metadata = run(lambda: inode_of(ops, "image/zarr.json"))
    handle = run(lambda: ops.open(metadata, os.O_WRONLY | os.O_TRUNC, None))  # type: ignore[arg-type]
    group = b'{"zarr_format": 3, "node_type": "group"}'
    assert run(lambda: ops.write(handle.fh, 0, group)) == len(group)
    # An array's metadata turned into a group's cannot be stored: refused at close.
    assert errno_of(lambda: ops.flush(handle.fh)) == errno.EINVAL
    assert ops.errors["EINVAL"] == 2 and ops.errors["EPERM"] == 2


def test_a_bug_in_a_lookup_or_a_read_is_eio_with_its_traceback(
    source: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lookup` and `read` map errors at the boundary inline (not through `_errors`): an
    unexpected exception still gives EIO, counted, and its traceback in the log."""
    ops = operations(source, kernel_served=True)
    chunk = run(lambda: inode_of(ops, "image/c/0/0"))
    image = run(lambda: inode_of(ops, "image"))

    def bug(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ops.view, "entry", bug)
    monkeypatch.setattr(ops.serving.versions, "read_kept", bug)
    with caplog.at_level(logging.ERROR, logger="shardfs"):
        assert errno_of(lambda: ops.lookup(image, b"zarr.json", None)) == errno.EIO  # type: ignore[arg-type]
        assert errno_of(lambda: ops.read(chunk, 0, 4096)) == errno.EIO
    failed = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert [r.getMessage().split("(")[0] for r in failed] == ["lookup", "read"], failed
    assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in failed)
    assert ops.errors == {"EIO": 2} and ops.requests["read"] == 1


def test_corrupt_data_is_eio_and_one_log_line(
    source: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = source / "image" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # the index's checksum no longer matches
    shard.write_bytes(bytes(raw))
    ops = operations(source)
    with caplog.at_level(logging.ERROR, logger="shardfs"):
        assert errno_of(lambda: inode_of(ops, "image/c/0/0")) == errno.EIO
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and "image/c/0/0" in lines[0], lines
    assert ops.errors == {"EIO": 1}


def test_a_reader_dropped_while_a_thread_reads_it_is_closed_after_that_read(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernel-served: the read of a file's first half goes to a worker thread (held there);
    meanwhile a pass over another file takes the only place for a reader. The first
    reader is closed once its read is done, not under it: the read gets its bytes."""
    monkeypatch.setattr(serving, "INODE_READERS", 1)
    ops = operations(source, kernel_served=True)
    entered, gate = threading.Event(), threading.Event()
    held: list[str] = []
    inline = ops.serving._run

    async def run_call(fn: Callable[..., Any], *args: Any) -> Any:
        if getattr(fn, "__name__", "") != "read" or held:
            return await inline(fn, *args)
        held.append("read")

        def slow(*a: Any) -> Any:
            entered.set()
            gate.wait(30)
            return fn(*a)

        return await ops._thread(slow, *args)

    monkeypatch.setattr(ops.serving, "_run", run_call)
    image = zarr.open_array(source / "image")
    expected = [np.ascontiguousarray(image[0:4, 8 * j : 8 * j + 8]).tobytes() for j in (0, 1)]

    async def main() -> list[bytes]:
        first, second = await inode_of(ops, "image/c/0/0"), await inode_of(ops, "image/c/0/1")
        got: list[bytes] = []

        async def read_first() -> None:
            got.append(await ops.read(first, 0, 64))  # half the file: a pass under way

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_first)
            await trio.to_thread.run_sync(entered.wait, 30)
            assert await ops.read(second, 0, 64) == expected[1]  # drops the first reader
            gate.set()
        return got

    assert run(main) == [expected[0]]
    assert ops.errors == {}


def test_a_chunk_file_a_listing_showed_is_read_as_listed_with_no_reader(
    source: Path, replies: Callable[[int], Replies], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernel-served: a chunk file the kernel learned of from a listing (readdirplus) is
    read from the shard version that listing located, opening no reader, even once
    zarr-python has replaced the shard."""
    ops = operations(source, kernel_served=True)
    recorder = replies(1000)
    assert read_dir(ops, recorder, run(lambda: inode_of(ops, "image/c/0"))) == ["0", "1", "2", "3"]
    ino = recorder.inos[recorder.names.index("1")]
    image = zarr.open_array(source / "image", mode="r+")
    expected = np.ascontiguousarray(image[0:8, 8:16]).tobytes()
    image[0:16, 0:16] = 7  # a new shard c/0/0, renamed over the one listed

    def no_reader(*args: Any) -> None:
        raise AssertionError("a reader was opened")

    monkeypatch.setattr(ops.serving, "_open_as_of", no_reader)
    assert run(lambda: ops.read(ino, 0, 4096)) == expected


def _answer(ops: Operations, parent: str, name: str) -> object:
    """What a kernel-served lookup of `name` answers, as a client and the inode table see
    it: the node the inode resolves to, its attributes and its bytes; or the errno, or
    "absent" for a negative entry."""

    async def main() -> object:
        try:
            entry = await ops.lookup(await inode_of(ops, parent), name.encode(), None)  # type: ignore[arg-type]
        except pyfuse3.FUSEError as e:
            return e.errno
        if entry.st_ino == 0:
            return "absent"
        node = ops.inodes.node(entry.st_ino)
        if stat_mod.S_ISDIR(entry.st_mode):
            return node.path, entry.st_mode
        data = await ops.read(entry.st_ino, 0, 1 << 20)
        return node.path, node.coords, entry.st_size, entry.st_mtime_ns, data

    return run(main)


def test_lookups_in_a_chunk_directory_looked_in_before_answer_as_a_fresh_mount_does(
    source: Path,
) -> None:
    """Kernel-served: a lookup in a directory a chunk file was found in before takes the
    prepared way (`shardfs.view.leaves`): inode number from the index, no node. It must
    answer what a mount that never looked there answers, for every kind of name, also
    after the arrays were rewritten behind it with other grids and key encodings."""
    group = zarr.open_group(source, mode="r+")
    flat = group.create_array(
        "flat", shape=(6, 6), dtype="u1", chunks=(3, 3), shards=(6, 6), fill_value=0,
        chunk_key_encoding={"name": "v2", "separator": "."}, compressors=None,
    )  # fmt: skip
    flat[:3] = 5  # chunks 0.0 and 0.1; 1.x empty
    names = ["0", "1", "2", "3", "4", "01", "-1", "x", ".", "..", "zarr.json", "c"]
    names += ["0.0", "0.1", "1.0", "2.0", "00.0", "0.0.0"]
    parents = ["image/c/0", "image/c/2", "image/c/3", "image/c/9", "flat"]
    primed = operations(source, kernel_served=True)

    def compare() -> None:
        for parent in parents:
            for first in ["0", "0.0"]:  # a chunk found there first, if either names one
                _answer(primed, parent, first)
            for name in names:
                expected = _answer(operations(source, kernel_served=True), parent, name)
                assert _answer(primed, parent, name) == expected, (parent, name)

    compare()
    assert primed.serving._leaves  # the prepared way was taken
    image = zarr.open_array(source / "image", mode="r")[:]
    group.create_array(
        "image", shape=(32, 40), dtype="u2", chunks=(4, 8), shards=(8, 40), fill_value=0,
        compressors=None, overwrite=True,
    )[:, :32] = image  # fmt: skip
    group.create_array(
        "flat", shape=(6, 6), dtype="u1", chunks=(2, 3), shards=(6, 6), fill_value=0,
        compressors=None, overwrite=True,
    )[:] = 9  # fmt: skip
    compare()


def test_a_chunk_file_listed_after_its_lookup_is_read_as_listed(
    source: Path, replies: Callable[[int], Replies]
) -> None:
    """Kernel-served: a node id names one version of a chunk file. One found by a lookup,
    then listed again after zarr-python replaced its shard, is listed under another node
    id, read as the listing showed it; the looked-up one still reads as it was shown."""
    ops = operations(source, kernel_served=True)
    ino = run(lambda: inode_of(ops, "image/c/0/1"))
    before = run(lambda: ops.read(ino, 0, 4096))
    image = zarr.open_array(source / "image", mode="r+")
    image[0:16, 0:16] = 7  # a new shard c/0/0, renamed over the one looked up
    recorder = replies(1000)
    assert read_dir(ops, recorder, run(lambda: inode_of(ops, "image/c/0"))) == ["0", "1", "2", "3"]
    listed = recorder.inos[recorder.names.index("1")]
    assert listed != ino
    assert run(lambda: ops.read(listed, 0, 4096)) == np.full(64, 7, "u2").tobytes()
    assert run(lambda: ops.read(ino, 0, 4096)) == before


def test_a_passed_through_file_gets_a_node_id_per_version(
    source: Path, replies: Callable[[int], Replies]
) -> None:
    """Kernel-served: a file passed through as stored is numbered by version as a chunk
    file is. Looked up, then renamed over by a longer one and listed in the middle of a
    listing begun before (a continuation re-sends what was computed then): the old node
    id keeps the old size and bytes, the new one has the new, whatever order the kernel
    gets the replies in; the kernel forgetting the old one lets its entry go."""
    notes = source / "notes"
    notes.mkdir()
    for i in range(40):
        (notes / f"f{i:02}").write_bytes(b"old" * (i + 1))
    ops = operations(source, kernel_served=True)
    directory = run(lambda: inode_of(ops, "notes"))
    recorder = replies(10)

    async def first_reply() -> None:
        await ops.readdir(directory, 0, None)  # type: ignore[arg-type]

    run(first_reply)  # the listing is taken now: f39 as "old" * 40
    old = run(lambda: inode_of(ops, "notes/f39"))
    (notes / "new").write_bytes(b"a newer, longer version" * 10)
    (notes / "new").rename(notes / "f39")
    new = run(lambda: inode_of(ops, "notes/f39"))
    assert new != old
    recorder.left = 40

    async def rest() -> None:
        await ops.readdir(directory, recorder.next_ids[-1], None)  # type: ignore[arg-type]

    run(rest)
    assert recorder.inos[recorder.names.index("f39")] == old  # the listing's, as computed
    getattr_of = lambda ino: run(lambda: ops.getattr(ino, None)).st_size  # noqa: E731
    assert getattr_of(old) == 120 and getattr_of(new) == 230
    assert run(lambda: ops.read(old, 0, 4096)) == b"old" * 40
    assert run(lambda: ops.read(new, 0, 4096)) == b"a newer, longer version" * 10
    entries = len(ops.inodes)
    run(lambda: ops.forget([(old, 2)]))  # the lookup's and the listing's references
    assert len(ops.inodes) == entries - 1 and ops.inodes.version(old) is None
