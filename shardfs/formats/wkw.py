"""webknossos-wrap (WKW) datasets, shown as unsharded Zarr arrays.

Pure: it parses headers, jump tables and `datasource-properties.json`, places
blocks in files, decodes LZ4 blocks and renders the Zarr documents of the
view. The caller does all I/O.

The layout, as the `wkw` library writes it (checked byte by byte). Every
file of a magnification (`header.wkw` at its root, and each data file
`z{Z}/y{Y}/x{X}.wkw`) starts with a 16-byte header: the magic `WKW`, a
version (1), a byte holding log2 of the block length (low 4 bits) and of the
file length in blocks (high 4 bits), the block type (1 raw, 2 LZ4, 3
LZ4HC), a voxel type code, the bytes of a voxel (all channels) and a u64
data offset (0 in `header.wkw`). A data file holds (file length)^3 blocks
of (block length)^3 voxels in Morton order (x the lowest bit). Raw blocks
are all the same size, from the data offset on. Compressed files have a jump
table after the header: one u64 absolute end offset per block, the first
block starting at the data offset; each block is a bare LZ4 block (no frame,
no size prefix). A block's place is known from two entries of the table (its
end and the one before), so the table is read in parts (`PART_BLOCKS`): a
file of 256^3 blocks has a table of 128 MiB, and one block of it must not
cost reading that. In a block x varies fastest, then y, then z, and a voxel's
channels are stored together: C order of (z, y, x, c).

The view shows a magnification as an array of axes (c, x, y, z) whose chunks
are the blocks, with the origin at voxel 0 (see docs/semantics.md, "WKW").
A block's bytes are exactly such a chunk in F order, so raw blocks are
served as stored and LZ4 blocks decoded, with no compressor.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from numcodecs import lz4

from shardfs.formats import jsondoc
from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.zarr_v2 import consolidated
from shardfs.formats.zarr_v3 import render as render_v3
from shardfs.primitives.errors import CorruptData, InvalidMetadata

HEADER = "header.wkw"
PROPERTIES = "datasource-properties.json"
MAGIC = b"WKW"
HEADER_SIZE = 16
RAW, LZ4, LZ4HC = 1, 2, 3
BLOCK_TYPES = {RAW: "raw", LZ4: "lz4", LZ4HC: "lz4hc"}
#: Voxel type codes, as the `wkw` library numbers them (from 1).
VOXEL_TYPES = (
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
)
#: The biggest block shardfs serves: one chunk file is one block, held in memory.
MAX_BLOCK = 1 << 30
#: The most blocks a file may have (files of 256^3; webknossos writes 32^3): a listing
#: makes a name per block.
MAX_FILE_BLOCKS = 1 << 24
#: The blocks of a part of a file's table, read, checked and kept together: the whole
#: table of the files webknossos writes (32^3 blocks, 256 KiB of table), 1/512 of the
#: biggest.
PART_BLOCKS = 1 << 15
#: The view's axes: what webknossos' own Zarr layers and its Zarr streaming use.
AXES = ("c", "x", "y", "z")
#: A chunk's bytes (C order of (z, y, x, c)) as the v3 transpose codec says it.
TRANSPOSE = [3, 2, 1, 0]
V3_NAMES = ChunkKeyEncoding("default", "/")
V2_NAMES = ChunkKeyEncoding("v2", "/")
_HEADER = struct.Struct("<3sBBBBBQ")

Vector = tuple[int, int, int]


@dataclass(frozen=True)
class Header:
    """A WKW header: of a magnification (`header.wkw`) or of one of its data files."""

    version: int
    block_len: int
    file_len: int
    block_type: int
    dtype: np.dtype
    channels: int
    data_offset: int

    @classmethod
    def parse(cls, raw: bytes) -> Header:
        """The header at the start of `raw`; CorruptData if it is not one shardfs reads."""
        if len(raw) < HEADER_SIZE:
            raise CorruptData(f"{len(raw)} bytes, too short for a WKW header")
        magic, version, lengths, block_type, voxel_type, voxel_size, data_offset = _HEADER.unpack(
            raw[:HEADER_SIZE]
        )
        if magic != MAGIC:
            raise CorruptData(f"no WKW magic (found {magic!r})")
        if version != 1:
            raise CorruptData(f"unknown WKW version {version}")
        if block_type not in BLOCK_TYPES:
            raise CorruptData(f"unknown block type {block_type}")
        if not 1 <= voxel_type <= len(VOXEL_TYPES):
            raise CorruptData(f"unknown voxel type {voxel_type}")
        dtype = np.dtype(VOXEL_TYPES[voxel_type - 1]).newbyteorder("<")
        if voxel_size == 0 or voxel_size % dtype.itemsize:
            raise CorruptData(f"{voxel_size} bytes per voxel do not fit {dtype.name} values")
        header = cls(
            version,
            1 << (lengths & 0xF),
            1 << (lengths >> 4),
            block_type,
            dtype,
            voxel_size // dtype.itemsize,
            data_offset,
        )
        if header.block_bytes > MAX_BLOCK:
            raise CorruptData(f"blocks of {header.block_bytes} bytes are too big to serve")
        if header.blocks > MAX_FILE_BLOCKS:
            raise CorruptData(f"files of {header.file_len}^3 blocks are too big to serve")
        return header

    @property
    def compressed(self) -> bool:
        return self.block_type != RAW

    @property
    def voxel_size(self) -> int:
        return self.channels * self.dtype.itemsize

    @property
    def block_bytes(self) -> int:
        """The bytes of a decoded block: a chunk file of the view."""
        return self.block_len**3 * self.voxel_size

    @property
    def stored_limit(self) -> int:
        """The most bytes a compressed block may take: LZ4's bound for a block's bytes
        (`LZ4_COMPRESSBOUND`, what the incompressible block takes as literals; `wkw` wrote
        32,898 bytes for a random block of 32,768), so that a corrupt jump table cannot
        make a reader fetch more than a block's worth."""
        return self.block_bytes + self.block_bytes // 255 + 16

    @property
    def blocks(self) -> int:
        """Blocks in a data file."""
        return self.file_len**3

    @property
    def file_voxels(self) -> int:
        """The edge of a data file in voxels."""
        return self.block_len * self.file_len

    @property
    def part_blocks(self) -> int:
        """The blocks of a part of a data file's table (see `PART_BLOCKS`)."""
        return min(self.blocks, PART_BLOCKS)

    def table_reads(self, part: int) -> list[tuple[int, int]]:
        """The ranges (offset, length) of a data file that `extents` of part `part` of its
        table needs: its first bytes (the header, and the first part's jump table) for the
        first part and for every part of a raw file; the header and the end offsets of the
        part's blocks and of the block before them for any other: 8 bytes per block."""
        n = self.part_blocks
        if not self.compressed:
            return [(0, HEADER_SIZE)]
        if part == 0:
            return [(0, HEADER_SIZE + 8 * n)]
        start = HEADER_SIZE + 8 * (part * n - 1)
        return [(0, HEADER_SIZE), (start, 8 * (n + 1))]

    def same_layout(self, other: Header) -> bool:
        """Whether a data file's header agrees with its magnification's (bar the offset)."""
        return (
            self.version,
            self.block_len,
            self.file_len,
            self.block_type,
            self.dtype,
            self.channels,
        ) == (
            other.version,
            other.block_len,
            other.file_len,
            other.block_type,
            other.dtype,
            other.channels,
        )

    def extents(self, pieces: list[bytes], file_size: int, part: int = 0) -> np.ndarray:
        """(offset, stored size) of the blocks of part `part` of the table of a data file of
        `file_size` bytes (blocks `part * part_blocks` on, by index in the file), from
        the ranges `table_reads(part)` names; CorruptData if they are not a header like
        this one, or place a block outside the file. What does not depend on the part
        (the header, where the data starts, whether the file holds its table or its raw
        blocks) is checked for every part: a part never costs more than its own entries."""
        found = Header.parse(pieces[0])
        if not found.same_layout(self):
            raise CorruptData(
                f"its header ({found.describe()}) disagrees with the magnification's "
                f"({self.describe()})"
            )
        start, n = found.data_offset, self.part_blocks
        first = part * n
        if not self.compressed:
            end = start + self.blocks * self.block_bytes
            if start < HEADER_SIZE or end > file_size:
                raise CorruptData(f"{file_size} bytes cannot hold its blocks up to byte {end}")
            offsets = start + self.block_bytes * np.arange(first, first + n, dtype=np.int64)
            return np.stack([offsets, np.full(n, self.block_bytes, np.int64)], axis=1)
        table_end = HEADER_SIZE + 8 * self.blocks
        if file_size < table_end:
            raise CorruptData(f"{file_size} bytes cannot hold its jump table")
        if start < table_end:
            raise CorruptData(f"its data offset {start} lies inside its jump table")
        wanted = [length for _, length in self.table_reads(part)]
        if [len(p) for p in pieces] != wanted:
            raise CorruptData(f"{file_size} bytes cannot hold its jump table")
        if part == 0:
            before, ends = start, np.frombuffer(pieces[0], "<u8", n, HEADER_SIZE)
        else:
            before, ends = (
                int.from_bytes(pieces[1][:8], "little"),
                np.frombuffer(pieces[1], "<u8", n, 8),
            )
            if before <= start or before > file_size:
                raise CorruptData(f"its jump table does not increase at block {first - 1}")
        if int(ends.max()) > file_size:
            raise CorruptData(f"its jump table points to byte {int(ends.max())}, past its end")
        ends = ends.astype(np.int64)
        starts = np.concatenate([[before], ends[:-1]])
        if (ends <= starts).any():
            i = first + int(np.argmax(ends <= starts))
            raise CorruptData(f"its jump table does not increase at block {i}")
        sizes = ends - starts
        if (sizes > self.stored_limit).any():
            i = int(np.argmax(sizes > self.stored_limit))
            raise CorruptData(
                f"its block {first + i} is {int(sizes[i])} bytes, more than LZ4 makes"
            )
        return np.stack([starts, sizes], axis=1)

    def decode(self, stored: bytes) -> bytes:
        """A block's bytes as stored, decoded: exactly `block_bytes` of them. What an LZ4
        block decodes into is allocated at that size and never grows: a block that would
        decode to more fails (as one that decodes to fewer), so a decode takes its block
        and a copy of its stored bytes, at most `stored_limit`."""
        if not self.compressed:
            data = stored
        else:
            try:
                # numcodecs' LZ4 reads the decoded size from a 4-byte prefix WKW does not store.
                data = lz4.decompress(struct.pack("<i", self.block_bytes) + stored)
            except (RuntimeError, ValueError) as e:
                raise CorruptData(f"an LZ4 block does not decode: {e}") from None
        if len(data) != self.block_bytes:
            raise CorruptData(f"a block holds {len(data)} bytes, not {self.block_bytes}")
        return data

    def describe(self) -> str:
        return (
            f"{BLOCK_TYPES[self.block_type]}, {self.dtype.name} x {self.channels}, blocks of "
            f"{self.block_len}^3, files of {self.file_len}^3 blocks"
        )


