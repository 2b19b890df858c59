"""DANDI's zarr checksum: a tree hash over the (path, digest, size) of every file. No I/O.

A file's digest is the md5 hex of its bytes (on S3, its ETag). A directory's
digest is the md5 of the compact JSON `{"directories":[...],"files":[...]}`
of its entries, each `{"digest":...,"name":...,"size":...}` and sorted by
name, written `{md5}-{file count}--{total size}` with both numbers counted
recursively; a child directory's entry carries that string and its total
size. Directories without files do not exist for it. This is what the DANDI
Archive and the `zarr_checksum` package compute, byte for byte, so digests
made here compare with theirs.

`Fold` computes it in one pass, in bounded memory: a directory's digest
depends on its subtree alone, so a depth-first walk can make it as soon as it
leaves the directory, and keep only the directories on its path (each with
the entries found so far), never the tree. Entries are sorted when their
directory is closed, so the walk may visit files and subdirectories in any
order (shards' order, say) as long as it never comes back to a directory it
left.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _quote
from operator import itemgetter

#: The checksum of a tree without files.
EMPTY_CHECKSUM = "481a2f77ab786a0f45aafd5db0971caa-0--0"

_PATTERN = re.compile(r"([0-9a-f]{32})-([0-9]+)--([0-9]+)")


@dataclass(frozen=True, slots=True)
class Digest:
    """A directory's checksum: the md5 of its manifest, and its files and bytes below it."""

    md5: str
    count: int
    size: int

    def __str__(self) -> str:
        return f"{self.md5}-{self.count}--{self.size}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        match = _PATTERN.fullmatch(text)
        if match is None:
            raise ValueError(f"not a zarr checksum: {text!r}")
        return cls(match.group(1), int(match.group(2)), int(match.group(3)))


#: One entry of a manifest: (name, digest, size).
Item = tuple[str, str, int]


@dataclass
class Manifest:
    """The entries of one directory, sorted by name, from which its digest is computed."""

    directories: list[Item]
    files: list[Item]

    def json(self) -> str:
        """The exact text DANDI hashes: `json.dumps` of {"directories": [...], "files": [...]},
        compact, non-ASCII escaped (formatted here: 2x faster)."""
        return f'{{"directories":[{_entries(self.directories)}],"files":[{_entries(self.files)}]}}'


def _entries(items: list[Item]) -> str:
    """The entries as `json.dumps` writes them (with the encoder's own string quoting)."""
    return ",".join(
        [f'{{"digest":{_quote(d)},"name":{_quote(n)},"size":{s:d}}}' for n, d, s in items]
    )


@dataclass(frozen=True, slots=True)
class DirectoryChecksum:
    """A directory's manifest and digest; `path` is "" for the root."""

    path: str
    manifest: Manifest
    digest: Digest
    text: str

    def document(self) -> str:
        """The directory's `.checksum` document, as the DANDI design stores it."""
        return f'{{"checksums":{self.text},"digest":"{self.digest}"}}'


@dataclass
class _Open:
    """A directory the walk is in: its entries so far, and the files its closed
    subdirectories hold."""

    path: str
    directories: list[Item] = field(default_factory=list)
    files: list[Item] = field(default_factory=list)
    below: int = 0

    def close(self) -> DirectoryChecksum:
        manifest = Manifest(_sorted(self.path, self.directories), _sorted(self.path, self.files))
        text = manifest.json()
        md5 = hashlib.md5(text.encode()).hexdigest()
        size = sum(s for _, _, s in self.files) + sum(s for _, _, s in self.directories)
        return DirectoryChecksum(
            self.path, manifest, Digest(md5, len(self.files) + self.below, size), text
        )


def _sorted(path: str, items: list[Item]) -> list[Item]:
    """`items` sorted by name, in place; a name twice means the walk came back to `path`
    after leaving it, which would have given it two digests."""
    items.sort()
    if len(dict.fromkeys(map(itemgetter(0), items))) != len(items):
        name = next(a[0] for a, b in itertools.pairwise(items) if a[0] == b[0])
        raise ValueError(f"{'/'.join(filter(None, (path, name)))} added twice")
    return items


class Fold:
    """The checksum of files added in a depth-first walk (see the module docstring).

    Files come with their directory (`/`-separated, "" for the root); once a
    file of another directory than the current one's subtree is added, the
    current directory is closed for good. `on_directory` is called with each
    directory that holds a file somewhere below it, deepest first, the root last.
    """

    def __init__(self, on_directory: Callable[[DirectoryChecksum], None] | None = None) -> None:
        self._open = [_Open("")]
        self._on_directory = on_directory
        #: Files added so far.
        self.count = 0

    def add(self, path: str, digest: str, size: int) -> None:
        directory, _, name = path.rpartition("/")
        self.add_files(directory, [(name, digest, size)])

    def add_files(self, directory: str, items: Iterable[Item]) -> None:
        """Add files of `directory`: (name, digest, size) each."""
        top = self._open[-1]
        if directory != top.path:
            top = self._enter(directory)
        before = len(top.files)
        top.files.extend(items)
        self.count += len(top.files) - before

    def finish(self) -> Digest:
        """The checksum of the whole tree (EMPTY_CHECKSUM without files); closes every
        directory still open."""
        root = Digest.parse(EMPTY_CHECKSUM)
        while self._open:
            closed = self._close()
            if closed is not None:
                root = closed.digest
        return root

    def _enter(self, directory: str) -> _Open:
        """Close the open directories `directory` is not in, open those down to it."""
        while not _inside(directory, self._open[-1].path):
            self._close()
        top = self._open[-1]
        if directory == top.path:
            return top
        below = directory[len(top.path) + 1 :] if top.path else directory
        for name in below.split("/"):
            if name in ("", ".", ".."):
                raise ValueError(f"not a directory path: {directory!r}")
            top = _Open(f"{top.path}/{name}" if top.path else name)
            self._open.append(top)
        return top

    def _close(self) -> DirectoryChecksum | None:
        """Close the deepest open directory; None if it holds no file (it does not exist
        for the checksum)."""
        node = self._open.pop()
        if not node.files and not node.directories:
            return None
        closed = node.close()
        if self._open:
            parent = self._open[-1]
            name = node.path.rpartition("/")[2]
            parent.directories.append((name, str(closed.digest), closed.digest.size))
            parent.below += closed.digest.count
        if self._on_directory is not None:
            self._on_directory(closed)
        return closed


def _inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or below it."""
    return not directory or path == directory or path.startswith(directory + "/")
