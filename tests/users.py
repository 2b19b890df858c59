"""Other users of the host, for tests that play an attacker (or a second victim).

The tests run as root (CI does); they create ordinary users once per machine and run
code as them with `runuser`. The project's own Python lives under /root (mode 0700), so
code run as another user uses the system's `/usr/bin/python3` and a world-readable copy
of the package: only its stdlib-only modules (`shardfs.primitives`, `shardfs.fuse.mounts`)
can be imported there. Without root, `useradd` or that Python, the tests are skipped with
the reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import shardfs

#: Names of the users the tests make: one who is attacked, one who attacks.
VICTIM, ATTACKER = "shardfs-victim", "shardfs-attacker"
PYTHON = "/usr/bin/python3"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str
    #: a world-readable copy of the package, for `run`
    package_root: str

    def run(
        self, code: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run Python `code` as this user, with `shardfs` importable (its stdlib-only
        modules) and a bare environment (`env` added); the caller checks the result."""
        environ = {"PATH": "/usr/bin:/bin", "HOME": self.home, "PYTHONPATH": self.package_root}
        environ.update(env or {})
        return subprocess.run(
            [RUNUSER, "-u", self.name, "--", PYTHON, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environ,
            cwd="/",
            check=False,
        )


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "tests that play a second user must run as root (to create and become it)"
    if shutil.which("useradd") is None or not os.access(RUNUSER, os.X_OK):
        return "useradd or runuser is missing"
    if not os.access(PYTHON, os.X_OK):
        return f"{PYTHON} is missing (code run as another user needs the system's Python)"
    return None


def _user(name: str, package_root: str) -> User:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
        entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, entry.pw_dir, package_root)


@pytest.fixture(scope="session")
def users() -> Iterator[tuple[User, User]]:
    """(victim, attacker): two ordinary users, made on first use."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    root = tempfile.mkdtemp(prefix="shardfs-package-")
    try:
        os.chmod(root, 0o755)
        shutil.copytree(
            Path(shardfs.__file__).parent,
            Path(root, "shardfs"),
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for directory, _, files in os.walk(root):
            os.chmod(directory, 0o755)
            for name in files:
                os.chmod(os.path.join(directory, name), 0o644)
        yield _user(VICTIM, root), _user(ATTACKER, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user may add to, as /tmp (mode 1777), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="shardfs-public-"))
    try:
        os.chmod(path, 0o1777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
