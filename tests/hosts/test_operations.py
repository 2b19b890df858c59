"""Operating shardfs: mount(8) and fstab, systemd (sd_notify, the shipped units, the journal),
signals and unmounts that commit, uncommitted chunks kept for the next mount, stale mounts,
and `shardfs info`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.cli import main
from shardfs.cli.logs import redact
from shardfs.fuse.mounts import (
    is_stale,
    lock_path,
    mount_type,
    open_lock,
    unmount,
    wait_for_daemon,
)
from shardfs.fuse.notify import notify
from shardfs.maintenance import fsck
from shardfs.options import parse_options
from shardfs.storage import LocalStorage
from shardfs.view import Namespace
from tests.conftest import start_mount, stop_mount
from tests.support.backends import Source
from tests.support.ome_data import image_with_labels, plate

SHARDFS = [sys.executable, "-m", "shardfs"]
REPO = Path(__file__).resolve().parents[2]
#: The units name the install location of docs/install.md; tests run the venv's command instead.
INSTALLED = "/usr/local/bin/shardfs"
VENV_SHARDFS = Path(sys.executable).parent / "shardfs"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRET"


def run(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFS, *args], capture_output=True, text=True, timeout=120, **kwargs)


def make_source(root: Path) -> np.ndarray:
    """A group with a sharded array `image` (4 shards of 4x4 chunks, 40 of 64 chunks
    written) and an unsharded array `labels/seg`; returns the image's values."""
    group = zarr.open_group(root, mode="w")
    image = group.create_array(
        "image", shape=(32, 32), dtype="uint16", shards=(16, 16), chunks=(4, 4)
    )
    values = np.zeros((32, 32), dtype="uint16")
    values[:20, :] = np.arange(20 * 32, dtype="uint16").reshape(20, 32)
    image[:] = values
    group.create_group("labels").create_array(
        "seg", shape=(30, 30), dtype="uint32", chunks=(10, 10)
    )[:] = 1
    return values


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, np.ndarray]:
    root = tmp_path / "src"
    return root, make_source(root)


def daemon_pid(mountpoint: Path) -> int:
    """The PID recorded in the lock file of the daemon serving `mountpoint`."""
    return int(json.loads(Path(lock_path(str(mountpoint))).read_text())["pid"])


