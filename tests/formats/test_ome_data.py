"""The OME-Zarr test data and the 0.4 reader environment.

The 0.5 builders (tests/support/ome_data.py) must write what they describe: valid for
ome-zarr-models v05, and pixels that zarr-python 3 and tensorstore read back as
described; breaking the data must make those checks fail. ome-zarr-py 0.10 (on zarr 2)
writes the 0.4 twin of every case, and the 0.4 reader script must find in it what the
description says. A last test records the layout ome-zarr-py writes by default, which
the v2 view's OME-Zarr 0.4 has to look like.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.support.ome_data import (
    CASES,
    LEVELS,
    OmeData,
    image_czyx,
    image_with_labels,
    image_yx,
    plate,
    validate,
)
from tests.support.ome_read import assert_images_read, assert_plate_read, read_ome_04, write_ome_04
from tests.support.zarr2 import Zarr2

by_case = pytest.mark.parametrize("name", CASES)


def read_zarr(where: Path) -> np.ndarray:
    return zarr.open_array(where, mode="r", zarr_format=3)[...]


def read_tensorstore(where: Path) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(where)}}
    return ts.open(spec, open=True).result().read().result()


READERS = {"zarr": read_zarr, "tensorstore": read_tensorstore}


def assert_pixels(data: OmeData, read: Callable[[Path], np.ndarray]) -> None:
    for image in data.images:
        for level in image.levels:
            where = data.root / image.path / level.path
            np.testing.assert_array_equal(read(where), level.data, err_msg=str(where))


def assert_as_described(data: OmeData) -> None:
    """Every group's attributes, and every level's array metadata and pixels (read by
    zarr-python 3 and by tensorstore), are what `data` describes."""
    for path, ome in data.attributes.items():
        assert zarr.open_group(data.root / path, mode="r").attrs.asdict() == {"ome": ome}, path
    for image in data.images:
        assert len(image.levels) == LEVELS
        for level in image.levels:
            where = data.root / image.path / level.path
            array = zarr.open_array(where, mode="r", zarr_format=3)
            assert array.metadata.dimension_names == image.axis_names, where
            assert (array.chunks, array.shards) == (level.chunks, level.shards), where
            assert array.dtype == level.data.dtype, where
    for read in READERS.values():
        assert_pixels(data, read)


@by_case
def test_builder_writes_what_it_describes(name: str, tmp_path: Path) -> None:
    data = CASES[name](tmp_path / "data")  # validates with ome-zarr-models
    assert data.root == tmp_path / "data"
    assert_as_described(data)
    for image in data.images:  # edge chunks on every level 0
        level = image.levels[0]
        assert any(n % c for n, c in zip(level.shape, level.chunks, strict=True))


def test_dandi_like_layout(tmp_path: Path) -> None:
    data = CASES["dandi"](tmp_path)
    level = data.images[0].levels[0]
    assert (level.shape, level.chunks, level.shards) == ((130,) * 3, (64,) * 3, (2048,) * 3)
    codecs = json.loads((tmp_path / "0" / "zarr.json").read_text())["codecs"]
    assert [c["name"] for c in codecs[0]["configuration"]["codecs"]] == ["bytes", "zstd"]
    shard = tmp_path / "0" / "c" / "0" / "0" / "0"
    assert [p for p in (tmp_path / "0" / "c").rglob("*") if p.is_file()] == [shard]
    assert shard.stat().st_size > 32**3 * 16  # the index: 32^3 entries of 16 bytes


@by_case
def test_levels_are_where_their_transforms_put_them(name: str, tmp_path: Path) -> None:
    """Each level's pixel i lies, by its scale and translation, on a pixel centre of level
    0 that has the same value: the described transforms are the pixels' own."""
    for image in CASES[name](tmp_path).images:
        first = image.levels[0]
        for level in image.levels[1:]:
            indices = []
            for n, scale, translation, scale0, translation0 in zip(
                level.shape,
                level.scale,
                level.translation,
                first.scale,
                first.translation,
                strict=True,
            ):
                position = (np.arange(n) * scale + translation - translation0) / scale0
                assert np.array_equal(position, np.round(position)), (image.path, level.path)
                indices.append(position.astype(int))
            np.testing.assert_array_equal(first.data[np.ix_(*indices)], level.data)


