"""The daemon's descriptors through real mounts (issue 41): under a low RLIMIT_NOFILE, the
versions a kernel-served mount keeps and the files one process holds open on a
`kernel_cache=no` mount leave room for every other read; and a shard removed from the
source frees its space within `cache_timeout` and a few seconds on an idle mount."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.adapter import INODE_AS_FH
from shardfs.view.shown import SLACK, TIDY_EVERY
from tests.conftest import Mounted, stop_mount, wait_mounted

pytestmark = pytest.mark.fuse

#: Shards of the source, each of two chunk files of CHUNK int32s (stored raw).
SHARDS, CHUNK = 400, 16
#: The daemon's RLIMIT_NOFILE, soft and hard: its pins get 192 descriptors.
LIMIT = 256


def make_source(root: Path, shards: int = SHARDS) -> np.ndarray:
    """zarr-python 3 writes `shards` shards of two raw chunks; chunk file c/i holds data
    [i * CHUNK, (i + 1) * CHUNK)."""
    data = np.arange(shards * 2 * CHUNK, dtype="<i4")
    array = zarr.create_array(
        root, shape=data.shape, chunks=(CHUNK,), shards=(2 * CHUNK,), dtype="<i4", compressors=None
    )
    array[...] = data
    return data


#: A program that writes the bytes of the file it is given to its stdout.
READ = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"


def chunk(data: np.ndarray, i: int) -> bytes:
    return data[i * CHUNK : (i + 1) * CHUNK].tobytes()


@contextlib.contextmanager
def limited_mount(source: Path, tmp_path: Path, *options: str) -> Iterator[Mounted]:
    """A mount whose daemon runs under RLIMIT_NOFILE LIMIT (hard too: it cannot raise it)."""
    mountpoint, log = tmp_path / "mnt", tmp_path / "mnt.log"
    mountpoint.mkdir()
    args = [sys.executable, "-m", "shardfs", "mount", str(source), str(mountpoint), "-f"]
    args += ["-o", ",".join(options)]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

    with open(log, "ab") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, preexec_fn=limit
        )
    mounted = wait_mounted(Mounted(mountpoint, process, log, options))
    try:
        yield mounted
    finally:
        stop_mount(mounted)


def descriptors(pid: int) -> list[str]:
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


@pytest.mark.skipif(not INODE_AS_FH, reason="this pyfuse3 lacks the patch in patches/")
def test_kept_versions_leave_room_under_a_low_file_limit(tmp_path: Path) -> None:
    """Kernel-served: a lookup of a chunk file of each of 400 shards keeps versions open
    within the limit, and then every chunk file reads (before: EIO from about the 240th
    lookup on, 'Too many open files')."""
    data = make_source(tmp_path / "src")
    with limited_mount(tmp_path / "src", tmp_path, "ro") as mounted:
        for shard in range(SHARDS):
            assert os.stat(mounted.path / "c" / str(2 * shard)).st_size == 4 * CHUNK
        assert len(descriptors(mounted.process.pid)) < LIMIT
        for i in (1, 3, 2 * SHARDS - 1, 0):
            assert (mounted.path / "c" / str(i)).read_bytes() == chunk(data, i)


def test_one_process_holding_many_files_open_leaves_room_for_other_reads(
    tmp_path: Path,
) -> None:
    """`kernel_cache=no`: one process holds a chunk file of each of 400 shards open (more
    than the daemon's descriptors); another process still reads the right bytes, and so
    does every file held, its shard opened again (before: its opens failed with EIO)."""
    data = make_source(tmp_path / "src")
    with limited_mount(tmp_path / "src", tmp_path, "ro", "kernel_cache=no") as mounted:
        held = [
            os.open(mounted.path / "c" / str(2 * shard), os.O_RDONLY) for shard in range(SHARDS)
        ]
        try:
            assert len(descriptors(mounted.process.pid)) < LIMIT
            other = subprocess.run(
                [sys.executable, "-c", READ, str(mounted.path / "c" / "1")],
                capture_output=True,
                check=True,
            )
            assert other.stdout == chunk(data, 1)
            for shard, fd in enumerate(held):
                assert os.pread(fd, 4 * CHUNK, 0) == chunk(data, 2 * shard)
        finally:
            for fd in held:
                os.close(fd)


@pytest.mark.skipif(not INODE_AS_FH, reason="this pyfuse3 lacks the patch in patches/")
def test_a_removed_shard_frees_its_space_on_an_idle_mount(tmp_path: Path) -> None:
    """The daemon lets go the version it kept of a shard read and then removed from the
    source within cache_timeout + SLACK (and a tick of the timer), with no request."""
    data = make_source(tmp_path / "src", shards=1)
    timeout = 1
    with limited_mount(tmp_path / "src", tmp_path, "ro", f"cache_timeout={timeout}") as mounted:
        assert (mounted.path / "c" / "0").read_bytes() == chunk(data, 0)
        shown = time.monotonic()
        (tmp_path / "src" / "c" / "0").unlink()
        removed = f"{tmp_path}/src/c/0 (deleted)"
        assert removed in descriptors(mounted.process.pid)
        while removed in descriptors(mounted.process.pid):
            assert time.monotonic() - shown < timeout + SLACK + 2 * TIDY_EVERY, "still held"
            time.sleep(0.1)
