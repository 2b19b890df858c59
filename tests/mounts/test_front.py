"""The native front (docs/design.md, "The native front"): what it answers, what it passes
on to Python, and that the bytes and versions are the same either way.

The data are written by zarr-python; reads go through the mount with zarr-python and
plain `os.read`, and are compared with what zarr-python reads from the source.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardfs.fuse.kernel_served.front import unavailable
from tests.support.shard_model import Layout, Source, judge

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.skipif(unavailable() is not None, reason=f"no native front: {unavailable()}"),
]

SHAPE, CHUNKS, SHARDS = (32, 32, 64), (4, 4, 8), (8, 8, 32)


def stats(mountpoint: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "shardfs", "stats", str(mountpoint), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    fuse: dict[str, Any] = json.loads(done.stdout)["fuse"]
    return fuse


def shardfs_stats(mountpoint: Path) -> str:
    """What `shardfs stats` prints for a person."""
    done = subprocess.run(
        [sys.executable, "-m", "shardfs", "stats", str(mountpoint)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def write(source: Path, seed: int) -> np.ndarray:
    """zarr-python writes the array "a" (uncompressed: chunk files are stored bytes)."""
    data = np.random.default_rng(seed).integers(0, 1 << 16, SHAPE, dtype="uint16")
    array = zarr.create_array(
        source / "a", shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="uint16",
        compressors=None, overwrite=True,
    )  # fmt: skip
    array[...] = data
    return data


def drop_caches() -> None:
    """The kernel's page cache, dentries and inodes (FORGETs follow)."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    zarr.create_group(src)
    return src


@pytest.mark.alone  # it drops the kernel's caches
def test_the_front_answers_lookups_reads_and_ioctls_with_the_bytes_python_would(
    source: Path, mount: Any
) -> None:
    data = write(source, 1)
    on, off = mount(source, "ro"), mount(source, "ro", "front=no")  # on: the default
    names = [f"a/c/{i}/{j}/{k}" for i in range(8) for j in range(8) for k in range(8)]
    drop_caches()  # reads from the disk: the front's workers
    for name in names:  # as a copy reads: in key order, each file opened, read, closed
        assert (on.path / name).read_bytes() == (off.path / name).read_bytes()
    front = stats(on.path)["front"]
    # Python answers the first lookup of a directory, and one of each shard's chunks in
    # it (which fills the front's rows of the shard's others): 3 of the 8 files here.
    assert front["answered"]["lookup"] >= len(names) // 2, front
    assert front["answered"]["read"] >= len(names) // 2, front
    assert front["answered"]["ioctl"] > 0 and front["read from disk"] > 0, front
    for mounted in (on, off):
        assert np.array_equal(zarr.open_array(mounted.path / "a", mode="r")[...], data)
    assert stats(off.path)["front"] == {"off": "front=no"}
    assert "native front is off" not in on.log() + off.log()
    shown = [shardfs_stats(m.path) for m in (on, off)]
    assert "native front, answered:" in shown[0] and "passed on to Python:" in shown[0]
    assert "native front: off (front=no)" in shown[1]


def test_a_new_version_goes_to_python_and_gets_new_node_ids(source: Path, mount: Any) -> None:
    """A shard rewritten by zarr-python: the front's rows of the old version cannot vouch
    for the lookup ("changed"), Python numbers the new version, and reads are new bytes; a
    descriptor opened before reads the old version whole (a node id names one version)."""
    write(source, 2)
    mounted = mount(source, "ro", "cache_timeout=0.2", "front=yes")
    chunk = mounted.path / "a" / "c" / "0" / "0" / "1"
    zarr.open_array(mounted.path / "a", mode="r")[...]  # every row filled
    old_bytes = chunk.read_bytes()
    old_ino = os.stat(chunk).st_ino
    held = os.open(chunk, os.O_RDONLY)
    try:
        new = write(source, 3)
        time.sleep(0.5)  # past cache_timeout: the kernel looks the names up again
        assert np.array_equal(zarr.open_array(mounted.path / "a", mode="r")[...], new)
        assert os.stat(chunk).st_ino != old_ino
        assert chunk.read_bytes() != old_bytes
        assert os.pread(held, len(old_bytes) + 1, 0) == old_bytes
    finally:
        os.close(held)
    assert stats(mounted.path)["front"]["misses"]["changed"] > 0


