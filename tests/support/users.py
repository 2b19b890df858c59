"""Other users of the host, for tests that play an attacker (or a second victim), or a
workstation user who mounts without root.

The tests run as root (CI does); they create ordinary users once per machine and run
code as them with `runuser`. The project's own Python lives under /root (mode 0700), so
code run as another user uses the system's `/usr/bin/python3` and a world-readable copy
of the package: only its stdlib-only modules (`shardfs.primitives`, `shardfs.fuse.mounts`)
can be imported there. Without root, `useradd` or that Python, the tests are skipped with
the reason.

To run the whole of shardfs as such a user (`user_shardfs`), the tests build a virtual
environment of that Python with the patched pyfuse3 as `scripts/setup --user` does, once per
machine, in /var/tmp/shardfs-test-user-venv (built again only when the patch changes), and
run this checkout's package in it through a small wrapper command.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import re
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
#: The cached environment in which other users run shardfs (see `user_shardfs`).
USER_VENV = Path("/var/tmp/shardfs-test-user-venv")
REPO = Path(__file__).resolve().parents[2]


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
        return self._run([PYTHON, "-c", code], environ, timeout)

    def run_command(
        self, argv: list[str], env: dict[str, str | None] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` as this user, with a bare environment (`env` added; a variable set to
        None is left out) in "/"; the caller checks the result."""
        given: dict[str, str | None] = {"PATH": "/usr/bin:/bin", "HOME": self.home, **(env or {})}
        environ = {name: value for name, value in given.items() if value is not None}
        # runuser itself would set HOME and the like: `env -i` hands on exactly `environ`
        command = ["env", "-i", *(f"{name}={value}" for name, value in environ.items()), *argv]
        return self._run(command, environ, timeout)

    def _run(
        self, argv: list[str], environ: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RUNUSER, "-u", self.name, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environ,
            cwd="/",
            check=False,
        )


def why_no_users() -> str | None:
    """Why tests cannot play ordinary users here, or None."""
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
        # (another pytest worker may be making it too: useradd then fails, and it exists)
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name])
        entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, entry.pw_dir, package_root)


@pytest.fixture(scope="session")
def users() -> Iterator[tuple[User, User]]:
    """(victim, attacker): two ordinary users, made on first use."""
    reason = why_no_users()
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


@dataclass(frozen=True)
class UserShardfs:
    """shardfs (this checkout's) as other users run it: `command` is an executable that any
    user may run, `python` the environment's interpreter (with zarr-python 3)."""

    command: str
    python: str


def _pyfuse3_version() -> str:
    """The version `scripts/setup` gives the patched pyfuse3 it builds: from the patches it
    applies, in its order."""
    listed = re.search(r"pyfuse3_patches=\(([^)]*)\)", (REPO / "scripts" / "setup").read_text())
    assert listed is not None, "scripts/setup names no pyfuse3_patches"
    names = re.findall(r"patches/(pyfuse3-[\w.-]+\.patch)", listed.group(1))
    patches = b"".join((REPO / "patches" / name).read_bytes() for name in names)
    return "3.5.0+shardfs.g" + hashlib.sha256(patches).hexdigest()[:12]


def _venv_is_current(python: Path) -> bool:
    code = "import pyfuse3, numpy, trio, numcodecs, crc32c, zarr; print(pyfuse3.__version__)"
    try:
        found = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError:
        return False
    if found.returncode != 0 or found.stdout.strip() != _pyfuse3_version():
        return False
    # what it installed follows the project's requirements: built again when they change
    built_from = USER_VENV / "pyproject.toml"
    return (
        built_from.is_file() and built_from.read_bytes() == (REPO / "pyproject.toml").read_bytes()
    )


def build_user_venv() -> str | None:
    """USER_VENV, built unless it is current (another pytest worker, or the build ahead
    that scripts/check starts, may be building it: they take turns); None, or why it
    could not be built."""
    USER_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{USER_VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_user_venv()


def _build_user_venv() -> str | None:
    """Build USER_VENV with `scripts/setup --user` run on a copy of this checkout, with the
    system's Python (it must not live under /root, which other users cannot enter); None,
    or why it could not be built."""
    python = USER_VENV / ".venv" / "bin" / "python"
    if _venv_is_current(python):
        return None
    shutil.rmtree(USER_VENV, ignore_errors=True)
    USER_VENV.mkdir(mode=0o755)
    os.chmod(USER_VENV, 0o755)
    for name in ("scripts", "patches", "shardfs"):
        shutil.copytree(REPO / name, USER_VENV / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, USER_VENV / name)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8"}
    try:
        built = subprocess.run(
            ["bash", "scripts/setup", "--user"],
            cwd=USER_VENV,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "scripts/setup --user with the system's Python took over 15 minutes"
    if built.returncode != 0 or not _venv_is_current(python):
        tail = " | ".join((built.stdout + built.stderr).strip().splitlines()[-3:])
        return f"scripts/setup --user with {PYTHON} failed ({built.returncode}): {tail}"
    for directory, _, files in os.walk(USER_VENV):
        os.chmod(directory, os.stat(directory).st_mode | 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)
    return None


@pytest.fixture(scope="session")
def user_shardfs(users: tuple[User, User]) -> UserShardfs:
    """shardfs as the test users run it (see the module docstring); skipped, with the
    reason, where its environment cannot be built."""
    reason = build_user_venv()
    if reason:
        pytest.skip(reason)
    python = str(USER_VENV / ".venv" / "bin" / "python")
    # This checkout's code, not the copy the environment was built from (an older one).
    command = Path(users[0].package_root, "bin", "shardfs")
    command.parent.mkdir(mode=0o755, exist_ok=True)
    command.write_text(
        f'#!/bin/sh\nPYTHONPATH={users[0].package_root} exec {python} -m shardfs "$@"\n'
    )
    os.chmod(command.parent, 0o755)
    os.chmod(command, 0o755)
    return UserShardfs(str(command), python)


@contextlib.contextmanager
def dev_fuse_mode(mode: int) -> Iterator[None]:
    """Give /dev/fuse `mode` for the block, and its mode before back after it. Debian makes it
    0666, so that every user may mount; some machines (this project's among them) have 0600."""
    before = os.stat("/dev/fuse").st_mode & 0o7777
    os.chmod("/dev/fuse", mode)
    try:
        yield
    finally:
        os.chmod("/dev/fuse", before)
