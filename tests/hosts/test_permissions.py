"""Owners and modes (docs/semantics.md "Permissions"): a mount shows each file the mode and
owner of what it is stored in, so that with `allow_other` (and the kernel's
`default_permissions`) other users read through it only what the source lets them read;
`uid=`, `gid=`, `file_mode=` and `dir_mode=` replace them."""

from __future__ import annotations

import contextlib
import json
import os
import random
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.owners import Owners
from shardfs.options import parse_options
from shardfs.primitives.errors import UsageError
from shardfs.storage import base as storage_base
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
def test_the_v2_view_shows_other_users_nothing_the_source_denies_them(
    users: tuple[User, User], public_dir: Path
) -> None:
    """Through root's `ro,allow_other,view=v2` mount (repros r3 and r4 of audit 4): a
    symlink `c` the attacker plants beside a copy of a private array's `zarr.json` does not
    lead the lookup of chunk `0` (shard `c/0`) to root's shards; the root group's
    `.zmetadata`, which everyone may read, holds nothing of the victim's private group,
    whose own `.zmetadata` the victim reads whole."""
    victim, attacker = users
    src = _source(public_dir)
    # as zarr-python writes it: only the 0700 directory above keeps others out
    (src / "private" / "c" / "0").chmod(0o644)
    secret = "the victim's secret attribute"
    group = zarr.open_group(src / "victim", mode="w", attributes={"secret": secret})
    group.create_array("a", shape=(4,), dtype="u1", compressors=None)[:] = 1
    for directory, _, names in os.walk(src / "victim"):
        os.chown(directory, victim.uid, victim.gid)
        os.chmod(directory, 0o700)
        for name in names:
            os.chown(os.path.join(directory, name), victim.uid, victim.gid)
            os.chmod(os.path.join(directory, name), 0o600)
    leak = src / "leak"
    leak.mkdir(mode=0o755)
    (leak / "zarr.json").write_bytes((src / "private" / "zarr.json").read_bytes())
    for path in (leak, leak / "zarr.json"):
        os.chown(path, attacker.uid, attacker.gid)
    planted = attacker.run(
        f"import os\nos.symlink({str(src / 'private' / 'c')!r}, {str(leak / 'c')!r})"
    )
    assert planted.returncode == 0, planted.stderr
    with _mounted(public_dir, src, "ro", "allow_other", "view=v2") as mnt:
        assert _read_as(attacker, src / "private" / "c" / "0", mnt / "leak" / "0") == [
            "EACCES",
            "ENOENT",
        ]
        assert _read_as(attacker, mnt / "victim" / ".zattrs") == ["EACCES"]
        assert _read_as(attacker, mnt / ".zmetadata")[0].startswith("OK")
        shown = (mnt / ".zmetadata").read_text()  # one document, whoever reads it
        assert "shared/.zarray" in shown and "leak/.zarray" in shown
        assert "victim/" not in shown and "private/" not in shown and secret not in shown
        assert _read_as(victim, mnt / "victim" / ".zmetadata")[0].startswith("OK")
        own = (mnt / "victim" / ".zmetadata").read_text()
        assert secret in own and "a/.zarray" in own


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


#: What a listing asks of a directory: to read and to search it.
READS = storage_base.READ | storage_base.SEARCH


def _kernel_may(uid: int, groups: set[int], shown: tuple[int, int, int], bits: int) -> bool:
    """The kernel's check (`default_permissions`) of user `uid` in `groups` against a
    file shown as `shown`: root may do anything, else one class of bits decides."""
    mode, owner, group = shown
    if uid == 0:
        return True
    shift = 6 if uid == owner else 3 if group in groups else 0
    return (mode >> shift) & bits == bits


