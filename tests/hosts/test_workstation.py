"""A workstation user's path: mounting without root (also from an fstab `user` line), and the
one line that names the real cause and its fix where that path fails (issue 32).

The tests that play an ordinary user run this checkout's shardfs as the user `users` makes,
in the environment `user_shardfs` builds; they are skipped, with the reason, where that
cannot be done. /dev/fuse is mode 0600 on some machines (Debian makes it 0666): tests in
which the user must mount make it 0666 for as long as they run (`dev_fuse_mode`), and give
it its mode back after.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.mounts import mount_type, unmount
from shardfs.options import MountOptions
from tests.support.users import User, UserShardfs, dev_fuse_mode

SHARDFS = [sys.executable, "-m", "shardfs"]

pytestmark = pytest.mark.fuse

VALUES = np.arange(32 * 32, dtype="uint16").reshape(32, 32)


def make_source(path: Path) -> None:
    """A group with one sharded array `image` (16x16 shards of 8x8 chunks)."""
    group = zarr.open_group(path, mode="w")
    group.create_array("image", shape=(32, 32), dtype="u2", shards=(16, 16), chunks=(8, 8))[:] = (
        VALUES
    )


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFS, *args], capture_output=True, text=True, timeout=120)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed (asserted to be one line)."""
    assert result.returncode != 0, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardfs: "), result.stderr
    return lines[0]


# -- failures as root ----------------------------------------------------------------------


@pytest.fixture
def source(tmp_path: Path) -> Path:
    make_source(tmp_path / "src")
    return tmp_path / "src"


def test_a_non_empty_mountpoint_is_refused_unless_nonempty(tmp_path: Path, source: Path) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    (mp / "notes.txt").write_text("mine")
    try:
        line = one_line(run("mount", str(source), str(mp), "-o", "ro"))
        assert f"mountpoint {mp} is not empty" in line and "-o nonempty" in line, line
        assert mount_type(str(mp)) is None
        # -o nonempty mounts over it (shardfs's own option: libfuse 3 knows no `nonempty`)
        result = run("mount", str(source), str(mp), "-o", "ro,nonempty")
        assert result.returncode == 0, result.stderr
        assert sorted(os.listdir(mp)) == ["image", "zarr.json"]
    finally:
        if mount_type(str(mp)) is not None:
            assert run("umount", str(mp)).returncode == 0
    assert (mp / "notes.txt").read_text() == "mine"


def test_a_daemon_that_dies_before_it_serves_says_why(tmp_path: Path, source: Path) -> None:
    """An error nobody foresaw (here the lock of the kept chunks is a directory) still reaches
    the log= file, with its traceback, and the one line `shardfs mount` prints."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    pending = MountOptions(spool=str(spool)).leftover_dir(os.path.realpath(source))
    os.makedirs(pending + ".lock")
    mp, log = tmp_path / "mp", tmp_path / "daemon.log"
    mp.mkdir()
    try:
        line = one_line(run("mount", str(source), str(mp), "-o", f"rw,spool={spool},log={log}"))
    finally:
        if mount_type(str(mp)) is not None:
            run("umount", str(mp))
    assert f"cannot mount {mp}:" in line and "Is a directory" in line, line
    assert "exited (1)" not in line
    text = log.read_text()
    assert "ERROR" in text and "Is a directory" in text and "Traceback" in text, text
    assert mount_type(str(mp)) is None


def test_allow_other_without_user_allow_other_is_refused_before_mounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For users other than root, the check reads fuse.conf (here a copy)."""
    from shardfs import cli

    conf = tmp_path / "fuse.conf"
    conf.write_text("# user_allow_other\nmount_max = 1000\n")
    monkeypatch.setattr(cli, "FUSE_CONF", str(conf))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    options = MountOptions(allow_other=True)
    with pytest.raises(cli.UsageError) as info:
        cli.check_allow_other(options)
    message = str(info.value)
    assert "user_allow_other" in message and str(conf) in message, message
    conf.write_text("mount_max = 1000\n  user_allow_other  \n")
    cli.check_allow_other(options)  # no error
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    conf.write_text("")
    cli.check_allow_other(options)  # root needs no user_allow_other


# -- an ordinary user --------------------------------------------------------------------


