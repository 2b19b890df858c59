"""The patched pyfuse3 (patches/pyfuse3-3.5.0-*.patch) that scripts/setup builds.

A filesystem that answers open and opendir with ENOSYS lets the kernel serve repeated reads and
listings from its caches, but then sends fh 0; only the patched build tells the read and readdir
handlers which inode that is. This runs a tiny pyfuse3 daemon (this file, run as a script) in
that mode and reads its request counts, which it reports as the root's `user.requests` xattr.
The build also asks the kernel for parallel lookups in one directory, which libfuse 3.14 never
does (see patches/README.md).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

#: inode -> contents of the daemon's files, named "f0", "f1", ... in the root (inode 1)
FILES = {inode: (b"%d" % inode) * 1000 for inode in range(2, 6)}
#: a directory "d" in the root, where lookups of "pair*" names wait for each other
SUBDIR = 100


def serve(mountpoint: str) -> None:
    """Serve FILES read-only, answering ENOSYS to open and opendir, and count the requests
    (and the fh values the handlers were given) that reach the daemon."""
    import pyfuse3
    import trio

    counts: Counter[str] = Counter()
    handles: defaultdict[str, set[int]] = defaultdict(set)

    def attributes(inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.entry_timeout = entry.attr_timeout = 300
        if inode in (pyfuse3.ROOT_INODE, SUBDIR):
            entry.st_mode, entry.st_nlink = stat.S_IFDIR | 0o555, 2
        else:
            entry.st_mode, entry.st_nlink = stat.S_IFREG | 0o444, 1
            entry.st_size = len(FILES[inode])
        return entry

    #: lookups of "pair*" names under way, and the most at once
    pairs = {"now": 0, "most": 0}
    together = trio.Event()

    class Operations(pyfuse3.Operations):
        async def getattr(self, inode, ctx=None):
            counts["getattr"] += 1
            return attributes(inode)

        async def lookup(self, parent, name, ctx=None):
            counts["lookup"] += 1
            if parent == pyfuse3.ROOT_INODE and name == b"d":
                return attributes(SUBDIR)
            if parent == SUBDIR and name.startswith(b"pair"):  # waits up to 5 s for another
                pairs["now"] += 1
                pairs["most"] = max(pairs["most"], pairs["now"])
                if pairs["now"] >= 2:
                    together.set()
                with trio.move_on_after(5):
                    await together.wait()
                pairs["now"] -= 1
                counts["pairs_most"] = pairs["most"]
                raise pyfuse3.FUSEError(errno.ENOENT)
            inode = int(name[1:]) + 2 if name[:1] == b"f" and name[1:].isdigit() else 0
            if parent != pyfuse3.ROOT_INODE or inode not in FILES:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return attributes(inode)

        async def open(self, inode, flags, ctx):
            counts["open"] += 1
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def opendir(self, inode, ctx):
            counts["opendir"] += 1
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def read(self, fh, off, size):
            counts["read"] += 1
            handles["read"].add(fh)
            if fh not in FILES:
                raise pyfuse3.FUSEError(errno.EBADF)
            return FILES[fh][off : off + size]

        async def readdir(self, fh, start_id, token):
            counts["readdir"] += 1
            handles["readdir"].add(fh)
            for inode in sorted(FILES)[start_id:]:
                name = b"f%d" % (inode - 2)
                if not pyfuse3.readdir_reply(token, name, attributes(inode), inode - 1):
                    return

        async def flush(self, fh):
            # ENOSYS once stops flush on every close (the kernel's no_flush)
            counts["flush"] += 1
            handles["flush"].add(fh)
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def release(self, fh):
            counts["release"] += 1

        async def releasedir(self, fh):
            counts["releasedir"] += 1

        async def getxattr(self, inode, name, ctx):
            if name != b"user.requests":
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
            report = {"counts": counts, "handles": {k: sorted(v) for k, v in handles.items()}}
            return json.dumps(report).encode()

    pyfuse3.init(Operations(), mountpoint, {"fsname=pyfuse3-patch-test", "ro"})
    print("ready", flush=True)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


def test_installed_pyfuse3_is_patched() -> None:
    import pyfuse3

    for flag in ("SHARDFS_INODE_AS_FH", "SHARDFS_PARALLEL_DIROPS"):
        assert getattr(pyfuse3, flag, False) is True, (
            f"pyfuse3 {pyfuse3.__version__} lacks {flag}: run scripts/setup"
        )


@pytest.mark.fuse
def test_lookups_in_one_directory_run_at_once(tmp_path: Path) -> None:
    """libfuse 3.14 wants FUSE_CAP_PARALLEL_DIROPS but never tells the kernel, which then
    serialises the lookups of one directory: a lookup that waits (an index read from S3)
    holds up every other in the directory. Each of two lookups here waits for the other.
    (In a subdirectory: on this kernel, 6.18, the lookups of a mount's root directory stay
    one at a time even with the flag; chunk files are never there.)"""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    daemon = subprocess.Popen(
        [sys.executable, __file__, str(mountpoint)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert daemon.stdout is not None
        assert daemon.stdout.readline() == "ready\n", "the daemon did not mount"
        subdir = mountpoint / "d"
        assert subdir.is_dir()
        start = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            found = list(pool.map(os.path.exists, [subdir / "pair0", subdir / "pair1"]))
        elapsed = time.monotonic() - start
        report = json.loads(os.getxattr(mountpoint, "user.requests"))
        assert found == [False, False]
        assert report["counts"]["pairs_most"] == 2, report
        assert elapsed < 4, f"{elapsed:.1f} s: one lookup waited alone"
    finally:
        _unmount(mountpoint, daemon)


@pytest.mark.fuse
def test_no_open_mode_reads_and_lists_from_the_kernel_caches(tmp_path: Path) -> None:
    """First pass: one lookup and one read per file, the read given the inode as fh; second
    pass and second listing: no request at all."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    daemon = subprocess.Popen(
        [sys.executable, __file__, str(mountpoint)], stdout=subprocess.PIPE, text=True
    )
    seen: dict[str, int] = {}

    def requests() -> tuple[dict[str, int], dict[str, list[int]]]:
        """The requests since the last call, and the fh values the handlers got so far."""
        report = json.loads(os.getxattr(mountpoint, "user.requests"))
        counts = report["counts"]
        new = {op: n - seen.get(op, 0) for op, n in counts.items() if n != seen.get(op, 0)}
        seen.update(counts)
        return new, report["handles"]

    def read_all() -> None:
        for inode, data in FILES.items():
            assert (mountpoint / f"f{inode - 2}").read_bytes() == data

    try:
        assert daemon.stdout is not None
        assert daemon.stdout.readline() == "ready\n", "the daemon did not mount"
        requests()

        read_all()
        first, handles = requests()
        assert first.pop("open") == 1  # answered ENOSYS: the kernel stops sending open
        assert first.pop("flush", 0) <= 1
        assert first == {"lookup": len(FILES), "read": len(FILES)}
        assert handles["read"] == sorted(FILES)

        read_all()
        assert requests()[0] == {}

        names = [f"f{inode - 2}" for inode in FILES]
        assert sorted(os.listdir(mountpoint)) == names
        listing, handles = requests()
        assert listing.pop("opendir") == 1
        assert listing.pop("getattr", 0) <= 1
        assert listing.pop("readdir") >= 1
        assert listing == {}
        assert handles["readdir"] == [1]  # the root's inode

        assert sorted(os.listdir(mountpoint)) == names
        assert requests()[0] == {}
    finally:
        _unmount(mountpoint, daemon)


def _unmount(mountpoint: Path, daemon: subprocess.Popen[str]) -> None:
    subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True, check=False)
    try:
        daemon.wait(timeout=10)
    except subprocess.TimeoutExpired:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        daemon.kill()
        daemon.wait(timeout=10)


if __name__ == "__main__":
    serve(sys.argv[1])
