"""WKW test datasets, written by the `wkw` package (an independent writer), and what `wkw`
itself reads back from them.

Small blocks (8^3 voxels, files of 4^3 blocks: 32^3 voxels) keep them small while
every case the view must get right is there: layers of uint8, uint16 with two
channels, uint32 and uint64 segmentation; several magnifications (one
anisotropic); a bounding box that starts off the origin and ends inside its last
files; raw files, or LZ4HC ones compressed by `wkw` from the raw ones.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import wkw

BLOCK_LEN = 8
FILE_LEN = 4
TOP_LEFT = (5, 3, 2)
SIZE = (50, 37, 30)


@dataclass(frozen=True)
class LayerSpec:
    name: str
    category: str
    dtype: str
    channels: int
    mags: tuple[tuple[int, int, int], ...]


LAYERS = (
    LayerSpec("color", "color", "uint8", 1, ((1, 1, 1), (2, 2, 1))),
    LayerSpec("color2", "color", "uint16", 2, ((1, 1, 1),)),
    LayerSpec("segmentation", "segmentation", "uint32", 1, ((1, 1, 1), (2, 2, 2))),
    LayerSpec("segmentation64", "segmentation", "uint64", 1, ((1, 1, 1),)),
)


def mag_name(mag: tuple[int, int, int]) -> str:
    return str(mag[0]) if len(set(mag)) == 1 else "-".join(map(str, mag))


def _volume(spec: LayerSpec, rng: np.random.Generator) -> np.ndarray:
    """Values of the layer in its bounding box (c, x, y, z), at magnification 1."""
    shape = (spec.channels, *SIZE)
    if spec.category == "segmentation":  # big ids, to catch byte order and width mistakes
        base = np.iinfo(spec.dtype).max // 2
        return (base + rng.integers(0, 1000, shape)).astype(spec.dtype)
    return rng.integers(1, np.iinfo(spec.dtype).max, shape).astype(spec.dtype)


def write_mag(
    directory: Path, data: np.ndarray, offset: tuple[int, int, int], compressed: bool
) -> None:
    """Write `data` (c, x, y, z) at voxel `offset` of a new magnification `directory`."""
    header = wkw.Header(
        np.dtype(data.dtype).type,
        num_channels=data.shape[0],
        block_len=BLOCK_LEN,
        file_len=FILE_LEN,
        block_type=wkw.Header.BLOCK_TYPE_RAW,
    )
    target = directory.with_name(directory.name + ".raw") if compressed else directory
    with wkw.Dataset.create(str(target), header) as dataset:
        dataset.write(offset, data)
        if compressed:  # compressed files are only written whole: compress the raw ones
            dataset.compress(str(directory), compress_files=True).close()
    if compressed:
        for path in sorted(target.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        target.rmdir()


def make_dataset(root: Path, compressed: bool, seed: int = 0) -> Path:
    """A webknossos dataset with `datasource-properties.json` at `root`."""
    rng = np.random.default_rng(seed)
    layers = []
    for spec in LAYERS:
        full = _volume(spec, rng)
        mags = []
        for mag in spec.mags:
            data = np.ascontiguousarray(full[:, :: mag[0], :: mag[1], :: mag[2]])
            offset = tuple(-(-t // m) for t, m in zip(TOP_LEFT, mag, strict=True))
            write_mag(root / spec.name / mag_name(mag), data, offset, compressed)
            mags.append({"resolution": list(mag), "cubeLength": BLOCK_LEN * FILE_LEN})
        layer = {
            "name": spec.name,
            "category": spec.category,
            "boundingBox": {
                "topLeft": list(TOP_LEFT),
                "width": SIZE[0],
                "height": SIZE[1],
                "depth": SIZE[2],
            },
            "elementClass": spec.dtype,
            "dataFormat": "wkw",
            "wkwResolutions": mags,
        }
        if spec.category == "segmentation":
            layer["largestSegmentId"] = int(full.max())
        layers.append(layer)
    properties = {
        "id": {"name": root.name, "team": ""},
        "scale": [11.24, 11.24, 25.0],
        "dataLayers": layers,
    }
    (root / "datasource-properties.json").write_text(json.dumps(properties, indent=2))
    return root


def arrays(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every magnification directory of a dataset made by `make_dataset`, and its mag."""
    return {f"{s.name}/{mag_name(m)}": m for s in LAYERS for m in s.mags}


def expected_shape(mag: tuple[int, int, int]) -> tuple[int, int, int]:
    return tuple(-(-(t + s) // m) for t, s, m in zip(TOP_LEFT, SIZE, mag, strict=True))


def read_wkw(directory: Path, shape: tuple[int, ...]) -> np.ndarray:
    """What `wkw` reads from a magnification: (c, x, y, z) from voxel 0."""
    with wkw.Dataset.open(str(directory)) as dataset:
        return dataset.read((0, 0, 0), shape[-3:])


# -- hand-made files: what `wkw` cannot write (it takes block and file lengths up to 128) ------


def header_bytes(
    block_type: int, block_len: int, file_len: int, data_offset: int = 0, voxel_size: int = 1
) -> bytes:
    """A WKW header of uint8 voxels (`voxel_size` channels), lengths given by their log2."""
    lengths = file_len << 4 | block_len
    return struct.pack("<3sBBBBBQ", b"WKW", 1, lengths, block_type, 1, voxel_size, data_offset)


HUGE_FILE = 8  #: log2 of the biggest file length shardfs serves: files of 256^3 blocks


def sparse_huge_file(directory: Path, compressed: bool, index: int) -> bytes:
    """A bare magnification of one data file of 256^3 blocks of one uint8 voxel, held as a
    sparse file: raw (16 MiB), or LZ4 (2 bytes per block, after a jump table of 128 MiB)
    with only the part of the table that locates block `index` (its part of 2^15
    blocks, and the end of the block before) and that part's blocks written. What
    block `index` holds."""
    blocks = 1 << 3 * HUGE_FILE
    directory.mkdir(parents=True)
    path = directory / "z0/y0/x0.wkw"
    path.parent.mkdir(parents=True)
    value = bytes([index % 251 + 1])
    if not compressed:
        (directory / "header.wkw").write_bytes(header_bytes(1, 0, HUGE_FILE))
        with open(path, "wb") as f:
            f.write(header_bytes(1, 0, HUGE_FILE, 16))
            f.seek(16 + index)
            f.write(value)
            f.truncate(16 + blocks)
        return value
    start = 16 + 8 * blocks
    (directory / "header.wkw").write_bytes(header_bytes(2, 0, HUGE_FILE))
    first = index - index % (1 << 15)
    part = np.arange(max(first - 1, 0), first + (1 << 15), dtype="<u8")
    with open(path, "wb") as f:
        f.write(header_bytes(2, 0, HUGE_FILE, start))
        f.seek(16 + 8 * int(part[0]))
        f.write((start + 2 * (part + 1)).astype("<u8").tobytes())  # block i ends there
        f.seek(start + 2 * first)
        for i in range(first, first + (1 << 15)):  # one literal: a 1-byte LZ4 block
            f.write(b"\x10" + bytes([i % 251 + 1]))
        f.truncate(start + 2 * blocks)
    return value
