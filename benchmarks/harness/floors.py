"""The floors: pyfuse3 + trio daemons whose handlers do nothing.

Why: every request a shardfs mount answers goes through the kernel, libfuse,
pyfuse3's request loop and trio before shardfs's own code runs, and in Python
that machinery alone costs tens of µs of CPU per request. This daemon serves
files of SIZE bytes from memory, read-only, with handlers that only look up an
integer. What it costs per file read is the per-request floor of a pyfuse3 file
system in Python, which no shardfs change can go below; `per_file` measures
shardfs against it. What it costs to walk a tree of a given shape
(`find`, `tar`) is the floor of any pyfuse3 mount of that shape: `scale
--layout dandi` measures it beside the shardfs mount and the plain tree. Like a
`-o ro` shardfs mount it keeps entries, attributes and pages cached (300 s
timeouts, `keep_cache`) and answers `flush` with ENOSYS, so the kernel stops
sending it. Every file holds SIZE bytes "x". Two shapes:

    .venv/bin/python -m benchmarks.floor serve MOUNTPOINT N [--per-dir 100] [COMMON]
    .venv/bin/python -m benchmarks.floor serve MOUNTPOINT [N] --tree 100,100,100
        [--under data/c] [COMMON]
    COMMON: [--noopen] [--size 64] [--counts FILE]
    .venv/bin/python -m benchmarks.floor serve-read SOURCE MOUNTPOINT
    .venv/bin/python -m benchmarks.floor serve-write MOUNTPOINT

runs in the foreground until `fusermount3 -u MOUNTPOINT`, SIGINT or SIGTERM
(mount type `fuse.floor`).

--per-dir  N files in directories of PER_DIR files (`<d>/<f>`, both counted
           from 0; `--per-dir 0`: all in the root); the default shape.
--tree     nested directories of the fan-outs given, the last level files, names
           decimal numbers counted from 0: `--tree 100,100,100` is 100
           directories `<i>` of 100 directories `<i>/<j>` of 100 files
           `<i>/<j>/<k>`, 1,000,000 files (N, if given, at most their product:
           the first N files in that order, as with --per-dir). `--per-dir P`
           is `--tree ceil(N/P),P`.
--under    the tree sits below this chain of directories (`data/c`: the tree
           of a Zarr array `data`'s chunk keys, `data/c/<i>/<j>/<k>`).
--size     bytes per file (default 64).
--noopen   `open` and `opendir` answer ENOSYS: the kernel then stops sending
           open, release, opendir and releasedir for the connection, keeps the
           pages and listings itself, and sends reads and readdirs with fh 0.
           Stock pyfuse3 3.5 hands a handler only that fh, so the daemon could
           not tell files or directories apart; this needs a pyfuse3 patched to
           pass the inode instead (it has `pyfuse3.SHARDFS_INODE_AS_FH`;
           scripts/setup builds it, see patches/README.md), and is refused
           without it. (The kernel still sends the first flush; the floor
           answers it ENOSYS, and then none comes.)
--counts   count the requests each handler gets (a wrapper per handler, which
           costs a little CPU: leave it out of timed runs) and write them as a
           JSON object {handler: count} to FILE at exit and on every SIGUSR1
           (through a temporary file renamed over FILE, so a reader never sees
           half of it).

serve-read  the tree below SOURCE, loaded into memory, served read-only and
            kernel-served as a `-o ro` mount is (ENOSYS to open and opendir, 300 s
            timeouts): the floor of a cold read of a plain copy (`cold_path`, `s3_read`).
serve-write an empty read-write tree in memory, every file a bytearray (1 s timeouts,
            getxattr ENODATA, like a shardfs rw mount): the floor of a write.

Nothing is made per file or per directory by `serve`: inodes are numbered level by level
(1 the root, then the directories of --under, then each level of the tree in
order, the files last), so a handler finds an entry's parent, children and
name by arithmetic, and start-up and memory do not grow with the tree.
"""