def test_a_rendered_document_admits_only_who_may_read_all_it_is_made_from() -> None:
    """`Owners.covers`, against the kernel's own rule for every user and every way they may
    be in the groups: whoever may read the document may do what each need asks; and the
    usual cases are let through (a shared tree; a user's own private one, to that user)."""
    rng = random.Random(41)
    owners = Owners(read_only=True)
    admitted = 0
    for _ in range(20000):
        shown_from = (
            stat.S_IFREG | rng.getrandbits(9),
            rng.choice((0, 1, 2)),
            rng.choice((10, 11)),
        )
        needs = [
            (
                rng.random() < 0.5,
                (rng.getrandbits(9), rng.choice((0, 1, 2)), rng.choice((10, 11))),
                rng.choice((storage_base.READ, storage_base.SEARCH, READS)),
            )
            for _ in range(rng.randint(1, 2))
        ]
        if not owners.covers(shown_from, needs):
            continue
        admitted += 1
        shown = owners.of(False, shown_from)
        for uid in (1, 2, 3):
            for groups in ({10}, {11}, {10, 11}, set()):
                if _kernel_may(uid, groups, shown, storage_base.READ):
                    for is_dir, access, bits in needs:
                        assert _kernel_may(uid, groups, owners.of(is_dir, access), bits), (
                            shown_from,
                            needs,
                            uid,
                            groups,
                        )
    assert admitted > 1000
    doc, directory = (stat.S_IFREG | 0o644, 0, 0), (stat.S_IFDIR | 0o755, 0, 0)
    victim_doc, victim_dir = (stat.S_IFREG | 0o600, 5, 5), (stat.S_IFDIR | 0o700, 5, 5)
    assert owners.covers(doc, [(True, directory, READS), (False, doc, storage_base.READ)])
    assert not owners.covers(doc, [(True, victim_dir, storage_base.SEARCH)])
    assert not owners.covers(doc, [(False, victim_doc, storage_base.READ)])
    assert owners.covers(victim_doc, [(True, victim_dir, READS), (False, doc, storage_base.READ)])
    lab_doc, lab_dir = (stat.S_IFREG | 0o640, 5, 7), (stat.S_IFDIR | 0o750, 5, 7)
    assert owners.covers(lab_doc, [(True, lab_dir, READS), (False, lab_doc, storage_base.READ)])
    assert not owners.covers(lab_doc, [(True, (stat.S_IFDIR | 0o711, 5, 7), READS)])
    # the modes the options give are those the kernel checks
    assert Owners(True, file_mode=0o444, dir_mode=0o555).covers(
        doc, [(True, victim_dir, storage_base.SEARCH)]
    )
    # nothing stored has owners (S3): everyone may read everything
    assert owners.covers(None, [(True, None, READS), (False, None, storage_base.READ)])


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


def test_a_wkw_zmetadata_holds_only_what_every_reader_of_it_may_read(tmp_path: Path) -> None:
    """A WKW group's `.zmetadata` (v2 view), shown with the mode of the properties file, is
    made from the magnifications' headers too: with `allow_other` it leaves out the ones
    that some user it admits could not reach or read the header of; a magnification's
    own documents are shown with its header's mode where that is the narrower."""
    from shardfs.options import MountOptions
    from shardfs.sources import open_source, open_view
    from shardfs.view.interface import ViewInterface

    src = _wkw(tmp_path / "src")
    os.chown(src / "color2", 1234, 1234)
    (src / "color2").chmod(0o700)
    (src / "segmentation" / "2" / "header.wkw").chmod(0o600)

    def opened(allow_other: bool) -> ViewInterface:
        options = MountOptions(read_only=True, allow_other=allow_other, view="v2")
        return open_view(open_source(str(src), options), options, "test")

    def consolidated(allow_other: bool, group: str = "") -> set[str]:
        view = opened(allow_other)
        node = view.resolve(f"{group}/.zmetadata" if group else ".zmetadata")
        return set(json.loads(view.open(node).read(0, view.attr(node).size))["metadata"])

    shown = consolidated(True)
    assert {"color/1/.zarray", "color/2-2-1/.zarray", "segmentation/1/.zarray"} <= shown
    assert "color2/.zattrs" in shown  # made from the properties file alone
    assert "color2/1/.zarray" not in shown and "segmentation/2/.zarray" not in shown
    assert consolidated(True, "segmentation") == {".zgroup", ".zattrs", "1/.zarray", "1/.zattrs"}
    assert {"color2/1/.zarray", "segmentation/2/.zarray"} <= consolidated(False)
    properties = (src / "datasource-properties.json").stat().st_mode
    for allow_other, mode in ((True, 0o100600), (False, properties)):
        view = opened(allow_other)
        for path in ("segmentation/2/.zarray", "segmentation/2/.zattrs"):
            node = view.resolve(path)
            assert view.attr(node).access == (mode, 0, 0)
            assert view.open(node).attr().access == (mode, 0, 0)
        assert view.attr(view.resolve("color2/1/.zarray")).access == (properties, 0, 0)


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
