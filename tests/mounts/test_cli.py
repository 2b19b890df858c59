"""The command line: clear one-line failures, detaching, unmounting, signals."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.mounts import mount_type, unmount
from shardfs.options import parse_options, parse_size
from shardfs.primitives.errors import UsageError
from tests.conftest import Mounted, start_mount, stop_mount

SHARDFS = [sys.executable, "-m", "shardfs"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "src"
    a = zarr.create_array(root, shape=(8, 8), dtype="uint8", shards=(4, 4), chunks=(2, 2))
    a[:] = np.arange(64, dtype="uint8").reshape(8, 8)
    return root


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFS, *args], capture_output=True, text=True, timeout=120)


def daemons_for(mountpoint: Path) -> list[int]:
    """PIDs of shardfs daemons serving `mountpoint` (started by these tests)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"shardfs" in argv and os.fsencode(mountpoint) in argv and b"mount" in argv:
            found.append(int(entry))
    return found


def wait_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("make", "options", "message"),
    [
        (lambda tmp: (tmp / "missing", tmp / "mp"), [], "does not exist"),
        (lambda tmp: (tmp, tmp / "mp"), [], "not a Zarr v3 hierarchy"),
        (lambda tmp: (None, tmp / "missing-mp"), [], "does not exist"),
        (lambda tmp: (None, tmp / "file"), [], "not a directory"),
        (lambda tmp: (None, tmp / "mp"), ["-o", "ro,bogus"], "unknown mount option 'bogus'"),
        (lambda tmp: (None, tmp / "mp"), ["-o", "index_cache=12Q"], "bad size"),
        (lambda tmp: (None, tmp / "mp"), ["-o", "ro=1"], "takes no value"),
    ],
)
def test_mount_failures_are_one_clear_line(
    tmp_path: Path, source: Path, make, options: list[str], message: str
) -> None:
    (tmp_path / "mp").mkdir()
    (tmp_path / "file").write_text("x")
    src, mp = make(tmp_path)
    result = run("mount", str(src or source), str(mp), *options)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardfs: ") and message in lines[0], (
        result.stderr
    )
    assert mount_type(str(mp)) is None


def test_mountpoint_inside_source_is_refused(tmp_path: Path, source: Path) -> None:
    inside = source / "mp"
    inside.mkdir(exist_ok=True)
    try:
        result = run("mount", str(source), str(inside))
        assert result.returncode == 2 and "inside the source" in result.stderr
    finally:
        inside.rmdir()


def test_detached_mount_answers_at_once_and_umount_stops_the_daemon(
    tmp_path: Path, source: Path
) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    result = run("mount", str(source), str(mp), "-o", f"ro,log={tmp_path / 'log'}")
    pids = daemons_for(mp)
    try:
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert mount_type(str(mp)) == "fuse.shardfs"  # mounted before the command returned
        assert len(pids) == 1
        assert sorted(os.listdir(mp / "c" / "0")) == ["0", "1", "2", "3"]
        np.testing.assert_array_equal(
            zarr.open_array(mp, mode="r")[:], np.arange(64, dtype="uint8").reshape(8, 8)
        )
        busy = run("mount", str(source), str(mp))
        assert busy.returncode == 2 and "busy" in busy.stderr
        held = os.open(mp / "c", os.O_RDONLY)  # a user of the mount: it cannot go
        try:
            in_use = run("umount", str(mp))
        finally:
            os.close(held)
        assert in_use.returncode == 1 and mount_type(str(mp)) == "fuse.shardfs"
        assert in_use.stderr.splitlines() == [
            f"shardfs: cannot unmount {mp}: a process has a file or its working directory in "
            f"it: find it with `fuser -vm {mp}` and end it, or unmount once it is done with "
            f"`fusermount3 -uz {mp}`"
        ], in_use.stderr
        assert run("umount", str(mp)).returncode == 0
        assert mount_type(str(mp)) is None
        assert wait_gone(pids), "daemon still running after umount"
        assert "mounted" in (tmp_path / "log").read_text()
    finally:
        if mount_type(str(mp)) is not None:
            unmount(str(mp), lazy=True)
        for pid in daemons_for(mp):
            os.kill(pid, signal.SIGKILL)


