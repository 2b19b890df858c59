"""Readers never get bytes of two versions, and never take a torn shard for a corrupt one.

Each test replays a sequence an audit of the write path found broken, through real
mounts, with data written by zarr-python 3: a chunk file open across another
writer's commit (read in pieces, as chunks over 4 MiB are); readers of one mount
while another appends big tails to the same shard; a torn append left by a writer
killed in the middle.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec

from shardfs.storage import LocalStorage
from tests.conftest import Mounted, one_shard_array
from tests.support.backends import Source

MIB = 1 << 20
#: 6 MiB inner chunks of uint32: over the 4 MiB a reader takes whole, so they are read in pieces
ROWS, COLS = 1536, 1024
CHUNK = ROWS * COLS * 4
LAYOUTS = ("flat", "start", "end")


def write_big(store: object) -> None:
    """Three arrays of one 6 MiB chunk c/0/0 of ones: unsharded, and sharded with the index
    at the start and at the end (two inner chunks per shard), all uncompressed."""
    group = zarr.open_group(store, mode="w")
    group.create_array(
        "flat", shape=(ROWS, COLS), dtype="<u4", chunks=(ROWS, COLS), compressors=None
    )[:] = 1
    group.create_array(
        "start",
        shape=(ROWS, 2 * COLS),
        dtype="<u4",
        chunks=(ROWS, 2 * COLS),
        serializer=ShardingCodec(
            chunk_shape=(ROWS, COLS), codecs=[BytesCodec()], index_location="start"
        ),
        compressors=None,
    )[:] = 1
    group.create_array(
        "end",
        shape=(ROWS, 2 * COLS),
        dtype="<u4",
        chunks=(ROWS, COLS),
        shards=(ROWS, 2 * COLS),
        compressors=None,
    )[:] = 1


def values(data: bytes) -> set[int]:
    return set(np.frombuffer(data, dtype="<u4").tolist())


def errors_of(mounted: Mounted) -> list[str]:
    return [line for line in mounted.log().splitlines() if "ERROR" in line]


@pytest.mark.fuse
@pytest.mark.parametrize("writer", ["another mount", "the same mount"])
def test_an_open_chunk_never_serves_two_versions(src: Source, mount, writer: str) -> None:
    """Read the first MiB of a chunk; through a writer, rewrite the chunk at the same size
    and fsync; read the last MiB on the same descriptor. It must be the old bytes (a local
    file renamed over stays readable) or EIO (an S3 object replaced whole; a shard
    appended to, which nothing proves still holds the old bytes: see docs/semantics.md,
    "Consistency"), never the new ones."""
    write_big(src.zarr_store())
    w = mount(src.url, "rw", "flush_interval=3600", *src.options)
    r = w if writer == "the same mount" else mount(src.url, "ro", *src.options)
    for name in LAYOUTS:
        fd = os.open(r.path / name / "c/0/0", os.O_RDONLY)
        try:
            assert values(os.pread(fd, MIB, 0)) == {1}
            out = os.open(w.path / name / "c/0/0", os.O_WRONLY | os.O_TRUNC)
            os.write(out, (3).to_bytes(4, "little") * (CHUNK // 4))
            os.fsync(out)
            os.close(out)
            try:
                rest = values(os.pread(fd, MIB, CHUNK - MIB))
            except OSError as e:
                assert e.errno == errno.EIO, f"{name}: {e}"
            else:
                assert rest == {1}, f"{name}: the open file mixed two versions"
        finally:
            os.close(fd)
        # Opened again, the file is the new chunk, whole.
        assert values((w.path / name / "c/0/0").read_bytes()) == {3}
    assert "Traceback" not in r.log() + w.log()
    for line in errors_of(r):
        assert "while open" in line, line
    w.stop()
    for name in LAYOUTS:
        assert np.unique(zarr.open_array(src.zarr_store(name), mode="r")[:, :COLS]).tolist() == [3]


RACE_READER = """
import json, os, sys
path, stop, out = sys.argv[1:4]
ok, errors = 0, {}
while not os.path.exists(stop):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, 4096, 0)
        finally:
            os.close(fd)
        assert data == b"\\x07" * 4096, data[:8]
        ok += 1
    except OSError as e:
        errors[str(e)] = errors.get(str(e), 0) + 1
