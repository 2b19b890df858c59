"""What every view of a source builds on, whatever its format: the read-only view whose
paths resolve from its root (`SourceView`), the open file (`Reader`), reading the latest version of an object (`latest`) and
checking what is decoded from one (`verified`), opening again what changed meanwhile
(`open_again`) and files shown as stored (`stored_file`).

The Zarr view (`shardfs.view.namespace`), the Neuroglancer precomputed view
(`shardfs.view.precomputed`) and the WKW view (`shardfs.view.wkw`) all serve chunks
cut out of shards and files passed through, pinned to the version seen at open; they
differ only in how a path becomes stored bytes, so that is all each of them says.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import crc32c

from shardfs.primitives.cache import LruCache, detached
from shardfs.primitives.errors import (
    CorruptData,
    NotADirectory,
    NotFound,
    ShardfsError,
    SourceChanged,
    StorageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import Pin, Stat, Storage
from shardfs.view.hierarchy import join
from shardfs.view.nodes import Attr, Extent, Node
from shardfs.view.readahead import ExtentSource, NextShard, ReadAhead

log = logging.getLogger("shardfs")

T = TypeVar("T")

#: Chunks up to this size are read whole on the first read of an open file, so
#: that reading a chunk costs one positioned read of its shard however the
#: kernel splits the file into requests. (On a store with costly requests,
#: passthrough files too.)
WHOLE_CHUNK_LIMIT = 4 << 20


def logged_corruption(message: str) -> CorruptData:
    """A CorruptData whose one log line is written now, so the boundary that maps it to
    EIO, and later requests that meet it again, do not log it again."""
    log.error("%s", message)
    error = CorruptData(message)
    error.logged = True
    return error


def verified(storage: Storage, key: str, stat: Stat, decode: Callable[[], T]) -> T:
    """`decode()` of an index of version `stat` of shard `key`. Its CorruptData is a torn
    view of a shard another writer is changing if the shard is another version by now
    (SourceChanged: read it again); only one that stays is corrupt, logged once."""
    try:
        return decode()
    except CorruptData as e:
        current = storage.stat(key)
        if current is None or current.version != stat.version:
            raise SourceChanged(f"{storage.describe(key)} changed") from None
        raise logged_corruption(
            f"{storage.describe(key)}: corrupt shard, its chunks give EIO: {e}"
        ) from None


def latest(
    storage: Storage,
    key: str,
    load: Callable[[Stat], T],
    listed: Stat | None = None,
    doing: str = "it is read",
) -> T | None:
    """`load(stat)` of object `key` as it is now, or None if there is none (or it is a
    directory); loaded again from a new stat while it changes meanwhile. `listed`, a
    stat just taken, saves asking for the first."""
    for _ in attempts():
        stat, listed = listed or storage.stat(key), None
        if stat is None or stat.is_dir:
            return None
        try:
            return load(stat)
        except SourceChanged:
            continue  # changing while we read it: read the new version
    raise StorageError(f"{storage.describe(key)} keeps changing while {doing}")


def open_again(node: Node, open_: Callable[[Node], Reader]) -> Reader:
    """`open_(node)`, located again while what holds it is replaced meanwhile."""
    for _ in attempts():
        try:
            return open_(node)
        except SourceChanged:
            continue  # replaced since it was located: locate it again
    raise StorageError(f"{node.path} keeps changing while it is opened")


def stored_file(storage: Storage, key: str, path: str, stat: Stat) -> Reader:
    """View path `path` showing version `stat` of object `key` as it is stored."""
    return Reader(storage, path, stat, storage.pin(key, stat), 0, stat.size)


def entry_path(parent: Node, name: str) -> str:
    """The view path of entry `name` of directory node `parent`, refusing what cannot be an
    entry there (NotADirectory, NotFound), before any storage is asked."""
    if not parent.is_dir:
        raise NotADirectory(parent.path)
    if name in ("", ".", "..") or "/" in name:
        raise NotFound(name)
    return join(parent.path, name)


class SourceView(ABC):
    """A read-only view of a source, whose paths resolve by lookups from its root."""

    storage: Storage
    #: Read-only: `Workspace` is the writable side of a Zarr view (see `ViewInterface`).
    writes: None = None

    def root(self) -> Node:
        stat = self.storage.stat("")
        if stat is None or not stat.is_dir:
            raise NotFound("source root is gone")
        return self._root()

    @abstractmethod
    def _root(self) -> Node:
        """The root's node, the source's root being a directory."""

    @abstractmethod
    def lookup(self, parent: Node, name: str) -> Node: ...

    @abstractmethod
    def attr(self, node: Node) -> Attr: ...

    @abstractmethod
    def caches(self) -> dict[str, LruCache | ReadAhead]:
        """The view's caches by the name `shardfs stats` shows."""

    def stats(self) -> dict[str, Any]:
        """Figures for `shardfs stats`: what the source was asked, and each cache's."""
        source = self.storage.stats()
        caches = {name: cache.snapshot() for name, cache in self.caches().items()}
        return {"source": source, "caches": {**caches, **source.pop("caches", {})}}

    def settle(self, timeout: float) -> None:
        """At the end of a mount: wait up to `timeout` seconds for what the caches fetch in
        the background (read-ahead's prefetches), so that it lands, in a disk cache for
        the next mount, instead of being cut off as the daemon exits."""
        deadline = time.monotonic() + timeout
        for cache in self.caches().values():
            if isinstance(cache, ReadAhead):
                cache.settle(max(0.0, deadline - time.monotonic()))

    def entry(self, parent: Node, name: str) -> tuple[Node, Attr]:
        """`lookup` and `attr` in one step, as a FUSE lookup wants them."""
        node = self.lookup(parent, name)
        return node, self.attr(node)

    def cached_chunk(self, extent: Extent) -> bytes | None:
        """The stored bytes `extent` locates if the view holds them in memory (read-ahead
        from a store where every request costs a round trip), with no request and no
        wait; None otherwise."""
        return None

    def resolve(self, path: str) -> Node:
        """The node at a `/`-separated view path ("" is the root)."""
        node = self.root()
        for name in filter(None, path.split("/")):
            node = self.lookup(node, name)
        return node


