"""Unit tests of the OME-Zarr 0.5 <-> 0.4 metadata translation (shardfs.formats.ome).

The 0.5 documents are written as the 0.5 spec and schemas shape them (no
version inside the objects), the 0.4 ones as the 0.4 spec does (a version in
each multiscales item, image-label, plate and well; none in omero and labels).
Both are validated with ome-zarr-models.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ome_zarr_models.exceptions import ValidationWarning
from ome_zarr_models.v04 import bioformats2raw as b2r04
from ome_zarr_models.v04 import hcs as hcs04
from ome_zarr_models.v04 import image as image04
from ome_zarr_models.v04 import image_label as image_label04
from ome_zarr_models.v04 import labels as labels04
from ome_zarr_models.v04 import well as well04
from ome_zarr_models.v05 import bioformats2raw as b2r05
from ome_zarr_models.v05 import hcs as hcs05
from ome_zarr_models.v05 import image as image05
from ome_zarr_models.v05 import image_label as image_label05
from ome_zarr_models.v05 import labels as labels05
from ome_zarr_models.v05 import well as well05

from shardfs.formats.ome import (
    OME_KEYS,
    describe,
    dimension_names,
    v04_attributes,
    v05_attributes,
)
from shardfs.primitives.errors import InvalidWrite

AXES = {
    "t": {"name": "t", "type": "time", "unit": "second"},
    "c": {"name": "c", "type": "channel"},
    "z": {"name": "z", "type": "space", "unit": "micrometer"},
    "y": {"name": "y", "type": "space", "unit": "micrometer"},
    "x": {"name": "x", "type": "space", "unit": "micrometer"},
}
#: The axes of the images with 2, 3, 4 and 5 dimensions.
IMAGE_AXES = ["yx", "cyx", "czyx", "tczyx"]

OMERO = {
    "id": 1,
    "name": "example.tif",
    "channels": [
        {
            "active": True,
            "coefficient": 1,
            "color": "0000FF",
            "family": "linear",
            "inverted": False,
            "label": "DAPI",
            "window": {"end": 1500, "max": 65535, "min": 0, "start": 0},
        },
        {
            "active": False,
            "coefficient": 1,
            "color": "00FF00",
            "family": "linear",
            "inverted": False,
            "label": "GFP",
            "window": {"end": 800, "max": 4095, "min": 0, "start": 100},
        },
    ],
    "rdefs": {"defaultT": 0, "defaultZ": 0, "model": "color"},
}
DOWNSCALING = {
    "description": "the fields in metadata depend on the downscaling implementation",
    "method": "skimage.transform.pyramid_gaussian",
    "version": "0.16.1",  # the method's version: not an OME version
    "args": "[true]",
    "kwargs": {"multichannel": True},
}


def multiscale(axes: str, name: str = "example") -> dict[str, Any]:
    """A 0.5 multiscales item with 3 levels: space halved per level (0.5, 1, 2 micrometer)
    and shifted by a quarter of the coarser pixel; time scaled by 0.1 s for every level."""

    def scale(level: int) -> list[float]:
        return [0.5 * 2**level if a in "zyx" else 1.0 for a in axes]

    def translation(level: int) -> list[float]:
        return [0.25 * (2**level - 1) if a in "zyx" else 0.0 for a in axes]

    return copy.deepcopy(
        {
            "name": name,
            "axes": [AXES[a] for a in axes],
            "datasets": [
                {
                    "path": str(level),
                    "coordinateTransformations": [
                        {"type": "scale", "scale": scale(level)},
                        {"type": "translation", "translation": translation(level)},
                    ],
                }
                for level in range(3)
            ],
            "coordinateTransformations": [
                {"type": "scale", "scale": [0.1 if a == "t" else 1.0 for a in axes]}
            ],
            "type": "gaussian",
            "metadata": DOWNSCALING,
        }
    )


def image(axes: str) -> dict[str, Any]:
    """The 0.5 attributes of an image group (with omero if it has channels)."""
    ome: dict[str, Any] = {"version": "0.5", "multiscales": [multiscale(axes)]}
    if "c" in axes:
        ome["omero"] = copy.deepcopy(OMERO)
    return {"ome": ome, "creator": {"name": "shardfs tests"}}


LABELS = {"ome": {"version": "0.5", "labels": ["cells", "nuclei"]}}
IMAGE_LABEL = {
    "colors": [
        {"label-value": 1, "rgba": [255, 0, 0, 255]},
        {"label-value": 2, "rgba": [0, 255, 0, 128]},
    ],
    "properties": [
        {"label-value": 1, "class": "cell", "area (pixels)": 1200},
        {"label-value": 2, "class": "nucleus"},
    ],
    "source": {"image": "../../"},
}
LABEL_IMAGE = {
    "ome": {
        "version": "0.5",
        "image-label": IMAGE_LABEL,
        "multiscales": [multiscale("zyx", "cells")],
    }
}
PLATE = {
    "ome": {
        "version": "0.5",
        "plate": {
            "name": "test plate",
            "rows": [{"name": "A"}, {"name": "B"}],
            "columns": [{"name": "1"}, {"name": "2"}, {"name": "3"}],
            "wells": [
                {"path": "A/1", "rowIndex": 0, "columnIndex": 0},
                {"path": "B/3", "rowIndex": 1, "columnIndex": 2},
            ],
            "field_count": 2,
            "acquisitions": [
                {"id": 0, "name": "first", "maximumfieldcount": 2, "starttime": 1343731272},
                {"id": 1, "name": "second", "maximumfieldcount": 1},
            ],
        },
    }
}
WELL_A1 = {
    "ome": {
        "version": "0.5",
        "well": {"images": [{"path": "0", "acquisition": 0}, {"path": "1", "acquisition": 1}]},
    }
}
WELL_B3 = {
    "ome": {
        "version": "0.5",
        "well": {"images": [{"path": "0", "acquisition": 0}, {"path": "1", "acquisition": 0}]},
    }
}
BF2RAW = {"ome": {"version": "0.5", "bioformats2raw.layout": 3}}
OME_GROUP = {"ome": {"version": "0.5", "series": ["0", "1"]}}

#: The ome-zarr-models attribute models of each kind of node, 0.4 then 0.5.
MODELS = {
    "image": (image04.ImageAttrs, image05.ImageAttrs),
    "labels": (labels04.LabelsAttrs, labels05.LabelsAttrs),
    "image-label": (image_label04.ImageLabelAttrs, image_label05.ImageLabelAttrs),
    "plate": (hcs04.HCSAttrs, hcs05.HCSAttrs),
    "well": (well04.WellAttrs, well05.WellAttrs),
    "bioformats2raw": (b2r04.BioFormats2RawAttrs, b2r05.BioFormats2RawAttrs),
}
#: Every spec-shaped 0.5 node above, with the kind ome-zarr-models validates it as.
NODES = [
    *[(f"image {axes}", "image", image(axes)) for axes in IMAGE_AXES],
    ("labels", "labels", LABELS),
    ("label image", "image-label", LABEL_IMAGE),
    ("plate", "plate", PLATE),
    ("well A/1", "well", WELL_A1),
    ("well B/3", "well", WELL_B3),
    ("bioformats2raw", "bioformats2raw", BF2RAW),
]


def validate(kind: str, v04: dict[str, Any], v05: dict[str, Any]) -> None:
    """Both forms pass ome-zarr-models (which raises pydantic's ValidationError)."""
    model04, model05 = MODELS[kind]
    model04.model_validate(v04)
    with warnings.catch_warnings():
        # ome-zarr-models 1.7 asks 0.5 plates for a `version`, which the 0.5 schema has not
        warnings.simplefilter("ignore", ValidationWarning)
        model05.model_validate(v05["ome"])


# -- the 0.4 form of spec-shaped documents ---------------------------------------------


def test_image_5d_v04_form() -> None:
    shown, dropped = v04_attributes(image("tczyx"))
    assert dropped == []
    assert shown == {
        "creator": {"name": "shardfs tests"},
        "multiscales": [
            {
                "version": "0.4",
                "name": "example",
                "axes": [
                    {"name": "t", "type": "time", "unit": "second"},
                    {"name": "c", "type": "channel"},
                    {"name": "z", "type": "space", "unit": "micrometer"},
                    {"name": "y", "type": "space", "unit": "micrometer"},
                    {"name": "x", "type": "space", "unit": "micrometer"},
                ],
                "datasets": [
                    {
                        "path": "0",
                        "coordinateTransformations": [
                            {"type": "scale", "scale": [1.0, 1.0, 0.5, 0.5, 0.5]},
                            {"type": "translation", "translation": [0.0, 0.0, 0.0, 0.0, 0.0]},
                        ],
                    },
                    {
                        "path": "1",
                        "coordinateTransformations": [
                            {"type": "scale", "scale": [1.0, 1.0, 1.0, 1.0, 1.0]},
                            {
                                "type": "translation",
                                "translation": [0.0, 0.0, 0.25, 0.25, 0.25],
                            },
                        ],
                    },
                    {
                        "path": "2",
                        "coordinateTransformations": [
                            {"type": "scale", "scale": [1.0, 1.0, 2.0, 2.0, 2.0]},
                            {
                                "type": "translation",
                                "translation": [0.0, 0.0, 0.75, 0.75, 0.75],
                            },
                        ],
                    },
                ],
                "coordinateTransformations": [
                    {"type": "scale", "scale": [0.1, 1.0, 1.0, 1.0, 1.0]}
                ],
                "type": "gaussian",
                "metadata": DOWNSCALING,
            }
        ],
        "omero": OMERO,
    }


@pytest.mark.parametrize("axes", IMAGE_AXES)
def test_images_of_2_to_5_axes(axes: str) -> None:
    attributes = image(axes)
    shown, dropped = v04_attributes(attributes)
    assert dropped == []
    validate("image", shown, attributes)
    assert [m["version"] for m in shown["multiscales"]] == ["0.4"]
    assert {k: v for k, v in shown["multiscales"][0].items() if k != "version"} == multiscale(axes)
    assert shown.get("omero") == attributes["ome"].get("omero")
    assert "version" not in shown.get("omero", {})
    assert v05_attributes(shown, attributes) == attributes
    # what a 0.4 writer creates from scratch becomes the 0.5 document
    assert v05_attributes(shown, None) == attributes


def test_labels_v04_form() -> None:
    assert v04_attributes(LABELS) == ({"labels": ["cells", "nuclei"]}, [])
    shown, dropped = v04_attributes(LABEL_IMAGE)
    assert dropped == []
    assert shown == {
        "image-label": {"version": "0.4", **IMAGE_LABEL},
        "multiscales": [{"version": "0.4", **multiscale("zyx", "cells")}],
    }


def test_hcs_v04_form() -> None:
    plate, dropped = v04_attributes(PLATE)
    assert dropped == []
    assert plate == {"plate": {"version": "0.4", **PLATE["ome"]["plate"]}}
    assert v04_attributes(WELL_A1) == (
        {
            "well": {
                "version": "0.4",
                "images": [{"path": "0", "acquisition": 0}, {"path": "1", "acquisition": 1}],
            }
        },
        [],
    )


def test_bioformats2raw_v04_form() -> None:
    assert v04_attributes(BF2RAW) == ({"bioformats2raw.layout": 3}, [])
    assert v04_attributes(OME_GROUP) == ({"series": ["0", "1"]}, [])
    assert v05_attributes({"series": ["0", "1"]}, None) == OME_GROUP
    assert v05_attributes({"bioformats2raw.layout": 3}, {}) == BF2RAW


@pytest.mark.parametrize(("name", "kind", "attributes"), NODES, ids=[n[0] for n in NODES])
def test_both_forms_validate_and_round_trip(
    name: str, kind: str, attributes: dict[str, Any]
) -> None:
    original = copy.deepcopy(attributes)
    shown, dropped = v04_attributes(attributes)
    assert dropped == []
    validate(kind, shown, attributes)
    assert "ome" not in shown
    assert v05_attributes(shown, attributes) == attributes
    assert v05_attributes(shown, None) == attributes
    assert attributes == original  # neither function changes what it is given


# -- what 0.4 cannot say ---------------------------------------------------------------


def odd_image() -> dict[str, Any]:
    """A valid 0.5 image with what 0.4 cannot show: a key under ome that 0.4 lacks, an
    attribute beside ome named as an OME key, and a plate version of a 0.5 draft."""
    attributes = image("cyx")
    attributes["ome"]["schema_url"] = "https://ngff.openmicroscopy.org/0.5/schemas/image.schema"
    attributes["omero"] = {"mine": True}
    attributes["ome"]["plate"] = {"version": "0.5-dev", **PLATE["ome"]["plate"]}
    return attributes


def test_dropped_is_named_and_not_shown() -> None:
    attributes = odd_image()
    original = copy.deepcopy(attributes)
    shown, dropped = v04_attributes(attributes)
    assert attributes == original
    assert dropped == [
        "attribute 'omero': a 0.4 reader would take it for OME metadata",
        "ome.schema_url: 0.4 has no such key",
        'ome.plate.version "0.5-dev": 0.4 has "0.4" there',
    ]
    assert "schema_url" not in shown
    assert shown["omero"] == OMERO  # the OME object, not the attribute it hides
    assert shown["plate"]["version"] == "0.4"
    assert set(shown) == {"creator", "multiscales", "omero", "plate"}
    validate("image", shown, image("cyx"))
    assert v05_attributes(shown, attributes) == attributes


def test_a_04_edit_keeps_what_04_could_not_show() -> None:
    attributes = odd_image()
    shown = v04_attributes(attributes)[0]
    edited = copy.deepcopy(shown)
    edited["omero"]["channels"][0]["label"] = "Hoechst"
    edited["plate"]["name"] = "renamed"
    edited["multiscales"][0]["datasets"].pop()  # a level removed
    edited["creator"] = "someone else"
    original = copy.deepcopy(edited)
    stored = v05_attributes(edited, attributes)
    assert edited == original
    assert stored["ome"]["schema_url"] == attributes["ome"]["schema_url"]
    assert stored["omero"] == {"mine": True}
    assert stored["ome"]["plate"]["version"] == "0.5-dev"
    assert stored["ome"]["plate"]["name"] == "renamed"
    assert stored["ome"]["omero"]["channels"][0]["label"] == "Hoechst"
    assert [d["path"] for d in stored["ome"]["multiscales"][0]["datasets"]] == ["0", "1"]
    assert "version" not in stored["ome"]["multiscales"][0]
    assert stored["creator"] == "someone else"
    assert v04_attributes(stored)[0] == edited


def test_the_documents_own_version_inside_an_object_is_not_a_loss() -> None:
    """ome-zarr-models writes `plate.version` "0.5"; 0.4 says it as "0.4", and a write
    back restores it."""
    attributes = copy.deepcopy(PLATE)
    attributes["ome"]["plate"]["version"] = "0.5"
    shown, dropped = v04_attributes(attributes)
    assert dropped == []
    assert shown["plate"]["version"] == "0.4"
    assert v05_attributes(shown, attributes) == attributes


def test_an_edit_inside_a_list_keeps_what_its_items_hid() -> None:
    attributes = image("yx")
    attributes["ome"]["multiscales"].append(multiscale("yx", "second"))
    attributes["ome"]["multiscales"][1]["version"] = "0.5-dev"  # as 0.5 drafts wrote it
    shown, dropped = v04_attributes(attributes)
    assert dropped == ['ome.multiscales[1].version "0.5-dev": 0.4 has "0.4" there']
    shown["multiscales"][1]["name"] = "renamed"
    stored = v05_attributes(shown, attributes)
    assert stored["ome"]["multiscales"][1] == {
        **attributes["ome"]["multiscales"][1],
        "name": "renamed",
    }
    assert stored["ome"]["multiscales"][0] == attributes["ome"]["multiscales"][0]


def test_removing_the_ome_keys_removes_ome_only() -> None:
    attributes = odd_image()
    stored = v05_attributes({"creator": "x"}, attributes)
    assert stored == {"creator": "x", "omero": {"mine": True}}


def test_attributes_without_ome_05_are_shown_as_they_are() -> None:
    for attributes in [
        {},
        {"answer": 42, "multiscales": "not OME here"},
        {"ome": {"version": "0.4", "multiscales": []}},
        {"ome": {"version": "0.6.dev3", "multiscales": []}},
        {"ome": {"version": 0.5, "labels": ["a"]}},
        {"ome": "0.5"},
    ]:
        shown, dropped = v04_attributes(attributes)
        assert (shown, dropped) == (attributes, [])
        assert shown is not attributes


# -- writes of 0.4 documents -----------------------------------------------------------


def test_a_04_write_without_ome_keys_is_stored_as_it_is() -> None:
    for written in [{}, {"answer": 42}, {"labels": {"cat": 1}}, {"series": [1, 2]}]:
        stored = v05_attributes(written, {"old": True})
        assert stored == written
        assert stored is not written
    # a 0.5 document written whole through the v2 view stays as it is
    assert v05_attributes(PLATE, None) == PLATE


def test_labels_and_series_count_as_ome_only_as_lists_of_paths() -> None:
    assert v05_attributes({"labels": ["a", "b"]}, None) == {
        "ome": {"version": "0.5", "labels": ["a", "b"]}
    }
    assert v05_attributes({"labels": ["a", 1]}, None) == {"labels": ["a", 1]}
    # on a node that is OME, every OME key is OME, whatever its shape
    assert v05_attributes({"labels": {"a": 1}}, LABELS) == {
        "ome": {"version": "0.5", "labels": {"a": 1}}
    }


def test_omero_version_04_is_dropped_on_write() -> None:
    written = {"omero": {**OMERO, "version": "0.4"}}
    assert v05_attributes(written, None) == {"ome": {"version": "0.5", "omero": OMERO}}
    kept = {"omero": {**OMERO, "version": "0.1"}}
    assert v05_attributes(kept, None) == {"ome": {"version": "0.5", **kept}}


@pytest.mark.parametrize(
    ("written", "where"),
    [
        ({"multiscales": [{**multiscale("yx"), "version": "0.3"}]}, "multiscales[0]"),
        (
            {"multiscales": [{**multiscale("yx"), "version": "0.4"}, {"version": "0.5"}]},
            "multiscales[1]",
        ),
        ({"plate": {**PLATE["ome"]["plate"], "version": "0.5"}}, "plate"),
        ({"well": {"images": [{"path": "0"}], "version": "0.1"}}, "well"),
        ({"image-label": {**IMAGE_LABEL, "version": "0.5"}}, "image-label"),
        ({"well": {"images": [], "version": 0.4}}, "well"),
    ],
)
def test_other_ome_versions_are_refused(written: dict[str, Any], where: str) -> None:
    for source in (None, image("yx")):
        with pytest.raises(InvalidWrite, match="^" + re.escape(f"{where} in the written")):
            v05_attributes(written, source)


def test_ome_beside_04_keys_is_refused() -> None:
    with pytest.raises(InvalidWrite, match="'ome'"):
        v05_attributes({"labels": ["a"], "ome": {"version": "0.5"}}, None)


# -- dimension_names -------------------------------------------------------------------


@pytest.mark.parametrize("axes", IMAGE_AXES)
def test_dimension_names(axes: str) -> None:
    assert dimension_names(image(axes)) == {path: list(axes) for path in ("0", "1", "2")}


def test_dimension_names_of_other_nodes() -> None:
    for attributes in (LABELS, PLATE, WELL_A1, BF2RAW, {}, v04_attributes(image("yx"))[0]):
        assert dimension_names(attributes) == {}
    assert dimension_names(LABEL_IMAGE) == {
        "0": ["z", "y", "x"],
        "1": ["z", "y", "x"],
        "2": ["z", "y", "x"],
    }
    two = {"ome": {"version": "0.5", "multiscales": [multiscale("yx"), multiscale("cyx")]}}
    two["ome"]["multiscales"][1]["datasets"][0]["path"] = "c0"
    assert dimension_names(two) == {
        "0": ["y", "x"],
        "1": ["y", "x"],
        "2": ["y", "x"],
        "c0": list("cyx"),
    }
    unnamed = image("yx")
    unnamed["ome"]["multiscales"][0]["axes"][0]["name"] = None
    assert dimension_names(unnamed) == {}


# -- describe --------------------------------------------------------------------------


def group(attributes: dict[str, Any]) -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes}


