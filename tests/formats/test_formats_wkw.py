"""The WKW format logic (`shardfs.formats.wkw`), checked against files the `wkw` package wrote:
headers byte by byte, where each block lies (Morton order, jump tables), how a block's bytes
become a (c, x, y, z) chunk, and every way a file can be corrupt."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from numcodecs import lz4

from shardfs.formats.wkw import (
    HEADER_SIZE,
    LZ4,
    LZ4HC,
    PART_BLOCKS,
    RAW,
    Header,
    Mag,
    file_key,
    morton_index,
    parse_properties,
    v2_documents,
    zmetadata,
)
from shardfs.primitives.errors import CorruptData, InvalidMetadata
from tests.support.wkw_data import BLOCK_LEN, FILE_LEN, header_bytes, write_mag

CASES = [
    (dtype, channels, compressed)
    for dtype, channels in (("uint8", 1), ("uint16", 2), ("uint32", 1), ("uint64", 1))
    for compressed in (False, True)
]


def written(tmp_path: Path, dtype: str, channels: int, compressed: bool) -> tuple[Path, np.ndarray]:
    """A magnification of two files (x0, x1), every voxel distinct, as `wkw` wrote it."""
    shape = (channels, 2 * BLOCK_LEN * FILE_LEN, BLOCK_LEN * FILE_LEN, BLOCK_LEN * FILE_LEN)
    data = np.arange(np.prod(shape), dtype=np.uint64).astype(dtype).reshape(shape)
    directory = tmp_path / f"{dtype}-{channels}-{compressed}"
    write_mag(directory, data, (0, 0, 0), compressed)
    return directory, data


@pytest.mark.parametrize(("dtype", "channels", "compressed"), CASES)
def test_headers_are_what_wkw_writes(
    tmp_path: Path, dtype: str, channels: int, compressed: bool
) -> None:
    directory, _ = written(tmp_path, dtype, channels, compressed)
    raw = (directory / "header.wkw").read_bytes()
    assert len(raw) == HEADER_SIZE and raw[:3] == b"WKW"
    header = Header.parse(raw)
    assert (header.version, header.block_len, header.file_len) == (1, BLOCK_LEN, FILE_LEN)
    assert header.block_type == (LZ4HC if compressed else RAW)
    assert (header.dtype, header.channels, header.data_offset) == (np.dtype(dtype), channels, 0)
    assert header.block_bytes == BLOCK_LEN**3 * channels * np.dtype(dtype).itemsize
    data_file = Header.parse((directory / "z0/y0/x1.wkw").read_bytes())
    assert data_file.same_layout(header)
    assert data_file.data_offset == (HEADER_SIZE + 8 * FILE_LEN**3 if compressed else HEADER_SIZE)


@pytest.mark.parametrize(("dtype", "channels", "compressed"), CASES)
def test_every_block_is_the_chunk_wkw_reads(
    tmp_path: Path, dtype: str, channels: int, compressed: bool
) -> None:
    """Located by `Mag.locate` (Morton order), cut out by the jump table, decoded: C order of
    (z, y, x, c), which is the (c, x, y, z) chunk `wkw` reads, in F order."""
    directory, data = written(tmp_path, dtype, channels, compressed)
    header = Header.parse((directory / "header.wkw").read_bytes())
    mag = Mag("mag", header, data.shape[1:])
    assert mag.grid == (2 * FILE_LEN, FILE_LEN, FILE_LEN)
    tables = {}
    for x, y, z in np.ndindex(*mag.grid):
        file, index = mag.locate((x, y, z))
        if file not in tables:
            content = (directory / file_key(file)).read_bytes()
            tables[file] = (content, extents(header, content))
        content, located = tables[file]
        offset, size = located[index]
        chunk = header.decode(content[offset : offset + size])
        block = np.frombuffer(chunk, header.dtype).reshape((BLOCK_LEN,) * 3 + (channels,))
        b = BLOCK_LEN
        expected = data[:, x * b : (x + 1) * b, y * b : (y + 1) * b, z * b : (z + 1) * b]
        np.testing.assert_array_equal(block.transpose(3, 2, 1, 0), expected)
        as_f = np.frombuffer(chunk, header.dtype).reshape((channels,) + (b,) * 3, order="F")
        np.testing.assert_array_equal(as_f, expected)


def test_morton_order_puts_x_lowest() -> None:
    assert [morton_index(p, 2) for p in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (2, 0, 0)]] == [
        1,
        2,
        4,
        8,
    ]
    assert sorted(morton_index(p, 2) for p in np.ndindex(4, 4, 4)) == list(range(64))


# -- corrupt input ---------------------------------------------------------------------------


@pytest.fixture
def lz4_file(tmp_path: Path) -> tuple[Header, bytes]:
    directory, _ = written(tmp_path, "uint16", 2, True)
    header = Header.parse((directory / "header.wkw").read_bytes())
    return header, (directory / "z0/y0/x0.wkw").read_bytes()


@pytest.fixture
def raw_file(tmp_path: Path) -> tuple[Header, bytes]:
    directory, _ = written(tmp_path, "uint8", 1, False)
    header = Header.parse((directory / "header.wkw").read_bytes())
    return header, (directory / "z0/y0/x0.wkw").read_bytes()


def extents(header: Header, content: bytes) -> np.ndarray:
    """The extents of every block of a data file, part by part of its table."""
    parts = []
    for part in range(header.blocks // header.part_blocks):
        pieces = [content[offset : offset + n] for offset, n in header.table_reads(part)]
        parts.append(header.extents(pieces, len(content), part))
    return np.concatenate(parts)


def patched(content: bytes, at: int, value: bytes) -> bytes:
    return content[:at] + value + content[at + len(value) :]


@pytest.mark.parametrize(
    ("at", "value", "message"),
    [
        (0, b"WKX", "no WKW magic"),
        (3, b"\x02", "unknown WKW version"),
        (5, b"\x07", "unknown block type"),
        (6, b"\x0b", "unknown voxel type"),
        (7, b"\x03", "do not fit"),
        (4, b"\xf3", "files of 32768\\^3 blocks are too big"),
        (4, b"\x0f", "blocks of .* bytes are too big"),
        (5, b"\x02", "disagrees with the magnification's"),  # LZ4 where the mag says LZ4HC
        (4, b"\x24", "disagrees with the magnification's"),  # another file length
    ],
)
def test_bad_headers(lz4_file: tuple[Header, bytes], at: int, value: bytes, message: str) -> None:
    header, content = lz4_file
    with pytest.raises(CorruptData, match=message):
        extents(header, patched(content, at, value))


def test_truncated_files(lz4_file: tuple[Header, bytes], raw_file: tuple[Header, bytes]) -> None:
    header, content = lz4_file
    with pytest.raises(CorruptData, match="past its end"):
        extents(header, content[:-1])
    with pytest.raises(CorruptData, match="cannot hold its jump table"):
        extents(header, content[:100])
    with pytest.raises(CorruptData, match="too short"):
        extents(header, content[:10])
    header, content = raw_file
    assert len(extents(header, content)) == FILE_LEN**3
    with pytest.raises(CorruptData, match="cannot hold its blocks"):
        extents(header, content[:-1])


def test_bad_jump_tables(lz4_file: tuple[Header, bytes]) -> None:
    header, content = lz4_file
    past = struct.pack("<Q", len(content) + 1)
    with pytest.raises(CorruptData, match="past its end"):
        extents(header, patched(content, HEADER_SIZE + 8 * 5, past))
    first_end = content[HEADER_SIZE : HEADER_SIZE + 8]
    with pytest.raises(CorruptData, match="does not increase at block 2"):
        extents(header, patched(content, HEADER_SIZE + 8 * 2, first_end))
    last = HEADER_SIZE + 8 * (header.blocks - 1)
    grown = struct.pack("<Q", len(content) + header.stored_limit)
    with pytest.raises(CorruptData, match=r"block 63 is \d+ bytes, more than LZ4 makes"):
        extents(header, patched(content, last, grown) + bytes(header.stored_limit))
    inside = struct.pack("<Q", HEADER_SIZE)
    with pytest.raises(CorruptData, match="inside its jump table"):
        extents(header, patched(content, 8, inside))


def test_lz4_blocks_must_decode_to_exactly_a_block(lz4_file: tuple[Header, bytes]) -> None:
    header, content = lz4_file
    offset, size = extents(header, content)[3]
    block = content[offset : offset + size]
    assert len(header.decode(block)) == header.block_bytes
    for bad in (block[:-3], b"\xff" * 20, block + block):
        with pytest.raises(CorruptData):
            header.decode(bad)
    small = Header(1, 2, 1, LZ4HC, np.dtype("uint8"), 1, 0)
    with pytest.raises(CorruptData, match="does not decode"):
        small.decode(block)  # decodes to more than a block of 2^3 bytes


def test_raw_blocks_are_served_as_stored(raw_file: tuple[Header, bytes]) -> None:
    header, content = raw_file
    offset, size = extents(header, content)[7]
    assert header.decode(content[offset : offset + size]) == content[offset : offset + size]


# -- huge files: their tables are read in parts ---------------------------------------------


def test_a_part_of_a_huge_table_is_read_alone() -> None:
    """A file of 256^3 LZ4 blocks has a jump table of 128 MiB; the blocks of one part of
    it (2^15) are located from its header and 8 * (2^15 + 1) bytes of it, wherever the
    part is, and checked: corruption is reported at the block's index in the file."""
    blocks, n = 1 << 24, PART_BLOCKS
    start = HEADER_SIZE + 8 * blocks
    header = Header.parse(header_bytes(LZ4, 0, 8))
    assert header.part_blocks == n and header.blocks == blocks
    size = start + 3 * blocks  # every block 3 bytes

    def ends(first: int, last: int) -> np.ndarray:
        """The end offsets of blocks first..last - 1."""
        return start + 3 * np.arange(first + 1, last + 1, dtype=np.int64)

    assert header.table_reads(0) == [(0, HEADER_SIZE + 8 * n)]
    part = 300
    reads = header.table_reads(part)
    assert reads == [(0, HEADER_SIZE), (HEADER_SIZE + 8 * (part * n - 1), 8 * (n + 1))]
    head = header_bytes(LZ4, 0, 8, start)
    entries = ends(part * n - 1, (part + 1) * n).astype("<u8").tobytes()
    found = header.extents([head, entries], size, part)
    np.testing.assert_array_equal(found[:, 0], ends(part * n - 1, (part + 1) * n - 1))
    assert (found[:, 1] == 3).all()
    first = header.extents([head + ends(0, n).astype("<u8").tobytes()], size, 0)
    assert (first[0, 0], first[-1, 0]) == (start, int(ends(n - 2, n - 1)[0]))
    bad = bytearray(entries)
    bad[8 * 7 : 8 * 8] = bytes(8)  # block part * n + 6 ends at 0
    with pytest.raises(CorruptData, match=f"does not increase at block {part * n + 6}"):
        header.extents([head, bytes(bad)], size, part)
    with pytest.raises(CorruptData, match=f"does not increase at block {part * n - 1}"):
        header.extents([head, struct.pack("<Q", start) + entries[8:]], size, part)
    with pytest.raises(CorruptData, match="cannot hold its jump table"):
        header.extents([head, entries[:-1]], size, part)
    with pytest.raises(CorruptData, match="cannot hold its jump table"):
        header.extents([head, entries], start - 1, part)
    with pytest.raises(CorruptData, match="inside its jump table"):
        header.extents([header_bytes(LZ4, 0, 8, start - 8), entries], size, part)


