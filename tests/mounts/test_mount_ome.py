"""OME-Zarr 0.5 images served as OME-Zarr 0.4 through `view=v2`, and 0.4 writes stored as
0.5 (issue 20).

The data is written by zarr-python 3 with spec-shaped 0.5 metadata and validated by
ome-zarr-models v05 (tests/support/ome_data.py): images of 2 to 5 axes and 3 levels, labels, an
HCS plate, a bioformats2raw layout, sharded and unsharded levels mixed. Through one
read-only v2 mount, ome-zarr-py 0.10 on zarr-python 2 (the reader napari's plugin uses)
must find every image with the pixels and physical metadata the source holds, and
ome-zarr-models must validate the view as 0.4. Through read-write v2 mounts, ome-zarr-py
writes a label image and a new image; after the unmount the source validates as 0.5 and
reads back equal.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from ome_zarr_models import v04
from ome_zarr_models.exceptions import ValidationWarning
from ome_zarr_models.v05 import Image as Image05

from tests.conftest import Mounted, start_mount, stop_mount
from tests.support.ome_data import CASES, OmeData, image_czyx, image_zyx, validate, validate_models
from tests.support.ome_read import assert_images_read, assert_plate_read, read_ome_04
from tests.support.zarr2 import Zarr2

pytestmark = pytest.mark.fuse
by_case = pytest.mark.parametrize("name", CASES)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2
) -> Iterator[tuple[dict[str, OmeData], Mounted, dict[str, dict[str, Any]]]]:
    """Every case in one source, one read-only v2 mount of it, and what ome-zarr-py
    found in each case through the mount (one zarr-2 run)."""
    base = tmp_path_factory.mktemp("ome")
    source = base / "src"
    zarr.open_group(source, mode="w")
    built = {name: build(source / name) for name, build in CASES.items()}
    mounted = start_mount(source, base / "mnt", base / "mnt.log", "ro", "view=v2")
    try:
        reports = read_ome_04(zarr2, [(mounted.path / name, base / "out" / name) for name in built])
        yield built, mounted, dict(zip(built, reports, strict=True))
    finally:
        stop_mount(mounted)


@by_case
def test_a_04_reader_reads_every_image_through_the_view(
    name: str, served: tuple[dict[str, OmeData], Mounted, dict[str, dict[str, Any]]]
) -> None:
    built, _, reports = served
    assert_images_read(built[name], reports[name])
    if name == "plate":
        assert_plate_read(built[name], reports[name])
    if name == "bioformats2raw":
        assert reports[name]["bioformats2raw"] == {"path": "", "layout": 3, "series": ["0", "1"]}


@by_case
def test_ome_zarr_models_validates_the_view_as_04(
    name: str, served: tuple[dict[str, OmeData], Mounted, dict[str, dict[str, Any]]]
) -> None:
    built, mounted, _ = served
    validate_models(mounted.path / name, built[name], v04, zarr_format=2)


@by_case
def test_levels_have_the_slash_separator_and_objects_their_version(
    name: str, served: tuple[dict[str, OmeData], Mounted, dict[str, dict[str, Any]]]
) -> None:
    built, mounted, _ = served
    data = built[name]
    for image in data.images:
        where = mounted.path / name / image.path
        attrs = json.loads((where / ".zattrs").read_text())
        assert "ome" not in attrs
        assert [m["version"] for m in attrs["multiscales"]] == ["0.4"]
        assert attrs["multiscales"][0]["axes"] == [axis.ome() for axis in image.axes]
        if image.image_label is not None:
            assert attrs["image-label"]["version"] == "0.4"
        for level in image.levels:
            zarray = json.loads((where / level.path / ".zarray").read_text())
            assert zarray["dimension_separator"] == "/"
            assert zarray["shape"] == list(level.shape)
            assert zarray["chunks"] == list(level.chunks)  # inner chunks of sharded levels


def test_nothing_is_left_out_of_the_cases(
    served: tuple[dict[str, OmeData], Mounted, dict[str, dict[str, Any]]],
) -> None:
    _, mounted, _ = served
    assert "OME-Zarr 0.4 form leaves out" not in mounted.log()
    assert "ERROR" not in mounted.log() and "shown unchanged" not in mounted.log()


def test_the_bioformats2raw_metadata_file_is_served(
    served: tuple[dict[str, OmeData], Mounted, dict[str, dict[str, Any]]],
) -> None:
    built, mounted, _ = served
    data = built["bioformats2raw"]
    for path, content in data.files.items():
        assert (mounted.path / "bioformats2raw" / path).read_bytes() == content


def test_what_04_cannot_say_is_left_out_with_one_log_line(
    tmp_path: Path, mount: Callable[..., Mounted], zarr2: Zarr2
) -> None:
    """A key under `ome` that 0.4 lacks and an attribute named like an OME object: the
    0.4 form leaves them out (never shown as OME metadata), and one line names them."""
    data = image_zyx(tmp_path / "src")
    group = zarr.open_group(data.root, mode="a")
    ome = group.attrs["ome"]
    group.attrs.update({"ome": {**ome, "extension": {"x": 1}}, "omero": {"mine": True}})
    mounted = mount(data.root, "ro", "view=v2")
    attrs = json.loads((mounted.path / ".zattrs").read_text())
    assert "extension" not in json.dumps(attrs) and "omero" not in attrs
    (report,) = read_ome_04(zarr2, [(mounted.path, tmp_path / "out")])
    assert_images_read(data, report)
    lines = [line for line in mounted.log().splitlines() if "leaves out" in line]
    assert len(lines) == 1, mounted.log()
    assert "ome.extension" in lines[0] and "'omero'" in lines[0] and "zarr.json" in lines[0]


def test_a_dot_separated_level_is_named_in_the_log(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """0.4 requires `/`. The view keeps the separator an array is stored with (its
    listings follow the source's directories), so a level stored with `.` is shown with
    it, as stored, and one log line says why a 0.4 reader may not find its chunks."""
    source = tmp_path / "src"
    pixels = np.arange(30 * 20, dtype="uint16").reshape(30, 20)
    group = zarr.open_group(source, mode="w", zarr_format=3)
    level = group.create_array(
        "0",
        shape=pixels.shape,
        chunks=(8, 8),
        shards=(16, 16),
        dtype=pixels.dtype,
        dimension_names=["y", "x"],
        chunk_key_encoding={"name": "default", "separator": "."},
    )
    level[...] = pixels
    axes = [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
    transforms = [{"type": "scale", "scale": [1.0, 1.0]}]
    group.attrs["ome"] = {
        "version": "0.5",
        "multiscales": [
            {"axes": axes, "datasets": [{"path": "0", "coordinateTransformations": transforms}]}
        ],
    }
    Image05.from_zarr(zarr.open_group(source, mode="r"))
    mounted = mount(source, "ro", "view=v2")
    assert json.loads((mounted.path / "0" / ".zarray").read_text())["dimension_separator"] == "."
    served = zarr.open_array(mounted.path / "0", mode="r", zarr_format=2)[...]
    np.testing.assert_array_equal(served, pixels)
    lines = [line for line in mounted.log().splitlines() if "dimension separator" in line]
    assert len(lines) == 1 and "0/zarr.json" in lines[0], mounted.log()


#: ome-zarr-py 0.10 adds a label image to an image (as its documentation shows), and
#: writes a new image beside it.
WRITE_04 = """
import numpy as np
import zarr
from ome_zarr.io import parse_url
from ome_zarr.scale import Scaler
from ome_zarr.writer import write_image, write_labels

labels = np.load(params["labels"])
root = zarr.group(store=parse_url(params["image"], mode="w").store)
write_labels(
    labels, root, "nuclei", axes=params["axes"], scaler=Scaler(max_layer=2),  # 3 levels
    storage_options={"chunks": params["chunks"]},
    label_metadata={
        "colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}],
        "properties": [{"label-value": 1, "class": "nucleus"}],
    },
)
new = zarr.group(store=parse_url(params["new"], mode="w").store)
write_image(np.load(params["pixels"]), new, axes="yx", storage_options={"chunks": (16, 16)})
"""


@pytest.mark.parametrize("options", [(), ("shard_new=2",)], ids=["unsharded", "shard_new"])
def test_04_writes_land_as_valid_05(
    tmp_path: Path, mount: Callable[..., Mounted], zarr2: Zarr2, options: tuple[str, ...]
) -> None:
    source = tmp_path / "src"
    data = image_czyx(source / "image")
    zarr.open_group(source, mode="a").create_group("new")
    level0 = data.images[0].levels[0]
    labels = (level0.data[:1] > np.median(level0.data)).astype("uint32")
    pixels = np.random.default_rng(20).integers(0, 255, (40, 50), dtype="uint8")
    np.save(tmp_path / "labels.npy", labels)
    np.save(tmp_path / "pixels.npy", pixels)
    mounted = mount(source, "view=v2", *options)
    zarr2.run(
        WRITE_04,
        image=str(mounted.path / "image"),
        new=str(mounted.path / "new"),
        labels=str(tmp_path / "labels.npy"),
        pixels=str(tmp_path / "pixels.npy"),
        axes="".join(data.images[0].axis_names),
        chunks=list(level0.chunks),
    )
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ValidationWarning)
        image = Image05.from_zarr(zarr.open_group(source / "image", mode="r"))
        new = Image05.from_zarr(zarr.open_group(source / "new", mode="r"))
    assert image.labels is not None
    validate(replace(data, root=source / "image"))  # the image itself is unchanged

    def stored(path: str) -> dict[str, Any]:
        return json.loads((source / path / "zarr.json").read_text())

    assert stored("image/labels")["attributes"] == {"ome": {"version": "0.5", "labels": ["nuclei"]}}
    label = stored("image/labels/nuclei")["attributes"]["ome"]
    assert label["version"] == "0.5"
    assert label["image-label"] == {
        "colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}],
        "properties": [{"label-value": 1, "class": "nucleus"}],
    }
    assert "version" not in label["multiscales"][0]
    assert stored("new")["attributes"]["ome"]["multiscales"][0]["axes"][0]["name"] == "y"
    for path, axes in (("image/labels/nuclei", data.images[0].axis_names), ("new", ("y", "x"))):
        for dataset in stored(path)["attributes"]["ome"]["multiscales"][0]["datasets"]:
            meta = stored(f"{path}/{dataset['path']}")
            assert meta["dimension_names"] == list(axes)
            sharded = [c["name"] for c in meta["codecs"]] == ["sharding_indexed"]
            assert sharded is bool(options), meta["codecs"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(
            zarr.open_array(source / "image/labels/nuclei/0", mode="r")[...], labels
        )
        np.testing.assert_array_equal(zarr.open_array(source / "new/0", mode="r")[...], pixels)
    assert new.attributes.ome.multiscales[0].datasets[0].path == "0"


def test_levels_written_after_their_image_get_its_axes(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """A writer that puts the image's 0.4 metadata first and its level arrays after it:
    each level is stored with the `dimension_names` 0.5 requires, from the image's axes."""
    source = tmp_path / "src"
    zarr.open_group(source, mode="w")
    mounted = mount(source, "view=v2")
    image = mounted.path / "img"
    image.mkdir()
    (image / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    axes = [{"name": "y", "type": "space", "unit": "micrometer"}, {"name": "x", "type": "space"}]
    datasets = [
        {"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": [2.0**i] * 2}]}
        for i in range(2)
    ]
    multiscale = {"version": "0.4", "name": "img", "axes": axes, "datasets": datasets}
    (image / ".zattrs").write_text(json.dumps({"multiscales": [multiscale]}))
    pixels = np.arange(12 * 10, dtype="<u2").reshape(12, 10)
    for i in range(2):
        level = pixels[:: 2**i, :: 2**i]
        zarray = {
            "zarr_format": 2,
            "shape": list(level.shape),
            "chunks": [6, 5],
            "dtype": "<u2",
            "compressor": None,
            "fill_value": 0,
            "order": "C",
            "filters": None,
            "dimension_separator": "/",
        }
        (image / str(i)).mkdir()
        (image / str(i) / ".zarray").write_text(json.dumps(zarray))
        zarr.open_array(image / str(i), mode="r+", zarr_format=2)[...] = level
    mounted.stop()
    assert "ERROR" not in mounted.log(), mounted.log()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ValidationWarning)
        Image05.from_zarr(zarr.open_group(source / "img", mode="r"))
    for i in range(2):
        array = zarr.open_array(source / "img" / str(i), mode="r")
        assert array.metadata.dimension_names == ("y", "x")
        np.testing.assert_array_equal(array[...], pixels[:: 2**i, :: 2**i])
