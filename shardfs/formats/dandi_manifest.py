"""DANDI Zarr manifests: one version of every object of a Zarr, as a tree of tables. Pure.

A manifest (dandi-archive's `doc/design/zarr-manifests.md`) is a JSON object with
`fields` (the names of the values each entry gives, recommended `["versionId",
"lastModified", "size", "ETag"]`), `statistics` (`entries`, `depth`, `totalSize`,
`lastModified`, `zarrChecksum`) and `entries`: nested objects for directories, whose
leaves are arrays of those fields, one per object. The published ones also carry
`schemaVersion: 2`.

DANDI Zarrs hold up to about a million entries, so a manifest may be 100 MB of JSON.
`parse` reads it streaming (ijson's events, C backend) into one `Table` per directory:
its names sorted in one blob, sizes and mtimes in `array`s, ETags as 16-byte digests and
version ids in one blob, never a Python object per entry. `TreeBuilder` makes the same
tables from a listing (`-o as_of`, `shardfs manifest`), and `write` writes a tree back as
a manifest.

Keys are refused that no path could hold or that could reach outside the Zarr's
prefix: `.`, `..`, empty names, names with `/`, `\\` or NUL, names longer than NAME_MAX.
"""

from __future__ import annotations

import itertools
import json
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, NamedTuple

import ijson

from shardfs.primitives.errors import UsageError

#: The schema version the published manifests carry, and `write` writes.
SCHEMA_VERSION = 2
#: The `fields` DANDI recommends, in its order: what `write` writes.
RECOMMENDED_FIELDS = ("versionId", "lastModified", "size", "ETag")
#: What an entry must give for a mount to read its object and check it.
REQUIRED_FIELDS = frozenset({"versionId", "size", "ETag"})
#: The most entries a manifest may have: about 70 bytes of tables each (so at most about
#: 350 MB), five times the biggest DANDI Zarrs.
MAX_ENTRIES = 5_000_000
#: The longest file name Linux takes (NAME_MAX), in bytes.
NAME_MAX = 255
#: A directory in a table's `sizes`.
DIRECTORY = -1
_NO_DIGEST = bytes(16)
#: Names `bad_name` refuses, and the characters it refuses in names.
_ODD = frozenset({"", ".", ".."})
_ODD_CHARS = frozenset("/\\\0")
#: Bytes ijson reads at a time.
_BUFFER = 1 << 16


class PinnedVersion(NamedTuple):
    """The version of an object a pinned tree names: what reads ask S3 for (`VersionId`)
    and what they check the answer against (its ETag, without quotes, and its size)."""

    version_id: str
    etag: str
    size: int

    def __str__(self) -> str:
        """Its name in the disk cache: the version id alone is not enough where it is
        `null` (an object stored while versioning was off), which a later write replaces."""
        return f"{self.version_id} {self.etag}"


class Row(NamedTuple):
    """One entry of a table: a directory (`is_dir`, no version) or a pinned object."""

    name: str
    is_dir: bool
    size: int
    mtime: int
    version: PinnedVersion | None


def bad_name(name: str) -> str | None:
    """Why `name` cannot be a name in a pinned tree, or None."""
    if name in ("", ".", ".."):
        return f"{name!r} cannot be a file name" if name else "an empty name"
    if "/" in name or "\\" in name or "\0" in name:
        return f"{name!r} holds a '/', '\\' or NUL"
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        return f"a name longer than the {NAME_MAX} bytes a file name can have"
    return None