def test_a_part_of_a_huge_raw_file() -> None:
    """A raw file has no table: a part's blocks follow from its header alone (16 bytes),
    and a file too small for all of its blocks is corrupt, whichever part is asked for."""
    header = Header.parse(header_bytes(RAW, 0, 8))
    assert header.table_reads(511) == [(0, HEADER_SIZE)]
    head = header_bytes(RAW, 0, 8, HEADER_SIZE)
    found = header.extents([head], HEADER_SIZE + (1 << 24), 511)
    assert (int(found[0, 0]), len(found)) == (HEADER_SIZE + 511 * PART_BLOCKS, PART_BLOCKS)
    with pytest.raises(CorruptData, match="cannot hold its blocks"):
        header.extents([head], HEADER_SIZE + (1 << 24) - 1, 511)


def test_a_stored_block_is_at_most_what_lz4_makes_of_it() -> None:
    """LZ4's bound (`LZ4_COMPRESSBOUND`): what LZ4 makes of random bytes, the worst case,
    fits (`wkw` wrote 32,898 bytes for a random block of 32,768)."""
    header = Header(1, 32, 1, LZ4HC, np.dtype("uint8"), 1, 0)
    assert header.stored_limit == 32768 + 128 + 16
    noise = np.random.default_rng(0).integers(0, 256, header.block_bytes, np.uint8).tobytes()
    stored = lz4.compress(noise)[4:]  # without numcodecs' size prefix
    assert header.block_bytes < len(stored) <= header.stored_limit
    assert len(header.decode(stored)) == header.block_bytes


