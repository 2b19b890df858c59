"""OME-Zarr 0.5 test data written by zarr-python 3 (not by shardfs), for the OME-Zarr tests.

Each builder writes one spec-shaped hierarchy under an empty `root` (NGFF 0.5: the
metadata in group attributes under `ome`, `dimension_names` on every level array), checks
it with ome-zarr-models' v05 models and returns an `OmeData` that says what was written:
every multiscale image with its levels' pixels, chunks, shards and transforms, and the
`ome` attributes of every group. Tests compare what they read with that description
instead of deriving it again from the files they test.

Levels are subsamples (every second pixel from the second one on along the downsampled
axes), so that every level is exact and its translation moves by one pixel of the level
above: each level then has its own transforms, which a translator that copies level 0's
would get wrong. Sharded and unsharded levels are mixed within images, and every level 0
has edge chunks. Scales and translations are dyadic, so they survive JSON unchanged.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import zarr
from ome_zarr_models import v05
from ome_zarr_models.common.omero import Omero
from ome_zarr_models.exceptions import ValidationWarning
from zarr.codecs import BloscCodec, ZstdCodec

VERSION = "0.5"
#: Levels per image: enough for a level whose transforms differ from level 0's and 1's.
LEVELS = 3


@dataclass(frozen=True)
class Axis:
    name: str
    type: str
    unit: str | None = None

    def ome(self) -> dict[str, str]:
        """The axis as NGFF metadata (no unit key where there is no unit)."""
        axis = {"name": self.name, "type": self.type}
        return axis if self.unit is None else axis | {"unit": self.unit}


@dataclass(frozen=True, eq=False)
class Level:
    """One resolution level: the zarr array `path` in its image group, and its pixels."""

    path: str
    data: np.ndarray
    chunks: tuple[int, ...]
    #: None where the level is not sharded.
    shards: tuple[int, ...] | None
    scale: tuple[float, ...]
    translation: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape


@dataclass(frozen=True)
class Channel:
    """An `omero` channel: its label, colour (RRGGBB) and display window."""

    label: str
    color: str
    window: tuple[float, float]

    def ome(self, dtype: np.dtype) -> dict[str, Any]:
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
        start, end = self.window
        return {
            "label": self.label,
            "color": self.color,
            "active": True,
            "window": {"min": float(info.min), "max": float(info.max), "start": start, "end": end},
        }


@dataclass(frozen=True, eq=False)
class Image:
    """A multiscale image group (an image, a label image or a plate's field)."""

    #: Group path below the root ("" for the root itself).
    path: str
    name: str
    axes: tuple[Axis, ...]
    levels: tuple[Level, ...]
    #: The multiscale-wide scale applied after each level's transforms, if any.
    global_scale: tuple[float, ...] | None = None
    channels: tuple[Channel, ...] = ()
    #: Root-relative paths of this image's label images.
    labels: tuple[str, ...] = ()
    #: The `image-label` metadata of a label image.
    image_label: dict[str, Any] | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.levels[0].data.dtype

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self.axes)


@dataclass(frozen=True, eq=False)
class OmeData:
    """What one builder wrote under `root`."""

    root: Path
    kind: Literal["image", "plate", "bioformats2raw"]
    #: Every multiscale group: images, label images and plate fields.
    images: tuple[Image, ...]
    #: Group path -> the `ome` attributes written there (groups without them are absent).
    attributes: dict[str, dict[str, Any]]
    #: Plain files in the hierarchy (root-relative path -> bytes): bioformats2raw's OME-XML.
    files: dict[str, bytes] = field(default_factory=dict)

    def image(self, path: str) -> Image:
        return next(image for image in self.images if image.path == path)


#: Axis name -> (type, default unit); space axes take the image's unit.
AXIS_TYPES = {"t": ("time", "second"), "c": ("channel", None)} | {
    name: ("space", "micrometer") for name in "zyx"
}


