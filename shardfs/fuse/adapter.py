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
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import numpy as np
import pyfuse3
import trio

from shardfs.checksum.digests import ChunkDigests
from shardfs.fuse.inodes import SHIFT, InodeTable, Slot
from shardfs.fuse.kernel_served.front import NativeFront, unavailable
from shardfs.fuse.owners import Owners
from shardfs.primitives.blocking import WouldBlock, attempt
from shardfs.primitives.errors import (
    AlreadyExists,
    AttributesFixed,
    BadHandle,
    CannotMove,
    CorruptData,
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
from shardfs.view.interface import Opened, OpenFile, PreparedDirectory, ViewInterface, Writes
from shardfs.view.leaves import DIRECTORIES_KEPT
from shardfs.view.nodes import ArrayView, ChunkRun, Extent, Listing
from shardfs.view.shown import KernelVersions, Shown

if TYPE_CHECKING:
    from shardfs.fuse.metrics import Latency

log = logging.getLogger("shardfs")
#: How `os.fsdecode` decodes a name
_FS_ENCODING = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())

P = ParamSpec("P")
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

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
    #: of rows of each (start, stop, slot), whose counts of the kernel's references a reply
    #: adds to (rows are in grid order: a stretch per shard, in a chunk directory)
    slots: dict[int, Slot]
    stretches: list[tuple[int, int, Slot]]

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
                (a, b, shard_slots[k][1]) for a, b, k in zip(cuts, cuts[1:], firsts, strict=False)
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


async def _invalidate(inode: int) -> None:
    """Have the kernel drop the pages and attributes it keeps of `inode`. From a worker
    thread, after the request that found it stale has been answered: the kernel may
    need locks that request holds."""
    with contextlib.suppress(OSError):  # forgotten by the kernel meanwhile: nothing kept
        await trio.to_thread.run_sync(pyfuse3.invalidate_inode, inode, False)


def _front_off(view: ViewInterface, config: MountConfig) -> str | None:
    """Why a kernel-served mount of `view` runs without the native front (None: with)."""
    if not config.kernel_served:
        return None
    if not config.front:
        return "front=no"
    if view.storage.stat_path("") is None:
        return "its source is not a local directory"
    return unavailable()


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
#: Readers a kernel-served mount keeps, one per inode while a pass over its file is under
#: way (each may hold a descriptor and a chunk's bytes), the least recently used closed
#: beyond this; a reader is closed when its pass reaches the end of its file, since the
#: kernel's page cache serves re-reads. One dropped early is opened again as of the same
#: show (see `shardfs.view.shown`), so the budget costs time, never a mixed pass.
INODE_READERS = 256
#: Listings a kernel-served mount keeps while the kernel reads them, one per directory.
INODE_LISTINGS = 64
#: Shards of a chunk directory after the one a lookup found whose rows the native front is
#: given ahead (see `Operations.fill_ahead`), and such fills waiting at most.
SHARDS_AHEAD = 8
AHEAD_QUEUED = 256
#: Where the chunk files a kernel-served mount's lookups located are stored (about 200
#: bytes each), by node id: the read of such a file needs no reader. A node id names one
#: version (see `InodeTable`), so a location, once known, never goes stale.
EXTENTS_KEPT = 1 << 16


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


class _ByInode(OrderedDict[K, V]):
    """Per-inode (or per-directory) state of a kernel-served mount (no open/opendir, so
    no file handles): kept for the most recently used, `close` called on what is dropped.
    `get` is OrderedDict's own (in C: asked at every lookup) and does not count as a use;
    `move_to_end` does."""

    def __init__(self, budget: int, close: Callable[[K, V], None]) -> None:
        super().__init__()
        self._budget = budget
        self._close = close

    def put(self, key: K, item: V) -> None:
        self.drop(key)
        self[key] = item
        while len(self) > self._budget:
            self._close(*self.popitem(last=False))

    def drop(self, key: K) -> None:
        item = self.pop(key, None)
        if item is not None:
            self._close(key, item)


