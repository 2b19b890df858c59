"""Kernel-served read-only mounts (issue 21): with the patched pyfuse3 the daemon answers
open and opendir with ENOSYS, and the kernel serves warm re-reads and listings itself.

The requests the kernel sends are counted from the daemon's debug log (one DEBUG line per
request). A warm pass over files and directories read before must send none; the stock
behaviour (`kernel_cache=no`) keeps its open requests; and a change of the source, made
by zarr-python 3 and by another (read-write) shardfs mount appending to a shard in place,
shows through the mount within `cache_timeout`.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr

from shardfs.fuse.adapter import INODE_AS_FH
from shardfs.fuse.kernel_served.serving import INODE_READERS
from tests.conftest import Mounted
from tests.mounts.test_stats import stats

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(
        not INODE_AS_FH,
        reason="this pyfuse3 lacks the patch in patches/ (bash scripts/setup builds it)",
    ),
]

SHAPE, CHUNKS, SHARDS = (4, 6, 40), (1, 1, 4), (2, 3, 20)


def make_source(root: Path) -> np.ndarray:
    """A 3-D sharded array written by zarr-python 3 (c/i/j/k: directories of 10 chunk
    files), with its last chunk of each row left empty."""
    data = np.arange(np.prod(SHAPE), dtype="uint16").reshape(SHAPE) + 1
    data[..., 36:] = 0
    array = zarr.create_array(
        root, shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="uint16", fill_value=0
    )
    array[...] = data
    return data


def requests(mounted: Mounted, since: int) -> collections.Counter[str]:
    """The requests the daemon logged after the first `since` lines of its log."""
    lines = mounted.log().splitlines()[since:]
    return collections.Counter(
        m.group(1) for line in lines if (m := re.search(r" DEBUG (\w+)\(", line))
    )


def read_once_dropped(path: Path) -> bytes:
    """`path` read whole, once the kernel dropped the name whose version is gone: it is
    told to once the failed reply is sent (asynchronously), and until then the name still
    leads to that version, whose reads fail with EIO."""
    for _ in range(100):
        try:
            return path.read_bytes()
        except OSError as e:
            assert e.errno == errno.EIO
            time.sleep(0.05)
    return path.read_bytes()


def walk(root: Path) -> dict[str, bytes]:
    """Every file below `root` read whole (open, read, close), after listing its directory."""
    files = {}
    for directory in sorted(p for p in [root, *root.rglob("*")] if p.is_dir()):
        for path in sorted(directory.iterdir()):
            if path.is_file():
                files[str(path.relative_to(root))] = path.read_bytes()
    return files


def test_warm_rereads_and_listings_send_no_request(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """Requests are counted where they are answered: in Python (its debug log) and in the
    native front, if it runs (`shardfs stats`)."""
    make_source(tmp_path / "src")
    mounted = mount(tmp_path / "src", "ro", "debug")

    def answered() -> collections.Counter[str]:
        return collections.Counter(
            stats(mounted).get("fuse", {}).get("front", {}).get("answered", {})
        )

    native = answered()  # (first: what it asks of the mount is not counted)
    start = len(mounted.log().splitlines())
    first = walk(mounted.path)
    cold = requests(mounted, start) + (answered() - native)
    assert len(first) == 4 * 6 * 9 + 1  # chunk files and zarr.json
    # One open and one opendir each answered ENOSYS; after them, none.
    assert cold["open"] == 1 and cold["opendir"] == 1, cold
    assert cold["read"] >= len(first), cold
    native = answered()
    middle = len(mounted.log().splitlines())
    assert walk(mounted.path) == first
    warm = requests(mounted, middle) + (answered() - native)
    assert not {"read", "readdir", "lookup", "open", "opendir", "getattr"} & warm.keys(), warm
    assert "ERROR" not in mounted.log()


def test_stock_behaviour_can_be_forced(tmp_path: Path, mount: Callable[..., Mounted]) -> None:
    """`kernel_cache=no`: every open and listing is asked, as with a stock pyfuse3."""
    make_source(tmp_path / "src")
    mounted = mount(tmp_path / "src", "ro", "debug", "kernel_cache=no")
    first = walk(mounted.path)
    middle = len(mounted.log().splitlines())
    assert walk(mounted.path) == first
    warm = requests(mounted, middle)
    assert warm["open"] == len(first) and warm["opendir"] > 0, warm
    assert warm["read"] == 0, warm  # file data is still kept across opens


def read_back(path: Path) -> np.ndarray:
    return zarr.open_array(path, mode="r")[...]


def wait_for(check: Callable[[], bool], within: float) -> float:
    """Seconds until `check()` holds; fails after `within` seconds."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within, "not seen within the bound"
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.mark.parametrize("writer", ["zarr-python", "shardfs-rw-mount"])
def test_a_changed_source_shows_within_the_cache_timeout(
    tmp_path: Path, mount: Callable[..., Mounted], writer: str
) -> None:
    """Cached pages and listings are dropped once the kernel asks again: a rewritten shard
    (zarr-python renames a new one over it) and a shard appended to in place by another
    mount (no directory's mtime changes) both show within `cache_timeout`."""
    source = tmp_path / "src"
    data = make_source(source)
    mounted = mount(source, "ro", "cache_timeout=2")
    np.testing.assert_array_equal(read_back(mounted.path), data)
    leaf = mounted.path / "c" / "0" / "0"
    assert sorted(int(p.name) for p in leaf.iterdir()) == list(range(9))
    changed = data.copy()
    changed[0, 0, :] = 7  # the empty last chunk too: a new chunk file in c/0/0
    if writer == "zarr-python":
        zarr.open_array(source, mode="r+")[0, 0, :] = 7
    else:
        writing = mount(source)
        zarr.open_array(writing.path, mode="r+")[0, 0, :] = 7
        writing.stop()
        assert "ERROR" not in writing.log(), writing.log()
    np.testing.assert_array_equal(read_back(source), changed)
    took = wait_for(lambda: len(list(leaf.iterdir())) == 10, within=6)
    np.testing.assert_array_equal(read_back(mounted.path), changed)
    assert took < 6
    assert "ERROR" not in mounted.log(), mounted.log()


