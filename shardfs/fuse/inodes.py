"""Inode numbers for view nodes, without an entry per chunk.

A chunk's inode number is derived from its position: the array's slot (one
small record per array and grid shape) and the chunk's index in C order of
the grid. So a listing of a million chunks, and the kernel holding all of
them, costs the table nothing, and any derived number resolves back to its
node. Every other node (directories, metadata documents, passed-through
files) has an entry, held exactly as long as the kernel holds the inode:
until it forgets it.

A derived number keeps its meaning while nothing changes. When a chunk file
is renamed or unlinked on a writable mount, its derived number is "claimed"
by an entry that says what the kernel's inode now is (the file at its new
path, or the removed file), until the kernel forgets it; meanwhile a new
file at the old position gets a counted number instead.

On a kernel-served mount (`versioned`) a slot stands for one version of a
chunk file's bytes as well: the array's stored document and the shard the
chunk is stored in, each at one version. So a node id names exactly one
version's bytes and attributes, whatever order the kernel applies replies in
(see docs/design.md, "One node id, one version"). Such a slot lives while the
kernel holds any of its numbers: lookups and listed entries count up, forgets
down, and a slot at zero is let go and its number given to the next version.
Those counts have one owner (`SlotCounts`): this table's, or the native
front's when it runs, which answers lookups itself.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Protocol

import numpy as np
import pyfuse3

from shardfs.primitives.errors import UnknownNode
from shardfs.storage.base import Stat
from shardfs.view import Node, Role
from shardfs.view.hierarchy import join
from shardfs.view.nodes import ArrayView, ChunkRun
from shardfs.view.shown import Shown

#: Derived numbers are (slot + 1) << SHIFT | index; counted ones stay below 1 << SHIFT.
SHIFT = 40
#: At most this many array slots (so that every number fits in 63 bits).
SLOTS = (1 << (63 - SHIFT)) - 1
#: Slots of a versioned table, each about 400 bytes: versions of shards the kernel holds
#: chunk files of at once. Beyond it, chunks of new versions get counted numbers.
VERSIONED_SLOTS = 1 << 20
#: Slots let go that keep their numbers for the same version (about 200 bytes each).
RETIRED_KEPT = 1 << 16


class SlotCounts(Protocol):
    """The one owner of the kernel's references to each slot's node ids."""

    def ref(self, slot: int, count: int) -> None:
        """The kernel took `count` more references to node ids of `slot`."""

    def unref(self, slot: int, count: int) -> int:
        """The kernel forgot `count` of them (0: only asks): how many it holds still. At 0
        the owner forgets the slot in the same step, so that the table may let it go."""


class Counts:
    """`SlotCounts` kept here: a mount whose every lookup Python answers."""

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}

    def ref(self, slot: int, count: int) -> None:
        self._refs[slot] = self._refs.get(slot, 0) + count

    def unref(self, slot: int, count: int) -> int:
        left = self._refs.get(slot, 0) - count
        if left > 0:
            self._refs[slot] = left
            return left
        self._refs.pop(slot, None)
        return 0


class FileVersion:
    """A counted node id of a versioned table: one file at one version of the object its
    bytes come from (`shard`: its key and stat), as `shown`."""

    __slots__ = ("by_path", "shard", "shown")

    def __init__(self, by_path: Hashable, shard: tuple[str, Stat]) -> None:
        self.by_path = by_path
        self.shard = shard
        self.shown = Shown(-1, 0.0, {shard[0]: shard[1]})


class Slot:
    """What the derived numbers of one slot stand for: an array's chunks (`grid`) as of
    `array`, and on a versioned table as of `shown`: the array's document and one shard,
    each at one version (`shard`: its key and stat). What the kernel holds of it is
    counted by the table's `SlotCounts`."""

    __slots__ = ("array", "grid", "key", "shard", "shown", "slot_key")

    def __init__(
        self, slot_key: Hashable, array: ArrayView, shard: tuple[str, Stat] | None
    ) -> None:
        self.slot_key = slot_key
        self.key = array.key
        self.grid = array.layout.grid
        self.array = array
        self.shard = shard
        self.shown: Shown | None = None
        if shard is not None:
            stats: dict[str, Stat | None] = {shard[0]: shard[1]}
            if array.source is not None:
                stats = {array.source: array.metadata, **stats}
            self.shown = Shown(-1, 0.0, stats)


