"""The storage interface every backend implements.

Keys are `/`-separated paths relative to the source root ("" is the root).
Calls block and may come from several threads at once, so backends must be
thread-safe. Inside `shardfs.storage.blocking.nonblocking()` a backend must
not wait for I/O: it raises `WouldBlock` instead (see that module). Nothing
above this layer knows which backend it talks to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stat:
    """What the view needs to know about an object or directory.

    `version` changes whenever the content may have changed (for local files:
    inode, size and mtime; for S3 later: the ETag). Caches key on it.
    """

    is_dir: bool
    size: int
    mtime_ns: int
    version: Hashable


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    stat: Stat


class Storage(ABC):
    """A read interface to a tree of objects."""

    @abstractmethod
    def stat(self, key: str) -> Stat | None:
        """The object or directory at `key`, or None if there is none."""

    @abstractmethod
    def list(self, key: str) -> list[Entry]:
        """The entries of directory `key`. Raises NotFound or NotADirectory."""

    @abstractmethod
    def read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        """Exactly `length` bytes of `key` from `offset`.

        If `version` is given and the object is no longer that version, raises
        SourceChanged rather than mixing bytes of two versions. Reading past
        the end raises CorruptData: callers only ask for ranges an index or a
        size promised them.
        """

    @abstractmethod
    def describe(self, key: str) -> str:
        """A human-readable name of `key` for log lines (never includes credentials)."""
