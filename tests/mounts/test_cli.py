"""The command line: clear one-line failures, detaching, unmounting, signals."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.mounts import mount_type, unmount
from shardfs.options import parse_options, parse_size
from shardfs.primitives.errors import UsageError
from tests.conftest import Mounted, start_mount, stop_mount

SHARDFS = [sys.executable, "-m", "shardfs"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "src"
    a = zarr.create_array(root, shape=(8, 8), dtype="uint8", shards=(4, 4), chunks=(2, 2))
    a[:] = np.arange(64, dtype="uint8").reshape(8, 8)
    return root


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFS, *args], capture_output=True, text=True, timeout=120)


def daemons_for(mountpoint: Path) -> list[int]:
    """PIDs of shardfs daemons serving `mountpoint` (started by these tests)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"shardfs" in argv and os.fsencode(mountpoint) in argv and b"mount" in argv:
            found.append(int(entry))
    return found


def wait_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("make", "options", "message"),
    [
        (lambda tmp: (tmp / "missing", tmp / "mp"), [], "does not exist"),
        (lambda tmp: (tmp, tmp / "mp"), [], "not a Zarr v3 hierarchy"),
        (lambda tmp: (None, tmp / "missing-mp"), [], "does not exist"),
        (lambda tmp: (None, tmp / "file"), [], "not a directory"),
        (lambda tmp: (None, tmp / "mp"), ["-o", "ro,bogus"], "unknown mount option 'bogus'"),
        (lambda tmp: (None, tmp / "mp"), ["-o", "index_cache=12Q"], "bad size"),
        (lambda tmp: (None, tmp / "mp"), ["-o", "ro=1"], "takes no value"),
    ],
)
def test_mount_failures_are_one_clear_line(
    tmp_path: Path, source: Path, make, options: list[str], message: str
) -> None:
    (tmp_path / "mp").mkdir()
    (tmp_path / "file").write_text("x")
    src, mp = make(tmp_path)
    result = run("mount", str(src or source), str(mp), *options)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardfs: ") and message in lines[0], (
        result.stderr
    )
    assert mount_type(str(mp)) is None


def test_mountpoint_inside_source_is_refused(tmp_path: Path, source: Path) -> None:
    inside = source / "mp"
    inside.mkdir(exist_ok=True)
    try:
        result = run("mount", str(source), str(inside))
        assert result.returncode == 1 and "inside the source" in result.stderr
    finally:
        inside.rmdir()


def test_detached_mount_answers_at_once_and_umount_stops_the_daemon(
    tmp_path: Path, source: Path
) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    result = run("mount", str(source), str(mp), "-o", f"ro,log={tmp_path / 'log'}")
    pids = daemons_for(mp)
    try:
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert mount_type(str(mp)) == "fuse.shardfs"  # mounted before the command returned
        assert len(pids) == 1
        assert sorted(os.listdir(mp / "c" / "0")) == ["0", "1", "2", "3"]
        np.testing.assert_array_equal(
            zarr.open_array(mp, mode="r")[:], np.arange(64, dtype="uint8").reshape(8, 8)
        )
        busy = run("mount", str(source), str(mp))
        assert busy.returncode == 1 and "busy" in busy.stderr
        assert run("umount", str(mp)).returncode == 0
        assert mount_type(str(mp)) is None
        assert wait_gone(pids), "daemon still running after umount"
        assert "mounted" in (tmp_path / "log").read_text()
    finally:
        if mount_type(str(mp)) is not None:
            unmount(str(mp), lazy=True)
        for pid in daemons_for(mp):
            os.kill(pid, signal.SIGKILL)


