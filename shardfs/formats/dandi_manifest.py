"""DANDI Zarr manifests: one version of every object of a Zarr, as a table of rows. Pure.

A manifest (dandi-archive's `doc/design/zarr-manifests.md`) is a JSON object with
`fields` (the names of the values each entry gives, recommended `["versionId",
"lastModified", "size", "ETag"]`), `statistics` (`entries`, `depth`, `totalSize`,
`lastModified`, `zarrChecksum`) and `entries`: nested objects for directories, whose
leaves are arrays of those fields, one per object. The published ones also carry
`schemaVersion: 2`.

DANDI Zarrs hold up to about a million entries, so a manifest may be 100 MB of JSON.
`parse` reads it streaming (ijson's events, C backend) into one `Table` of rows, each
directory's rows one after another once it is whole: names in one blob, sizes and
mtimes in `array`s, ETags as 16-byte digests and version ids in blobs, and for a
subdirectory the number of its rows. Neither an entry nor a directory costs a Python
object or its path: only the directories on the way down are open. `TreeBuilder` makes
the same table from a listing (`-o as_of`, `shardfs manifest`), and `write` writes a tree
back as a manifest.

What a manifest could make big is bounded as it is read, before the memory is spent:
entries and directories (MAX_ENTRIES), the depth of directories (MAX_DEPTH), the bytes of
a path (MAX_PATH), an entry's strings (MAX_STRING), and the values `fields`, `statistics`
and `schemaVersion` decode to (MAX_VALUE_ITEMS, MAX_VALUE_DEPTH). Keys are refused that
no path could hold or that could reach outside the Zarr's prefix: `.`, `..`, empty names,
names with `/`, `\\` or NUL, names longer than NAME_MAX.
"""

from __future__ import annotations

import bisect
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
#: The most entries a tree may have, files and directories together: about 75 bytes of
#: tables each (so at most about 375 MB), five times the biggest DANDI Zarrs.
MAX_ENTRIES = 5_000_000
#: The deepest a directory may lie below the root, in levels (DANDI's Zarrs nest a few:
#: groups, arrays, one level per axis of nested chunk keys).
MAX_DEPTH = 128
#: The longest path below the prefix, in bytes: S3's longest key, so no object has more.
MAX_PATH = 1024
#: The longest version id or ETag of an entry, and string in `fields` or `statistics`, in
#: characters (S3's version ids have at most 1,024 bytes, its ETags a few dozen).
MAX_STRING = 1024
#: What `fields`, `statistics` or `schemaVersion` may decode to: this many items (keys,
#: strings, numbers, arrays and objects each count one), nested this many levels deep.
MAX_VALUE_ITEMS = 1000
MAX_VALUE_DEPTH = 16
#: The longest file name Linux takes (NAME_MAX), in bytes.
NAME_MAX = 255
#: A row of a subdirectory holds `DIRECTORY - d` in `sizes`, `d` its number.
DIRECTORY = -1
#: Sizes are below this (`sizes` holds signed 64-bit numbers).
_SIZE_END = 1 << 63
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


def _too_long(length: int) -> str:
    return f"a path of {length} bytes, longer than the {MAX_PATH} of S3's longest key"


def _too_deep(depth: int) -> str:
    return f"a directory {depth} levels deep, deeper than the {MAX_DEPTH} a tree may have"