# -- properties and documents ----------------------------------------------------------------


def properties(*layers: dict) -> bytes:
    return json.dumps(
        {"id": {"name": "ds"}, "scale": [1, 2, 3], "dataLayers": list(layers)}
    ).encode()


def layer(name: str = "color", **fields: object) -> dict:
    base = {
        "name": name,
        "category": "color",
        "boundingBox": {"topLeft": [10, 0, 3], "width": 100, "height": 64, "depth": 30},
        "elementClass": "uint8",
        "dataFormat": "wkw",
        "wkwResolutions": [{"resolution": 1, "cubeLength": 1024}, {"resolution": [4, 4, 2]}],
    }
    return base | fields


def test_properties_name_layers_and_their_mags() -> None:
    mags = [{"mag": [1, 1, 1], "path": "./elsewhere/1"}, {"mag": "2-2-1"}]
    parsed = parse_properties(properties(layer(), layer("seg", mags=mags)))
    color, seg = parsed.layers
    assert [m.candidates for m in color.mags] == [("color/1", "color/1-1-1"), ("color/4-4-2",)]
    assert [m.candidates for m in seg.mags] == [("elsewhere/1",), ("seg/2-2-1",)]
    assert color.shape((1, 1, 1)) == (110, 64, 33)
    assert color.shape((4, 4, 2)) == (28, 16, 17)  # the far corner, scaled, rounded up
    assert parsed.attributes == {"webknossos": {"id": {"name": "ds"}, "scale": [1, 2, 3]}}
    assert color.attributes["webknossos"]["category"] == "color"
    assert not parsed.skipped


