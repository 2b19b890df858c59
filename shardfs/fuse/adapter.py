"""The pyfuse3 adapter: translates kernel requests into calls of a view (`ViewInterface`).

This is the only place that knows about FUSE. Every handler runs its core
call first on the event loop in non-blocking mode and, if that would wait for
I/O, again in a worker thread (see `shardfs.primitives.blocking`); it turns core
exceptions into errno values in `_errors`, so no exception can end the main
loop.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Hashable, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import numpy as np
import pyfuse3

from shardfs.checksum.digests import ChunkDigests
from shardfs.fuse.calls import Caller
from shardfs.fuse.inodes import InodeTable, Slot
from shardfs.fuse.kernel_served.serving import KernelServing
from shardfs.fuse.owners import Owners
from shardfs.primitives.errors import (
    AlreadyExists,
    AttributesFixed,
    BadHandle,
    CannotMove,
    InvalidRequest,
    InvalidWrite,
    IsADirectory,
    MissingChunk,
    NoAttribute,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
    ReadOnly,
    ShardfsError,
    StorageError,
    Unimplemented,
)
from shardfs.storage.base import Access, Stat
from shardfs.view import Attr, Node, Role
from shardfs.view.interface import OpenFile, ViewInterface, Writes
from shardfs.view.nodes import ChunkRun, Listing

if TYPE_CHECKING:
    from shardfs.fuse.metrics import Latency

log = logging.getLogger("shardfs")
#: How `os.fsdecode` decodes a name
_FS_ENCODING = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())

P = ParamSpec("P")
T = TypeVar("T")

_ERRNO: list[tuple[type[ShardfsError], int]] = [
    (NotFound, errno.ENOENT),
    (NotADirectory, errno.ENOTDIR),
    (IsADirectory, errno.EISDIR),
    (ReadOnly, errno.EROFS),
    (AlreadyExists, errno.EEXIST),
    (NotEmpty, errno.ENOTEMPTY),
    (CannotMove, errno.EXDEV),
    (InvalidWrite, errno.EINVAL),
    (NotPermitted, errno.EPERM),
    (Unimplemented, errno.ENOSYS),
    (BadHandle, errno.EBADF),
    (InvalidRequest, errno.EINVAL),
    (NoAttribute, errno.ENODATA),
    (AttributesFixed, errno.ENOTSUP),
]

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT
#: Chunks of a listing made ready for replies at a time (a readdirplus reply holds fewer).
WINDOW = 4096
#: The extended attribute holding a chunk file's md5 (hex), for checksum tools.
MD5_XATTR = b"user.md5"


@dataclass
class _Window:
    """Rows [start, stop) of a run of chunk files, made ready for readdirplus replies: a
    listing is read over many requests, and preparing rows a window at a time keeps the
    per-row work in one bare loop."""

    run: ChunkRun
    start: int
    stop: int
    names: list[bytes]
    #: derived inode numbers, or None if the table must count these (see InodeTable)
    inos: list[int] | None
    sizes: list[int]
    blocks: list[int]
    mtimes: list[int]
    accesses: list[Access | None]
    #: the slots those numbers are made from (see `InodeTable.holds`), and the stretches
    #: of rows of each (start, stop, slot number), whose counts of the kernel's references
    #: a reply adds to (rows are in grid order: a stretch per shard, in a chunk directory)
    slots: dict[int, Slot]
    stretches: list[tuple[int, int, int]]

    @classmethod
    def of(cls, run: ChunkRun, row: int, inodes: InodeTable) -> _Window:
        stop = min(row + WINDOW, len(run))
        sizes = run.sizes[row:stop]
        inos = inodes.run_inodes(run, row, stop)
        shard_slots = inodes.run_slots(run) if inos is not None else []
        stretches = []
        if shard_slots:
            shards = run.shard[row:stop]
            cuts = [0, *(np.flatnonzero(shards[1:] != shards[:-1]) + 1).tolist(), len(shards)]
            firsts = shards[cuts[:-1]].tolist()
            stretches = [
                (a, b, shard_slots[k][0]) for a, b, k in zip(cuts, cuts[1:], firsts, strict=False)
            ]
        return cls(
            run,
            row,
            stop,
            [name.encode() for name in run.names(row, stop)],
            inos,
            sizes.tolist(),
            ((sizes + 511) // 512).tolist(),
            run.mtimes(row, stop),
            run.accesses(row, stop),
            dict(shard_slots),
            stretches,
        )


def _send(
    token: pyfuse3.ReaddirToken,
    entry: pyfuse3.EntryAttributes,
    position: int,
    rows: Iterable[tuple[bytes, int, int, int, int, Access | None]],
    owners: Owners,
) -> int:
    """Add chunk files (name, inode, size, blocks, mtime, access) to a readdirplus reply,
    `entry` holding what they share; how many fit. A listing of a million files spends
    its time in this loop: keep it bare."""
    reply = pyfuse3.readdir_reply
    last = -1
    shown: object = entry  # no access: the first row sets its owner
    sent = 0
    for name, ino, size, nblocks, mtime, access in rows:
        entry.st_ino = ino
        entry.st_size = size
        entry.st_blocks = nblocks
        if mtime != last:
            entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = last = mtime
        if access is not shown:
            entry.st_mode, entry.st_uid, entry.st_gid = owners.of(False, shown := access)
        if not reply(token, name, entry, position + sent + 1):
            break
        sent += 1
    return sent


def _source(node: Node, attr: Attr, seen: dict[str, Stat | None] | None) -> tuple[str, Stat] | None:
    """The object (key, and its version as shown) that the bytes of a file come from, where
    it is one: a chunk's shard, a passed-through file (`seen` is what the reply was made
    from). What a kernel-served mount numbers a file's versions by (`InodeTable`)."""
    if attr.shard is not None or seen is None or node.role is not Role.FILE:
        return attr.shard
    key = node.source or node.path
    stat = seen.get(key)
    return None if stat is None or stat.is_dir else (key, stat)