def test_detached_mount_takes_relative_paths(tmp_path: Path, source: Path) -> None:
    """The daemon runs in "/": relative SOURCE, MOUNTPOINT and log= must still work."""
    (tmp_path / "mp").mkdir()
    rel_source = os.path.relpath(source, tmp_path)
    result = subprocess.run(
        [*SHARDFS, "mount", rel_source, "mp", "-o", "ro,log=rel.log"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    mp = tmp_path / "mp"
    try:
        assert result.returncode == 0, result.stderr
        assert sorted(os.listdir(mp / "c" / "0")) == ["0", "1", "2", "3"]
        assert "mounted" in (tmp_path / "rel.log").read_text()
    finally:
        pids = daemons_for(mp)
        if mount_type(str(mp)) is not None:
            unmount(str(mp), lazy=True)
        assert wait_gone(pids), "daemon still running after unmount"


def test_umount_of_something_else_is_refused(tmp_path: Path) -> None:
    result = run("umount", str(tmp_path))
    assert result.returncode == 2 and "not mounted" in result.stderr


@pytest.mark.parametrize("how", ["sigterm", "sigint", "fusermount", "umount"])
def test_daemon_exits_cleanly(tmp_path: Path, source: Path, how: str) -> None:
    mounted = start_mount(source, tmp_path / "mp", tmp_path / "log", "ro")
    try:
        if how == "sigterm":
            mounted.process.send_signal(signal.SIGTERM)
        elif how == "sigint":
            mounted.process.send_signal(signal.SIGINT)
        elif how == "fusermount":
            assert unmount(str(mounted.path)).returncode == 0
        else:
            subprocess.run(["umount", str(mounted.path)], check=True)
        assert mounted.process.wait(timeout=15) == 0, mounted.log()
        assert mount_type(str(mounted.path)) is None
    finally:
        stop_mount(mounted)


def test_read_only_refuses_writes_and_debug_traces_requests(tmp_path: Path, source: Path) -> None:
    mounted: Mounted = start_mount(source, tmp_path / "mp", tmp_path / "log", "ro", "debug")
    try:
        with pytest.raises(OSError) as info:
            (mounted.path / "c" / "0" / "0").write_bytes(b"x")
        assert info.value.errno == errno.EROFS
        with pytest.raises(OSError) as info:
            (mounted.path / "new").mkdir()
        assert info.value.errno == errno.EROFS
        os.listdir(mounted.path / "c")
        assert "lookup" in mounted.log() and "DEBUG" in mounted.log()
        for _ in range(3):
            (mounted.path / "zarr.json").read_bytes()
        # Nothing is stored on close: the first flush tells the kernel to send no more.
        assert mounted.log().count(" flush(") == 1, mounted.log()
    finally:
        stop_mount(mounted)


def test_option_parsing() -> None:
    options = parse_options(["ro,allow_other", "index_cache=256M", "debug"])
    assert options.read_only and options.allow_other and options.debug
    assert options.index_cache == 256 << 20
    assert "allow_other" in options.fuse_options("x") and "ro" in options.fuse_options("x")
    assert (
        parse_size("4096") == 4096 and parse_size("64K") == 65536 and parse_size("1GiB") == 1 << 30
    )
    with pytest.raises(UsageError):
        parse_size("-1")


def test_commands_print_nothing_unasked(tmp_path: Path, source: Path) -> None:
    """With every warning shown, the commands of a plain install print no library's warning (numcodecs warns on import when google-crc32c,
    which it wants, is missing: it is one of shardfs's own requirements)."""
    from importlib.metadata import requires

    assert any(r.replace("_", "-").startswith("google-crc32c") for r in requires("shardfs") or [])
    env = dict(os.environ, PYTHONWARNINGS="default")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    for args in (
        ["--help"],
        ["info", str(source)],
        ["checksum", str(source)],
        ["mount", str(source), str(mountpoint), "-o", "ro"],
        ["umount", str(mountpoint)],
    ):
        result = subprocess.run(
            [*SHARDFS, *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 0, (args, result.stderr)
        assert "Warning" not in result.stderr, (args, result.stderr)


#: A value of each placeholder the option table uses, for `parse_options`.
PLACEHOLDERS = {
    "SIZE": "1M",
    "SECONDS": "2",
    "N": "3",
    "DIR": "/tmp/x",
    "URL": "http://localhost:9000",
    "NAME": "x",
    "FILE": "/tmp/x.log",
    "MODE": "0440",
    "HOST:PORT": "localhost:9464",
    "TIMESTAMP": "2024-05-01T12:00:00",
}


#: The repository: README.md and docs/ are checked against the code.
REPOSITORY = Path(__file__).resolve().parents[2]


def test_mount_help_and_the_option_page_show_every_option_of_the_one_table() -> None:
    """`shardfs mount --help` and the table of docs/configuration.md are made from
    `shardfs.options.TABLE`, and `parse_options` takes exactly the options named there (and
    the generic ones)."""
    import re

    from shardfs import options

    page = (REPOSITORY / "docs" / "configuration.md").read_text()
    assert options.markdown_table() in page, (
        "the table of mount options in docs/configuration.md is not "
        "shardfs.options.markdown_table(): paste its output there"
    )
    assert page.count("| option | meaning |") == 1, "one table of mount options, no other"
    shown = run("mount", "--help").stdout
    named = {name for forms, _ in options.TABLE for name in options._names(forms)}
    for name in (*named, *options.KERNEL_FLAGS, *options.IGNORED):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", shown), name
    # the ones the old, hand-written help left out, among them
    for name in ("cache_dir", "kernel_cache", "endpoint_url", "anon", "metadata_ttl", "nonempty"):
        assert name in named
    assert named - options.IGNORED == options.OWN
    for forms, _ in options.TABLE:
        for form in re.findall(r"`([a-z_]+(?:=[^`]*)?)`", forms):
            name, _, value = form.partition("=")
            value = PLACEHOLDERS.get(value, value)
            if name == "cache_size":  # needs a disk cache to size
                parse_options([f"cache_dir=/tmp/x,{name}={value}"])
            else:
                parse_options([f"{name}={value}" if value else name])
    with pytest.raises(UsageError, match="unknown mount option"):
        parse_options(["no_such_option=1"])


# -- the messages of the small mistakes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "hint"),
    [
        ("--ro", "-o ro"),
        ("-r", "-o ro"),
        ("--rw", "-o rw"),
        ("--allow_other", "-o allow_other"),
        ("--index-cache=1G", "-o index_cache=1G"),
    ],
)
def test_a_mount_option_given_as_a_flag_is_told_its_o_form(
    tmp_path: Path, source: Path, flag: str, hint: str
) -> None:
    """`shardfs mount --ro` says to write `-o ro`, not argparse's top-level usage."""
    (tmp_path / "mp").mkdir()
    for args in (
        ["mount", flag, str(source), str(tmp_path / "mp")],
        ["mount", str(source), str(tmp_path / "mp"), "-o", "debug", flag],
        [str(source), str(tmp_path / "mp"), flag],  # as mount.fuse3 would run it
    ):
        result = run(*args)
        name = flag.partition("=")[0]
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"shardfs: mount has no {name} flag: mount options go after -o ({hint})"
        ]
    assert mount_type(str(tmp_path / "mp")) is None


def test_mount_options_given_as_a_third_argument_are_told_their_o_form(
    tmp_path: Path, source: Path
) -> None:
    """`shardfs mount SRC MNT ro` (as `mount` and fstab write them) says to write `-o ro`."""
    (tmp_path / "mp").mkdir()
    for given in ("ro", "ro,uid=1000", "allow_other"):
        result = run("mount", str(source), str(tmp_path / "mp"), given)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"shardfs: mount takes SOURCE MOUNTPOINT: mount options go after -o (-o {given})"
        ]
    assert mount_type(str(tmp_path / "mp")) is None


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["mount", "SRC"], "the following arguments are required: mountpoint (see: shardfs mount --help)"),
        (["mount", "SRC", "MP", "extra"], "mount: unrecognized arguments: extra (see: shardfs mount --help)"),
        (["info", ".", "--bogus"], "info: unrecognized arguments: --bogus (see: shardfs info --help)"),
        (["--bogus"], "the following arguments are required: command (see: shardfs --help)"),
        (["fsck"], "the following arguments are required: source (see: shardfs fsck --help)"),
    ],
)  # fmt: skip
def test_every_usage_error_is_one_line(args: list[str], line: str) -> None:
    """argparse's errors too: one line starting `shardfs:`, exit 2, and no usage."""
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"shardfs: {line}"]


