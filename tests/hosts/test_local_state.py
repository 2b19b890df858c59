"""The daemon's local state on a shared host: the runtime directory (lock files, the stats
socket), the write spool and the chunks kept for the next mount are the daemon user's alone.

What shardfs makes is 0700 (directories) and 0600 (files) whatever the umask; a directory
another user could change is refused with one line naming it and why, except the runtime
directory in /tmp, which is replaced by one in the user's home (with a warning): someone who
made /tmp/shardfs-UID first may be planting symlinks there (repro t8 of issue 31).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shardfs.fuse import control
from shardfs.fuse.mounts import DaemonLock, lock_path, mount_type, open_lock, unmount
from shardfs.primitives.private import UnsafeState
from shardfs.writeback.buffer import PREFIX, SUFFIX, WriteBuffer
from shardfs.writeback.leftover import Leftovers
from tests.conftest import one_shard_array, start_mount, stop_mount
from tests.mounts.test_kept_chunks import keep_chunks, make_source
from tests.support.users import User

SHARDFS = [sys.executable, "-m", "shardfs"]
CHUNK = 512 * 1024


def _mode(path: Path | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- the spool --------------------------------------------------------------------------


def _unsafe_spools(tmp_path: Path, attacker_uid: int) -> dict[str, tuple[Path, str]]:
    """Spool directories another user could change, with the reason each is refused."""
    made = {}
    tmp_path.mkdir(exist_ok=True)
    for name, mode in (("group", 0o775), ("others", 0o757), ("open", 0o777)):
        (tmp_path / name).mkdir()
        os.chmod(tmp_path / name, mode)
        made[name] = (tmp_path / name, f"is writable by group or others (mode {mode:04o})")
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    made["symlink"] = (tmp_path / "link", "is a symbolic link")
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", attacker_uid, attacker_uid)
    made["theirs"] = (tmp_path / "theirs", f"is owned by uid {attacker_uid}")
    (tmp_path / "open" / "below").mkdir()  # in a directory others may rename it from
    made["below"] = (tmp_path / "open" / "below", f"the directory {tmp_path / 'open'} above it")
    return made


@pytest.mark.fuse
def test_an_unsafe_spool_refuses_the_mount_with_one_line(
    tmp_path: Path, users: tuple[User, User]
) -> None:
    source = tmp_path / "src"
    one_shard_array(source, "a", (8, 8), (4, 4), 7)
    (tmp_path / "mp").mkdir()
    for name, (spool, reason) in _unsafe_spools(tmp_path / "spools", users[1].uid).items():
        result = subprocess.run(
            [*SHARDFS, "mount", str(source), str(tmp_path / "mp"), "-o", f"rw,spool={spool}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        try:
            assert result.returncode == 1, name
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert lines[0].startswith(f"shardfs: cannot mount {tmp_path / 'mp'}: ")
            assert f"spool directory {spool}: " in lines[0] and reason in lines[0], lines[0]
            assert mount_type(str(tmp_path / "mp")) is None
            assert not [p for p in os.listdir(spool) if p.startswith(PREFIX)]
        finally:
            if mount_type(str(tmp_path / "mp")) is not None:
                unmount(str(tmp_path / "mp"), lazy=True)


def test_an_unsafe_spool_is_refused(tmp_path: Path, users: tuple[User, User]) -> None:
    for name, (spool, reason) in _unsafe_spools(tmp_path, users[1].uid).items():
        with pytest.raises(UnsafeState) as raised:
            WriteBuffer(150, str(spool))
        assert str(raised.value).startswith(f"spool directory {spool}: "), name
        assert reason in str(raised.value) and "\n" not in str(raised.value), name


def test_a_sticky_spool_others_share_works(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    buffer = WriteBuffer(150, str(shared))
    try:
        blobs = [buffer.new(bytes([i]) * 100) for i in range(3)]
        assert buffer.spilled == 200
        assert os.path.dirname(buffer.spool_dir) == str(shared)
        assert _mode(buffer.spool_dir) == 0o700
        for blob in blobs[:2]:
            assert _mode(blob._spool) == 0o600
        assert [blob.getvalue() for blob in blobs] == [bytes([i]) * 100 for i in range(3)]
    finally:
        buffer.close()
    assert _mode(shared) == 0o1777  # a spool directory that exists is left as it is


def test_a_missing_spool_is_made_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        buffer = WriteBuffer(150, str(tmp_path / "new" / "spool"))
    finally:
        os.umask(old)
    buffer.close()
    assert _mode(tmp_path / "new") == _mode(tmp_path / "new" / "spool") == 0o700


def test_the_sweep_never_follows_a_symlink_nor_removes_another_users_directory(
    users: tuple[User, User], public_dir: Path
) -> None:
    """In a sticky spool that users share, a buffer sweeps only dead directories of its own
    user: not another user's (made to look dead), not a symlink named like one (to a dead
    directory elsewhere), not one that others may write in."""
    _, attacker = users
    theirs = public_dir / f"{PREFIX}attacker{SUFFIX}"
    made = attacker.run(
        f"import os; os.mkdir({str(theirs)!r}, 0o700); open({str(theirs / '0.blob')!r}, 'w')"
    )
    assert made.returncode == 0, made.stderr
    elsewhere = public_dir / "elsewhere"
    dead = WriteBuffer(150, str(elsewhere))  # a dead buffer's directory, outside the spool
    os.close(dead._dir_fd)
    (public_dir / f"{PREFIX}link{SUFFIX}").symlink_to(dead.spool_dir)
    open_one = public_dir / f"{PREFIX}open{SUFFIX}"
    open_one.mkdir()
    os.chmod(open_one, 0o777)

    buffer = WriteBuffer(150, str(public_dir))
    buffer.close()
    assert (theirs / "0.blob").exists()
    assert os.path.isdir(dead.spool_dir) and (public_dir / f"{PREFIX}link{SUFFIX}").is_symlink()
    assert open_one.is_dir()


# -- the chunks kept for the next mount -------------------------------------------------------


@pytest.mark.parametrize("where", ["pending", "pending/ID"])
def test_an_unsafe_directory_of_kept_chunks_is_refused(tmp_path: Path, where: str) -> None:
    (tmp_path / where).mkdir(parents=True)
    os.chmod(tmp_path / where, 0o777)
    leftovers = Leftovers(str(tmp_path / "pending" / "ID"), "a source")
    with pytest.raises(UnsafeState) as raised:
        leftovers.claim()
    assert str(raised.value) == (
        f"directory of kept chunks {tmp_path / where}: is writable by group or others "
        "(mode 0777); refused (another user could change it)"
    )


def test_the_directory_of_kept_chunks_is_made_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    old = os.umask(0)
    try:
        leftovers = Leftovers(str(tmp_path / "state" / "pending" / "ID"), "a source")
        assert leftovers.claim()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "state") == _mode(tmp_path / "state" / "pending") == 0o700
    assert _mode(tmp_path / "state" / "pending" / "ID.lock") == 0o600


# -- the runtime directory, played by other users -----------------------------------------

#: Code run as a user: loads shardfs/fuse/mounts.py by its path (`import shardfs.fuse`
#: would import pyfuse3, which the system's Python lacks) with /tmp played by SHARED.
MOUNTS = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location(
    "mounts", os.path.join(os.environ["PYTHONPATH"], "shardfs", "fuse", "mounts.py"))
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.SHARED_TMP = {shared!r}
"""