def array(shape: list[int], data_type: str = "uint16") -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": data_type}


def test_describe_a_bioformats2raw_image_with_labels() -> None:
    nodes = {
        "": group(BF2RAW),
        "OME": group(OME_GROUP),
        "0": group(image("tczyx")),
        "0/0": array([2, 3, 64, 512, 512]),
        "0/1": array([2, 3, 32, 256, 256]),
        "0/labels": group(LABELS),
        "0/labels/cells": group(LABEL_IMAGE),
        "0/labels/cells/0": array([64, 512, 512], "uint32"),
        "0/labels/cells/1": array([32, 256, 256], "uint32"),
        "0/labels/cells/2": array([16, 128, 128], "uint32"),
        "1": group({"note": "not OME"}),
    }
    nodes["0"]["attributes"]["ome"]["extra"] = 1
    assert describe(nodes) == [
        "bioformats2raw layout 3 /: series 0, 1 (from /OME)",
        "image /0: 'example', 3 levels, type 'gaussian'",
        "  axes: t (time, second), c (channel), z (space, micrometer), "
        "y (space, micrometer), x (space, micrometer)",
        "  every level, after its own: scale [0.1, 1, 1, 1, 1]",
        "  level 0 (/0/0): shape 2x3x64x512x512 uint16, "
        "scale [0.1, 1, 0.5, 0.5, 0.5], translation [0, 0, 0, 0, 0]",
        "  level 1 (/0/1): shape 2x3x32x256x256 uint16, "
        "scale [0.1, 1, 1, 1, 1], translation [0, 0, 0.25, 0.25, 0.25]",
        "  level 2 (/0/2): no array, scale [0.1, 1, 2, 2, 2], translation [0, 0, 0.75, 0.75, 0.75]",
        "  channel 0: 'DAPI', color 0000FF, window 0..1500 of 0..65535",
        "  channel 1: 'GFP', color 00FF00, window 100..800 of 0..4095, inactive",
        "labels /0/labels: cells, nuclei",
        "label image /0/labels/cells: 'cells', 3 levels, type 'gaussian', 2 colors, "
        "2 properties, source ../../",
        "  axes: z (space, micrometer), y (space, micrometer), x (space, micrometer)",
        "  every level, after its own: scale [1, 1, 1]",
        "  level 0 (/0/labels/cells/0): shape 64x512x512 uint32, "
        "scale [0.5, 0.5, 0.5], translation [0, 0, 0]",
        "  level 1 (/0/labels/cells/1): shape 32x256x256 uint32, "
        "scale [1, 1, 1], translation [0.25, 0.25, 0.25]",
        "  level 2 (/0/labels/cells/2): shape 16x128x128 uint32, "
        "scale [2, 2, 2], translation [0.75, 0.75, 0.75]",
        "the v2 view of /0 leaves out ome.extra: 0.4 has no such key",
    ]