@dataclass(eq=False, slots=True)
class Table:
    """The entries of one directory, sorted by name (UTF-8 bytes, which is code point order).

    Entry `i` is named `names[name_at[i]:name_at[i + 1]]`; `sizes[i]` is DIRECTORY for a
    subdirectory; its ETag is `etags[16 * i:16 * i + 16]` unless `odd_etags` holds it (a
    multipart upload's `md5-N`); its version id `versions[version_at[i]:version_at[i + 1]]`.
    """

    names: bytes
    name_at: array[int]
    sizes: array[int]
    mtimes: array[int]
    etags: bytes
    versions: bytes
    version_at: array[int]
    odd_etags: dict[int, str] | None

    def __len__(self) -> int:
        return len(self.sizes)

    def name(self, i: int) -> bytes:
        return self.names[self.name_at[i] : self.name_at[i + 1]]

    def find(self, name: bytes) -> int:
        """The index of entry `name`, or -1."""
        lo, hi = 0, len(self.sizes)
        names, at = self.names, self.name_at
        while lo < hi:
            mid = (lo + hi) // 2
            if names[at[mid] : at[mid + 1]] < name:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self.sizes) and names[at[lo] : at[lo + 1]] == name else -1

    def etag(self, i: int) -> str:
        if self.odd_etags is not None and i in self.odd_etags:
            return self.odd_etags[i]
        return self.etags[16 * i : 16 * i + 16].hex()

    def row(self, i: int) -> Row:
        name = self.name(i).decode("utf-8", "surrogatepass")
        size = self.sizes[i]
        if size == DIRECTORY:
            return Row(name, True, 0, self.mtimes[i], None)
        version_id = self.versions[self.version_at[i] : self.version_at[i + 1]].decode()
        version = PinnedVersion(version_id, self.etag(i), size)
        return Row(name, False, size, self.mtimes[i], version)

    def rows(self) -> Iterator[Row]:
        return map(self.row, range(len(self.sizes)))

    def cost(self) -> int:
        """Bytes the table holds (what memory bounds are about)."""
        arrays = (self.name_at, self.sizes, self.mtimes, self.version_at)
        return (
            len(self.names)
            + len(self.etags)
            + len(self.versions)
            + sum(a.itemsize * len(a) for a in arrays)
        )


@dataclass
class PinnedTree:
    """Every directory of a pinned Zarr, by path below the prefix ("" the root)."""

    directories: dict[str, Table]
    #: The `statistics` the manifest gave (empty for a tree made from a listing).
    statistics: dict[str, Any] = field(default_factory=dict)
    entries: int = 0
    total_size: int = 0
    depth: int = 0
    #: The newest mtime of an entry, in seconds (0 without entries).
    last_modified: int = 0

    def lookup(self, key: str) -> Row | None:
        """The entry at `key` ("" is the root directory), or None."""
        if not key:
            return Row("", True, 0, self.last_modified, None)
        parent, _, name = key.rpartition("/")
        table = self.directories.get(parent)
        if table is None:
            return None
        i = table.find(name.encode("utf-8", "surrogatepass"))
        return None if i < 0 else table.row(i)

    def files(self) -> Iterator[tuple[str, Table]]:
        """Every directory with its table, depth first (each subtree whole before the next):
        the order DANDI's checksum folds them in."""
        pending = [""]
        while pending:
            path = pending.pop()
            table = self.directories[path]
            yield path, table
            for i in reversed(range(len(table))):
                if table.sizes[i] == DIRECTORY:
                    name = table.name(i).decode("utf-8", "surrogatepass")
                    pending.append(f"{path}/{name}" if path else name)

    def cost(self) -> int:
        return sum(table.cost() for table in self.directories.values())


class _Open:
    """A table being filled, in the order entries come."""

    __slots__ = ("etags", "last", "mtimes", "name_at", "names", "odd", "order", "sizes",
                 "version_at", "versions")  # fmt: skip

    def __init__(self) -> None:
        self.names = bytearray()
        self.name_at = array("I", [0])
        self.sizes = array("q")
        self.mtimes = array("q")
        self.etags = bytearray()
        self.versions = bytearray()
        self.version_at = array("I", [0])
        self.odd: dict[int, str] | None = None
        self.last = b""
        #: whether the names came sorted so far (then no sort is needed at the end)
        self.order = True

    def add(self, name: bytes, size: int, mtime: int, etag: str, version: bytes) -> None:
        if self.order and self.sizes and name <= self.last:
            self.order = False
        self.last = name
        self.names += name
        self.name_at.append(len(self.names))
        self.sizes.append(size)
        self.mtimes.append(mtime)
        if size == DIRECTORY:
            self.etags += _NO_DIGEST
        else:
            try:
                digest = bytes.fromhex(etag)
            except ValueError:
                digest = b""
            if len(digest) == 16 and digest.hex() == etag:
                self.etags += digest
            else:
                self.etags += _NO_DIGEST
                if self.odd is None:
                    self.odd = {}
                self.odd[len(self.sizes) - 1] = etag
        self.versions += version
        self.version_at.append(len(self.versions))

    def close(self, path: str, duplicate: Callable[[str, list[Row]], Row]) -> Table:
        table = Table(
            bytes(self.names),
            self.name_at,
            self.sizes,
            self.mtimes,
            bytes(self.etags),
            bytes(self.versions),
            self.version_at,
            self.odd,
        )
        if self.order:
            return table
        return _sorted(path, table, duplicate)