@dataclass(frozen=True)
class Chunk:
    """What a reader of a chunk cut out of a shard needs beyond its bytes' place: the
    part of the shard that located it (`extents`, walked by `read_ahead`), where a walker
    goes next, and how to open the chunk file again as it is now (`restart`; None where
    the reader must serve the version it was opened as of, as a kernel-served mount's)."""

    read_ahead: ReadAhead
    extents: ExtentSource
    ahead: NextShard | None = None
    restart: Callable[[], Reader] | None = None


class Reader:
    """An open file of a view. Every byte it serves comes from the version seen at open.

    `stored` bytes at `base` of the object that `pin` holds back the file (see
    `Pin`), or `data` made by the view (a rendered document: `pin` None). A
    `chunk` is cut out of a shard; any other pinned file is passed through, and
    one changed in place shows its new content, as on a local file system.

    A chunk up to WHOLE_CHUNK_LIMIT, a file with `decode` (which turns the stored
    bytes into the file's `size` bytes), and on a store with costly requests any
    small file, is read whole on its first read (a chunk through read-ahead) and
    served from memory until it has been read to its end, so that it costs one
    request however the kernel splits its reads. On such a store a file too big
    for that is read in pieces of at least `request_cost` bytes, the rest kept for
    the next read. `close` lets the pinned version go.
    """

    #: Not a file of the write side (see `OpenFile.buffered`).
    buffered = False

    def __init__(
        self,
        storage: Storage,
        path: str,
        stat: Stat,
        pin: Pin | None,
        base: int = 0,
        stored: int = 0,
        size: int | None = None,
        *,
        data: bytes | None = None,
        decode: Callable[[bytes], bytes] | None = None,
        chunk: Chunk | None = None,
    ) -> None:
        self._storage = storage
        self.path = path
        self._stat = stat
        self._pin = pin
        self._base = base
        self._stored = len(data) if data is not None else stored
        self.size = self._stored if size is None else size
        self._data = data
        self._decode = decode
        self._chunk = chunk
        #: the part read-ahead walks
        self._extents = chunk.extents if chunk is not None else None
        self._failed: ShardfsError | None = None
        costly = storage.request_cost > 0
        small = self._stored <= WHOLE_CHUNK_LIMIT
        self._whole = pin is not None and (
            decode is not None or (small and (chunk is not None or costly))
        )
        #: (offset, bytes) read ahead of a partial read on a store with costly requests
        self._ahead: tuple[int, bytes] | None = None
        #: whether a read gave bytes: from then on the file is the version those came from
        self._served = False

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pin is not None:
            self._pin.close()

    @property
    def version(self) -> Hashable:
        """The version it serves: of the object its bytes are cut from (a shard, a file),
        or a rendered document's checksum (`.zmetadata` is made from many documents)."""
        if self._pin is None:
            assert self._data is not None
            return len(self._data), crc32c.crc32c(self._data)
        return self._pin.key, self._stat.version

    def attr(self) -> Attr:
        """The file as opened: what `fstat` shows of it once its path names another file."""
        return Attr(False, self.size, self._stat.mtime_ns, None, self._stat.access)

    def read(self, offset: int, size: int) -> bytes:
        if self._failed is not None:
            raise detached(self._failed)  # the kept one gets no traceback (see `detached`)
        if offset >= self.size or size <= 0:
            return b""
        size = min(size, self.size - offset)
        data = self._data
        if data is None:
            if not self._whole:
                got = self._fetch(offset, size)
                self._served = True
                return got
            data = self._load()
        self._served = True
        # Read to the end: free the buffer of a sequential reader.
        self._data = None if self._whole and offset + size >= self.size else data
        return data[offset : offset + size]

    def _load(self) -> bytes:
        """The whole file: its stored bytes, decoded."""
        stored = self._fetch(0, self._stored)
        if self._decode is None:
            return stored
        try:
            return self._decode(stored)
        except CorruptData as e:
            message = f"{self.path} (stored in {self._describe()}): {e}"
        self._failed = logged_corruption(message)
        raise detached(self._failed)

    def _describe(self) -> str:
        assert self._pin is not None
        return self._storage.describe(self._pin.key)

    def _fetch(self, offset: int, size: int) -> bytes:
        for _ in attempts():
            try:
                return self._read(offset, min(size, max(0, self._stored - offset)))
            except SourceChanged:
                self._ahead = None
                try:
                    self._follow_change()
                except SourceChanged:
                    continue  # changed again while we looked: look again
                except ShardfsError as e:
                    self._failed = detached(e)
                    raise
        raise StorageError(f"{self._describe()} keeps changing while {self.path} is read")

    def _read(self, offset: int, size: int) -> bytes:
        assert self._pin is not None
        chunk, extents = self._chunk, self._extents
        if chunk is not None and extents is not None and offset == 0 and size == self._stored:
            return chunk.read_ahead.read(self._pin, extents, self._base, size, chunk.ahead)
        cost = self._storage.request_cost
        if not cost:
            return self._pin.read(self._base + offset, size)
        if self._ahead is not None:
            start, data = self._ahead
            if start <= offset and offset + size <= start + len(data):
                return data[offset - start : offset - start + size]
        length = min(self._stored - offset, max(size, cost))
        data = self._pin.read(self._base + offset, length)
        self._ahead = (offset, data)
        return data[:size]

    def _follow_change(self) -> None:
        """The object changed while open: carry on only with the same bytes.

        A file passed through and changed in place shows its new content; one
        replaced by another object (S3) fails. A chunk carries on only if the new
        version provably holds the bytes it had at open, and nothing proves that: an
        append leaves the bytes before it, but a rewrite in place before the append
        looks the same afterwards. So its content is gone and every later read fails,
        rather than mixing two versions; unless no read gave any of its bytes yet and
        it may be opened again (`Chunk.restart`) at the same size (the size the client
        holds): it is then the new version, whole, from its first byte (a reader of an
        untouched chunk while another mount appends to its shard).
        """
        assert self._pin is not None
        now = self._pin.current()
        if now is None or now.is_dir:
            raise StorageError(f"{self.path}: {self._describe()} was removed while open")
        chunk = self._chunk
        if chunk is None:
            if not self._pin.in_place:
                raise StorageError(f"{self.path}: {self._describe()} was replaced while open")
            self._pin.follow(now)
            self._stat, self.size, self._stored = now, now.size, now.size
            return
        if not self._served and chunk.restart is not None:
            again = chunk.restart()
            if again.size == self.size:
                pin, self._pin = self._pin, None
                self.__dict__.update(again.__dict__)
                pin.close()
                return
            again.close()
        raise StorageError(f"{self.path}: {self._describe()} was rewritten while open")
