"""Shared fixtures: real FUSE mounts that never outlive their test."""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zarr

from shardfs.fuse.mounts import mount_type, runtime_dir, unmount
from tests.support.zarr2 import Zarr2, ensure_newest_zarr, ensure_zarr2

#: The S3 fixtures (`moto_server`, `s3`) live with the server and proxy they manage; `src`
#: (an empty source on each backend) with the backends.
pytest_plugins = ["tests.support.s3", "tests.support.backends", "tests.support.users"]


@dataclass
class Mounted:
    """A running `shardfs mount -f` started by a test, with its log."""

    path: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    options: tuple[str, ...] = field(default=())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Unmount now and wait for the daemon to exit (it commits what it buffers first)."""
        stop_mount(self)


#: `SHARDFS_TEST_FRONT=no`: the mounts of `start_mount` run without the native front unless
#: a test asks for it (scripts/check runs the kernel-served tests so, as well as with it).
WITHOUT_FRONT = os.environ.get("SHARDFS_TEST_FRONT") == "no"


def start_mount(source: Path | str, mountpoint: Path, log_path: Path, *options: str) -> Mounted:
    """Mount in the foreground as a child of the test and wait until it answers."""
    if WITHOUT_FRONT and not any(o.startswith("front=") for o in options):
        options = (*options, "front=no")
    mountpoint.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "shardfs", "mount", str(source), str(mountpoint), "-f"]
    if options:
        args += ["-o", ",".join(options)]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    return wait_mounted(Mounted(mountpoint, process, log_path, options))


def wait_mounted(mounted: Mounted, timeout: float = 30) -> Mounted:
    """Wait until the daemon `mounted` started answers at its mountpoint; if it dies or
    does not come up in `timeout` seconds, clean up and fail with its log."""
    deadline = time.monotonic() + timeout
    while mount_type(str(mounted.path)) != "fuse.shardfs":
        if mounted.process.poll() is not None or time.monotonic() > deadline:
            stop_mount(mounted)
            raise RuntimeError(f"mount did not come up: {mounted.log()}")
        time.sleep(0.02)
    os.stat(mounted.path)  # answered by the daemon
    # ... and the daemon's own first stat of it answered too (its "ready"): an unmount
    # while that stat is in flight would find the mount busy
    while f"mounted {mounted.path}" not in mounted.log():
        if mounted.process.poll() is not None or time.monotonic() > deadline:
            stop_mount(mounted)
            raise RuntimeError(f"mount did not report ready: {mounted.log()}")
        time.sleep(0.02)
    return mounted


def stop_mount(mounted: Mounted) -> None:
    """Unmount (lazily if busy) and reap the daemon; kill it by PID only as a last resort."""
    path = str(mounted.path)
    if mount_type(path) == "fuse.shardfs" and unmount(path).returncode != 0:
        unmount(path, lazy=True)
    try:
        mounted.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        mounted.process.kill()
        mounted.process.wait(timeout=15)
    if mount_type(path) == "fuse.shardfs":
        unmount(path, lazy=True)


def one_shard_array(
    root: Path, name: str, shape: tuple[int, int], chunks: tuple[int, int], value: int, **codecs
) -> None:
    """zarr-python 3 writes array `name` of uint8 `value`s into group `root`: one shard of
    inner `chunks` (uncompressed unless `codecs` say otherwise)."""
    group = zarr.open_group(root, mode="a")
    kwargs = {"compressors": None, **codecs}
    array = group.create_array(
        name, shape=shape, dtype="u1", chunks=chunks, shards=shape, fill_value=0, **kwargs
    )
    array[:] = value


def fuse_absent() -> str | None:
    """Why this machine cannot mount FUSE file systems, or None if it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="run the stress tier too (tests marked stress): long stress, scale and timing runs",
    )


#: Fixtures of the ordinary users' accounts, homes and /dev/fuse's mode, which a test may
#: change for as long as it runs: the tests using them are `alone` (run one at a time).
USERS_FIXTURES = {"users", "user_shardfs", "public_dir"}


@pytest.hookimpl(tryfirst=True)  # (before `-m` selects by marker)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `fuse` mount for real: skipped, with the reason, where FUSE is absent.
    Tests marked `stress` are left out unless --stress is given. Tests of the ordinary
    users are marked `alone`."""
    for item in items:
        if USERS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.alone)
    if not config.getoption("--stress"):
        stress = [item for item in items if item.get_closest_marker("stress") is not None]
        if stress:
            config.hook.pytest_deselected(items=stress)
            items[:] = [item for item in items if item.get_closest_marker("stress") is None]
    why = fuse_absent()
    if why is not None:
        skip = pytest.mark.skip(reason=f"FUSE is absent: {why}")
        for item in items:
            if item.get_closest_marker("fuse") is not None:
                item.add_marker(skip)


#: Seconds one test may take, set-up and teardown included (the first test to use a
#: session fixture pays for building its virtual environment). No test comes near it;
#: one that hangs fails with every thread's stack instead of holding CI until its limit.
TEST_TIME_LIMIT = 900


class Hung(Exception):
    """Raised in the main thread of a test that outlived TEST_TIME_LIMIT."""


def _hung(signum: int, frame: object) -> None:
    faulthandler.dump_traceback(all_threads=True)
    raise Hung(f"the test ran longer than {TEST_TIME_LIMIT} s; stacks are above")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Each test under TEST_TIME_LIMIT. Should the main thread be stuck where no signal
    reaches it, the whole run ends a minute later, still with the stacks."""
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIME_LIMIT)
    faulthandler.dump_traceback_later(TEST_TIME_LIMIT + 60, exit=True)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def mount(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    """`mount(source, *options)` mounts `source` and returns a `Mounted`; all are undone at
    teardown. Only for tests marked `fuse` (so they are skipped where FUSE is absent)."""
    assert request.node.get_closest_marker("fuse"), f"{request.node.nodeid}: mark it fuse"
    mounts: list[Mounted] = []

    def _mount(source: Path, *options: str) -> Mounted:
        n = len(mounts)
        mounted = start_mount(source, tmp_path / f"mnt{n}", tmp_path / f"mnt{n}.log", *options)
        mounts.append(mounted)
        return mounted

    yield _mount
    for mounted in reversed(mounts):
        stop_mount(mounted)


@pytest.fixture(scope="session")
def zarr2() -> Zarr2:
    """zarr-python 2.18 in its own virtual environment (see tests/support/zarr2.py)."""
    return ensure_zarr2()


@pytest.fixture(scope="session")
def newest_zarr() -> Zarr2:
    """The newest zarr-python release, on Python 3.12+ from pyenv (see tests/support/zarr2.py)."""
    return ensure_newest_zarr()


@pytest.fixture(scope="session", autouse=True)
def no_stray_locks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Remove the lock files that daemons killed by tests (SIGKILL) leave in the runtime
    directory: only those of mountpoints below this run's temporary directory, and only
    once no process holds them."""
    yield
    base = str(tmp_path_factory.getbasetemp().resolve())
    directory = Path(runtime_dir())
    for lock in directory.glob("*.lock") if directory.is_dir() else ():
        with contextlib.suppress(OSError, ValueError), open(lock, "rb") as file:
            mountpoint = json.loads(file.read() or b"{}").get("mountpoint", "")
            if not mountpoint.startswith(base + os.sep):
                continue
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a daemon holds it
            lock.unlink()
            lock.with_suffix(".sock").unlink(missing_ok=True)  # its control socket