def wait_exit(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, f"daemon {pid} still running"
        time.sleep(0.05)


def kill_daemon(mountpoint: Path) -> None:
    """SIGKILL the daemon serving `mountpoint` (one this test started) and wait until its
    mount is stale: its other threads may still hold /dev/fuse when the main one is gone."""
    pid = daemon_pid(mountpoint)
    os.kill(pid, signal.SIGKILL)
    wait_exit(pid)
    deadline = time.monotonic() + 20
    while not is_stale(str(mountpoint)):
        assert time.monotonic() < deadline, "the mount of a killed daemon never went stale"
        time.sleep(0.05)


@contextlib.contextmanager
def cleanup(mountpoint: Path) -> Iterator[None]:
    """However the test ends, nothing stays mounted at `mountpoint` and its daemon is gone."""
    try:
        yield
    finally:
        pid = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid = daemon_pid(mountpoint)
        if mount_type(str(mountpoint)) is not None:
            unmount(str(mountpoint), lazy=True)
        if pid is not None and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(AssertionError):
                wait_exit(pid, timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # ours: the daemon this test started


# -- 1. options: what mount(8), fstab and systemd pass ---------------------------------------


def test_generic_mount_options_are_accepted_ignored_or_mapped() -> None:
    generic = (
        "defaults,_netdev,nofail,noauto,auto,user,nouser,users,owner,group,comment=x,"
        "x-systemd.automount,x-systemd.mount-timeout=30,x-gvfs-show,relatime,nodiratime,"
        "suid,dev,exec,nosuid,nodev,noexec,rw"
    )
    options = parse_options([generic])
    assert not options.read_only
    fuse = options.fuse_options("src")
    assert {"nosuid", "nodev", "noexec"} <= fuse  # the last of each pair wins
    assert not {"suid", "dev", "exec", "defaults", "_netdev", "relatime"} & fuse
    assert not any(o.startswith(("x-", "comment")) for o in fuse)
    assert parse_options(["rw,suid,dev", "ro"]).read_only  # mount(8) passes rw first
    assert "suid" in parse_options(["nosuid,suid"]).fuse_options("src")
    # The detached daemon gets the options again: the generic ones it does not need.
    assert parse_options([generic]).argument() == "suid,dev,exec,nosuid,nodev,noexec,rw"


def test_a_command_less_argument_list_is_a_mount(tmp_path: Path) -> None:
    """mount.fuse3 runs `shardfs SOURCE MOUNTPOINT -o OPTS`."""
    result = run(str(tmp_path / "missing"), str(tmp_path), "-o", "ro,_netdev")
    assert result.returncode == 2 and "does not exist" in result.stderr, result.stderr


# -- 2. mount(8): `mount -t fuse.shardfs` and an fstab line ----------------------------------


def in_private_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run `script` (sh) in a mount namespace of its own where /usr/local/bin holds only
    `shardfs`: mount(8) runs helpers with PATH removed, so mount.fuse3 finds `shardfs` only
    in the shell's default path, as docs/install.md's link (a symlink there) arranges. The
    namespace keeps the host's /usr/local/bin, and the mounts made, out of everyone's way."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "shardfs").symlink_to(VENV_SHARDFS)
    prelude = f"set -eu\nmount --bind {bindir} /usr/local/bin\n"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", prelude + script],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.fuse
def test_mount_t_fuse_shardfs_and_an_fstab_line(tmp_path: Path, source) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not VENV_SHARDFS.exists():
        pytest.skip("needs root, unshare(1) and the venv's shardfs command")
    root, values = source
    mp = tmp_path / "mnt"
    mp.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"{root} {mp} fuse.shardfs ro,_netdev,nofail,noauto,x-systemd.automount,"
        "x-systemd.mount-timeout=30,defaults 0 0\n"
    )
    reader = tmp_path / "read.py"
    reader.write_text(
        "import sys, numpy, zarr\n"
        "numpy.save(sys.argv[2], zarr.open_array(sys.argv[1], mode='r')[:])\n"
    )
    read = f"{sys.executable} {reader}"
    script = f"""
trap 'umount -l {mp} 2>/dev/null || true' EXIT
mount -t fuse.shardfs {root} {mp} -o ro,_netdev,nofail,x-systemd.automount,suid,dev,exec,defaults
grep " {mp} " /proc/self/mountinfo
{read} {mp}/image {tmp_path}/direct.npy
umount {mp}
mount -T {fstab} {mp}
grep " {mp} " /proc/self/mountinfo
{read} {mp}/image {tmp_path}/fstab.npy
umount {mp}
"""
    result = in_private_namespace(script, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.splitlines()
    assert len(table) == 2 and all("fuse.shardfs" in line and " ro," in line for line in table)
    np.testing.assert_array_equal(np.load(tmp_path / "direct.npy"), values)
    np.testing.assert_array_equal(np.load(tmp_path / "fstab.npy"), values)
    assert mount_type(str(mp)) is None


@pytest.mark.fuse
def test_an_fstab_line_for_a_read_only_s3_prefix(tmp_path: Path, s3) -> None:
    """Credentials reach the daemon from the environment of mount(8) (here, the test's fake
    ones), as they would from a unit's Environment= or root's ~/.aws at boot."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not VENV_SHARDFS.exists():
        pytest.skip("needs root, unshare(1) and the venv's shardfs command")
    local = tmp_path / "local"
    make_source(local)
    s3.upload_tree(local, "volume.zarr")
    mp = tmp_path / "mnt"
    mp.mkdir()
    options = ",".join(["ro", "_netdev", "nofail", "metadata_ttl=forever", *s3.mount_options()])
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{s3.url('volume.zarr')} {mp} fuse.shardfs {options} 0 0\n")
    script = f"""
trap 'umount -l {mp} 2>/dev/null || true' EXIT
mount -T {fstab} {mp}
cat {mp}/image/c/0/0 > {tmp_path}/chunk
ls {mp}/image/c/3
umount {mp}
"""
    result = in_private_namespace(script, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [str(i) for i in range(8)]  # chunk row 3: all written
    assert (tmp_path / "chunk").read_bytes() == _stored_chunk(local, (0, 0))
    assert mount_type(str(mp)) is None


# -- 3. signals and unmounts commit what is buffered -----------------------------------------


def write_chunk(mountpoint: Path) -> None:
    """Copy chunk (0, 0) of `image` to the empty chunk (7, 7) through the mount."""
    data = (mountpoint / "image" / "c" / "0" / "0").read_bytes()
    (mountpoint / "image" / "c" / "7" / "7").write_bytes(data)


def assert_committed(root: Path, values: np.ndarray) -> None:
    stored = zarr.open_array(root / "image", mode="r")
    np.testing.assert_array_equal(stored[28:, 28:], values[:4, :4])


@pytest.mark.fuse
@pytest.mark.parametrize("how", ["sigterm", "sigint", "umount"])
def test_signals_and_umount_commit_pending_writes(tmp_path: Path, source, how: str) -> None:
    root, values = source
    mounted = start_mount(root, tmp_path / "mnt", tmp_path / "log", "flush_interval=600")
    try:
        write_chunk(mounted.path)
        if how == "umount":
            subprocess.run(["umount", str(mounted.path)], check=True)
        else:
            mounted.process.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        assert mounted.process.wait(timeout=30) == 0, mounted.log()
    finally:
        stop_mount(mounted)
    assert "all buffered chunks committed (this mount: 1 shard appends" in mounted.log()
    assert mount_type(str(mounted.path)) is None
    assert_committed(root, values)


@pytest.mark.fuse
def test_shardfs_umount_returns_once_the_daemon_has_exited(tmp_path: Path, source) -> None:
    root, values = source
    mp = tmp_path / "mnt"
    mp.mkdir()
    with cleanup(mp):
        result = run(
            "mount", str(root), str(mp), "-o", f"flush_interval=600,log={tmp_path / 'log'}"
        )
        assert result.returncode == 0, result.stderr
        pid = daemon_pid(mp)
        write_chunk(mp)
        result = run("umount", str(mp))
        assert result.returncode == 0, result.stderr
        wait_exit(pid, timeout=2)  # exiting already: its lock went with its files
        assert not Path(lock_path(str(mp))).exists()
    assert_committed(root, values)


@pytest.mark.fuse
def test_a_failed_commit_at_shutdown_is_kept_for_the_next_mount(tmp_path: Path, source) -> None:
    root, values = source
    spool = tmp_path / "spool"
    options = ("flush_interval=600", f"spool={spool}")
    shard = root / "image" / "c" / "1" / "1"
    intact = shard.read_bytes()
    mounted = start_mount(root, tmp_path / "mnt", tmp_path / "log1", *options)
    try:
        write_chunk(mounted.path)
        shard.write_bytes(intact[:-4] + b"XXXX")  # its index no longer verifies
        mounted.process.send_signal(signal.SIGTERM)
        assert mounted.process.wait(timeout=30) == 1, mounted.log()
    finally:
        stop_mount(mounted)
    log = mounted.log()
    assert f"could not commit 1 shard at unmount: {shard}; their chunks are kept in" in log
    kept = list(spool.glob("pending/*/*.pending"))
    assert len(kept) == 1 and str(kept[0].parent) in log

    reader = start_mount(root, tmp_path / "mnt", tmp_path / "log-ro", "ro", f"spool={spool}")
    stop_mount(reader)
    assert "chunks that an earlier mount could not commit wait in" in reader.log()
    assert "for a read-write mount of this source (shards: 1)" in reader.log()
    assert kept[0].exists()  # a read-only mount leaves them alone

    shard.write_bytes(intact)  # repaired: the next mount commits the kept chunk
    again = start_mount(root, tmp_path / "mnt", tmp_path / "log2", *options)
    try:
        kept_chunk = (again.path / "image" / "c" / "7" / "7").read_bytes()
        assert kept_chunk == _stored_chunk(root, (0, 0))  # visible before its commit
        assert run("umount", str(again.path)).returncode == 0
        assert again.process.wait(timeout=30) == 0, again.log()
    finally:
        stop_mount(again)
    assert "that an earlier mount could not commit are pending again: 1" in again.log()
    assert_committed(root, values)
    assert not list(spool.glob("pending/*"))


@pytest.mark.fuse
def test_chunks_an_unreachable_store_refused_at_shutdown_reach_it_later(tmp_path: Path, s3) -> None:
    """S3 refuses every PUT (403) when the daemon stops: the chunk is kept, named, and the
    next mount commits it."""
    local = tmp_path / "local"
    values = make_source(local)
    s3.upload_tree(local, "src")
    options = (*s3.mount_options(), "flush_interval=600", f"spool={tmp_path / 'spool'}")
    mounted = start_mount(s3.url("src"), tmp_path / "mnt", tmp_path / "log1", *options)
    try:
        write_chunk(mounted.path)
        refusal = s3.proxy.fail(403, method="PUT", count=None)
        mounted.process.send_signal(signal.SIGTERM)
        assert mounted.process.wait(timeout=60) == 1, mounted.log()
    finally:
        stop_mount(mounted)
    shard = f"s3://{s3.bucket}/src/image/c/1/1"
    assert f"could not commit 1 shard at unmount: {shard}; their chunks are kept" in mounted.log()
    assert refusal.hits >= 1

    refusal.remaining = 0  # the store takes writes again
    again = start_mount(s3.url("src"), tmp_path / "mnt", tmp_path / "log2", *options)
    try:
        assert run("umount", str(again.path)).returncode == 0
        assert again.process.wait(timeout=60) == 0, again.log()
    finally:
        stop_mount(again)
    stored = zarr.open_array(Source("src", s3).zarr_store("image"), mode="r")
    np.testing.assert_array_equal(stored[28:, 28:], values[:4, :4])


def _stored_chunk(root: Path, coords: tuple[int, int]) -> bytes:
    """Chunk `coords` of `image` as its shard stores it (read through the view, no mount)."""
    ns = Namespace(LocalStorage(str(root)))
    return ns.open(ns.resolve(f"image/c/{coords[0]}/{coords[1]}")).read(0, 1 << 20)


# -- 4. stale mounts ----------------------------------------------------------------------------


@pytest.mark.fuse
def test_the_mountpoint_of_a_killed_daemon_is_recovered(tmp_path: Path, source) -> None:
    root, values = source
    mp = tmp_path / "mnt"
    mp.mkdir()
    with cleanup(mp):
        assert run("mount", str(root), str(mp), "-o", "ro").returncode == 0
        kill_daemon(mp)
        with pytest.raises(OSError):
            os.listdir(mp)

        result = run("mount", str(root), str(mp), "-o", "ro")
        assert result.returncode == 0, result.stderr
        assert "was a stale fuse.shardfs mount" in result.stderr
        assert "cleared it (lazy unmount)" in result.stderr
        np.testing.assert_array_equal(zarr.open_array(mp / "image", mode="r")[:], values)

        # `shardfs umount` of a stale mount clears it too.
        kill_daemon(mp)
        result = run("umount", str(mp))
        assert result.returncode == 0 and "cleared it" in result.stderr, result.stderr
        assert mount_type(str(mp)) is None


#: A stand-in daemon: takes the lock of argv[1] (waiting up to argv[2] s), says so, holds it
#: for argv[3] s, records the outcome argv[4] and exits.
HOLDER = """import sys, time
from shardfs.fuse.mounts import DaemonLock
lock = DaemonLock(sys.argv[1], timeout=float(sys.argv[2]))
print("locked", flush=True)
time.sleep(float(sys.argv[3]))
lock.release(sys.argv[4])
"""


def hold(mountpoint: str, timeout: float, seconds: float, outcome: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", HOLDER, mountpoint, str(timeout), str(seconds), outcome]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_daemon_lock_orders_daemons_and_reports_to_waiters(tmp_path: Path) -> None:
    """A daemon's lock: `shardfs umount` waits on it until the daemon has exited and reads
    its outcome; a new daemon of the same mountpoint waits until the previous one is gone."""
    mp = str(tmp_path / "mnt")
    first = hold(mp, 1, 4.0, "could not commit 1 shard")  # long enough for a slow start
    processes = [first]
    try:
        assert first.stdout is not None and first.stdout.readline() == "locked\n"
        waiter = open_lock(mp)
        assert waiter is not None
        assert wait_for_daemon(waiter, timeout=0.1) is None  # still held
        impatient = hold(mp, 0.2, 0, "")
        assert impatient.wait(timeout=30) == 1
        assert "has not exited" in impatient.communicate()[1]
        second = hold(mp, 30, 0.5, "")  # waits for the first, then takes a new file
        processes.append(second)
        assert wait_for_daemon(waiter) == "could not commit 1 shard"
        first.wait(timeout=5)  # the lock went with the process (it is exiting, or gone)
        assert second.stdout is not None and second.stdout.readline() == "locked\n"
        waiter = open_lock(mp)
        assert waiter is not None
        assert json.loads(Path(lock_path(mp)).read_text())["pid"] == second.pid
        assert wait_for_daemon(waiter, timeout=30) == ""
        second.wait(timeout=5)
        assert open_lock(mp) is None
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()  # ours, by PID
            process.wait()


# -- 5. systemd: sd_notify, the journal, the units ---------------------------------------------


@contextlib.contextmanager
def notify_socket(tmp_path: Path, abstract: bool) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"shardfs-test-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + name)
        address = "@" + name
    else:
        address = str(tmp_path / "notify.sock")
        sock.bind(address)
    sock.settimeout(30)
    try:
        yield sock, address
    finally:
        sock.close()


@pytest.mark.parametrize("abstract", [False, True])
def test_notify_speaks_the_sd_notify_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, abstract: bool
) -> None:
    with notify_socket(tmp_path, abstract) as (sock, address):
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        assert notify("READY=1", "STATUS=serving /x")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving /x"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not notify("READY=1")


@pytest.mark.fuse
def test_the_daemon_tells_systemd_when_it_is_ready_and_stopping(tmp_path: Path, source) -> None:
    root, _ = source
    mp = tmp_path / "mnt"
    mp.mkdir()
    log_file = tmp_path / "stderr"
    with notify_socket(tmp_path, abstract=True) as (sock, address), cleanup(mp):
        with open(log_file, "wb") as stderr:
            st = os.fstat(stderr.fileno())
            env = {
                **os.environ,
                "NOTIFY_SOCKET": address,
                "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}",
                "AWS_SECRET_ACCESS_KEY": SECRET,
            }
            process = subprocess.Popen(
                [*SHARDFS, "mount", "--foreground", str(root), str(mp), "-o", "debug"],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
            )
        try:
            ready = sock.recv(4096).decode()
            assert ready.startswith("READY=1\n"), ready
            assert mount_type(str(mp)) == "fuse.shardfs" and "image" in os.listdir(mp)
            process.send_signal(signal.SIGTERM)
            assert sock.recv(4096).decode().startswith("STOPPING=1\n")
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()  # ours, by PID
                process.wait()
    lines = log_file.read_text().splitlines()
    # The journal's format: a priority per line, no time (the journal has it).
    assert lines and all(line[:3] in ("<6>", "<7>", "<4>", "<3>") for line in lines), lines
    assert any(line.startswith("<7>DEBUG readdir(") for line in lines)
    assert any(line.startswith("<6>INFO mounted") for line in lines)
    assert SECRET not in log_file.read_text()


def test_log_lines_carry_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    line = redact(
        f"endpoint http://alice:hunter22@minio:9000/x key AKIAIOSFODNN7EXAMPLE secret {SECRET}"
    )
    assert "hunter22" not in line and "AKIAIOSFODNN7EXAMPLE" not in line and SECRET not in line
    assert "http://[secret]@minio:9000/x" in line


def test_the_shipped_units_verify(tmp_path: Path) -> None:
    """systemd-analyze verify, with the installed command's path pointing at the venv's."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/setup installs systemd"
    units = sorted((REPO / "systemd").glob("*.service"))
    assert units
    for unit in units:
        text = unit.read_text()
        assert INSTALLED in text
        copy = tmp_path / unit.name
        copy.write_text(text.replace(INSTALLED, str(VENV_SHARDFS)))
        result = subprocess.run(
            [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0 and not result.stderr.strip(), result.stderr
        assert "Type=notify" in text and "Restart=on-failure" in text
        assert f"ExecStop=-{INSTALLED} umount %f" in text


# -- 6. shardfs info ------------------------------------------------------------------------------


def test_info_describes_every_array(tmp_path: Path, source, capsys) -> None:
    root, _ = source
    assert main(["info", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "node", "format", "data", "type", "shape", "shard", "chunk", "shards", "chunks",
        "stored", "dead",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert rows["/"][1:] == ["group"] and rows["/labels"][1:] == ["group"]
    assert rows["/image"][1:8] == ["sharded", "uint16", "32x32", "16x16", "4x4", "4", "40/64"]
    assert rows["/image"][-2:] == ["B", "(0.0%)"]
    assert rows["/labels/seg"][1:8] == ["unsharded", "uint32", "30x30", "-", "10x10", "-", "9/9"]

    assert main(["info", "--json", str(root)]) == 0
    report = json.loads(capsys.readouterr().out)
    image = next(n for n in report["nodes"] if n["path"] == "/image")
    assert image["shards"] == 4 and image["chunks"] == 40 and image["grid_chunks"] == 64
    assert image["dead_bytes"] == 0 and image["stored_bytes"] == sum(
        p.stat().st_size for p in (root / "image" / "c").rglob("*") if p.is_file()
    )


def test_info_describes_the_ome_structure(tmp_path: Path, capsys) -> None:
    """Images, levels with shapes and scales, channels, labels and the plate layout of an
    OME-Zarr 0.5 source written by zarr-python 3; a source without OME says nothing."""
    zarr.open_group(tmp_path, mode="w")
    image_with_labels(tmp_path / "cells")
    plate(tmp_path / "plate")
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    ome = [line.strip() for line in out[out.index("OME-Zarr:") + 1 :]]
    assert "image /cells: 'cells image', 3 levels" in ome
    assert "axes: z (space, micrometer), y (space, micrometer), x (space, micrometer)" in ome
    assert (
        "level 1 (/cells/1): shape 10x24x26 uint16, scale [1, 1, 1], translation [0, 2.5, 2.5]"
        in ome
    )
    assert "labels /cells/labels: cells" in ome
    assert any(
        line.startswith("label image /cells/labels/cells: 'cells', 3 levels") for line in ome
    )
    assert ome[ome.index("well A/1: 2 fields, acquisitions 0") - 2].startswith(
        "plate /plate: 'test plate', 2 rows x 2 columns, 2 wells"
    )
    assert "channel 0: 'DAPI', color 0000FF, window 0..5000 of 0..65535" in ome
    assert main(["info", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["ome"] == ome_lines(out)
    zarr.open_group(tmp_path / "plain", mode="w")
    assert main(["info", str(tmp_path / "plain")]) == 0
    assert "OME-Zarr" not in capsys.readouterr().out


def ome_lines(out: list[str]) -> list[str]:
    """The OME-Zarr section of `shardfs info`, without its indentation."""
    return [line[2:] for line in out[out.index("OME-Zarr:") + 1 :]]


@pytest.mark.fuse
def test_info_counts_the_dead_space_appends_leave(tmp_path: Path, source, capsys) -> None:
    root, _ = source
    replaced = len(_stored_chunk(root, (0, 0)))
    mounted = start_mount(root, tmp_path / "mnt", tmp_path / "log")
    try:
        (mounted.path / "image" / "c" / "0" / "0").write_bytes(
            (mounted.path / "image" / "c" / "0" / "1").read_bytes()
        )
    finally:
        stop_mount(mounted)
    assert main(["info", "--json", str(root)]) == 0
    image = next(n for n in json.loads(capsys.readouterr().out)["nodes"] if n["path"] == "/image")
    # The append left the replaced chunk and the old index (16 entries + crc32c) behind.
    assert image["dead_bytes"] == replaced + 16 * 16 + 4
    assert image["chunks"] == 40
    usage = next(a for a in fsck(LocalStorage(str(root)), repair=False).arrays)
    assert (usage.dead, usage.live) == (image["dead_bytes"], image["live_bytes"])


def test_info_shows_a_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal the bar counts the shard indexes read and is erased when the report
    follows; in a pipe there is none."""
    root = tmp_path / "many"
    zarr.create_array(root, shape=(16, 16), dtype="uint8", shards=(2, 2), chunks=(1, 1))[:] = 3
    piped = run("info", str(root))
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout.splitlines()[1].split()[6:8] == ["64", "256/256"]
    terminal, tty = pty.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    shown = b""
    try:
        command = [*SHARDFS, "info", str(root)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=tty, text=True)
        os.close(tty)
        with contextlib.suppress(OSError):  # EIO: the child's end is closed, all is read
            while chunk := os.read(terminal, 1 << 16):
                shown += chunk
        out, _ = child.communicate(timeout=120)
    finally:
        os.close(terminal)
    assert child.returncode == 0 and out == piped.stdout
    frames = shown.decode().split("\r")
    assert any("listing" in frame for frame in frames), frames  # the walk, counted
    assert any("/64 " in frame for frame in frames), frames  # then the shard indexes read
    assert frames[-1].strip() == "", frames  # erased


def test_info_refuses_what_it_does_not_describe(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    scale = {"key": "1_1_1", "size": [4, 4, 4], "resolution": [1, 1, 1], "encoding": "raw"}
    scale |= {"chunk_sizes": [[4, 4, 4]], "voxel_offset": [0, 0, 0]}
    info = {"@type": "neuroglancer_multiscale_volume", "type": "image", "data_type": "uint8"}
    (volume / "info").write_text(json.dumps(info | {"num_channels": 1, "scales": [scale]}))
    result = run("info", str(volume))
    assert result.returncode == 2 and "Zarr v3 sources only" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run("info", str(tmp_path / "volume"), "-o", "ro")
    assert result.returncode == 2 and "does not apply to shardfs info" in result.stderr


def test_info_on_s3_matches_the_local_report(tmp_path: Path, s3, capsys) -> None:
    local = tmp_path / "src"
    make_source(local)
    s3.upload_tree(local, "data")
    remote = Source("data", s3, s3.mount_options())
    assert main(["info", "--json", str(local)]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main(["info", "--json", remote.url, "-o", ",".join(remote.options)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == f"s3://{s3.bucket}/data"
    assert report["nodes"] == expected["nodes"]
    assert report["unchecked"] == []
    # Credentials that may only read cannot list multipart uploads: `info` still answers,
    # and says what it could not look at.
    s3.proxy.fail(403, code="AccessDenied", method="GET", query="uploads", count=None)
    assert main(["info", "--json", remote.url, "-o", ",".join(remote.options)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nodes"] == expected["nodes"]
    assert len(report["unchecked"]) == 1 and "AccessDenied" in report["unchecked"][0], report