class InodeTable:
    """Maps inode numbers to nodes, and keeps the kernel's lookup counts where it must.

    `budget` bounds the counted entries: beyond it, `over_budget` names the
    entries the kernel should be asked to forget (see the adapter). The root
    is never dropped.
    """

    def __init__(self, root: Node, budget: int = 100_000, versioned: bool = False) -> None:
        self.budget = budget
        #: a slot per version of each shard (kernel-served mounts: see the module's docstring)
        self.versioned = versioned
        self._nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: root}
        #: by path, or on a versioned table by (path, key, version) for a file
        self._by_path: dict[Hashable, int] = {root.path: pyfuse3.ROOT_INODE}
        #: the counted node ids of a versioned table that name one version of a file
        self._file_versions: dict[int, FileVersion] = {}
        self._counts: dict[int, int] = {}
        self._next = pyfuse3.ROOT_INODE + 1
        self._slots: dict[int, Slot] = {}
        self._slot_of: dict[Hashable, int] = {}
        #: slots let go (versioned tables), by what they stood for, the oldest first: the
        #: same version comes back to the same numbers while it is here
        self._retired: OrderedDict[Hashable, int] = OrderedDict()
        #: slot numbers given up by `_retired`, given out again once no fresh one is left
        self._free: list[int] = []
        #: the next slot number never given out
        self._fresh = 0
        #: how many slots were let go: a number memoised with an older epoch may stand
        #: for another version now
        self.epoch = 0
        self._slot_budget = VERSIONED_SLOTS if versioned else SLOTS
        #: derived numbers that entries hold (see the module's docstring)
        self._claimed: set[int] = set()
        #: entries the kernel was asked to forget (see `over_budget`)
        self._asked: set[int] = set()
        #: inodes of files unlinked or renamed over: they live on only in open files
        self._removed: set[int] = set()
        #: the kernel's references to each slot (versioned tables), by their one owner: set
        #: before the kernel's first request (the native front's, when it runs)
        self.counts: SlotCounts = Counts()

    def __len__(self) -> int:
        """Entries held (derived numbers that nothing claimed are not entries)."""
        return len(self._nodes)

    # -- derived numbers -------------------------------------------------------------

    def _slot(self, array: ArrayView, shard: tuple[str, Stat] | None = None) -> int | None:
        """The slot of `array`'s grid (on a versioned table: as of its document's version
        and `shard`'s), made on first sight; None if its chunks cannot be numbered by
        position (too many chunks, or too many slots, or a versioned table not told the
        shard)."""
        grid = array.layout.grid
        if self.versioned:
            if shard is None:
                return None
            slot_key: Hashable = (array.key, grid, array.version, shard[0], shard[1].version)
        else:
            slot_key = (array.key, grid)
        slot = self._slot_of.get(slot_key)
        if slot is None:
            if math.prod(grid) > 1 << SHIFT or len(self._slots) >= self._slot_budget:
                return None
            slot = self._retired.pop(slot_key, None)
            if slot is None:
                if self._fresh < SLOTS:
                    slot, self._fresh = self._fresh, self._fresh + 1
                elif self._free:
                    slot = self._free.pop()
                elif self._retired:
                    slot = self._retired.popitem(last=False)[1]
                else:
                    return None
            self._slot_of[slot_key] = slot
            self._slots[slot] = Slot(slot_key, array, shard)
        else:
            found = self._slots[slot]
            if found.array is not array:
                found.array = array
        return slot

    def _derived(self, node: Node, shard: tuple[str, Stat] | None = None) -> int | None:
        if node.role is not Role.CHUNK or node.meta is None:
            return None
        slot = self._slot(node.array, shard)
        if slot is None:
            return None
        index = 0
        for coord, size in zip(node.coords, node.array.layout.grid, strict=True):
            index = index * size + coord  # C order, as np.ravel_multi_index (slow for one)
        return (slot + 1) << SHIFT | index

    def chunk_base(self, array: ArrayView, shard: tuple[str, Stat] | None = None) -> int | None:
        """What the inode number of a chunk of `array` (stored in `shard`, on a versioned
        table) is, less its index in the grid (C order); None if its chunks need entries.
        Only while no derived number is claimed: on mounts whose chunk files are never
        renamed or unlinked (read-only ones)."""
        slot = self._slot(array, shard)
        return None if slot is None or self._claimed else (slot + 1) << SHIFT

    def run_inodes(self, run: ChunkRun, start: int, stop: int) -> list[int] | None:
        """The inode numbers of chunks [start, stop) of a run, or None if they need entries
        (see `assign`). On a versioned table each row's slot is its shard version's."""
        if self.versioned:
            slots = self.run_slots(run)
            if not slots:
                return None
            bases = np.array([(slot + 1) << SHIFT for slot, _ in slots], np.int64)
            numbers = (run.flat[start:stop] + bases[run.shard[start:stop]]).tolist()
        else:
            slot = self._slot(run.array)
            if slot is None:
                return None
            numbers = (run.flat[start:stop] + ((slot + 1) << SHIFT)).tolist()
        if self._claimed and not self._claimed.isdisjoint(numbers):
            return None
        return numbers

    def run_slots(self, run: ChunkRun) -> list[tuple[int, Slot]]:
        """The slot (number, record) of each shard of `run` (`run.shards` order), what its
        numbers are made from; none on a table not versioned, or if one cannot be made."""
        if not self.versioned:
            return []
        found = []
        for shard in run.shards:
            slot = self._slot(run.array, shard)
            if slot is None:
                return []
            found.append((slot, self._slots[slot]))
        return found

    def holds(self, slots: dict[int, Slot]) -> bool:
        """Whether every one of `slots` still stands for what it stood for (a slot let go
        may be given to another version)."""
        return all(self._slots.get(slot) is found for slot, found in slots.items())

    def slot(self, ino: int) -> Slot | None:
        """The slot a derived number stands for (None for a counted one, or one let go)."""
        return self._slots.get((ino >> SHIFT) - 1)

    def ref_slot(self, slot: int, count: int) -> None:
        """The kernel took `count` references to node ids of `slot` (`ref`, in bulk)."""
        self.counts.ref(slot, count)

    def _unref_slot(self, ino: int, count: int) -> None:
        """A derived number forgotten `count` times: a versioned slot the kernel holds none
        of any more is let go, and its number given to the next version."""
        slot = (ino >> SHIFT) - 1
        found = self._slots.get(slot)
        if found is None or not self.versioned:
            return
        if not self.counts.unref(slot, count):
            self._let_go(slot, found)

    def _let_go(self, slot: int, found: Slot) -> None:
        """The kernel holds no number of `slot`: its record goes, and its number waits in
        `_retired`, so that the same version, looked up again, gets the same numbers."""
        self.epoch += 1
        del self._slots[slot]
        del self._slot_of[found.slot_key]
        self._retired[found.slot_key] = slot
        if len(self._retired) > RETIRED_KEPT:
            self._free.append(self._retired.popitem(last=False)[1])

    def full(self) -> bool:
        """Whether a versioned table has no slot left for a new version."""
        return self.versioned and len(self._slots) >= self._slot_budget

    def sweep(self, held: set[int]) -> None:
        """Let go of the slots the kernel holds no number of (made for listed rows that
        were never sent), but those of `held` (rows still to be sent)."""
        for slot, found in list(self._slots.items()):
            if slot not in held and not self.counts.unref(slot, 0):
                self._let_go(slot, found)

    # -- the table ---------------------------------------------------------------------

    def found(self, ino: int) -> Node:
        """The node of `ino`; UnknownNode if it means nothing (any more): the kernel holds
        only what it was given, so this is a defect, never a missing file."""
        try:
            return self.node(ino)
        except KeyError:
            raise UnknownNode(f"node id {ino} is not one the kernel was given") from None

    def node(self, ino: int) -> Node:
        """The node of `ino`; KeyError if it means nothing (any more)."""
        node = self._nodes.get(ino)
        if node is not None:
            return node
        found = self._slots.get((ino >> SHIFT) - 1)
        index = ino & ((1 << SHIFT) - 1)
        if found is None:
            raise KeyError(ino)
        key, grid, array = found.key, found.grid, found.array
        if index >= math.prod(grid):
            raise KeyError(ino)
        coords: list[int] = []
        for size in reversed(grid):  # C order, as np.unravel_index (slow for one)
            index, coord = divmod(index, size)
            coords.append(coord)
        coords.reverse()
        return Node(join(key, array.names.encode(coords)), Role.CHUNK, array, tuple(coords))

    def inode_of(self, path: str) -> int | None:
        """The inode of a counted node's path (a directory's), if the kernel holds it."""
        return self._by_path.get(path)

    def assign(self, node: Node, shard: tuple[str, Stat] | None = None) -> int:
        """The inode of `node`'s path (a chunk stored in `shard`, on a versioned table), made
        if needed; an entry records the newest node."""
        if shard is not None and self.versioned:  # (read-only: no path is claimed)
            derived = self._derived(node, shard)
            if derived is not None:
                return derived
            return self._file_version(node, shard)
        ino = self._by_path.get(node.path)
        if ino is None:
            derived = self._derived(node, shard)
            if derived is not None and derived not in self._claimed:
                return derived
            ino = self._next
            self._next += 1
            self._by_path[node.path] = ino
        self._nodes[ino] = node
        return ino

    def _file_version(self, node: Node, shard: tuple[str, Stat]) -> int:
        """A counted node id for `node` as of `shard`'s version: a file whose bytes come
        from one object (passed through, or a chunk whose slots ran out)."""
        by_path = (node.path, shard[0], shard[1].version)
        ino = self._by_path.get(by_path)
        if ino is None:
            ino = self._next
            self._next += 1
            self._by_path[by_path] = ino
            self._file_versions[ino] = FileVersion(by_path, shard)
        self._nodes[ino] = node
        return ino

    def version(self, ino: int) -> Slot | FileVersion | None:
        """What version node id `ino` names, on a versioned table (None: a directory, a
        document rendered from several objects, or a table not versioned)."""
        if ino >> SHIFT:
            found = self._slots.get((ino >> SHIFT) - 1)
            return found if found is not None and found.shown is not None else None
        return self._file_versions.get(ino)

    def ref(self, ino: int) -> None:
        """The kernel took one more reference (a lookup or a readdirplus entry)."""
        if ino != pyfuse3.ROOT_INODE and ino in self._nodes:
            self._counts[ino] = self._counts.get(ino, 0) + 1
        elif self.versioned and ino >> SHIFT and (ino >> SHIFT) - 1 in self._slots:
            self.counts.ref((ino >> SHIFT) - 1, 1)

    def forget(self, ino: int, count: int) -> None:
        if ino not in self._nodes:
            self._unref_slot(ino, count)  # a derived number: only its slot's count
            return
        left = self._counts.get(ino, 0) - count
        if left > 0 and not ino >> SHIFT:
            self._counts[ino] = left
        else:
            # A claimed derived number is dropped at the first forget: the kernel sends
            # one when it evicts the inode, with the whole count.
            self._counts.pop(ino, None)
            self.drop_unreferenced(ino)

    def drop_unreferenced(self, ino: int) -> None:
        """Remove the entry of `ino` unless the kernel holds it (or it is the root)."""
        if ino == pyfuse3.ROOT_INODE or ino in self._counts:
            return
        node = self._nodes.pop(ino, None)
        self._claimed.discard(ino)
        self._asked.discard(ino)
        self._removed.discard(ino)
        version = self._file_versions.pop(ino, None)
        if node is not None:
            by_path = node.path if version is None else version.by_path
            if self._by_path.get(by_path) == ino:
                del self._by_path[by_path]

    def over_budget(self) -> list[tuple[int, str]]:
        """(parent inode, name) of the oldest counted entries beyond the budget, not asked
        for before: for the kernel to be asked to forget them (the table shrinks when it
        does). Asks for a tenth of the budget more, so that it is not asked at every entry."""
        excess = len(self._counts) - len(self._asked) - self.budget
        if excess <= 0:
            return []
        wanted: list[tuple[int, str]] = []
        for ino in self._counts:
            if len(wanted) >= excess + self.budget // 10:
                break
            if ino in self._asked:
                continue
            parent, _, name = self._nodes[ino].path.rpartition("/")
            parent_ino = self._by_path.get(parent)
            if parent_ino is not None and name:
                self._asked.add(ino)
                wanted.append((parent_ino, name))
        return wanted

    # -- changes of a writable mount -------------------------------------------------------

    def unlink(self, node: Node) -> None:
        """The file `node` was removed (or renamed over): a new file at its path gets a
        new inode, while the old one lives on for the kernel's open handles until it is
        forgotten. Its path no longer speaks for it (see `removed`)."""
        ino = self._by_path.pop(node.path, None)
        if ino is None:
            ino = self._derived(node)
            if ino is None:
                return
            self._nodes[ino] = node  # claimed, without a path
            self._claimed.add(ino)
            self._counts.pop(ino, None)
        self._removed.add(ino)

    def removed(self, ino: int) -> bool:
        """Whether `ino` is a file that was unlinked or renamed over: only its open files
        can say what it holds (its path now names another file, or none)."""
        return ino in self._removed

    def move(self, old: Node, new: Node) -> None:
        """The file `old` was renamed to `new`: its inode goes with it."""
        ino = self._by_path.pop(old.path, None)
        if ino is None:
            ino = self._derived(old)
            if ino is None:
                return
            self._claimed.add(ino)
            self._counts.pop(ino, None)
        self._by_path[new.path] = ino
        self._nodes[ino] = new