def test_describe_a_plate() -> None:
    nodes = {
        "": group(PLATE),
        "A": group({}),
        "A/1": group(WELL_A1),
        "A/1/0": group(image("yx")),
        "A/1/0/0": array([256, 256], "uint8"),
        "A/1/0/1": array([128, 128], "uint8"),
        "A/1/0/2": array([64, 64], "uint8"),
    }
    lines = describe(nodes)
    assert lines[:6] == [
        "plate /: 'test plate', 2 rows x 3 columns, 2 wells, at most 2 fields per well, "
        "2 acquisitions",
        "  acquisition 0: 'first', at most 2 fields",
        "  acquisition 1: 'second', at most 1 field",
        "  well A/1: 2 fields, acquisitions 0, 1",
        "  well B/3: no well group",
        "image /A/1/0: 'example', 3 levels, type 'gaussian'",
    ]
    assert (
        lines[8]
        == "  level 0 (/A/1/0/0): shape 256x256 uint8, scale [0.5, 0.5], translation [0, 0]"
    )
    assert len(lines) == 11


def test_describe_without_ome() -> None:
    assert describe({}) == []
    assert describe({"": group({"a": 1}), "x": array([2])}) == []
    assert describe({"": group(v04_attributes(PLATE)[0])}) == []


def test_describe_odd_nodes() -> None:
    nodes = {
        "": group({"ome": {"version": "0.5", "bioformats2raw.layout": 3}}),
        "0": group({"ome": {"version": "0.5", "omero": {"channels": [{"label": "a"}]}}}),
        "1": group({"ome": {"version": "0.5", "well": {"images": [{"path": "0"}]}}}),
        "2": group({"ome": {"version": "0.5", "series": ["x"]}}),
    }
    assert describe(nodes) == [
        "bioformats2raw layout 3 /: images 0, 1, 2",
        "image /0: no multiscales",
        "  channel 0: 'a', color None",
        "well /1: 1 field",
        "series /2: x",
    ]