@dataclass
class _Pass:
    """A reader of a kernel-served file while a pass over it is under way, with the show
    it reads as of and the size it serves."""

    reader: Opened
    path: str
    shown: Shown | None
    size: int
    #: reads of it under way (in worker threads): it is closed once they are done
    busy: int = 0
    dropped: bool = False

    async def read(self, run: Callable[..., Awaitable[bytes]], off: int, size: int) -> bytes:
        """`reader.read` through `run`, the reader kept open until it returns."""
        self.busy += 1
        try:
            return await run(self.reader.read, off, size)
        finally:
            self.busy -= 1
            if self.dropped and not self.busy:
                self.reader.close()

    def drop(self) -> None:
        """Close the reader now, or, while reads of it are under way, after the last."""
        self.dropped = True
        if not self.busy:
            self.reader.close()


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
        self._limiter = trio.CapacityLimiter(config.workers)
        self._handles: dict[int, OpenFile] = {}
        #: the inode of each open file, and the open files of each inode: a file that was
        #: unlinked or renamed over is known by these alone (see `InodeTable.removed`)
        self._inode_of: dict[int, int] = {}
        self._files_of: dict[int, set[int]] = {}
        self._listings: dict[int, Listing] = {}
        self._windows: dict[int, _Window] = {}
        # kernel-served mounts: by inode, since the kernel sends no file handles
        self._readers: _ByInode[int, _Pass] = _ByInode(INODE_READERS, lambda _, p: p.drop())
        self._owners = Owners(
            config.read_only, config.uid, config.gid, config.file_mode, config.dir_mode
        )
        #: why a kernel-served mount runs without the native front, if it does
        self.front_off = _front_off(view, config)
        front = None
        if config.kernel_served and self.front_off is None:
            # made first: it sets aside its descriptors from the budget the versions use
            front = NativeFront(view.storage, self._owners, config.cache_timeout)
        #: what the kernel of a kernel-served mount was shown of each file
        self.versions = (
            KernelVersions(view.storage, config.cache_timeout) if config.kernel_served else None
        )
        #: the native front, attached by the daemon once pyfuse3 has mounted
        self.front = front
        #: shards whose rows the front is to be given ahead of their lookups (`fill_ahead`)
        self._ahead, self._ahead_receive = trio.open_memory_channel[
            tuple[int, PreparedDirectory, str]
        ](AHEAD_QUEUED)
        self._asked_ahead: set[tuple[int, str]] = set()
        if front is not None and self.versions is not None:
            front.versions = self.versions
            self.versions.elsewhere = front
            self.inodes.shared = front.retire
        #: read-only mounts: the version each inode was last opened on (see `_open_file`)
        self._opened: dict[int, Hashable] = {}
        #: the show whose reads last failed, by inode: logged once
        self._failed_shows: dict[int, int] = {}
        # a listing's window of prepared rows, and the versions it was made from, go with it
        self._dir_listings: _ByInode[int, Listing] = _ByInode(INODE_LISTINGS, self._listing_gone)
        self._listing_seen: dict[int, dict[str, Stat | None]] = {}
        #: the latest listings shown, by directory path, with their shows: where the chunk
        #: files they showed are stored (see `_extent`)
        self._listed: _ByInode[str, tuple[Shown, Listing]] = _ByInode(
            INODE_LISTINGS, lambda *_: None
        )
        #: By inode, the chunk directories looked in (see `lookup`), each with the node id
        #: bases of the shard versions looked up there (see `_base`)
        self._leaves: dict[int, tuple[PreparedDirectory, dict[Hashable, Any]]] = {}
        #: By node id, where the chunk files that lookups located are stored (the oldest
        #: dropped first)
        self._extents: dict[int, Extent] = {}
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

    def without_front(self, why: str) -> None:
        """Serve everything in Python: the front could not start (`why`)."""
        self.front, self.front_off = None, why
        self.inodes.shared = None
        if self.versions is not None:
            self.versions.elsewhere = None

    def stats(self) -> dict[str, Any]:
        """Everything `shardfs stats` shows: the view's figures, the kernel's requests, and
        those the native front answered."""
        fuse: dict[str, Any] = {
            "requests": dict(sorted(self.requests.items())),
            "errors": dict(sorted(self.errors.items())),
        }
        if self.front is not None:
            fuse["front"] = self.front.stats()
        elif self.front_off is not None:
            fuse["front"] = {"off": self.front_off}
        if self.versions is not None:
            fuse["kept"] = self.versions.snapshot()
        return {"uptime": time.time() - self.started, "fuse": fuse, **self.view.stats()}

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a core call inline if it needs no waiting I/O, else in a worker thread."""
        try:
            return attempt(fn, *args)
        except WouldBlock:
            return await self._thread(fn, *args)

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _node(self, ino: int) -> Node:
        try:
            return self.inodes.node(ino)
        except KeyError:
            raise NotFound(f"inode {ino}") from None

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
        if seen is not None:
            if self.inodes.version(ino) is not None:
                self._version_shown(ino, attr, seen)
            else:
                attr = self._shown(ino, attr, seen)
        return self._entry(ino, attr)

    def _version_shown(self, ino: int, attr: Attr, seen: dict[str, Stat | None]) -> None:
        """A file `ino` was shown (kernel-served mounts) whose node id names the versions
        its attributes come from: only they are kept readable, and where its bytes are
        stored, if its lookup found that."""
        assert self.versions is not None
        self.versions.keep(seen)
        if attr.extent is not None:
            extents = self._extents
            extents[ino] = attr.extent
            if len(extents) > EXTENTS_KEPT:
                del extents[next(iter(extents))]

    async def _recorded(
        self, fn: Callable[..., T], *args: Any
    ) -> tuple[T, dict[str, Stat | None] | None]:
        """`fn(*args)` through `_run`, with the versions of the source it consulted if the
        kernel is to be shown its result (kernel-served mounts), else None."""
        if self.versions is None:
            return await self._run(fn, *args), None
        storage = self.versions.storage

        def call() -> tuple[T, dict[str, Stat | None]]:
            with storage.recording() as seen:
                return fn(*args), seen

        return await self._run(call)

    def _shown(self, ino: int, attr: Attr, seen: dict[str, Stat | None]) -> Attr:
        """The attributes of file `ino` to give the kernel, recorded as shown; while a pass
        over the file is under way, those of the version it reads, whatever the source
        holds now (the kernel would otherwise drop the pass's pages, or cut it)."""
        assert self.versions is not None
        if attr.is_dir:
            return attr
        live = self._readers.get(ino)
        if live is not None:
            return live.reader.attr()
        self.versions.show(seen, inode=ino, extent=attr.extent)
        return attr

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
            prepared = self._leaves.get(parent_inode)
            if prepared is not None:
                # A directory of chunk files looked in before (kernel-served mounts): the
                # chunk's inode number from its index, none of the layers (`view.leaves`).
                directory, bases = prepared
                try:
                    try:  # `_run`, inline: one coroutine less per chunk file
                        found = attempt(directory.entry, text)
                    except WouldBlock:
                        found = await self._thread(directory.entry, text)
                except MissingChunk:
                    return self._absent()
                held = None
                if found is not None:
                    attr = found[3]
                    held = bases.get((attr.shard[0], attr.shard[1].version))  # type: ignore[index]
                    if held is None or bases[None] != self.inodes.epoch:
                        held = self._base(bases, found[0], attr.shard)  # type: ignore[arg-type]
                if held is not None:
                    _, _, index, attr, seen = found  # type: ignore[misc]
                    ino = held[0] + index
                    held[1].refs += 1  # `InodeTable.ref`, inline
                    self.versions.keep(seen)  # type: ignore[union-attr]  # `_version_shown`, inline
                    if attr.extent is not None:  # `_version_shown`, inline
                        extents = self._extents
                        extents[ino] = attr.extent
                        if len(extents) > EXTENTS_KEPT:
                            del extents[next(iter(extents))]
                    if self.front is not None:  # its other chunk files are the front's
                        slot = (held[0] >> SHIFT) - 1
                        self.front.fill(parent_inode, directory, found, held[0], slot)  # type: ignore[arg-type]
                        self._ask_ahead(parent_inode, directory, found)
                    return self._entry(ino, attr)
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
                if seen is not None and node.role is Role.CHUNK:
                    self._prepared(parent_inode, parent, node)
                    entry = self._reply(node, attr, seen)
                    if self.front is not None:
                        self._first_to_front(parent_inode, text)
                    return entry
                return self._reply(node, attr, seen)
            return self._reply(node, attr)
        except Exception as e:
            raise _fuse_error(self, "lookup", (parent_inode, name, ctx), e) from None
        finally:
            if self.latency is not None:
                self.latency.observe("lookup", start)

    def _first_to_front(self, parent_inode: int, name: str) -> None:
        """After the first lookup in a directory (the long way, which prepared it): its
        shard's rows to the front, and the next shards' asked for, as later lookups do.
        Only if the prepared directory answers inline (it just located that shard)."""
        prepared = self._leaves.get(parent_inode)
        if prepared is None or self.front is None:
            return
        leaf, bases = prepared
        try:
            found = attempt(leaf.entry, name)
        except (WouldBlock, ShardfsError):
            return
        if found is None or found[3].shard is None:
            return
        held = self._base(bases, found[0], found[3].shard)
        if held is not None:
            self.front.fill(parent_inode, leaf, found, held[0], (held[0] >> SHIFT) - 1)
            self._ask_ahead(parent_inode, leaf, found)

    def _ask_ahead(self, parent_inode: int, leaf: PreparedDirectory, found: Any) -> None:
        """Have the rows of the next shards of this directory filled in the background
        (`fill_ahead`): a reader going through it in key order then finds them in the
        front, not one lookup per shard here. Asked once per (directory, shard)."""
        for name in leaf.names_ahead(found, SHARDS_AHEAD):
            asked = (parent_inode, name)
            if asked in self._asked_ahead:
                continue
            if len(self._asked_ahead) >= DIRECTORIES_KEPT * SHARDS_AHEAD:
                self._asked_ahead.clear()
            self._asked_ahead.add(asked)
            try:
                self._ahead.send_nowait((parent_inode, leaf, name))
            except trio.WouldBlock:
                return  # busy: the lookups of those chunks fill them instead

    async def fill_ahead(self) -> None:
        """Fill the front's rows of the shards `_ask_ahead` named, as a lookup of each
        would: the shard located (its index read, in a worker thread if it must wait),
        its version kept, numbered and filled. Runs for the life of the mount."""
        async for parent_inode, leaf, name in self._ahead_receive:
            prepared = self._leaves.get(parent_inode)
            front, versions = self.front, self.versions
            if front is None or versions is None or prepared is None or prepared[0] is not leaf:
                continue
            try:
                found = await self._run(leaf.entry, name)
            except ShardfsError:
                continue  # (missing, or hostile: the lookup of that chunk will say)
            if found is None or found[3].shard is None:
                continue
            held = self._base(prepared[1], found[0], found[3].shard)
            if held is not None:
                versions.keep(found[4])
                front.fill(parent_inode, leaf, found, held[0], (held[0] >> SHIFT) - 1)

    def _base(
        self, bases: dict[Hashable, Any], array: ArrayView, shard: tuple[str, Stat]
    ) -> tuple[int, Slot] | None:
        """The number of chunk 0 of `array` in `shard`'s version, and its slot, memoised in
        `bases` (one prepared directory's, by the shard's key and version) while the table lets
        no slot go (`InodeTable.epoch`: a slot let go may be given to another version)."""
        if bases[None] != self.inodes.epoch or len(bases) > DIRECTORIES_KEPT:
            bases.clear()
            bases[None] = self.inodes.epoch
        base = self.inodes.chunk_base(array, shard)
        if base is None:
            return None
        slot = self.inodes.slot(base)
        assert slot is not None
        held = bases[shard[0], shard[1].version] = (base, slot)
        return held

    def _prepared(self, parent_inode: int, parent: Node, chunk: Node) -> None:
        """Keep the directory a chunk file was just found in prepared, if its view did, for
        the lookups of its other chunk files (kernel-served mounts: no chunk renamed)."""
        leaf = self.view.chunk_directory(parent.path)
        if leaf is None or leaf.array_key != chunk.array.key:
            return
        if len(self._leaves) >= DIRECTORIES_KEPT:
            self._leaves.clear()
        self._leaves[parent_inode] = (leaf, {None: self.inodes.epoch})
        if self.front is not None:
            self.front.directory(parent_inode, leaf)

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
        slot = self.inodes.version(inode) if self.versions is not None else None
        if slot is not None:
            # The node id names one version: its attributes as of that version, never the
            # source's now (the kernel may apply this reply after a newer one).
            node = self._node(inode)
            try:
                attr = await self._run(self._attr_as_of, node, slot.shown)
            except ShardfsError as e:
                raise await self._failed(inode, node.path, e, slot.shown) from None
            return self._entry(inode, attr)
        attr, seen = await self._recorded(self.view.attr, self._node(inode))
        return self._entry(inode, attr if seen is None else self._shown(inode, attr, seen))

    def _open_file_of(self, inode: int) -> OpenFile:
        """An open file of `inode`, a writable one if there is; ENOENT if none is open."""
        files = [self._handles[fh] for fh in self._files_of.get(inode, ())]
        if not files:
            raise NotFound(f"inode {inode}: removed, and not open")
        return next((f for f in files if f.buffered), files[0])

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)
            self._extents.pop(ino, None)
            self._opened.pop(ino, None)
            self._readers.drop(ino)
            self._drop_listing(ino)
            if self.versions is not None:
                self.versions.forget(ino)
                self._failed_shows.pop(ino, None)

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

    async def _inode_listing(self, inode: int, start_id: int) -> Listing:
        """The listing a kernel-served directory is read from: taken afresh when a read
        starts at 0, so offsets stay stable while the kernel reads on."""
        listing = self._dir_listings.get(inode) if start_id else None
        if listing is not None:
            self._dir_listings.move_to_end(inode)
        if listing is None:
            node = self._node(inode)
            fresh, seen = await self._recorded(self.view.listing, node)
            if self.versions is not None and seen is not None:
                shown = self.versions.show(seen, directory=node.path)
                self._listed.put(node.path, (shown, fresh))
            self._drop_listing(inode)
            self._dir_listings.put(inode, fresh)
            if seen is not None:
                self._listing_seen[inode] = seen
            return fresh
        return listing

    def _listing_gone(self, inode: int, _: Listing) -> None:
        self._windows.pop(inode, None)
        self._listing_seen.pop(inode, None)

    def _drop_listing(self, inode: int) -> None:
        self._dir_listings.drop(inode)
        self._windows.pop(inode, None)  # a window of a listing dropped before

    @_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # readdirplus: every entry carries its attributes, so one listing fills the
        # kernel's entry and attribute caches (no lookup or getattr per file after it).
        if self.config.kernel_served:
            listing = await self._inode_listing(fh, start_id)
        else:
            listing = self._listings[fh]
        seen = self._listing_seen.get(fh) if self.config.kernel_served else None
        for position in range(start_id, len(listing.entries)):
            name, node, attr = listing.entries[position]
            ino = self.inodes.assign(node, _source(node, attr, seen))
            live = self._readers.get(ino) if self.config.kernel_served else None
            if live is not None:
                attr = live.reader.attr()
            if not pyfuse3.readdir_reply(
                token, os.fsencode(name), self._entry(ino, attr), position + 1
            ):
                self.inodes.drop_unreferenced(ino)
                return
            self.inodes.ref(ino)
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
                if self.front is not None and window.inos is not None:  # the reads: the front's
                    slots = self.inodes.run_slots(run)
                    self.front.fill_listed(fh, run, window.names, window.start, window.stop, slots)
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
                        slot.refs += min(b, i + sent) - max(a, i)
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
        """A read of an open file; on a kernel-served mount, of inode `fh`: there are no
        opens to pin a version to, so the file is read as of its latest show
        (`shardfs.view.shown`), the version whose size the kernel holds, until the kernel
        asks for its attributes again (`cache_timeout`). A reader is kept while a pass
        over the file is under way and closed at its end. A read that cannot be served
        as shown fails (`_failed`). (One method for both: a frame less per chunk file.)

        The kernel is never told to drop a file at the end of a pass: a reader that
        reads on to find the end (Python's `read()`, `cat`) would then be given the new
        size, and the new version's bytes after the old one's."""
        self.requests["read"] += 1  # `_errors`, inline
        if self.debug:
            log.debug("read%r", (fh, off, size))
        start = perf_counter_ns()
        try:
            if self.versions is None:
                return await self._run(self._handles[fh].read, off, size)
            inode = fh
            live = self._readers.get(inode)
            if live is not None:
                self._readers.move_to_end(inode)
            else:
                node = None
                slot = self.inodes.version(inode)
                if slot is not None:
                    # Its node id names the version to serve (`InodeTable`).
                    shown = slot.shown
                    extent = self._extents.get(inode)  # the common case: its lookup's
                    if extent is None:
                        node = self._node(inode)
                        extent = self._listed_extent(node, slot.shard)
                else:
                    node = self._node(inode)
                    directory = node.path.rpartition("/")[0]
                    shown = self.versions.latest(inode, directory)
                    extent = self._extent(node, directory, shown)
                if extent is not None and off + size >= extent.length:
                    # A read to the end of a file its show located: from the kept version
                    # at once, with no reader (no pass to keep going, see `_shown`).
                    if off >= extent.length:
                        return b""
                    try:  # `_run`, inline: one coroutine less per chunk file
                        data = attempt(self.versions.read_kept, extent, off, size)
                    except WouldBlock:
                        data = await self._thread(self.versions.read_kept, extent, off, size)
                    if data is not None:
                        return data
                    data = self.view.cached_chunk(extent)  # a store that keeps no versions (S3)
                    if data is not None:
                        return data[off : off + size]
                if node is None:
                    node = self._node(inode)
                try:
                    live = await self._run(self._open_as_of, node, shown)
                except ShardfsError as e:
                    raise await self._failed(inode, node.path, e, shown) from None
                self._readers.put(inode, live)
            try:
                data = await live.read(self._run, off, size)
            except CorruptData:
                raise  # the reader answers the kernel's retries with it, logged once
            except ShardfsError as e:
                self._readers.drop(inode)
                raise await self._failed(inode, live.path, e, live.shown) from None
            if off + len(data) >= live.size or not data:
                self._readers.drop(inode)  # the pass is over: the kernel holds what it read
            return data
        except Exception as e:
            raise _fuse_error(self, "read", (fh, off, size), e) from None
        finally:
            if self.latency is not None:
                self.latency.observe("read", start)

    def _extent(self, node: Node, directory: str, shown: Shown | None) -> Extent | None:
        """Where the bytes of `node` (an entry of `directory`) are stored as `shown`, the
        kernel's latest show of it, found them: its lookup's, or its listing's if that
        listing is among the latest kept."""
        if shown is None or shown.extent is not None:
            return None if shown is None else shown.extent
        listed = self._listed.get(directory)
        if listed is not None:
            self._listed.move_to_end(directory)
        if listed is None or listed[0] is not shown:
            return None
        return listed[1].extent(node)

    def _listed_extent(self, node: Node, shard: tuple[str, Stat] | None) -> Extent | None:
        """Where chunk file `node` is stored, if one of the latest listings of its directory
        listed it from the very version its node id names (`shard`, and its array's)."""
        listed = self._listed.get(node.path.rpartition("/")[0])
        if listed is None or shard is None:
            return None
        extent = listed[1].extent(node)
        if extent is None or extent.key != shard[0] or extent.stat.version != shard[1].version:
            return None
        return extent

    def _attr_as_of(self, node: Node, shown: Shown) -> Attr:
        assert self.versions is not None
        with self.versions.as_of(shown):
            return self.view.attr(node)

    def _open_as_of(self, node: Node, shown: Shown | None) -> _Pass:
        assert self.versions is not None
        with self.versions.as_of(shown):
            reader = self.view.open(node)
        return _Pass(reader, node.path, shown, reader.attr().size)

    async def _failed(
        self, inode: int, path: str, error: ShardfsError, shown: Shown | None
    ) -> ShardfsError:
        """The error to answer for a read that failed. If it failed because a version the
        kernel was shown is gone, the kernel is told to drop what it holds of the file
        (once the reply is sent); reads as of that show go on failing until it asks for
        the file's attributes again, so that no read after it gets a version whose size
        it does not hold (the kernel itself retries a failed read at once). A chunk
        file's node id names its version: the kernel is told to drop its name too, so
        that the next open looks it up and gets the node id of the version there now."""
        if shown is None or not shown.stats or isinstance(error, CorruptData):
            return error
        assert self.versions is not None
        versioned = self.inodes.version(inode) is not None
        if isinstance(error, NotFound) and not versioned:  # (MissingChunk is a NotFound)
            return error
        if not isinstance(error, NotFound) and not await self._run(self.versions.changed, shown):
            return error  # the source holds what was shown: a failure of its own
        # (a node id that names a version: not found means that version is gone, EIO)
        trio.lowlevel.spawn_system_task(_invalidate, inode)
        if self.inodes.version(inode) is not None:
            # Its node id names the version that is gone: the kernel must look the name
            # up again to learn the one there is now.
            directory, _, name = path.rpartition("/")
            parent = self.inodes.inode_of(directory)
            if parent is not None:
                pyfuse3.invalidate_entry_async(parent, os.fsencode(name), ignore_enoent=True)
        if self._failed_shows.get(inode) != shown.seq:
            self._failed_shows[inode] = shown.seq
            if not error.logged:
                log.error(
                    "%s changed after the kernel was given its size; reads fail until the "
                    "kernel asks for it again (%s)", path, error,
                )  # fmt: skip
        failed = StorageError(f"{path}: the version the kernel holds is gone")
        failed.logged = True
        return failed

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
