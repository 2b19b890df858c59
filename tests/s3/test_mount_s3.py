"""S3 mounts under faults and concurrent writers.

Arrays are written straight into the bucket by zarr-python 3; reads go through
a real mount and the fault-injecting proxy. Whatever the proxy does (503s,
stalls, bodies cut short, a shard replaced between its index read and a
chunk read), a read returns the right values or fails with EIO: never wrong
bytes. Two mounts writing different chunks of one shard both keep theirs.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.conftest import Mounted
from tests.support.s3 import RequestInfo, S3Env

pytestmark = [pytest.mark.fuse]

SHAPE = (64, 64)
CHUNKS = (8, 8)
SHARDS = (32, 32)
#: bytes of an uncompressed shard index of 4x4 chunks: (offset, nbytes) and a crc32c
INDEX = 16 * 16 + 4


def values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60000, SHAPE).astype("uint16")


def write(s3: S3Env, path: str, data: np.ndarray, **options: Any) -> None:
    """zarr-python 3 writes `data` as a sharded array at `path` of the bucket."""
    group = zarr.open_group(s3.zarr_store("src"), mode="a")
    kwargs: dict[str, Any] = {"chunks": CHUNKS, "shards": SHARDS, "compressors": None}
    kwargs.update(options)
    array = group.create_array(
        path, shape=data.shape, dtype=data.dtype, fill_value=0, overwrite=True, **kwargs
    )
    array[...] = data


def read_view(mounted: Mounted, path: str) -> np.ndarray:
    return zarr.open_array(mounted.path / path, mode="r")[...]


def test_a_whole_array_read_costs_few_requests(s3: S3Env, mount) -> None:
    """One LIST for the tree, each index a suffix range, each shard's chunks in few GETs."""
    data = values(5)
    write(s3, "a", data)
    s3.proxy.reset_counts()
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro")
    np.testing.assert_array_equal(read_view(mounted, "a"), data)
    gets = [entry for entry in s3.proxy.log() if entry[0] == "GET" and entry[1].startswith("src/")]
    shards = {key for _, key, _, _ in gets if "/c/" in key}
    assert len(shards) == 4
    indexes = [key for _, key, byte_range, _ in gets if byte_range == f"bytes=-{INDEX}"]
    assert sorted(indexes) == sorted(shards), gets
    chunk_gets = sum(1 for _, key, _, _ in gets if key in shards) - len(indexes)
    assert chunk_gets <= 2 * len(shards), gets
    assert s3.proxy.counts()["LIST"] == 1, s3.proxy.log()
    # Read to check the source, then by the view.
    assert sum(1 for _, key, _, _ in gets if key == "src/zarr.json") == 2, gets


def test_a_read_only_mount_needs_only_read_permissions(s3: S3Env, mount) -> None:
    """Cluster nodes often hold credentials that may list and get, nothing else: asking
    for unfinished uploads (ListMultipartUploads) is then denied, and must not stop a
    read-only mount."""
    data = values(6)
    write(s3, "a", data)
    denied = s3.proxy.fail(403, code="AccessDenied", method="GET", query="uploads", count=None)
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro")
    np.testing.assert_array_equal(read_view(mounted, "a"), data)
    assert denied.hits >= 1
    assert "ERROR" not in mounted.log() and "Traceback" not in mounted.log(), mounted.log()


def test_retried_faults_leave_reads_correct(s3: S3Env, mount) -> None:
    arrays = {name: values(seed) for seed, name in enumerate(["err", "cut", "slow"])}
    for name, data in arrays.items():
        write(s3, name, data)
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro", "timeout=1")
    s3.proxy.fail(503, method="GET", key=re.compile("src/err/c/").search, count=3)
    s3.proxy.truncate(method="GET", key=re.compile("src/cut/c/").search, count=3)
    s3.proxy.slow(3.0, method="GET", key=re.compile("src/slow/c/").search, count=2)
    for name, data in arrays.items():
        np.testing.assert_array_equal(read_view(mounted, name), data, name)
    failed = [entry for entry in s3.proxy.log() if entry[3] >= 500]
    assert len(failed) >= 3, "the faults were injected"
    assert "ERROR" not in mounted.log(), mounted.log()


def test_persistent_failure_is_eio_and_one_log_line(s3: S3Env, mount) -> None:
    data = values(7)
    write(s3, "a", data)
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro", "timeout=1")
    chunk = mounted.path / "a" / "c" / "0" / "0"
    rule = s3.proxy.fail(503, method="GET", key="src/a/c/0/0", count=None)
    with pytest.raises(OSError) as error:
        chunk.read_bytes()
    assert error.value.errno == errno.EIO
    lines = [line for line in mounted.log().splitlines() if "ERROR" in line]
    assert lines and all(f"s3://{s3.bucket}/src/a/c/0/0" in line for line in lines), lines
    assert "testing" not in mounted.log()  # the credentials never reach the log
    rule.remaining = 0  # the store recovers: so does the mount, without a restart
    np.testing.assert_array_equal(read_view(mounted, "a"), data)


