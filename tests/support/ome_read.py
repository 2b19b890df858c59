"""OME-Zarr 0.4 as legacy tools see it: ome-zarr-py 0.10 (on zarr-python 2, in the
`.venv-zarr2` environment of tests/support/zarr2.py) reads it, and writes it.

`read_ome_04` reports what ome-zarr-py's reader (`ome_zarr.reader.Reader`, the one napari's
plugin uses) finds: every node with its axes, per-level transforms and shapes, channels,
labels, plate and well metadata, and each level's pixels saved as .npy. `write_ome_04`
has ome-zarr-py write the 0.4 twin of an `OmeData` (tests/support/ome_data.py) with its own
writer functions, the same levels and transforms, so that a 0.4 view of the 0.5 data can
be compared with what the legacy writer itself stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.ome_data import (
    LEVELS,
    PLATE_COLUMNS,
    PLATE_FIELDS,
    PLATE_ROWS,
    PLATE_WELLS,
    OmeData,
)
from tests.support.zarr2 import Zarr2

#: params: items, a list of {path, out}; prints a report per item. ome-zarr-py 0.10 has
#: no reader for the bioformats2raw layout, so the script follows the spec's rule (the
#: OME group's `series`, else groups 0, 1, ...) and reads each series as an image.
READ_04 = r"""
import os
import numpy as np
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader


def read(root, out):
    root = os.path.abspath(root)
    report = {"nodes": {}, "bioformats2raw": None}
    seen = set()

    def relative(path):
        path = os.path.relpath(os.path.normpath(path), root)
        return "" if path == "." else path.replace(os.sep, "/")

    def record(node):
        path = relative(node.zarr.path)
        if path in report["nodes"]:
            return
        attrs = node.zarr.root_attrs
        meta = node.metadata
        npy = []
        for level, data in enumerate(node.data):
            file = os.path.join(out, path, f"level{level}.npy")
            os.makedirs(os.path.dirname(file), exist_ok=True)
            np.save(file, data.compute())
            npy.append(file)
        report["nodes"][path] = {
            "specs": [type(spec).__name__ for spec in node.specs],
            "zattrs": attrs,
            "visible": node.visible,
            "name": meta.get("name"),
            "axes": meta.get("axes"),
            "coordinateTransformations": meta.get("coordinateTransformations"),
            "shapes": [list(data.shape) for data in node.data],
            "dtypes": [str(data.dtype) for data in node.data],
            "channel_names": meta.get("channel_names"),
            "colormap": meta.get("colormap"),
            "contrast_limits": meta.get("contrast_limits"),
            "labels": attrs.get("labels"),
            "label_colors": meta.get("color"),
            "label_properties": meta.get("properties"),
            "plate": attrs.get("plate"),
            "well": attrs.get("well"),
            "npy": npy,
        }

    def visit(path):
        path = os.path.normpath(path)
        if path in seen:
            return
        seen.add(path)
        location = parse_url(path)
        if location is None:
            return
        attrs = location.root_attrs
        if "bioformats2raw.layout" in attrs and "plate" not in attrs:
            ome = parse_url(os.path.join(path, "OME"))
            series = ome.root_attrs.get("series") if ome is not None else None
            if series is None:
                series = []
                while parse_url(os.path.join(path, str(len(series)))) is not None:
                    series.append(str(len(series)))
            report["bioformats2raw"] = {
                "path": relative(path),
                "layout": attrs["bioformats2raw.layout"],
                "series": series,
            }
            for name in series:
                visit(os.path.join(path, name))
            return
        for node in Reader(location)():
            record(node)
            here = node.zarr.path
            for well in (node.zarr.root_attrs.get("plate") or {}).get("wells", []):
                visit(os.path.join(here, well["path"]))
            for image in (node.zarr.root_attrs.get("well") or {}).get("images", []):
                visit(os.path.join(here, image["path"]))

    visit(root)
    return report