@pytest.fixture
def workplace(users: tuple[User, User]) -> Iterator[Path]:
    """A directory the victim user owns, with a source (`src`) and a mountpoint (`mp`)
    in it; unmounted and removed afterwards (outside root's private /tmp/pytest-of-root)."""
    victim = users[0]
    base = Path(tempfile.mkdtemp(prefix="shardfs-ws-", dir="/var/tmp"))
    try:
        os.chmod(base, 0o755)
        make_source(base / "src")
        (base / "mp").mkdir()
        for directory, names, files in os.walk(base):
            for name in [directory, *(os.path.join(directory, n) for n in names + files)]:
                os.chown(name, victim.uid, victim.gid)
        yield base
    finally:
        if mount_type(str(base / "mp")) is not None:
            unmount(str(base / "mp"), lazy=True)
        shutil.rmtree(base, ignore_errors=True)


#: Read the array through the mount as the user, with zarr-python, and print its sum.
READ = "import sys, zarr; print(int(zarr.open_array(sys.argv[1], mode='r')[:].sum()))"
#: Write one chunk's worth of sevens through the mount as the user.
WRITE = "import sys, zarr; a = zarr.open_array(sys.argv[1], mode='r+'); a[:8, :8] = 7"


def _state_of(user: User) -> str:
    """Where shardfs keeps a user's state, below the home of the passwd database."""
    return os.path.join(user.home, ".local", "state", "shardfs")


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_an_ordinary_user_mounts_reads_and_writes(
    users: tuple[User, User], user_shardfs: UserShardfs, workplace: Path, mode: str
) -> None:
    victim = users[0]
    src, mp = workplace / "src", workplace / "mp"
    with dev_fuse_mode(0o666):
        mounted = victim.run_command([user_shardfs.command, "mount", str(src), str(mp), "-o", mode])
        assert mounted.returncode == 0, mounted.stderr
        try:
            assert mount_type(str(mp)) == "fuse.shardfs"
            listed = victim.run_command(["ls", str(mp / "image" / "c" / "0")])
            assert listed.stdout.split() == ["0", "1", "2", "3"], listed
            read = victim.run_command([user_shardfs.python, "-c", READ, str(mp / "image")])
            assert read.stdout.strip() == str(int(VALUES.sum())), read.stderr
            if mode == "rw":
                wrote = victim.run_command([user_shardfs.python, "-c", WRITE, str(mp / "image")])
                assert wrote.returncode == 0, wrote.stderr
        finally:
            stopped = victim.run_command([user_shardfs.command, "umount", str(mp)])
        assert stopped.returncode == 0, stopped.stderr
    assert_written(src, mode)


def assert_written(src: Path, mode: str) -> None:
    """The source holds VALUES, with the first chunk written as 7 by a read-write mount."""
    expected = VALUES.copy()
    if mode == "rw":
        expected[:8, :8] = 7
    np.testing.assert_array_equal(zarr.open_array(src / "image", mode="r")[:], expected)


def test_dev_fuse_without_permission_says_so_and_what_to_change(
    users: tuple[User, User], user_shardfs: UserShardfs, workplace: Path
) -> None:
    victim = users[0]
    with dev_fuse_mode(0o600):
        result = victim.run_command(
            [user_shardfs.command, "mount", str(workplace / "src"), str(workplace / "mp")]
        )
    line = one_line(result)
    assert "/dev/fuse" in line and "permission" in line.lower(), line
    assert "chmod 0666 /dev/fuse" in line, line
    assert "module" not in line, line  # the device is there: not the old guess
    assert mount_type(str(workplace / "mp")) is None


