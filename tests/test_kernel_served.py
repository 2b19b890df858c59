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
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.adapter import INODE_AS_FH
from tests.conftest import Mounted

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
    make_source(tmp_path / "src")
    mounted = mount(tmp_path / "src", "ro", "debug")
    start = len(mounted.log().splitlines())
    first = walk(mounted.path)
    cold = requests(mounted, start)
    assert len(first) == 4 * 6 * 9 + 1  # chunk files and zarr.json
    # One open and one opendir each answered ENOSYS; after them, none.
    assert cold["open"] == 1 and cold["opendir"] == 1, cold
    assert cold["read"] >= len(first), cold
    middle = len(mounted.log().splitlines())
    assert walk(mounted.path) == first
    warm = requests(mounted, middle)
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