def _as(user: User, code: str, **env: str) -> tuple[Any, str]:
    """What `code`, run as `user`, printed as JSON; and its stderr."""
    result = user.run(code, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def _lock_name(mountpoint: str) -> str:
    return hashlib.sha256(os.fsencode(os.path.realpath(mountpoint))).hexdigest()[:24] + ".lock"


def test_a_runtime_dir_another_user_made_first_is_not_used(
    users: tuple[User, User], public_dir: Path
) -> None:
    """t8: the attacker makes the victim's /tmp/shardfs-UID first (0777) and plants a
    symlink at the lock's name; the victim's daemon takes its lock in its home instead,
    never touches the symlink's target, says why, and `shardfs umount` finds the lock."""
    victim, attacker = users
    precious, mountpoint = public_dir / "precious", public_dir / "mnt"
    squat = public_dir / f"shardfs-{victim.uid}"
    _as(
        victim,
        f"import json, os; os.mkdir({str(mountpoint)!r}); "
        f"open({str(precious)!r}, 'w').write('victim data'); print(json.dumps(1))",
    )
    _as(
        attacker,
        f"import json, os; os.mkdir({str(squat)!r}); os.chmod({str(squat)!r}, 0o777); "
        f"os.symlink({str(precious)!r}, {str(squat / _lock_name(str(mountpoint)))!r}); "
        "print(json.dumps(1))",
    )
    fallback = os.path.join(victim.home, ".local", "state", "shardfs", "run")
    made = []  # what the victim's daemon makes in its home, for the cleanup
    path = fallback
    while path != victim.home and not os.path.exists(path):
        made.append(path)
        path = os.path.dirname(path)
    try:
        found, stderr = _as(
            victim,
            MOUNTS.format(shared=str(public_dir))
            + f"""
lock = m.DaemonLock({str(mountpoint)!r})
fd = m.open_lock({str(mountpoint)!r})  # as `shardfs umount` does
held = json.loads(os.pread(fd, 4096, 0))
os.close(fd)
info = os.stat(os.path.dirname(lock.path))
out = {{"lock": lock.path, "held": held, "dir_mode": info.st_mode & 0o7777,
        "file_mode": os.stat(lock.path).st_mode & 0o7777, "precious": open({str(precious)!r}).read()}}
lock.release("")
print(json.dumps(out))""",
        )
        assert found["precious"] == "victim data"
        assert precious.read_text() == "victim data"
        assert found["lock"] == os.path.join(fallback, _lock_name(str(mountpoint)))
        assert found["held"]["mountpoint"] == str(mountpoint)
        assert (found["dir_mode"], found["file_mode"]) == (0o700, 0o600)
        warning = stderr.strip().splitlines()
        assert warning == [
            f"runtime directory {squat}: is owned by uid {attacker.uid}, not by the daemon's "
            f"user (uid {victim.uid}); refused (another user could change it); "
            f"using {fallback} instead"
        ]
        assert os.path.islink(squat / _lock_name(str(mountpoint)))  # left as it was
    finally:
        # The squat goes with public_dir (as root); what the victim's daemon made, here.
        for path in made:
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)