def test_other_layers_are_left_as_stored() -> None:
    parsed = parse_properties(
        properties(
            layer(),
            layer("z", dataFormat="zarr"),
            layer("color"),  # a second layer of the same name
            layer("bad", boundingBox={"topLeft": [0, 0]}),
            layer("up", mags=[{"mag": [1, 1, 1], "path": "../outside"}]),
        )
    )
    assert [x.name for x in parsed.layers] == ["color"]
    assert len(parsed.skipped) == 4
    for raw in (b"[]", b"{", json.dumps({"dataLayers": 3}).encode()):
        with pytest.raises(InvalidMetadata):
            parse_properties(raw)


def test_documents() -> None:
    header = Header(1, 32, 32, LZ4HC, np.dtype("<u2"), 2, 0)
    mag = Mag("color/1", header, (100, 64, 33), (2, 2, 1), (11, 0, 3))
    doc = json.loads(mag.zarr_json())
    assert doc["shape"] == [2, 100, 64, 33] and doc["dimension_names"] == ["c", "x", "y", "z"]
    assert doc["chunk_grid"]["configuration"]["chunk_shape"] == [2, 32, 32, 32]
    assert doc["codecs"][0] == {"name": "transpose", "configuration": {"order": [3, 2, 1, 0]}}
    assert doc["attributes"] == {"webknossos": {"mag": [2, 2, 1], "topLeft": [5, 0, 3]}}
    docs = v2_documents({"": {}, "color": {}}, {"color/1": mag})
    zarray = docs["color/1"][".zarray"]
    assert (zarray["order"], zarray["dtype"], zarray["compressor"]) == ("F", "<u2", None)
    assert docs["color/1"][".zattrs"]["_ARRAY_DIMENSIONS"] == ["c", "x", "y", "z"]
    assert set(zmetadata(docs, "color")["metadata"]) == {
        ".zgroup",
        ".zattrs",
        "1/.zarray",
        "1/.zattrs",
    }
    assert set(zmetadata(docs, "")["metadata"]) == {
        ".zgroup",
        ".zattrs",
        "color/.zgroup",
        "color/.zattrs",
        "color/1/.zarray",
        "color/1/.zattrs",
    }