def pixels(seed: int, shape: Sequence[int], dtype: str, high: int | None = None) -> np.ndarray:
    """Deterministic pixels: integers over the dtype's whole range (or 0..`high`), floats
    normally distributed."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return (rng.standard_normal(tuple(shape)) * 1000).astype(dt)
    info = np.iinfo(dt)
    low, top = (0, high) if high is not None else (int(info.min), int(info.max))
    return rng.integers(low, top, size=tuple(shape), dtype=dt, endpoint=True)


def write_image(
    root: zarr.Group,
    path: str,
    data: np.ndarray,
    *,
    axes: str,
    name: str,
    chunks: Sequence[int],
    sharded: Sequence[bool],
    scale: Sequence[float],
    translation: Sequence[float],
    downsample: str = "zyx",
    unit: str = "micrometer",
    channels: Sequence[Channel] = (),
    global_scale: Sequence[float] | None = None,
    compressors: Any = "auto",
    image_label: dict[str, Any] | None = None,
    chunks_per_shard: int = 2,
) -> tuple[Image, dict[str, Any]]:
    """Write `data` as a multiscale image group `path` of `root` ("" for `root`) with
    LEVELS levels. A level keeps `chunks` along an axis they split, else takes half the
    axis, so lower levels have edge chunks too; `sharded[i]` says whether level i is
    sharded (shards of `chunks_per_shard` chunks along every axis the chunks split).
    Returns the image and its `ome` attributes."""
    axis_list = tuple(
        Axis(a, AXIS_TYPES[a][0], unit if AXIS_TYPES[a][0] == "space" else AXIS_TYPES[a][1])
        for a in axes
    )
    step = tuple(slice(1, None, 2) if a in downsample else slice(None) for a in axes)
    levels: list[Level] = []
    level_scale, level_translation = tuple(scale), tuple(translation)
    for index in range(LEVELS):
        level_chunks = tuple(
            c if c < n else max(1, (n + 1) // 2) for c, n in zip(chunks, data.shape, strict=True)
        )
        shards = (
            tuple(
                chunks_per_shard * c if c < n else c
                for c, n in zip(level_chunks, data.shape, strict=True)
            )
            if sharded[index]
            else None
        )
        levels.append(Level(str(index), data, level_chunks, shards, level_scale, level_translation))
        # Pixel i of the next level is pixel 2i+1 of this one.
        level_translation = tuple(
            t + s if a in downsample else t
            for a, t, s in zip(axes, level_translation, level_scale, strict=True)
        )
        level_scale = tuple(
            2 * s if a in downsample else s for a, s in zip(axes, level_scale, strict=True)
        )
        data = np.ascontiguousarray(data[step])
    multiscale: dict[str, Any] = {
        "name": name,
        "axes": [axis.ome() for axis in axis_list],
        "datasets": [
            {
                "path": level.path,
                "coordinateTransformations": [
                    {"type": "scale", "scale": list(level.scale)},
                    {"type": "translation", "translation": list(level.translation)},
                ],
            }
            for level in levels
        ],
    }
    if global_scale is not None:
        multiscale["coordinateTransformations"] = [{"type": "scale", "scale": list(global_scale)}]
    ome: dict[str, Any] = {"version": VERSION, "multiscales": [multiscale]}
    if channels:
        ome["omero"] = {"channels": [channel.ome(levels[0].data.dtype) for channel in channels]}
    if image_label is not None:
        ome["image-label"] = image_label
    if path:
        group = root.create_group(path, attributes={"ome": ome})
    else:
        group = root
        group.attrs["ome"] = ome
    for level in levels:
        array = group.create_array(
            level.path,
            shape=level.shape,
            dtype=level.data.dtype,
            chunks=level.chunks,
            shards=level.shards,
            dimension_names=list(axes),
            compressors=compressors,
            fill_value=0,
        )
        array[...] = level.data
    image = Image(
        path,
        name,
        axis_list,
        tuple(levels),
        tuple(global_scale) if global_scale is not None else None,
        tuple(channels),
        image_label=image_label,
    )
    return image, ome


def validate_models(root: Path, data: OmeData, version: ModuleType, zarr_format: int) -> None:
    """ome-zarr-models' `version` module (`v04`, `v05`) validates the hierarchy `data`
    describes at `root`, each image too; its warnings of data that is not strictly
    compliant count as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ValidationWarning)
        group = zarr.open_group(root, mode="r", zarr_format=zarr_format)
        model = {"image": version.Image, "plate": version.HCS}.get(data.kind)
        (model or version.BioFormats2Raw).from_zarr(group)
        for image in data.images:
            version.Image.from_zarr(
                zarr.open_group(root / image.path, mode="r", zarr_format=zarr_format)
            )