# -- properties ------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["version", "name", "a"]) | st.text(max_size=3), inner, max_size=3
        )
    ),
    max_leaves=8,
)
OBJECT = st.dictionaries(
    st.sampled_from(["version", "name", "path"]) | st.text(max_size=3), JSON, max_size=3
)
#: Values of the OME keys under `ome`: objects where versions go, anything elsewhere.
OME_VALUES = {
    "multiscales": st.lists(OBJECT | JSON, max_size=3),
    "image-label": OBJECT,
    "plate": OBJECT,
    "well": OBJECT,
    "omero": OBJECT,
    **{key: JSON for key in ("labels", "series", "bioformats2raw.layout")},
}
USER_KEYS = st.sampled_from(sorted(OME_KEYS)) | st.text(max_size=4).filter(lambda k: k != "ome")


@st.composite
def ome_05(draw: st.DrawFn) -> dict[str, Any]:
    """Any 0.5 attributes, with inner versions, unknown keys under ome and clashing names."""
    objects = draw(st.fixed_dictionaries({}, optional=OME_VALUES))
    unknown = draw(st.dictionaries(st.sampled_from(["schema_url", "coordinateSystems"]), JSON))
    version = draw(st.sampled_from(["0.5", "0.5.1"]))
    user = draw(st.dictionaries(USER_KEYS, JSON, max_size=3))
    return {**user, "ome": {"version": version, **objects, **unknown}}