def test_a_read_the_front_gets_short_is_a_short_read_not_an_error(source: Path, mount: Any) -> None:
    """The front reads without waiting, and fewer bytes than asked may come back with no
    error: the rest is not in the page cache, or the file shrank. It then passes the read
    on to Python, which knows which, and counts "short read", not "error". (A shard cut
    short under the mount: the chunk's version is gone, so EIO.)"""
    data = np.random.default_rng(9).integers(0, 1 << 16, (64, 256), dtype="uint16")
    array = zarr.create_array(
        source / "p", shape=data.shape, chunks=(32, 128), shards=(64, 256), dtype="uint16",
        compressors=None,
    )  # fmt: skip
    array[...] = data  # 4 chunks of 8 KiB, in the page cache as zarr-python wrote them
    mounted = mount(source, "ro", "front=yes")
    chunk = mounted.path / "p" / "c" / "0" / "1"  # at 8 KiB in the shard
    os.stat(chunk)  # its row, filled by Python
    os.truncate(source / "p" / "c" / "0" / "0", 8192 + 100)
    with pytest.raises(OSError) as failed:
        chunk.read_bytes()
    assert failed.value.errno == errno.EIO
    misses = stats(mounted.path)["front"]["misses"]
    assert misses["short read"] >= 1 and misses["error"] == 0, misses  # (the kernel retries)


@pytest.mark.alone  # it drops the kernel's caches
def test_forgotten_versions_leave_the_front_and_come_back(source: Path, mount: Any) -> None:
    """The kernel forgets every chunk file (caches dropped): the slots are let go on both
    sides (the front's count taken over first), and a second read fills them again."""
    data = write(source, 4)
    mounted = mount(source, "ro", "front=yes")
    assert np.array_equal(zarr.open_array(mounted.path / "a", mode="r")[...], data)
    before = stats(mounted.path)["front"]
    assert before["slots"] > 0 and before["rows"] > 0, before
    deadline = time.monotonic() + 20
    while stats(mounted.path)["front"]["slots"] and time.monotonic() < deadline:
        drop_caches()  # the kernel's FORGETs reach Python, which retires the slots
        time.sleep(0.2)
    after = stats(mounted.path)["front"]
    assert after["slots"] == 0 and after["rows"] == 0, after
    assert np.array_equal(zarr.open_array(mounted.path / "a", mode="r")[...], data)
    assert stats(mounted.path)["front"]["rows"] > 0


#: Seconds of the stress run (`test_stress_every_pass_is_one_version`, in the stress tier).
STRESS = float(os.environ.get("SHARDFS_FRONT_STRESS_SECONDS", "60"))