def test_the_runtime_dir_in_tmp_is_made_private_whatever_the_umask(
    users: tuple[User, User], public_dir: Path
) -> None:
    victim, attacker = users
    found, stderr = _as(
        victim,
        MOUNTS.format(shared=str(public_dir))
        + f"""
os.umask(0)
lock = m.DaemonLock({str(public_dir / "mnt")!r})
out = {{"lock": lock.path, "dir_mode": os.stat(os.path.dirname(lock.path)).st_mode & 0o7777,
        "file_mode": os.stat(lock.path).st_mode & 0o7777}}
lock.release("")
print(json.dumps(out))""",
    )
    assert os.path.dirname(found["lock"]) == str(public_dir / f"shardfs-{victim.uid}")
    assert (found["dir_mode"], found["file_mode"]) == (0o700, 0o600)
    assert stderr == ""
    peek = attacker.run(f"import os; print(os.listdir({os.path.dirname(found['lock'])!r}))")
    assert peek.returncode != 0 and "PermissionError" in peek.stderr


def test_xdg_runtime_dir_is_preferred_if_it_is_the_users_alone(
    users: tuple[User, User], public_dir: Path
) -> None:
    victim, attacker = users
    mine, theirs = public_dir / "run-victim", public_dir / "run-attacker"
    for user, path in ((victim, mine), (attacker, theirs)):
        _as(user, f"import json, os; os.mkdir({str(path)!r}, 0o700); print(json.dumps(1))")
    code = MOUNTS.format(shared=str(public_dir)) + (
        f"lock = m.DaemonLock({str(public_dir / 'mnt')!r}); "
        "print(json.dumps([m.runtime_dir(), os.path.dirname(lock.path)])); lock.release('')"
    )
    assert _as(victim, code, XDG_RUNTIME_DIR=str(mine)) == ([str(mine / "shardfs")] * 2, "")
    assert _mode(mine / "shardfs") == 0o700 and os.stat(mine / "shardfs").st_uid == victim.uid
    # Another user's (as `su` leaves it), or one that does not exist: /tmp/shardfs-UID.
    in_tmp = str(public_dir / f"shardfs-{victim.uid}")
    for xdg in (theirs, public_dir / "missing"):
        assert _as(victim, code, XDG_RUNTIME_DIR=str(xdg)) == ([in_tmp] * 2, "")
        assert not (xdg / "shardfs").exists()