# -- one version per file: as the kernel was shown it, whole (issue 31) -----------------------


def shard_chunk(shard: bytes, count: int, i: int) -> bytes:
    """Chunk `i` of a shard of `count` chunks with its index at the end (crc32c after it)."""
    index = np.frombuffer(shard[-(16 * count + 4) : -4], "<u8").reshape(count, 2)
    offset, nbytes = (int(v) for v in index[i])
    return shard[offset : offset + nbytes]


def one_pass(path: Path, others: Callable[[], None] = lambda: None, piece: int = 1 << 16) -> bytes:
    """One pass over `path` in pieces, with the kernel's read-ahead off; `others()` runs
    after the first piece (a change of the source, other readers)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        data = os.pread(fd, piece, 0)
        others()
        while piece_read := os.pread(fd, piece, len(data)):
            data += piece_read
    finally:
        os.close(fd)
    return data


@pytest.mark.parametrize("listed", [False, True], ids=["looked-up", "listed"])
def test_a_file_shown_then_replaced_is_read_as_shown(
    tmp_path: Path, mount: Callable[..., Mounted], listed: bool
) -> None:
    """A chunk file stat'ed, and listed or not (the kernel holds its size), whose shard
    zarr-python then replaces with a bigger chunk, reads as the version the kernel was
    shown: whole, never the new bytes cut at the old size. (Looked up, it is read from
    the kept version its lookup located; listed, through a reader opened as of the
    listing.)"""
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(64,), chunks=(16,), shards=(64,), dtype="int32")
    array[...] = np.ones(64, "int32")
    old = shard_chunk((source / "c" / "0").read_bytes(), 4, 0)
    mounted = mount(source, "ro")
    assert (mounted.path / "c" / "0").stat().st_size == len(old)
    if listed:
        assert len(list((mounted.path / "c").iterdir())) == 4
    array[...] = np.random.default_rng(1).integers(0, 2**31, 64, dtype="int32")
    new = shard_chunk((source / "c" / "0").read_bytes(), 4, 0)
    assert len(new) > len(old)
    assert (mounted.path / "c" / "0").read_bytes() == old
    assert "ERROR" not in mounted.log(), mounted.log()


def test_a_shard_rewritten_in_place_then_renamed_over_is_not_served(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """A chunk file looked up, whose shard is then rewritten in place at its size with its
    mtime set back (other values, written by zarr-python elsewhere), then renamed over by
    zarr-python: by its stat, the version kept is what a plain rename over leaves. The
    read fails once (EIO, one log line naming the shard), never giving the in-place
    bytes; the next gets the new version."""
    source = tmp_path / "src"
    kind = {"shape": (64,), "chunks": (16,), "shards": (64,), "dtype": "int32", "compressors": None}
    array = zarr.create_array(source, **kind)
    array[...] = 1
    zarr.create_array(tmp_path / "other", **kind)[...] = 3
    mounted = mount(source, "ro")
    chunk = mounted.path / "c" / "0"
    assert chunk.stat().st_size == 64
    shard = source / "c" / "0"
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.write((tmp_path / "other" / "c" / "0").read_bytes())
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    array[...] = 2  # zarr-python renames a new shard over it
    with pytest.raises(OSError) as failed:
        chunk.read_bytes()
    assert failed.value.errno == errno.EIO
    assert set(np.frombuffer(read_once_dropped(chunk), "<i4").tolist()) == {2}
    errors = [line for line in mounted.log().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "c/0 changed" in errors[0], errors


def test_one_pass_is_one_version_however_many_files_are_read_meanwhile(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """A pass over a 1 MiB chunk file whose shard zarr-python renames a new one over, while
    more other files are read than the daemon keeps readers: the old version, whole."""
    source, n = tmp_path / "src", 1 << 18
    zarr.create_group(source)
    big = zarr.create_array(
        source / "big", shape=(2 * n,), chunks=(n,), shards=(2 * n,), dtype="int32",
        compressors=None,
    )  # fmt: skip
    big[...] = 1
    many = zarr.create_array(
        source / "many", shape=(4 * 400,), chunks=(4,), shards=(4 * 400,), dtype="int32"
    )
    many[...] = np.arange(4 * 400, dtype="int32")
    mounted = mount(source, "ro")
    chunks = sorted((mounted.path / "many" / "c").iterdir(), key=lambda p: int(p.name))

    def meanwhile() -> None:
        big[...] = 2
        for path in chunks[: INODE_READERS + 50]:
            path.read_bytes()

    data = one_pass(mounted.path / "big" / "c" / "0", meanwhile)
    assert set(np.frombuffer(data, "<i4").tolist()) == {1}
    assert len(data) == 4 * n
    assert "ERROR" not in mounted.log(), mounted.log()


def set_attributes(path: Path, tag: str, n: int) -> None:
    """zarr-python rewrites the node's zarr.json (a rename over it) with a big attribute."""
    node = zarr.open(path, mode="r+")
    node.attrs.update({"blob": tag * n})