def errno_for(error: ShardfsError) -> int:
    """The errno a FUSE client sees for a core error; everything unexpected is EIO."""
    for cls, code in _ERRNO:
        if isinstance(error, cls):
            return code
    return errno.EIO


def _errors(handler: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Count a request and map its exceptions to FUSEError at the boundary (`_fuse_error`).
    The two handlers every chunk file costs, `lookup` and `read`, do the same inline: a
    coroutine less per request (see docs/design.md)."""

    name = handler.__name__

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:  # (pyfuse3 passes no kwargs)
        ops = args[0]
        ops.requests[name] += 1  # type: ignore[attr-defined]
        if ops.debug:  # type: ignore[attr-defined]
            log.debug("%s%r", name, args[1:])
        start = perf_counter_ns()
        try:
            return await handler(*args, **kwargs)
        except Exception as e:
            raise _fuse_error(ops, name, args[1:], e) from None
        finally:
            if ops.latency is not None:  # type: ignore[attr-defined]
                ops.latency.observe(name, start)  # type: ignore[attr-defined]

    return wrapper


def _fuse_error(ops: Any, name: str, args: tuple[Any, ...], e: Exception) -> pyfuse3.FUSEError:
    """The FUSEError for what handler `name` raised, logging what the user must see and
    counting it. Called in the handler's `except` block (an unexpected error is logged
    with its traceback)."""
    if isinstance(e, ShardfsError):
        code = errno_for(e)
        if code != errno.ENOSYS:  # kernel-served mounts answer it on purpose
            ops.errors[errno.errorcode.get(code, str(code))] += 1
        if code in (errno.EIO, errno.EINVAL) and not e.logged:
            log.error("%s: %s", name, e)
        return pyfuse3.FUSEError(code)
    ops.errors["EIO"] += 1
    log.exception("%s%r failed unexpectedly", name, args)
    return pyfuse3.FUSEError(errno.EIO)


#: Whether this pyfuse3 hands read and readdir the inode when the kernel sends fh 0 (the
#: patch in patches/, which scripts/setup builds): what kernel-served mounts need.
INODE_AS_FH: bool = getattr(pyfuse3, "SHARDFS_INODE_AS_FH", False)


@dataclass(frozen=True)
class MountConfig:
    """How the adapter answers the kernel. `read_only` mounts let the kernel cache long;
    `kernel_served` ones (read-only, with the patched pyfuse3) let the kernel serve
    re-reads and listings without asking (see `Operations.open`)."""

    read_only: bool = True
    timeout: float = 300.0
    workers: int = 16
    #: inodes held by entries (not chunks, which are numbered by position) before the
    #: kernel is asked to forget the oldest
    inodes: int = 100_000
    kernel_served: bool = False
    #: kernel-served mounts: answer hot requests in the native front where it can run
    front: bool = False
    #: the owner and modes every file shows, replacing the source's (see `Owners`)
    uid: int | None = None
    gid: int | None = None
    file_mode: int | None = None
    dir_mode: int | None = None

    @property
    def cache_timeout(self) -> float:
        return self.timeout if self.read_only else 1.0


class Operations(pyfuse3.Operations):
    """The FUSE file system over a view: read-only, or read-write where `view.writes` is.

    Every request runs inline first (see `_run`). Changes to the namespace
    are safe to retry in a thread because the workspace does all their I/O
    before it changes anything.
    """

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, view: ViewInterface, config: MountConfig) -> None:
        super().__init__()
        self.view = view
        self.writes = view.writes
        self.config = config
        self.inodes = InodeTable(view.root(), config.inodes, versioned=config.kernel_served)
        self._timeout = config.cache_timeout  # (a property: asked at every entry)
        caller = Caller(config.workers)
        #: library calls inline where they need not wait, else in a worker thread
        self._run, self._thread = caller.run, caller.thread
        self._handles: dict[int, OpenFile] = {}
        #: the inode of each open file, and the open files of each inode: a file that was
        #: unlinked or renamed over is known by these alone (see `InodeTable.removed`)
        self._inode_of: dict[int, int] = {}
        self._files_of: dict[int, set[int]] = {}
        self._listings: dict[int, Listing] = {}
        self._windows: dict[int, _Window] = {}
        self._owners = Owners(
            config.read_only, config.uid, config.gid, config.file_mode, config.dir_mode
        )
        #: kernel-served mounts: the versions shown and what is served as of them
        self.serving = (
            KernelServing(
                view,
                self.inodes,
                self._owners,
                caller,
                self._windows,
                front=config.front,
                timeout=config.cache_timeout,
            )
            if config.kernel_served
            else None
        )
        #: read-only mounts: the version each inode was last opened on (see `_open_file`)
        self._opened: dict[int, Hashable] = {}
        self._digests: ChunkDigests | None = None
        self._next_fh = itertools.count(1)
        #: FUSE requests by handler, and error replies by errno, for `shardfs stats`
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        #: how long the requests take, while metrics are served (`shardfs.fuse.metrics`)
        self.latency: Latency | None = None
        #: whether each request is logged (as configured when the mount starts)
        self.debug = log.isEnabledFor(logging.DEBUG)
        self.started = time.time()

    def stats(self) -> dict[str, Any]:
        """Everything `shardfs stats` shows: the view's figures, the kernel's requests, and
        those the native front answered."""
        fuse: dict[str, Any] = {
            "requests": dict(sorted(self.requests.items())),
            "errors": dict(sorted(self.errors.items())),
        }
        if self.serving is not None:
            fuse.update(self.serving.stats())
        return {"uptime": time.time() - self.started, "fuse": fuse, **self.view.stats()}

    def _node(self, ino: int) -> Node:
        return self.inodes.found(ino)

    def _writable(self) -> Writes:
        if self.writes is None:
            raise ReadOnly("this mount is read-only")
        return self.writes

    def _entry(self, ino: int, attr: Attr, removed: bool = False) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = ino
        entry.generation = 0
        entry.entry_timeout = entry.attr_timeout = self._timeout
        entry.st_mode, entry.st_uid, entry.st_gid = self._owners.of(attr.is_dir, attr.access)
        entry.st_nlink = 2 if attr.is_dir else 0 if removed else 1
        entry.st_size = attr.size
        entry.st_blksize = 65536
        entry.st_blocks = -(-attr.size // 512)
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = attr.mtime_ns
        return entry

    def _reply(
        self, node: Node, attr: Attr, seen: dict[str, Stat | None] | None = None
    ) -> pyfuse3.EntryAttributes:
        """The entry of a node the kernel now holds one more reference to; `seen`, the
        versions its attributes come from, is recorded as shown (kernel-served mounts)."""
        ino = self.inodes.assign(node, _source(node, attr, seen))
        self.inodes.ref(ino)
        self._keep_budget()
        if seen is not None and self.serving is not None:
            attr = self.serving.shown(ino, attr, seen)
        return self._entry(ino, attr)

    async def _recorded(
        self, fn: Callable[..., T], *args: Any
    ) -> tuple[T, dict[str, Stat | None] | None]:
        """`fn(*args)` through `_run`, with the versions of the source it consulted if the
        kernel is to be shown its result (kernel-served mounts), else None."""
        if self.serving is None:
            return await self._run(fn, *args), None
        return await self._run(self.serving.recording, fn, *args)

    def _keep_budget(self) -> None:
        """Ask the kernel to forget the oldest inodes beyond the table's budget (its
        forgets shrink the table). Asynchronous: never wait on the kernel in a handler."""
        if self.inodes.full():
            held: set[int] = set()
            for window in self._windows.values():
                held.update(window.slots)
            self.inodes.sweep(held)
        names = self.inodes.over_budget()
        if names:
            log.debug("asking the kernel to forget %d of %d inodes", len(names), len(self.inodes))
        for parent, name in names:
            pyfuse3.invalidate_entry_async(parent, os.fsencode(name), ignore_enoent=True)

    # -- namespace ----------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1  # `_errors`, inline
        if self.debug:
            log.debug("lookup%r", (parent_inode, name, ctx))
        start = perf_counter_ns()
        try:
            text = name.decode(*_FS_ENCODING)  # as os.fsdecode, with no Python frame
            serving = self.serving
            if serving is not None:
                # A directory of chunk files looked in before: the chunk's entry with none
                # of the layers (`KernelServing.lookup_prepared`).
                try:
                    found = await serving.lookup_prepared(parent_inode, text)
                except MissingChunk:
                    return self._absent()
                if found is not None:
                    return self._entry(*found)
            parent = self._node(parent_inode)
            if text == ".":
                node, attr = parent, await self._run(self.view.attr, parent)
            elif text == "..":
                node = await self._run(self.view.resolve, parent.path.rpartition("/")[0])
                attr = await self._run(self.view.attr, node)
            else:
                try:
                    (node, attr), seen = await self._recorded(self.view.entry, parent, text)
                except MissingChunk:
                    return self._absent()
                if seen is not None and node.role is Role.CHUNK and serving is not None:
                    serving.prepare(parent_inode, parent, node)
                    entry = self._reply(node, attr, seen)
                    serving.first_to_front(parent_inode, text)
                    return entry
                return self._reply(node, attr, seen)
            return self._reply(node, attr)
        except Exception as e:
            raise _fuse_error(self, "lookup", (parent_inode, name, ctx), e) from None
        finally:
            if self.latency is not None:
                self.latency.observe("lookup", start)

    def _absent(self) -> pyfuse3.EntryAttributes:
        """A negative entry: the kernel remembers that the name does not exist for as
        long as it remembers entries, so a reader of a sparse array asks once per missing
        chunk. (A rename's target, an `O_EXCL` create and `mkdir` look their name up
        again whatever the kernel remembers.)"""
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = 0
        entry.entry_timeout = self.config.cache_timeout
        return entry

    @_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if self.inodes.removed(inode):
            return self._entry(inode, self._open_file_of(inode).attr(), removed=True)
        if self.serving is not None:
            return self._entry(inode, await self.serving.attr(inode))
        return self._entry(inode, await self._run(self.view.attr, self._node(inode)))

    def _open_file_of(self, inode: int) -> OpenFile:
        """An open file of `inode`, a writable one if there is; ENOENT if none is open."""
        files = [self._handles[fh] for fh in self._files_of.get(inode, ())]
        if not files:
            raise NotFound(f"inode {inode}: removed, and not open")
        return next((f for f in files if f.buffered), files[0])

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)
            self._opened.pop(ino, None)
            if self.serving is not None:
                self.serving.forget(ino)

    @_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if self.config.kernel_served:
            # The kernel then caches listings itself and sends readdir with the inode.
            raise Unimplemented("opendir: the kernel keeps listings")
        # The listing is taken once per opendir, so offsets stay stable while it is read.
        listing = await self._run(self.view.listing, self._node(inode))
        fh = next(self._next_fh)
        self._listings[fh] = listing
        return fh

    @_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # readdirplus: every entry carries its attributes, so one listing fills the
        # kernel's entry and attribute caches (no lookup or getattr per file after it).
        serving = self.serving
        if serving is not None:
            listing, seen = await serving.listing(fh, start_id)
        else:
            listing, seen = self._listings[fh], None
        for position in range(start_id, len(listing.entries)):
            name, node, attr = listing.entries[position]
            ino = self.inodes.assign(node, _source(node, attr, seen))
            if serving is not None:
                attr = serving.as_read(ino, attr)
            if not pyfuse3.readdir_reply(
                token, os.fsencode(name), self._entry(ino, attr), position + 1
            ):
                self.inodes.drop_unreferenced(ino)
                return
            self.inodes.ref(ino)
            if serving is not None:
                serving.list_ahead(ino, node)
        for position, run, row in listing.chunks(start_id):
            if not self._reply_chunks(fh, token, run, row, position):
                break
        self._keep_budget()

    def _reply_chunks(
        self, fh: int, token: pyfuse3.ReaddirToken, run: ChunkRun, row: int, position: int
    ) -> bool:
        """Reply with the chunks of `run` from `row` on (at `position`); whether all of
        them fit. Their inode numbers are derived from their positions unless the table
        must count them (see `InodeTable`)."""
        entry = self._entry(0, Attr(False, 0, 0))
        while row < len(run):
            window = self._windows.get(fh)
            if (
                window is None
                or window.run is not run
                or not window.start <= row < window.stop
                or not self.inodes.holds(window.slots)
            ):
                window = self._windows[fh] = _Window.of(run, row, self.inodes)
                if self.serving is not None and window.inos is not None:  # the front's reads
                    self.serving.fill_listed(
                        fh, run, window.names, window.start, window.stop,
                        position - (row - window.start),
                    )  # fmt: skip
            i = row - window.start
            stop = min(window.stop - window.start, i + 1024)
            if window.inos is None:  # counted: entries, referenced once sent
                first = window.start + i
                nodes = [run.node(k, n.decode()) for k, n in enumerate(window.names[i:stop], first)]
                inos = [self.inodes.assign(node) for node in nodes]
            else:
                inos = window.inos[i:stop]
            rows = zip(
                window.names[i:stop],
                inos,
                window.sizes[i:stop],
                window.blocks[i:stop],
                window.mtimes[i:stop],
                window.accesses[i:stop],
                strict=True,
            )
            sent = _send(token, entry, position, rows, self._owners)
            if window.inos is None:
                for k, ino in enumerate(inos):
                    (self.inodes.ref if k < sent else self.inodes.drop_unreferenced)(ino)
            else:
                for a, b, slot in window.stretches:  # `InodeTable.ref`, per stretch of a slot
                    if a < i + sent and b > i:
                        self.inodes.ref_slot(slot, min(b, i + sent) - max(a, i))
            row, position = row + sent, position + sent
            if sent < stop - i:
                return False
        return True

    async def releasedir(self, fh: int) -> None:
        self._listings.pop(fh, None)
        self._windows.pop(fh, None)

    @_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 65536
        data.f_namemax = 255
        return data

    # -- data ---------------------------------------------------------------------

    def _open_file(
        self, inode: int, handle: OpenFile, version: Hashable = None
    ) -> pyfuse3.FileInfo:
        fh = next(self._next_fh)
        self._handles[fh] = handle
        self._inode_of[fh] = inode
        self._files_of.setdefault(inode, set()).add(fh)
        # Data of an unchanged read-only source may stay in the page cache across opens;
        # an open of another version than the last one has the kernel drop what it kept.
        keep = self.config.read_only
        if version is not None:
            keep = keep and self._opened.get(inode, version) == version
            if not keep:
                # The size it holds may be another version's too: have it ask again (the
                # attributes alone take no lock an open holds, so this is safe here).
                with contextlib.suppress(OSError):
                    pyfuse3.invalidate_inode(inode, attr_only=True)
            self._opened[inode] = version
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep, direct_io=False)

    @_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if self.config.kernel_served:
            # No open and release from now on: the kernel keeps file pages across opens
            # and sends reads with the inode (see `read`). Writes are refused by
            # the mount itself (`ro`).
            raise Unimplemented("open: the kernel serves re-reads")
        if self.inodes.removed(inode):
            # Opened again through /proc/PID/fd: the same file, not the one at its old path.
            handle = self._open_file_of(inode)
            if handle.buffered:
                handle = await self._run(self._writable().reopen, handle, flags)
            elif flags & _WRITE_FLAGS:
                raise NotFound(f"inode {inode}: removed; its open files are readers")
            return self._open_file(inode, handle)
        node = self._node(inode)
        if self.writes is None:
            if flags & _WRITE_FLAGS:
                raise ReadOnly("this mount is read-only")
            reader = await self._run(self.view.open, node)
            return self._open_file(inode, reader, reader.version)
        return self._open_file(inode, await self._run(self.writes.open, node, flags))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        """A read of an open file; on a kernel-served mount, of inode `fh`, as of the
        kernel's latest show of it (`KernelServing.read`). (One handler for both, with
        `_errors` inline: a coroutine less per chunk file.)"""
        self.requests["read"] += 1  # `_errors`, inline
        if self.debug:
            log.debug("read%r", (fh, off, size))
        start = perf_counter_ns()
        try:
            if self.serving is None:
                return await self._run(self._handles[fh].read, off, size)
            return await self.serving.read(fh, off, size)
        except Exception as e:
            raise _fuse_error(self, "read", (fh, off, size), e) from None
        finally:
            if self.latency is not None:
                self.latency.observe("read", start)

    @_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handles[fh]
        if not handle.buffered:
            raise BadHandle("a write to a file opened for reading")
        return await self._run(self._writable().write, handle, off, buf)

    @_errors
    async def flush(self, fh: int) -> None:
        if self.writes is None:
            # Nothing to store on close: ENOSYS tells the kernel to stop sending flushes,
            # which saves a round trip on every close of a read-only mount.
            raise Unimplemented("flush: nothing is stored on close")
        handle = self._handles[fh]
        if handle.buffered:
            # Metadata documents and files of arrays shown unchanged are stored on close
            # (I/O, under the workspace lock).
            if handle.stores_on_close:  # type: ignore[attr-defined]  # buffered: a WriteHandle
                await self._thread(self._writable().flush, handle)
            else:
                await self._run(self._writable().flush, handle)

    @_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles[fh]
        if handle.buffered:
            await self._thread(self._writable().fsync, handle)

    @_errors
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        if self.writes is not None and await self._thread(self.writes.sync) > 0:
            raise StorageError("some buffered chunks could not be committed (see the log)")

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        inode = self._inode_of.pop(fh, None)
        files = self._files_of.get(inode, set()) if inode is not None else set()
        files.discard(fh)
        if not files and inode is not None:
            self._files_of.pop(inode, None)
        if handle is None:
            return
        if handle.buffered:
            if self.writes is not None:
                self.writes.release(handle)  # type: ignore[arg-type]  # buffered: a WriteHandle
        elif not any(self._handles[f] is handle for f in files):
            # its last descriptor (one reader may serve several, see `open`)
            handle.close()  # type: ignore[attr-defined]  # not buffered: an Opened

    # -- changes --------------------------------------------------------------------

    @_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        writes = self._writable()
        if not stat.S_ISREG(mode) and stat.S_IFMT(mode):
            raise NotPermitted("only regular files can be created")
        parent = self._node(parent_inode)
        node, attr, handle = await self._run(writes.create, parent, os.fsdecode(name))
        entry = self._reply(node, attr)
        return self._open_file(entry.st_ino, handle), entry

    @_errors
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        writes = self._writable()
        node, attr = await self._run(writes.mkdir, self._node(parent_inode), os.fsdecode(name))
        return self._reply(node, attr)

    @_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        node = await self._run(self._writable().unlink, self._node(parent_inode), os.fsdecode(name))
        self.inodes.unlink(node)

    @_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        node = await self._run(self._writable().rmdir, self._node(parent_inode), os.fsdecode(name))
        self.inodes.unlink(node)

    @_errors
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        writes = self._writable()
        if flags & ~pyfuse3.RENAME_NOREPLACE:
            raise InvalidRequest("rename: only RENAME_NOREPLACE is supported")  # not EXCHANGE
        old, new = self._node(parent_inode_old), self._node(parent_inode_new)
        old_name, new_name = os.fsdecode(name_old), os.fsdecode(name_new)
        noreplace = bool(flags & pyfuse3.RENAME_NOREPLACE)

        was, now, replaced = await self._run(writes.rename, old, old_name, new, new_name, noreplace)
        if replaced:
            self.inodes.unlink(now)  # the file renamed over lives on in its open files
        self.inodes.move(was, now)

    @_errors
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        writes = self._writable()
        node, parent = self._node(inode), self._node(new_parent_inode)
        target, attr = await self._run(writes.link, node, parent, os.fsdecode(new_name))
        return self._reply(target, attr)

    @_errors
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        writes = self._writable()
        removed = self.inodes.removed(inode)
        # ftruncate names the open file: its path may have been unlinked or renamed over.
        handle = self._handles.get(fh) if fh is not None else None
        if handle is None and removed:
            handle = self._open_file_of(inode)
        if fields.update_size:
            if handle is not None and handle.buffered:
                result = await self._run(writes.truncate_open, handle, attr.st_size)
            elif removed:  # open for reading only: not ours to cut
                raise NotFound(f"inode {inode}: removed, and open for reading only")
            else:
                result = await self._run(writes.truncate, self._node(inode), attr.st_size)
        elif handle is not None and removed:
            result = handle.attr()
        else:
            # Modes, owners and times are not stored; the view keeps its own.
            result = await self._run(self.view.attr, self._node(inode))
        return self._entry(inode, result, removed)

    @_errors
    async def mknod(self, *args: Any, **kwargs: Any) -> pyfuse3.EntryAttributes:
        raise NotPermitted("only regular files and directories can be created")

    @_errors
    async def symlink(self, *args: Any, **kwargs: Any) -> pyfuse3.EntryAttributes:
        raise NotPermitted("symbolic links cannot be created")

    @_errors
    async def setxattr(self, *args: Any, **kwargs: Any) -> None:
        raise AttributesFixed("extended attributes cannot be set")

    @_errors
    async def removexattr(self, *args: Any, **kwargs: Any) -> None:
        raise AttributesFixed("extended attributes cannot be removed")

    # -- extended attributes ----------------------------------------------------------

    def _md5(self, node: Node) -> str | None:
        """The md5 behind `user.md5`, of chunk files whose bytes are served as stored,
        kept by where they are stored (the digests are made on first use: most mounts
        are never asked)."""
        namespace = self.view.digest_source(node)
        if namespace is None:
            return None
        if self._digests is None:
            self._digests = ChunkDigests(namespace)
        return self._digests.md5(node)

    @_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if name != MD5_XATTR:
            raise NoAttribute(name.decode(errors="replace"))
        digest = await self._run(self._md5, self._node(inode))
        if digest is None:
            raise NoAttribute(name.decode())
        return digest.encode()

    @_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return [MD5_XATTR] if self.view.digest_source(self._node(inode)) is not None else []
