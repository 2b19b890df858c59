"""Nothing under a local source is trusted as a path (repro r13 of issue 41).

A user who can write a source plants symlinks and `.shardfs/` entries; root's `fsck`, or a
read-write mount, must then never create, truncate or rename anything outside the source:
names are resolved beneath the source root with no symlink followed, a journal entry acts
only on the regular file whose device and inode it names, root writes a source another user
owns with that user's rights, and refuses to write one where others could replace a
directory on its path.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfs.cli import main
from shardfs.fuse.mounts import mount_type
from shardfs.primitives.errors import NotFound, SourceChanged
from shardfs.storage import LocalStorage, beneath, journal
from shardfs.storage import descriptors as descriptors_module
from shardfs.storage.base import ABSENT
from shardfs.storage.writers import UnsafeSource
from tests.conftest import one_shard_array, start_mount, stop_mount
from tests.support.users import User

SHARDFS = [sys.executable, "-m", "shardfs"]
SECRET = b"root's precious data\n" * 50


@pytest.fixture(params=["openat2", "walking"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of resolving beneath: openat2, and one component at a time (no openat2)."""
    monkeypatch.setattr(beneath, "_no_openat2", request.param == "walking")
    return request.param


def test_beneath_refuses_symlinks_dotdot_and_absolute_paths(
    tmp_path: Path, resolution: str
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (outside / "f").write_bytes(b"outside")
    (root / "d" / "f").write_bytes(b"inside")
    (root / "last").symlink_to(outside / "f")
    (root / "middle").symlink_to(outside)
    (root / "d" / "absolute").symlink_to("/")
    (root / "dangling").symlink_to(outside / "new")
    tree = beneath.Tree(str(root))
    fd = tree.open("d/f", os.O_RDONLY)
    assert os.read(fd, 100) == b"inside"
    os.close(fd)
    refused = {
        "last": errno.ELOOP,
        "middle/f": errno.ELOOP,
        "d/absolute/etc/passwd": errno.ELOOP,
        "../outside/f": errno.EXDEV,
        "d/../../outside/f": errno.EXDEV,
        str(outside / "f"): errno.EXDEV,
    }
    for path, code in refused.items():
        for flags in (os.O_RDONLY, os.O_RDWR | os.O_TRUNC):
            with pytest.raises(OSError) as raised:
                tree.open(path, flags)
            assert raised.value.errno == code, (path, resolution)
    with pytest.raises(OSError) as raised:
        tree.open("dangling", os.O_RDWR | os.O_CREAT)
    assert raised.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        tree.mkdir("middle/new")
    with pytest.raises(OSError):
        tree.rename("d/f", "middle/moved")
    assert not (outside / "new").exists() and sorted(os.listdir(outside)) == ["f"]
    assert (outside / "f").read_bytes() == b"outside"
    tree.unlink("last")  # the link itself
    assert (outside / "f").read_bytes() == b"outside"


def test_reads_never_follow_a_symlink(
    tmp_path: Path, resolution: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symlink is not part of a source, wherever it is on the way to a key: a stat, read,
    listing or pin finds nothing there (repro r3 of audit 4: the v2 view looked up chunk
    `0` of a 1-D array as shard `c/0`, and a planted `c` led to another user's shards).
    Nor does a pin whose descriptor the budget closed open its file again through one."""
    root, outside = tmp_path / "src", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    (outside / "c").mkdir(parents=True)
    (outside / "c" / "0").write_bytes(b"outside")
    (root / "d" / "f").write_bytes(b"inside")
    (root / "d" / "g").write_bytes(b"inside too")
    (root / "c").symlink_to(outside / "c")
    (root / "last").symlink_to(outside / "c" / "0")
    storage = LocalStorage(root)
    for key in ("c/0", "c", "last"):
        assert storage.stat(key) is None, (key, resolution)
        with pytest.raises(NotFound):
            storage.read(key, 0, 7)
    with pytest.raises(NotFound):
        storage.list("c")
    assert [entry.name for entry in storage.list("")] == ["d"]
    assert storage.read("d/f", 0, 6) == b"inside"

    monkeypatch.setattr(descriptors_module, "budget", lambda: 1)
    stat = storage.stat("d/f")
    assert stat is not None
    held = storage.pin("d/f", stat)
    other = storage.pin("d/g", storage.stat("d/g"))  # type: ignore[arg-type]
    os.rename(root / "d", outside / "d")  # its file unchanged, now reached through a symlink
    (root / "d").symlink_to(outside / "d")
    with pytest.raises(SourceChanged):
        held.read(0, 6)
    held.close()
    other.close()


# -- journal recovery, as the attacker plants it --------------------------------------


def entry(key: str, old: int, new: int, inode: tuple[int, int] | None = None) -> str:
    doc: dict[str, object] = {"key": key, "old_size": old, "new_size": new, "crc32c": 0}
    if inode is not None:
        doc["dev"], doc["ino"] = inode
    return json.dumps(doc)


@pytest.fixture
def planted(public_dir: Path, users: tuple[User, User]) -> Iterator[tuple[Path, Path, User]]:
    """(source, secret file): a source owned by the attacker in a root-owned directory,
    and a file of root's (0600 in a 0700 directory) outside it."""
    attacker = users[1]
    base = public_dir / "base"
    base.mkdir(mode=0o755)
    secret = base / "secret"
    secret.mkdir(mode=0o700)
    victim = secret / "victim"
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    source = base / "src"
    source.mkdir(mode=0o755)
    os.chown(source, attacker.uid, attacker.gid)
    yield source, victim, attacker


def plant(attacker: User, source: Path, code: str) -> None:
    prelude = (
        "import os, json, hashlib\n"
        f"src = {str(source)!r}\n"
        "def entry_file(key, text):\n"
        "    os.makedirs(src + '/.shardfs/journal', exist_ok=True)\n"
        "    name = hashlib.sha1(key.encode()).hexdigest()\n"
        "    open(src + '/.shardfs/journal/' + name, 'w').write(text)\n"
    )
    done = attacker.run(prelude + code)
    assert done.returncode == 0, done.stderr


def test_recovery_never_follows_a_planted_symlink(
    planted: tuple[Path, Path, User],
) -> None:
    """The attacker fills in the victim's device and inode (they can stat it) for a key
    that is a symlink to it, and makes `.shardfs/lock` a symlink to a file to create."""
    source, victim, attacker = planted
    st = victim.stat()
    created = victim.parent / "created-by-root"
    plant(
        attacker,
        source,
        f"os.symlink({str(victim)!r}, src + '/link')\n"
        f"entry_file('link', {entry('link', 7, 99999, (st.st_dev, st.st_ino))!r})\n"
        f"os.symlink({str(created)!r}, src + '/.shardfs/lock')\n",
    )
    storage = LocalStorage(source)
    lines = storage.recover()
    assert lines == [
        f"{source}/link: left as is: it is a symbolic link (or below one), never followed"
    ]
    assert victim.read_bytes() == SECRET and not created.exists()
    assert not (source / ".shardfs" / "lock").is_symlink()
    assert os.listdir(source / ".shardfs" / "journal") == []


def test_recovery_acts_only_on_the_inode_the_entry_names(
    planted: tuple[Path, Path, User],
) -> None:
    source, _victim, attacker = planted
    plant(
        attacker,
        source,
        "open(src + '/shard', 'wb').write(b'x' * 100)\n"
        f"entry_file('shard', {entry('shard', 10, 100, (1, 2))!r})\n",
    )
    lines = LocalStorage(source).recover()
    assert lines == [
        f"{source}/shard: left as is: another file replaced it since an interrupted append"
    ]
    assert (source / "shard").read_bytes() == b"x" * 100


def test_an_entry_without_an_inode_is_left_to_a_person(
    planted: tuple[Path, Path, User], capsys: pytest.CaptureFixture
) -> None:
    """Older versions wrote no device and inode: recovery does not act on such an entry,
    fsck says the shard is possibly torn and how to settle it, and `--settle` does."""
    source, _victim, attacker = planted
    one_shard_array(source, "a", (8, 8), (4, 4), 7)
    shard = source / "a" / "c" / "0" / "0"
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"torn tail")
    for path in [source, *source.rglob("*")]:  # the attacker's source, all of it
        os.chown(path, attacker.uid, attacker.gid)
    plant(attacker, source, f"entry_file('a/c/0/0', {entry('a/c/0/0', size, size + 100)!r})\n")
    storage = LocalStorage(source)
    (line,) = storage.recover()
    assert isinstance(line, journal.Unsettled) and "possibly torn, left as is" in line
    assert shard.stat().st_size == size + 9 and storage.pending_recovery() == ["a/c/0/0"]
    assert main(["fsck", str(source)]) == 1
    out = capsys.readouterr().out.splitlines()
    torn = [line for line in out if line.startswith("POSSIBLY TORN")]
    assert len(torn) == 1 and f"{shard}: possibly torn" in torn[0]
    assert f"`shardfs fsck --settle a/c/0/0 {source}`" in torn[0]
    assert shard.stat().st_size == size + 9
    assert main(["fsck", "--settle", "a/c/0/0", str(source)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{shard}: rolled back a torn append (kept {size} of {size + 9} bytes)"
    assert out[-1] == "fsck: no damage"
    assert shard.stat().st_size == size and storage.pending_recovery() == []


def test_root_writes_another_users_source_with_that_users_rights(
    planted: tuple[Path, Path, User],
) -> None:
    source, victim, attacker = planted
    storage = LocalStorage(source)
    stat = storage.put("d/k", [b"data"], ABSENT)
    storage.append("d/k", [b"+more"], stat.version)
    for path in (source / "d", source / "d" / "k"):
        assert (path.stat().st_uid, path.stat().st_gid) == (attacker.uid, attacker.gid)
    # a file of root's in the source: the owner may not write it, so neither does root here
    (source / "roots").write_bytes(b"r" * 50)
    with pytest.raises(Exception, match="Permission denied"):
        storage.append("roots", [b"x"], storage.stat("roots").version)  # type: ignore[union-attr]
    assert (source / "roots").read_bytes() == b"r" * 50
    assert os.getuid() == 0 and os.listdir(victim.parent)  # this thread is root again


# -- root refuses a source others could replace --------------------------------------


def unsafe_sources(public_dir: Path, attacker: User) -> dict[str, tuple[Path, str]]:
    """Sources of root's whose path another user could change, with the expected reason."""
    made = {}
    owned = public_dir / "owned"
    owned.mkdir()
    os.chown(owned, attacker.uid, attacker.gid)
    made["above, another user's"] = (owned / "src", f"{owned} above it is owned by {attacker.name}")
    loose = public_dir / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    made["above, writable by all"] = (loose / "src", "is writable by group or others (mode 0777)")
    group = public_dir / "group"
    group.mkdir()
    made["the source, group-writable"] = (group / "src", "the source root is writable by group")
    for source, _ in made.values():
        one_shard_array(source, "a", (8, 8), (4, 4), 7)
    (group / "src").chmod(0o775)
    return made


def test_root_refuses_to_write_a_source_others_could_replace(
    public_dir: Path, users: tuple[User, User]
) -> None:
    for name, (source, reason) in unsafe_sources(public_dir, users[1]).items():
        before = sorted(str(p) for p in source.rglob("*"))
        with pytest.raises(UnsafeSource) as raised:
            LocalStorage(source).recover()
        assert reason in str(raised.value) and "runuser -u" in str(raised.value), name
        for command in (["fsck"], ["compact"]):
            done = subprocess.run([*SHARDFS, *command, str(source)], capture_output=True, text=True)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1, (name, done.stderr)
            assert lines[0].startswith(f"shardfs: source {source}: refused to write it as root")
            assert reason in lines[0], (name, lines[0])
        done = subprocess.run([*SHARDFS, "fsck", "--dry-run", str(source)], capture_output=True)
        assert done.returncode == 0, name  # reading is not refused
        assert sorted(str(p) for p in source.rglob("*")) == before, name


@pytest.mark.fuse
def test_a_rw_mount_is_refused_and_a_ro_mount_writes_nothing(
    public_dir: Path, users: tuple[User, User], tmp_path: Path
) -> None:
    source, reason = unsafe_sources(public_dir, users[1])["above, another user's"]
    mountpoint = tmp_path / "mp"
    mountpoint.mkdir()
    try:
        done = subprocess.run(
            [*SHARDFS, "mount", str(source), str(mountpoint), "-o", "rw"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        if mount_type(str(mountpoint)) is not None:  # not refused: no mount outlives the test
            subprocess.run([*SHARDFS, "umount", str(mountpoint)], timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert reason in lines[0] and "refused to write it as root" in lines[0]
    assert not (source / ".shardfs").exists()
    before = sorted(str(p) for p in source.rglob("*"))
    mounted = start_mount(source, mountpoint, tmp_path / "log", "ro")
    try:
        assert (mountpoint / "a" / "c" / "0" / "0").read_bytes() == bytes([7] * 16)
    finally:
        stop_mount(mounted)
    assert sorted(str(p) for p in source.rglob("*")) == before


def test_a_hard_link_is_left_to_a_person(tmp_path: Path) -> None:
    """A file with two names may be another file's too (protected_hardlinks=1 keeps users
    from linking files they do not own; where it is 0 this still holds)."""
    storage = LocalStorage(tmp_path)
    stat = storage.put("k", [b"x" * 10], ABSENT)
    os.link(tmp_path / "k", tmp_path / "other")
    st = (tmp_path / "k").stat()
    (tmp_path / ".shardfs" / "journal" / journal.entry_name("k")).write_text(
        entry("k", 5, 10, (st.st_dev, st.st_ino))
    )
    (line,) = storage.recover()
    assert isinstance(line, journal.Unsettled) and "it has 2 names (hard links)" in line
    assert (tmp_path / "other").read_bytes() == b"x" * 10 and stat.size == 10


def test_a_source_made_anew_is_written_where_it_is_read(tmp_path: Path) -> None:
    """A writer that overwrites a whole hierarchy removes the source directory and makes it
    again: a store's writes then go to the new directory at the source's path (where its
    reads, by path, look), not into the removed one its root descriptor still names."""
    root = tmp_path / "src"
    root.mkdir()
    storage = LocalStorage(root)
    storage.put("a", [b"first"], ABSENT)
    root.rename(tmp_path / "old")
    root.mkdir()
    storage.put("a", [b"second"], ABSENT)
    assert (root / "a").read_bytes() == b"second" == storage.read("a", 0, 6)
    assert (tmp_path / "old" / "a").read_bytes() == b"first"


def test_a_journal_entry_too_deep_for_python_is_malformed_not_a_crash() -> None:
    """Whoever writes a source writes its journal: an entry nested deeper than Python's
    decoder recurses (within the 64 KiB an entry may have) is a malformed entry, left
    alone and reported, as any other, not a RecursionError out of recovery."""
    deep = b"[" * 30000 + b"]" * 30000
    assert len(deep) <= journal.MAX_ENTRY
    with pytest.raises(ValueError):
        journal.JournalEntry.decode(deep, journal.entry_name("a"))
