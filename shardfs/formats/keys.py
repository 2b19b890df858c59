"""Zarr v3 chunk key encodings: chunk grid coordinates <-> storage keys.

The same encoding names the shards of a sharded array in the source and the
inner chunks in the unsharded view, so one class serves both directions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardfs.primitives.errors import InvalidMetadata


def parse_index(text: str) -> int | None:
    """Parse one key component as a grid index, or None.

    Only the canonical spelling counts ("7", never "07" or "+7"), so that
    every index has exactly one name and a stray file cannot alias a chunk.
    """
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


@dataclass(frozen=True)
class ChunkKeyEncoding:
    """A `chunk_key_encoding` of an array: `default` or `v2`, separator `/` or `.`."""

    name: str
    separator: str

    @classmethod
    def from_metadata(cls, value: Any) -> ChunkKeyEncoding:
        """Parse the `chunk_key_encoding` field (absent means `default` with `/`)."""
        if value is None:
            return cls("default", "/")
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, dict):
            raise InvalidMetadata(f"chunk_key_encoding must be an object, not {value!r}")
        name = value.get("name")
        config = value.get("configuration") or {}
        if name not in ("default", "v2"):
            raise InvalidMetadata(f"unknown chunk_key_encoding {name!r}")
        separator = config.get("separator", "/" if name == "default" else ".")
        if separator not in ("/", "."):
            raise InvalidMetadata(f"unsupported chunk key separator {separator!r}")
        return cls(name, separator)

    @property
    def nested(self) -> bool:
        """Whether keys form directories (separator `/`)."""
        return self.separator == "/"

    def encode(self, coords: Sequence[int]) -> str:
        """The key of the chunk at `coords`, relative to the array."""
        # (`map(str, ...)`: asked on every read of a chunk, by its inode)
        separator = self.separator
        if self.name == "default":
            return "c" + separator + separator.join(map(str, coords)) if coords else "c"
        return separator.join(map(str, coords)) if coords else "0"

    def decode(self, key: str, ndim: int) -> tuple[int, ...] | None:
        """The coordinates named by `key`, or None if it is not a chunk key."""
        parts = key.split(self.separator)
        if self.name == "default":
            if parts[0] != "c":
                return None
            parts = parts[1:]
        elif ndim == 0:
            return () if key == "0" else None
        if len(parts) != ndim:
            return None
        coords = tuple(map(parse_index, parts))
        return None if None in coords else coords  # type: ignore[return-value]

    def dir_depth(self, parts: Sequence[str], ndim: int) -> tuple[int, ...] | None:
        """Interpret directory components below the array as a key prefix.

        Returns the grid coordinates fixed by the directory (possibly none), or
        None if the components are not a directory of the key space. Only
        nested (`/`) encodings have directories; `default` keys start with `c`.
        """
        if not self.nested:
            return None
        if self.name == "default":
            if not parts or parts[0] != "c":
                return None
            parts = parts[1:]
        if len(parts) >= ndim:
            return None
        coords = tuple(parse_index(p) for p in parts)
        return None if None in coords else coords  # type: ignore[return-value]

    def dir_path(self, prefix: Sequence[int]) -> str:
        """The directory (relative to the array) that holds keys starting with `prefix`.

        Only meaningful for nested encodings; the empty string is the array itself.
        """
        parts = [str(i) for i in prefix]
        if self.name == "default":
            parts.insert(0, "c")
        return "/".join(parts)

    def component(self, name: str, depth: int) -> int | None:
        """The grid index named by one directory component `depth` levels below `dir_path(())`."""
        return parse_index(name)

    def owns(self, name: str, ndim: int) -> bool:
        """Whether a top-level entry of the array directory belongs to the key space.

        Entries that do belong are shards in the source and are replaced by
        the virtual chunks; all other entries pass through.
        """
        if self.nested:
            if self.name == "default":
                return name == "c"
            return parse_index(name) is not None
        return self.decode(name, ndim) is not None
