"""One odd object must not take a mount down (issue 22).

Anybody who can write to a bucket can store an object whose key no path can
hold: a `.`, `..` or empty segment, a `dir/` key with data, a name that is also
a directory, a name over 255 bytes or a path over 4095. Such an object is left
out of the view with one log line, once per mount, and everything else mounts
and reads exactly. Nothing outside the prefix is ever shown or asked for.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.mounts import mount_type
from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import NotFound, UsageError
from shardfs.storage.base import ABSENT
from shardfs.storage.s3 import S3Config, S3Storage
from tests.conftest import Mounted, stop_mount
from tests.mounts.test_cli import daemons_for, run, wait_gone
from tests.s3.test_mount_s3 import CHUNKS, SHAPE, read_view, values, write
from tests.s3.test_storage_s3 import storage
from tests.support.s3 import S3Env

#: Healthy arrays that zarr-python 3 writes below the prefix, with the seeds of their values.
ARRAYS = {"a": 1, "b": 2}
#: A path over 4095 bytes: 16 directories of 250-byte names (their paths stay within it),
#: then a file whose path has 4271 bytes.
DEEP = "deep/" + "/".join(["s" * 250] * 17)
#: Odd keys, below the prefix, and what their log line says.
ODD = {
    "../x": "'..' cannot be a file name",
    "other/c/../../y": "'..' cannot be a file name",
    "x/../../../etc": "'..' cannot be a file name",
    "./dot": "'.' cannot be a file name",
    "e//f": "an empty name",
    "/lead": "an empty name",  # `src//lead`: a `/` right after the prefix
    "a/c//0": "an empty name",  # inside a healthy array
    "dir/": "it ends in '/', so it names a directory, which cannot hold its 3 bytes",
    "b": "its name is also a directory",  # a stray object named like array b
    "n" * 256: "a name of 256 bytes, longer than the 255 a file name can have",
    "é" * 128: "a name of 256 bytes, longer than the 255",
    "nul\0x": "a NUL character cannot be in a file name",
    DEEP: "a path of 4271 bytes, longer than the 4095 a path can have",
}
#: Keys a path can hold, at the limits; and an empty folder marker, which shows its directory.
FIT = {"k" * 255: b"fit", "é" * 127: b"fit too", "marker/": b""}
#: Keys outside the prefix: never shown, whatever the odd keys name.
OUTSIDE = ["etc/passwd", "src-sibling/zarr.json", "srcx"]
#: What the odd and fit keys add to the view: the directories before an odd segment show.
SHOWN = {
    "other": True,
    "other/c": True,
    "x": True,
    "e": True,
    "dir": True,
    "marker": True,
    **{"/".join(DEEP.split("/")[:depth]): True for depth in range(1, 18)},
    "k" * 255: False,
    "é" * 127: False,
}


@pytest.fixture
def one_by_one(s3: S3Env) -> Iterator[None]:
    """Remove the objects of `s3` one by one at teardown: moto's DeleteObjects, with which
    `s3` empties its bucket, fails (500) on some odd keys."""
    yield
    for key in list(s3.keys()):
        s3.admin.delete_object(Bucket=s3.bucket, Key=key)


def seed(s3: S3Env, prefix: str) -> None:
    """Odd, fit and outside keys around `prefix` (the arrays are written by `write`)."""
    for key in ODD:
        s3.put(f"{prefix}/{key}", b"odd")
    for key, data in FIT.items():
        s3.put(f"{prefix}/{key}", data)
    for key in OUTSIDE:
        s3.put(key, b"secret")


def array_view(name: str) -> dict[str, bool]:
    """The paths of the view of a (64, 64) array of 8x8 chunks, all stored: is_dir by path."""
    grid = range(SHAPE[0] // CHUNKS[0]), range(SHAPE[1] // CHUNKS[1])
    paths = {name: True, f"{name}/zarr.json": False, f"{name}/c": True}
    paths.update({f"{name}/c/{i}": True for i in grid[0]})
    paths.update({f"{name}/c/{i}/{j}": False for i in grid[0] for j in grid[1]})
    return paths


def expected_view() -> dict[str, bool]:
    view = {"zarr.json": False, **SHOWN}
    for name in ARRAYS:
        view.update(array_view(name))
    return view


def mounted_tree(root: Path) -> dict[str, bool]:
    """Every path below `root`, is_dir by path; walked by directory descriptors, since the
    deepest directories' paths are longer than a path given to a system call can be."""
    tree: dict[str, bool] = {}
    for directory, dirs, files, _ in os.fwalk(root):
        below = os.path.relpath(directory, root)
        for name, is_dir in [*((d, True) for d in dirs), *((f, False) for f in files)]:
            tree[name if below == "." else f"{below}/{name}"] = is_dir
    return tree


