"""Owners and modes (docs/semantics.md "Permissions"): a mount shows each file the mode and
owner of what it is stored in, so that with `allow_other` (and the kernel's
`default_permissions`) other users read through it only what the source lets them read;
`uid=`, `gid=`, `file_mode=` and `dir_mode=` replace them."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.owners import Owners
from shardfs.options import parse_options
from shardfs.primitives.errors import UsageError
from tests.conftest import start_mount, stop_mount
from tests.support.users import User

#: Read each path as the user; prints "OK n" or the errno's name per path.
READ = """
import errno, sys
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            print("OK", len(f.read()))
    except OSError as e:
        print(errno.errorcode[e.errno])
"""


def _source(root: Path) -> Path:
    """A group of two sharded arrays written by zarr-python 3: `private` (directory 0700,
    shard and documents 0600) and `shared` (0755, 0644), all root's, and a private file."""
    src = root / "src"
    group = zarr.open_group(src, mode="w")
    for name in ("private", "shared"):
        # the index first: a write through the mount then replaces the shard (no append)
        shards = {"shape": (16,), "index_location": "start"}
        array = group.create_array(
            name, shape=(16,), dtype="u1", chunks=(4,), shards=shards, compressors=None
        )
        array[:] = np.arange(16, dtype="u1")
    (src / "notes.txt").write_text("root's notes\n")
    os.chmod(src, 0o755)
    for directory, _, files in os.walk(src / "private"):
        os.chmod(directory, 0o700)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o600)
    for directory, _, files in os.walk(src / "shared"):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    os.chmod(src / "notes.txt", 0o600)
    return src


def _read_as(user: User, *paths: Path) -> list[str]:
    result = user.run(f"import sys\nsys.argv[1:] = {[str(p) for p in paths]!r}\n" + READ)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[:-1]


@contextlib.contextmanager
def _mounted(root: Path, src: Path, *options: str) -> Iterator[Path]:
    """`src` mounted where other users can reach it (below `root`), for the test only."""
    mnt = root / "mnt"
    mounted = start_mount(src, mnt, root / "mount.log", *options)
    try:
        yield mnt
    finally:
        stop_mount(mounted)


def _shown(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


@pytest.mark.fuse
def test_other_users_read_through_the_mount_only_what_the_source_lets_them(
    users: tuple[User, User], public_dir: Path
) -> None:
    user = users[0]
    src = _source(public_dir)
    os.chown(src / "shared" / "c" / "0", user.uid, user.gid)  # the shard: its chunks show it
    with _mounted(public_dir, src, "ro", "allow_other") as mnt:
        _check_source_modes(user, src, mnt)


def _check_source_modes(user: User, src: Path, mnt: Path) -> None:
    # A listing first (readdirplus fills the kernel's attributes), then lookups.
    assert sorted(os.listdir(mnt / "shared" / "c")) == ["0", "1", "2", "3"]
    assert _shown(mnt / "shared" / "c" / "1") == (0o444, user.uid, user.gid)
    assert _shown(mnt / "private" / "c" / "2") == (0o400, 0, 0)  # looked up
    assert _shown(mnt / "private") == (0o500, 0, 0)
    assert _shown(mnt / "private" / "c") == (0o500, 0, 0)  # its stored directory's
    assert _shown(mnt / "private" / "zarr.json") == (0o400, 0, 0)
    assert _shown(mnt / "shared") == (0o555, 0, 0)
    assert _shown(mnt / "notes.txt") == (0o400, 0, 0)

    private = [mnt / "private" / "c" / "0", mnt / "private" / "zarr.json", mnt / "notes.txt"]
    # the same as the source itself tells the user
    assert _read_as(user, src / "private" / "c" / "0", src / "notes.txt") == ["EACCES"] * 2
    assert _read_as(user, *private) == ["EACCES"] * 3
    shared = [mnt / "shared" / "c" / "3", mnt / "shared" / "zarr.json"]
    assert [line.split()[0] for line in _read_as(user, *shared)] == ["OK", "OK"]
    assert _read_as(user, mnt / "shared" / "c" / "3") == ["OK 4"]


@pytest.mark.fuse
def test_options_replace_the_shown_owner_and_modes(
    users: tuple[User, User], public_dir: Path
) -> None:
    user = users[0]
    src = _source(public_dir)
    options = (f"uid={user.uid}", f"gid={user.gid}", "file_mode=0440", "dir_mode=0550")
    with _mounted(public_dir, src, "ro", "allow_other", *options) as mnt:
        assert _shown(mnt / "private") == (0o550, user.uid, user.gid)
        assert _shown(mnt / "private" / "c" / "1") == (0o440, user.uid, user.gid)
        assert _shown(mnt / "notes.txt") == (0o440, user.uid, user.gid)
        # the daemon (root) reads them; the kernel lets the user in as the shown owner
        files = (mnt / "private" / "c" / "1", mnt / "notes.txt")
        assert _read_as(user, *files) == ["OK 4", "OK 13"]


def test_the_shown_mode_follows_the_stored_one() -> None:
    ro, rw = Owners(read_only=True), Owners(read_only=False)
    me = (os.getuid(), os.getgid())
    # no owners stored (S3; what a read-write mount has not committed): the mounting user's
    assert ro.of(True, None) == (stat.S_IFDIR | 0o555, *me)
    assert ro.of(False, None) == (stat.S_IFREG | 0o444, *me)
    assert rw.of(True, None) == (stat.S_IFDIR | 0o755, *me)
    assert rw.of(False, None) == (stat.S_IFREG | 0o644, *me)
    # stored: its permission bits; files without execute, ro without write, no set-id bits
    shard = (stat.S_IFREG | 0o6775, 12, 34)
    assert rw.of(False, shard) == (stat.S_IFREG | 0o664, 12, 34)
    assert ro.of(False, shard) == (stat.S_IFREG | 0o444, 12, 34)
    directory = (stat.S_IFDIR | 0o3771, 5, 6)
    assert rw.of(True, directory) == (stat.S_IFDIR | 0o1771, 5, 6)
    assert ro.of(True, directory) == (stat.S_IFDIR | 0o1551, 5, 6)
    given = Owners(True, uid=7, gid=8, file_mode=0o640, dir_mode=0o750)
    assert given.of(False, shard) == (stat.S_IFREG | 0o640, 7, 8)
    assert given.of(True, None) == (stat.S_IFDIR | 0o750, 7, 8)
    assert Owners(True, gid=9).of(False, shard) == (stat.S_IFREG | 0o444, 12, 9)


def test_owner_and_mode_options_are_checked() -> None:
    options = parse_options(["ro,uid=1002,gid=0,file_mode=0440,dir_mode=750"])
    assert (options.uid, options.gid, options.file_mode, options.dir_mode) == (
        1002,
        0,
        0o440,
        0o750,
    )
    assert options.given == ["ro", "uid=1002", "gid=0", "file_mode=0440", "dir_mode=750"]
    assert parse_options(["dir_mode=07777"]).dir_mode == 0o7777
    for bad, says in [
        ("uid=alice", "numeric id"),
        ("gid=-1", "numeric id"),
        ("uid=4294967295", "numeric id"),
        ("uid=", "needs a value"),
        ("file_mode=10000", "octal mode from 0 to 7777"),
        ("file_mode=0o644", "octal mode"),
        ("dir_mode=0758", "octal mode"),
        ("dir_mode=", "needs a value"),
    ]:
        with pytest.raises(UsageError, match=says):
            parse_options([bad])


def _precomputed(root: Path) -> Path:
    """A sharded precomputed volume written by tensorstore."""
    import tensorstore as ts

    sharding = {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": 0,
        "hash": "identity",
        "minishard_bits": 1,
        "shard_bits": 1,
        "minishard_index_encoding": "raw",
        "data_encoding": "raw",
    }
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": str(root)},
            "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
            "scale_metadata": {
                "key": "s0",
                "size": [16, 16, 8],
                "chunk_size": [8, 8, 8],
                "resolution": [1, 1, 1],
                "encoding": "raw",
                "sharding": sharding,
            },
            "create": True,
        }
    ).result()
    store[...] = np.ones((16, 16, 8, 1), dtype="u1")
    return root


