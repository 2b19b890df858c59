"""An S3 (or S3-compatible) bucket prefix as the source, through boto3.

Objects are the keys below the prefix; directories are the `/`-separated
prefixes between them, as ListObjectsV2 with a delimiter shows them. A
version is an object's ETag, so every read that names a version is sent with
`If-Match` and a changed object answers 412 instead of mixing two versions.

Listings and object stats are cached for `metadata_ttl` seconds (one cache,
one budget); `stat` is answered from the parent directory's listing, so
looking up the files of a directory costs no HEAD requests, and a listing
is taken of a whole subtree at once, so a small tree costs one LIST
request in all. Our own writes update the cache at once; a 412 drops what was cached
about the object, so the next stat sees the new version.

Writes are conditional (`If-Match` on the ETag, `If-None-Match: *` for a new
object). S3 cannot append, so `append` makes a new version of the object: a
small one is read and written back whole; a big one is a multipart upload
whose first parts are server-side copies of the object (UploadPartCopy,
nothing downloaded) and whose last part is the appended bytes.

A delete is conditional (`If-Match`) only where the store is seen to honour
that: not all do (MinIO deletes whatever the ETag named; AWS general-purpose
buckets answered 501 before September 2025), and a store that ignores it
would delete a version another writer just stored. The first delete of a
storage tries it out on a private object of its own (see
`_probe_conditional_delete`); where the store fails, a delete HEADs the
object (with `If-Match`) and deletes it unconditionally only if it is still
the expected version, which leaves one round trip in which another writer's
new version would be lost.

Anybody who can write to the bucket can store a key that no path can hold:
one with a `.`, `..` or empty segment, a name longer than NAME_MAX or a path
longer than PATH_MAX, or a `dir/` key with data in it. Such a key is left
out of the view with one warning per mount (see `_leave_out`), so that one
odd object cannot stop a mount of everything else. Where a name is both an
object and a directory (`a/b` and `a/b/c`), the directory wins: it may hold
whole arrays, the object is one file.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import boto3
import botocore.exceptions
from botocore import UNSIGNED
from botocore.config import Config

from shardfs.primitives.blocking import check_may_block, may_block
from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import (
    CorruptData,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
    UsageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import ABSENT, Entry, RequestCounts, Stat, Storage
from shardfs.storage.disk_cache import DiskCache

log = logging.getLogger("shardfs")

T = TypeVar("T")

#: S3's smallest part of a multipart upload (all but the last part).
MIN_PART = 5 << 20
#: S3's biggest part, and so the biggest range one UploadPartCopy copies.
MAX_PART = 5 << 30
#: Multipart uploads older than this under our prefix are left by a writer that died.
STALE_UPLOAD = timedelta(hours=1)
#: Attempts at a GET whose body arrives cut short (botocore retries failed requests itself).
BODY_ATTEMPTS = 4

_DIR_VERSION = "directory"
_PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_FAILED_PRECONDITION = {"PreconditionFailed", "412"}
#: Where the delete probe puts its object, below the prefix (`.shardfs/` is not used otherwise).
PROBE_DIR = ".shardfs"
#: The ETag the delete probe names to be refused: not its object's (the MD5 of its body).
_WRONG_ETAG = '"' + "0" * 32 + '"'
_MISSING = {"NoSuchKey", "404", "NotFound", "NoSuchVersion"}
#: The kinds `shardfs stats` counts requests by (the others by their operation's name).
_KINDS = {
    "GetObject": "GET",
    "ListObjectsV2": "LIST",
    "HeadObject": "HEAD",
    "PutObject": "PUT",
    "DeleteObject": "DELETE",
}


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET/PREFIX`; the prefix has no leading or trailing `/`."""
    if not url.startswith("s3://"):
        raise UsageError(f"{url} is not an s3:// URL")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket:
        raise UsageError(f"{url} names no bucket (use s3://BUCKET/PREFIX)")
    return bucket, prefix.strip("/")