def shown(bucket: str, key: str) -> str:
    """How a log line names the object `key`: its URL, escaped if it is not printable."""
    url = f"s3://{bucket}/{key}"
    return f"{url if url.isprintable() else ascii(url)}: left out of the view: "


def assert_logged_once(log: str, bucket: str, prefix: str) -> None:
    """Each odd key in exactly one line of `log`, with its reason; nothing else left out."""
    lines = [line for line in log.splitlines() if ": left out of the view: " in line]
    for key, why in ODD.items():
        mine = [line for line in lines if shown(bucket, f"{prefix}/{key}") in line]
        assert len(mine) == 1, (key, mine)
        assert why in mine[0], mine[0]
    assert len(lines) == len(ODD), lines


@pytest.mark.fuse
@pytest.mark.usefixtures("one_by_one")
def test_odd_keys_are_left_out_and_the_rest_mounts(s3: S3Env, mount) -> None:
    for name, seed_of in ARRAYS.items():
        write(s3, name, values(seed_of))
    seed(s3, "src")
    options = [*s3.mount_options(), "ro", "metadata_ttl=1", "cache_timeout=0.1"]
    mounted: Mounted = mount(s3.url("src"), *options)
    assert mounted_tree(mounted.path) == expected_view()
    for name, seed_of in ARRAYS.items():
        np.testing.assert_array_equal(read_view(mounted, name), values(seed_of), name)
    for key, data in FIT.items():
        if data:
            assert (mounted.path / key).read_bytes() == data
    assert os.listdir(mounted.path / "other" / "c") == []
    lists = s3.proxy.counts()["LIST"]
    time.sleep(1.5)  # the listings expire: the daemon lists again, and logs nothing again
    assert mounted_tree(mounted.path) == expected_view()
    np.testing.assert_array_equal(read_view(mounted, "b"), values(ARRAYS["b"]))
    assert s3.proxy.counts()["LIST"] > lists, "listed again"
    log = mounted.log()
    assert_logged_once(log, s3.bucket, "src")
    assert "marker" not in log, "an empty folder marker is not worth a line"
    assert "ERROR" not in log and "Traceback" not in log, log