def _wkw(root: Path) -> Path:
    from tests.support.wkw_data import make_dataset

    return make_dataset(root, compressed=False)


@pytest.mark.parametrize("make", [_precomputed, _wkw])
def test_precomputed_and_wkw_files_show_the_stored_file_they_are_served_from(
    make: Callable[[Path], Path], tmp_path: Path
) -> None:
    """Chunk files show their shard's (WKW: data file's) mode and owner, documents their
    stored document's, directories (virtual ones too) the nearest stored directory's."""
    from shardfs.options import MountOptions
    from shardfs.sources import open_source, open_view
    from shardfs.view.nodes import Role

    src = make(tmp_path / "src")
    stored_chunks = 0
    for directory, _, files in os.walk(src):
        os.chown(directory, 1234, 5678)
        os.chmod(directory, 0o750)
        for name in files:
            path = os.path.join(directory, name)
            data = name.endswith(".shard") or os.path.basename(directory).startswith("y")
            stored_chunks += data
            os.chown(path, 1234, 5678)
            os.chmod(path, 0o604 if data else 0o640)
    assert stored_chunks
    options = MountOptions(read_only=True)
    view = open_view(open_source(str(src), options), options, "test")
    seen: set[Role] = set()
    pending = [view.root()]
    while pending:
        directory = pending.pop()
        for name, node, listed in view.listing(directory).items():
            node = view.lookup(directory, name)
            mode = 0o750 if node.is_dir else 0o604 if node.role is Role.CHUNK else 0o640
            for attr in (listed, view.attr(node)):
                assert attr.access is not None, node
                assert (stat.S_IMODE(attr.access[0]), *attr.access[1:]) == (mode, 1234, 5678)
            seen.add(node.role)
            if node.is_dir:
                pending.append(node)
    assert {Role.CHUNK, Role.METADATA, Role.ARRAY} <= seen


@pytest.mark.fuse
def test_a_shard_rewritten_through_the_mount_keeps_its_owner_and_mode(
    users: tuple[User, User], public_dir: Path
) -> None:
    """The new version of a shard is made by the daemon (root here): it takes the mode and
    owner of the one it replaces, so a write opens no private shard to everyone."""
    user = users[0]
    src = _source(public_dir)
    shard = src / "private" / "c" / "0"
    os.chown(shard, user.uid, user.gid)
    before = shard.stat().st_ino
    with _mounted(public_dir, src, "rw") as mnt:
        array = zarr.open_array(mnt / "private", mode="r+")
        array[4:8] = 7
    assert shard.stat().st_ino != before  # replaced, not appended to
    assert _shown(shard) == (0o600, user.uid, user.gid)
    assert zarr.open_array(src / "private", mode="r")[4:8].tolist() == [7] * 4