def _sorted(path: str, table: Table, duplicate: Callable[[str, list[Row]], Row]) -> Table:
    """`table` sorted by name; `duplicate` picks the one row of a name given more than once."""
    order = sorted(range(len(table)), key=table.name)
    rows: list[Row] = []
    for _, group in itertools.groupby(order, key=table.name):
        indexes = list(group)
        first = table.row(indexes[0])
        rows.append(first if len(indexes) == 1 else duplicate(path, list(map(table.row, indexes))))
    again = _Open()
    for row in rows:
        version = row.version
        again.add(
            row.name.encode("utf-8", "surrogatepass"),
            DIRECTORY if row.is_dir else row.size,
            row.mtime,
            version.etag if version else "",
            version.version_id.encode() if version else b"",
        )
    return again.close(path, duplicate)


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class TreeBuilder:
    """Fills a PinnedTree entry by entry, from a manifest's nesting or from listed keys.

    `strict` (a manifest): a bad name or a name given twice is a UsageError. Otherwise (a
    listing of a bucket, which may hold any key): `left_out(key, why)` is told and the key
    skipped, and a directory wins over an object of its name, as S3 sources show them.
    """

    def __init__(
        self,
        strict: bool = True,
        left_out: Callable[[str, str], None] | None = None,
        name: str = "",
    ) -> None:
        self.strict = strict
        #: how errors name what is built (`manifest NAME`)
        self.what = f"manifest {name}" if name else "the tree"
        self.left_out = left_out
        self._open: dict[str, _Open] = {"": _Open()}
        self._tables: dict[str, Table] = {}
        self.entries = 0
        self.total_size = 0
        self.depth = 0
        self.last_modified = 0

    def _refuse(self, key: str, why: str) -> bool:
        """Refuse key `key` (strict) or leave it out; False."""
        if self.strict:
            raise UsageError(f"{self.what}: the key {key!r} cannot be mounted: {why}")
        if self.left_out is not None:
            self.left_out(key, why)
        return False

    def name(self, path: str, name: str) -> bytes | None:
        """`name`, of directory `path`, encoded; None if it is left out."""
        why = bad_name(name)
        if why is not None:
            self._refuse(_join(path, name), why)
            return None
        return name.encode("utf-8", "surrogatepass")

    def directory(self, path: str, name: bytes, mtime: int = 0) -> str:
        """Open subdirectory `name` of directory `path`; its path."""
        below = _join(path, name.decode("utf-8", "surrogatepass"))
        if below in self._open or below in self._tables:
            if self.strict:
                raise UsageError(f"{self.what} names {below!r} twice")
            return below
        self._open[path].add(name, DIRECTORY, mtime, "", b"")
        self._open[below] = _Open()
        return below

    def file(self, path: str, name: bytes, size: int, mtime: int, etag: str, version: str) -> None:
        """Add object `name` to open directory `path`."""
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise UsageError(
                f"{self.what}: more than {MAX_ENTRIES} entries, more than a mount holds"
            )
        self.total_size += size
        if mtime > self.last_modified:
            self.last_modified = mtime
        self._open[path].add(name, size, mtime, etag, version.encode())

    def key(self, key: str, size: int, mtime: int, etag: str, version: str) -> None:
        """Add object `key` (a path below the prefix), with the directories it lies in."""
        *directories, last = key.split("/")
        for part in key.split("/"):
            why = bad_name(part)
            if why is not None:
                self._refuse(key, why)
                return
        path = ""
        for part in directories:
            below = _join(path, part)
            if below not in self._open:
                self.directory(path, part.encode("utf-8", "surrogatepass"))
            path = below
        self.depth = max(self.depth, len(directories))
        self.file(path, last.encode("utf-8", "surrogatepass"), size, mtime, etag, version)

    def open_table(self, path: str) -> _Open:
        """The table being filled of open directory `path`."""
        return self._open[path]

    def close(self, path: str) -> None:
        """Directory `path` is whole: make its table."""
        self._tables[path] = self._open.pop(path).close(path, self._duplicate)

    def _duplicate(self, path: str, rows: list[Row]) -> Row:
        key = _join(path, rows[0].name)
        if self.strict:
            raise UsageError(f"{self.what} names {key!r} twice")
        directories = [row for row in rows if row.is_dir]
        for row in rows:
            if not row.is_dir:
                why = "its name is also a directory (keys below it), which is shown instead"
                self._refuse(key, why if directories else "listed twice")
        return directories[0] if directories else rows[0]

    def finish(self, statistics: dict[str, Any] | None = None) -> PinnedTree:
        for path in sorted(self._open, key=len, reverse=True):
            self.close(path)
        return PinnedTree(
            self._tables,
            statistics or {},
            self.entries,
            self.total_size,
            self.depth,
            self.last_modified,
        )


# -- parsing ---------------------------------------------------------------------------


