"""Metadata documents that would cost the daemon without bound, through a real mount:
a zarr.json whose shards hold 2^24 inner chunks (its per-chunk structures would take
hundreds of MiB), and documents Python's JSON decoder cannot take (nesting 2000 levels
deep, an integer of 5000 digits). Each is shown as stored with one warning; the daemon
stays small and logs no traceback, and a root document of that kind fails the mount in
one line. The arrays are written by zarr-python, their documents then edited as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.mounts import mount_type, unmount

pytestmark = pytest.mark.fuse

DEEP = "[" * 2000 + "]" * 2000
BIG = "9" * 5000


def peak_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def with_attribute(path: Path, payload: str) -> bytes:
    """Give the document at `path` an attribute holding `payload` (JSON text); its bytes."""
    doc = json.loads(path.read_text())
    doc["attributes"] = {"x": "PAYLOAD"}
    raw = json.dumps(doc).replace('"PAYLOAD"', payload).encode()
    path.write_bytes(raw)
    return raw


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w")
    # 2^24 inner chunks per shard: 128 MiB of slots, over the 16 MiB metadata budget.
    group.create_array(
        "huge", shape=(1 << 25,), dtype="u1", chunks=(1,), shards=(1 << 24,), compressors=None
    )
    (root / "huge" / "c").mkdir()
    (root / "huge" / "c" / "0").write_bytes(bytes(range(100)))
    for name in ("ok", "deep", "big"):
        array = group.create_array(name, shape=(64,), dtype="i4", chunks=(8,), shards=(32,))
        array[:] = np.arange(64, dtype="i4")
    return root


def test_hostile_arrays_are_shown_as_stored_with_one_warning(source: Path, mount) -> None:
    stored = {
        "deep": with_attribute(source / "deep" / "zarr.json", DEEP),
        "big": with_attribute(source / "big" / "zarr.json", BIG),
        "huge": (source / "huge" / "zarr.json").read_bytes(),
    }
    mounted = mount(source, "ro")
    for _ in range(3):
        for name, raw in stored.items():
            assert (mounted.path / name / "zarr.json").read_bytes() == raw
        assert sorted(os.listdir(mounted.path / "huge" / "c")) == ["0"]  # the shard, as stored
        assert sorted(os.listdir(mounted.path / "deep" / "c")) == ["0", "1"]
        assert sorted(os.listdir(mounted.path / "big" / "c")) == ["0", "1"]
    assert (mounted.path / "huge" / "c" / "0").read_bytes() == bytes(range(100))
    assert len(os.listdir(mounted.path / "ok" / "c")) == 8  # beside them, served unsharded
    assert peak_mib(mounted.process.pid) < 300
    log = mounted.log()
    assert "Traceback" not in log and "failed unexpectedly" not in log
    warnings = [line for line in log.splitlines() if "shown unchanged" in line]
    assert len(warnings) == 3, warnings
    assert any("huge/zarr.json" in w and "metadata_cache" in w for w in warnings)
    assert any("deep/zarr.json" in w and "nested deeper than 128" in w for w in warnings)
    assert any("big/zarr.json" in w and "4300 digits" in w for w in warnings)


@pytest.mark.parametrize("payload", [DEEP, BIG])
def test_a_root_document_python_cannot_parse_fails_the_mount_in_one_line(
    tmp_path: Path, payload: str
) -> None:
    root = tmp_path / "src"
    zarr.open_group(root, mode="w")
    with_attribute(root / "zarr.json", payload)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardfs", "mount", str(root), str(mountpoint)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if mount_type(str(mountpoint)) == "fuse.shardfs":
            unmount(str(mountpoint))
    assert done.returncode != 0
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "zarr.json is not valid JSON" in done.stderr