@dataclass(eq=False, slots=True)
class Table:
    """The rows of a pinned tree: each directory's entries one after another, sorted by
    name (UTF-8 bytes, which is code point order).

    Row `i` is named `names[name_at[i]:name_at[i + 1]]`; `sizes[i]` is an object's size,
    or `DIRECTORY - d` for subdirectory `d` (see `PinnedTree.first`); its ETag is
    `etags[16 * i:16 * i + 16]`, unless `i` is the `k`th of `odd_rows` (an ETag that is
    no md5 hex, as a multipart upload's `md5-N`): then `odd_text[odd_at[k]:odd_at[k + 1]]`;
    its version id `versions[version_at[i]:version_at[i + 1]]`.
    """

    names: bytearray
    name_at: array[int]
    sizes: array[int]
    mtimes: array[int]
    etags: bytearray
    versions: bytearray
    version_at: array[int]
    odd_rows: array[int]
    odd_at: array[int]
    odd_text: bytearray

    def __len__(self) -> int:
        return len(self.sizes)

    def name(self, i: int) -> bytearray:
        return self.names[self.name_at[i] : self.name_at[i + 1]]

    def find(self, name: bytes, lo: int, hi: int) -> int:
        """The row named `name` among rows `lo` to `hi`, or -1."""
        names, at, end = self.names, self.name_at, hi
        while lo < hi:
            mid = (lo + hi) // 2
            if names[at[mid] : at[mid + 1]] < name:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < end and names[at[lo] : at[lo + 1]] == name else -1

    def subdirectory(self, i: int) -> int:
        """The number of the directory row `i` is, or -1 if it is an object."""
        size = self.sizes[i]
        return DIRECTORY - size if size < 0 else -1

    def etag(self, i: int) -> str:
        odd = self.odd_rows
        if odd:
            k = bisect.bisect_left(odd, i)
            if k < len(odd) and odd[k] == i:
                return self.odd_text[self.odd_at[k] : self.odd_at[k + 1]].decode()
        return self.etags[16 * i : 16 * i + 16].hex()

    def row(self, i: int) -> Row:
        name = self.name(i).decode("utf-8", "surrogatepass")
        size = self.sizes[i]
        if size < 0:
            return Row(name, True, 0, self.mtimes[i], None)
        version_id = self.versions[self.version_at[i] : self.version_at[i + 1]].decode()
        version = PinnedVersion(version_id, self.etag(i), size)
        return Row(name, False, size, self.mtimes[i], version)

    def cost(self) -> int:
        """Bytes the table holds (what memory bounds are about)."""
        arrays = (self.name_at, self.sizes, self.mtimes, self.version_at, self.odd_rows,
                  self.odd_at)  # fmt: skip
        blobs = (self.names, self.etags, self.versions, self.odd_text)
        return sum(map(len, blobs)) + sum(a.itemsize * len(a) for a in arrays)


@dataclass(frozen=True, slots=True)
class Directory:
    """One directory of a pinned tree: rows `start` to `end` of `table`."""

    table: Table
    start: int
    end: int

    def find(self, name: bytes) -> int:
        """The row of entry `name`, or -1."""
        return self.table.find(name, self.start, self.end)

    def rows(self) -> Iterator[Row]:
        return map(self.table.row, range(self.start, self.end))


@dataclass(eq=False)
class PinnedTree:
    """Every directory of a pinned Zarr: directory `d`'s entries are rows `first[d]` to
    `first[d + 1]` of `table`; the root ("" below the prefix) is the last."""

    table: Table
    first: array[int]
    #: The `statistics` the manifest gave (empty for a tree made from a listing).
    statistics: dict[str, Any] = field(default_factory=dict)
    #: Objects, and directories below the root.
    entries: int = 0
    directories: int = 0
    total_size: int = 0
    depth: int = 0
    #: The newest mtime of an entry, in seconds (0 without entries).
    last_modified: int = 0
    #: The directory last asked for, by path: the next lookup is most often beside it.
    _recent: tuple[str, Directory | None] = field(default=("\0", None), init=False, repr=False)

    def _directory(self, number: int) -> Directory:
        return Directory(self.table, self.first[number], self.first[number + 1])

    def directory(self, key: str) -> Directory | None:
        """Directory `key` ("" the root), or None where there is none (nothing, or an
        object). One binary search per level, none for the directory last asked for."""
        recent = self._recent
        if recent[0] == key:
            return recent[1]
        found = self._walk(key)
        self._recent = (key, found)
        return found

    def _walk(self, key: str) -> Directory | None:
        found = self._directory(len(self.first) - 2)
        for part in key.split("/") if key else ():
            i = found.find(part.encode("utf-8", "surrogatepass"))
            number = -1 if i < 0 else self.table.subdirectory(i)
            if number < 0:
                return None
            found = self._directory(number)
        return found

    def lookup(self, key: str) -> Row | None:
        """The entry at `key` ("" is the root directory), or None."""
        if not key:
            return Row("", True, 0, self.last_modified, None)
        parent, _, name = key.rpartition("/")
        directory = self.directory(parent)
        if directory is None:
            return None
        i = directory.find(name.encode("utf-8", "surrogatepass"))
        return None if i < 0 else self.table.row(i)

    def files(self) -> Iterator[tuple[str, Directory]]:
        """Every directory with its rows, depth first (each subtree whole before the next):
        the order DANDI's checksum folds them in. Holds the directories on the way down."""
        table = self.table
        root = self._directory(len(self.first) - 2)
        yield "", root
        down = [("", iter(range(root.start, root.end)))]
        while down:
            path, rows = down[-1]
            for i in rows:
                number = table.subdirectory(i)
                if number >= 0:
                    below = _join(path, table.name(i).decode("utf-8", "surrogatepass"))
                    directory = self._directory(number)
                    yield below, directory
                    down.append((below, iter(range(directory.start, directory.end))))
                    break
            else:
                down.pop()

    def cost(self) -> int:
        return self.table.cost() + self.first.itemsize * len(self.first)


