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
"""

from __future__ import annotations

import math

import pyfuse3

from shardfs.view import Node, Role
from shardfs.view.hierarchy import join
from shardfs.view.nodes import ArrayView, ChunkRun

#: Derived numbers are (slot + 1) << SHIFT | index; counted ones stay below 1 << SHIFT.
SHIFT = 40
#: At most this many array slots (so that every number fits in 63 bits).
SLOTS = (1 << (63 - SHIFT)) - 1


class InodeTable:
    """Maps inode numbers to nodes, and keeps the kernel's lookup counts where it must.

    `budget` bounds the counted entries: beyond it, `over_budget` names the
    entries the kernel should be asked to forget (see the adapter). The root
    is never dropped.
    """

    def __init__(self, root: Node, budget: int = 100_000) -> None:
        self.budget = budget
        self._nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: root}
        self._by_path: dict[str, int] = {root.path: pyfuse3.ROOT_INODE}
        self._counts: dict[int, int] = {}
        self._next = pyfuse3.ROOT_INODE + 1
        #: per slot, (array key, grid, the array as last seen)
        self._slots: list[tuple[str, tuple[int, ...], ArrayView]] = []
        self._slot_of: dict[tuple[str, tuple[int, ...]], int] = {}
        #: derived numbers that entries hold (see the module's docstring)
        self._claimed: set[int] = set()
        #: entries the kernel was asked to forget (see `over_budget`)
        self._asked: set[int] = set()
        #: inodes of files unlinked or renamed over: they live on only in open files
        self._removed: set[int] = set()

    def __len__(self) -> int:
        """Entries held (derived numbers that nothing claimed are not entries)."""
        return len(self._nodes)

    # -- derived numbers -------------------------------------------------------------

    def _slot(self, array: ArrayView) -> int | None:
        """The slot of `array`'s grid, made on first sight; None if its chunks cannot be
        numbered by position (too many chunks, or too many arrays)."""
        grid = array.layout.grid
        slot = self._slot_of.get((array.key, grid))
        if slot is None:
            if math.prod(grid) > 1 << SHIFT or len(self._slots) >= SLOTS:
                return None
            slot = len(self._slots)
            self._slot_of[(array.key, grid)] = slot
            self._slots.append((array.key, grid, array))
        elif self._slots[slot][2] is not array:
            self._slots[slot] = (array.key, grid, array)
        return slot

    def _derived(self, node: Node) -> int | None:
        if node.role is not Role.CHUNK or node.meta is None:
            return None
        slot = self._slot(node.array)
        if slot is None:
            return None
        index = 0
        for coord, size in zip(node.coords, node.array.layout.grid, strict=True):
            index = index * size + coord  # C order, as np.ravel_multi_index (slow for one)
        return (slot + 1) << SHIFT | index

    def chunk_base(self, array: ArrayView) -> int | None:
        """What the inode number of a chunk of `array` is, less its index in the grid (C
        order); None if its chunks need entries. Only while no derived number is claimed:
        on mounts whose chunk files are never renamed or unlinked (read-only ones)."""
        slot = self._slot(array)
        return None if slot is None or self._claimed else (slot + 1) << SHIFT

    def run_inodes(self, run: ChunkRun, start: int, stop: int) -> list[int] | None:
        """The inode numbers of chunks [start, stop) of a run, or None if they need entries
        (see `assign`)."""
        slot = self._slot(run.array)
        if slot is None:
            return None
        numbers = (run.flat[start:stop] + ((slot + 1) << SHIFT)).tolist()
        if self._claimed and not self._claimed.isdisjoint(numbers):
            return None
        return numbers

    # -- the table ---------------------------------------------------------------------

    def node(self, ino: int) -> Node:
        """The node of `ino`; KeyError if it means nothing (any more)."""
        node = self._nodes.get(ino)
        if node is not None:
            return node
        slot, index = (ino >> SHIFT) - 1, ino & ((1 << SHIFT) - 1)
        if not 0 <= slot < len(self._slots):
            raise KeyError(ino)
        key, grid, array = self._slots[slot]
        if index >= math.prod(grid):
            raise KeyError(ino)
        coords: list[int] = []
        for size in reversed(grid):  # C order, as np.unravel_index (slow for one)
            index, coord = divmod(index, size)
            coords.append(coord)
        coords.reverse()
        return Node(join(key, array.names.encode(coords)), Role.CHUNK, array, tuple(coords))

    def assign(self, node: Node) -> int:
        """The inode of `node`'s path, made if needed; an entry records the newest node."""
        ino = self._by_path.get(node.path)
        if ino is None:
            derived = self._derived(node)
            if derived is not None and derived not in self._claimed:
                return derived
            ino = self._next
            self._next += 1
            self._by_path[node.path] = ino
        self._nodes[ino] = node
        return ino

    def ref(self, ino: int) -> None:
        """The kernel took one more reference (a lookup or a readdirplus entry)."""
        if ino != pyfuse3.ROOT_INODE and ino in self._nodes:
            self._counts[ino] = self._counts.get(ino, 0) + 1

    def forget(self, ino: int, count: int) -> None:
        if ino not in self._nodes:
            return  # a derived number: nothing kept
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
        if node is not None and self._by_path.get(node.path) == ino:
            del self._by_path[node.path]

    def over_budget(self) -> list[tuple[int, str]]:
        """(parent inode, name) of the oldest counted entries beyond the budget, not asked
        for before: for the kernel to be asked to forget them (the table shrinks when it
        does). Asks for a tenth of the budget more, so that it is not asked at every entry."""
        excess = len(self._counts) - len(self._asked) - self.budget
        if excess <= 0:
            return []
        wanted = []
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
