"""The shard index of `sharding_indexed`: a uint64 array of (offset, nbytes) pairs.

Pure functions, no I/O: callers read the index bytes (their size comes from
`IndexCodec.size`) and hand them here to be verified and decoded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np

from shardfs.primitives.errors import CorruptData, InvalidMetadata

#: Offset and nbytes both equal to this mark an empty inner chunk.
EMPTY = np.uint64(2**64 - 1)


def normalize_codec(codec: Any) -> tuple[str, dict[str, Any]]:
    """A codec entry as (name, configuration); bare strings are allowed by the spec."""
    if isinstance(codec, str):
        return codec, {}
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        config = codec.get("configuration") or {}
        if not isinstance(config, dict):
            raise InvalidMetadata(f"codec {codec['name']!r}: configuration must be an object")
        return codec["name"], config
    raise InvalidMetadata(f"malformed codec entry {codec!r}")


@dataclass(frozen=True)
class IndexCodec:
    """How an index is encoded: byte order plus a number of trailing crc32c checksums.

    The spec allows any fixed-size codec chain; the ones writers use are
    `bytes` followed by zero or more `crc32c`, and nothing else is accepted,
    because guessing at another chain could misread offsets.
    """

    big_endian: bool
    checksums: int

    @classmethod
    def from_codecs(cls, codecs: Sequence[Any]) -> IndexCodec:
        """Parse `index_codecs`."""
        names = [normalize_codec(c) for c in codecs]
        if not names or names[0][0] != "bytes":
            raise InvalidMetadata(f"index_codecs must start with 'bytes', got {codecs!r}")
        endian = names[0][1].get("endian", "little")
        if endian not in ("little", "big"):
            raise InvalidMetadata(f"index bytes codec has unknown endian {endian!r}")
        rest = [n for n, _ in names[1:]]
        if any(n != "crc32c" for n in rest):
            raise InvalidMetadata(f"unsupported index_codecs {codecs!r}")
        return cls(big_endian=endian == "big", checksums=len(rest))

    def to_codecs(self) -> list[dict[str, Any]]:
        """The `index_codecs` JSON for this codec (used by writers and tests)."""
        endian = "big" if self.big_endian else "little"
        return [{"name": "bytes", "configuration": {"endian": endian}}] + [
            {"name": "crc32c"} for _ in range(self.checksums)
        ]

    def size(self, chunks_per_shard: Sequence[int]) -> int:
        """Encoded size in bytes of the index of a shard with `chunks_per_shard` slots."""
        return 16 * math.prod(chunks_per_shard) + 4 * self.checksums

    def decode(self, raw: bytes, chunks_per_shard: Sequence[int]) -> np.ndarray:
        """Verify and decode `raw` into a native uint64 array of shape `chunks_per_shard + (2,)`.

        Raises CorruptData if the size is wrong or a checksum does not match.
        """
        expected = self.size(chunks_per_shard)
        if len(raw) != expected:
            raise CorruptData(f"index is {len(raw)} bytes, expected {expected}")
        view = memoryview(raw)
        for _ in range(self.checksums):
            body, stored = view[:-4], int.from_bytes(view[-4:], "little")
            if crc32c.crc32c(body) != stored:
                raise CorruptData("index checksum (crc32c) does not match")
            view = body
        dtype = ">u8" if self.big_endian else "<u8"
        index = np.frombuffer(view, dtype=dtype).astype(np.uint64)
        return index.reshape((*chunks_per_shard, 2))

    def encode(self, index: np.ndarray) -> bytes:
        """Encode an index array (the inverse of `decode`)."""
        raw = np.ascontiguousarray(index, dtype=">u8" if self.big_endian else "<u8").tobytes()
        for _ in range(self.checksums):
            raw += crc32c.crc32c(raw).to_bytes(4, "little")
        return raw


def check_entries(index: np.ndarray, data_start: int, data_end: int) -> None:
    """Raise CorruptData unless every entry is empty or lies in [data_start, data_end).

    Offsets are absolute positions in the shard. An entry with only one of its
    two values set to the empty marker is corrupt too: it is neither a chunk
    nor an empty slot.
    """
    flat = index.reshape(-1, 2)
    offset, nbytes = flat[:, 0], flat[:, 1]
    empty_off, empty_len = offset == EMPTY, nbytes == EMPTY
    if np.any(empty_off != empty_len):
        raise CorruptData("index has an entry with only one of offset/nbytes marked empty")
    used = ~empty_off
    off, n = offset[used], nbytes[used]
    # Compare without computing off + n, which could wrap around in uint64.
    if np.any(off < np.uint64(data_start)) or np.any(off > np.uint64(data_end)):
        raise CorruptData(
            f"index entry points outside the shard's data (bytes {data_start}..{data_end})"
        )
    if np.any(n > np.uint64(data_end) - off):
        raise CorruptData(
            f"index entry runs past the end of the shard's data (bytes {data_start}..{data_end})"
        )
