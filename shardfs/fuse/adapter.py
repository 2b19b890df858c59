"""The pyfuse3 adapter: translates kernel requests into `Namespace` calls.

This is the only place that knows about FUSE. Every handler runs its core
call first on the event loop in non-blocking mode and, if that would wait for
I/O, again in a worker thread (see `shardfs.storage.blocking`); it turns core
exceptions into errno values in `_errors`, so no exception can end the main
loop.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio

from shardfs.errors import (
    CorruptData,
    IsADirectory,
    NotADirectory,
    NotFound,
    ReadOnly,
    ShardfsError,
)
from shardfs.fuse.inodes import InodeTable
from shardfs.storage.blocking import WouldBlock, nonblocking
from shardfs.view import Attr, Namespace, Node, Reader

log = logging.getLogger("shardfs")

P = ParamSpec("P")
T = TypeVar("T")

_ERRNO: list[tuple[type[ShardfsError], int]] = [
    (NotFound, errno.ENOENT),
    (NotADirectory, errno.ENOTDIR),
    (IsADirectory, errno.EISDIR),
    (ReadOnly, errno.EROFS),
]

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def errno_for(error: ShardfsError) -> int:
    """The errno a FUSE client sees for a core error; everything unexpected is EIO."""
    for cls, code in _ERRNO:
        if isinstance(error, cls):
            return code
    return errno.EIO


def _errors(handler: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Map exceptions to FUSEError at the boundary, logging what the user must see."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s%r", handler.__name__, args[1:])
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except ShardfsError as e:
            code = errno_for(e)
            if code == errno.EIO and not (isinstance(e, CorruptData) and e.logged):
                log.error("%s: %s", handler.__name__, e)
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            log.exception("%s%r failed unexpectedly", handler.__name__, args[1:])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


@dataclass(frozen=True)
class MountConfig:
    """How the adapter answers the kernel. `read_only` mounts let the kernel cache long."""

    read_only: bool = True
    timeout: float = 300.0
    workers: int = 16

    @property
    def cache_timeout(self) -> float:
        return self.timeout if self.read_only else 1.0


class Operations(pyfuse3.Operations):
    """A read-only FUSE file system over a `Namespace`."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, namespace: Namespace, config: MountConfig) -> None:
        super().__init__()
        self.ns = namespace
        self.config = config
        self.inodes = InodeTable(namespace.root())
        self._limiter = trio.CapacityLimiter(config.workers)
        self._handles: dict[int, Reader] = {}
        self._listings: dict[int, list[tuple[str, Node, Attr]]] = {}
        self._next_fh = itertools.count(1)
        self._uid, self._gid = os.getuid(), os.getgid()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a core call inline if it needs no waiting I/O, else in a worker thread."""
        try:
            with nonblocking():
                return fn(*args)
        except WouldBlock:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _node(self, ino: int) -> Node:
        try:
            return self.inodes.node(ino)
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _entry(self, ino: int, attr: Attr) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = ino
        entry.generation = 0
        entry.entry_timeout = self.config.cache_timeout
        entry.attr_timeout = self.config.cache_timeout
        if attr.is_dir:
            entry.st_mode = stat.S_IFDIR | (0o555 if self.config.read_only else 0o755)
            entry.st_nlink = 2
        else:
            entry.st_mode = stat.S_IFREG | (0o444 if self.config.read_only else 0o644)
            entry.st_nlink = 1
        entry.st_size = attr.size
        entry.st_blksize = 65536
        entry.st_blocks = -(-attr.size // 512)
        entry.st_uid, entry.st_gid = self._uid, self._gid
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = attr.mtime_ns
        return entry

    def _lookup_sync(self, parent: Node, name: str) -> tuple[Node, Attr]:
        node = self.ns.lookup(parent, name)
        return node, self.ns.attr(node)

    # -- namespace ----------------------------------------------------------------

    @_errors
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if text == ".":
            node, attr = parent, await self._run(self.ns.attr, parent)
        elif text == "..":
            node = await self._run(self.ns.resolve, parent.path.rpartition("/")[0])
            attr = await self._run(self.ns.attr, node)
        else:
            node, attr = await self._run(self._lookup_sync, parent, text)
        ino = self.inodes.assign(node)
        self.inodes.ref(ino)
        return self._entry(ino, attr)

    @_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(inode, await self._run(self.ns.attr, self._node(inode)))

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)

    @_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        # The listing is taken once per opendir, so offsets stay stable while it is read.
        listing = await self._run(self.ns.listdir, self._node(inode))
        fh = next(self._next_fh)
        self._listings[fh] = listing
        return fh

    @_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        listing = self._listings[fh]
        for position in range(start_id, len(listing)):
            name, node, attr = listing[position]
            ino = self.inodes.assign(node)
            if not pyfuse3.readdir_reply(
                token, os.fsencode(name), self._entry(ino, attr), position + 1
            ):
                self.inodes.drop_unreferenced(ino)
                break
            self.inodes.ref(ino)

    async def releasedir(self, fh: int) -> None:
        self._listings.pop(fh, None)

    @_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 65536
        data.f_namemax = 255
        return data

    # -- data ---------------------------------------------------------------------

    @_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & _WRITE_FLAGS:
            raise ReadOnly("this mount does not accept writes yet")
        reader = await self._run(self.ns.open, self._node(inode))
        fh = next(self._next_fh)
        self._handles[fh] = reader
        # Data of an unchanged read-only source may stay in the page cache across opens.
        return pyfuse3.FileInfo(fh=fh, keep_cache=self.config.read_only, direct_io=False)

    @_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await self._run(self._handles[fh].read, off, size)

    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)

    # -- writes: refused until write-back lands --------------------------------------

    async def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = rename = link = symlink = create = _refuse
    setxattr = removexattr = _refuse