print(json.dumps([read(item["path"], item["out"]) for item in params["items"]]))
"""


def read_ome_04(zarr2: Zarr2, items: list[tuple[Path, Path]]) -> list[dict[str, Any]]:
    """What ome-zarr-py 0.10's reader finds in each (0.4 hierarchy, .npy folder) pair, in
    one run (its imports take a second and a half): per hierarchy, `nodes` by
    root-relative path and `bioformats2raw` (its `series`) where the root has that layout.

    A node reports its `specs` (Multiscales, OMERO, Labels, Label, Plate, Well), `zattrs`,
    `name`, `axes`, `coordinateTransformations` (per level), `shapes`, `dtypes`,
    `channel_names`, `colormap`, `contrast_limits`, `labels` (of a labels group),
    `label_colors` and `label_properties` (of a label image, by label value as a string),
    `plate`, `well`, and `npy`: a file per level (plates and wells: the reader's stitched
    grid of their fields).
    """
    return zarr2.run(READ_04, items=[{"path": str(path), "out": str(out)} for path, out in items])


#: params: items, a list of {dest, kind, images, plate, wells, series, files} (see
#: `write_ome_04`). Images are written before the label images that refer to them.
WRITE_04 = r"""
import os
import numpy as np
import zarr
from ome_zarr.format import FormatV04
from ome_zarr.io import parse_url
from ome_zarr.writer import (
    write_multiscale,
    write_multiscale_labels,
    write_plate_metadata,
    write_well_metadata,
)

fmt = FormatV04()
for item in params["items"]:
    root = zarr.group(store=parse_url(item["dest"], mode="w").store)
    if item["kind"] == "plate":
        plate = item["plate"]
        write_plate_metadata(
            root,
            [row["name"] for row in plate["rows"]],
            [column["name"] for column in plate["columns"]],
            [well["path"] for well in plate["wells"]],
            fmt=fmt,
            acquisitions=plate.get("acquisitions"),
            field_count=plate.get("field_count"),
            name=plate.get("name"),
        )
        for path, images in item["wells"].items():
            write_well_metadata(root.require_group(path), images, fmt=fmt)
    if item["kind"] == "bioformats2raw":
        root.attrs["bioformats2raw.layout"] = 3
        root.require_group("OME").attrs["series"] = item["series"]
    for path, text in item["files"].items():
        with open(os.path.join(item["dest"], path), "w") as file:
            file.write(text)
    for image in sorted(item["images"], key=lambda image: image["image_label"] is not None):
        pyramid = [np.load(file) for file in image["levels"]]
        options = {
            "fmt": fmt,
            "axes": image["axes"],
            "coordinate_transformations": image["transforms"],
            "storage_options": [{"chunks": chunks} for chunks in image["chunks"]],
        }
        if image["global_transforms"] is not None:
            options["coordinateTransformations"] = image["global_transforms"]
        if image["image_label"] is None:
            group = root.require_group(image["path"]) if image["path"] else root
            write_multiscale(pyramid, group, name=image["name"], **options)
            if image["omero"] is not None:
                group.attrs["omero"] = image["omero"]
        else:
            parent, _, name = image["path"].rpartition("labels/")
            group = root.require_group(parent.rstrip("/")) if parent else root
            write_multiscale_labels(pyramid, group, name, label_metadata=image["image_label"], **options)
"""


def write_ome_04(zarr2: Zarr2, items: list[tuple[OmeData, Path]], npy: Path) -> None:
    """Have ome-zarr-py 0.10 write the 0.4 twin of each OmeData at its destination, in one
    run: the same levels (handed over as .npy files in `npy`), chunks and transforms, the
    `omero` channels set on the image group as its documentation does, label images
    through `write_multiscale_labels`, plates through its plate and well writers, and
    bioformats2raw's layout (which it has no writer for) by hand."""
    specs = []
    for index, (data, dest) in enumerate(items):
        images = []
        for image in data.images:
            ome = data.attributes[image.path]
            multiscale = ome["multiscales"][0]
            levels = []
            for level in image.levels:
                file = npy / str(index) / image.path / f"{level.path}.npy"
                file.parent.mkdir(parents=True, exist_ok=True)
                np.save(file, level.data)
                levels.append(str(file))
            image_label = ome.get("image-label")
            images.append(
                {
                    "path": image.path,
                    "name": image.name,
                    "axes": multiscale["axes"],
                    "transforms": [d["coordinateTransformations"] for d in multiscale["datasets"]],
                    "global_transforms": multiscale.get("coordinateTransformations"),
                    "chunks": [level.chunks for level in image.levels],
                    "levels": levels,
                    "omero": ome.get("omero"),
                    # ome-zarr-py adds the version of its format itself.
                    "image_label": (
                        {k: v for k, v in image_label.items() if k != "version"}
                        if image_label is not None
                        else None
                    ),
                }
            )
        root_ome = data.attributes[""]
        specs.append(
            {
                "dest": str(dest),
                "kind": data.kind,
                "images": images,
                "plate": root_ome.get("plate"),
                "wells": {
                    path: ome["well"]["images"]
                    for path, ome in data.attributes.items()
                    if "well" in ome
                },
                "series": data.attributes.get("OME", {}).get("series"),
                "files": {path: content.decode() for path, content in data.files.items()},
            }
        )
    zarr2.run(WRITE_04, items=specs)


