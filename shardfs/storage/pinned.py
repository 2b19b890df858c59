"""An S3 prefix pinned to one version of each object: by a DANDI Zarr manifest, or as of a time.

`PinnedS3Storage` is an `S3Storage` whose listings and stats come from a `PinnedTree`
(`shardfs.formats.dandi_manifest`), never from ListObjects, and whose every GET names the
object's `VersionId` (ranged as any read). An object version never changes, so what the
disk cache keeps of it (keyed by version) never needs to be checked again; each answer is
still checked against the ETag and size the tree names. A version S3 no longer has is
EIO on that file, with one log line naming its key and version.

The tree comes from a manifest (`read_manifest`: a local file, an `s3://` or an
`https://` URL, read streaming within `MAX_MANIFEST` bytes) or from ListObjectVersions
of the prefix (`tree_at`: each key's newest version at a time, or now, for `shardfs
manifest`). Whether the objects carry version ids at all is told from those versions
alone: anonymous users may call neither ListBuckets nor GetBucketVersioning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import IO, Any

import botocore.exceptions

from shardfs.formats.dandi_manifest import (
    PinnedTree,
    PinnedVersion,
    Row,
    TreeBuilder,
    format_time,
    parse,
)
from shardfs.primitives.errors import (
    CorruptData,
    NotADirectory,
    NotFound,
    ReadOnly,
    SourceChanged,
    StorageError,
    UsageError,
)
from shardfs.storage.base import Entry, Stat
from shardfs.storage.disk_cache import DiskCache
from shardfs.storage.s3 import S3Config, S3Storage, parse_url

log = logging.getLogger("shardfs")

#: The biggest manifest read: about 12 times the biggest DANDI Zarr's (1M entries, 100 MB).
MAX_MANIFEST = 1 << 30
#: What a directory of a pinned tree shows as its version (it never changes).
_DIR_VERSION = "directory"


class PinnedS3Storage(S3Storage):
    """The objects below `s3://bucket/prefix/` as `tree` names them. Read-only."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        config: S3Config | None = None,
        disk_cache: DiskCache | None = None,
        tree: PinnedTree | None = None,
    ) -> None:
        super().__init__(bucket, prefix, config, disk_cache)
        self.tree = tree or TreeBuilder().finish()
        self._gone: set[tuple[str, str]] = set()
        self._gone_lock = threading.Lock()

    # -- what the tree names ------------------------------------------------------------

    def _stat_of(self, row: Row) -> Stat:
        mtime = row.mtime * 1_000_000_000
        if row.is_dir:
            return Stat(True, 0, mtime or self._dir_stat.mtime_ns, _DIR_VERSION)
        return Stat(False, row.size, mtime, row.version)

    def _stat(self, key: str) -> Stat | None:
        row = self.tree.lookup(key)
        return None if row is None else self._stat_of(row)

    def _list(self, key: str) -> list[Entry]:
        directory = self.tree.directory(key)
        if directory is None:
            if self.tree.lookup(key) is None:
                raise NotFound(key)
            raise NotADirectory(key)
        return [Entry(row.name, self._stat_of(row)) for row in directory.rows()]

    def etag(self, stat: Stat) -> str | None:
        return stat.version.etag if isinstance(stat.version, PinnedVersion) else None

    # -- reads of one version ------------------------------------------------------------

    def _read_condition(self, version: Hashable) -> dict[str, Any]:
        if not isinstance(version, PinnedVersion):
            raise StorageError(f"s3://{self.bucket}: a pinned source reads pinned versions only")
        return {"VersionId": version.version_id}

    def _check_answer(self, key: str, version: Hashable | None, answer: dict[str, Any]) -> None:
        """The answer must be the version the tree names: its ETag and size."""
        assert isinstance(version, PinnedVersion)
        etag = str(answer.get("ETag", "")).strip('"')
        total = str(answer.get("ContentRange", "")).rpartition("/")[2]
        if etag != version.etag or (total.isdigit() and int(total) != version.size):
            got = f"ETag {etag}" + (f", {total} bytes" if total.isdigit() else "")
            message = (
                f"{self.describe(key)} version {version.version_id} is not what the pinned "
                f"tree names (ETag {version.etag}, {version.size} bytes): {got}"
            )
            with self._gone_lock:
                first = (key, version.version_id) not in self._gone
                self._gone.add((key, version.version_id))
            if first:
                log.error("%s", message)
            error = CorruptData(message)
            error.logged = True  # once per version, here: not at every request that meets it
            raise error

    def _call(self, what: str, key: str, request: Callable[[], Any], version: Any = None) -> Any:
        try:
            return super()._call(what, key, request, version)
        except SourceChanged:
            if not isinstance(version, PinnedVersion):
                raise
        with self._gone_lock:
            first = (key, version.version_id) not in self._gone
            self._gone.add((key, version.version_id))
        message = f"{self.describe(key)} version {version.version_id} is gone from the bucket"
        if first:
            log.error("%s", message)
        error = StorageError(message)
        error.logged = True  # once per version, here: not at every request that meets it
        raise error from None

    # -- nothing is written ----------------------------------------------------------------

    def put(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        raise ReadOnly(f"{self.describe(key)}: a pinned source is read-only")

    def append(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        raise ReadOnly(f"{self.describe(key)}: a pinned source is read-only")

    def delete(self, key: str, expect: Hashable) -> None:
        raise ReadOnly(f"{self.describe(key)}: a pinned source is read-only")

    def recover(self) -> list[str]:
        return []

    def pending_recovery(self) -> list[str]:
        """None: the versions a tree names are whole, whatever writers do now."""
        return []

    # -- listing versions --------------------------------------------------------------------

    def versions(self, when: int | None) -> PinnedTree:
        """Each key's version at `when` (seconds; None: now), from ListObjectVersions.

        At `when`, a key's newest version with LastModified <= `when` (whole seconds, as
        S3 keeps them) that is not a delete marker. UsageError if the prefix's objects
        carry no version ids (versioning never enabled): nothing could be pinned.
        """
        base = self._dir_prefix("")
        builder = TreeBuilder(
            strict=False, left_out=lambda key, why: self._leave_out(base + key, why)
        )
        pending: dict[str, tuple[int, bool, bool, dict[str, Any]]] = {}
        seen = versioned = False
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base}
        while True:
            page = self._call("list", "", lambda: self._s3.list_object_versions(**request))
            for item, marker in _items(page):
                seen = True
                versioned = versioned or item.get("VersionId", "null") != "null"
                stamp = int(item["LastModified"].timestamp())
                if when is None and not item.get("IsLatest"):
                    continue
                if when is not None and stamp > when:
                    continue
                rank = (stamp, bool(item.get("IsLatest")), marker)
                best = pending.get(item["Key"])
                if best is None or rank > best[:3]:
                    pending[item["Key"]] = (*rank, item)
            truncated = bool(page.get("IsTruncated"))
            following = page.get("NextKeyMarker", "")
            for key in sorted(k for k in pending if not truncated or k < following):
                _, _, marker, item = pending.pop(key)
                if not marker:
                    self._enter(builder, base, item)
            if not truncated:
                break
            request["KeyMarker"] = following
            request["VersionIdMarker"] = page.get("NextVersionIdMarker", "")
        if seen and not versioned:
            raise UsageError(
                f"s3://{self.bucket}/{self.prefix}: its objects carry no version ids "
                "(versioning was never enabled on the bucket), so no version can be pinned"
            )
        return builder.finish()

    def _enter(self, builder: TreeBuilder, base: str, item: dict[str, Any]) -> None:
        name = item["Key"][len(base) :]
        if name.endswith("/") or not name:
            self._folder_marker(item)
            return
        etag = str(item.get("ETag", "")).strip('"')
        mtime = int(item["LastModified"].timestamp())
        builder.key(name, item["Size"], mtime, etag, item.get("VersionId", "null"))


def _items(page: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    """The versions and delete markers of a page, each with whether it is a marker."""
    for item in page.get("Versions", ()):
        yield item, False
    for item in page.get("DeleteMarkers", ()):
        yield item, True


def open_pinned(
    source: str,
    config: S3Config,
    disk_cache: DiskCache | None,
    manifest: str | None = None,
    as_of: int | None = None,
) -> PinnedS3Storage:
    """The storage of `source` pinned to `manifest` (a path or URL) or to time `as_of`."""
    bucket, prefix = parse_url(source)
    storage = PinnedS3Storage(bucket, prefix, config, disk_cache)
    if manifest is not None:
        storage.tree = read_manifest(manifest, config)
        return storage
    try:
        tree = storage.versions(as_of)
    except StorageError as e:
        raise UsageError(f"source {source}: {e}") from None
    if not tree.entries:
        when = "now" if as_of is None else f"at {format_time(as_of)}"
        raise UsageError(f"source {source}: no object of its prefix existed {when}")
    storage.tree = tree
    return storage


# -- reading a manifest ------------------------------------------------------------------------


class _Bounded:
    """A binary stream cut off, with a UsageError, once more than `limit` bytes came."""

    def __init__(self, stream: IO[bytes], limit: int, name: str) -> None:
        self.stream, self.limit, self.name, self.count = stream, limit, name, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.count += len(data)
        if self.count > self.limit:
            raise UsageError(f"manifest {self.name} is bigger than {self.limit} bytes")
        return data


def read_manifest(location: str, config: S3Config, limit: int = MAX_MANIFEST) -> PinnedTree:
    """The tree of the manifest at `location`: a local path, an `s3://BUCKET/KEY` (reached
    as the source is: `config`) or an `https://` URL; read streaming, at most `limit` bytes."""
    with _opened(location, config, limit) as stream:
        return parse(_Bounded(stream, limit, location), location)  # type: ignore[arg-type]


def _too_big(location: str, size: int | None, limit: int) -> None:
    if size is not None and size > limit:
        raise UsageError(f"manifest {location} has {size} bytes, more than the {limit} read")


@contextlib.contextmanager
def _opened(location: str, config: S3Config, limit: int) -> Iterator[IO[bytes]]:
    if location.startswith(("https://", "http://")):
        try:
            answer = urllib.request.urlopen(location, timeout=config.timeout)
        except urllib.error.HTTPError as e:
            raise UsageError(f"manifest {location}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise UsageError(
                    f"manifest {location}: the server's certificate is not trusted: "
                    f"{reason.verify_message} (the certificate authorities trusted are the "
                    "system's, or those of SSL_CERT_FILE or SSL_CERT_DIR)"
                ) from None
            raise UsageError(f"manifest {location}: cannot be fetched: {reason}") from None
        with answer:
            length = answer.headers.get("Content-Length")
            _too_big(location, int(length) if length and length.isdigit() else None, limit)
            yield answer
        return
    if location.startswith("s3://"):
        bucket, key = parse_url(location)
        reader = S3Storage(bucket, "", config)
        try:
            answer = reader._s3.get_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "?")
            raise UsageError(f"manifest {location}: {code}") from None
        except botocore.exceptions.BotoCoreError as e:
            raise UsageError(f"manifest {location}: {e}") from None
        body = answer["Body"]
        try:
            _too_big(location, answer.get("ContentLength"), limit)
            yield body
        finally:
            body.close()
        return
    try:
        stream = open(location, "rb")  # noqa: SIM115 (closed below)
    except OSError as e:
        raise UsageError(f"manifest {location}: {e.strerror}") from None
    with stream:
        _too_big(location, os.fstat(stream.fileno()).st_size, limit)
        yield stream