@given(ome_05())
@settings(max_examples=200)
def test_round_trip(attributes: dict[str, Any]) -> None:
    original = copy.deepcopy(attributes)
    shown, dropped = v04_attributes(attributes)
    assert v05_attributes(shown, attributes) == attributes
    assert attributes == original
    ome = attributes["ome"]
    clashing = [k for k in attributes if k in OME_KEYS]
    unknown = [k for k in ome if k not in OME_KEYS and k != "version"]
    assert set(shown) == (set(attributes) - {"ome", *clashing}) | (OME_KEYS & set(ome))
    for key, value in shown.items():
        if key not in OME_KEYS:
            assert value == attributes[key]
    # nothing invented: the OME objects as they are, but for their version
    versioned = []
    for key in OME_KEYS & set(ome):
        if key == "multiscales":
            pairs = list(zip(shown[key], ome[key], strict=True))
        else:
            pairs = [(shown[key], ome[key])]
        for mine, theirs in pairs:
            if key in ("multiscales", "image-label", "plate", "well") and isinstance(theirs, dict):
                assert mine["version"] == "0.4"
                versioned.append(theirs.get("version", "0.4"))
                mine, theirs = (
                    {k: v for k, v in d.items() if k != "version"} for d in (mine, theirs)
                )
            assert mine == theirs
    assert len(dropped) == len(clashing) + len(unknown) + sum(v != "0.4" for v in versioned)