def validate(data: OmeData) -> None:
    """Check what `data` describes with ome-zarr-models v05, plus what the models leave
    out: `omero` channels (one per channel of the image) and bioformats2raw's `series`."""
    validate_models(data.root, data, v05, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ValidationWarning)
        if data.kind == "bioformats2raw":
            series = data.attributes["OME"]["series"]
            ome_group = zarr.open_group(data.root / "OME", mode="r", zarr_format=3)
            if ome_group.attrs["ome"] != {"version": VERSION, "series": series}:
                raise ValueError(f"OME group attributes: {ome_group.attrs.asdict()}")
            for path in series:
                v05.Image.from_zarr(zarr.open_group(data.root / path, mode="r"))
        for image in data.images:
            attrs = zarr.open_group(data.root / image.path, mode="r").attrs["ome"]
            if "omero" in attrs:
                channels = Omero.model_validate(attrs["omero"]).channels
                size = image.levels[0].shape[image.axis_names.index("c")]
                if len(channels) != size:
                    raise ValueError(
                        f"image {image.path!r}: {len(channels)} omero channels for {size}"
                    )


def _single(root: Path, image: Image, ome: dict[str, Any]) -> OmeData:
    data = OmeData(root, "image", (image,), {"": ome})
    validate(data)
    return data


def _open(root: Path) -> zarr.Group:
    return zarr.open_group(root, mode="w", zarr_format=3)


def image_yx(root: Path) -> OmeData:
    """2-D uint8 in nanometers, uncompressed; level 0 sharded, levels 1-2 not."""
    image, ome = write_image(
        _open(root),
        "",
        pixels(1, (50, 61), "uint8"),
        axes="yx",
        name="yx",
        chunks=(16, 16),
        sharded=(True, False, False),
        scale=(0.5, 0.25),
        translation=(-8.0, 4.5),
        unit="nanometer",
        compressors=None,
    )
    return _single(root, image, ome)


def image_zyx(root: Path) -> OmeData:
    """3-D float32 downsampled along z too; every level sharded."""
    image, ome = write_image(
        _open(root),
        "",
        pixels(2, (20, 40, 37), "float32"),
        axes="zyx",
        name="zyx",
        chunks=(8, 16, 16),
        sharded=(True, True, True),
        scale=(2.0, 0.5, 0.5),
        translation=(0.0, 10.0, 20.0),
    )
    return _single(root, image, ome)


def image_czyx(root: Path) -> OmeData:
    """4-D uint16 with three omero channels, blosc; level 0 unsharded, levels 1-2 sharded."""
    image, ome = write_image(
        _open(root),
        "",
        pixels(3, (3, 9, 48, 40), "uint16"),
        axes="czyx",
        name="czyx",
        chunks=(1, 4, 16, 16),
        sharded=(False, True, True),
        scale=(1.0, 1.5, 0.25, 0.25),
        translation=(0.0, 3.0, -1.0, 2.0),
        downsample="yx",
        channels=(
            Channel("DAPI", "0000FF", (0, 40000)),
            Channel("GFP", "00FF00", (100, 30000)),
            Channel("mCherry", "FF0000", (0, 65535)),
        ),
        compressors=BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    )
    return _single(root, image, ome)


def image_tczyx(root: Path) -> OmeData:
    """5-D int16 with two omero channels and a multiscale-wide scale (the time step);
    levels 0 and 2 sharded, level 1 not."""
    image, ome = write_image(
        _open(root),
        "",
        pixels(4, (3, 2, 6, 32, 36), "int16"),
        axes="tczyx",
        name="tczyx",
        chunks=(1, 1, 4, 16, 16),
        sharded=(True, False, True),
        scale=(1.0, 1.0, 2.0, 0.5, 0.5),
        translation=(0.0, 0.0, 0.0, 5.0, 5.0),
        downsample="yx",
        channels=(
            Channel("nuclei", "00FFFF", (-1000, 1000)),
            Channel("membrane", "FF00FF", (-500, 2000)),
        ),
        global_scale=(2.5, 1.0, 1.0, 1.0, 1.0),
    )
    return _single(root, image, ome)


