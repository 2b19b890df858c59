"""The native front (docs/design.md, "The native front"): what it answers, what it passes
on to Python, and that the bytes and versions are the same either way.

The data are written by zarr-python; reads go through the mount with zarr-python and
plain `os.read`, and are compared with what zarr-python reads from the source.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardfs.fuse.kernel_served.front import unavailable

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


def test_the_front_answers_lookups_reads_and_ioctls_with_the_bytes_python_would(
    source: Path, mount: Any
) -> None:
    data = write(source, 1)
    on, off = mount(source, "ro"), mount(source, "ro", "front=no")
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
    assert "the native front is off: front=no" in off.log()
    assert "native front is off" not in on.log()


def test_a_new_version_goes_to_python_and_gets_new_node_ids(source: Path, mount: Any) -> None:
    """A shard rewritten by zarr-python: the front's rows of the old version cannot vouch
    for the lookup ("changed"), Python numbers the new version, and reads are new bytes; a
    descriptor opened before reads the old version whole (a node id names one version)."""
    write(source, 2)
    mounted = mount(source, "ro", "cache_timeout=0.2")
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


def test_forgotten_versions_leave_the_front_and_come_back(source: Path, mount: Any) -> None:
    """The kernel forgets every chunk file (caches dropped): the slots are let go on both
    sides (the front's count taken over first), and a second read fills them again."""
    data = write(source, 4)
    mounted = mount(source, "ro")
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