def morton_index(position: Vector, bits: int) -> int:
    """The index in its file of the block at `position` in the file (x the lowest bit)."""
    index = 0
    for level in range(bits):
        for axis in range(3):
            index |= ((position[axis] >> level) & 1) << (3 * level + axis)
    return index


def file_key(position: Vector) -> str:
    """A data file's key in its magnification, by its position in the file grid."""
    x, y, z = position
    return f"z{z}/y{y}/x{x}.wkw"


def parse_file_part(prefix: str, name: str, suffix: str = "") -> int | None:
    """The index a component of a data file's key names (`z12`, `x3.wkw`), or None."""
    match = re.fullmatch(rf"{prefix}(0|[1-9][0-9]*){re.escape(suffix)}", name)
    return int(match.group(1)) if match else None


# -- magnifications and their documents ------------------------------------------------


@dataclass(frozen=True)
class Mag:
    """A magnification shown as an array: directory `key` (relative to the source), its
    header, its voxel `shape` (x, y, z), and, where properties name them, its factors, its
    layer's bounding box corner (for its attributes) and its layer's name."""

    key: str
    header: Header
    shape: Vector
    factors: Vector | None = None
    top_left: Vector | None = None
    layer: str | None = None

    @property
    def attributes(self) -> dict[str, Any]:
        """`{"webknossos": {"mag", "topLeft"}}`: the corner divided by the factors, rounded
        down; nothing for a bare magnification."""
        if self.factors is None:
            return {}
        info: dict[str, Any] = {"mag": list(self.factors)}
        if self.top_left is not None:
            info["topLeft"] = [t // m for t, m in zip(self.top_left, self.factors, strict=True)]
        return {"webknossos": info}

    @property
    def chunk_shape(self) -> list[int]:
        return [self.header.channels] + [self.header.block_len] * 3

    @property
    def grid(self) -> Vector:
        """The chunk grid (x, y, z): blocks, from voxel 0."""
        b = self.header.block_len
        return tuple(-(-n // b) for n in self.shape)  # type: ignore[return-value]

    @property
    def array_shape(self) -> list[int]:
        return [self.header.channels, *self.shape]

    def chunk_coords(self, coords: tuple[int, ...]) -> Vector | None:
        """The block (x, y, z) that chunk `coords` (c, x, y, z) is, or None outside the grid."""
        if coords[0] != 0 or any(
            not 0 <= i < n for i, n in zip(coords[1:], self.grid, strict=True)
        ):
            return None
        return coords[1:]  # type: ignore[return-value]

    def locate(self, block: Vector) -> tuple[Vector, int]:
        """The file (its position in the file grid) holding a block, and the block's index."""
        f = self.header.file_len
        index = morton_index(tuple(i % f for i in block), f.bit_length() - 1)  # type: ignore[arg-type]
        return tuple(i // f for i in block), index  # type: ignore[return-value]

    def blocks_of_file(self, file: Vector) -> tuple[range, range, range]:
        """The blocks (x, y, z ranges) of a data file that lie in the grid."""
        f = self.header.file_len
        return tuple(  # type: ignore[return-value]
            range(p * f, min((p + 1) * f, n)) for p, n in zip(file, self.grid, strict=True)
        )

    def zarr_json(self) -> bytes:
        h = self.header
        bytes_codec: dict[str, Any] = {"name": "bytes"}
        if h.dtype.itemsize > 1:
            bytes_codec["configuration"] = {"endian": "little"}
        return render_v3(
            {
                "zarr_format": 3,
                "node_type": "array",
                "shape": self.array_shape,
                "data_type": h.dtype.name,
                "chunk_grid": {
                    "name": "regular",
                    "configuration": {"chunk_shape": self.chunk_shape},
                },
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": 0,
                "codecs": [
                    {"name": "transpose", "configuration": {"order": TRANSPOSE}},
                    bytes_codec,
                ],
                "attributes": self.attributes,
                "dimension_names": list(AXES),
            }
        )

    def zarray(self) -> dict[str, Any]:
        h = self.header
        return {
            "zarr_format": 2,
            "shape": self.array_shape,
            "chunks": self.chunk_shape,
            "dtype": h.dtype.str,
            "compressor": None,
            "fill_value": 0,
            "order": "F",
            "filters": None,
            "dimension_separator": "/",
        }

    def zattrs(self) -> dict[str, Any]:
        """`.zattrs`: the attributes, and the axes as xarray reads them."""
        return {**self.attributes, "_ARRAY_DIMENSIONS": list(AXES)}


def group_json(attributes: dict[str, Any]) -> bytes:
    return render_v3({"zarr_format": 3, "node_type": "group", "attributes": attributes})


def v2_documents(
    groups: dict[str, dict[str, Any]], mags: dict[str, Mag]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The v2 documents of every node (`.zgroup`, `.zarray`, `.zattrs`) by directory."""
    docs: dict[str, dict[str, dict[str, Any]]] = {}
    for key, attributes in groups.items():
        docs[key] = {".zgroup": {"zarr_format": 2}, ".zattrs": attributes}
    for key, mag in mags.items():
        docs[key] = {".zarray": mag.zarray(), ".zattrs": mag.zattrs()}
    return docs


def zmetadata(docs: dict[str, dict[str, dict[str, Any]]], group: str) -> dict[str, Any]:
    """The `.zmetadata` of `group`: every v2 document of its subtree, by key below it."""
    below = {
        key[len(group) + 1 :] if group else key: named
        for key, named in docs.items()
        if not group or key == group or key.startswith(group + "/")
    }
    return consolidated(
        {
            f"{key}/{name}" if key else name: doc
            for key, named in below.items()
            for name, doc in named.items()
        }
    )


# -- datasource-properties.json -------------------------------------------------------


@dataclass(frozen=True)
class MagSpec:
    """A magnification a layer lists: its factors, and the directories it may be in."""

    mag: Vector
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class Layer:
    """A WKW layer of a dataset: its directory, bounding box and magnifications."""

    name: str
    top_left: Vector
    size: Vector
    mags: tuple[MagSpec, ...]
    attributes: dict[str, Any]

    def shape(self, mag: Vector) -> Vector:
        """A magnification's voxel shape: the box's far corner, scaled down, rounded up."""
        return tuple(  # type: ignore[return-value]
            -(-(t + s) // m) for t, s, m in zip(self.top_left, self.size, mag, strict=True)
        )


@dataclass(frozen=True)
class Properties:
    """A parsed `datasource-properties.json`: the WKW layers, the root's attributes, and
    why other layers are shown as stored (one warning each)."""

    layers: tuple[Layer, ...]
    attributes: dict[str, Any]
    skipped: tuple[str, ...] = ()


def _vector(value: Any, what: str, minimum: int) -> Vector:
    if type(value) is int:
        value = [value] * 3
    if (
        not isinstance(value, list)
        or len(value) != 3
        or any(type(v) is not int or v < minimum for v in value)
    ):
        raise InvalidMetadata(f"{what} must be 3 integers >= {minimum}")
    return tuple(value)


def _directory(path: str) -> str:
    """A directory path relative to the dataset, normalised; InvalidMetadata if it leaves it."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or path.startswith("/") or "://" in path:
        raise InvalidMetadata(f"path {path!r} is not a directory inside the dataset")
    return "/".join(parts)


def mag_names(mag: Vector) -> tuple[str, ...]:
    """The directory names webknossos gives a magnification: `2` (or `2-2-2`), `2-2-1`."""
    long = "-".join(map(str, mag))
    return (str(mag[0]), long) if len(set(mag)) == 1 else (long,)


def _mag_spec(layer: str, entry: Any) -> MagSpec:
    if not isinstance(entry, dict):
        raise InvalidMetadata("a magnification must be an object")
    value = entry.get("mag", entry.get("resolution"))
    if isinstance(value, str):
        value = [int(p) for p in value.split("-")] if re.fullmatch(r"\d+(-\d+){2}", value) else 0
    mag = _vector(value, "mag", 1)
    if isinstance(entry.get("path"), str):
        return MagSpec(mag, (_directory(entry["path"]),))
    return MagSpec(mag, tuple(f"{layer}/{name}" for name in mag_names(mag)))


def _layer(doc: dict[str, Any]) -> Layer:
    name = doc.get("name")
    if not isinstance(name, str):
        raise InvalidMetadata("name must be a string")
    _directory(name)
    box = doc.get("boundingBox")
    if not isinstance(box, dict):
        raise InvalidMetadata("boundingBox must be an object")
    top_left = _vector(box.get("topLeft"), "boundingBox.topLeft", 0)
    size = _vector([box.get("width"), box.get("height"), box.get("depth")], "boundingBox size", 0)
    entries = doc.get("mags", doc.get("wkwResolutions"))
    if not isinstance(entries, list) or not entries:
        raise InvalidMetadata("a WKW layer must list its mags (or wkwResolutions)")
    mags = tuple(_mag_spec(name, entry) for entry in entries)
    kept = ("category", "elementClass", "boundingBox", "largestSegmentId")
    attributes = {"webknossos": {k: doc[k] for k in kept if k in doc}}
    return Layer(name, top_left, size, mags, attributes)


def parse_properties(raw: bytes) -> Properties:
    """The WKW layers `datasource-properties.json` describes; InvalidMetadata if it is not
    a webknossos datasource. Layers of other formats, or that it does not describe
    well, are left as stored, with the reason in `skipped`."""
    try:
        doc = jsondoc.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidMetadata(f"{PROPERTIES} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("dataLayers"), list):
        raise InvalidMetadata(f"{PROPERTIES} lists no dataLayers")
    layers, skipped, names = [], [], set()
    for i, entry in enumerate(doc["dataLayers"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("dataFormat", "wkw") != "wkw":
            skipped.append(f"layer {i} ({name!r}) is not a WKW layer: shown as stored")
            continue
        try:
            layer = _layer(entry)
            if layer.name in names:
                raise InvalidMetadata("another layer has the same name")
        except InvalidMetadata as e:
            skipped.append(f"layer {i} ({name!r}) shown as stored: {e}")
            continue
        names.add(layer.name)
        layers.append(layer)
    attributes = {"webknossos": {k: doc[k] for k in ("id", "scale") if k in doc}}
    return Properties(tuple(layers), attributes, tuple(skipped))


def bare_shape(header: Header, files: list[Vector]) -> Vector:
    """The shape of a magnification without properties: up to the end of its last files."""
    return tuple(  # type: ignore[return-value]
        header.file_voxels * (max((f[axis] for f in files), default=-1) + 1) for axis in range(3)
    )