#: The label image's values: 0 (background) and three labels.
LABEL_VALUES = 3


def image_with_labels(root: Path) -> OmeData:
    """A zyx uint16 image (level 0 sharded) with `labels/cells`, a uint32 label image of
    the same shape and transforms (unsharded), with colours, properties and its source."""
    group = _open(root)
    options: dict[str, Any] = {
        "axes": "zyx",
        "chunks": (4, 16, 16),
        "scale": (1.0, 0.5, 0.5),
        "translation": (0.0, 2.0, 2.0),
        "downsample": "yx",
    }
    shape = (10, 48, 52)
    image, ome = write_image(
        group,
        "",
        pixels(5, shape, "uint16"),
        name="cells image",
        sharded=(True, False, False),
        **options,
    )
    labels_ome = {"version": VERSION, "labels": ["cells"]}
    group.create_group("labels", attributes={"ome": labels_ome})
    image_label = {
        "version": VERSION,
        "colors": [
            {"label-value": value, "rgba": [60 * value, 255 - 60 * value, 128, 255]}
            for value in range(1, LABEL_VALUES + 1)
        ],
        "properties": [
            {"label-value": value, "class": f"cell type {value}", "area (pixels)": 100 * value}
            for value in range(1, LABEL_VALUES + 1)
        ],
        "source": {"image": "../../"},
    }
    label, label_ome = write_image(
        group,
        "labels/cells",
        pixels(6, shape, "uint32", high=LABEL_VALUES),
        name="cells",
        sharded=(False, False, False),
        image_label=image_label,
        **options,
    )
    image = replace(image, labels=("labels/cells",))
    data = OmeData(
        root, "image", (image, label), {"": ome, "labels": labels_ome, "labels/cells": label_ome}
    )
    validate(data)
    return data


#: The plate: a 2x2 plate with wells A/1 and B/2, two fields each, one acquisition.
PLATE_ROWS, PLATE_COLUMNS, PLATE_WELLS, PLATE_FIELDS = (
    ("A", "B"),
    ("1", "2"),
    ("A/1", "B/2"),
    ("0", "1"),
)


def plate(root: Path) -> OmeData:
    """An HCS plate of cyx uint16 fields with two omero channels; the first field of each
    well has level 0 sharded, the second none."""
    group = _open(root)
    plate_ome: dict[str, Any] = {
        "version": VERSION,
        "plate": {
            "version": VERSION,
            "name": "test plate",
            "rows": [{"name": row} for row in PLATE_ROWS],
            "columns": [{"name": column} for column in PLATE_COLUMNS],
            "wells": [
                {
                    "path": path,
                    "rowIndex": PLATE_ROWS.index(path.split("/")[0]),
                    "columnIndex": PLATE_COLUMNS.index(path.split("/")[1]),
                }
                for path in PLATE_WELLS
            ],
            "acquisitions": [{"id": 0, "name": "first", "maximumfieldcount": len(PLATE_FIELDS)}],
            "field_count": len(PLATE_FIELDS),
        },
    }
    group.attrs["ome"] = plate_ome
    attributes = {"": plate_ome}
    images = []
    for well_index, well_path in enumerate(PLATE_WELLS):
        row = well_path.split("/")[0]
        if row not in group:
            group.create_group(row)
        well_ome = {
            "version": VERSION,
            "well": {
                "version": VERSION,
                "images": [{"path": field_path, "acquisition": 0} for field_path in PLATE_FIELDS],
            },
        }
        group.create_group(well_path, attributes={"ome": well_ome})
        attributes[well_path] = well_ome
        for field_index, field_path in enumerate(PLATE_FIELDS):
            path = f"{well_path}/{field_path}"
            image, ome = write_image(
                group,
                path,
                pixels(10 + 2 * well_index + field_index, (2, 27, 30), "uint16"),
                axes="cyx",
                name=path,
                chunks=(1, 8, 8),
                sharded=(field_index == 0, False, False),
                scale=(1.0, 0.5, 0.5),
                translation=(0.0, 0.0, 0.0),
                downsample="yx",
                channels=(
                    Channel("DAPI", "0000FF", (0, 5000)),
                    Channel("actin", "FFFFFF", (0, 9000)),
                ),
            )
            images.append(image)
            attributes[path] = ome
    data = OmeData(root, "plate", tuple(images), attributes)
    validate(data)
    return data


