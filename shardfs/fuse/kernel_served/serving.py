"""The serving of a kernel-served mount (read-only, with the patched pyfuse3): what its
kernel was shown, and the answers that must agree with it (see docs/design.md, "Reads as
the kernel was shown them", "One node id, one version" and "The native front").

There are no opens and no opendirs, so nothing pins a version where a reader starts: the
versions a lookup, getattr or listing showed the kernel are kept (`KernelVersions`), and
reads are served as of them. `KernelServing` owns all that state: the versions shown, the
listings the kernel reads, the prepared chunk directories by node id and the node-id
bases of their shard versions, the located chunk files read from their kept versions, the
readers of passes under way, and the native front with the rows it is given. The adapter
(`Operations`) hands it the requests of such a mount, one method call each.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyfuse3
import trio

from shardfs.fuse.calls import Caller
from shardfs.fuse.inodes import SHIFT, InodeTable, Slot
from shardfs.fuse.kernel_served.front import NativeFront, unavailable
from shardfs.fuse.owners import Owners
from shardfs.primitives.blocking import WouldBlock, attempt
from shardfs.primitives.errors import CorruptData, NotFound, ShardfsError, StorageError
from shardfs.storage.base import Stat
from shardfs.view import Attr, Node
from shardfs.view.interface import Opened, PreparedDirectory, ViewInterface
from shardfs.view.leaves import DIRECTORIES_KEPT
from shardfs.view.nodes import ArrayView, ChunkRun, Extent, Listing, Role
from shardfs.view.shown import KernelVersions, Shown

log = logging.getLogger("shardfs")

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Readers a kernel-served mount keeps, one per inode while a pass over its file is under
#: way (each may hold a descriptor and a chunk's bytes), the least recently used closed
#: beyond this; a reader is closed when its pass reaches the end of its file, since the
#: kernel's page cache serves re-reads. One dropped early is opened again as of the same
#: show (see `shardfs.view.shown`), so the budget costs time, never a mixed pass.
INODE_READERS = 256
#: Listings a kernel-served mount keeps while the kernel reads them, one per directory.
INODE_LISTINGS = 64
#: Shards of a chunk directory after the one a lookup found whose rows the native front is
#: given ahead (see `KernelServing.work_ahead`), and such fills and listings waiting at most.
SHARDS_AHEAD = 8
AHEAD_QUEUED = 256
#: Listings of chunk directories the native front is given ahead of the kernel's first read
#: (see `KernelServing.list_ahead`) at most, and their chunk files at most each.
LISTINGS_AHEAD = 256
LISTED_AHEAD_ROWS = 1024
#: Where the chunk files a kernel-served mount's lookups located are stored (about 200
#: bytes each), by node id: the read of such a file needs no reader. A node id names one
#: version (see `InodeTable`), so a location, once known, never goes stale.
EXTENTS_KEPT = 1 << 16


async def _invalidate(inode: int) -> None:
    """Have the kernel drop the pages and attributes it keeps of `inode`. From a worker
    thread, after the request that found it stale has been answered: the kernel may
    need locks that request holds."""
    with contextlib.suppress(OSError):  # forgotten by the kernel meanwhile: nothing kept
        await trio.to_thread.run_sync(pyfuse3.invalidate_inode, inode, False)


def front_off(view: ViewInterface, front: bool) -> str | None:
    """Why a kernel-served mount of `view` runs without the native front (None: with);
    `front`: whether the mount asks for it."""
    if not front:
        return "front=no"
    if view.storage.stat_path("") is None:
        return "its source is not a local directory"
    return unavailable()


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


class KernelServing:
    """The state and answers of one kernel-served mount: made by `Operations` for such a
    mount alone, and, like it, owned by the event loop.

    `windows` is the adapter's map of readdirplus windows: a directory's goes with its
    listing (by inode, as the kernel sends readdir here)."""

    def __init__(
        self,
        view: ViewInterface,
        inodes: InodeTable,
        owners: Owners,
        caller: Caller,
        windows: MutableMapping[int, Any],
        front: bool,
        timeout: float,
    ) -> None:
        self.view = view
        self.inodes = inodes
        #: the adapter's: library calls inline where they need not wait, else in a thread
        self._run, self._thread = caller.run, caller.thread
        self._windows = windows
        # by inode, since the kernel sends no file handles
        self._readers: _ByInode[int, _Pass] = _ByInode(INODE_READERS, lambda _, p: p.drop())
        #: why the mount runs without the native front, if it does
        self.front_off = front_off(view, front)
        native = None
        if self.front_off is None:
            # made first: it sets aside its descriptors from the budget the versions use
            native = NativeFront(view.storage, owners, timeout)
        #: what the kernel was shown of each file
        self.versions = KernelVersions(view.storage, timeout)
        #: the native front, attached by the daemon once pyfuse3 has mounted
        self.front = native
        #: what the front is to be given ahead of the kernel's requests (`work_ahead`): the
        #: rows of shards before their lookups, listings before their reads
        self._ahead, self._ahead_receive = trio.open_memory_channel[Callable[[], Awaitable[None]]](
            AHEAD_QUEUED
        )
        self._asked_ahead: set[tuple[int, str]] = set()
        if native is not None:
            native.versions = self.versions
            self.versions.elsewhere = native
        #: the show whose reads last failed, by inode: logged once
        self._failed_shows: dict[int, int] = {}
        # a listing's window of prepared rows, and the versions it was made from, go with it
        self._dir_listings: _ByInode[int, Listing] = _ByInode(INODE_LISTINGS, self._listing_gone)
        #: listings made ahead for the front (`list_ahead`), until the kernel reads them
        self._listed_ahead: _ByInode[int, Listing] = _ByInode(LISTINGS_AHEAD, self._listing_gone)
        self._listing_seen: dict[int, dict[str, Stat | None]] = {}
        #: the latest listings shown, by directory path, with their shows: where the chunk
        #: files they showed are stored (see `_extent`)
        self._listed: _ByInode[str, tuple[Shown, Listing]] = _ByInode(
            INODE_LISTINGS, lambda *_: None
        )
        #: By inode, the chunk directories looked in (see `lookup_prepared`), each with the
        #: node id bases of the shard versions looked up there (see `_base`)
        self._leaves: dict[int, tuple[PreparedDirectory, dict[Hashable, Any]]] = {}
        #: By node id, where the chunk files that lookups located are stored (the oldest
        #: dropped first)
        self._extents: dict[int, Extent] = {}

    def start_front(self) -> None:
        """Have the native front answer from now on (after pyfuse3's init, before its
        loop: before the kernel's first request reaches Python). It then owns the counts
        of the kernel's references to slots, since it answers lookups itself; if it
        cannot start, Python serves everything and keeps them."""
        front = self.front
        if front is None:
            return
        try:
            front.attach()
        except OSError as e:  # (nothing is passed through it yet: pyfuse3 reads the device)
            self.front, self.front_off = None, f"it could not start: {e}"
            self.versions.elsewhere = None
            return
        self.inodes.counts = front

    def stats(self) -> dict[str, Any]:
        """The figures of `shardfs stats` that are this mount's: the native front's (or why
        it is off) and the kept versions'."""
        figures: dict[str, Any] = {}
        if self.front is not None:
            figures["front"] = self.front.stats()
        elif self.front_off is not None:
            figures["front"] = {"off": self.front_off}
        figures["kept"] = self.versions.snapshot()
        return figures

    def _node(self, ino: int) -> Node:
        return self.inodes.found(ino)

    def recording(self, fn: Callable[..., T], *args: Any) -> tuple[T, dict[str, Stat | None]]:
        """`fn(*args)`, with the versions of the source it consulted: what the kernel is
        to be shown of its result (`KernelVersions.show`). A core call, run as one."""
        with self.versions.storage.recording() as seen:
            return fn(*args), seen

    # -- shows ----------------------------------------------------------------------

    def shown(self, ino: int, attr: Attr, seen: dict[str, Stat | None]) -> Attr:
        """The attributes to give the kernel of `ino`, whose entry it now holds, made from
        the versions `seen`, which are recorded as shown."""
        if self.inodes.version(ino) is not None:
            self._version_shown(ino, attr, seen)
            return attr
        return self._shown(ino, attr, seen)

    def _version_shown(self, ino: int, attr: Attr, seen: dict[str, Stat | None]) -> None:
        """A file `ino` was shown whose node id names the versions its attributes come
        from: only they are kept readable, and where its bytes are stored, if its lookup
        found that."""
        self.versions.keep(seen)
        if attr.extent is not None:
            extents = self._extents
            extents[ino] = attr.extent
            if len(extents) > EXTENTS_KEPT:
                del extents[next(iter(extents))]

    def _shown(self, ino: int, attr: Attr, seen: dict[str, Stat | None]) -> Attr:
        """The attributes of file `ino` to give the kernel, recorded as shown; while a pass
        over the file is under way, those of the version it reads, whatever the source
        holds now (the kernel would otherwise drop the pass's pages, or cut it)."""
        if attr.is_dir:
            return attr
        live = self._readers.get(ino)
        if live is not None:
            return live.reader.attr()
        self.versions.show(seen, inode=ino, extent=attr.extent)
        return attr

    def as_read(self, ino: int, attr: Attr) -> Attr:
        """The attributes of `ino` to list: while a pass over the file is under way, those
        of the version it reads."""
        live = self._readers.get(ino)
        return attr if live is None else live.reader.attr()

    async def attr(self, inode: int) -> Attr:
        """The attributes of `inode` to answer a getattr with, recorded as shown."""
        slot = self.inodes.version(inode)
        if slot is not None:
            # The node id names one version: its attributes as of that version, never the
            # source's now (the kernel may apply this reply after a newer one).
            node = self._node(inode)
            try:
                return await self._run(self._attr_as_of, node, slot.shown)
            except ShardfsError as e:
                raise await self._failed(inode, node.path, e, slot.shown) from None
        attr, seen = await self._run(self.recording, self.view.attr, self._node(inode))
        return self._shown(inode, attr, seen)

    def forget(self, ino: int) -> None:
        """The kernel forgot `ino`: what was kept for it goes."""
        self._extents.pop(ino, None)
        self._readers.drop(ino)
        self._drop_listing(ino)
        self.versions.forget(ino)
        self._failed_shows.pop(ino, None)

    # -- lookups ----------------------------------------------------------------------

    async def lookup_prepared(self, parent_inode: int, name: str) -> tuple[int, Attr] | None:
        """The node id and attributes of chunk file `name` in a directory of chunk files
        looked in before, if it is one and the way prepared there answers: the chunk's
        inode number from its index, none of the layers (`view.leaves`), its version kept
        and its location noted; None: the long way must answer. Raises `MissingChunk` for
        a chunk that is not stored (a negative entry)."""
        prepared = self._leaves.get(parent_inode)
        if prepared is None:
            return None
        directory, bases = prepared
        try:  # `_run`, inline: one coroutine less per chunk file
            found = attempt(directory.entry, name)
        except WouldBlock:
            found = await self._thread(directory.entry, name)
        if found is None:
            return None
        attr = found[3]
        held = bases.get((attr.shard[0], attr.shard[1].version))  # type: ignore[index]
        if held is None or bases[None] != self.inodes.epoch:
            held = self._base(bases, found[0], attr.shard)  # type: ignore[arg-type]
        if held is None:
            return None
        _, _, index, attr, seen = found
        ino = held[0] + index
        self.inodes.ref_slot((held[0] >> SHIFT) - 1, 1)  # `InodeTable.ref`, inline
        self.versions.keep(seen)  # `_version_shown`, inline
        if attr.extent is not None:  # `_version_shown`, inline
            extents = self._extents
            extents[ino] = attr.extent
            if len(extents) > EXTENTS_KEPT:
                del extents[next(iter(extents))]
        if self.front is not None:  # its other chunk files are the front's
            slot = (held[0] >> SHIFT) - 1
            self.front.fill(parent_inode, directory, found, held[0], slot)
            self._ask_ahead(parent_inode, directory, found)
        return ino, attr

    def prepare(self, parent_inode: int, parent: Node, chunk: Node) -> None:
        """Keep the directory a chunk file was just found in prepared, if its view did, for
        the lookups of its other chunk files (no chunk is renamed here)."""
        leaf = self.view.chunk_directory(parent.path)
        if leaf is None or leaf.array_key != chunk.array.key:
            return
        if len(self._leaves) >= DIRECTORIES_KEPT:
            self._leaves.clear()
        self._leaves[parent_inode] = (leaf, {None: self.inodes.epoch})
        if self.front is not None:
            self.front.directory(parent_inode, leaf)

    def first_to_front(self, parent_inode: int, name: str) -> None:
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
        (`_fill_ahead`): a reader going through it in key order then finds them in the
        front, not one lookup per shard here. Asked once per (directory, shard)."""
        for name in leaf.names_ahead(found, SHARDS_AHEAD):
            asked = (parent_inode, name)
            if asked in self._asked_ahead:
                continue
            if len(self._asked_ahead) >= DIRECTORIES_KEPT * SHARDS_AHEAD:
                self._asked_ahead.clear()
            self._asked_ahead.add(asked)
            try:
                self._ahead.send_nowait(
                    functools.partial(self._fill_ahead, parent_inode, leaf, name)
                )
            except trio.WouldBlock:
                return  # busy: the lookups of those chunks fill them instead

    async def work_ahead(self) -> None:
        """Do what was asked ahead of the kernel's requests (`_ask_ahead`, `list_ahead`),
        one at a time, in the background. Runs for the life of the mount."""
        async for job in self._ahead_receive:
            try:
                await job()
            except Exception:  # a defect: what was asked is left to the kernel's requests
                log.exception("work ahead of the kernel's requests failed")

    async def _fill_ahead(self, parent_inode: int, leaf: PreparedDirectory, name: str) -> None:
        """Fill the front's rows of the shard of chunk `name`, as a lookup of it would: the
        shard located (its index read, in a worker thread if it must wait), its version
        kept, numbered and filled."""
        prepared = self._leaves.get(parent_inode)
        front = self.front
        if front is None or prepared is None or prepared[0] is not leaf:
            return
        try:
            found = await self._run(leaf.entry, name)
        except ShardfsError:
            return  # (missing, or hostile: the lookup of that chunk will say)
        if found is None or found[3].shard is None:
            return
        held = self._base(prepared[1], found[0], found[3].shard)
        if held is not None:
            self.versions.keep(found[4])
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

    # -- listings ---------------------------------------------------------------------

    async def listing(
        self, inode: int, start_id: int
    ) -> tuple[Listing, dict[str, Stat | None] | None]:
        """The listing directory `inode` is read from, and the versions it was made from:
        taken afresh when a read starts at 0, so offsets stay stable while the kernel
        reads on."""
        listing = self._dir_listings.get(inode) if start_id else None
        if listing is not None:
            self._dir_listings.move_to_end(inode)
            return listing, self._listing_seen.get(inode)
        listing = self._listed_ahead.get(inode) if start_id else None
        if listing is not None:  # the front answered its first pages
            return listing, self._listing_seen.get(inode)
        node = self._node(inode)
        fresh, seen = await self._run(self.recording, self.view.listing, node)
        shown = self.versions.show(seen, directory=node.path)
        self._listed.put(node.path, (shown, fresh))
        self._drop_listing(inode)
        self._dir_listings.put(inode, fresh)
        self._listing_seen[inode] = seen
        if self.front is not None:  # its pages after this one: the same listing's
            self.front.listing(inode, len(fresh), len(fresh.entries))
        return fresh, seen

    def _listing_gone(self, inode: int, _: Listing) -> None:
        self._windows.pop(inode, None)
        self._listing_seen.pop(inode, None)
        if self.front is not None:
            self.front.unlist(inode)

    def list_ahead(self, inode: int, node: Node) -> None:
        """Directory `node` was just listed to the kernel as `inode`: if it is one of chunk
        files, have its listing made in the background for the front, which answers the
        kernel's first read of it from there while the files it was made from are
        unchanged (`work_ahead`)."""
        if (
            self.front is not None
            and node.role is Role.CHUNK_DIR
            and inode not in self._listed_ahead
            and inode not in self._dir_listings
        ):
            with contextlib.suppress(trio.WouldBlock):  # busy: Python answers its first read
                self._ahead.send_nowait(functools.partial(self._list_ahead, inode, node))

    async def _list_ahead(self, inode: int, node: Node) -> None:
        """Make the listing of `node` as a reply to the kernel's first read of it would
        (recorded, its versions shown, numbered, its rows filled), and give it to the front
        with what it was made from; only a directory of chunk files alone, not too big,
        that the kernel still holds as `inode` and has not read meanwhile."""
        front = self.front
        if front is None or inode in self._listed_ahead or inode in self._dir_listings:
            return
        try:
            fresh, seen = await self._run(self.recording, self.view.listing, node)
        except ShardfsError:
            return  # (the kernel's read of it will say)
        made_from = front.made_from(seen)
        if (
            made_from is None
            or fresh.entries
            or not 0 < len(fresh) <= LISTED_AHEAD_ROWS
            or not self._still(inode, node)
            or inode in self._dir_listings
        ):
            return
        shown = self.versions.show(seen, directory=node.path)
        self._listed.put(node.path, (shown, fresh))
        self._listed_ahead.put(inode, fresh)
        self._listing_seen[inode] = seen
        front.listing(inode, len(fresh), 0, made_from)
        for position, run, row in fresh.chunks(0):
            slots = self.inodes.run_slots(run)
            if slots:
                names = [name.encode() for name in run.names(row, len(run))]
                front.fill_listed(inode, run, names, row, len(run), position, slots)

    def _still(self, inode: int, node: Node) -> bool:
        """Whether `inode` still means `node` (the kernel may have forgotten it meanwhile)."""
        try:
            return self.inodes.node(inode).path == node.path
        except KeyError:
            return False

    def _drop_listing(self, inode: int) -> None:
        self._listed_ahead.drop(inode)
        self._dir_listings.drop(inode)
        self._windows.pop(inode, None)  # a window of a listing dropped before

    def fill_listed(
        self, inode: int, run: ChunkRun, names: list[bytes], start: int, stop: int,
        position: int,
    ) -> None:  # fmt: skip
        """Rows [start, stop) of `run`, named `names`, made ready for a reply to a readdir
        of `inode`, where row `start` is at `position`: their reads are the native front's,
        and so are the pages of the listing from there on."""
        if self.front is not None:
            slots = self.inodes.run_slots(run)
            self.front.fill_listed(inode, run, names, start, stop, position, slots)

    # -- reads ------------------------------------------------------------------------

    async def read(self, inode: int, off: int, size: int) -> bytes:
        """A read of inode `inode`: there are no opens to pin a version to, so the file is
        read as of its latest show (`shardfs.view.shown`), the version whose size the
        kernel holds, until the kernel asks for its attributes again (`cache_timeout`). A
        reader is kept while a pass over the file is under way and closed at its end. A
        read that cannot be served as shown fails (`_failed`). (`Operations.read` calls
        it with no frame between: one coroutine per chunk file besides the handler's.)

        The kernel is never told to drop a file at the end of a pass: a reader that
        reads on to find the end (Python's `read()`, `cat`) would then be given the new
        size, and the new version's bytes after the old one's."""
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
        with self.versions.as_of(shown):
            return self.view.attr(node)

    def _open_as_of(self, node: Node, shown: Shown | None) -> _Pass:
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