def _rewrite(file: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(file.read_text())
    change(document)
    file.write_text(json.dumps(document))


def _no_dimension_names(root: Path) -> None:
    _rewrite(root / "1" / "zarr.json", lambda d: d.pop("dimension_names"))


def _old_version(root: Path) -> None:
    _rewrite(root / "zarr.json", lambda d: d["attributes"]["ome"].update(version="0.4"))


def _one_omero_channel_missing(root: Path) -> None:
    _rewrite(root / "zarr.json", lambda d: d["attributes"]["ome"]["omero"]["channels"].pop())


def _float_labels(root: Path) -> None:
    level = root / "labels" / "cells" / "2"
    array = zarr.open_array(level, mode="r")
    zarr.create_array(
        level, shape=array.shape, dtype="float32", dimension_names=("z", "y", "x"), overwrite=True
    )


def _unknown_acquisition(root: Path) -> None:
    _rewrite(
        root / "B" / "2" / "zarr.json",
        lambda d: d["attributes"]["ome"]["well"]["images"][1].update(acquisition=7),
    )


def _label_levels_missing(root: Path) -> None:
    _rewrite(
        root / "labels" / "cells" / "zarr.json",
        lambda d: d["attributes"]["ome"]["multiscales"][0]["datasets"].pop(),
    )


@pytest.mark.parametrize(
    ("build", "breakage", "message"),
    [
        pytest.param(image_yx, _no_dimension_names, "has no dimension_names", id="dimension_names"),
        pytest.param(image_yx, _old_version, "Input should be '0.5'", id="version"),
        pytest.param(image_czyx, _one_omero_channel_missing, "2 omero channels for 3", id="omero"),
        pytest.param(image_with_labels, _float_labels, "Got float32", id="label_dtype"),
        pytest.param(
            image_with_labels,
            _label_levels_missing,
            r"label multiscale levels \(2\)",
            id="label_levels",
        ),
        pytest.param(plate, _unknown_acquisition, "Acquisition ID '7", id="acquisition"),
    ],
)
def test_validation_rejects_broken_data(
    build: Callable[[Path], OmeData],
    breakage: Callable[[Path], None],
    message: str,
    tmp_path: Path,
) -> None:
    data = build(tmp_path)
    breakage(tmp_path)
    with pytest.raises((ValueError, RuntimeError), match=message):
        validate(data)


def test_bioformats2raw_series_must_name_images(tmp_path: Path) -> None:
    data = CASES["bioformats2raw"](tmp_path)
    _rewrite(tmp_path / "OME" / "zarr.json", lambda d: d["attributes"]["ome"]["series"].append("2"))
    with pytest.raises(ValueError, match="OME group attributes"):
        validate(data)


@pytest.mark.parametrize("reader", READERS)
def test_pixel_check_sees_one_wrong_pixel(reader: str, tmp_path: Path) -> None:
    """One pixel changed in the last (edge) chunk of a sharded level 0 fails the check."""
    data = image_yx(tmp_path)
    level = data.images[0].levels[0]
    zarr.open_array(tmp_path / level.path, mode="r+")[-1, -1] = level.data[-1, -1] ^ 1
    with pytest.raises(AssertionError, match=r"Mismatched elements: 1 "):
        assert_pixels(data, READERS[reader])


@pytest.fixture(scope="module")
def twins(
    tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2
) -> dict[str, tuple[OmeData, Path, dict[str, Any]]]:
    """Each case, its 0.4 twin written by ome-zarr-py, and what the reader script found
    in the twin (two zarr-2 runs for all cases)."""
    base = tmp_path_factory.mktemp("twins")
    built = {name: build(base / "v05" / name) for name, build in CASES.items()}
    write_ome_04(zarr2, [(data, base / "v04" / name) for name, data in built.items()], base / "npy")
    reports = read_ome_04(zarr2, [(base / "v04" / name, base / "out" / name) for name in built])
    return {
        name: (data, base / "v04" / name, report)
        for (name, data), report in zip(built.items(), reports, strict=True)
    }


@by_case
def test_reader_script_finds_every_image(
    name: str, twins: dict[str, tuple[OmeData, Path, dict[str, Any]]]
) -> None:
    data, _, report = twins[name]
    assert_images_read(data, report)


def test_reader_script_sees_the_plate(
    twins: dict[str, tuple[OmeData, Path, dict[str, Any]]],
) -> None:
    data, _, report = twins["plate"]
    assert_plate_read(data, report)


def test_reader_script_follows_bioformats2raw(
    twins: dict[str, tuple[OmeData, Path, dict[str, Any]]],
) -> None:
    data, root, report = twins["bioformats2raw"]
    assert report["bioformats2raw"] == {"path": "", "layout": 3, "series": ["0", "1"]}
    assert sorted(report["nodes"]) == ["0", "1"]
    assert (root / "OME" / "METADATA.ome.xml").read_bytes() == data.files["OME/METADATA.ome.xml"]


#: ome-zarr-py's own defaults: write_image with its default Scaler (4 downsamplings of y
#: and x) and write_labels, as its documentation shows them.
WRITE_DEFAULT = """
import numpy as np
import zarr
from ome_zarr.io import parse_url
from ome_zarr.writer import write_image, write_labels

image = np.load(params["image"])
root = zarr.group(store=parse_url(params["dest"], mode="w").store)
write_image(image, root, axes="czyx", storage_options={"chunks": (1, 4, 16, 16)})
root.attrs["omero"] = {"channels": [{"label": "DAPI", "color": "0000FF"}]}
write_labels(
    (image[:1] > 30000).astype("uint8"),
    root,
    "cells",
    axes="czyx",
    label_metadata={"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}]},
)
"""


def test_layout_ome_zarr_py_writes(zarr2: Zarr2, tmp_path: Path) -> None:
    """What ome-zarr-py 0.10 stores for 0.4: zarr v2 with "/" as dimension separator,
    blosc-lz4 chunks, no .zattrs on arrays, `multiscales` (version 0.4, name, axes,
    datasets with a scale per level) and `omero` at the image, `labels` at labels/ and
    `image-label` (version 0.4) beside `multiscales` at the label image. The reader script
    reads it back as zarr-python 3 does."""
    image = np.random.default_rng(7).integers(0, 2**16, (1, 5, 40, 50), dtype=np.uint16)
    np.save(tmp_path / "image.npy", image)
    dest = tmp_path / "default.zarr"
    zarr2.run(WRITE_DEFAULT, image=str(tmp_path / "image.npy"), dest=str(dest))

    def document(path: str) -> dict[str, Any]:
        return json.loads((dest / path).read_text())

    assert document(".zgroup") == {"zarr_format": 2}
    attrs = document(".zattrs")
    assert sorted(attrs) == ["multiscales", "omero"]
    (multiscale,) = attrs["multiscales"]
    assert sorted(multiscale) == ["axes", "datasets", "name", "version"]
    assert (multiscale["version"], multiscale["name"]) == ("0.4", "/")
    assert multiscale["axes"][0] == {"name": "c", "type": "channel"}
    assert [d["path"] for d in multiscale["datasets"]] == ["0", "1", "2", "3", "4"]
    assert multiscale["datasets"][1]["coordinateTransformations"] == [
        {"type": "scale", "scale": [1.0, 1.0, 2.0, 2.0]}
    ]
    zarray = document("0/.zarray")
    assert zarray == {
        "chunks": [1, 4, 16, 16],
        "compressor": {"blocksize": 0, "clevel": 5, "cname": "lz4", "id": "blosc", "shuffle": 1},
        "dimension_separator": "/",
        "dtype": "<u2",
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "shape": [1, 5, 40, 50],
        "zarr_format": 2,
    }
    assert (dest / "0" / "0" / "0" / "0" / "0").is_file()  # nested chunk keys
    assert not (dest / "0" / ".zattrs").exists()
    assert document("labels/.zattrs") == {"labels": ["cells"]}
    label_attrs = document("labels/cells/.zattrs")
    assert label_attrs["image-label"] == {
        "colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}],
        "version": "0.4",
    }
    assert label_attrs["multiscales"][0]["name"] == "cells"

    (report,) = read_ome_04(zarr2, [(dest, tmp_path / "out")])
    assert sorted(report["nodes"]) == ["", "labels", "labels/cells"]
    for path, node in report["nodes"].items():
        for index, file in enumerate(node["npy"]):
            level = zarr.open_array(dest / path / str(index), mode="r", zarr_format=2)
            np.testing.assert_array_equal(np.load(file), level[...])
    np.testing.assert_array_equal(np.load(report["nodes"][""]["npy"][0]), image)
    assert report["nodes"][""]["channel_names"] == ["DAPI"]
    assert report["nodes"]["labels"]["labels"] == ["cells"]
