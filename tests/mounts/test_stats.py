"""`shardfs stats`: a mount's figures, read from its daemon over the control socket.

The figures are checked against what the counting proxy saw of the same mount,
and against what was written; asking for them must cost no request to the
source and show nothing in the mounted tree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardfs.fuse.control import socket_path
from tests.conftest import Mounted, one_shard_array
from tests.s3.test_disk_cache import chunk_by_chunk, write_array
from tests.support.s3 import S3Env


def shardfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardfs", *args], capture_output=True, text=True, timeout=60
    )


def stats(mounted: Mounted) -> dict[str, Any]:
    done = shardfs("stats", str(mounted.path), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.fuse
def test_source_figures_equal_what_the_store_saw(s3: S3Env, mount, tmp_path: Path) -> None:
    data = write_array(s3, 7)
    # Two failures of the first chunk GET of one shard: botocore retries them.
    s3.proxy.fail(503, method="GET", key=re.compile("root/a/c/1/1").search, count=2)
    s3.proxy.reset_counts()
    options = [*s3.mount_options(), "ro", f"cache_dir={tmp_path / 'cache'}"]
    mounted = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(chunk_by_chunk(mounted), data)
    listed = sorted(os.listdir(mounted.path))
    seen = s3.proxy.counts()
    figures = stats(mounted)
    assert s3.proxy.counts() == seen, "asking for the figures sends no request to the source"
    assert sorted(os.listdir(mounted.path)) == listed == ["a", "zarr.json"]
    source = figures["source"]
    expected = dict(seen)
    expected["ListMultipartUploads"] = expected.pop("other")  # a ro mount's one look for them
    assert source["requests"] == expected, "the daemon (-f) made every request the store saw"
    assert source["errors"] == {"503": 2} and source["retries"] == 2
    gets = source["requests"]["GET range"]
    assert source["bytes_read"] >= data.nbytes, "every shard byte came once at least"
    assert figures["caches"]["disk"]["misses"] > 0 and figures["caches"]["disk"]["hits"] >= 0
    assert figures["caches"]["shard indexes"]["misses"] >= 16  # once per shard at least
    fuse = figures["fuse"]["requests"]
    assert fuse["read"] >= 256 and "lookup" in fuse, fuse
    assert "commits" not in figures
    mounted.stop()
    # The remount reads from the disk cache: its figures say so.
    s3.proxy.reset_counts()
    again = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(chunk_by_chunk(again), data)
    figures = stats(again)
    disk = figures["caches"]["disk"]
    assert disk["misses"] == 0 and disk["hits"] > 0, disk
    assert figures["source"]["requests"].get("GET range", 0) < gets


@pytest.mark.fuse
def test_commits_and_fuse_errors_are_counted(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    one_shard_array(source, "a", (64, 64), (8, 8), 0)
    mounted = mount(source, "flush_interval=0.2")
    zarr.open_array(mounted.path / "a", mode="r+")[:16, :] = 7  # 16 inner chunks
    for _ in range(100):
        figures = stats(mounted)
        if figures["commits"]["chunks"] >= 16:
            break
        time.sleep(0.1)
    assert figures["commits"]["chunks"] == 16, figures["commits"]
    assert figures["commits"]["chunk_bytes"] > 0
    commits, source = figures["commits"], figures["source"]
    stored = source["requests"].get("append", 0) + source["requests"].get("put", 0)
    assert stored == commits["appends"] + commits["rewrites"] >= 1, figures
    assert source["bytes_written"] >= commits["chunk_bytes"]
    assert not (mounted.path / "nothing").exists()
    figures = stats(mounted)
    assert figures["fuse"]["errors"].get("ENOENT", 0) >= 1
    assert figures["fuse"]["requests"]["write"] >= 1


@pytest.mark.fuse
def test_the_figures_are_logged_at_an_interval(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    zarr.open_group(source, mode="w")
    mounted = mount(source, "ro", "stats_interval=0.2")
    os.listdir(mounted.path)
    deadline = time.monotonic() + 10
    while "stats: fuse" not in mounted.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    line = next(line for line in mounted.log().splitlines() if "stats: fuse" in line)
    assert "requests" in line and "source" in line
    path = socket_path(str(mounted.path))
    assert os.path.exists(path)
    mounted.stop()
    assert not os.path.exists(path), "the daemon removes its socket as it exits"


def test_stats_of_what_is_not_a_mount(tmp_path: Path) -> None:
    done = shardfs("stats", str(tmp_path))
    assert done.returncode == 2 and "is not a shardfs mount" in done.stderr


@pytest.mark.fuse
def test_the_report_shows_sizes_in_binary_units(mount, tmp_path: Path) -> None:
    """The text report is for people (4.0 KiB of 64.0 MiB, not 4096/67108864); --json keeps
    the bytes."""
    one_shard_array(tmp_path / "src", "a", (64, 64), (16, 16), 3)
    mounted = mount(tmp_path / "src", "ro", "index_cache=64M")
    assert (mounted.path / "a" / "c" / "0" / "0").read_bytes() == b"\x03" * 256
    done = shardfs("stats", str(mounted.path))
    assert done.returncode == 0, done.stderr
    index_cache = next(line for line in done.stdout.splitlines() if "index" in line)
    assert index_cache.endswith(" of 64.0 MiB"), done.stdout
    assert not re.search(r"\d+/\d{4,}", done.stdout), done.stdout
    assert re.search(r"bytes read +\d+(\.\d)? (B|KiB|MiB)$", done.stdout, re.M), done.stdout
    assert stats(mounted)["caches"]  # --json: numbers
