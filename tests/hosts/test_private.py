"""Private local state (`shardfs.primitives.private`): what another user controls is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardfs.primitives.private import UnsafeState, check_private_dir, open_private, private_dir
from tests.support.users import User


def test_a_new_directory_and_its_missing_parents_are_0700_whatever_the_umask(
    tmp_path: Path,
) -> None:
    old = os.umask(0)
    try:
        made = private_dir(str(tmp_path / "a" / "b"))
    finally:
        os.umask(old)
    assert made == str(tmp_path / "a" / "b")
    for path in (tmp_path / "a", tmp_path / "a" / "b"):
        assert path.stat().st_mode & 0o777 == 0o700


def test_files_are_0600_and_never_opened_through_a_symlink(tmp_path: Path) -> None:
    os.umask(old := os.umask(0))
    try:
        fd = open_private(str(tmp_path / "lock"), os.O_RDWR | os.O_CREAT)
    finally:
        os.umask(old)
    os.close(fd)
    assert (tmp_path / "lock").stat().st_mode & 0o777 == 0o600
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        open_private(str(tmp_path / "link"), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    assert (tmp_path / "victim").read_text() == "keep"


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_directory_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    (tmp_path / "d").mkdir()
    os.chmod(tmp_path / "d", mode)
    with pytest.raises(UnsafeState, match=rf"{tmp_path}/d: is writable by group or others"):
        private_dir(str(tmp_path / "d"))


def test_a_symlink_is_refused_even_to_a_private_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeState, match="is a symbolic link"):
        private_dir(str(tmp_path / "link"))


def test_a_directory_under_one_others_may_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)  # not sticky: anyone may rename what is in it
    with pytest.raises(UnsafeState, match=rf"the directory {tmp_path}/open above it"):
        private_dir(str(tmp_path / "open" / "mine"))
    os.chmod(tmp_path / "open", 0o1777)  # sticky, as /tmp: only the owner may
    check_private_dir(private_dir(str(tmp_path / "open" / "mine")))


def test_a_shared_directory_may_be_roots_or_sticky_but_never_a_symlink(tmp_path: Path) -> None:
    """`shared`: a directory the daemon only makes a private one in (the spool's root)."""
    (tmp_path / "sticky").mkdir()
    os.chmod(tmp_path / "sticky", 0o1777)
    check_private_dir(str(tmp_path / "sticky"), shared=True)
    with pytest.raises(UnsafeState, match="is writable by group or others"):
        check_private_dir(str(tmp_path / "sticky"))
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeState, match=r"is writable by group or others \(mode 0777\)"):
        check_private_dir(str(tmp_path / "open"), shared=True)
    (tmp_path / "link").symlink_to(tmp_path / "sticky")
    with pytest.raises(UnsafeState, match="is a symbolic link"):
        check_private_dir(str(tmp_path / "link"), shared=True)


def test_a_directory_made_never_passes_its_mode_to_a_symlinks_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone who swaps the new directory for a symlink before it gets mode 0700 (in a
    directory they may write, which is then refused) gets no file chmod-ed through it."""
    target = tmp_path / "target"
    target.write_text("x")
    os.chmod(target, 0o644)
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    made = tmp_path / "open" / "d"
    mkdir = os.mkdir

    def swapped(path: str, mode: int = 0o777) -> None:
        mkdir(path, mode)
        os.rmdir(path)
        os.symlink(target, path)

    monkeypatch.setattr(os, "mkdir", swapped)
    with pytest.raises(UnsafeState):
        private_dir(str(made))
    assert target.stat().st_mode & 0o777 == 0o644


def _as(user: User, code: str) -> dict[str, object]:
    result = user.run(code)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_a_directory_another_user_made_first_is_refused(
    users: tuple[User, User], public_dir: Path
) -> None:
    victim, attacker = users
    public = public_dir
    squat = public / "cache"
    made = _as(attacker, f"import os, json; os.mkdir({str(squat)!r}, 0o700); print(json.dumps(1))")
    assert made == 1
    found = _as(
        victim,
        f"""import json
from shardfs.primitives.private import private_dir, UnsafeState
try:
    private_dir({str(squat)!r}); print(json.dumps("used"))
except UnsafeState as e:
    print(json.dumps(str(e)))""",
    )
    assert found == (
        f"{squat}: is owned by uid {attacker.uid}, not by the daemon's user (uid {victim.uid}); "
        "refused (another user could change it)"
    )
    # the victim's own directory there is accepted, and nobody else may look inside
    own = public / "own"
    assert _as(
        victim,
        f"import json; from shardfs.primitives.private import private_dir; "
        f"print(json.dumps(private_dir({str(own)!r})))",
    ) == str(own)
    peek = attacker.run(f"import os; print(os.listdir({str(own)!r}))")
    assert peek.returncode != 0 and "PermissionError" in peek.stderr
