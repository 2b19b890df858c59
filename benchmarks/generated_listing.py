"""The stored checksum of a plain copy that is only a generated listing: 10M files, no inodes.

Why: `shardfs checksum COPY` of a plain copy of a 10,000,000-chunk view would
need 10M files on disk (10M inodes). This runs what that command runs,
`stored_checksum` with one thread per core, over a `Storage` that lists and
reads the plain copy of the view of a source made by `checksum --synthetic
ROWS` (the DANDI layout, ROWS x 100 x 100 chunks of one byte): the view's two
`zarr.json` documents (read once from SOURCE through the view), and chunk files
`data/c/<i>/<j>/<k>` of one byte each, made up from their coordinates (the
values the synthetic shards hold). It prints the checksum, which must be what
`shardfs checksum --virtual SOURCE` prints.

    .venv/bin/python benchmarks/generated_listing.py SOURCE ROWS

(a file, not a module: `checksum` runs it with another tree's shardfs on the path)
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence

from shardfs.checksum import stored_checksum
from shardfs.storage import LocalStorage
from shardfs.storage.base import Entry, Stat, Storage
from shardfs.view import Namespace

#: Chunks along the second and third axes (as benchmarks/scale.py's DANDI layout).
SIDE = 100
ARRAY = "data"
DOCUMENTS = ("zarr.json", f"{ARRAY}/zarr.json")


def value(i: int, j: int, k: int) -> int:
    """The one byte of chunk (i, j, k) (benchmarks/scale.py's `dandi_value`)."""
    return 1 + (i + 3 * j + k) % 251


class GeneratedCopy(Storage):
    """The plain copy of the synthetic source's view, listed and read from nothing."""

    def __init__(self, documents: dict[str, bytes], rows: int) -> None:
        self.documents = documents
        self.rows = rows

    def _list(self, key: str) -> list[Entry]:
        parts = key.split("/") if key else []
        if not parts:
            return [self._file("zarr.json", len(self.documents["zarr.json"])), self._dir(ARRAY)]
        if parts == [ARRAY]:
            return [self._file("zarr.json", len(self.documents[DOCUMENTS[1]])), self._dir("c")]
        depth = len(parts) - 2  # data/c: 0, data/c/<i>: 1, data/c/<i>/<j>: 2
        if depth < 2:
            return [self._dir(str(n)) for n in range(self.rows if depth == 0 else SIDE)]
        return [self._file(str(k), 1) for k in range(SIDE)]

    @staticmethod
    def _dir(name: str) -> Entry:
        return Entry(name, Stat(True, 0, 0, name))

    @staticmethod
    def _file(name: str, size: int) -> Entry:
        return Entry(name, Stat(False, size, 0, name))

    def _read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        data = self.documents.get(key)
        if data is None:
            i, j, k = (int(n) for n in key.split("/")[2:])
            data = bytes([value(i, j, k)])
        return data[offset : offset + length]

    def _stat(self, key: str) -> Stat | None:
        raise NotImplementedError

    def describe(self, key: str) -> str:
        return f"generated:{key}"

    def put(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        raise NotImplementedError

    def append(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        raise NotImplementedError

    def delete(self, key: str, expect: Hashable) -> None:
        raise NotImplementedError

    def makedirs(self, key: str) -> None:
        raise NotImplementedError

    def recover(self) -> list[str]:
        return []

    def pending_recovery(self) -> list[str]:
        return []


def main() -> int:
    source, rows = sys.argv[1], int(sys.argv[2])
    namespace = Namespace(LocalStorage(source))
    documents = {}
    for path in DOCUMENTS:
        with namespace.open(namespace.resolve(path)) as reader:
            documents[path] = reader.read(0, reader.size)
    print(stored_checksum(GeneratedCopy(documents, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
