"""Requests the kernel need not send (issue 21), counted from the daemon's debug log.

- A chunk that does not exist is answered with a negative entry: the kernel remembers
  the absence as long as it remembers entries, so a reader of a sparse array asks once
  per missing chunk, not at every probe. A chunk written through the mount shows at
  once all the same (the kernel's own create and rename replace what it remembered).
- Without `allow_other` nobody but the mounting user reaches the mount, and every file
  is that user's: the kernel checks no mode bits (no `default_permissions`), so it asks
  for no directory attributes to check them each time a writer changes a directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.options import parse_options
from tests.conftest import Mounted
from tests.mounts.test_kernel_served import CHUNKS, make_source, requests

pytestmark = pytest.mark.fuse


def mount_options(mounted: Mounted) -> set[str]:
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == str(mounted.path):
                return set(fields[3].split(","))
    raise AssertionError(f"{mounted.path} is not mounted")


@pytest.mark.parametrize("mode", ["ro", "rw", "ro,kernel_cache=no"])
def test_a_missing_chunk_is_remembered_missing(
    tmp_path: Path, mount: Callable[..., Mounted], mode: str
) -> None:
    make_source(tmp_path / "src")  # chunk c/i/j/9 of every row is empty
    mounted = mount(tmp_path / "src", mode, "debug")
    missing = mounted.path / "c" / "1" / "2" / "9"
    present = mounted.path / "c" / "1" / "2" / "8"
    assert present.is_file()
    start = len(mounted.log().splitlines())
    assert not os.path.exists(missing)
    first = requests(mounted, start)
    assert first["lookup"] == 1, first  # its parent is known: one lookup, answered empty
    middle = len(mounted.log().splitlines())
    for _ in range(3):
        assert not os.path.exists(missing)
        with pytest.raises(FileNotFoundError):
            missing.read_bytes()
    assert requests(mounted, middle) == {}  # within the entry timeout: none


def test_a_chunk_written_after_its_absence_was_seen_shows_at_once(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    data = make_source(tmp_path / "src")
    mounted = mount(tmp_path / "src", "rw")
    missing = mounted.path / "c" / "1" / "2" / "9"
    assert not missing.exists()  # remembered as missing from now on
    # zarr-python 3 writes the chunk through the view (a temporary file renamed over it).
    view = zarr.open_array(mounted.path, mode="r+")
    assert view.chunks == CHUNKS
    row = np.arange(4, dtype="uint16") + 7
    view[1, 2, 36:40] = row
    assert missing.is_file()
    data[1, 2, 36:40] = row
    np.testing.assert_array_equal(zarr.open_array(mounted.path, mode="r")[...], data)


def test_a_writer_costs_no_permission_checks(tmp_path: Path, mount: Callable[..., Mounted]) -> None:
    make_source(tmp_path / "src")
    mounted = mount(tmp_path / "src", "rw", "debug")
    assert "default_permissions" not in mount_options(mounted)
    view = zarr.open_array(mounted.path, mode="r+")
    start = len(mounted.log().splitlines())
    view[...] = 5  # every chunk of the view written by zarr-python 3: 4 x 6 x 10 files
    written = requests(mounted, start)
    chunks = 4 * 6 * 10
    assert written["rename"] == chunks, written
    # With `default_permissions` each create and each rename made the kernel ask for the
    # directory's attributes again before the next change in it: two per chunk.
    assert written["getattr"] < chunks // 4, written
    assert (zarr.open_array(mounted.path, mode="r")[...] == 5).all()


def test_allow_other_keeps_the_kernels_permission_checks() -> None:
    assert "default_permissions" in parse_options(["allow_other"]).fuse_options("src")
    assert "default_permissions" not in parse_options(["rw"]).fuse_options("src")
    assert "default_permissions" not in parse_options(["ro"]).fuse_options("src")