#: A minimal OME-XML for bioformats2raw's two series (MetadataOnly, as the spec asks).
OME_XML = b"""<?xml version="1.0" encoding="UTF-8"?>
<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06">
  <Image ID="Image:0" Name="series 0"><Pixels ID="Pixels:0" DimensionOrder="XYZCT" Type="uint16" SizeX="34" SizeY="30" SizeZ="4" SizeC="2" SizeT="1"><MetadataOnly/></Pixels></Image>
  <Image ID="Image:1" Name="series 1"><Pixels ID="Pixels:1" DimensionOrder="XYZCT" Type="uint8" SizeX="26" SizeY="20" SizeZ="1" SizeC="1" SizeT="2"><MetadataOnly/></Pixels></Image>
</OME>
"""


def bioformats2raw(root: Path) -> OmeData:
    """bioformats2raw's layout: `bioformats2raw.layout: 3` at the root, tczyx images `0`
    (uint16, level 0 sharded) and `1` (uint8, unsharded), and group `OME` with `series`
    in its `ome` attributes (where 0.5 puts it) beside OME/METADATA.ome.xml."""
    group = _open(root)
    root_ome = {"version": VERSION, "bioformats2raw.layout": 3}
    group.attrs["ome"] = root_ome
    options: dict[str, Any] = {
        "axes": "tczyx",
        "chunks": (1, 1, 2, 16, 16),
        "scale": (1.0, 1.0, 1.0, 0.25, 0.25),
        "translation": (0.0, 0.0, 0.0, 0.0, 0.0),
        "downsample": "yx",
    }
    first, first_ome = write_image(
        group,
        "0",
        pixels(20, (1, 2, 4, 30, 34), "uint16"),
        name="series 0",
        sharded=(True, False, False),
        channels=(Channel("C0", "FF0000", (0, 4095)), Channel("C1", "00FF00", (0, 4095))),
        **options,
    )
    second, second_ome = write_image(
        group,
        "1",
        pixels(21, (2, 1, 1, 20, 26), "uint8"),
        name="series 1",
        sharded=(False, False, False),
        **options,
    )
    series_ome = {"version": VERSION, "series": ["0", "1"]}
    group.create_group("OME", attributes={"ome": series_ome})
    (root / "OME" / "METADATA.ome.xml").write_bytes(OME_XML)
    data = OmeData(
        root,
        "bioformats2raw",
        (first, second),
        {"": root_ome, "0": first_ome, "1": second_ome, "OME": series_ome},
        {"OME/METADATA.ome.xml": OME_XML},
    )
    validate(data)
    return data


def dandi_like(root: Path) -> OmeData:
    """The DANDI layout of the design notes: a zyx uint16 volume of 64^3 chunks, 32^3
    chunks per shard (a 512 KiB shard index), zstd, on every level (130^3 at level 0:
    edge chunks in one part-filled shard)."""
    image, ome = write_image(
        _open(root),
        "",
        pixels(30, (130, 130, 130), "uint16"),
        axes="zyx",
        name="dandi-like",
        chunks=(64, 64, 64),
        sharded=(True, True, True),
        scale=(1.0, 1.0, 1.0),
        translation=(0.0, 0.0, 0.0),
        compressors=ZstdCodec(level=3),
        chunks_per_shard=32,
    )
    return _single(root, image, ome)


#: The default cases, by name.
CASES: dict[str, Callable[[Path], OmeData]] = {
    "yx": image_yx,
    "zyx": image_zyx,
    "czyx": image_czyx,
    "tczyx": image_tczyx,
    "labels": image_with_labels,
    "plate": plate,
    "bioformats2raw": bioformats2raw,
    "dandi": dandi_like,
}
