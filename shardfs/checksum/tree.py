"""DANDI's zarr checksum: a tree hash over the (path, digest, size) of every file. No I/O.

A file's digest is the md5 hex of its bytes (on S3, its ETag). A directory's
digest is the md5 of the compact JSON `{"directories":[...],"files":[...]}`
of its entries, each `{"digest":...,"name":...,"size":...}` and sorted by
name, written `{md5}-{file count}--{total size}` with both numbers counted
recursively; a child directory's entry carries that string and its total
size. Directories without files do not exist for it. This is what the DANDI
Archive and the `zarr_checksum` package compute, byte for byte, so digests
made here compare with theirs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote

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
    """The entries of one directory, from which its digest is computed."""

    directories: list[Item]
    files: list[Item]

    def json(self) -> str:
        """The exact text DANDI hashes: `json.dumps` of {"directories": [...], "files": [...]},
        compact, non-ASCII escaped, entries sorted by name (formatted here: 2x faster)."""
        return f'{{"directories":[{_entries(self.directories)}],"files":[{_entries(self.files)}]}}'

    def digest(self, text: str | None = None) -> Digest:
        """The directory's digest (`text`: its `json()`, if the caller has it already)."""
        md5 = hashlib.md5((self.json() if text is None else text).encode()).hexdigest()
        count = len(self.files) + sum(Digest.parse(d).count for _, d, _ in self.directories)
        size = sum(s for _, _, s in self.files) + sum(s for _, _, s in self.directories)
        return Digest(md5, count, size)


def _entries(items: list[Item]) -> str:
    """The entries as `json.dumps` writes them (with the encoder's own string quoting)."""
    return ",".join(
        [f'{{"digest":{_quote(d)},"name":{_quote(n)},"size":{s:d}}}' for n, d, s in sorted(items)]
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


class ChecksumTree:
    """Files added one by one; directory digests computed bottom-up at the end.

    Paths are `/`-separated and relative to the root; every path is added once.
    """

    def __init__(self) -> None:
        self._files: dict[str, list[Item]] = {}
        self._count = 0

    def __len__(self) -> int:
        """The number of files added."""
        return self._count

    def add(self, path: str, digest: str, size: int) -> None:
        directory, _, name = path.rpartition("/")
        files = self._files.get(directory)
        if files is None:
            files = self._files[directory] = []
        files.append((name, digest, size))
        self._count += 1

    def directories(self) -> Iterator[DirectoryChecksum]:
        """Every directory that holds a file somewhere below it, deepest first, root last."""
        children: dict[str, list[Item]] = {}
        paths = set(self._files)
        for path in self._files:
            while path:
                path = path.rpartition("/")[0]
                paths.add(path)
        for path in sorted(paths, key=lambda p: -p.count("/") if p else 1):
            manifest = Manifest(children.pop(path, []), self._files.get(path, []))
            text = manifest.json()
            digest = manifest.digest(text)
            if path:
                parent, _, name = path.rpartition("/")
                children.setdefault(parent, []).append((name, str(digest), digest.size))
            yield DirectoryChecksum(path, manifest, digest, text)

    def digest(self) -> Digest:
        """The checksum of the whole tree (EMPTY_CHECKSUM without files)."""
        root = Digest.parse(EMPTY_CHECKSUM)
        for directory in self.directories():
            root = directory.digest
        return root