# -- the runtime directory of a real mount --------------------------------------------------


@pytest.mark.fuse
def test_lock_socket_and_spool_of_a_mount_are_private_with_umask_0(tmp_path: Path) -> None:
    """A read-write mount started with umask 0 that spills: runtime directory 0700, its
    lock file and control socket 0600, the spool directory it makes 0700, spill files
    0600."""
    source, spool = tmp_path / "src", tmp_path / "spool"
    one_shard_array(source, "a", (1024, 2048), (512, 1024), 7)
    old = os.umask(0)
    try:
        mounted = start_mount(
            source,
            tmp_path / "mnt",
            tmp_path / "log",
            "rw",
            "write_buffer=768K",
            "flush_interval=600",
            f"spool={spool}",
        )
    finally:
        os.umask(old)
    try:
        lock = lock_path(str(mounted.path))
        sock = control.socket_path(str(mounted.path))
        assert _mode(os.path.dirname(lock)) == 0o700
        assert _mode(lock) == 0o600
        deadline = time.monotonic() + 15  # the socket is made as the mount comes up
        while not os.path.lexists(sock) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and _mode(sock) == 0o600
        chunks = mounted.path / "a" / "c" / "0"
        with open(chunks / "0", "wb") as held:  # stays open: buffered, then spilled
            held.write(b"\x01" * CHUNK)
            held.flush()
            (chunks / "1").write_bytes(b"\x02" * CHUNK)
            blobs = list(spool.rglob("*.blob"))
            assert blobs, "nothing was spilled"
            assert _mode(spool) == 0o700
            for blob in blobs:
                assert _mode(blob.parent) == 0o700 and _mode(blob) == 0o600
    finally:
        stop_mount(mounted)
    assert mounted.process.returncode == 0, mounted.log()


@pytest.mark.fuse
def test_kept_chunks_are_private_with_umask_0(tmp_path: Path) -> None:
    source, spool = tmp_path / "src", tmp_path / "spool"
    make_source(source)
    old = os.umask(0)
    try:
        keep_chunks(tmp_path, source, spool, ["a/c/0/0"])
    finally:
        os.umask(old)
    made = [p for p in spool.rglob("*") if not p.name.startswith(PREFIX)]
    assert {p.name for p in made if p.is_file()} >= {"source"}
    for path in [spool, *made]:
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_lock_files_are_never_opened_through_a_symlink(tmp_path: Path) -> None:
    """A symlink at the lock's name (no daemon makes one) is neither written through by a
    daemon nor followed by `shardfs umount`."""
    mountpoint, target = tmp_path / "mnt", tmp_path / "target"
    target.write_text("keep")
    link = Path(lock_path(str(mountpoint)))
    link.parent.mkdir(mode=0o700, exist_ok=True)
    link.symlink_to(target)
    try:
        with pytest.raises(RuntimeError, match="cannot create the lock file"):
            DaemonLock(str(mountpoint), timeout=0)
        assert open_lock(str(mountpoint)) is None
    finally:
        link.unlink()
    assert target.read_text() == "keep"


def test_stats_asks_no_socket_in_a_directory_others_may_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setattr(control, "socket_path", lambda mountpoint: str(shared / "x.sock"))
    with pytest.raises(UnsafeState, match=f"{shared}: is writable by group or others"):
        control.query(str(tmp_path / "mnt"))