#: Top-level 0.4 keys as a 0.4 tool writes them: versions say 0.4, labels list paths.
V04_VALUES = {
    "multiscales": st.lists(OBJECT.map(lambda o: {**o, "version": "0.4"}), max_size=2),
    **{
        key: OBJECT.map(lambda o: {**o, "version": "0.4"})
        for key in ("image-label", "plate", "well")
    },
    "omero": OBJECT.filter(lambda o: "version" not in o),
    **{key: st.lists(st.text(max_size=3), max_size=2) for key in ("labels", "series")},
    "bioformats2raw.layout": JSON,
}


@given(
    st.fixed_dictionaries({}, optional=V04_VALUES),
    st.dictionaries(st.text(max_size=4).filter(lambda k: k not in OME_KEYS | {"ome"}), JSON),
)
def test_04_documents_come_back_as_written(ome: dict[str, Any], user: dict[str, Any]) -> None:
    written = {**user, **ome}
    stored = v05_attributes(written, None)
    assert v04_attributes(stored) == (written, [])
    if ome:
        assert stored["ome"]["version"] == "0.5"
        assert all("version" not in o for o in stored["ome"].get("multiscales", []))
        assert all(
            "version" not in stored["ome"].get(k, {}) for k in ("plate", "well", "image-label")
        )


