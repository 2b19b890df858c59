"""The system's mount table, unmounting through fusermount3, and the daemon's lock.

A daemon holds an exclusive `flock` on a file named after its mountpoint for
as long as it runs, including the commit after the unmount. The kernel drops
the lock when the process ends however it ends, so `shardfs umount` can wait
for the daemon by taking the lock, and a lock nobody holds never means a live
daemon. The daemon writes how its final commit went into the file before it
exits, for the waiter to report.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import subprocess
import time
from typing import Any


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_type(path: str) -> str | None:
    """The file system type mounted exactly at `path` (e.g. "fuse.shardfs"), or None."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return None
    found = None
    for line in lines:
        fields = line.split()
        if _unescape(fields[4]) == real:
            dash = fields.index("-")
            found = fields[dash + 1]  # the last mount on top wins
    return found


def is_stale(path: str) -> bool:
    """Whether `path` is a FUSE mount whose daemon is gone ("transport endpoint is not
    connected"): the kernel keeps such a mount until it is unmounted. Asks with statfs,
    which the kernel never answers from its caches (a stat may be)."""
    try:
        os.statvfs(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def unmount(path: str, lazy: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `fusermount3 -u` (with `-z` if `lazy`); the caller checks the result."""
    args = ["fusermount3", "-u", *(["-z"] if lazy else []), path]
    return subprocess.run(args, capture_output=True, text=True, check=False)


# -- the daemon's lock ---------------------------------------------------------------------


def runtime_dir() -> str:
    """Where daemons keep their lock files: /run/shardfs for root, else the user's runtime
    directory (or a private directory in /tmp)."""
    if os.geteuid() == 0:
        return "/run/shardfs"
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "shardfs") if base else f"/tmp/shardfs-{os.geteuid()}"


def lock_path(mountpoint: str) -> str:
    """The lock file of the daemon serving `mountpoint` (named by its real path)."""
    real = os.path.realpath(mountpoint)
    name = hashlib.sha256(os.fsencode(real)).hexdigest()[:24]
    return os.path.join(runtime_dir(), f"{name}.lock")


#: How long a new daemon waits for the previous one of its mountpoint to finish its commit.
PREVIOUS_TIMEOUT = 30.0


class DaemonLock:
    """Held by a daemon from before it mounts until it exits (see the module docstring).

    If the previous daemon of the mountpoint still holds it (unmounted, but still
    committing), the new one waits for it, so it mounts what that daemon committed."""

    def __init__(self, mountpoint: str, timeout: float = PREVIOUS_TIMEOUT) -> None:
        self.path = lock_path(mountpoint)
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as e:
                raise RuntimeError(
                    f"cannot create the lock file {self.path}: {e.strerror}"
                ) from None
            if not _lock(self._fd, fcntl.LOCK_EX, deadline):
                os.close(self._fd)
                raise RuntimeError(f"the previous daemon of {mountpoint} has not exited")
            try:
                same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(self._fd)  # the previous daemon removed the file as it exited: again
        self._write({"pid": os.getpid(), "mountpoint": os.path.realpath(mountpoint)})

    def _write(self, record: dict[str, Any]) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(record).encode() + b"\n", 0)

    def release(self, outcome: str) -> None:
        """Record `outcome` ("" when all went well) for a waiter and remove the file. The
        lock itself is left to the kernel, which drops it when the process has ended, so
        a waiter returns only once the daemon has exited."""
        self._write({"pid": os.getpid(), "outcome": outcome})
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def open_lock(mountpoint: str) -> int | None:
    """A descriptor of the lock file of the daemon serving `mountpoint`, or None if no
    daemon has one (an older daemon, or none). Open it before unmounting: the daemon
    removes the file as it exits."""
    try:
        return os.open(lock_path(mountpoint), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def _lock(fd: int, mode: int, deadline: float | None, poll: float = 0.05) -> bool:
    """Take `flock` `mode` on `fd`, waiting until `deadline` (monotonic; None: forever)."""
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(poll)


def wait_for_daemon(fd: int, timeout: float | None = None) -> str | None:
    """Wait until the daemon behind lock file `fd` has exited; its outcome ("" for a clean
    exit, or what went wrong), or None on timeout. Closes `fd` unless it times out."""
    if not _lock(fd, fcntl.LOCK_SH, None if timeout is None else time.monotonic() + timeout):
        return None
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except ValueError:
        record = {}
    finally:
        os.close(fd)
    # A daemon killed before it released the lock recorded no outcome.
    return str(record.get("outcome", "the daemon ended without reporting (killed?)"))