def test_a_shard_replaced_between_index_and_chunk_read(s3: S3Env, mount) -> None:
    """The replacement lands after the mount read a shard's index and before it reads a
    chunk: every chunk then shows the old values or the new ones, or fails with EIO."""
    old, new = values(1), values(2)
    write(s3, "a", old)
    write(s3, "b", new)  # the same array with other values: its shards replace a's
    shard = "src/a/c/0/0"
    size = s3.keys(shard)[shard][0]
    replacement = s3.get("src/b/c/0/0")
    replaced = threading.Event()

    def replace_once(request: RequestInfo) -> None:
        first, _, last = (request.range or "").removeprefix("bytes=").partition("-")
        is_index = first.startswith("-") or (last and int(last) == size - 1)
        if not replaced.is_set() and not is_index:
            s3.put(shard, replacement)
            replaced.set()

    s3.proxy.before(replace_once, method="GET", key=shard, range=True, count=None)
    mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), "ro")
    grid = [(i, j) for i in range(SHARDS[0] // CHUNKS[0]) for j in range(SHARDS[1] // CHUNKS[1])]
    outcomes = set()
    for i, j in grid:
        region = np.s_[i * CHUNKS[0] : (i + 1) * CHUNKS[0], j * CHUNKS[1] : (j + 1) * CHUNKS[1]]
        path = mounted.path / "a" / "c" / str(i) / str(j)
        try:
            raw = path.read_bytes()
        except OSError as e:
            assert e.errno == errno.EIO
            outcomes.add("EIO")
            continue
        seen = np.frombuffer(raw, dtype="<u2").reshape(CHUNKS)
        if np.array_equal(seen, old[region]):
            outcomes.add("old")
        else:
            np.testing.assert_array_equal(seen, new[region], f"chunk {i}/{j}: a mix")
            outcomes.add("new")
    assert replaced.is_set(), "the shard was replaced mid-read"
    assert "new" in outcomes, outcomes  # reopening after the change reads the new shard


@pytest.mark.parametrize("big", [False, True], ids=["put", "multipart"])
def test_two_mounts_write_different_chunks_of_one_shard(s3: S3Env, mount, big: bool) -> None:
    """Mount B commits last, from a listing that is stale on purpose: its conditional
    write fails, it re-reads the shard's index, applies its chunks again, and wins."""
    shape, chunks = ((1024, 1024), (128, 128)) if big else ((64, 64), (8, 8))
    data = np.random.default_rng(3).random(shape)  # float64: the shard is 8 MiB or 32 KiB
    write(s3, "a", data, chunks=chunks, shards=shape)
    shard = "src/a/c/0/0"
    assert (s3.keys(shard)[shard][0] >= 5 << 20) == big  # big: appends are multipart uploads
    options = [*s3.mount_options(), "flush_interval=3600"]
    first: Mounted = mount(s3.url("src"), *options)
    second: Mounted = mount(s3.url("src"), *options, "metadata_ttl=forever")
    half = shape[0] // 2
    expected = data.copy()
    expected[:half] = 1.0
    expected[half:] = 2.0
    zarr.open_array(first.path / "a", mode="r+")[:half] = 1.0
    zarr.open_array(second.path / "a", mode="r+")[half:] = 2.0
    s3.proxy.reset_counts()
    first.stop()
    second.stop()
    for mounted in (first, second):
        assert "ERROR" not in mounted.log(), mounted.log()
    refused = [entry for entry in s3.proxy.log() if entry[1] == shard and entry[3] == 412]
    assert refused, "the second commit met the first one's version"
    counts = s3.proxy.counts()
    if big:
        assert counts["UploadPartCopy"] >= 2 and counts["CompleteMultipartUpload"] >= 2, counts
    array = zarr.open_array(s3.zarr_store("src/a"), mode="r")
    np.testing.assert_array_equal(array[...], expected)
    stored = ts.open({"driver": "zarr3", "kvstore": s3.tensorstore_kvstore("src/a")}).result()
    np.testing.assert_array_equal(stored.read().result(), expected)
    uploads = s3.admin.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert not uploads, "no upload left behind"


def commit_together(mounted: Mounted, barrier: threading.Barrier, errors: list) -> None:
    """fsync the mount's root (a commit of all it buffers) once every party is ready."""
    fd = os.open(mounted.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        barrier.wait()
        os.fsync(fd)
    except BaseException as e:  # reported by the test's own thread
        errors.append(e)
    finally:
        os.close(fd)


def test_two_mounts_commit_one_shard_at_the_same_moment(s3: S3Env, mount) -> None:
    """Both mounts commit at once (fsync of each mount's root, released together), round
    after round: whichever order their conditional writes land in, both halves survive."""
    data = np.zeros(SHAPE, dtype="uint16")
    write(s3, "a", data, shards=SHAPE)
    options = [*s3.mount_options(), "flush_interval=3600"]
    mounts: list[Mounted] = [mount(s3.url("src"), *options), mount(s3.url("src"), *options)]
    half = SHAPE[0] // 2
    for value in range(1, 6):
        zarr.open_array(mounts[0].path / "a", mode="r+")[:half] = value
        zarr.open_array(mounts[1].path / "a", mode="r+")[half:] = 100 + value
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=commit_together, args=(m, barrier, errors)) for m in mounts
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        stored = zarr.open_array(s3.zarr_store("src/a"), mode="r")[...]
        assert (stored[:half] == value).all() and (stored[half:] == 100 + value).all(), value
    refused = [entry for entry in s3.proxy.log() if entry[3] == 412]
    assert refused, "in five rounds, some commit met the other mount's new version"
    for mounted in mounts:
        assert "ERROR" not in mounted.log(), mounted.log()


def test_mount_errors_are_clear(s3: S3Env, tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "mnt").mkdir()
    for url, expected in [
        (f"s3://no-such-bucket-{s3.bucket}/x", "no such bucket"),
        (s3.url("empty"), "not a Zarr v3 hierarchy"),
    ]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "shardfs",
                "mount",
                url,
                str(tmp_path / "mnt"),
                "-o",
                ",".join(s3.mount_options()),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and expected in done.stderr, done.stderr


def test_kernel_served_reads_never_mix_or_cut_a_replaced_object(s3: S3Env, mount) -> None:
    """A kernel-served S3 mount whose daemon learns of changes at once (`metadata_ttl=0.1`):
    a pass over a chunk during which its shard object is replaced whole, while more
    other files are read than the daemon keeps readers, gives the old version whole or
    fails; a chunk stat'ed and then replaced by a longer one fails once (its old version
    is gone), and the next read gives the new version whole."""
    from shardfs.fuse.adapter import INODE_AS_FH
    from shardfs.fuse.kernel_served.serving import INODE_READERS
    from tests.mounts.test_kernel_served import one_pass

    if not INODE_AS_FH:
        pytest.skip("this pyfuse3 lacks the patch in patches/ (bash scripts/setup builds it)")
    n = 1 << 18
    group = zarr.open_group(s3.zarr_store("src"), mode="a")
    big = group.create_array("big", shape=(2 * n,), chunks=(n,), shards=(2 * n,), dtype="int32",
                             compressors=None)  # fmt: skip
    big[...] = 1
    many = group.create_array("many", shape=(4 * 400,), chunks=(4,), shards=(4 * 400,),
                              dtype="int32")  # fmt: skip
    many[...] = np.arange(4 * 400, dtype="int32")
    small = group.create_array("small", shape=(64,), chunks=(16,), shards=(64,), dtype="int32")
    small[...] = np.ones(64, "int32")
    mounted: Mounted = mount(
        s3.url("src"), *s3.mount_options(), "ro", "metadata_ttl=0.1", "read_cache=0", "debug"
    )
    others = sorted((mounted.path / "many" / "c").iterdir(), key=lambda p: int(p.name))

    def meanwhile() -> None:
        big[...] = 2  # a new object (ETag) of the shard
        for path in others[: INODE_READERS + 50]:
            path.read_bytes()

    try:
        data = one_pass(mounted.path / "big" / "c" / "0", meanwhile)
    except OSError as e:
        assert e.errno == errno.EIO
    else:
        assert set(np.frombuffer(data, "<i4").tolist()) == {1} and len(data) == 4 * n

    chunk = mounted.path / "small" / "c" / "0"
    shown = chunk.stat().st_size
    small[...] = np.random.default_rng(1).integers(0, 2**31, 64, dtype="int32")
    time.sleep(0.3)  # past metadata_ttl: the daemon knows of the new object
    with pytest.raises(OSError) as failed:
        chunk.read_bytes()
    assert failed.value.errno == errno.EIO
    new = chunk.read_bytes()
    assert len(new) > shown
    assert zarr.open_array(mounted.path / "small", mode="r")[...].tolist() == small[...].tolist()
    errors = [line for line in mounted.log().splitlines() if "ERROR" in line]
    assert (
        len(errors) == 1
        and "small/c/0 changed after the kernel was given its size; reads fail" in errors[0]
    ), errors