json.dump({"ok": ok, "errors": errors}, open(out, "w"))
"""


@pytest.mark.fuse
def test_readers_of_another_mount_never_fail_during_big_appends(tmp_path: Path, mount) -> None:
    """One mount commits 15 MiB into one shard per fsync, ten times; another mount's reader of
    an untouched chunk of that shard sees neither an error nor a corrupt shard meanwhile."""
    source = tmp_path / "src"
    one_shard_array(source, "a", (4096, 4096), (1024, 1024), 7)
    w = mount(source, "rw")
    r = mount(source, "rw")  # rw: the kernel keeps no page cache across opens
    stop = tmp_path / "stop"
    result = tmp_path / "reader.json"
    reader = subprocess.Popen(
        [sys.executable, "-c", RACE_READER, str(r.path / "a/c/3/3"), str(stop), str(result)]
    )
    try:
        for value in range(1, 11):
            fds = [
                os.open(w.path / f"a/c/{i}/{k}", os.O_WRONLY | os.O_TRUNC)
                for i in range(4)
                for k in range(4)
                if (i, k) != (3, 3)
            ]
            for fd in fds:
                os.write(fd, bytes([value]) * (1024 * 1024))
            os.fsync(fds[0])  # one commit: 15 MiB appended to the shard
            for fd in fds:
                os.close(fd)
    finally:
        stop.touch()
        reader.wait(timeout=60)
    seen = json.loads(result.read_text())
    assert seen["ok"] > 100 and not seen["errors"], seen
    assert not errors_of(r), r.log()
    w.stop()
    a = zarr.open_array(source / "a", mode="r")[:]
    assert np.unique(a[3072:, 3072:]).tolist() == [7]
    assert np.unique(a[:1024, :1024]).tolist() == [10]


CRASHING_APPENDER = """
import os, sys
from shardfs.storage import LocalStorage, journal
root, key, how = sys.argv[1:4]

def torn(fd, views, offset):
    data = b"".join(bytes(v) for v in views)
    if how == "zeros":  # the file grown, its tail not written yet
        os.ftruncate(fd, offset + len(data))
    else:
        os.pwrite(fd, data[: len(data) // 2], offset)
    os._exit(9)  # killed in the middle of the append

journal.write_all = torn
storage = LocalStorage(root)
stat = storage.stat(key)
storage.append(key, [os.urandom(300_000), b"\\x00" * 20_000], stat.version)
"""


@pytest.mark.fuse
@pytest.mark.parametrize("index", ["crc32c", "no checksum"])
@pytest.mark.parametrize("tail", ["half written", "zeros"])
def test_a_torn_append_is_served_as_the_shard_before_it(
    tmp_path: Path, mount, index: str, tail: str
) -> None:
    """A writer killed in the middle of an append leaves a torn tail and its journal record.
    A mount that is already running, and a new read-only one, serve the shard as it was
    before the append (not EIO, not empty chunks); the next read-write mount rolls it back."""
    source = tmp_path / "src"
    codecs = [BytesCodec()] if index == "no checksum" else None
    group = zarr.open_group(source, mode="w")
    expected = np.arange(64 * 64, dtype="<u2").reshape(64, 64)
    sharding = ShardingCodec(
        chunk_shape=(16, 16),
        codecs=[BytesCodec()],
        **({"index_codecs": codecs} if codecs else {}),
    )
    group.create_array(
        "a", shape=(64, 64), dtype="<u2", chunks=(64, 64), serializer=sharding, compressors=None
    )[:] = expected
    running = mount(source, "ro")
    before = (running.path / "a/c/1/2").read_bytes()
    key = "a/c/0/0"
    size = (source / key).stat().st_size
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            CRASHING_APPENDER,
            str(source),
            key,
            "zeros" if tail == "zeros" else "half",
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert crashed.returncode == 9
    assert (source / key).stat().st_size > size  # torn
    assert LocalStorage(source).pending_recovery() == [key]
    fresh = mount(source, "ro")
    for mounted in (running, fresh):
        assert (mounted.path / "a/c/1/2").read_bytes() == before
        got = zarr.open_array(mounted.path / "a", mode="r")[:]
        np.testing.assert_array_equal(got, expected)
        assert not errors_of(mounted), mounted.log()
    fresh.stop()
    running.stop()
    repaired = mount(source, "rw")
    np.testing.assert_array_equal(zarr.open_array(repaired.path / "a", mode="r")[:], expected)
    assert "rolled back a torn append" in repaired.log()
    repaired.stop()
    assert (source / key).stat().st_size == size