@dataclass(frozen=True)
class S3Config:
    """How to reach the store; see the S3 options in docs/configuration.md."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    anon: bool = False
    #: How long a listing or stat may be answered from the cache (inf: until evicted).
    metadata_ttl: float = 1.0
    #: The budget of the listing cache, in estimated bytes.
    listing_cache: int = 32 << 20
    #: Seconds to wait for a connection or for data before a request is retried.
    timeout: float = 30.0
    #: Attempts per request (botocore's standard retry mode: 5xx, throttling, timeouts).
    attempts: int = 5
    connections: int = 32


@dataclass
class _Listing:
    """A directory's entries (only the first page's if not `complete`)."""

    entries: dict[str, Stat]
    complete: bool

    @property
    def cost(self) -> int:
        return 160 * len(self.entries) + 200


class _MetadataCache:
    """Listings by directory key and stats by object key, each valid for `ttl` seconds, in
    one least-recently-used cache with one budget (estimated bytes) over both."""

    def __init__(self, budget: int, ttl: float) -> None:
        self.ttl = ttl
        self._items: LruCache[tuple[float, Any, int]] = LruCache(budget, lambda item: item[2])

    def get(self, kind: str, key: str) -> Any:
        item = self._items.peek((kind, key))
        if item is None:
            return None
        if item[0] < time.monotonic():
            self._items.discard((kind, key))
            return None
        return item[1]

    def put(self, kind: str, key: str, value: Any, cost: int) -> None:
        self._items.put((kind, key), (time.monotonic() + self.ttl, value, cost))

    def drop(self, kind: str, key: str) -> None:
        self._items.discard((kind, key))

    def snapshot(self) -> dict[str, int]:
        return self._items.snapshot()


def _parent(key: str) -> tuple[str, str]:
    parent, _, name = key.rpartition("/")
    return parent, name


#: The longest file name Linux takes (NAME_MAX), in bytes.
NAME_MAX = 255
#: The longest path Linux takes (PATH_MAX), in bytes with its closing NUL.
PATH_MAX = 4096
#: Keys whose fitness for a path each storage keeps (about 200 bytes each).
CHECKED_KEYS = 4096
#: Why an object is left out whose name is also a directory.
_SHADOWED = "its name is also a directory (keys below it), which is shown instead"


def _bad_name(name: str) -> str | None:
    """Why `name` can be the name of no file or directory, or None."""
    if name in (".", ".."):
        return f"{name!r} cannot be a file name"
    if not name:
        return "an empty name (a '/' first or two '/' in a row)"
    if "\0" in name:
        return "a NUL character cannot be in a file name"
    return None


def _unfit(name: str, depth: int) -> str | None:
    """Why no path can hold `name` as an entry of a directory whose path below the prefix,
    with a `/` after it, is `depth` bytes long; None if one can."""
    why = _bad_name(name)
    if why is not None:
        return why
    size = len(name.encode())
    if size > NAME_MAX:
        return f"a name of {size} bytes, longer than the {NAME_MAX} a file name can have"
    if depth + size >= PATH_MAX:
        return f"a path of {depth + size} bytes, longer than the {PATH_MAX - 1} a path can have"
    return None


def _unfit_path(path: str) -> str | None:
    """Why no path can hold `path` (below the prefix), or None if one can."""
    depth = 0
    for name in path.split("/"):
        why = _unfit(name, depth)
        if why is not None:
            return why
        depth += len(name.encode()) + 1
    return None


def _depth(key: str) -> int:
    """The `depth` (see `_unfit`) of the entries of directory `key`."""
    return len(key.encode()) + 1 if key else 0


def _past(last: str, below: str) -> bool:
    """Whether a listing in key order that reached key `last` went past every key that
    starts with `below`."""
    return last > below and not last.startswith(below)


def _code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _transient(error: botocore.exceptions.ClientError) -> bool:
    """Whether an error may pass if asked again: a 5xx, but 501 NotImplemented."""
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return isinstance(status, int) and status >= 500 and status != 501


def _mtime_ns(when: datetime | None = None) -> int:
    """Whole seconds, as S3 reports them, so our own writes show what a listing shows later."""
    seconds = int(when.timestamp()) if when is not None else int(time.time())
    return seconds * 1_000_000_000


class S3Storage(Storage):
    """The objects below `s3://bucket/prefix/`."""

    #: A round trip of tens of milliseconds is worth about this much transfer.
    request_cost = 1 << 20
    #: Keys per LIST page (S3's maximum).
    page_size = 1000

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        config: S3Config | None = None,
        disk_cache: DiskCache | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        for name in self.prefix.split("/") if self.prefix else ():
            why = _bad_name(name)
            if why is not None:
                raise UsageError(
                    f"s3://{bucket}/{self.prefix}: the prefix cannot be a directory: {why}; "
                    "S3 takes keys as written and resolves no '.' or '..', so name the prefix "
                    "as its keys spell it"
                )
        self.config = config = config or S3Config()
        #: Where bytes of object versions are kept across mounts (`-o cache_dir`), if anywhere.
        self.disk_cache = disk_cache
        session = boto3.session.Session(profile_name=config.profile, region_name=config.region)
        client_config = Config(
            retries={"mode": "standard", "max_attempts": config.attempts},
            connect_timeout=config.timeout,
            read_timeout=config.timeout,
            max_pool_connections=config.connections,
            signature_version=UNSIGNED if config.anon else None,
        )
        try:
            self._s3 = session.client("s3", endpoint_url=config.endpoint_url, config=client_config)
        except botocore.exceptions.BotoCoreError as e:
            raise UsageError(f"s3://{bucket}: {e}") from None
        self._cache = _MetadataCache(config.listing_cache, config.metadata_ttl)
        self.counts = RequestCounts()
        self._s3.meta.events.register("before-send.s3", self._sending)
        self._s3.meta.events.register("needs-retry.s3", self._answered)
        #: Whether DeleteObject honours If-Match here (None: not found out yet; see `delete`).
        self._deletes_conditional: bool | None = None
        self._probe_lock = threading.Lock()
        #: Directories have no mtime in S3: they show the time the source was opened.
        self._dir_stat = Stat(True, 0, time.time_ns(), _DIR_VERSION)
        #: The keys left out of the view and logged, and the prefixes whose keys were.
        self._left_out: set[str] = set()
        self._left_out_below: set[str] = set()
        self._left_out_lock = threading.Lock()
        #: Why no path can hold a key, kept for the keys asked about most (every read and
        #: stat checks its key: a shard's is checked at each chunk read).
        self._unfit_path = functools.lru_cache(maxsize=CHECKED_KEYS)(_unfit_path)

    # -- naming -------------------------------------------------------------

    def _object(self, key: str) -> str:
        """The S3 key of `key`. A name that no path can hold is not in the view: no request
        is made for it, so nothing (`..` above all) reaches outside the prefix or at a key
        the view leaves out."""
        whole = f"{self.prefix}/{key}" if self.prefix and key else self.prefix or key
        why = self._unfit_path(key) if key else None
        if why is not None:
            raise NotFound(f"s3://{self.bucket}/{whole}: not in the view: {why}")
        return whole

    def _dir_prefix(self, key: str) -> str:
        whole = self._object(key)
        return f"{whole}/" if whole else ""

    def describe(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object(key)}"

    def etag(self, stat: Stat) -> str | None:
        return str(stat.version).strip('"')

    # -- reads ----------------------------------------------------------------

    def _stat(self, key: str) -> Stat | None:
        if not key:
            return self._dir_stat
        if self._unfit_path(key) is not None:
            return None  # not in the view (`/x` would otherwise be answered as `x`)
        parent, name = _parent(key)
        listing: _Listing | None = self._cache.get("list", parent)
        if listing is not None and (name in listing.entries or listing.complete):
            return listing.entries.get(name)
        known: tuple[Stat | None] | None = self._cache.get("stat", key)
        if known is not None:
            return known[0]
        check_may_block()
        listing = self._listing(parent, first_page_only=True)
        if name in listing.entries or listing.complete:
            return listing.entries.get(name)
        stat = self._probe(key)  # a directory too big to list for one stat
        self._cache.put("stat", key, (stat,), 200)
        return stat

    def _list(self, key: str) -> list[Entry]:
        listing = self._cache.get("list", key)
        if listing is None or not listing.complete:
            check_may_block()
            listing = self._listing(key, first_page_only=False)
        if not listing.entries and key:
            stat = self.stat(key)
            if stat is None:
                raise NotFound(key)
            if not stat.is_dir:
                raise NotADirectory(key)
        return [Entry(name, stat) for name, stat in listing.entries.items()]

    def _listing(self, key: str, first_page_only: bool) -> _Listing:
        """List directory `key` (one page, or all) and cache what was listed.

        The first request lists the whole subtree (no delimiter): a sharded
        tree holds few objects, so one page usually answers every directory
        below `key` as well, instead of one LIST per directory level. Names
        that no path can hold are left out (see `_leave_out`).
        """
        listing = self._list_tree(key)
        if listing.complete or first_page_only:
            return listing
        prefix = self._dir_prefix(key)
        depth = _depth(key)
        entries: dict[str, Stat] = {}
        token: str | None = None
        while True:
            request = {
                "Bucket": self.bucket,
                "Prefix": prefix,
                "Delimiter": "/",
                "MaxKeys": self.page_size,
            }
            if token:
                request["ContinuationToken"] = token
            page = self._call("list", key, functools.partial(self._s3.list_objects_v2, **request))
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(prefix) : -1]
                why = _unfit(name, depth)
                if why is not None:
                    self._leave_out_below(key, common["Prefix"], why)
                    continue
                if name in entries:  # an object of that name, on an earlier page
                    self._leave_out(f"{prefix}{name}", _SHADOWED)
                entries[name] = self._dir_stat
            for item in page.get("Contents", ()):
                name = item["Key"][len(prefix) :]
                if not name:  # "dir/" itself
                    self._folder_marker(item)
                elif (why := _unfit(name, depth)) is not None:
                    self._leave_out(item["Key"], why)
                elif name in entries:  # a directory
                    self._leave_out(item["Key"], _SHADOWED)
                else:
                    entries[name] = self._object_stat(item)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        listing = _Listing(entries, complete=True)
        self._cache.put("list", key, listing, listing.cost)
        return listing

    def _list_tree(self, key: str) -> _Listing:
        """One page of every object below directory `key`: caches the listing of each
        directory the page covers whole, and returns `key`'s (partial if truncated)."""
        prefix = self._dir_prefix(key)
        request = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": self.page_size}
        page = self._call("list", key, lambda: self._s3.list_objects_v2(**request))
        contents = page.get("Contents", ())
        truncated = bool(page.get("IsTruncated"))
        listings: dict[str, dict[str, Stat]] = {key: {}}
        for item in contents:
            self._place(item, key, prefix, listings)
        last = contents[-1]["Key"] if contents else ""
        for directory, entries in listings.items():
            below = self._dir_prefix(directory)
            # Keys come in order, so a directory is whole once the page went past it.
            complete = not truncated or (directory != key and _past(last, below))
            if directory == key and not complete:
                # An object is not known to be a file while the next page may hold its directory.
                entries = {
                    n: s for n, s in entries.items() if s.is_dir or _past(last, f"{below}{n}/")
                }
                listings[directory] = entries
            if complete or directory == key:
                listing = _Listing(entries, complete)
                self._cache.put("list", directory, listing, listing.cost)
        return self._cache.get("list", key) or _Listing(listings[key], not truncated)

    def _place(
        self, item: dict[str, Any], key: str, prefix: str, listings: dict[str, dict[str, Stat]]
    ) -> None:
        """Enter object `item`, from a listing of directory `key` (S3 prefix `prefix`), in
        `listings`: its name in its directory's, the directories it lies below in theirs.
        A name that no path can hold ends that (the directories before it stay, as a
        listing with a delimiter shows them); an object yields to a directory of its name."""
        directory, depth = key, _depth(key)
        names = item["Key"][len(prefix) :].split("/")
        for i, name in enumerate(names):
            last = i == len(names) - 1
            if last and not name:  # "dir/"
                self._folder_marker(item)
                return
            why = _unfit(name, depth)
            if why is not None:
                self._leave_out(item["Key"], why)
                return
            entries = listings[directory]
            if last:
                if name in entries:  # a directory
                    self._leave_out(item["Key"], _SHADOWED)
                else:
                    entries[name] = self._object_stat(item)
                return
            path = f"{directory}/{name}" if directory else name
            if name in entries and not entries[name].is_dir:
                self._leave_out(self._object(path), _SHADOWED)
            entries[name] = self._dir_stat
            listings.setdefault(path, {})
            directory, depth = path, depth + len(name.encode()) + 1

    def _folder_marker(self, item: dict[str, Any]) -> None:
        """A `dir/` key is a console's folder marker, not shown; one with data is logged."""
        if item["Size"]:
            self._leave_out(
                item["Key"],
                f"it ends in '/', so it names a directory, which cannot hold its "
                f"{item['Size']} bytes",
            )

    def _leave_out(self, key: str, why: str) -> None:
        """Log that object `key` (its whole S3 key) is not in the view, and why: once per
        mount, not at every listing (listings are taken again when they expire)."""
        with self._left_out_lock:
            if key in self._left_out:
                return
            self._left_out.add(key)
        url = f"s3://{self.bucket}/{key}"
        log.warning("%s: left out of the view: %s", url if url.isprintable() else ascii(url), why)

    def _leave_out_below(self, key: str, below: str, why: str) -> None:
        """Log each object below S3 prefix `below`, a directory of `key` that no path can
        hold: a listing with a delimiter names only the prefix. Listed once per mount."""
        with self._left_out_lock:
            if below in self._left_out_below:
                return
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": below}
        while True:
            page = self._call("list", key, functools.partial(self._s3.list_objects_v2, **request))
            for item in page.get("Contents", ()):
                self._leave_out(item["Key"], why)
            request["ContinuationToken"] = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not request["ContinuationToken"]:
                break
        with self._left_out_lock:
            self._left_out_below.add(below)

    def _probe(self, key: str) -> Stat | None:
        """The stat of `key` in a directory too big to list for one stat: one LIST, `/` as
        the delimiter, of two entries from `key` on, which are the object and its directory
        (which wins) unless keys like `key-1` lie between."""
        whole = self._object(key)
        request = {"Bucket": self.bucket, "Prefix": whole, "Delimiter": "/", "MaxKeys": 2}
        page = self._call("stat", key, lambda: self._s3.list_objects_v2(**request))
        objects = {item["Key"]: item for item in page.get("Contents", ())}
        below = {common["Prefix"] for common in page.get("CommonPrefixes", ())}
        is_dir = f"{whole}/" in below
        if not is_dir and page.get("IsTruncated") and max({*objects, *below}) < f"{whole}/":
            is_dir = self._is_dir(key)
        if is_dir:
            if whole in objects:
                self._leave_out(whole, _SHADOWED)
            return self._dir_stat
        return self._object_stat(objects[whole]) if whole in objects else None

    @staticmethod
    def _object_stat(item: dict[str, Any]) -> Stat:
        return Stat(False, item["Size"], _mtime_ns(item.get("LastModified")), item["ETag"])

    def _head(self, key: str) -> Stat | None:
        try:
            head = self._call(
                "stat",
                key,
                lambda: self._s3.head_object(Bucket=self.bucket, Key=self._object(key)),
            )
        except NotFound:
            return None
        return Stat(False, head["ContentLength"], _mtime_ns(head.get("LastModified")), head["ETag"])

    def _is_dir(self, key: str) -> bool:
        page = self._call(
            "list",
            key,
            lambda: self._s3.list_objects_v2(
                Bucket=self.bucket, Prefix=self._dir_prefix(key), MaxKeys=1
            ),
        )
        return bool(page.get("KeyCount"))

    def _read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        if self.disk_cache is not None and version is not None:
            return self._cached(key, offset, length, version)
        return self._get(key, offset, length, f"bytes={offset}-{offset + length - 1}", version)[0]

    def _read_tail(self, key: str, length: int, size: int, version: Hashable) -> bytes:
        if self.disk_cache is not None:
            return self._cached(key, size - length, length, version)
        return self._get(key, size - length, length, f"bytes=-{length}", version)[0]

    def local_span(
        self, key: str, offset: int, length: int, version: Hashable
    ) -> tuple[int, int] | None:
        if self.disk_cache is None:
            return None
        check_may_block()
        return self.disk_cache.held_span(self._cache_name(key), str(version), offset, length)

    def _cache_name(self, key: str) -> str:
        """The object's name in the disk cache, which mounts of other stores share."""
        return f"{self.config.endpoint_url or 'aws'}/{self.bucket}/{self._object(key)}"

    def _cached(self, key: str, offset: int, length: int, version: Hashable) -> bytes:
        """A read of one version through the disk cache, which fetches whole blocks. Never
        on the event loop: a hit reads a file, and the cache's index may wait for a lock
        another mount of the host holds."""
        assert self.disk_cache is not None
        check_may_block()

        def fetch(start: int, size: int) -> tuple[bytes, int | None]:
            return self._get(key, start, size, f"bytes={start}-{start + size - 1}", version, True)

        try:
            return self.disk_cache.read(self._cache_name(key), str(version), offset, length, fetch)
        except CorruptData as e:
            raise CorruptData(f"{self.describe(key)}: {e}") from None

    def _get(
        self,
        key: str,
        offset: int,
        length: int,
        byte_range: str,
        version: Hashable | None,
        to_end: bool = False,
    ) -> tuple[bytes, int | None]:
        """A ranged GET of `length` bytes at `offset`, asked for as `byte_range`, and the
        object's size if the answer tells it. With `to_end`, fewer bytes are an answer
        when the object ends before `length` of them."""
        check_may_block()
        if length <= 0:
            return b"", None
        request: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._object(key),
            "Range": byte_range,
        }
        if version is not None:
            request.update(self._read_condition(version))
        for attempt in attempts(BODY_ATTEMPTS, at_once=0, first=0.05, longest=2.0):
            answer = self._call("read", key, lambda: self._s3.get_object(**request), version)
            self._check_answer(key, version, answer)
            try:
                data = answer["Body"].read()
            except (botocore.exceptions.BotoCoreError, OSError) as e:
                self.counts.failed(type(e).__name__)
                if attempt + 1 == BODY_ATTEMPTS:
                    raise StorageError(f"{self.describe(key)}: read failed: {e}") from None
                self.counts.retried(1)
                continue
            finally:
                answer["Body"].close()
            self.counts.moved(read=len(data))
            total = answer.get("ContentRange", "").rpartition("/")[2]
            size = int(total) if total.isdigit() else None
            if len(data) != length and not (to_end and size == offset + len(data)):
                raise CorruptData(
                    f"{self.describe(key)}: wanted {length} bytes at {offset}, "
                    f"the object has {total or 'fewer'} bytes"
                )
            return data, size
        raise AssertionError("unreachable")

    def _read_condition(self, version: Hashable) -> dict[str, Any]:
        """What a GET of version `version` adds to its request: `If-Match` on the ETag."""
        return {"IfMatch": version}

    def _check_answer(self, key: str, version: Hashable | None, answer: dict[str, Any]) -> None:
        """Check a GET's answer (its headers) against the version asked for: `If-Match`
        did that here already."""

    # -- writes ---------------------------------------------------------------

    def put(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        check_may_block()
        body = b"".join(parts)
        self.counts.moved(written=len(body))
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": self._object(key), "Body": body}
        request.update(self._condition(expect))
        answer = self._call("write", key, lambda: self._s3.put_object(**request), expect)
        stat = Stat(False, len(body), _mtime_ns(), answer["ETag"])
        self._wrote(key, stat)
        return stat

    def append(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        check_may_block()
        if expect is ABSENT:
            if self._head(key) is None:
                raise NotFound(key)
            raise SourceChanged(f"{self.describe(key)} exists")
        current = self._head_version(key, expect)
        tail = b"".join(parts)
        if not tail:
            return current
        if current.size < MIN_PART:
            old = self.read(key, 0, current.size, expect)
            return self.put(key, [old, tail], expect)
        return self._append_multipart(key, current, tail)

    def _head_version(self, key: str, expect: Hashable) -> Stat:
        """The object's stat, if it is still version `expect`; else SourceChanged."""
        try:
            head = self._call(
                "write",
                key,
                lambda: self._s3.head_object(
                    Bucket=self.bucket, Key=self._object(key), IfMatch=expect
                ),
                expect,
            )
        except NotFound:
            raise SourceChanged(f"{self.describe(key)} was removed") from None
        return Stat(False, head["ContentLength"], _mtime_ns(head.get("LastModified")), head["ETag"])

    def _append_multipart(self, key: str, current: Stat, tail: bytes) -> Stat:
        """The object copied server-side, then `tail`, as one new version, if still `current`."""
        self.counts.moved(written=len(tail))
        target = {"Bucket": self.bucket, "Key": self._object(key)}
        upload = self._call("write", key, lambda: self._s3.create_multipart_upload(**target))
        upload_id = upload["UploadId"]
        try:
            parts = []
            count = -(-current.size // MAX_PART)
            bounds = [current.size * i // count for i in range(count + 1)]
            for number, (start, end) in enumerate(itertools.pairwise(bounds), 1):
                copied = self._call(
                    "write",
                    key,
                    functools.partial(
                        self._s3.upload_part_copy,
                        **target,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": self.bucket, "Key": target["Key"]},
                        CopySourceIfMatch=current.version,
                        CopySourceRange=f"bytes={start}-{end - 1}",
                    ),
                    current.version,
                )
                parts.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
            number = len(parts) + 1
            sent = self._call(
                "write",
                key,
                lambda: self._s3.upload_part(
                    **target, UploadId=upload_id, PartNumber=number, Body=tail
                ),
            )
            parts.append({"PartNumber": number, "ETag": sent["ETag"]})
            done = self._call(
                "write",
                key,
                lambda: self._s3.complete_multipart_upload(
                    **target,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    IfMatch=current.version,
                ),
                current.version,
            )
        except BaseException:
            self._abort(key, upload_id)
            raise
        stat = Stat(False, current.size + len(tail), _mtime_ns(), done["ETag"])
        self._wrote(key, stat)
        return stat

    def _abort(self, key: str, upload_id: str) -> None:
        """Abort a failed upload, so its parts are not kept (and billed) forever."""
        try:
            self._s3.abort_multipart_upload(
                Bucket=self.bucket, Key=self._object(key), UploadId=upload_id
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            log.warning("%s: could not abort upload %s: %s", self.describe(key), upload_id, e)

    def delete(self, key: str, expect: Hashable) -> None:
        check_may_block()
        if expect is ABSENT:
            if self._head(key) is None:
                raise NotFound(key)
            raise SourceChanged(f"{self.describe(key)} exists")
        if self._conditional_delete():
            request = {"Bucket": self.bucket, "Key": self._object(key), "IfMatch": expect}
            self._call("write", key, lambda: self._s3.delete_object(**request), expect)
        else:
            self._checked_delete(key, expect)
        self._wrote(key, None)

    def _checked_delete(self, key: str, expect: Hashable) -> None:
        """Delete `key` on a store that does not honour If-Match on DeleteObject.

        A HEAD (with If-Match, and its ETag compared too) checks that the object
        is still version `expect`, then an unconditional DELETE removes it. Not
        atomic: a version another writer stores between the two is deleted.
        """
        current = self._head_version(key, expect)
        if str(current.version).strip('"') != str(expect).strip('"'):  # If-Match ignored too
            self._forget(key)
            raise SourceChanged(f"{self.describe(key)} changed")
        request = {"Bucket": self.bucket, "Key": self._object(key)}
        self._call("write", key, lambda: self._s3.delete_object(**request))

    def _conditional_delete(self) -> bool:
        """Whether a DeleteObject with If-Match is safe here: found out once, at the first
        delete (so never on a read-only mount, which deletes nothing)."""
        with self._probe_lock:
            if self._deletes_conditional is None:
                self._deletes_conditional = self._probe_conditional_delete()
            return self._deletes_conditional

    def _probe_conditional_delete(self) -> bool:
        """Try If-Match on DeleteObject out on an object of our own, `.shardfs/delete-probe-<random>`.

        Put it (If-None-Match: *); delete it naming a wrong ETag, which must
        answer 412 and leave it; delete it naming its own ETag, which must
        remove it. Anything else (deleted anyway, an error such as 501
        NotImplemented for the header, the probe object refused) means deletes
        cannot rely on If-Match: logged once, and False. The probe object is
        removed in any case. Failures that may pass (network, 5xx; after
        botocore's retries) raise StorageError and leave the question open for
        the next delete.
        """
        key = f"{PROBE_DIR}/delete-probe-{uuid.uuid4().hex}"
        target = {"Bucket": self.bucket, "Key": self._object(key)}
        where = self.describe(key)
        body = b"shardfs delete probe"
        try:
            try:
                etag = self._s3.put_object(**target, Body=body, IfNoneMatch="*")["ETag"]
            except botocore.exceptions.ClientError as e:
                if _transient(e):
                    raise
                return self._untrusted(f"could not put {where} to try it out: {_code(e)}")
            why: str | None = "the probe was cut short"
            try:
                why = self._judge_delete(target, etag)
            finally:
                if why is not None:  # else the probe deleted it itself
                    self._remove_probe(target, where)
                self._forget_probe(key)
        except botocore.exceptions.ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
            raise StorageError(
                f"{where}: trying out conditional deletes failed: {_code(e) or status}"
            ) from None
        except botocore.exceptions.BotoCoreError as e:
            raise StorageError(f"{where}: trying out conditional deletes failed: {e}") from None
        if why is not None:
            return self._untrusted(f"{where}: {why}")
        log.debug("s3://%s: DeleteObject honours If-Match", self.bucket)
        return True

    def _judge_delete(self, target: dict[str, str], etag: str) -> str | None:
        """Why DeleteObject's If-Match cannot be relied on, from the probe object `target`
        (version `etag`); None if it was refused with a wrong ETag and obeyed with the right one.
        Raises what the store answered if that may pass (5xx but 501, after botocore's retries)."""
        try:
            self._s3.delete_object(**target, IfMatch=_WRONG_ETAG)
            return "deleted although If-Match named another ETag"
        except botocore.exceptions.ClientError as e:
            if _transient(e):
                raise
            if _code(e) not in _FAILED_PRECONDITION:
                return f"DeleteObject with If-Match answered {_code(e)}"
        if self._probe_etag(target) != etag:
            return "changed or gone after a DeleteObject that answered 412"
        try:
            self._s3.delete_object(**target, IfMatch=etag)
        except botocore.exceptions.ClientError as e:
            if _transient(e):
                raise
            return f"DeleteObject with If-Match naming its own ETag answered {_code(e)}"
        if self._probe_etag(target) is not None:
            return "still there after a DeleteObject with If-Match naming its own ETag"
        return None

    def _probe_etag(self, target: dict[str, str]) -> str | None:
        """The probe object's ETag, or None once it is gone."""
        try:
            return str(self._s3.head_object(**target)["ETag"])
        except botocore.exceptions.ClientError as e:
            if _code(e) in _MISSING:
                return None
            raise

    def _forget_probe(self, key: str) -> None:
        """Drop what a listing of ours taken during the probe may have cached of its object."""
        root = self._cache.get("list", "")
        if root is not None and PROBE_DIR in root.entries:
            self._cache.drop("list", "")
        self._cache.drop("list", PROBE_DIR)
        self._cache.drop("stat", PROBE_DIR)
        self._cache.drop("stat", key)

    def _remove_probe(self, target: dict[str, str], where: str) -> None:
        try:
            self._s3.delete_object(**target)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            log.warning("%s: could not remove this probe object (remove it by hand): %s", where, e)

    def _untrusted(self, why: str) -> bool:
        log.warning(
            "s3://%s: the store does not honour If-Match on DeleteObject (%s); each delete "
            "checks the object's ETag with a HEAD just before deleting it, and a new version "
            "stored by another writer in between would be lost",
            self.bucket,
            why,
        )
        return False

    def makedirs(self, key: str) -> None:
        """Nothing to do: a directory exists while some object lies below it."""

    def _condition(self, expect: Hashable) -> dict[str, Any]:
        return {"IfNoneMatch": "*"} if expect is ABSENT else {"IfMatch": expect}

    def _wrote(self, key: str, stat: Stat | None) -> None:
        """Make the cache show what this process just wrote (None: removed).

        Listings are replaced, never changed in place: another thread may be
        iterating over the old one.
        """
        self._cache.drop("stat", key)
        if stat is not None:
            self._cache.put("stat", key, (stat,), 200)
        child = key
        while child:
            parent, name = _parent(child)
            listing = self._cache.get("list", parent)
            if listing is not None:
                entries = dict(listing.entries)
                if child != key and stat is None:
                    self._cache.drop("list", parent)  # the directory may now be empty
                    listing = None
                elif child != key:
                    entries.setdefault(name, self._dir_stat)
                elif stat is None:
                    entries.pop(name, None)
                else:
                    entries[name] = stat
                if listing is not None:
                    listing.entries = entries
            if child != key:
                self._cache.drop("stat", child)  # a directory that was missing may exist now
            child = parent

    def _forget(self, key: str) -> None:
        """Drop what is cached about `key`: it changed behind our back."""
        self._cache.drop("stat", key)
        self._cache.drop("list", _parent(key)[0])

    # -- recovery -------------------------------------------------------------

    def _uploads(self) -> list[dict[str, Any]]:
        prefix = self._dir_prefix("")
        uploads: list[dict[str, Any]] = []
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self._call(
                "list", "", functools.partial(self._s3.list_multipart_uploads, **request)
            )
            uploads += page.get("Uploads", ())
            if not page.get("IsTruncated"):
                return uploads
            request["KeyMarker"] = page.get("NextKeyMarker", "")
            request["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    def recover(self) -> list[str]:
        """Abort multipart uploads that writers which died left behind (older than an hour,
        so a live writer on another machine is never cut off)."""
        check_may_block()
        lines = []
        now = datetime.now(UTC)
        for upload in self._uploads():
            initiated = upload.get("Initiated")
            if initiated is not None and now - initiated < STALE_UPLOAD:
                continue
            key = upload["Key"]
            try:
                self._s3.abort_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload["UploadId"]
                )
            except botocore.exceptions.ClientError as e:
                lines.append(f"s3://{self.bucket}/{key}: could not abort a stale upload: {e}")
                continue
            lines.append(f"s3://{self.bucket}/{key}: aborted an upload left since {initiated}")
        return lines

    def pending_recovery(self) -> list[str]:
        check_may_block()
        base = self._dir_prefix("")
        return sorted({upload["Key"][len(base) :] for upload in self._uploads()})

    # -- requests -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        stats = self.counts.snapshot()
        stats["caches"] = {"s3 listings": self._cache.snapshot()}
        if self.disk_cache is not None:
            stats["caches"]["disk"] = self.disk_cache.snapshot()
        return stats

    # -- what was asked: botocore's events see every HTTP request, retries included --------

    def _sending(self, request: Any, event_name: str, **_: Any) -> None:
        operation = event_name.rpartition(".")[2]
        if operation == "GetObject" and "Range" in request.headers:
            kind = "GET range"
        else:
            kind = _KINDS.get(operation, operation)
        self.counts.add(kind)
        if request.context.get("retries", {}).get("attempt", 1) > 1:
            self.counts.retried(1)

    def _answered(self, response: Any, caught_exception: Any, **_: Any) -> None:
        if caught_exception is not None:
            self.counts.failed(type(caught_exception).__name__)
        elif response is not None and response[0].status_code >= 400:
            self.counts.failed(str(response[0].status_code))

    def _call(
        self, what: str, key: str, request: Callable[[], T], version: Hashable | None = None
    ) -> T:
        """Run one boto3 request (botocore retries transient failures) and map its errors.

        `version` is the version the request was conditional on: a failed
        precondition, or a missing object, then means the object changed.
        """
        assert may_block()
        try:
            return request()
        except botocore.exceptions.ClientError as e:
            code = _code(e)
            if code in _PRECONDITION and (version is not None or what == "write"):
                self._forget(key)
                what_happened = "exists" if version in (None, ABSENT) else "changed"
                raise SourceChanged(f"{self.describe(key)} {what_happened}") from None
            if code in _MISSING:
                if version is not None:
                    self._forget(key)
                    raise SourceChanged(f"{self.describe(key)} was removed") from None
                raise NotFound(key) from None
            if code in ("InvalidRange", "416"):
                raise CorruptData(f"{self.describe(key)}: read past the end") from None
            if code == "NoSuchBucket":
                raise StorageError(f"s3://{self.bucket}: no such bucket") from None
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
            raise StorageError(f"{self.describe(key)}: {what} failed: {code or status}") from None
        except botocore.exceptions.BotoCoreError as e:
            raise StorageError(f"{self.describe(key)}: {what} failed: {e}") from None