@given(ome_05(), st.data())
@settings(max_examples=200)
def test_04_edits_are_stored_and_keep_what_04_could_not_show(
    attributes: dict[str, Any], data: st.DataObject
) -> None:
    shown = v04_attributes(attributes)[0]
    edited = copy.deepcopy(shown)
    for key in data.draw(st.lists(st.sampled_from(sorted(OME_KEYS)) | USER_KEYS, max_size=3)):
        if data.draw(st.booleans()):
            edited.pop(key, None)
        elif key in OME_KEYS:
            edited[key] = data.draw(V04_VALUES.get(key, JSON))
        else:
            edited[key] = data.draw(JSON)
    stored = v05_attributes(edited, attributes)
    hidden = {k: v for k, v in attributes.items() if k in OME_KEYS}
    assert {k: stored[k] for k in hidden} == hidden
    if OME_KEYS & set(edited):
        assert v04_attributes(stored)[0] == edited
        unknown = {k: v for k, v in attributes["ome"].items() if k not in OME_KEYS}
        assert {k: stored["ome"][k] for k in unknown} == unknown
    elif OME_KEYS & set(shown):  # the 0.4 tool removed the OME metadata
        assert stored == {**edited, **hidden}
    else:  # there was none to show: `ome` (a version and keys 0.4 lacks) stays
        assert stored == {**edited, **hidden, "ome": attributes["ome"]}