def test_detached_mount_takes_relative_paths(tmp_path: Path, source: Path) -> None:
    """The daemon runs in "/": relative SOURCE, MOUNTPOINT and log= must still work."""
    (tmp_path / "mp").mkdir()
    rel_source = os.path.relpath(source, tmp_path)
    result = subprocess.run(
        [*SHARDFS, "mount", rel_source, "mp", "-o", "ro,log=rel.log"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    mp = tmp_path / "mp"
    try:
        assert result.returncode == 0, result.stderr
        assert sorted(os.listdir(mp / "c" / "0")) == ["0", "1", "2", "3"]
        assert "mounted" in (tmp_path / "rel.log").read_text()
    finally:
        pids = daemons_for(mp)
        if mount_type(str(mp)) is not None:
            unmount(str(mp), lazy=True)
        assert wait_gone(pids), "daemon still running after unmount"


def test_umount_of_something_else_is_refused(tmp_path: Path) -> None:
    result = run("umount", str(tmp_path))
    assert result.returncode == 1 and "not mounted" in result.stderr


@pytest.mark.parametrize("how", ["sigterm", "sigint", "fusermount", "umount"])
def test_daemon_exits_cleanly(tmp_path: Path, source: Path, how: str) -> None:
    mounted = start_mount(source, tmp_path / "mp", tmp_path / "log", "ro")
    try:
        if how == "sigterm":
            mounted.process.send_signal(signal.SIGTERM)
        elif how == "sigint":
            mounted.process.send_signal(signal.SIGINT)
        elif how == "fusermount":
            assert unmount(str(mounted.path)).returncode == 0
        else:
            subprocess.run(["umount", str(mounted.path)], check=True)
        assert mounted.process.wait(timeout=15) == 0, mounted.log()
        assert mount_type(str(mounted.path)) is None
    finally:
        stop_mount(mounted)


def test_read_only_refuses_writes_and_debug_traces_requests(tmp_path: Path, source: Path) -> None:
    mounted: Mounted = start_mount(source, tmp_path / "mp", tmp_path / "log", "ro", "debug")
    try:
        with pytest.raises(OSError) as info:
            (mounted.path / "c" / "0" / "0").write_bytes(b"x")
        assert info.value.errno == errno.EROFS
        with pytest.raises(OSError) as info:
            (mounted.path / "new").mkdir()
        assert info.value.errno == errno.EROFS
        os.listdir(mounted.path / "c")
        assert "lookup" in mounted.log() and "DEBUG" in mounted.log()
        for _ in range(3):
            (mounted.path / "zarr.json").read_bytes()
        # Nothing is stored on close: the first flush tells the kernel to send no more.
        assert mounted.log().count(" flush(") == 1, mounted.log()
    finally:
        stop_mount(mounted)


def test_option_parsing() -> None:
    options = parse_options(["ro,allow_other", "index_cache=256M", "debug"])
    assert options.read_only and options.allow_other and options.debug
    assert options.index_cache == 256 << 20
    assert "allow_other" in options.fuse_options("x") and "ro" in options.fuse_options("x")
    assert (
        parse_size("4096") == 4096 and parse_size("64K") == 65536 and parse_size("1GiB") == 1 << 30
    )
    with pytest.raises(UsageError):
        parse_size("-1")


def test_commands_print_nothing_unasked(tmp_path: Path, source: Path) -> None:
    """With every warning shown, the commands of a plain install print no library's warning (numcodecs warns on import when google-crc32c,
    which it wants, is missing: it is one of shardfs's own requirements)."""
    from importlib.metadata import requires

    assert any(r.replace("_", "-").startswith("google-crc32c") for r in requires("shardfs") or [])
    env = dict(os.environ, PYTHONWARNINGS="default")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    for args in (
        ["--help"],
        ["info", str(source)],
        ["checksum", str(source)],
        ["mount", str(source), str(mountpoint), "-o", "ro"],
        ["umount", str(mountpoint)],
    ):
        result = subprocess.run(
            [*SHARDFS, *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 0, (args, result.stderr)
        assert "Warning" not in result.stderr, (args, result.stderr)


#: A value of each placeholder the option table uses, for `parse_options`.
PLACEHOLDERS = {
    "SIZE": "1M",
    "SECONDS": "2",
    "N": "3",
    "DIR": "/tmp/x",
    "URL": "http://localhost:9000",
    "NAME": "x",
    "FILE": "/tmp/x.log",
    "MODE": "0440",
}


def test_mount_help_and_the_readme_show_every_option_of_the_one_table() -> None:
    """`shardfs mount --help` and the README's table are made from `shardfs.options.TABLE`,
    and `parse_options` takes exactly the options named there (and the generic ones)."""
    import re

    from shardfs import options

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert options.markdown_table() in readme, (
        "the README's table of mount options is not shardfs.options.markdown_table(): "
        "paste its output into the README"
    )
    shown = run("mount", "--help").stdout
    named = {name for forms, _ in options.TABLE for name in options._names(forms)}
    for name in (*named, *options.KERNEL_FLAGS, *options.IGNORED):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", shown), name
    # the ones the old, hand-written help left out, among them
    for name in ("cache_dir", "kernel_cache", "endpoint_url", "anon", "metadata_ttl", "nonempty"):
        assert name in named
    assert named - options.IGNORED == options.OWN
    for forms, _ in options.TABLE:
        for form in re.findall(r"`([a-z_]+(?:=[^`]*)?)`", forms):
            name, _, value = form.partition("=")
            value = PLACEHOLDERS.get(value, value)
            if name == "cache_size":  # needs a disk cache to size
                parse_options([f"cache_dir=/tmp/x,{name}={value}"])
            else:
                parse_options([f"{name}={value}" if value else name])
    with pytest.raises(UsageError, match="unknown mount option"):
        parse_options(["no_such_option=1"])