def parse_time(text: str) -> int:
    """Seconds since the epoch of an ISO 8601 time; one without a zone is UTC."""
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp())


def format_time(seconds: int) -> str:
    """A time as the manifests write it: `YYYY-MM-DDTHH:MM:SS+00:00`."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


class _Events:
    """ijson's events with a name for errors."""

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self.stream = ijson.basic_parse(stream, buf_size=_BUFFER)
        self.next = self.stream.__next__
        self.name = name

    def take(self) -> tuple[str, Any]:
        try:
            return self.next()  # type: ignore[no-any-return]
        except StopIteration:
            raise UsageError(f"manifest {self.name}: not valid JSON: it ends early") from None

    def fail(self, why: str) -> UsageError:
        return UsageError(f"manifest {self.name}: {why}")

    def value(self, event: tuple[str, Any]) -> Any:
        """The (small) value that starts with `event`, decoded."""
        kind, value = event
        if kind == "start_map":
            found: dict[str, Any] = {}
            while (item := self.take())[0] != "end_map":
                found[item[1]] = self.value(self.take())
            return found
        if kind == "start_array":
            items = []
            while (item := self.take())[0] != "end_array":
                items.append(self.value(item))
            return items
        return value

    def skip(self, event: tuple[str, Any]) -> None:
        depth = 1 if event[0] in ("start_map", "start_array") else 0
        while depth:
            kind = self.take()[0]
            depth += kind in ("start_map", "start_array")
            depth -= kind in ("end_map", "end_array")


def parse(stream: IO[bytes], name: str) -> PinnedTree:
    """The tree a manifest read from `stream` describes (`name` names it in errors).

    UsageError, in one line, for anything but a manifest: not JSON, `fields` without
    versionId, size or ETag, a `schemaVersion` other than 2, a bad key (see `bad_name`),
    an entry that is not an array of the fields' values.
    """
    try:
        return _parse(_Events(stream, name))
    except ijson.JSONError as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"manifest {name}: not valid JSON: {detail}") from None
    except UnicodeError as e:
        raise UsageError(f"manifest {name}: not valid JSON: {e}") from None


def _parse(events: _Events) -> PinnedTree:
    if events.take()[0] != "start_map":
        raise events.fail("not a JSON object")
    fields: list[str] | None = None
    assumed = False
    statistics: dict[str, Any] = {}
    builder: TreeBuilder | None = None
    while (item := events.take())[0] != "end_map":
        key, first = item[1], events.take()
        if key == "fields":
            given = events.value(first)
            if assumed and given != list(RECOMMENDED_FIELDS):
                raise events.fail("fields come after entries and are not the recommended ones")
            fields = _fields(events, given)
        elif key == "schemaVersion":
            version = events.value(first)
            if version != SCHEMA_VERSION:
                raise events.fail(f"schemaVersion {version!r}, not {SCHEMA_VERSION}")
        elif key == "statistics":
            statistics = events.value(first)
            if not isinstance(statistics, dict):
                raise events.fail("statistics is not an object")
        elif key == "entries":
            if first[0] != "start_map":
                raise events.fail("entries is not an object")
            if fields is None:
                fields, assumed = list(RECOMMENDED_FIELDS), True
            builder = TreeBuilder(name=events.name)
            _entries(events, builder, fields)
        else:
            events.skip(first)
    try:
        events.next()
    except StopIteration:
        pass
    else:
        raise events.fail("not valid JSON: more after the object")
    if builder is None:
        raise events.fail("no entries")
    if fields is None:
        raise events.fail("no fields")
    return builder.finish(statistics)


def _fields(events: _Events, given: Any) -> list[str]:
    if not isinstance(given, list) or not all(isinstance(f, str) for f in given):
        raise events.fail("fields is not an array of names")
    missing = sorted(REQUIRED_FIELDS - set(given))
    if missing or len(set(given)) != len(given):
        why = f"lacks {', '.join(missing)}" if missing else "names a field twice"
        raise events.fail(f"fields {json.dumps(given)} {why} (recommended: "
                          f"{json.dumps(list(RECOMMENDED_FIELDS))})")  # fmt: skip
    return given


