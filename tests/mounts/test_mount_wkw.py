"""WKW datasets written by the `wkw` package, read through a real mount as Zarr v3 and as zarr v2
by zarr-python 3, zarr-python 2.18 and tensorstore: every chunk equals what `wkw` reads.

The datasets (tests/support/wkw_data.py) have layers of uint8, uint16 with two channels, uint32
and uint64, several magnifications, a bounding box that ends inside its last files, and
raw or LZ4HC blocks.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import wkw
import zarr

from shardfs.cli import main
from shardfs.formats.wkw import Header, morton_index
from shardfs.storage import LocalStorage
from shardfs.view import Role
from shardfs.view.wkw import HELD_BLOCKS, HOLD_IDLE, WkwNamespace
from tests.conftest import Mounted
from tests.library.test_checksum import reference
from tests.mounts.test_kernel_served import wait_for
from tests.support.s3 import S3Env
from tests.support.wkw_data import (
    BLOCK_LEN,
    FILE_LEN,
    HUGE_FILE,
    arrays,
    expected_shape,
    make_dataset,
    read_wkw,
    sparse_huge_file,
    write_mag,
)
from tests.support.zarr2 import Zarr2

pytestmark = pytest.mark.fuse

KINDS = ["raw", "lz4hc"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("wkw")
    return {kind: make_dataset(base / kind, compressed=kind == "lz4hc") for kind in KINDS}


@pytest.fixture(scope="module")
def expected(datasets: dict[str, Path]) -> dict[str, np.ndarray]:
    """What `wkw` reads of each magnification (the same in both datasets)."""
    root = datasets["raw"]
    found = {}
    for key, mag in arrays(root).items():
        header = Header.parse((root / key / "header.wkw").read_bytes())
        found[key] = read_wkw(root / key, (header.channels, *expected_shape(mag)))
    for key, data in found.items():
        np.testing.assert_array_equal(read_wkw(datasets["lz4hc"] / key, data.shape), data)
    return found


def error_lines(mounted: Mounted) -> list[str]:
    return [line for line in mounted.log().splitlines() if " ERROR " in line]


def chunk_files(array: Path, v2: bool) -> dict[tuple[int, ...], Path]:
    """The chunk files of an array of the view, by chunk coordinates (c, x, y, z): below
    `c/` in v3, below the array in v2 (`dimension_separator` `/`)."""
    keys = array if v2 else array / "c"
    found = {}
    for directory, _, names in os.walk(keys):
        for name in names:
            parts = Path(directory, name).relative_to(keys).parts
            if len(parts) == 4:
                found[tuple(map(int, parts))] = Path(directory, name)
    return found


def expected_chunks(directory: Path, data: np.ndarray) -> dict[tuple[int, ...], bytes]:
    """Every block of magnification `directory` in the grid of `data` that a data file
    holds, as `wkw` reads it, in C order of (z, y, x, c): whole blocks, also where they
    reach past the array's shape."""
    b = BLOCK_LEN
    grid = [-(-n // b) for n in data.shape[1:]]
    padded = read_wkw(directory, (data.shape[0], *(g * b for g in grid)))
    chunks = {}
    for x, y, z in np.ndindex(*grid):
        f = FILE_LEN
        if not (directory / f"z{z // f}/y{y // f}/x{x // f}.wkw").exists():
            continue
        block = padded[:, x * b : (x + 1) * b, y * b : (y + 1) * b, z * b : (z + 1) * b]
        chunks[(0, x, y, z)] = block.transpose(3, 2, 1, 0).tobytes()
    return chunks


def check_chunks(mountpoint: Path, source: Path, expected: dict[str, np.ndarray], v2: bool) -> None:
    """Every chunk file of every array is the block `wkw` reads; none is missing or extra."""
    for key, data in expected.items():
        files = chunk_files(mountpoint / key, v2)
        wanted = expected_chunks(source / key, data)
        assert set(files) == set(wanted), key
        for coords, path in files.items():
            assert path.stat().st_size == len(wanted[coords])
            assert path.read_bytes() == wanted[coords], (key, coords)


# -- reading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.filterwarnings("ignore:Object at datasource-properties.json is not recognized")
def test_zarr_v3_readers(
    kind: str, datasets: dict[str, Path], expected: dict[str, np.ndarray], mount
) -> None:
    mounted: Mounted = mount(datasets[kind])
    assert "mounted read-only" in mounted.log()
    root = zarr.open_group(mounted.path, mode="r")
    assert root.attrs["webknossos"]["scale"] == [11.24, 11.24, 25.0]
    assert sorted(root.group_keys()) == ["color", "color2", "segmentation", "segmentation64"]
    assert root["segmentation"].attrs["webknossos"]["category"] == "segmentation"
    for key, data in expected.items():
        array = zarr.open_array(mounted.path / key, mode="r")
        assert array.metadata.dimension_names == ("c", "x", "y", "z")
        np.testing.assert_array_equal(array[...], data, key)
        store = ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{mounted.path / key}/"}}
        ).result()
        np.testing.assert_array_equal(store.read().result(), data, key)
        assert store.domain.labels == ("c", "x", "y", "z")
    check_chunks(mounted.path, datasets[kind], expected, v2=False)
    # What is not a chunk or a document is shown as stored, outside the arrays only.
    properties = datasets[kind] / "datasource-properties.json"
    assert (mounted.path / properties.name).read_bytes() == properties.read_bytes()
    assert sorted(os.listdir(mounted.path / "color" / "1")) == ["c", "zarr.json"]
    assert not (mounted.path / "color" / "1" / "header.wkw").exists()
    assert not error_lines(mounted), mounted.log()


V2_READ = """
import zarr, numpy as np
root = zarr.open_consolidated(params["path"], mode="r")
for key in params["keys"]:
    array = root[key]
    assert array.order == "F" and array.compressor is None, key
    np.save(f"{params['out']}/{key.replace('/', '__')}.npy", array[...])
layer = zarr.open_consolidated(params["path"] + "/color", mode="r")
print(json.dumps([sorted(root.group_keys()), sorted(layer.array_keys())]))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_zarr_v2_readers(
    kind: str,
    datasets: dict[str, Path],
    expected: dict[str, np.ndarray],
    mount,
    zarr2: Zarr2,
    tmp_path: Path,
) -> None:
    mounted: Mounted = mount(datasets[kind], "view=v2")
    groups, arrays = zarr2.run(
        V2_READ, path=str(mounted.path), keys=list(expected), out=str(tmp_path)
    )
    assert groups == ["color", "color2", "segmentation", "segmentation64"]
    assert arrays == ["1", "2-2-1"]
    for key, data in expected.items():
        np.testing.assert_array_equal(np.load(tmp_path / f"{key.replace('/', '__')}.npy"), data)
        array = zarr.open_array(mounted.path / key, mode="r", zarr_format=2)
        np.testing.assert_array_equal(array[...], data, key)
        store = ts.open(
            {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{mounted.path / key}/"}}
        ).result()
        np.testing.assert_array_equal(store.read().result(), data, key)
    check_chunks(mounted.path, datasets[kind], expected, v2=True)
    assert not error_lines(mounted), mounted.log()


@pytest.mark.parametrize("view", ["v3", "v2"])
def test_a_bare_magnification(view: str, tmp_path: Path, mount) -> None:
    """A magnification directory with only header.wkw: its shape ends with its last files;
    blocks of no file are missing chunks (the fill value, 0)."""
    data = np.arange(2 * 20 * 9 * 40, dtype=np.uint16).reshape(2, 20, 9, 40)
    source = tmp_path / "mag"
    write_mag(source, data, (40, 0, 3), compressed=True)
    mounted: Mounted = mount(source, f"view={view}")
    fmt = 3 if view == "v3" else 2
    array = zarr.open_array(mounted.path, mode="r", zarr_format=fmt)
    file = BLOCK_LEN * FILE_LEN
    assert array.shape == (2, 2 * file, file, 2 * file)
    expected = read_wkw(source, array.shape)
    assert not expected[:, :file].any()  # no file there: zeros, from no chunk
    np.testing.assert_array_equal(array[...], expected)
    driver = {"v3": "zarr3", "v2": "zarr"}[view]
    kvstore = {"driver": "file", "path": f"{mounted.path}/"}
    store = ts.open({"driver": driver, "kvstore": kvstore}).result()
    np.testing.assert_array_equal(store.read().result(), expected)
    check_chunks(mounted.path, source, {"": expected}, v2=view == "v2")
    if view == "v3":
        assert sorted(os.listdir(mounted.path / "c" / "0")) == [str(i) for i in range(4, 8)]


# -- bad input -------------------------------------------------------------------------------


def corrupt(path: Path, at: int, value: bytes) -> None:
    content = bytearray(path.read_bytes())
    content[at : at + len(value)] = value
    path.write_bytes(bytes(content))


def test_corrupt_files_give_eio_and_one_log_line_each(
    datasets: dict[str, Path], expected: dict[str, np.ndarray], tmp_path: Path, mount
) -> None:
    source = tmp_path / "copy"
    shutil.copytree(datasets["lz4hc"], source)
    raw = tmp_path / "raw"
    shutil.copytree(datasets["raw"] / "color2", raw)
    broken = {
        "color/1/z0/y0/x0.wkw": lambda p: corrupt(p, 0, b"XKW"),
        "color/1/z0/y0/x1.wkw": lambda p: corrupt(p, 5, b"\x09"),  # unknown block type
        "color2/1/z0/y1/x0.wkw": lambda p: p.write_bytes(p.read_bytes()[:-100]),  # truncated
        "segmentation/1/z0/y0/x0.wkw": lambda p: corrupt(p, 16 + 8 * 7, (1 << 40).to_bytes(8)),
        "segmentation/1/z0/y1/x1.wkw": lambda p: corrupt(p, 16 + 8 * 9, bytes(8)),  # decreases
        "segmentation/2/z0/y0/x0.wkw": lambda p: shutil.copy(raw / "1/z0/y0/x0.wkw", p),
    }
    for key, damage in broken.items():
        damage(source / key)
    # An LZ4 block that decodes to too few bytes: only that chunk fails.
    lz4_file = source / "segmentation64/1/z0/y0/x1.wkw"
    table = np.frombuffer(lz4_file.read_bytes()[16 : 16 + 8 * 64], "<u8")
    corrupt(lz4_file, int(table[0]), b"\x00" * 8)
    mounted: Mounted = mount(source)
    failed: dict[str, int] = {}
    for key, data in expected.items():
        files = chunk_files(mounted.path / key, v2=False)
        wanted = expected_chunks(datasets["lz4hc"] / key, data)
        for coords, path in files.items():
            try:
                assert path.read_bytes() == wanted[coords]
            except OSError as e:
                assert e.errno == errno.EIO
                file = f"z{coords[3] // FILE_LEN}/y{coords[2] // FILE_LEN}/x{coords[1] // FILE_LEN}"
                failed[f"{key}/{file}.wkw"] = failed.get(f"{key}/{file}.wkw", 0) + 1
    assert set(failed) == {*broken, "segmentation64/1/z0/y0/x1.wkw"}
    assert failed["segmentation64/1/z0/y0/x1.wkw"] == 1  # one block of the file
    assert failed["color/1/z0/y0/x0.wkw"] == FILE_LEN**3  # a whole file: its header
    lines = error_lines(mounted)
    for key in broken:
        assert sum(str(source / key) in line for line in lines) == 1, (key, mounted.log())
    assert len(lines) == len(broken) + 1, mounted.log()
    assert mounted.process.poll() is None  # still serving
    np.testing.assert_array_equal(
        zarr.open_array(mounted.path / "color2/1", mode="r")[:, :32, :32, :32],
        expected["color2/1"][:, :32, :32, :32],
    )


def test_a_file_replaced_under_the_mount_is_read_whole_or_not_at_all(tmp_path: Path, mount) -> None:
    """A new version of a data file is read through its own jump table (once the kernel asks
    again, within `cache_timeout`); a block opened before the file changed is served from
    the version it opened, or fails, rather than mixing the two."""
    first = np.full((1, 32, 32, 32), 7, np.uint8)
    write_mag(tmp_path / "a", first, (0, 0, 0), compressed=True)
    write_mag(tmp_path / "b", first + 1, (0, 0, 0), compressed=True)
    mounted: Mounted = mount(tmp_path / "a", "cache_timeout=0.5")
    chunk = mounted.path / "c/0/1/2/3"
    with open(chunk, "rb") as held:
        assert held.read(10) == b"\x07" * 10
        os.replace(tmp_path / "b/z0/y0/x0.wkw", tmp_path / "a/z0/y0/x0.wkw")
        try:
            rest = held.read()
            assert rest == b"\x07" * (len(rest))  # the version it opened (still pinned)
        except OSError as e:
            assert e.errno == errno.EIO
    assert wait_for(lambda: chunk.read_bytes() == b"\x08" * 512, within=5) < 5
    np.testing.assert_array_equal(zarr.open_array(mounted.path, mode="r")[...], first + 1)


def test_writes_are_refused(datasets: dict[str, Path], mount, tmp_path: Path) -> None:
    mounted: Mounted = mount(datasets["raw"])
    with pytest.raises(OSError) as error:
        (mounted.path / "color/1/c/0/0/0/0").write_bytes(b"x")
    assert error.value.errno == errno.EROFS
    (tmp_path / "empty").mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardfs",
            "mount",
            str(datasets["raw"]),
            str(tmp_path / "empty"),
            "-o",
            "rw",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "WKW source: it cannot be written" in result.stderr


# -- memory ----------------------------------------------------------------------------------


def status(pid: int, field: str) -> int:
    """A memory figure of /proc/PID/status (VmRSS, VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no {field} for {pid}")


def test_idle_readers_of_big_lz4_blocks_hold_at_most_the_budget(tmp_path: Path, mount) -> None:
    """Eight files of one LZ4 block of 64 MiB (`wkw` compressed it to 256 KiB), each opened,
    read 4 KiB of and left open: the daemon holds at most `HELD_BLOCKS` of their blocks
    (not 512 MiB), every file reads on correctly (its block decoded again), and what is
    held goes once the readers idle."""
    header = wkw.Header(np.uint64, num_channels=4, block_len=128, file_len=1)
    block = np.zeros((4, 128, 128, 128), np.uint64)
    block[:, :, :, 0] = np.arange(4 * 128 * 128, dtype=np.uint64).reshape(4, 128, 128)
    source = tmp_path / "mag"
    with wkw.Dataset.create(str(tmp_path / "raw"), header) as dataset:
        dataset.write((0, 0, 0), block)
        dataset.compress(str(source), compress_files=True).close()
    for x in range(1, 8):
        shutil.copy(source / "z0/y0/x0.wkw", source / f"z0/y0/x{x}.wkw")
    chunk = block.transpose(3, 2, 1, 0).tobytes()
    assert len(chunk) == 64 << 20
    mounted: Mounted = mount(source)
    pid = mounted.process.pid
    base = status(pid, "VmRSS")
    files, grown = [], 0
    try:
        for x in range(8):
            files.append(open(mounted.path / f"c/0/{x}/0/0", "rb", buffering=0))  # noqa: SIM115
            assert files[-1].read(4096) == chunk[:4096]
            grown = max(grown, status(pid, "VmRSS") - base)
        assert grown < HELD_BLOCKS + (64 << 20), grown >> 20
        assert files[0].read() == chunk[4096:]  # dropped: decoded again
        assert wait_for(lambda: status(pid, "VmRSS") - base < 32 << 20, HOLD_IDLE + 10)
    finally:
        for file in files:
            file.close()
    assert not error_lines(mounted), mounted.log()


@pytest.mark.parametrize("compressed", [False, True])
def test_a_byte_of_a_file_with_a_huge_table_is_cheap(
    tmp_path: Path, mount, compressed: bool
) -> None:
    """A data file of 256^3 one-byte blocks (sparse; raw, or LZ4 after a jump table of
    128 MiB): a chunk file of it reads in well under 0.2 s, and the daemon's peak memory
    barely moves, on the first read and on the next (a part of the table is kept)."""
    position = (200, 100, 50)
    value = sparse_huge_file(tmp_path / "mag", compressed, morton_index(position, HUGE_FILE))
    mounted: Mounted = mount(tmp_path / "mag")
    pid = mounted.process.pid
    peak = status(pid, "VmHWM")
    for x in (200, 201):
        path = mounted.path / f"c/0/{x}/100/50"
        start = time.monotonic()
        got = path.read_bytes()
        assert time.monotonic() - start < 0.2
        if x == 200:
            assert got == value
    assert status(pid, "VmHWM") - peak < 16 << 20
    assert not error_lines(mounted), mounted.log()


# -- the command line ------------------------------------------------------------------------


def shardfs_out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out.strip()


@pytest.mark.parametrize("view", ["v3", "v2"])
def test_virtual_checksum_is_zarr_checksum_of_a_copy(
    view: str, datasets: dict[str, Path], mount, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    source = datasets["lz4hc"]
    got = shardfs_out(capsys, "checksum", "--virtual", "--view", view, str(source))
    mounted: Mounted = mount(source, f"view={view}")
    copy = tmp_path / "copy"
    shutil.copytree(mounted.path, copy)
    assert got == reference(copy) == reference(mounted.path)
    assert got != shardfs_out(capsys, "checksum", str(source))


def test_info_lists_mags_and_maintenance_refuses(
    datasets: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    out = shardfs_out(capsys, "info", str(datasets["lz4hc"]))
    assert "layers color, color2, segmentation, segmentation64; 6 magnifications" in out
    for key in arrays(datasets["lz4hc"]):
        assert f"\n{key}: mag [" in out
    report = json.loads(shardfs_out(capsys, "info", "--json", str(datasets["lz4hc"])))
    mags = {m["path"]: m for m in report["wkw"]}
    assert mags["color2/1"]["shape"] == [2, *expected_shape((1, 1, 1))]
    assert (mags["color/2-2-1"]["mag"], mags["color/2-2-1"]["layer"]) == ([2, 2, 1], "color")
    assert mags["segmentation/1"]["data_type"] == "uint32"
    for command in ("fsck", "compact"):
        assert main([command, str(datasets["lz4hc"])]) == 2
        assert "is a WKW dataset" in capsys.readouterr().err


# -- S3 ------------------------------------------------------------------------------------


def test_on_s3(
    s3: S3Env,
    datasets: dict[str, Path],
    expected: dict[str, np.ndarray],
    mount,
    capsys: pytest.CaptureFixture,
) -> None:
    """Without read-ahead (read_cache=0): one ranged GET of each data file's header and jump
    table, and one of each block read; with it, fewer. No HEAD: stats come from listings.
    The virtual checksum is that of the same dataset on a local disk."""
    s3.upload_tree(datasets["lz4hc"], "src")
    key = "segmentation/1"
    data = expected[key]
    for options, exact in ((["read_cache=0"], True), ([], False)):
        s3.proxy.reset_counts()
        mounted: Mounted = mount(s3.url("src"), *s3.mount_options(), *options)
        np.testing.assert_array_equal(zarr.open_array(mounted.path / key, mode="r")[...], data)
        gets = [e for e in s3.proxy.log() if e[0] == "GET" and e[1].startswith(f"src/{key}/z")]
        files = {k for _, k, _, _ in gets}
        header = Header.parse((datasets["lz4hc"] / key / "header.wkw").read_bytes())
        tables = [k for _, k, r, _ in gets if r == f"bytes=0-{header.table_reads(0)[0][1] - 1}"]
        assert sorted(tables) == sorted(files), gets
        blocks = len(expected_chunks(datasets["lz4hc"] / key, data))
        if exact:
            assert len(gets) == len(files) + blocks, gets
        else:
            assert len(gets) < len(files) + blocks, gets
        assert set(s3.proxy.counts()) == {"GET range", "LIST"}  # stats from listings
        mounted.stop()
    options = ",".join(s3.mount_options())
    local = shardfs_out(capsys, "checksum", "--virtual", str(datasets["lz4hc"]))
    assert shardfs_out(capsys, "checksum", "--virtual", s3.url("src"), "-o", options) == local


# -- a dataset webknossos-libs wrote ---------------------------------------------------------

WEBKNOSSOS_WRITE = """
import sys
sys.stdout = sys.stderr  # webknossos' progress bars: the runner reads stdout as JSON
import numpy as np, webknossos as wk
from pathlib import Path
out = Path(params["out"])
dataset = wk.Dataset(params["path"], voxel_size=(11.2, 11.2, 25))
rng = np.random.default_rng(1)
for name, category, dtype in (("color", wk.COLOR_CATEGORY, "uint8"),
                              ("segmentation", wk.SEGMENTATION_CATEGORY, "uint32")):
    extra = {"largest_segment_id": 999} if dtype == "uint32" else {}
    layer = dataset.add_layer(name, category, dtype=dtype, data_format="wkw", **extra)
    mag = layer.add_mag(1, chunk_shape=8, shard_shape=32, compress=True)
    data = rng.integers(1, 1000, (1, 45, 37, 20)).astype(dtype)
    mag.write(data, absolute_offset=(5, 3, 2), allow_resize=True, allow_unaligned=True)
    layer.downsample(from_mag=wk.Mag(1), coarsest_mag=wk.Mag(2), chunk_shape=8, shard_shape=32)
boxes = {}
for layer in dataset.layers.values():
    for mag, view in layer.mags.items():
        box = layer.bounding_box.align_with_mag(mag, ceil=True)
        key = f"{layer.name}/{mag.to_layer_name()}"
        np.save(out / f"{key.replace('/', '__')}.npy", view.read(absolute_bounding_box=box))
        in_mag = box.in_mag(mag)
        boxes[key] = [list(in_mag.topleft), list(in_mag.bottomright)]
(out / "boxes.json").write_text(json.dumps(boxes))
"""


def test_a_dataset_webknossos_wrote(tmp_path: Path, mount) -> None:
    """webknossos-libs lays the dataset out (`mags` with `path`, its own directory names
    and downsampling); what it reads of each magnification is what the mount shows at its
    bounding box, whose far corner is the array's shape, and every chunk is what `wkw`
    reads."""
    from tests.support.webknossos_env import ensure_webknossos

    source = tmp_path / "ds"
    ensure_webknossos().run(WEBKNOSSOS_WRITE, path=str(source), out=str(tmp_path))
    boxes = json.loads((tmp_path / "boxes.json").read_text())
    assert sorted(boxes) == ["color/1", "color/2-2-1", "segmentation/1", "segmentation/2-2-1"]
    mounted: Mounted = mount(source)
    for key, (top_left, bottom_right) in boxes.items():
        array = zarr.open_array(mounted.path / key, mode="r")
        assert list(array.shape[1:]) == bottom_right, key
        assert array.attrs["webknossos"]["topLeft"] == top_left, key
        region = tuple(slice(t, b) for t, b in zip(top_left, bottom_right, strict=True))
        written = np.load(tmp_path / f"{key.replace('/', '__')}.npy")
        np.testing.assert_array_equal(array[(slice(None), *region)], written, key)
        expected = read_wkw(source / key, array.shape)
        check_chunks(mounted.path, source, {key: expected}, v2=False)
    assert not error_lines(mounted), mounted.log()


# -- metadata shardfs cannot use -------------------------------------------------------------


def test_unusable_metadata(
    datasets: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, caplog
) -> None:
    """Properties that are not a datasource fail with one line; a magnification whose
    header.wkw is broken, and a layer of another format, are shown as stored."""
    source = tmp_path / "ds"
    shutil.copytree(datasets["raw"], source)
    properties = source / "datasource-properties.json"
    good = properties.read_text()
    properties.write_text("{")
    assert main(["info", str(source)]) == 2
    assert "is not a valid WKW dataset: datasource-properties.json is not valid JSON" in (
        capsys.readouterr().err
    )
    doc = json.loads(good)
    doc["dataLayers"][1]["dataFormat"] = "zarr3"
    properties.write_text(json.dumps(doc))
    corrupt(source / "color/2-2-1/header.wkw", 0, b"XYZ")
    storage = LocalStorage(str(source))
    view = WkwNamespace(storage)
    root = view.resolve("")
    roles = {name: node.role for name, node, _ in view.listing(root).items()}
    assert roles["color"] is Role.GROUP and roles["color2"] is Role.DIR
    color = {name: node.role for name, node, _ in view.listing(view.resolve("color")).items()}
    assert color == {"1": Role.ARRAY, "2-2-1": Role.DIR, "zarr.json": Role.METADATA}
    assert sorted(os.listdir(source / "color/2-2-1")) == sorted(
        name for name, _, _ in view.listing(view.resolve("color/2-2-1")).items()
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("layer 1 ('color2') is not a WKW layer" in w for w in warnings), warnings
    assert any("color/2-2-1/header.wkw: shown as stored: no WKW magic" in w for w in warnings)