def test_a_value_after_o_is_not_taken_for_a_flag(tmp_path: Path) -> None:
    """`-o` takes the next argument whatever it looks like: argparse judges it, not the hint."""
    result = run("mount", str(tmp_path / "missing"), str(tmp_path), "-o", "--ro")
    assert "no --ro flag" not in result.stderr and result.returncode == 2, result.stderr


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("index_cache=12Q", "option index_cache: bad size '12Q'"),
        ("write_buffer=lots", "option write_buffer: bad size 'lots'"),
        ("read_cache=1X", "option read_cache: bad size"),
        ("listing_cache=", "option listing_cache needs a value: listing_cache=SIZE"),
        ("cache_size=big", "option cache_size: bad size"),
        ("view=v4", "option view takes v3 or v2, got 'v4'"),
        ("view", "option view needs a value: view=v3 or view=v2"),
        ("cache_dir", "option cache_dir needs a value: cache_dir=DIR"),
        ("log=", "option log needs a value: log=FILE"),
        ("endpoint_url", "option endpoint_url needs a value: endpoint_url=URL"),
        ("flush_interval=0", "option flush_interval needs a positive number"),
        ("uid=alice", "option uid needs a numeric id"),
        ("kernel_cache=maybe", "option kernel_cache takes yes or no"),
    ],
)
def test_every_option_error_names_its_option(given: str, named: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_options([given])
    assert named in str(raised.value)


def test_a_bad_size_of_compact_names_its_option(source: Path) -> None:
    result = run("compact", str(source), "--min-dead", "12Q")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "shardfs: --min-dead: bad size '12Q' (use bytes or a K/M/G suffix, e.g. 256M)"
    ]