@pytest.mark.parametrize("node", ["sharded array", "group"])
def test_documents_are_one_version_per_pass(
    tmp_path: Path, mount: Callable[..., Mounted], node: str
) -> None:
    """The zarr.json the view renders for a sharded array, and a group's zarr.json passed
    through: a pass during which its attributes change gives the old document whole; a
    document stat'ed and then changed to a longer one reads as it was shown."""
    source = tmp_path / "src"
    zarr.create_group(source)
    for name in ("a", "b"):
        if node == "group":
            zarr.create_group(source / name)
        else:
            zarr.create_array(source / name, shape=(64,), chunks=(8,), shards=(32,), dtype="int32")
        set_attributes(source / name, "x", 600_000)
    mounted = mount(source, "ro")

    document = one_pass(
        mounted.path / "a" / "zarr.json", lambda: set_attributes(source / "a", "y", 600_000)
    )
    assert json.loads(document)["attributes"]["blob"] == "x" * 600_000

    shown = (mounted.path / "b" / "zarr.json").stat().st_size
    set_attributes(source / "b", "z", 700_000)
    document = (mounted.path / "b" / "zarr.json").read_bytes()
    assert len(document) == shown
    assert json.loads(document)["attributes"]["blob"] == "x" * 600_000
    assert "ERROR" not in mounted.log(), mounted.log()


