"""`-o metrics` of an S3 mount: the S3 requests, bytes, errors and retries a scrape shows are
the ones the counting proxy saw, and the ones `shardfs stats` shows."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.mounts.test_metrics import scrape, value
from tests.mounts.test_stats import stats
from tests.support.s3 import S3Env, free_port


@pytest.mark.fuse
def test_a_scrape_of_an_s3_mount_counts_its_requests(s3: S3Env, mount, tmp_path: Path) -> None:
    data = np.arange(128 * 128, dtype="uint16").reshape(128, 128)
    group = zarr.open_group(s3.zarr_store("root"), mode="w")
    group.create_array(
        "a", shape=data.shape, dtype="uint16", chunks=(32, 32), shards=(64, 64), compressors=None
    )[...] = data
    # Two failures of one chunk's GET: botocore retries them.
    s3.proxy.fail(503, method="GET", key=re.compile("root/a/c/1/1").search, count=2)
    s3.proxy.reset_counts()
    port = free_port()
    options = [*s3.mount_options(), "ro", f"cache_dir={tmp_path / 'cache'}", f"metrics={port}"]
    mounted = mount(s3.url("root"), *options)
    np.testing.assert_array_equal(zarr.open_array(mounted.path / "a", mode="r")[...], data)
    seen = s3.proxy.counts()
    figures = scrape(port)
    shown = stats(mounted)
    source = shown["source"]
    assert s3.proxy.counts() == seen, "a scrape sends no request to the source"

    requests = "shardfs_source_requests_total"
    assert value(figures, requests, kind="GET range") == seen["GET range"] > 0
    assert value(figures, requests, kind="LIST") == seen["LIST"]
    assert value(figures, requests, kind="ListMultipartUploads") == seen["other"]
    for kind, n in source["requests"].items():
        assert value(figures, requests, kind=kind) == n, kind
    assert value(figures, "shardfs_source_errors_total", kind="503") == 2
    assert value(figures, "shardfs_source_retries_total") == source["retries"] == 2
    read = value(figures, "shardfs_source_read_bytes_total")
    assert read == source["bytes_read"] >= data.nbytes
    disk = shown["caches"]["disk"]
    assert value(figures, "shardfs_cache_misses_total", cache="disk") == disk["misses"] > 0
    assert value(figures, "shardfs_cache_written_bytes_total", cache="disk") > 0
    assert value(figures, "shardfs_cache_misses_total", cache="s3 listings") >= 1