def test_allow_other_as_a_user_without_user_allow_other_says_what_is_missing(
    users: tuple[User, User], user_shardfs: UserShardfs, workplace: Path
) -> None:
    conf = Path("/etc/fuse.conf")
    if conf.exists() and any(
        line.strip() == "user_allow_other" for line in conf.read_text().splitlines()
    ):
        pytest.skip("/etc/fuse.conf has user_allow_other on this machine")
    victim = users[0]
    with dev_fuse_mode(0o666):
        result = victim.run_command(
            [
                user_shardfs.command,
                "mount",
                str(workplace / "src"),
                str(workplace / "mp"),
                "-o",
                "ro,allow_other",
            ]
        )
    line = one_line(result)
    assert "allow_other" in line and "user_allow_other" in line and "/etc/fuse.conf" in line
    assert "fuse_session_mount" not in line, line
    assert mount_type(str(workplace / "mp")) is None


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_an_fstab_user_line_mounts_for_an_ordinary_user(
    users: tuple[User, User], user_shardfs: UserShardfs, workplace: Path, mode: str
) -> None:
    """A `user,noauto` line, mounted by the user with `mount MOUNTPOINT` (from an fstab of the
    test's own, `mount -T`, so /etc/fstab is never touched). mount.fuse3 gives the daemon
    HOME=/root: state must still be the user's own, and a read-only mount needs none of the
    kept-chunks state at all."""
    victim = users[0]
    src, mp = workplace / "src", workplace / "mp"
    fstab = workplace / "fstab"
    # mount.fuse3 runs `shardfs` as found on the PATH, which mount(8) keeps for a user's mount
    fstab.write_text(f"{src}  {mp}  fuse.shardfs  user,noauto,{mode}  0 0\n")
    path = f"{os.path.dirname(user_shardfs.command)}:/usr/bin:/bin"
    os.chmod(fstab, 0o644)
    shutil.rmtree(_state_of(victim), ignore_errors=True)
    with dev_fuse_mode(0o666):
        # without HOME (as at boot, or from a service), mount.fuse3 gives the daemon HOME=/root
        mounted = victim.run_command(
            ["mount", "-T", str(fstab), str(mp)], env={"HOME": None, "PATH": path}
        )
        try:
            assert mounted.returncode == 0, mounted.stdout + mounted.stderr
            assert mount_type(str(mp)) == "fuse.shardfs"
            read = victim.run_command([user_shardfs.python, "-c", READ, str(mp / "image")])
            assert read.stdout.strip() == str(int(VALUES.sum())), read.stderr
            if mode == "rw":
                wrote = victim.run_command([user_shardfs.python, "-c", WRITE, str(mp / "image")])
                assert wrote.returncode == 0, wrote.stderr
            # a read-only mount makes no kept-chunks directory; a read-write one claims the
            # source's in its user's own (a lock file beside it, for the daemon's life)
            name = os.path.basename(MountOptions().leftover_dir(str(src)))
            claim = os.path.join(_state_of(victim), "pending", name + ".lock")
            if mode == "ro":
                assert not os.path.exists(os.path.join(_state_of(victim), "pending"))
            else:
                assert os.stat(claim).st_uid == victim.uid
        finally:
            stopped = victim.run_command([user_shardfs.command, "umount", str(mp)])
        assert stopped.returncode == 0, stopped.stderr
    assert_written(src, mode)


# -- scripts/setup without root --------------------------------------------------------------


@pytest.fixture
def setup_copy(users: tuple[User, User]) -> Iterator[Path]:
    """scripts/setup in a directory of its own, which the victim user may read, and a fake
    dpkg-query beside it that says some packages are missing (`MISSING` in its
    environment), so that the script stops or goes on as it would on such a machine."""
    base = Path(tempfile.mkdtemp(prefix="shardfs-setup-", dir="/var/tmp"))
    try:
        os.chmod(base, 0o755)
        (base / "scripts").mkdir(mode=0o755)
        shutil.copy(Path(__file__).parents[2] / "scripts" / "setup", base / "scripts")
        (base / "bin").mkdir(mode=0o755)
        fake = base / "bin" / "dpkg-query"
        fake.write_text(
            '#!/bin/sh\nfor a; do p=$a; done; for m in $MISSING; do [ "$m" = "$p" ] && exit 1; done\n'
            'printf "install ok installed"\n'
        )
        os.chmod(fake, 0o755)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _setup_as(user: User, base: Path, missing: str, *args: str) -> str:
    result = user.run_command(
        ["bash", str(base / "scripts" / "setup"), *args],
        env={"PATH": f"{base / 'bin'}:/usr/bin:/bin", "MISSING": missing},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr


def test_setup_without_root_names_the_missing_packages(
    users: tuple[User, User], setup_copy: Path
) -> None:
    victim = users[0]
    err = _setup_as(victim, setup_copy, "libfuse3-dev fio stress-ng")
    assert "Could not open lock file" not in err and "apt-get update" not in err
    assert "missing Debian packages: libfuse3-dev fio stress-ng" in err, err
    assert "sudo apt-get install libfuse3-dev fio stress-ng" in err, err
    assert "only the tests need fio stress-ng" in err, err
    # a user install asks only for what mounting needs
    err = _setup_as(victim, setup_copy, "libfuse3-dev fio stress-ng systemd", "--user")
    assert "sudo apt-get install libfuse3-dev\n" in err and "fio" not in err, err


def test_leftover_dir_is_below_the_users_home_whatever_home_says(
    monkeypatch: pytest.MonkeyPatch, users: tuple[User, User]
) -> None:
    victim = users[0]
    monkeypatch.setattr(os, "geteuid", lambda: victim.uid)
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    directory = MountOptions().leftover_dir("/data/x.zarr")
    name = hashlib.sha256(b"/data/x.zarr").hexdigest()[:24]
    assert directory == os.path.join(_state_of(victim), "pending", name)