def test_a_missing_source_exits_2_in_every_command(tmp_path: Path) -> None:
    """A missing SOURCE is a usage error, exit 2, as argparse's and as in every command."""
    missing = str(tmp_path / "missing")
    (tmp_path / "mp").mkdir()
    for args in (
        ["mount", missing, str(tmp_path / "mp")],
        [missing, str(tmp_path / "mp")],
        ["info", missing],
        ["fsck", missing],
        ["compact", missing],
        ["checksum", missing],
        ["checksum", "--virtual", missing],
    ):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.splitlines() == [f"shardfs: source {missing} does not exist"], args


def test_stats_of_a_dead_daemon_says_it_is_gone_and_how_to_clear_it(
    tmp_path: Path, source: Path
) -> None:
    mounted = start_mount(source, tmp_path / "mp", tmp_path / "log", "ro")
    try:
        mounted.process.kill()  # our child, the foreground daemon: it leaves a stale mount
        mounted.process.wait(timeout=15)
        mp = str(mounted.path)
        result = run("stats", mp)
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            f"shardfs: the daemon of {mp} is gone (the mount is stale: transport endpoint is "
            f"not connected); `shardfs umount {mp}` clears it"
        ]
        assert run("umount", mp).returncode == 0
        assert mount_type(mp) is None
    finally:
        stop_mount(mounted)


def test_a_source_with_no_sharded_array_mounts_with_one_line_saying_so(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    root = zarr.open_group(plain, mode="w")
    root.create_array("a", shape=(4, 4), chunks=(2, 2), dtype="uint8")[:] = 3
    mp = tmp_path / "mp"
    mp.mkdir()
    result = run("mount", str(plain), str(mp), "-o", f"ro,log={tmp_path / 'log'}")
    try:
        assert result.returncode == 0, result.stderr
        line = f"no sharded array in {plain}: every file is shown as it is stored"
        assert result.stderr.splitlines() == [f"shardfs: WARNING: {line}"]
        assert sorted(os.listdir(mp / "a" / "c" / "0")) == ["0", "1"]
        assert run("umount", str(mp)).returncode == 0
        assert (tmp_path / "log").read_text().count(line) == 1
    finally:
        if mount_type(str(mp)) is not None:
            unmount(str(mp), lazy=True)


def test_a_sharded_array_anywhere_in_the_walk_keeps_the_mount_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The walk goes past groups and unsharded arrays to a sharded array deeper down; an
    array's chunk directories are never walked."""
    from shardfs.sources import note_nothing_sharded, open_source

    root = zarr.open_group(tmp_path / "src", mode="w")
    root.create_array("plain", shape=(4, 4), chunks=(2, 2), dtype="uint8")[:] = 1
    deep = root.create_group("x").create_group("y")
    deep.create_array("s", shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="uint8")[:] = 2
    with caplog.at_level("WARNING", logger="shardfs"):
        note_nothing_sharded(open_source(str(tmp_path / "src")), "src")
        assert caplog.messages == []
        del root["x"]
        note_nothing_sharded(open_source(str(tmp_path / "src")), "src")
        note_nothing_sharded(open_source(str(tmp_path / "src")), "src", view="v2")
    assert caplog.messages == [
        "no sharded array in src: every file is shown as it is stored",
        # (the v2 view shows .zarray and .zattrs made from zarr.json)
        "no sharded array in src: chunk files are shown as stored, and the metadata as Zarr v2's",
    ]


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    import re

    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_link_of_the_readme_and_docs_reaches_its_page_and_heading() -> None:
    """Each docs page is one link from the README, and no link of README.md or docs/ points
    to a file or heading that is not there (docs/performance.md is rewritten from results:
    links into it are checked for the file only)."""
    import re

    pages = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
    readme_links = set(re.findall(r"\]\(docs/([^)#]+)", pages[0].read_text()))
    assert {p.name for p in pages[1:]} <= readme_links
    for page in pages:
        if page.name == "performance.md":
            continue
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https: and the like
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), (page.name, target)
            if anchor and linked.suffix == ".md" and linked.name != "performance.md":
                assert anchor in _anchors(linked.read_text()), (page.name, target)


def test_no_docs_heading_is_named_after_an_issue() -> None:
    """History stays in git and the issues; a heading names its topic."""
    import re

    for page in sorted((REPOSITORY / "docs").glob("*.md")):
        if page.name == "performance.md":
            continue  # rewritten from results elsewhere
        for heading in re.findall(r"^#+ .*$", page.read_text(), re.M):
            assert not re.search(r"\bissues? \d", heading, re.I), (page.name, heading)
