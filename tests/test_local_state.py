"""The daemon's local state on a shared host: the runtime directory (lock files, the stats
socket), the write spool and the chunks kept for the next mount are the daemon user's alone.

What shardfs makes is 0700 (directories) and 0600 (files) whatever the umask; a directory
another user could change is refused with one line naming it and why, except the runtime
directory in /tmp, which is replaced by one in the user's home (with a warning): someone who
made /tmp/shardfs-UID first may be planting symlinks there (repro t8 of issue 31).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shardfs.fuse.mounts import mount_type, unmount
from shardfs.primitives.private import UnsafeState
from shardfs.writeback.buffer import PREFIX, SUFFIX, WriteBuffer
from shardfs.writeback.leftover import Leftovers
from tests.conftest import one_shard_array
from tests.users import User

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
