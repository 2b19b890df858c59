"""The native front of a kernel-served mount, from Python's side (see docs/design.md, "The
native front").

The front (`_front.c`) reads the FUSE device itself and answers the lookups, getattrs and
reads of chunk files, and the pages of listings, from tables this module fills; every other
request reaches pyfuse3's loop as before. Python stays the only decider: it fills the rows
of one shard version in one prepared directory after its own lookup there found them
(`fill`), or as it lists them (`fill_listed`, with their positions in the listing it took:
`listing`), with the node ids its `InodeTable` gave that version, and a copy of the
descriptor it keeps for it (`KernelVersions.lend`). Whatever the rows cannot vouch for
comes back to Python.

The front owns the kernel's references to slots (`InodeTable.counts`): its lookups and
listings count there, and so do Python's (`ref`); a FORGET subtracts there (`unref`),
which at zero drops the slot's rows in the same step, before Python lets the slot go.
One count is shared: when a kept version was last shown (`KernelVersions.elsewhere` asks
before letting it go, and tells the front when it does).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Hashable
from types import ModuleType
from typing import Any

import pyfuse3

from shardfs.fuse.inodes import SHIFT, Slot
from shardfs.fuse.owners import Owners
from shardfs.storage.base import Stat, Storage
from shardfs.view.interface import Found, PreparedDirectory
from shardfs.view.nodes import ChunkRun
from shardfs.view.shown import KernelVersions

_front: ModuleType | None
try:
    from shardfs.fuse.kernel_served import _front
except ImportError:  # not built: mounts run without it (`unavailable`)
    _front = None

log = logging.getLogger("shardfs")

#: (directory, slot) pairs remembered as filled, all forgotten when full.
FILLED_KEPT = 1 << 16

#: The share of the pins' descriptor budget the front's copies of kept versions may use.
DESCRIPTOR_SHARE = 4


def unavailable() -> str | None:
    """Why this installation cannot run the front (None: it can)."""
    if _front is None:
        return "it was not built (scripts/setup builds it, with a C compiler)"
    if not getattr(pyfuse3, "SHARDFS_FRONT_CHANNEL", False):
        return "this pyfuse3 has no front channel (run scripts/setup again)"
    return None


class NativeFront:
    """The front of one mount: made before the mount, `attach`ed after pyfuse3's init and
    before its loop, `stop`ped after the unmount."""

    def __init__(self, storage: Storage, owners: Owners, timeout: float) -> None:
        self._storage = storage
        #: the versions the mount keeps, which lend the front their descriptors (set once
        #: made: they are made after the front, which sets aside its descriptors first)
        self.versions: KernelVersions | None = None
        self._owners = owners
        self._timeout = timeout
        #: descriptors the front may hold (copies of kept versions), set aside from the pins'
        self._kept_max = storage.reserve_descriptors(
            (storage.descriptor_budget() or 0) // DESCRIPTOR_SHARE
        )
        self._c: Any = None  # a `_front.Front` once attached
        #: the directories each slot's rows were given for by `fill` (see there)
        self._filled: dict[int, set[int]] = {}
        self._filled_count = 0
        #: the front's numbers of the kept versions it holds, by (key, version)
        self._ids: dict[tuple[str, Hashable], int] = {}
        self._next_id = itertools.count(1)

    def attach(self) -> None:
        """Start answering: the front reads the device from now on, and pyfuse3 reads what
        it passes on."""
        assert _front is not None
        # (the patch's functions: pyfuse3's own type stubs do not name them)
        device: int = getattr(pyfuse3, "shardfs_device_fd")()  # noqa: B009
        c = _front.Front(device, self._timeout, self._kept_max)
        c.start()  # (what it passes on waits in the channel until pyfuse3 reads it)
        getattr(pyfuse3, "shardfs_use_channel")(c.channel)  # noqa: B009
        self._c = c

    def stop(self) -> None:
        """End the front's thread, after the unmount (its read of the device is
        interrupted: requests Python left unanswered would keep it waiting). If it does not
        end within 5 s, it is left to end with the process, and the log says so."""
        if self._c is not None and not self._c.stop():
            log.warning("the native front did not stop within 5 s of the unmount")

    # -- what Python tells it --------------------------------------------------------

    def directory(self, inode: int, leaf: PreparedDirectory) -> None:
        """`inode` is the prepared directory `leaf`: its rows made before are dropped."""
        key, doc = leaf.document
        path = self._storage.stat_path(key)
        if path is not None and self._c is not None and _is_stat_version(doc.version):
            self._c.directory(inode, path.encode(), doc.version)

    def fill(
        self, parent: int, leaf: PreparedDirectory, found: Found, base: int, slot: int
    ) -> None:
        """Give the front the rows of the shard version `found` (just found by a lookup in
        directory `parent`, and numbered from `base` in `slot`) in that directory; once: if
        the front dropped them for room, the lookups of their chunks are Python's from then
        on (filling them again at each such lookup, with the table full, costs more than
        it saves when readers go back and forth over more than it holds)."""
        c = self._c
        parents = self._filled.get(slot)
        if c is None or (parents is not None and parent in parents):
            return
        rows = leaf.shard_rows(found)
        attr = found[3]
        if rows is None or attr.shard is None:
            return
        key, stat = attr.shard
        ident = self._kept(key, stat)
        if ident is None:
            return
        names, indices, offsets, lengths = rows
        mode, uid, gid = self._owners.of(False, attr.access)
        nodeids = [base + i for i in indices]
        c.fill(parent, ident, slot, names, nodeids, offsets, lengths, stat.mtime_ns, mode, uid, gid)
        if self._filled_count >= FILLED_KEPT:
            self._filled.clear()
            self._filled_count = 0
        self._filled.setdefault(slot, set()).add(parent)
        self._filled_count += 1

    def listing(
        self,
        parent: int,
        total: int,
        first: int,
        made_from: list[tuple[bytes, Any, bool]] | None = None,
    ) -> None:
        """Directory `parent` is listed afresh: `total` positions, its chunk files from
        `first` on. The front answers the pages of it that `fill_listed` makes rows for;
        the first too if the listing was made ahead of the kernel's read of it, while what
        it was made from is as `made_from` says (see `NativeFront.made_from`)."""
        if self._c is not None:
            self._c.listing(parent, total, first, made_from)

    def made_from(self, seen: dict[str, Stat | None]) -> list[tuple[bytes, Any, bool]] | None:
        """What the front checks a listing made ahead by: the files and directories `seen`
        (a recording of what the listing was made from: the directories as of before
        they were listed) as (path, version or None if absent, whether a directory); None
        if one is not local."""
        found: list[tuple[bytes, Any, bool]] = []
        for key, stat in seen.items():
            path = self._storage.stat_path(key)
            if path is None or (stat is not None and not _is_stat_version(stat.version)):
                return None
            if stat is None:
                found.append((path.encode(), None, False))
            else:
                found.append((path.encode(), stat.version, stat.is_dir))
        return found

    def unlist(self, parent: int) -> None:
        """Python dropped its listing of `parent`: so does the front."""
        if self._c is not None:
            self._c.unlist(parent)

    def fill_listed(
        self, parent: int, run: ChunkRun, names: list[bytes], start: int, stop: int,
        position: int, slots: list[tuple[int, Slot]],
    ) -> None:  # fmt: skip
        """Give the front rows [start, stop) of `run` (named `names`), at `position` on of
        the listing of directory `parent` being sent to the kernel with the node ids
        `slots` make (`InodeTable.run_slots`): the reads of those files are answered there,
        the listing's pages from there on, and their lookups too once `parent` is a
        prepared directory."""
        c = self._c
        if c is None:
            return
        for k, first, names_, flat, offsets, lengths in run.stored_rows(names, start, stop):
            key, stat = run.shards[k]
            ident = self._kept(key, stat)
            if ident is None:
                continue
            slot = slots[k][0]
            base = (slot + 1) << SHIFT
            mode, uid, gid = self._owners.of(False, stat.access)
            nodeids = [base + i for i in flat]
            c.fill(
                parent,
                ident,
                slot,
                names_,
                nodeids,
                offsets,
                lengths,
                stat.mtime_ns,
                mode,
                uid,
                gid,
                position + first,
            )

    def _kept(self, key: str, stat: Stat) -> int | None:
        """The front's number of kept version `stat` of `key`, given to it first if new."""
        ident = self._ids.get((key, stat.version))
        if ident is not None:
            return ident
        path = self._storage.stat_path(key)
        if path is None or not _is_stat_version(stat.version):
            return None
        ident = next(self._next_id)
        c, versions = self._c, self.versions
        if c is None or versions is None:
            return None

        def take(fd: int) -> None:
            try:
                kept = c.keep(ident, fd, path.encode(), stat.version)  # owns fd from here
            except BaseException:
                os.close(fd)
                raise
            if kept:
                self._ids[key, stat.version] = ident

        versions.lend(key, stat, take)
        return self._ids.get((key, stat.version))

    # -- what it tells Python --------------------------------------------------------

    def ref(self, slot: int, count: int) -> None:
        """`SlotCounts.ref`: counted in the front's tables (attached: see
        `KernelServing.start_front`)."""
        self._c.ref(slot, count)

    def unref(self, slot: int, count: int) -> int:
        """`SlotCounts.unref`: at 0 the front has dropped the slot and its rows."""
        left: int = self._c.unref(slot, count)
        if not left:
            self._filled.pop(slot, None)
        return left

    def shown_at(self, key: str, version: Hashable) -> float:
        """`KeptElsewhere.shown_at`."""
        ident = self._ids.get((key, version))
        return 0.0 if ident is None or self._c is None else float(self._c.shown_at(ident))

    def drop(self, key: str, version: Hashable) -> None:
        """`KeptElsewhere.drop`."""
        ident = self._ids.pop((key, version), None)
        if ident is not None and self._c is not None:
            self._c.drop(ident)

    def stats(self) -> dict[str, Any]:
        """Requests the front answered and passed on, why it passed them, its tables."""
        return {} if self._c is None else dict(self._c.stats())


def _is_stat_version(version: Hashable) -> bool:
    """Whether `version` is a local file's (dev, inode, size, mtime, ctime), the only
    kind the front checks."""
    return isinstance(version, tuple) and len(version) == 5