@pytest.mark.stress
@pytest.mark.parametrize("front", ["yes", "no"])
def test_stress_every_pass_is_one_version(tmp_path: Path, mount: Any, front: str) -> None:
    """8 threads read whole chunk files (one open-to-EOF pass each; half of them list the
    file's directory first, so that its rows come from the listing) while shards are
    replaced and rewritten by zarr-python, appended to, compacted, and rewritten in place
    underneath: every pass is one version the file had (or a version that existed inside
    one change, which a reader running through the change may see), or EIO."""
    source = Source(tmp_path / "src", tmp_path / "scratch", "t")
    zarr.create_group(source.root)
    layout = Layout(shape=4096, shard=1024, chunk=16, dtype="int32", compressed=True)
    source.create("a", layout, "ramp")
    source.commit("a")
    mounted = mount(source.root, "ro", "cache_timeout=0.5", f"front={front}")
    paths = sorted(source.current)
    lock = threading.Lock()
    stop = time.monotonic() + STRESS
    bad: list[str] = []
    counts = {"passes": 0, "eio": 0, "changes": 0}

    def change(rng: np.random.Generator) -> None:
        shard = int(rng.integers(layout.shards))
        kind = str(rng.choice(["replace", "append", "compact", "in place"]))
        if kind == "replace":
            source.replace_shard("a", shard, "random")
        elif kind == "append":
            source.append_to_shard("a", shard, "all", "random")
        elif kind == "compact":
            source.compact_shard("a", shard)
        else:
            source.rewrite_in_place("a", shard, then_replace=bool(rng.integers(2)))

    def writer() -> None:
        rng = np.random.default_rng(1)
        while time.monotonic() < stop and not bad:
            with lock:  # a change and its record, as one step for the judges
                change(rng)
                source.commit("a")
                counts["changes"] += 1
            time.sleep(float(rng.uniform(0, 0.05)))

    def reader(seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        while time.monotonic() < stop and not bad:
            path = paths[int(rng.integers(len(paths)))]
            try:
                if seed % 2:
                    os.listdir((mounted.path / path).parent)
                data = (mounted.path / path).read_bytes()
            except OSError as e:
                if e.errno != errno.EIO:
                    bad.append(f"{path}: {e}")
                with lock:
                    counts["eio"] += 1
                continue
            with lock:
                counts["passes"] += 1
                if data in source.ghosts.get(path, []):
                    continue
                verdict = judge(source, path, data, whole=True)
                if verdict is not None:
                    bad.append(f"{verdict[0]}: {verdict[1]}")

    threads = [threading.Thread(target=writer)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(counts, stats(mounted.path).get("front"))
    assert not bad, "\n".join(bad[:5])
    assert counts["passes"] > 100 and counts["changes"] > 10, counts
    assert mounted.process.poll() is None and "Traceback" not in mounted.log(), mounted.log()


@pytest.mark.alone  # it drops the kernel's caches
def test_the_front_pages_on_through_a_listing_python_took(source: Path, mount: Any) -> None:
    """A directory of 1,024 chunk files (4 shards), listed: Python answers the first page
    and makes the rows ready, the front the pages after it, each entry a reference of the
    kernel's. The names and node ids are what lookups and reads give, the bytes are
    Python's; references are counted right: files held open across dropped caches still
    read, and once closed every slot is let go."""
    data = np.random.default_rng(5).integers(0, 1 << 16, (4, 4096), dtype="uint16")
    array = zarr.create_array(
        source / "w", shape=data.shape, chunks=(4, 4), shards=(4, 1024), dtype="uint16",
        compressors=None,
    )  # fmt: skip
    array[...] = data
    on, off = mount(source, "ro"), mount(source, "ro", "front=no")
    listed = {e.name: e.inode() for e in os.scandir(on.path / "w" / "c" / "0")}
    assert sorted(listed) == sorted(os.listdir(off.path / "w" / "c" / "0"))
    assert sorted(listed, key=int) == [str(i) for i in range(1024)]
    front = stats(on.path)["front"]
    # (a page holds what getdents asked room for, up to the connection's max_pages)
    assert front["passed on"]["readdirplus"] == 1, front
    assert front["answered"]["readdirplus"] >= 2, front
    chunks = on.path / "w" / "c" / "0"
    for name in ("0", "255", "256", "1023"):
        assert os.stat(chunks / name).st_ino == listed[name]
        assert (chunks / name).read_bytes() == (off.path / "w" / "c" / "0" / name).read_bytes()
    held = {name: os.open(chunks / name, os.O_RDONLY) for name in ("7", "300", "600", "1000")}
    try:
        for _ in range(3):
            drop_caches()  # every entry not held is forgotten
            time.sleep(0.2)
        for name, fd in held.items():
            expect = (off.path / "w" / "c" / "0" / name).read_bytes()
            assert os.pread(fd, len(expect) + 1, 0) == expect, name
            assert os.fstat(fd).st_ino == listed[name]
    finally:
        for fd in held.values():
            os.close(fd)
    deadline = time.monotonic() + 20
    while stats(on.path)["front"]["slots"] and time.monotonic() < deadline:
        drop_caches()
        time.sleep(0.2)
    after = stats(on.path)["front"]
    assert after["slots"] == 0 and after["rows"] == 0 and after["listings"] == 0, after
    assert np.array_equal(zarr.open_array(on.path / "w", mode="r")[...], data)


def test_a_listing_made_ahead_is_answered_while_its_shards_hold(
    source: Path, mount: Any, request: pytest.FixtureRequest
) -> None:
    """Listing `w/c` shows the kernel the chunk directories `w/c/0` and `w/c/1`, whose
    listings are then made in the background for the front: the kernel's first read of
    each is answered there. A shard written by zarr-python after that (new chunk files
    in `w/c/1`) is seen: the front passes that read to Python, which lists it anew."""
    data = np.zeros((8, 4096), dtype="uint16")
    data[:, :2048] = np.random.default_rng(6).integers(1, 1 << 16, (8, 2048), dtype="uint16")
    array = zarr.create_array(
        source / "w", shape=data.shape, chunks=(4, 4), shards=(4, 1024), dtype="uint16",
        compressors=None, fill_value=0,
    )  # fmt: skip
    array[...] = data  # chunks 512-1023 of each row all zero: not stored
    mounted = mount(source, "ro")
    os.listdir(mounted.path / "w" / "c")
    # The kernel keeps these inodes, and the front their listings, whoever drops the
    # kernel's caches meanwhile (the listing's entries: no request).
    held = [os.open(mounted.path / "w" / "c" / name, os.O_PATH) for name in ("0", "1")]
    request.addfinalizer(lambda: [os.close(fd) for fd in held])
    deadline = time.monotonic() + 10
    while stats(mounted.path)["front"]["listings"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = stats(mounted.path)["front"]
    assert before["listings"] == 3, before  # w/c's (Python's reply), w/c/0's and w/c/1's

    first = mounted.path / "w" / "c" / "0"
    assert sorted(os.listdir(first), key=int) == [str(i) for i in range(512)]
    after = stats(mounted.path)["front"]
    assert after["passed on"]["readdirplus"] == before["passed on"]["readdirplus"], after
    assert (first / "7").read_bytes() == data[0:4, 28:32].tobytes()
    assert os.stat(first / "511").st_size == 32  # (a listed entry: the kernel's)

    zarr.open_array(source / "w", mode="r+")[4:8, 3000:3004] = 9  # chunk 750: a new shard
    second = mounted.path / "w" / "c" / "1"
    assert sorted(os.listdir(second), key=int) == [str(i) for i in [*range(512), 750]]
    last = stats(mounted.path)["front"]
    assert last["passed on"]["readdirplus"] > after["passed on"]["readdirplus"], last
    assert (second / "750").read_bytes() == np.full((4, 4), 9, "uint16").tobytes()
    assert (second / "3").read_bytes() == data[4:8, 12:16].tobytes()