from __future__ import annotations

import argparse
import collections
import errno
import itertools
import json
import math
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyfuse3
import trio

#: Entry and attribute timeouts, as a read-only shardfs mount gives them.
TIMEOUT = 300.0
#: The handlers `--counts` counts (all the floor answers).
HANDLERS = (
    "lookup",
    "getattr",
    "forget",
    "opendir",
    "readdir",
    "releasedir",
    "open",
    "read",
    "flush",
    "release",
    "statfs",
)


def inode_fh_supported() -> bool:
    """Whether this pyfuse3 passes the inode to `read` and `readdir` when the kernel sends
    fh 0 (after `open`/`opendir` answered ENOSYS): the patched build, not stock 3.5."""
    return bool(getattr(pyfuse3, "SHARDFS_INODE_AS_FH", False))


def fanouts_for(n: int, per_dir: int) -> tuple[int, ...]:
    """The --tree of `n` files in directories of `per_dir` (0: all in the root)."""
    return (-(-n // per_dir), per_dir) if per_dir else (n,)


class Floor(pyfuse3.Operations):
    """Read-only files of `size` bytes: the first `n` files of a tree of `fanouts`
    (entries per directory, level by level, the last level files) below the chain of
    directories `under` (see the module doc).

    Inodes: 1 the root, 2 ... the directories of `under`, then each level's entries in
    order; entry e of a level, in directory d of the level above, is d's child e % fanout.
    """

    def __init__(
        self,
        fanouts: tuple[int, ...],
        n: int,
        size: int,
        noopen: bool,
        under: tuple[bytes, ...] = (),
    ) -> None:
        super().__init__()
        counts = [n]  # entries per level, the files last
        for fanout in reversed(fanouts[1:]):
            counts.insert(0, -(-counts[0] // fanout))
        if counts[0] > fanouts[0]:
            raise ValueError(f"{n} files do not fit a tree of {fanouts}")
        self.levels: list[range] = []  # each level's inodes
        for count in counts:
            start = self.levels[-1].stop if self.levels else 2 + len(under)
            self.levels.append(range(start, start + count))
        #: per level of directories: its inodes, the level below's, and its fan-out
        self.dirs = list(zip(self.levels, self.levels[1:], fanouts[1:], strict=False))
        self.under = under
        self.n = n
        self.data = b"x" * size
        self.first_file = self.levels[-1].start
        self.noopen = noopen
        self.uid, self.gid = os.getuid(), os.getgid()

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = ino
        entry.entry_timeout = entry.attr_timeout = TIMEOUT
        entry.st_uid, entry.st_gid = self.uid, self.gid
        if ino < self.first_file:
            entry.st_mode = stat.S_IFDIR | 0o555
            entry.st_nlink = 2
        else:
            entry.st_mode = stat.S_IFREG | 0o444
            entry.st_nlink = 1
            entry.st_size = len(self.data)
            entry.st_blocks = -(-len(self.data) // 512)
        return entry

    def _children(self, ino: int) -> range:
        """The inodes in directory `ino`, in listing order."""
        if ino < self.levels[0].start:  # the root or a directory of `under`
            return range(ino + 1, ino + 2) if ino <= len(self.under) else self.levels[0]
        for level, below, fanout in self.dirs:
            if ino in level:
                start = below.start + (ino - level.start) * fanout
                return range(start, min(start + fanout, below.stop))
        raise pyfuse3.FUSEError(errno.ENOTDIR)

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        children = self._children(parent_inode)
        if parent_inode <= len(self.under):  # its one child has a name of `under`
            if name != self.under[parent_inode - 1]:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(children[0])
        try:
            i = int(name)
        except ValueError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        if not 0 <= i < len(children) or name != str(i).encode():
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(children[i])

    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        if inode >= self.first_file + self.n:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        pass

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if self.noopen:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        return inode  # readdir gets the inode either way (see --noopen); never fh 0

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        children = self._children(fh)
        under = self.under[fh - 1] if fh <= len(self.under) else None
        for position in range(start_id, len(children)):
            ino = children[position]
            name = under or str(position).encode()
            if not pyfuse3.readdir_reply(token, name, self._attr(ino), position + 1):
                return

    async def releasedir(self, fh: int) -> None:
        pass

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if self.noopen:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True, direct_io=False)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return self.data[off : off + size]

    async def flush(self, fh: int) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel stops sending flushes

    async def release(self, fh: int) -> None:
        pass

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_namemax = 255
        return data


def counting(ops: Floor, counts: collections.Counter[str]) -> None:
    """Wrap each handler of `ops` (on the instance) so that it counts its calls."""

    def wrap(name: str, handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any) -> Any:
            counts[name] += 1
            return await handler(*args)

        return counted

    for name in HANDLERS:
        setattr(ops, name, wrap(name, getattr(ops, name)))


def write_counts(path: str, counts: collections.Counter[str]) -> None:
    """`counts` as JSON at `path`, replaced atomically."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(dict(sorted(counts.items())), f)
    os.replace(temporary, path)


def serve(
    mountpoint: str,
    n: int | None,
    noopen: bool = False,
    *,
    size: int = 64,
    per_dir: int = 100,
    tree: tuple[int, ...] | None = None,
    under: str = "",
    counts: str | None = None,
) -> None:
    """Mount the floor at `mountpoint` and serve it until it is unmounted (or SIGINT/SIGTERM,
    which unmount too): `n` files in directories of `per_dir`, or with `tree` the first `n`
    (None: all) of that tree, below the directories `under` (`a/b`); with `counts`, write
    the request counts there (see the module doc)."""
    if noopen and not inode_fh_supported():
        raise RuntimeError(
            "--noopen needs a pyfuse3 that passes the inode as fh when the kernel sends "
            "fh 0 (pyfuse3.SHARDFS_INODE_AS_FH, see patches/README.md); pyfuse3 "
            f"{pyfuse3.__version__} at {pyfuse3.__file__} is not patched"
        )
    fanouts = tree or fanouts_for(n or 0, per_dir)
    n = math.prod(fanouts) if n is None else n
    ops = Floor(fanouts, n, size, noopen, tuple(os.fsencode(d) for d in under.split("/") if d))
    counter: collections.Counter[str] = collections.Counter()
    if counts is not None:
        counting(ops, counter)
    pyfuse3.init(ops, mountpoint, {"fsname=floor", "subtype=floor", "ro", "default_permissions"})

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def signals() -> None:
                with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGINT, signal.SIGTERM) as s:
                    async for signum in s:
                        if signum == signal.SIGUSR1:
                            if counts is not None:
                                write_counts(counts, counter)
                        else:  # unmount; pyfuse3.main returns once the kernel lets go
                            pyfuse3.terminate()

            nursery.start_soon(signals)
            print("ready", flush=True)
            await pyfuse3.main(min_tasks=2, max_tasks=16)  # as shardfs's daemon runs it
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)
        if counts is not None:
            write_counts(counts, counter)


def serve_read(source: str, mountpoint: str) -> None:
    """The tree below `source`, loaded into memory, served read-only and kernel-served."""
    nodes: dict[int, bytes | None] = {1: None}  # None: a directory
    children: dict[int, dict[bytes, int]] = {1: {}}
    inode_of = {"": 1}
    for top, dirs, files in os.walk(source):
        rel = os.path.relpath(top, source).removeprefix(".")
        for name in sorted(dirs):
            ino = inode_of[os.path.join(rel, name)] = len(nodes) + 1
            nodes[ino], children[ino] = None, {}
            children[inode_of[rel]][name.encode()] = ino
        for name in sorted(files):
            ino = len(nodes) + 1
            nodes[ino] = Path(top, name).read_bytes()
            children[inode_of[rel]][name.encode()] = ino

    class Operations(pyfuse3.Operations):
        def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
            data = nodes[ino]
            entry = _entry(ino, None if data is None else len(data), 300, 0o555)
            entry.st_blksize = 65536
            entry.st_blocks = -(-entry.st_size // 512)
            return entry

        async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
            return self._attr(inode)

        async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> Any:
            ino = children.get(parent, {}).get(name)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(ino)

        async def opendir(self, inode: int, ctx: Any) -> int:
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def readdir(self, fh: int, start: int, token: Any) -> None:
            _reply_entries(children[fh], start, token, self._attr)

        async def open(self, inode: int, flags: int, ctx: Any) -> Any:
            raise pyfuse3.FUSEError(errno.ENOSYS)

        async def read(self, fh: int, off: int, size: int) -> bytes:
            return nodes[fh][off : off + size]  # type: ignore[index]

        async def flush(self, fh: int) -> None:
            raise pyfuse3.FUSEError(errno.ENOSYS)

    _serve(Operations(), mountpoint, {"fsname=floor-read", "subtype=floor", "ro"})


def serve_write(mountpoint: str) -> None:
    """An empty read-write tree in memory; every file a bytearray."""
    dirs: dict[int, dict[bytes, int]] = {1: {}}
    files: dict[int, bytearray] = {}
    handles: dict[int, int] = {}
    numbers, fhs = itertools.count(2), itertools.count(1)

    class Operations(pyfuse3.Operations):
        def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
            size = None if ino in dirs else len(files[ino])
            entry = _entry(ino, size, 1.0, 0o755)
            entry.st_uid, entry.st_gid = os.getuid(), os.getgid()
            return entry

        async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
            return self._attr(inode)

        async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> Any:
            ino = dirs[parent].get(name)
            if ino is None:
                entry = pyfuse3.EntryAttributes()
                entry.st_ino, entry.entry_timeout = 0, 1.0
                return entry
            return self._attr(ino)

        async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
            if fields.update_size:
                del files[inode][attr.st_size :]
                files[inode].extend(bytes(attr.st_size - len(files[inode])))
            return self._attr(inode)

        async def mkdir(self, parent: int, name: bytes, mode: int, ctx: Any) -> Any:
            ino = dirs[parent][name] = next(numbers)
            dirs[ino] = {}
            return self._attr(ino)

        async def create(self, parent: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
            ino = dirs[parent][name] = next(numbers)
            files[ino] = bytearray()
            fh = next(fhs)
            handles[fh] = ino
            return pyfuse3.FileInfo(fh=fh), self._attr(ino)

        async def open(self, inode: int, flags: int, ctx: Any) -> Any:
            if flags & os.O_TRUNC:
                files[inode].clear()
            fh = next(fhs)
            handles[fh] = inode
            return pyfuse3.FileInfo(fh=fh)

        async def read(self, fh: int, off: int, size: int) -> bytes:
            return bytes(files[handles[fh]][off : off + size])

        async def write(self, fh: int, off: int, buf: bytes) -> int:
            data = files[handles[fh]]
            data.extend(bytes(max(0, off - len(data))))
            data[off : off + len(buf)] = buf
            return len(buf)

        async def flush(self, fh: int) -> None:
            pass

        async def release(self, fh: int) -> None:
            handles.pop(fh, None)

        async def rename(
            self, p0: int, n0: bytes, p1: int, n1: bytes, flags: int, ctx: Any
        ) -> None:
            dirs[p1][n1] = dirs[p0].pop(n0)

        async def unlink(self, parent: int, name: bytes, ctx: Any) -> None:
            dirs[parent].pop(name, None)

        async def rmdir(self, parent: int, name: bytes, ctx: Any) -> None:
            dirs[parent].pop(name, None)

        async def opendir(self, inode: int, ctx: Any) -> int:
            return inode

        async def readdir(self, fh: int, start: int, token: Any) -> None:
            _reply_entries(dirs[fh], start, token, self._attr)

        async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
            raise pyfuse3.FUSEError(errno.ENODATA)

        async def statfs(self, ctx: Any) -> Any:
            data = pyfuse3.StatvfsData()
            data.f_bsize = data.f_frsize = 65536
            data.f_namemax = 255
            data.f_blocks = data.f_bfree = data.f_bavail = 1 << 30
            return data

    _serve(Operations(), mountpoint, {"fsname=floor-write", "subtype=floor"})


def _entry(ino: int, size: int | None, timeout: float, mode: int) -> Any:
    """A floor's attributes: a directory (`size` None) of `mode`, or a file of `size` bytes
    without the execute bits."""
    entry = pyfuse3.EntryAttributes()
    entry.st_ino = ino
    entry.entry_timeout = entry.attr_timeout = timeout
    if size is None:
        entry.st_mode, entry.st_nlink = stat.S_IFDIR | mode, 2
    else:
        entry.st_mode, entry.st_nlink = stat.S_IFREG | (mode & 0o666), 1
        entry.st_size = size
    return entry


def _reply_entries(entries: dict[bytes, int], start: int, token: Any, attr: Any) -> None:
    """A floor's readdir: the entries of a directory from position `start`, as many as fit."""
    items = list(entries.items())
    for i in range(start, len(items)):
        if not pyfuse3.readdir_reply(token, items[i][0], attr(items[i][1]), i + 1):
            return


def _serve(operations: Any, mountpoint: str, options: set[str]) -> None:
    pyfuse3.init(operations, mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


def fanouts(text: str) -> tuple[int, ...]:
    """--tree: positive integers separated by commas."""
    levels = tuple(int(level) for level in text.split(","))
    if not all(level > 0 for level in levels):
        raise ValueError(text)
    return levels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("serve", help="mount and serve in the foreground")
    command.add_argument("mountpoint")
    command.add_argument("n", type=int, nargs="?", help="number of files (--tree: all of it)")
    command.add_argument("--noopen", action="store_true", help="open/opendir answer ENOSYS")
    command.add_argument("--size", type=int, default=64, help="bytes per file (default 64)")
    command.add_argument(
        "--per-dir", type=int, help="files per directory (0: all in the root; default 100)"
    )
    command.add_argument(
        "--tree", type=fanouts, help="entries per directory, level by level (e.g. 100,100,100)"
    )
    command.add_argument("--under", default="", help="the tree's parent directories (data/c)")
    command.add_argument("--counts", help="write request counts as JSON here")
    read = commands.add_parser("serve-read", help="a tree from memory, read-only")
    read.add_argument("source")
    read.add_argument("mountpoint")
    write = commands.add_parser("serve-write", help="an empty read-write tree in memory")
    write.add_argument("mountpoint")
    args = parser.parse_args()
    if args.command == "serve-read":
        serve_read(args.source, args.mountpoint)
        return 0
    if args.command == "serve-write":
        serve_write(args.mountpoint)
        return 0
    if args.tree is None and args.n is None:
        parser.error("N is needed without --tree")
    if args.tree is not None and args.per_dir is not None:
        parser.error("--tree and --per-dir exclude each other")
    if args.tree is not None and args.n is not None and args.n > math.prod(args.tree):
        tree = ",".join(map(str, args.tree))
        parser.error(f"--tree {tree} holds {math.prod(args.tree)} files, not N = {args.n}")
    if (args.n is not None and args.n < 1) or args.size < 0 or (args.per_dir or 0) < 0:
        parser.error("N must be positive, --size and --per-dir not negative")
    try:
        serve(
            args.mountpoint,
            args.n,
            args.noopen,
            size=args.size,
            per_dir=100 if args.per_dir is None else args.per_dir,
            tree=args.tree,
            under=args.under,
            counts=args.counts,
        )
    except RuntimeError as e:
        print(f"floor: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
