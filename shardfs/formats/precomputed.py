"""Neuroglancer precomputed volumes: sharded scales (`neuroglancer_uint64_sharded_v1`) and
their unsharded form.

Pure: it parses an `info` document, renders it without its `sharding` entries, and
decodes what a sharded scale stores (the fixed shard index, minishard indexes, chunk
data) into what an unsharded scale shows (one file per chunk, named by its voxel box,
holding the chunk's encoded bytes without the sharding's data_encoding). The caller
does all I/O.

Sharded layout, as neuroglancer and tensorstore write it. A chunk's id is the
compressed Morton code of its grid position. The id, shifted right by
`preshift_bits`, is hashed (identity or murmurhash3_x86_128); the low
`minishard_bits` of the hash pick the minishard, the next `shard_bits` the shard
file `<hex>.shard`. A shard starts with a fixed index of 2^minishard_bits
(start, end) uint64le pairs locating each minishard index, relative to the end
of that fixed index; a minishard index (raw or gzip) is a [3, n] uint64le array
of delta-coded chunk ids, delta-coded offsets (each from the end of the
previous chunk) and sizes.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shardfs.formats import jsondoc
from shardfs.primitives.errors import CorruptData, InvalidMetadata

INFO = "info"
VOLUME_TYPE = "neuroglancer_multiscale_volume"
SHARDED_TYPE = "neuroglancer_uint64_sharded_v1"
HASHES = ("identity", "murmurhash3_x86_128")
ENCODINGS = ("raw", "gzip")
#: Data types of precomputed volumes, as numpy names.
DATA_TYPES = frozenset(
    ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32"]
)
#: Bytes of one minishard index entry (chunk id, offset and size, uint64 each).
ENTRY = 24
#: Bytes of one fixed shard index entry (start and end, uint64 each).
FIXED_ENTRY = 16
#: A gzip member: a 10-byte header, at least 2 bytes of deflate data, an 8-byte trailer.
GZIP_MIN = 20

Position = tuple[int, int, int]


# -- ids: compressed Morton code and hash ---------------------------------------------


def morton_bits(grid: Position) -> Position:
    """Bits each axis contributes to a chunk id: as many as its grid extent needs."""
    return tuple((n - 1).bit_length() for n in grid)  # type: ignore[return-value]


def _schedule(bits: Position) -> list[tuple[int, int]]:
    """(axis, bit of the axis) for each bit of the code, lowest first: bit level by bit
    level, x, y, z in turn, axes whose bits are used up skipped."""
    return [(axis, level) for level in range(max(bits)) for axis in range(3) if level < bits[axis]]


def compressed_morton_code(position: Position, bits: Position) -> int:
    """The chunk id of grid `position`."""
    code = 0
    for out, (axis, level) in enumerate(_schedule(bits)):
        code |= ((position[axis] >> level) & 1) << out
    return code


def morton_positions(codes: np.ndarray, bits: Position) -> np.ndarray:
    """The grid positions (n, 3) of chunk ids (uint64); the inverse of
    `compressed_morton_code` for codes below 2^sum(bits)."""
    positions = np.zeros((len(codes), 3), dtype=np.uint64)
    for out, (axis, level) in enumerate(_schedule(bits)):
        positions[:, axis] |= ((codes >> np.uint64(out)) & np.uint64(1)) << np.uint64(level)
    return positions.astype(np.int64)


def _rotl(x: npt.NDArray[np.uint32], r: int) -> npt.NDArray[np.uint32]:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix32(h: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def murmurhash3_x86_128(keys: np.ndarray) -> npt.NDArray[np.uint64]:
    """The low 64 bits of MurmurHash3_x86_128, seed 0, of each uint64 as 8 bytes little endian.

    Vectorised with numpy's wrapping uint32 arithmetic, so that listing a scale can
    check every chunk id of a shard at once. An 8-byte key is all tail: words k1
    (low) and k2 (high); the other two lanes only take part in finalisation.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    k1 = (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    k2 = (keys >> np.uint64(32)).astype(np.uint32)
    c1, c2, c3 = np.uint32(0x239B961B), np.uint32(0xAB0E9789), np.uint32(0x38B34AE5)
    h2 = _rotl(k2 * c2, 16) * c3
    h1 = _rotl(k1 * c1, 15) * c2
    length = np.uint32(8)
    h1, h2 = h1 ^ length, h2 ^ length
    h3 = h4 = np.zeros_like(h1) ^ length
    h1 = h1 + h2 + h3 + h4
    h2, h3, h4 = h2 + h1, h3 + h1, h4 + h1
    h1, h2, h3, h4 = _fmix32(h1), _fmix32(h2), _fmix32(h3), _fmix32(h4)
    h1 = h1 + h2 + h3 + h4
    h2 = h2 + h1
    return h1.astype(np.uint64) | (h2.astype(np.uint64) << np.uint64(32))


# -- the sharding spec ----------------------------------------------------------------


@dataclass(frozen=True)
class Minishard:
    """A decoded minishard index: chunk ids (ascending), their grid positions (n, 3)
    and their byte ranges in the shard file."""

    ids: np.ndarray  # uint64
    positions: np.ndarray  # int64
    offsets: np.ndarray  # int64
    sizes: np.ndarray  # int64

    @property
    def cost(self) -> int:
        return 48 * len(self.ids) + 256

    def find(self, chunk_id: int) -> tuple[int, int] | None:
        """(offset, size) of a chunk, or None if this minishard does not hold it."""
        i = int(np.searchsorted(self.ids, np.uint64(chunk_id)))
        if i == len(self.ids) or int(self.ids[i]) != chunk_id:
            return None
        return int(self.offsets[i]), int(self.sizes[i])


def _gunzip(data: bytes, limit: int) -> bytes:
    """One whole gzip member, at most `limit` bytes decompressed; CorruptData otherwise."""
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = stream.decompress(data, limit + 1)
    except zlib.error as e:
        raise CorruptData(f"bad gzip data: {e}") from None
    if len(out) > limit:
        raise CorruptData(f"gzip data decompresses to more than {limit} bytes")
    if not stream.eof or stream.unused_data:
        raise CorruptData("gzip data is truncated or has trailing bytes")
    return out


def _bound(limit: int) -> str:
    return f"the {limit} bytes a minishard index of this scale may decode to"


@dataclass(frozen=True)
class Sharding:
    """A scale's `sharding` entry (`neuroglancer_uint64_sharded_v1`)."""

    preshift_bits: int
    hash: str
    minishard_bits: int
    shard_bits: int
    minishard_index_gzip: bool
    data_gzip: bool

    @classmethod
    def from_json(cls, doc: Any) -> Sharding:
        """The spec; InvalidMetadata for anything it does not define (or shardfs cannot use)."""
        if not isinstance(doc, dict):
            raise InvalidMetadata("sharding must be an object")
        if doc.get("@type") != SHARDED_TYPE:
            raise InvalidMetadata(f"unknown sharding @type {doc.get('@type')!r}")
        known = {"@type", "preshift_bits", "hash", "minishard_bits", "shard_bits"}
        known |= {"minishard_index_encoding", "data_encoding"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise InvalidMetadata(f"unknown sharding fields {unknown}")

        def bits(name: str, top: int) -> int:
            value = doc.get(name)
            if type(value) is not int or not 0 <= value <= top:
                raise InvalidMetadata(f"sharding {name} must be an integer in [0, {top}]")
            return value

        def encoding(name: str) -> bool:
            value: object = doc.get(name, "raw")
            if value not in ENCODINGS:
                raise InvalidMetadata(f"unknown sharding {name} {value!r}")
            return value == "gzip"

        if doc.get("hash") not in HASHES:
            raise InvalidMetadata(f"unknown sharding hash {doc.get('hash')!r}")
        spec = cls(
            bits("preshift_bits", 64),
            doc["hash"],
            bits("minishard_bits", 32),
            bits("shard_bits", 64),
            encoding("minishard_index_encoding"),
            encoding("data_encoding"),
        )
        if spec.minishard_bits + spec.shard_bits > 64:
            raise InvalidMetadata("sharding minishard_bits + shard_bits exceed 64")
        return spec

    @property
    def index_size(self) -> int:
        """Bytes of the fixed shard index at the start of every shard."""
        return FIXED_ENTRY << self.minishard_bits

    def hashes(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.uint64)
        # numpy, like C, leaves a shift by the whole width undefined.
        if self.preshift_bits < 64:
            shifted = ids >> np.uint64(self.preshift_bits)
        else:
            shifted = np.zeros_like(ids)
        return shifted if self.hash == "identity" else murmurhash3_x86_128(shifted)

    def shard_and_minishard(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shard number and the minishard of each chunk id."""
        h = self.hashes(ids)
        minishard = h & np.uint64((1 << self.minishard_bits) - 1)
        shard = (h >> np.uint64(self.minishard_bits)) & np.uint64((1 << self.shard_bits) - 1)
        return shard, minishard

    def locate(self, chunk_id: int) -> tuple[int, int]:
        shard, minishard = self.shard_and_minishard(np.array([chunk_id], dtype=np.uint64))
        return int(shard[0]), int(minishard[0])

    def shard_name(self, shard: int) -> str:
        return f"{shard:0{-(-self.shard_bits // 4)}x}.shard"

    def parse_shard_name(self, name: str) -> int | None:
        """The shard number of a canonical shard file name, else None."""
        match = re.fullmatch(r"([0-9a-f]+)\.shard", name)
        if match is None:
            return None
        shard = int(match.group(1), 16)
        if shard >> self.shard_bits or self.shard_name(shard) != name:
            return None
        return shard

    def check_shard_size(self, shard_size: int) -> None:
        """CorruptData if a shard of `shard_size` bytes cannot hold its fixed index (checked
        before any of it is read: a reader of single entries would not see it short)."""
        if shard_size < self.index_size:
            raise CorruptData(
                f"a shard of {shard_size} bytes cannot hold its {self.index_size}-byte index"
            )

    def decode_shard_index(
        self, raw: bytes, shard_size: int, first: int = 0, count: int | None = None
    ) -> np.ndarray:
        """`count` entries (default: the rest) of the fixed index of a shard of
        `shard_size` bytes from minishard `first` (default: all of them), as (count, 2)
        absolute [start, end) of each minishard index. CorruptData if any lies outside
        the shard."""
        self.check_shard_size(shard_size)
        if count is None:
            count = (1 << self.minishard_bits) - first
        if len(raw) != FIXED_ENTRY * count:
            raise CorruptData(f"shard index is {len(raw)} bytes, not {FIXED_ENTRY * count}")
        index = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        limit = np.uint64(shard_size - self.index_size)
        bad = (index[:, 0] > index[:, 1]) | (index[:, 1] > limit)
        if bad.any():
            i = int(np.argmax(bad))
            raise CorruptData(
                f"minishard {first + i} index at [{index[i, 0]}, {index[i, 1]}) lies outside "
                f"the {int(limit)} bytes after the shard index"
            )
        return index.astype(np.int64) + self.index_size

    def stored_limit(self, limit: int) -> int:
        """The most bytes a minishard index that decodes to at most `limit` bytes may be
        stored in: `limit` if raw; if gzip, with room for deflate's worst case (stored
        blocks: 5 bytes a 64 KiB block) and a gzip header."""
        return limit + (limit >> 10) + 4096 if self.minishard_index_gzip else limit

    def check_minishard_stored(self, minishard: int, stored: int, limit: int) -> None:
        """CorruptData if a minishard index stored in `stored` bytes would decode to more
        than `limit` bytes: checked before it is read."""
        if stored > self.stored_limit(limit):
            raise CorruptData(
                f"minishard {minishard} index is {stored} bytes stored, beyond {_bound(limit)}"
            )

    def decode_minishard(
        self, raw: bytes, shard: int, minishard: int, shard_size: int, limit: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A minishard index of shard `shard` as (ids, offsets, sizes), offsets absolute,
        verified: it decodes to at most `limit` bytes (a gzip index is inflated no
        further), every chunk lies in the shard's data, ids ascend and belong to this
        shard and minishard."""
        where = f"minishard {minishard} index"
        self.check_minishard_stored(minishard, len(raw), limit)
        if self.minishard_index_gzip:
            try:
                raw = _gunzip(raw, limit)
            except CorruptData as e:
                raise CorruptData(f"{where}: {e}") from None
        if len(raw) > limit:
            raise CorruptData(f"{where} is {len(raw)} bytes, more than {_bound(limit)}")
        if len(raw) % ENTRY:
            raise CorruptData(f"{where} is {len(raw)} bytes, not {ENTRY}n")
        deltas, gaps, sizes = np.frombuffer(raw, dtype="<u8").reshape(3, -1)
        ids = np.cumsum(deltas, dtype=np.uint64)
        if (ids[1:] <= ids[:-1]).any():
            raise CorruptData(f"{where}: chunk ids do not ascend")
        room = shard_size - self.index_size
        if room < 0:
            raise CorruptData(f"a shard of {shard_size} bytes cannot hold its index")
        if (gaps > np.uint64(room)).any() or (sizes > np.uint64(room)).any():
            raise CorruptData(f"{where}: a chunk lies outside the shard")
        # Each sum below adds at most 2 * room < 2^63 per entry, so a wrap shows as a descent.
        steps = gaps.copy()
        steps[1:] += sizes[:-1]
        starts = np.cumsum(steps, dtype=np.uint64)
        ends = starts + sizes
        if (starts[1:] < starts[:-1]).any() or (ends > np.uint64(room)).any():
            raise CorruptData(f"{where}: a chunk lies outside the shard")
        shards, minishards = self.shard_and_minishard(ids)
        if (shards != np.uint64(shard)).any() or (minishards != np.uint64(minishard)).any():
            raise CorruptData(f"{where}: a chunk id does not hash to this shard and minishard")
        return ids, starts.astype(np.int64) + self.index_size, sizes.astype(np.int64)

    def decode_data(self, stored: bytes, size: int) -> bytes:
        """A chunk's encoded bytes without the data_encoding, exactly `size` of them."""
        data = _gunzip(stored, size) if self.data_gzip else stored
        if len(data) != size:
            raise CorruptData(f"chunk holds {len(data)} bytes, its file size says {size}")
        return data


def gzip_size(trailer: bytes) -> int:
    """The uncompressed size (mod 2^32) a gzip member records in its last 4 bytes."""
    return int.from_bytes(trailer[-4:], "little")


# -- the info document ----------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """A sharded scale the view unshards. `key` is its directory, normalised."""

    key: str
    size: Position
    voxel_offset: Position
    chunk_size: Position
    encoding: str
    num_channels: int
    itemsize: int
    sharding: Sharding
    grid: Position = field(init=False)
    bits: Position = field(init=False)

    def __post_init__(self) -> None:
        grid = tuple(-(-n // c) for n, c in zip(self.size, self.chunk_size, strict=True))
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "bits", morton_bits(grid))  # type: ignore[arg-type]

    @property
    def chunk_count(self) -> int:
        return math.prod(self.grid)

    @property
    def gzip_sizes(self) -> bool:
        """Whether a chunk's file size is only known from its gzip trailer."""
        return self.sharding.data_gzip and self.encoding != "raw"

    def box(self, position: Position) -> tuple[Position, Position]:
        """The voxel box [begin, end) of a chunk, clipped at the volume's edge."""
        begin = tuple(
            o + g * c for o, g, c in zip(self.voxel_offset, position, self.chunk_size, strict=True)
        )
        end = tuple(
            min(b + c, o + n)
            for b, c, o, n in zip(begin, self.chunk_size, self.voxel_offset, self.size, strict=True)
        )
        return begin, end  # type: ignore[return-value]

    def chunk_name(self, position: Position) -> str:
        begin, end = self.box(position)
        return "_".join(f"{b}-{e}" for b, e in zip(begin, end, strict=True))

    def parse_chunk_name(self, name: str) -> Position | None:
        """The grid position of a canonical chunk file name of this scale, else None."""
        parts = name.split("_")
        if len(parts) != 3:
            return None
        position = []
        for part, o, c, g in zip(parts, self.voxel_offset, self.chunk_size, self.grid, strict=True):
            match = re.fullmatch(r"(-?[0-9]+)-(-?[0-9]+)", part)
            if match is None:
                return None
            i, rest = divmod(int(match.group(1)) - o, c)
            if rest or not 0 <= i < g:
                return None
            position.append(i)
        found: Position = tuple(position)  # type: ignore[assignment]
        return found if self.chunk_name(found) == name else None

    def chunk_id(self, position: Position) -> int:
        return compressed_morton_code(position, self.bits)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """The grid positions (n, 3) of chunk ids; CorruptData for an id outside the grid."""
        if len(ids) and int(ids.max()) >> sum(self.bits):
            raise CorruptData(f"chunk id {int(ids.max())} is outside the grid {self.grid}")
        positions = morton_positions(ids, self.bits)
        outside = (positions >= np.asarray(self.grid)).any(axis=1)
        if outside.any():
            raise CorruptData(f"chunk id {int(ids[np.argmax(outside)])} is outside the grid")
        return positions

    @property
    def minishard_capacity(self) -> int:
        """The most chunks one minishard of this scale can hold: the scale's chunks, and
        under the identity hash no more than the ids of the grid's id bits whose
        shard and minishard bits (`preshift_bits` up) are those of one minishard. (A
        murmurhash may send every chunk to one minishard.)"""
        count = self.chunk_count
        if self.sharding.hash == "identity":
            bits, spec = sum(self.bits), self.sharding
            low = min(bits, spec.preshift_bits)
            fixed = min(bits, spec.preshift_bits + spec.minishard_bits + spec.shard_bits) - low
            count = min(count, 1 << (bits - fixed))
        return count

    def minishard_limit(self, cap: int) -> int:
        """The most bytes a minishard index of this scale may decode to: 24 bytes a chunk
        it can hold (`minishard_capacity`), and no more than `cap` (the reader's bound)."""
        return min(ENTRY * self.minishard_capacity, cap - cap % ENTRY)

    def decode_minishard(
        self, raw: bytes, shard: int, minishard: int, shard_size: int, cap: int
    ) -> Minishard:
        """A verified minishard index (see `Sharding.decode_minishard`, bounded by
        `minishard_limit(cap)`) whose chunks all lie in this scale's grid."""
        ids, offsets, sizes = self.sharding.decode_minishard(
            raw, shard, minishard, shard_size, self.minishard_limit(cap)
        )
        return Minishard(ids, self.positions(ids), offsets, sizes)

    def raw_size(self, position: Position) -> int:
        """Bytes of a `raw`-encoded chunk: its clipped voxels, channels, items."""
        begin, end = self.box(position)
        voxels = math.prod(e - b for b, e in zip(begin, end, strict=True))
        return voxels * self.num_channels * self.itemsize

    def file_size(self, position: Position, stored: int, trailer: bytes | None = None) -> int:
        """The size of a chunk's file, given its stored size and, if `gzip_sizes`, the
        last 4 bytes of its stored form."""
        if self.encoding == "raw":
            return self.raw_size(position)
        if self.sharding.data_gzip:
            assert trailer is not None
            return gzip_size(trailer)
        return stored


@dataclass(frozen=True)
class Volume:
    """A parsed `info`: the rewritten document, the sharded scales the view unshards (by
    key), and why other sharded scales are shown unchanged (one warning each)."""

    info: bytes
    scales: dict[str, Scale]
    unchanged: tuple[str, ...] = ()

    @property
    def cost(self) -> int:
        return 2 * len(self.info) + 512 * (len(self.scales) + 1)


def _claims_volume(doc: Any) -> bool:
    """`@type` says it is a multiscale volume, or (older writers) it is absent and there
    are `scales`."""
    if not isinstance(doc, dict):
        return False
    return doc.get("@type", VOLUME_TYPE if "scales" in doc else None) == VOLUME_TYPE


def is_volume(raw: bytes) -> bool:
    """Whether an `info` file claims to describe a multiscale volume (valid or not)."""
    try:
        return _claims_volume(jsondoc.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False


def _vector(scale: dict[str, Any], name: str, minimum: int | None, default: Any = None) -> Position:
    value = scale.get(name, default)
    if (
        not isinstance(value, list)
        or len(value) != 3
        or any(type(v) is not int or (minimum is not None and v < minimum) for v in value)
    ):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise InvalidMetadata(f"{name} must be 3 integers{bound}")
    return tuple(value)


def normalize_key(key: Any) -> str:
    """A scale's directory relative to the volume; InvalidMetadata if it leaves it."""
    if not isinstance(key, str):
        raise InvalidMetadata("key must be a string")
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise InvalidMetadata(f"key {key!r} is not a directory inside the volume")
    return "/".join(parts)


def _directory(key: Any) -> str | None:
    try:
        return normalize_key(key)
    except InvalidMetadata:
        return None


def _scale(doc: dict[str, Any], num_channels: int, itemsize: int) -> Scale:
    key = normalize_key(doc.get("key"))
    chunk_sizes = doc.get("chunk_sizes")
    if not isinstance(chunk_sizes, list) or len(chunk_sizes) != 1:
        raise InvalidMetadata("a sharded scale must have exactly one chunk size")
    if not isinstance(doc.get("encoding"), str):
        raise InvalidMetadata("encoding must be a string")
    sharding = Sharding.from_json(doc["sharding"])
    scale = Scale(
        key,
        _vector(doc, "size", 1),
        _vector(doc, "voxel_offset", None, [0, 0, 0]),
        _vector({"chunk_size": chunk_sizes[0]}, "chunk_size", 1),
        doc["encoding"],
        num_channels,
        itemsize,
        sharding,
    )
    if sum(scale.bits) > 64:
        raise InvalidMetadata(f"a grid of {scale.grid} chunks needs chunk ids over 64 bits")
    return scale


def parse_info(raw: bytes) -> Volume:
    """The volume an `info` file describes; InvalidMetadata if it is not a valid
    multiscale volume. A sharded scale whose sharding shardfs cannot read is kept
    sharded (shown unchanged), with the reason in `unchanged`."""
    try:
        doc = jsondoc.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidMetadata(f"info is not valid JSON: {e}") from None
    if not _claims_volume(doc):
        raise InvalidMetadata(f"info is not a {VOLUME_TYPE}")
    data_type = doc.get("data_type")
    if data_type not in DATA_TYPES:
        raise InvalidMetadata(f"unknown data_type {data_type!r}")
    num_channels = doc.get("num_channels")
    if type(num_channels) is not int or num_channels < 1:
        raise InvalidMetadata("num_channels must be a positive integer")
    scales = doc.get("scales")
    if not isinstance(scales, list) or not scales or not all(isinstance(s, dict) for s in scales):
        raise InvalidMetadata("scales must be a non-empty list of objects")
    itemsize = np.dtype(data_type).itemsize
    directories = Counter(_directory(s.get("key")) for s in scales)
    found: dict[str, Scale] = {}
    unchanged = []
    for i, scale in enumerate(scales):
        if scale.get("sharding") is None:
            continue  # unsharded: passes through
        try:
            parsed = _scale(scale, num_channels, itemsize)
            if directories[parsed.key] > 1:
                raise InvalidMetadata("another scale has the same directory")
        except InvalidMetadata as e:
            unchanged.append(f"scale {i} (key {scale.get('key')!r}) shown sharded: {e}")
            continue
        found[parsed.key] = parsed
        del scale["sharding"]
    info = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()
    return Volume(info, found, tuple(unchanged))