def _entries(events: _Events, builder: TreeBuilder, fields: list[str]) -> None:
    """Fill `builder` from the `entries` object (its start_map taken). The loop is what
    a million entries cost: names are checked and rows stored inline."""
    count = len(fields)
    at_version, at_size, at_etag = (fields.index(f) for f in ("versionId", "size", "ETag"))
    at_time = fields.index("lastModified") if "lastModified" in fields else -1
    times: dict[str, int] = {}
    stream = events.stream
    take = stream.__next__
    paths = [""]
    tables = [builder.open_table("")]
    table = tables[0]
    name = ""
    entries = builder.entries
    total = builder.total_size
    newest = builder.last_modified
    depth = 0
    try:
        for kind, value in stream:
            if kind == "map_key":
                name = value
                continue
            if kind == "start_array":
                row = tuple(itertools.islice(stream, count))
                if take()[0] != "end_array" or len(row) != count:
                    raise events.fail(f"the entry {_where(paths[-1], name)} is not an array "
                                      f"of {count} values")  # fmt: skip
                version, size, etag = row[at_version], row[at_size], row[at_etag]
                if (
                    version[0] != "string"
                    or etag[0] != "string"
                    or type(size[1]) is not int
                    or size[1] < 0
                ):
                    raise events.fail(f"the entry {_where(paths[-1], name)} is not "
                                      f"{json.dumps(fields)} of strings and a size")  # fmt: skip
                mtime = 0
                if at_time >= 0:
                    text = row[at_time][1]
                    mtime = times.get(text, -1) if type(text) is str else -1
                    if mtime < 0:
                        mtime = _time(events, text, _where(paths[-1], name))
                        if len(times) > 100_000:
                            times.clear()
                        times[text] = mtime
                    if mtime > newest:
                        newest = mtime
                encoded = name.encode("utf-8", "surrogatepass")
                if name in _ODD or len(encoded) > NAME_MAX or _ODD_CHARS.intersection(name):
                    builder.name(paths[-1], name)  # raises, saying why
                entries += 1
                total += size[1]
                table.add(encoded, size[1], mtime, etag[1], version[1].encode())
            elif kind == "start_map":
                encoded = builder.name(paths[-1], name)  # type: ignore[assignment]
                assert encoded is not None  # strict: a bad name raised
                paths.append(builder.directory(paths[-1], encoded))
                table = builder.open_table(paths[-1])
                tables.append(table)
                depth += 1
                builder.depth = max(builder.depth, depth)
            elif kind == "end_map":
                builder.close(paths.pop())
                tables.pop()
                if not paths:
                    break
                table = tables[-1]
                depth -= 1
            else:
                raise events.fail(f"{_where(paths[-1], name)} is neither an entry (array) "
                                  "nor a directory (object)")  # fmt: skip
            if entries > MAX_ENTRIES:
                raise events.fail(f"more than {MAX_ENTRIES} entries, more than a mount holds")
        else:
            raise StopIteration
    except StopIteration:
        raise events.fail("not valid JSON: it ends early") from None
    builder.entries, builder.total_size, builder.last_modified = entries, total, newest


def _where(path: str, name: str) -> str:
    return repr(_join(path, name))


def _time(events: _Events, text: Any, where: str) -> int:
    try:
        return parse_time(text)
    except (TypeError, ValueError):
        raise events.fail(f"the entry {where} has lastModified {text!r}, not a time") from None


# -- writing ---------------------------------------------------------------------------


def statistics(tree: PinnedTree, checksum: str) -> dict[str, Any]:
    """The `statistics` of a manifest of `tree`, whose DANDI zarr checksum is `checksum`."""
    return {
        "entries": tree.entries,
        "depth": tree.depth,
        "totalSize": tree.total_size,
        "lastModified": format_time(tree.last_modified),
        "zarrChecksum": checksum,
    }


def write(tree: PinnedTree, out: IO[str], checksum: str) -> None:
    """Write `tree` as a manifest: schemaVersion 2, the recommended fields, statistics
    (with `checksum`), and the nested entries."""
    quote = json.encoder.encode_basestring_ascii
    head = {
        "schemaVersion": SCHEMA_VERSION,
        "fields": list(RECOMMENDED_FIELDS),
        "statistics": statistics(tree, checksum),
    }
    out.write(json.dumps(head)[:-1] + ', "entries": ')
    times: dict[int, str] = {}

    def directory(path: str) -> None:
        table = tree.directories[path]
        out.write("{")
        for i, row in enumerate(table.rows()):
            out.write(f"{', ' if i else ''}{quote(row.name)}: ")
            if row.is_dir:
                directory(_join(path, row.name))
                continue
            assert row.version is not None
            when = times.get(row.mtime)
            if when is None:
                when = times[row.mtime] = format_time(row.mtime)
            out.write(f'[{quote(row.version.version_id)}, "{when}", {row.size}, '
                      f"{quote(row.version.etag)}]")  # fmt: skip

        out.write("}")

    directory("")
    out.write("}\n")
