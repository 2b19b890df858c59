"""The storage interface every backend implements.

Keys are `/`-separated paths relative to the source root ("" is the root).
Calls block and may come from several threads at once, so backends must be
thread-safe. Inside `shardfs.primitives.blocking.nonblocking()` a backend must
not wait for I/O: it raises `WouldBlock` instead (see that module). Nothing
above this layer knows which backend it talks to.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final


class _Absent(Enum):
    """The type of ABSENT: an enum member is a singleton that survives pickling."""

    ABSENT = "ABSENT"

    def __repr__(self) -> str:
        return "ABSENT"


#: A stored object's (st_mode, st_uid, st_gid), as its stat tells: what the mount shows
#: of its owner and mode (see `shardfs.fuse.owners`).
Access = tuple[int, int, int]
#: What a reader asks of a stored object (a `Need`): to read it, to search it (a directory).
READ, SEARCH = 0o4, 0o1
#: (whether it is a directory, its access, what is asked of it: `READ` | `SEARCH`)
Need = tuple[bool, Access | None, int]

ABSENT: Final = _Absent.ABSENT
"""An `expect` meaning "the object must not exist" (there is no version to name)."""


@dataclass(frozen=True, slots=True)
class Stat:
    """What the view needs to know about an object or directory.

    `version` changes whenever the content may have changed (for local files:
    inode, size and mtime; for S3 later: the ETag). Caches key on it. `access` is the
    object's mode, owner and group where the store has them (local files: from the
    same stat, and a chmod or chown changes the version through the ctime); None on S3.
    """

    is_dir: bool
    size: int
    mtime_ns: int
    version: Hashable
    access: Access | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    stat: Stat


class RequestCounts:
    """The requests a store was sent, by kind, and the bytes they moved: what `shardfs
    stats` shows of a source. Thread-safe: the view's worker threads share a store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.kinds: Counter[str] = Counter()
        #: failed answers by status or error name (a request retried and then answered
        #: counts once per failed attempt)
        self.errors: Counter[str] = Counter()
        self.retries = 0
        self.bytes_read = 0
        self.bytes_written = 0

    def add(self, kind: str, read: int = 0, written: int = 0) -> None:
        with self._lock:
            self.kinds[kind] += 1
            self.bytes_read += read
            self.bytes_written += written

    def moved(self, read: int = 0, written: int = 0) -> None:
        """Bytes of a request already counted (a body read after its answer came)."""
        with self._lock:
            self.bytes_read += read
            self.bytes_written += written

    def failed(self, error: str, retries: int = 0) -> None:
        with self._lock:
            self.errors[error] += 1
            self.retries += retries

    def retried(self, retries: int) -> None:
        with self._lock:
            self.retries += retries

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(sorted(self.kinds.items())),
                "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written,
                "errors": dict(sorted(self.errors.items())),
                "retries": self.retries,
            }


