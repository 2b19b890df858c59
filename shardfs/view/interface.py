"""What a front end needs of a view: the one interface the FUSE adapter programs against.

Four classes implement it: `Namespace` (a Zarr source, read-only), `Workspace`
(a Zarr source, read-write), `PrecomputedNamespace` (a Neuroglancer precomputed
source, read-only) and `WkwNamespace` (a WKW dataset, read-only). A front end asks `writes` for the writable side instead of
checking types, and never reaches past these methods into the classes behind
them, so a new view (or a new front end, such as an HTTP server) only has to
meet these two protocols.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shardfs.storage.base import Stat, Storage
    from shardfs.view.base import Reader
    from shardfs.view.nodes import ArrayView, Attr, Extent, Listing, Node
    from shardfs.view.shards import Shards

#: What a lookup of a chunk file in a prepared directory finds: its array, its coordinates,
#: its index in the array's grid (C order: what its inode number is made from), its
#: attributes, and the versions of the objects they come from (document, shard) in that
#: order.
Found = tuple["ArrayView", tuple[int, ...], int, "Attr", dict[str, "Stat | None"]]
#: Chunk files of one shard version in one directory (`PreparedDirectory.shard_rows`):
#: names, grid indices, offsets and lengths in the shard.
Rows = tuple[list[bytes], list[int], list[int], list[int]]


class PreparedDirectory(Protocol):
    """A directory of chunk files prepared for lookups (`shardfs.view.leaves`): the view's
    fast path, and what a front end that answers lookups itself (the native front) fills
    its rows from."""

    #: the array whose chunk files it holds
    array_key: str

    @property
    def document(self) -> tuple[str, Stat]:
        """The array's stored document, and the version the directory was made as of."""
        ...

    def entry(self, name: str) -> Found | None:
        """The chunk file `name` (MissingChunk if the array has no such chunk), or None
        where only the long way (`ViewInterface.entry`) can tell."""
        ...

    def shard_rows(self, found: Found) -> Rows | None:
        """The chunk files here stored in the shard version `found` is stored in."""
        ...

    def names_ahead(self, found: Found, count: int) -> list[str]:
        """The first chunk file of each of the `count` shards after `found`'s, here."""
        ...


class DigestSource(Protocol):
    """Where the md5 of a chunk file served as stored is taken from (a Zarr namespace):
    `ViewInterface.digest_source`."""

    shards: Shards

    def refresh(self, node: Node) -> Node: ...

    def open(self, node: Node) -> Reader: ...


class OpenFile(Protocol):
    """An open file of the view: a reader of a version of the source, or a buffered file
    being written."""

    #: Whether it is a file of the write side, whose bytes are in the write buffer: what
    #: the `Writes` calls that take a handle take.
    buffered: bool

    def read(self, offset: int, size: int) -> bytes: ...

    def attr(self) -> Attr:
        """The file as opened, whatever its path names now."""
        ...


class Opened(OpenFile, Protocol):
    """What `ViewInterface.open` gives: a reader that may pin a version of the source."""

    @property
    def version(self) -> Hashable:
        """The version of the source it serves: equal for two readers of one file only if
        they serve the same bytes."""
        ...

    def close(self) -> None: ...


class WriteHandle(OpenFile, Protocol):
    """A file open for writing through `Writes`."""

    #: Whether closing it stores it in the source (metadata documents, files passed
    #: through): a front end then closes it where waiting for I/O is allowed.
    stores_on_close: bool


class ViewInterface(Protocol):
    """The read side of a view, and the way to its write side."""

    #: Where its files are stored: what a front end that caches records versions of (see
    #: `shardfs.view.shown`).
    storage: Storage

    @property
    def writes(self) -> Writes | None:
        """The writable side of this view, or None where the view is read-only."""
        ...

    def root(self) -> Node: ...

    def resolve(self, path: str) -> Node: ...

    def entry(self, parent: Node, name: str) -> tuple[Node, Attr]: ...

    def attr(self, node: Node) -> Attr: ...

    def chunk_directory(self, path: str) -> PreparedDirectory | None:
        """The directory `path` of chunk files, prepared for lookups, if a lookup there
        prepared it; None in views that prepare none."""
        ...

    def cached_chunk(self, extent: Extent) -> bytes | None: ...

    def listing(self, node: Node) -> Listing: ...

    def open(self, node: Node) -> Opened: ...

    def digest_source(self, node: Node) -> DigestSource | None:
        """The Zarr namespace whose stored bytes `node` serves as they are stored, so that
        their md5 can be taken and kept by where they are stored; None where the node is
        not such a chunk file (another file, a precomputed chunk, a chunk written through
        the mount and not yet committed)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Figures for `shardfs stats`: what the source was asked and each cache's."""
        ...

    def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for background fetches in flight (the mount ends)."""
        ...


class Writes(Protocol):
    """The write side of a read-write view. Every call does its I/O before it changes any
    state, so a front end may retry it (see `shardfs.primitives.blocking`)."""

    def open(self, node: Node, flags: int) -> OpenFile:
        """A reader, or a `WriteHandle` where `flags` ask for writing."""
        ...

    def reopen(self, handle: WriteHandle, flags: int) -> WriteHandle: ...

    def create(self, parent: Node, name: str) -> tuple[Node, Attr, WriteHandle]: ...

    def mkdir(self, parent: Node, name: str) -> tuple[Node, Attr]: ...

    def rmdir(self, parent: Node, name: str) -> Node: ...

    def unlink(self, parent: Node, name: str) -> Node: ...

    def rename(
        self, old: Node, old_name: str, new: Node, new_name: str, noreplace: bool
    ) -> tuple[Node, Node, bool]: ...

    def link(self, node: Node, new_parent: Node, new_name: str) -> tuple[Node, Attr]: ...

    def truncate(self, node: Node, size: int) -> Attr: ...

    def truncate_open(self, handle: WriteHandle, size: int) -> Attr: ...

    def write(self, handle: WriteHandle, offset: int, data: bytes) -> int: ...

    def flush(self, handle: WriteHandle) -> None: ...

    def fsync(self, handle: WriteHandle) -> None: ...

    def release(self, handle: WriteHandle) -> None: ...

    def sync(self) -> int:
        """Commit everything buffered; how many chunks could not be stored."""
        ...