class _Rows:
    """Rows being gathered: an open directory's, in the order they come (with its name,
    its row in its parent's and the bytes of its path), or a tree's closed directories'."""

    __slots__ = ("etags", "last", "length", "mtimes", "name", "name_at", "names", "odd_at",
                 "odd_rows", "odd_text", "order", "row", "sizes", "version_at",
                 "versions")  # fmt: skip

    def __init__(self, name: str = "", row: int = -1, length: int = -1) -> None:
        self.names = bytearray()
        self.name_at = array("I", [0])
        self.sizes = array("q")
        self.mtimes = array("q")
        self.etags = bytearray()
        self.versions = bytearray()
        self.version_at = array("I", [0])
        self.odd_rows = array("I")
        self.odd_text = bytearray()
        self.odd_at = array("I", [0])
        self.last = b""
        #: whether the names came sorted so far (then no sort is needed at the end)
        self.order = True
        self.name, self.row, self.length = name, row, length

    def __len__(self) -> int:
        return len(self.sizes)

    def add(self, name: bytes, size: int, mtime: int, etag: str, version: bytes) -> None:
        if self.order and self.sizes and name <= self.last:
            self.order = False
        self.last = name
        self.names += name
        self.name_at.append(len(self.names))
        self.sizes.append(size)
        self.mtimes.append(mtime)
        if size < 0:
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
                self.odd_rows.append(len(self.sizes) - 1)
                self.odd_text += etag.encode()
                self.odd_at.append(len(self.odd_text))
        self.versions += version
        self.version_at.append(len(self.versions))

    def name_of(self, i: int) -> bytearray:
        return self.names[self.name_at[i] : self.name_at[i + 1]]

    def extend(self, other: _Rows) -> None:
        """Add every row of `other`, in its order."""
        rows, names = len(self.sizes), len(self.names)
        versions, odd = len(self.versions), len(self.odd_text)
        self.names += other.names
        self.name_at.extend(map(names.__add__, itertools.islice(other.name_at, 1, None)))
        self.sizes.extend(other.sizes)
        self.mtimes.extend(other.mtimes)
        self.etags += other.etags
        self.versions += other.versions
        self.version_at.extend(map(versions.__add__, itertools.islice(other.version_at, 1, None)))
        self.odd_rows.extend(map(rows.__add__, other.odd_rows))
        self.odd_text += other.odd_text
        self.odd_at.extend(map(odd.__add__, itertools.islice(other.odd_at, 1, None)))

    def take(self, other: _Rows, i: int) -> None:
        """Add row `i` of `other`."""
        self.names += other.name_of(i)
        self.name_at.append(len(self.names))
        self.sizes.append(other.sizes[i])
        self.mtimes.append(other.mtimes[i])
        self.etags += other.etags[16 * i : 16 * i + 16]
        self.versions += other.versions[other.version_at[i] : other.version_at[i + 1]]
        self.version_at.append(len(self.versions))
        k = bisect.bisect_left(other.odd_rows, i)
        if k < len(other.odd_rows) and other.odd_rows[k] == i:
            self.odd_rows.append(len(self.sizes) - 1)
            self.odd_text += other.odd_text[other.odd_at[k] : other.odd_at[k + 1]]
            self.odd_at.append(len(self.odd_text))

    def table(self) -> Table:
        """The rows as a Table: their buffers, not a copy (which would double the peak)."""
        return Table(
            self.names,
            self.name_at,
            self.sizes,
            self.mtimes,
            self.etags,
            self.versions,
            self.version_at,
            self.odd_rows,
            self.odd_at,
            self.odd_text,
        )


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class TreeBuilder:
    """Fills a PinnedTree directory by directory: from a manifest's nesting (`open`, its
    entries added to `innermost`, `close`) or from listed keys in order (`key`).

    Only the directories on the way down are open; each is closed into the tree's table
    once whole. `strict` (a manifest): a bad name, a name given twice or a bound passed is
    a UsageError. Otherwise (a listing of a bucket, which may hold any key):
    `left_out(key, why)` is told and the key skipped, and a directory wins over an object
    of its name, as S3 sources show them. MAX_ENTRIES is a UsageError either way.
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
        self._open = [_Rows()]
        self._closed = _Rows()
        self._first = array("Q", [0])
        self._last_key = ""
        self.entries = 0
        self.directories = 0
        self.total_size = 0
        self.depth = 0
        self.last_modified = 0

    def fail(self, why: str) -> UsageError:
        return UsageError(f"{self.what}: {why}")

    def _refused(self, key: str, why: str) -> UsageError:
        return self.fail(f"the key {key!r} cannot be mounted: {why}")

    def _refuse(self, key: str, why: str) -> bool:
        """Refuse key `key` (strict) or leave it out; False."""
        if self.strict:
            raise self._refused(key, why)
        if self.left_out is not None:
            self.left_out(key, why)
        return False

    @property
    def innermost(self) -> _Rows:
        """The open directory entries go to."""
        return self._open[-1]

    @property
    def whole(self) -> bool:
        """Whether the root is closed."""
        return not self._open

    def path(self) -> str:
        """The path of the innermost open directory ("" the root)."""
        return "/".join(rows.name for rows in self._open[1:])

    def refuse_name(self, name: str) -> None:
        """Raise why `name` cannot be in the innermost open directory (a bad name or a path
        too long), if it cannot."""
        encoded = name.encode("utf-8", "surrogatepass")
        length = self.innermost.length + 1 + len(encoded)
        why = bad_name(name) or (_too_long(length) if length > MAX_PATH else None)
        if why is not None:
            raise self._refused(_join(self.path(), name), why)

    def open(self, name: str) -> _Rows:
        """Open subdirectory `name` of the innermost open directory; UsageError where it
        would pass a bound (see `refuse_name`, MAX_DEPTH, MAX_ENTRIES)."""
        self.refuse_name(name)
        parent = self.innermost
        depth = len(self._open)
        if depth > MAX_DEPTH:
            raise self._refused(_join(self.path(), name), _too_deep(depth))
        self.directories += 1
        if self.entries + self.directories > MAX_ENTRIES:
            raise self.fail(f"more than {MAX_ENTRIES} entries, more than a mount holds")
        encoded = name.encode("utf-8", "surrogatepass")
        parent.add(encoded, DIRECTORY, 0, "", b"")
        below = _Rows(name, len(parent) - 1, parent.length + 1 + len(encoded))
        self._open.append(below)
        self.depth = max(self.depth, depth)
        return below

    def close(self) -> None:
        """The innermost open directory is whole: its rows, sorted, join the tree's."""
        rows = self._open.pop()
        number = len(self._first) - 1
        if rows.order and not len(self._closed):
            self._closed = rows  # taken as it is: no copy of the rows to double the peak
        elif rows.order:
            self._closed.extend(rows)
        else:
            order = sorted(range(len(rows)), key=rows.name_of)
            for _, group in itertools.groupby(order, key=rows.name_of):
                first, *more = group
                self._closed.take(rows, self._duplicate(rows, [first, *more]) if more else first)
        self._first.append(len(self._closed))
        if self._open:
            self.innermost.sizes[rows.row] = DIRECTORY - number

    def _duplicate(self, rows: _Rows, indexes: list[int]) -> int:
        """Which of rows `indexes` of closed directory `rows`, of one name, to keep."""
        key = _join(_join(self.path(), rows.name), rows.name_of(indexes[0]).decode())
        if self.strict:
            raise self.fail(f"names {key!r} twice")
        directories = [i for i in indexes if rows.sizes[i] < 0]
        for i in indexes:
            if rows.sizes[i] >= 0:
                why = "its name is also a directory (keys below it), which is shown instead"
                self._refuse(key, why if directories else "listed twice")
        return directories[0] if directories else indexes[0]

    def key(self, key: str, size: int, mtime: int, etag: str, version: str) -> None:
        """Add object `key` (a path below the prefix), with the directories it lies in.
        Keys come in order, as S3 lists them: the directories a key is not in are closed."""
        *directories, last = parts = key.split("/")
        for part in parts:
            why = bad_name(part)
            if why is not None:
                self._refuse(key, why)
                return
        length = len(key.encode("utf-8", "surrogatepass"))
        if length > MAX_PATH:
            self._refuse(key, _too_long(length))
            return
        if len(directories) > MAX_DEPTH:
            self._refuse(key, _too_deep(len(directories)))
            return
        if len(version) > MAX_STRING or len(etag) > MAX_STRING:
            self._refuse(key, f"a version id or ETag longer than {MAX_STRING} characters")
            return
        if key <= self._last_key:
            self._refuse(key, f"listed out of order, after {self._last_key!r}")
            return
        self._last_key = key
        same = 0
        while (
            same < len(directories)
            and same + 1 < len(self._open)
            and self._open[same + 1].name == directories[same]
        ):
            same += 1
        while len(self._open) > same + 1:
            self.close()
        for part in directories[same:]:
            self.open(part)
        self.entries += 1
        if self.entries + self.directories > MAX_ENTRIES:
            raise self.fail(f"more than {MAX_ENTRIES} entries, more than a mount holds")
        self.total_size += size
        self.last_modified = max(self.last_modified, mtime)
        self.innermost.add(last.encode("utf-8", "surrogatepass"), size, mtime, etag,
                           version.encode())  # fmt: skip

    def finish(self, statistics: dict[str, Any] | None = None) -> PinnedTree:
        while self._open:
            self.close()
        return PinnedTree(
            self._closed.table(),
            self._first,
            statistics or {},
            self.entries,
            self.directories,
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
        self._items = 0

    def take(self) -> tuple[str, Any]:
        try:
            return self.next()  # type: ignore[no-any-return]
        except StopIteration:
            raise UsageError(f"manifest {self.name}: not valid JSON: it ends early") from None

    def fail(self, why: str) -> UsageError:
        return UsageError(f"manifest {self.name}: {why}")

    def value(self, event: tuple[str, Any], what: str) -> Any:
        """The value `what` that starts with `event`, decoded: refused as it comes, before
        it is kept, beyond MAX_VALUE_ITEMS items, MAX_VALUE_DEPTH levels or a string of
        MAX_STRING characters."""
        self._items = 0
        return self._value(event, what, 0)

    def _value(self, event: tuple[str, Any], what: str, depth: int) -> Any:
        kind, value = event
        self._items += 1
        if self._items > MAX_VALUE_ITEMS:
            raise self.fail(f"{what} holds more than {MAX_VALUE_ITEMS} values")
        if kind in ("start_map", "start_array") and depth == MAX_VALUE_DEPTH:
            raise self.fail(f"{what} nests deeper than {MAX_VALUE_DEPTH} levels")
        if kind == "start_map":
            found: dict[str, Any] = {}
            while (item := self.take())[0] != "end_map":
                key = self._value(item, what, depth)
                found[key] = self._value(self.take(), what, depth + 1)
            return found
        if kind == "start_array":
            items = []
            while (item := self.take())[0] != "end_array":
                items.append(self._value(item, what, depth + 1))
            return items
        if type(value) is str and len(value) > MAX_STRING:
            raise self.fail(f"{what} holds a string longer than {MAX_STRING} characters")
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
    an entry that is not an array of the fields' values, a bound passed (see the module's
    docstring).
    """
    try:
        return _parse(_Events(stream, name))
    except ijson.JSONError as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"manifest {name}: not valid JSON: {detail}") from None
    except UnicodeError as e:
        raise UsageError(f"manifest {name}: not valid JSON: {e}") from None
    except (ValueError, SystemError) as e:
        # ijson's C backend raises the ValueError of an integer longer than Python converts
        # (`sys.get_int_max_str_digits()`), at times as the cause of a SystemError.
        cause = e if isinstance(e, ValueError) else e.__cause__
        if not isinstance(cause, ValueError):
            raise
        detail = str(cause).partition(";")[0]
        raise UsageError(f"manifest {name}: not JSON Python can read: {detail}") from None


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
            given = events.value(first, "fields")
            if assumed and given != list(RECOMMENDED_FIELDS):
                raise events.fail("fields come after entries and are not the recommended ones")
            fields = _fields(events, given)
        elif key == "schemaVersion":
            version = events.value(first, "schemaVersion")
            if version != SCHEMA_VERSION:
                raise events.fail(f"schemaVersion {version!r}, not {SCHEMA_VERSION}")
        elif key == "statistics":
            statistics = events.value(first, "statistics")
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
    a million entries cost: names and bounds are checked and rows stored inline."""
    count = len(fields)
    at_version, at_size, at_etag = (fields.index(f) for f in ("versionId", "size", "ETag"))
    at_time = fields.index("lastModified") if "lastModified" in fields else -1
    times: dict[str, int] = {}
    stream = events.stream
    take = stream.__next__
    table = builder.innermost
    #: the longest name an entry of `table` may have: NAME_MAX, or less where the path
    #: would be longer than MAX_PATH
    longest = min(NAME_MAX, MAX_PATH - table.length - 1)
    name = ""
    entries = builder.entries
    total = builder.total_size
    newest = builder.last_modified
    #: the entries there may be, given the directories
    most = MAX_ENTRIES - builder.directories
    try:
        for kind, value in stream:
            if kind == "map_key":
                name = value
                continue
            if kind == "start_array":
                row = tuple(itertools.islice(stream, count))
                if take()[0] != "end_array" or len(row) != count:
                    raise events.fail(f"the entry {_where(builder, name)} is not an array "
                                      f"of {count} values")  # fmt: skip
                version, size, etag = row[at_version], row[at_size], row[at_etag]
                if (
                    version[0] != "string"
                    or etag[0] != "string"
                    or type(size[1]) is not int
                    or not 0 <= size[1] < _SIZE_END
                ):
                    raise events.fail(f"the entry {_where(builder, name)} is not "
                                      f"{json.dumps(fields)} of strings and a size")  # fmt: skip
                if len(version[1]) > MAX_STRING or len(etag[1]) > MAX_STRING:
                    raise events.fail(f"the entry {_where(builder, name)} has a versionId "
                                      f"or ETag longer than {MAX_STRING} characters")  # fmt: skip
                mtime = 0
                if at_time >= 0:
                    text = row[at_time][1]
                    mtime = times.get(text, -1) if type(text) is str else -1
                    if mtime < 0:
                        mtime = _time(events, text, _where(builder, name))
                        if len(times) > 100_000:
                            times.clear()
                        times[text] = mtime
                    if mtime > newest:
                        newest = mtime
                encoded = name.encode("utf-8", "surrogatepass")
                if name in _ODD or len(encoded) > longest or _ODD_CHARS.intersection(name):
                    builder.refuse_name(name)  # raises, saying why
                entries += 1
                if entries > most:
                    raise events.fail(f"more than {MAX_ENTRIES} entries, more than a mount "
                                      "holds")  # fmt: skip
                total += size[1]
                table.add(encoded, size[1], mtime, etag[1], version[1].encode())
            elif kind == "start_map":
                builder.entries = entries
                table = builder.open(name)
                longest = min(NAME_MAX, MAX_PATH - table.length - 1)
                most = MAX_ENTRIES - builder.directories
            elif kind == "end_map":
                builder.close()
                if builder.whole:
                    break
                table = builder.innermost
                longest = min(NAME_MAX, MAX_PATH - table.length - 1)
            else:
                raise events.fail(f"{_where(builder, name)} is neither an entry (array) "
                                  "nor a directory (object)")  # fmt: skip
        else:
            raise StopIteration
    except StopIteration:
        raise events.fail("not valid JSON: it ends early") from None
    builder.entries, builder.total_size, builder.last_modified = entries, total, newest


def _where(builder: TreeBuilder, name: str) -> str:
    return repr(_join(builder.path(), name))


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
    (with `checksum`), and the nested entries (recursively: at most MAX_DEPTH levels)."""
    quote = json.encoder.encode_basestring_ascii
    head = {
        "schemaVersion": SCHEMA_VERSION,
        "fields": list(RECOMMENDED_FIELDS),
        "statistics": statistics(tree, checksum),
    }
    out.write(json.dumps(head)[:-1] + ', "entries": ')
    times: dict[int, str] = {}
    table = tree.table

    def directory(number: int) -> None:
        out.write("{")
        for i in range(tree.first[number], tree.first[number + 1]):
            row = table.row(i)
            out.write(f"{', ' if i > tree.first[number] else ''}{quote(row.name)}: ")
            if row.is_dir:
                directory(table.subdirectory(i))
                continue
            assert row.version is not None
            when = times.get(row.mtime)
            if when is None:
                when = times[row.mtime] = format_time(row.mtime)
            out.write(f'[{quote(row.version.version_id)}, "{when}", {row.size}, '
                      f"{quote(row.version.etag)}]")  # fmt: skip

        out.write("}")

    directory(len(tree.first) - 2)
    out.write("}\n")