class Pin:
    """Reads of one version of an object, for as long as the store can vouch for its bytes.

    An open file of the view reads through a pin, so every byte it gets comes from
    the version it was opened on, never from a later one (mountpoint-s3 pins the
    ETag the same way). This default pins the version by name: each read asks the
    store for exactly that version and raises SourceChanged once the object is
    another. A store that can keep a replaced version readable (a local file's
    inode) overrides it.
    """

    #: Whether a new version of the pinned object is that object changed in place (a
    #: local file's inode), which a reader of a plain file may follow as a local file
    #: system would; not where every version is a new object (S3), whose bytes must
    #: never be mixed with the old one's.
    in_place = False
    #: Whether the pin keeps its version readable after the object is replaced (a local
    #: file's inode, held open): worth keeping to serve that version later (see `as_of`).
    keeps_version = False

    def __init__(self, storage: Storage, key: str, stat: Stat) -> None:
        self.storage = storage
        self.key = key
        #: the version served; `follow` moves it on
        self.stat = stat

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of version `stat`; SourceChanged once it is gone."""
        return self.storage.read(self.key, offset, length, self.stat.version)

    def read_tail(self, length: int) -> bytes:
        """The last `length` bytes of version `stat` (see `Storage.read_tail`)."""
        return self.storage.read_tail(self.key, length, self.stat.size, self.stat.version)

    def current(self) -> Stat | None:
        """The pinned object as it is now: None if it is gone."""
        return self.storage.stat(self.key)

    def follow(self, stat: Stat) -> None:
        """Serve version `stat` from now on. Only for a caller that proved the bytes it
        will read are the same in `stat` as in the version pinned."""
        self.stat = stat

    def clone(self) -> Pin:
        """Another pin on the same version, to be closed on its own."""
        return Pin(self.storage, self.key, self.stat)

    def duplicate(self) -> int | None:
        """A descriptor of the version, of the caller's own (it closes it), if the pin holds
        one and it still is that version: what the native front reads it with. None else."""
        return None

    def advise(self, offset: int, length: int) -> None:
        """Hint that bytes [offset, offset + length) will be read soon: a store that can
        start fetching them without waiting (a local file: the kernel's read-ahead) does."""

    def close(self) -> None:
        """Let the version go. Reads afterwards are not allowed."""


#: A pin of its own (the caller closes it) on a kept version, by (key, version), or None;
#: for `Storage.as_of`.
KeptPins = Callable[[str, Hashable], Pin | None]


@dataclass(frozen=True)
class _Overlay:
    storage: Storage
    stats: Mapping[str, Stat | None]
    kept: KeptPins


class _Unseen(Enum):
    """The type of _UNSEEN, so that `is _UNSEEN` tells the type checker what is left."""

    UNSEEN = "UNSEEN"


#: This thread's overlay (`Storage.as_of`) and recording (`Storage.recording`), if any.
_thread = threading.local()
_UNSEEN: Final = _Unseen.UNSEEN


class Storage(ABC):
    """A tree of objects: reads, plus conditional writes.

    Every write names the version it was computed from (`expect`), so two
    writers that read the same version cannot both win: the loser gets
    SourceChanged and re-reads. Backends implement this with whatever their
    store offers (file locks locally, conditional PUTs on S3). Writes always
    wait for I/O, so in non-blocking mode they raise WouldBlock.
    """

    #: Bytes worth reading in vain to save one request: 0 where a read costs
    #: little more than its bytes (a local disk, with the kernel's read-ahead);
    #: large where each request has a round trip (an object store). Readers
    #: above merge nearby ranges and read ahead only when this is not 0.
    request_cost: int = 0

    #: What the store was asked (each backend makes its own in `__init__`).
    counts: RequestCounts

    def stats(self) -> dict[str, Any]:
        """Requests, bytes, errors, and the store's own caches, for `shardfs stats`."""
        return self.counts.snapshot()

    # Reads go through these wrappers, which apply this thread's overlay and recording;
    # backends implement the underscored methods.

    def stat(self, key: str) -> Stat | None:
        """The object or directory at `key`, or None if there is none."""
        overlay: _Overlay | None = getattr(_thread, "overlay", None)
        if overlay is not None and overlay.storage is self:
            found = overlay.stats.get(key, _UNSEEN)
            if found is not _UNSEEN:
                return found
        stat = self._stat(key)
        seen: dict[str, Stat | None] | None = getattr(_thread, "seen", None)
        if seen is not None:
            seen.setdefault(key, stat)
        return stat

    def version(self, key: str) -> Hashable | None:
        """The version of the file at `key` (None: no file there): all a caller that holds
        a `Stat` of it needs to know whether it still holds. Unlike `stat`, neither
        recorded nor seen through `as_of`; see `noted`."""
        stat = self._stat(key)
        return None if stat is None or stat.is_dir else stat.version

    def noted(self, stats: Mapping[str, Stat | None]) -> None:
        """Record `stats` as `stat` records what it answers (see `recording`): for a caller
        that learned them through `version`."""
        seen: dict[str, Stat | None] | None = getattr(_thread, "seen", None)
        if seen is not None:
            for key, stat in stats.items():
                seen.setdefault(key, stat)

    def list(self, key: str) -> list[Entry]:
        """The entries of directory `key`. Raises NotFound or NotADirectory."""
        seen: dict[str, Stat | None] | None = getattr(_thread, "seen", None)
        if seen is not None and key not in seen:
            # the directory as of before its entries are read: a result made from them
            # is checked against it (a change during or after the read shows as another)
            found = self._listed_stat(key)
            if found is not None:
                seen[key] = found
        entries = self._list(key)
        overlay: _Overlay | None = getattr(_thread, "overlay", None)
        if overlay is not None and overlay.storage is self:
            entries = [
                seen_as
                for entry in entries
                if (seen_as := _as_seen(overlay.stats, key, entry)) is not None
            ]
        if seen is not None:
            for entry in entries:
                seen.setdefault(f"{key}/{entry.name}" if key else entry.name, entry.stat)
        return entries

    def read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        """Exactly `length` bytes of `key` from `offset`.

        If `version` is given and the object is no longer that version, raises
        SourceChanged rather than mixing bytes of two versions. Reading past
        the end raises CorruptData: callers only ask for ranges an index or a
        size promised them.
        """
        kept = self._kept(key, version)
        if kept is None:
            return self._read(key, offset, length, version)
        with contextlib.closing(kept):
            return kept.read(offset, length)

    def pin(self, key: str, stat: Stat) -> Pin:
        """A pin on version `stat` of `key` (see `Pin`). SourceChanged if the object
        already is another version that the pin cannot serve."""
        kept = self._kept(key, stat.version)
        return kept if kept is not None else self._pin(key, stat)

    def read_tail(self, key: str, length: int, size: int, version: Hashable) -> bytes:
        """The last `length` bytes of version `version` of `key`, which has `size` bytes.

        Where an index sits at the end of an object; a store that can ask for a
        suffix of an object (S3's `bytes=-N`) does.
        """
        kept = self._kept(key, version)
        if kept is None:
            return self._read_tail(key, length, size, version)
        with contextlib.closing(kept):
            return kept.read(size - length, length)

    @contextlib.contextmanager
    def as_of(self, stats: Mapping[str, Stat | None], kept: KeptPins) -> Iterator[None]:
        """Within this block (on this thread), the objects of `stats` are taken to be the
        versions it names (None: absent), not what they are now, and a version `kept`
        has a pin for is read through that pin: what is read is as it was when `stats`
        were seen, where it still can be (else SourceChanged, as for any version gone).
        For serving a file as a client that was shown those versions holds it."""
        previous = getattr(_thread, "overlay", None)
        _thread.overlay = _Overlay(self, stats, kept)
        try:
            yield
        finally:
            _thread.overlay = previous

    def answering_as_of(self) -> bool:
        """Whether this thread is inside an `as_of` block of this store."""
        overlay: _Overlay | None = getattr(_thread, "overlay", None)
        return overlay is not None and overlay.storage is self

    def recording(self) -> _Recording:
        """Within this block (on this thread), every object stated or listed is noted in
        the dict it gives, with its version as first seen: what a result computed in
        the block was made from (see `as_of`)."""
        return _Recording()

    def _kept(self, key: str, version: Hashable | None) -> Pin | None:
        overlay: _Overlay | None = getattr(_thread, "overlay", None)
        if overlay is None or overlay.storage is not self or version is None:
            return None
        return overlay.kept(key, version)

    @abstractmethod
    def _stat(self, key: str) -> Stat | None: ...

    @abstractmethod
    def _list(self, key: str) -> builtins.list[Entry]: ...

    def _listed_stat(self, key: str) -> Stat | None:
        """The stat of directory `key` that `recording` notes when it is listed, where a
        change of its entries changes it (None: not noted; an object store has none)."""
        return None

    @abstractmethod
    def _read(
        self, key: str, offset: int, length: int, version: Hashable | None = None
    ) -> bytes: ...

    def _pin(self, key: str, stat: Stat) -> Pin:
        return Pin(self, key, stat)

    def _read_tail(self, key: str, length: int, size: int, version: Hashable) -> bytes:
        return self.read(key, size - length, length, version)

    def descriptor_budget(self) -> int | None:
        """How many descriptors the pins of this store may hold open at once (a local
        file held open: see `Pin.keeps_version`); None where pins hold none."""
        return None

    def reserve_descriptors(self, count: int) -> int:
        """Set aside up to `count` more descriptors of the pins' budget for other holders
        (the native front's copies, the metrics server's sockets); how many. 0 where pins
        hold none."""
        return 0

    def stat_path(self, key: str) -> str | None:
        """The local path whose `lstat` gives `key`'s version as `version` does, for a
        reader outside Python that checks versions itself (the native front); None where
        versions are no local file's stat."""
        return None

    def append_in_progress(self, key: str, stat: Stat) -> int | None:
        """The size of object `key` (found as `stat`) before an append that a writer has
        begun and not finished, or a crashed writer left torn, if the store keeps such a
        record (a local journal); else None. Only those first bytes are complete: an
        index beyond them may be torn."""
        return None

    def local_span(
        self, key: str, offset: int, length: int, version: Hashable
    ) -> tuple[int, int] | None:
        """Where a store that keeps a local copy of remote objects (a disk cache) holds
        `length` bytes at `offset` of version `version`: the span (start, end) of the
        local units around them, which it reads whole and with no request; None if a
        read of them would need a request. Readers that look ahead to save round trips
        read just that span instead (its end may lie beyond the object's)."""
        return None

    @abstractmethod
    def describe(self, key: str) -> str:
        """A human-readable name of `key` for log lines (never includes credentials)."""

    def etag(self, stat: Stat) -> str | None:
        """The ETag of the object `stat` describes, without quotes, if the store keeps one.

        It comes with listings, so DANDI's zarr checksum (which takes it as a
        file's digest: the md5 of objects uploaded in one part) needs no read.
        """
        return None

    @abstractmethod
    def put(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        """Replace or create object `key` with the concatenation of `parts`, atomically.

        Concurrent readers and a crash at any instant see the old object or the
        new one, never a mix. `expect` is the version (Stat.version) the caller
        built the new content from, or ABSENT if it believes there is no
        object; if the object is not (any more) that version, raises
        SourceChanged and changes nothing. Creates missing parent directories.
        Durable when it returns. Returns the new object's Stat.
        """

    @abstractmethod
    def append(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        """Append the concatenation of `parts` to object `key` if it is still version `expect`.

        Otherwise raises SourceChanged and changes nothing (with `expect=ABSENT`
        and no object: NotFound, as there is nothing to append to). Cheaper
        than `put` for growing a big object. Durable when it returns; after a
        crash at any instant, `recover()` leaves the object either exactly as
        before or with the whole append. Returns the new Stat.
        """

    @abstractmethod
    def delete(self, key: str, expect: Hashable) -> None:
        """Remove object `key` if it is still version `expect`, else SourceChanged.

        With `expect=ABSENT` and no object: NotFound. Durable when it returns.
        """

    @abstractmethod
    def makedirs(self, key: str) -> None:
        """Create directory `key` and its parents; no error if it exists.

        Stores without real directories may do nothing.
        """

    @abstractmethod
    def recover(self) -> builtins.list[str]:
        """Finish or roll back writes that a crashed writer left behind.

        Returns one human-readable line per repair, for the log. Safe to run
        while other processes write to the same source: it waits for writes
        in progress instead of mistaking them for crashed ones.
        """

    def tidy(self) -> None:
        """Remove what the store keeps of its own for writers (a local source's `.shardfs/`)
        if nothing of it is in use and nothing is left for `recover`, so that a source
        written through shardfs holds nothing else. For the end of a process that wrote;
        safe while other processes write to the same source (it then leaves it to them).
        Stores that keep nothing of their own do nothing."""
        return None

    @abstractmethod
    def pending_recovery(self) -> builtins.list[str]:
        """Keys with an unfinished-write record, changing nothing.

        For fsck and read-only mounts, which must report rather than repair.
        Writes in progress in other processes are included.
        """


def _as_seen(stats: Mapping[str, Stat | None], directory: str, entry: Entry) -> Entry | None:
    """A listed entry as `stats` saw it: None if it was absent then."""
    found = stats.get(f"{directory}/{entry.name}" if directory else entry.name, _UNSEEN)
    if found is _UNSEEN:
        return entry
    return None if found is None else Entry(entry.name, found)


class _Recording:
    """`Storage.recording`: a plain class, as every lookup, getattr and listing of a
    kernel-served mount enters one (a generator-based context manager costs more)."""

    __slots__ = ("_previous", "seen")

    def __init__(self) -> None:
        self.seen: dict[str, Stat | None] = {}

    def __enter__(self) -> dict[str, Stat | None]:
        self._previous = getattr(_thread, "seen", None)
        _thread.seen = self.seen
        return self.seen

    def __exit__(self, *exc: object) -> None:
        _thread.seen = self._previous