def assert_images_read(data: OmeData, report: dict[str, Any]) -> None:
    """The 0.4 reader found every image of `data` as it is described: name, axes,
    per-level transforms, shapes, dtypes and pixels, channels, labels and label colors
    and properties."""
    nodes = report["nodes"]
    for image in data.images:
        node = nodes[image.path]
        assert "Multiscales" in node["specs"]
        assert node["name"] == image.name
        assert node["axes"] == [axis.ome() for axis in image.axes]
        assert node["coordinateTransformations"] == [
            [
                {"type": "scale", "scale": list(level.scale)},
                {"type": "translation", "translation": list(level.translation)},
            ]
            for level in image.levels
        ]
        if image.global_scale is not None:
            multiscale = node["zattrs"]["multiscales"][0]
            assert multiscale["coordinateTransformations"] == [
                {"type": "scale", "scale": list(image.global_scale)}
            ]
        assert node["shapes"] == [list(level.shape) for level in image.levels]
        assert node["dtypes"] == [str(image.dtype)] * LEVELS
        for level, file in zip(image.levels, node["npy"], strict=True):
            np.testing.assert_array_equal(np.load(file), level.data)
        assert node["channel_names"] == (
            [channel.label for channel in image.channels] if image.channels else None
        )
        if image.channels:
            assert node["colormap"] == [
                [[0, 0, 0], [int(c.color[i : i + 2], 16) / 255 for i in (0, 2, 4)]]
                for c in image.channels
            ]
            assert node["contrast_limits"] == [list(c.window) for c in image.channels]
        for label_path in image.labels:
            parent, _, label_name = label_path.rpartition("/")
            assert label_name in nodes[parent]["labels"]
        if image.image_label is not None:
            assert node["specs"] == ["Label", "Multiscales"]
            assert node["label_colors"] == {
                str(c["label-value"]): [v / 255 for v in c["rgba"]]
                for c in image.image_label["colors"]
            }
            assert node["label_properties"] == {
                str(p["label-value"]): {k: v for k, v in p.items() if k != "label-value"}
                for p in image.image_label["properties"]
            }


def assert_plate_read(data: OmeData, report: dict[str, Any]) -> None:
    """The plate node stitches the first field of each well into the plate's grid, a
    well node its fields side by side, as napari shows them."""
    nodes = report["nodes"]
    assert nodes[""]["specs"] == ["Plate"]
    plate_04 = nodes[""]["plate"]
    plate_05 = data.attributes[""]["plate"]
    assert plate_04 == plate_05 | {"version": "0.4"}
    stitched = np.load(nodes[""]["npy"][0])
    first = data.image("A/1/0").levels[0].data
    height, width = first.shape[-2:]
    assert stitched.shape == (2, len(PLATE_ROWS) * height, len(PLATE_COLUMNS) * width)
    np.testing.assert_array_equal(stitched[:, :height, :width], first)
    np.testing.assert_array_equal(stitched[:, height:, width:], data.image("B/2/0").levels[0].data)
    assert not stitched[:, :height, width:].any()  # no well A/2
    for well in PLATE_WELLS:
        assert nodes[well]["specs"] == ["Well"]
        assert nodes[well]["well"] == data.attributes[well]["well"] | {"version": "0.4"}
        np.testing.assert_array_equal(
            np.load(nodes[well]["npy"][0]),
            np.concatenate(
                [data.image(f"{well}/{f}").levels[0].data for f in PLATE_FIELDS], axis=-1
            ),
        )
