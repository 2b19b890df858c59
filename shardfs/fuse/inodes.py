"""Inode numbers for view nodes, held exactly as long as the kernel holds them."""

from __future__ import annotations

import pyfuse3

from shardfs.view import Node


class InodeTable:
    """Maps inode numbers to nodes by path, with the kernel's lookup counts.

    An inode is dropped when the kernel forgets it (its count reaches zero),
    so the table is bounded by the kernel's own dentry cache. The root is
    never dropped.
    """

    def __init__(self, root: Node) -> None:
        self._nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: root}
        self._by_path: dict[str, int] = {root.path: pyfuse3.ROOT_INODE}
        self._counts: dict[int, int] = {}
        self._next = pyfuse3.ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, ino: int) -> Node:
        return self._nodes[ino]

    def assign(self, node: Node) -> int:
        """The inode of `node`'s path, created if needed; records the newest node."""
        ino = self._by_path.get(node.path)
        if ino is None:
            ino = self._next
            self._next += 1
            self._by_path[node.path] = ino
        self._nodes[ino] = node
        return ino

    def ref(self, ino: int) -> None:
        """The kernel took one more reference (a lookup or a readdirplus entry)."""
        if ino != pyfuse3.ROOT_INODE:
            self._counts[ino] = self._counts.get(ino, 0) + 1

    def forget(self, ino: int, count: int) -> None:
        left = self._counts.get(ino, 0) - count
        if left > 0:
            self._counts[ino] = left
        else:
            self._counts.pop(ino, None)
            self.drop_unreferenced(ino)

    def drop_unreferenced(self, ino: int) -> None:
        """Remove `ino` unless the kernel holds it (or it is the root)."""
        if ino == pyfuse3.ROOT_INODE or ino in self._counts:
            return
        node = self._nodes.pop(ino, None)
        if node is not None and self._by_path.get(node.path) == ino:
            del self._by_path[node.path]

    def unlink(self, path: str) -> None:
        """The file at `path` was removed: a new file there gets a new inode, while the
        old one lives on for the kernel's open handles until it is forgotten."""
        self._by_path.pop(path, None)

    def move(self, old_path: str, node: Node) -> None:
        """The file at `old_path` was renamed to `node.path`: its inode goes with it."""
        ino = self._by_path.pop(old_path, None)
        if ino is None:
            return
        self._by_path[node.path] = ino
        self._nodes[ino] = node