@pytest.mark.fuse
@pytest.mark.usefixtures("one_by_one")
def test_a_detached_mount_shows_the_odd_keys_and_logs_them(s3: S3Env, tmp_path: Path) -> None:
    """`shardfs mount` (no `-f`) finds the odd keys while it opens the source, before the
    daemon's log is set up: they are shown to whoever mounts, and in the daemon's log."""
    for name, seed_of in ARRAYS.items():
        write(s3, name, values(seed_of))
    seed(s3, "src")
    mountpoint, log_file = tmp_path / "mnt", tmp_path / "daemon.log"
    mountpoint.mkdir()
    options = ",".join([*s3.mount_options(), "ro", f"log={log_file}"])
    result = run("mount", s3.url("src"), str(mountpoint), "-o", options)
    pids = daemons_for(mountpoint)
    try:
        assert result.returncode == 0, result.stderr
        assert_logged_once(result.stderr, s3.bucket, "src")
        lines = result.stderr.splitlines()
        assert all(line.startswith("shardfs: WARNING: ") for line in lines), lines
        np.testing.assert_array_equal(zarr.open_array(mountpoint / "a", mode="r")[...], values(1))
        assert_logged_once(log_file.read_text(), s3.bucket, "src")
    finally:
        if mount_type(str(mountpoint)) is not None:
            assert run("umount", str(mountpoint)).returncode == 0
        assert wait_gone(pids), "daemon still running after umount"


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        ("src/../src", "'..' cannot be a file name"),
        ("./src", "'.' cannot be a file name"),
        ("src//a", "an empty name (a '/' first or two '/' in a row)"),
    ],
)
def test_a_prefix_no_path_can_hold_is_refused(
    s3: S3Env, tmp_path: Path, prefix: str, why: str
) -> None:
    """One line names the prefix and the reason, and nothing is mounted."""
    write(s3, "a", values(1))
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    args = [sys.executable, "-m", "shardfs", "mount", s3.url(prefix), str(mountpoint), "-f"]
    process = subprocess.Popen(
        [*args, "-o", ",".join(s3.mount_options())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, err = process.communicate(timeout=60)
    finally:  # had it mounted after all, the daemon would still run: undo that
        stop_mount(Mounted(mountpoint, process, tmp_path / "unused.log"))
    assert process.returncode == 2
    assert err.decode().splitlines() == [
        f"shardfs: s3://{s3.bucket}/{prefix}: the prefix cannot be a directory: {why}; S3"
        " takes keys as written and resolves no '.' or '..', so name the prefix as its keys"
        " spell it"
    ]
    assert mount_type(str(mountpoint)) != "fuse.shardfs" and out == b""


# The storage layer alone, without FUSE.


def storage_tree(st: S3Storage, key: str = "") -> dict[str, bool]:
    """Every path below directory `key` by `list`, is_dir by path."""
    tree: dict[str, bool] = {}
    for entry in st.list(key):
        path = f"{key}/{entry.name}" if key else entry.name
        tree[path] = entry.stat.is_dir
        if entry.stat.is_dir:
            tree.update(storage_tree(st, path))
    return tree


@pytest.mark.usefixtures("one_by_one")
@pytest.mark.parametrize("page_size", [1000, 2], ids=["one-page", "pages-of-2"])
def test_listings_leave_odd_keys_out_once(
    s3: S3Env, caplog: pytest.LogCaptureFixture, page_size: int
) -> None:
    """One page answers every directory, or pages of two make every directory big: the
    subtree pages and the listings with a delimiter (which name a bad directory by its
    prefix only) show the same tree and log each odd key once."""
    for key in ("zarr.json", "a/zarr.json", "a/c/0", "b/zarr.json"):
        s3.put(f"root/{key}", b"{}")
    seed(s3, "root")
    st = storage(s3, metadata_ttl=0.0)  # every listing expires at once: taken again each time
    st.page_size = page_size
    view = {"zarr.json": False, "a": True, "a/zarr.json": False, "a/c": True, "a/c/0": False}
    view |= {"b": True, "b/zarr.json": False, **SHOWN}
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        assert storage_tree(st) == view
        assert storage_tree(st) == view
        for key in ODD:
            stat = st.stat(key)
            assert stat is None or (key == "b" and stat.is_dir), key
        for key in SHOWN:
            assert st.stat(key) is not None, key
    assert_logged_once(caplog.text, s3.bucket, "root")


def test_a_directory_wins_over_an_object_of_its_name(
    s3: S3Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Wherever the object and the keys below it are seen: on one page, on two pages (the
    first would show a file), or by the stat of a name beyond the first page of a big
    directory, which is one LIST where no name like `name-1` comes between."""
    for key in ("a0", "b", "b/inner", "b-1", "c", "d", "d/inner"):
        s3.put(f"root/{key}", b"x")
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        one_page = storage(s3)
        assert {e.name: e.stat.is_dir for e in one_page.list("")} == {
            "a0": False,
            "b": True,
            "b-1": False,
            "c": False,
            "d": True,
        }
        split = storage(s3)
        split.page_size = 1
        s3.proxy.reset_counts()
        d = split.stat("d")  # page one ends at root/a0: d is asked for by itself
        assert d is not None and d.is_dir
        assert s3.proxy.counts() == {"LIST": 2}
        s3.proxy.reset_counts()
        b = split.stat("b")  # page one again, then root/b-1 comes between root/b and root/b/
        assert b is not None and b.is_dir
        assert s3.proxy.counts() == {"LIST": 3}
        c = split.stat("c")
        assert c is not None and not c.is_dir and c.size == 1
        assert split.stat("b/inner") is not None and split.stat("e") is None
        assert [e.name for e in split.list("b")] == ["inner"]
        pages = storage(s3)
        pages.page_size = 2  # the page ends at root/b: b looks like a file until root/b/inner
        b = pages.stat("b")
        assert b is not None and b.is_dir
    why = (
        "left out of the view: its name is also a directory (keys below it), which is shown instead"
    )
    shadowed = Counter(r.getMessage() for r in caplog.records if "left out" in r.getMessage())
    assert shadowed == {  # once by each storage (each mount) that met them
        f"s3://{s3.bucket}/root/b: {why}": 3,
        f"s3://{s3.bucket}/root/d: {why}": 2,
    }


def test_names_no_path_can_hold_are_never_asked_for(s3: S3Env) -> None:
    """Not `..` (nothing outside the prefix), nor any other odd name: no request, nothing
    read or written, and the reason is in the error."""
    s3.put("etc/passwd", b"secret")
    s3.put("root/zarr.json", b"{}")
    st = storage(s3)
    assert [e.name for e in st.list("")] == ["zarr.json"]
    s3.proxy.reset_counts()
    for key, why in {
        "../etc/passwd": "'..' cannot be a file name",
        "x/../../etc/passwd": "'..' cannot be a file name",
        "/zarr.json": "an empty name",
        "./zarr.json": "'.' cannot be a file name",
        "a//zarr.json": "an empty name",
        "n" * 256: "a name of 256 bytes",
        "/".join(["p" * 255] * 15 + ["p" * 128, "p" * 127]): "a path of 4096 bytes",
    }.items():
        with nonblocking():  # answered without a request, or this would raise WouldBlock
            assert st.stat(key) is None, key
        with pytest.raises(NotFound, match=f"s3://{s3.bucket}/root/.*: not in the view: {why}"):
            st.read(key, 0, 6)
        with pytest.raises(NotFound, match=why):
            st.list(key)
        with pytest.raises(NotFound, match=why):
            st.put(key, [b"evil"], ABSENT)
    assert s3.proxy.counts() == {}
    assert set(s3.keys()) == {"etc/passwd", "root/zarr.json"}
    with nonblocking():
        with pytest.raises(WouldBlock):  # 4095 bytes: a path can hold it, so it is asked for
            st.stat("/".join(["p" * 255] * 16))
        with pytest.raises(WouldBlock):  # 254 bytes
            st.stat("d/" + "é" * 127)


@pytest.mark.parametrize(
    ("prefix", "why"),
    [("a/../b", "'..'"), ("a/./b", "'.'"), ("a//b", "an empty name"), ("..", "'..'")],
)
def test_a_prefix_no_path_can_hold_is_refused_by_the_storage(prefix: str, why: str) -> None:
    with pytest.raises(UsageError, match=f"s3://bucket/{prefix}: the prefix cannot be .*{why}"):
        S3Storage("bucket", prefix, S3Config(endpoint_url="http://127.0.0.1:9"))