def test_a_listing_during_a_pass_keeps_the_size_of_the_version_read(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """A pass over a chunk file during which its shard is replaced by one with a smaller
    chunk, and its directory listed (readdirplus hands the kernel every file's size):
    the pass still gives the old version whole, not cut at the new size. The listing
    showed the new version under a node id of its own, which the path now names."""
    source, n = tmp_path / "src", 1 << 18
    array = zarr.create_array(source, shape=(2 * n,), chunks=(n,), shards=(2 * n,), dtype="int32")
    array[...] = np.random.default_rng(2).integers(0, 2**31, 2 * n, dtype="int32")
    mounted = mount(source, "ro")
    path = mounted.path / "c" / "0"
    with open(path, "rb") as f:
        expected = f.read()  # as the kernel has it now; then dropped by the replace below
    size = os.stat(path).st_size

    def meanwhile() -> None:
        array[...] = 1  # zstd: a much smaller chunk
        assert sorted(os.listdir(mounted.path / "c")) == ["0", "1"]

    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the next pass asks the daemon
    os.close(fd)
    data = one_pass(path, meanwhile)
    assert len(data) == size and data == expected
    assert os.stat(path).st_size < size
    assert "ERROR" not in mounted.log(), mounted.log()


def test_a_big_rendered_document_is_read_from_the_source_once_per_pass(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """A sharded array's zarr.json bigger than the document cache (16 MiB): a whole read
    of it through a kernel-served mount reads the stored document a few times (its
    parse, its splice), not once per read request of 128 KiB as before."""
    source = tmp_path / "src"
    zarr.create_group(source)
    array = zarr.create_array(source / "a", shape=(64,), chunks=(8,), shards=(32,), dtype="int32")
    array.attrs.update({"blob": ["x" * 1000 + str(i) for i in range(20 * 1024)]})
    stored = (source / "a" / "zarr.json").read_bytes()
    mounted = mount(source, "ro")
    document = (mounted.path / "a" / "zarr.json").read_bytes()
    assert json.loads(document) == {**json.loads(stored), **json.loads(document)}
    assert json.loads(document)["attributes"] == json.loads(stored)["attributes"]
    reads = stats(mounted)["source"]["requests"]["read"]
    assert reads <= 6, reads  # zarr.json of the root and of the array, a few times each


def test_without_kernel_serving_an_open_of_a_new_version_drops_the_old_pages(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """`-o ro,kernel_cache=no` keeps file pages across opens; an open that finds another
    version than the last open had the kernel drop them, so what it kept of the old
    version is never read beside the new one's bytes."""
    source, n = tmp_path / "src", 1 << 18
    array = zarr.create_array(
        source, shape=(2 * n,), chunks=(n,), shards=(2 * n,), dtype="int32", compressors=None
    )
    array[...] = 1
    mounted = mount(source, "ro", "kernel_cache=no")
    path = mounted.path / "c" / "0"
    assert set(np.frombuffer(path.read_bytes(), "<i4").tolist()) == {1}
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 1 << 16, 0, os.POSIX_FADV_DONTNEED)  # the kernel keeps the first 64 KiB
    os.close(fd)
    array[...] = 2  # zarr-python renames a new shard over the old
    assert set(np.frombuffer(path.read_bytes(), "<i4").tolist()) == {2}
    assert set(np.frombuffer(path.read_bytes(), "<i4").tolist()) == {2}


def test_without_kernel_serving_a_file_shown_then_replaced_is_read_whole(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """`-o ro,kernel_cache=no`: a chunk file stat'ed, whose shard is then replaced with a
    bigger chunk, and opened again: the open pins the new version and the kernel is made
    to ask for its size, so the read gives it whole, not cut at the old size."""
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(64,), chunks=(16,), shards=(64,), dtype="int32")
    array[...] = np.ones(64, "int32")
    mounted = mount(source, "ro", "kernel_cache=no")
    path = mounted.path / "c" / "0"
    old = path.read_bytes()
    array[...] = np.random.default_rng(1).integers(0, 2**31, 64, dtype="int32")
    new = shard_chunk((source / "c" / "0").read_bytes(), 4, 0)
    assert len(new) > len(old) == os.stat(path).st_size  # the kernel holds the old size
    assert path.read_bytes() == new
    assert "ERROR" not in mounted.log(), mounted.log()


def test_a_chunk_whose_version_is_gone_fails_once_then_reads_the_new_version(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """A chunk file's node id names its version: once that version is gone (its shard
    rewritten in place at another size, so no kept descriptor holds it), a read of the
    name the kernel holds fails with EIO, and the kernel is told to drop the name, so the
    next open looks it up again and reads the version there now, whole."""
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(64,), chunks=(8,), shards=(32,), dtype="int32")
    array[...] = 5  # compresses well: the rewrite below has bigger chunks
    mounted = mount(source, "ro")
    path = mounted.path / "c" / "1"
    old_size = os.stat(path).st_size  # a lookup: the kernel holds this version's node id
    other = tmp_path / "other"
    zarr.create_array(other, shape=(64,), chunks=(8,), shards=(32,), dtype="int32")[...] = (
        np.random.default_rng(3).integers(0, 2**31, 64, dtype="int32")
    )
    new = (other / "c" / "0").read_bytes()
    with open(source / "c" / "0", "r+b") as shard:  # in place: the same inode
        shard.write(new)
        shard.truncate(len(new))
    with pytest.raises(OSError) as failed:
        path.read_bytes()
    assert failed.value.errno == errno.EIO
    data = read_once_dropped(path)
    stored = zarr.open_array(other, mode="r")
    assert len(data) != old_size and len(data) == os.stat(path).st_size
    assert np.frombuffer(numcodecs.Zstd().decode(data), "int32").tolist() == stored[8:16].tolist()
    assert mounted.log().count("changed after the kernel was given its size") == 1
