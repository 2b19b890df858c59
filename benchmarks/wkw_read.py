"""Reading a whole WKW layer through a shardfs mount, side by side with the `wkw` library.

Why: a WKW dataset mounted by shardfs is read by Zarr tools instead of the `wkw`
library; this measures what that costs, in one run, on one machine. The layer
is written by `wkw` (blocks of 32^3, files of 8^3 blocks), once with raw blocks
and once with LZ4HC ones, which the mount decodes.

Per block type and repetition, each reader reads the whole layer three ways, back to
back: `wkw.Dataset.read` directly (wkw), the same reader on a plain copy of the mount's
array (plain: the same chunk files and zarr.json on the local disk, copied through the
mount when the data set is made), and through a mount (mount); the readers are
zarr-python 3 (zarr) and tensorstore (ts). Each COLD (page cache dropped before each
side, a fresh daemon) and then WARM (the same reads again at once). Ratios are
wkw / mount and plain / mount of one repetition: 1 is parity, below 1 the mount is
slower. Printed: the median time of each side and the median ratios with their range.
Also printed: what decoding every LZ4HC block of the layer costs in-process
(`Header.decode`, numcodecs' LZ4), the work the mount adds to a read of LZ4HC blocks.
Needs root (drop_caches, FUSE).

    .venv/bin/python -m benchmarks.wkw_read [--size 512] [--repeat 5] [--data DIR]
        [--results PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorstore as ts
import wkw
import zarr

from benchmarks.harness import results
from benchmarks.harness.caches import drop_caches
from benchmarks.harness.daemons import DataDir, MountManager
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, run
from shardfs.formats.wkw import Header
from shardfs.formats.wkw import file_key as wkw_file_key
from tests.conftest import start_mount, stop_mount

BLOCK_LEN, FILE_LEN = 32, 8
KINDS = ("raw", "lz4hc")


class Layer(DataDir):
    """A dataset of one uint8 layer `color` of `size`^3 voxels at magnification 1."""

    def __init__(self, data: Path, kind: str, size: int) -> None:
        super().__init__(data)
        self.kind, self.size = kind, size

    @property
    def source(self) -> Path:
        return self.data / "dataset"

    @property
    def mag(self) -> Path:
        return self.source / "color" / "1"

    @property
    def params(self) -> dict[str, object]:
        return {"kind": self.kind, "size": self.size, "block": BLOCK_LEN, "file": FILE_LEN}

    def make(self) -> None:
        """Smooth values with some noise: compressible, as microscopy data is."""
        shutil.rmtree(self.data, ignore_errors=True)
        self.mountpoint.mkdir(parents=True)
        n = self.size
        x, y, z = np.ogrid[:n, :n, :n]
        noise = np.random.default_rng(0).integers(0, 4, (1, n, n, n), dtype=np.uint8)
        values = ((x // 4 + y // 8 + z // 16) % 200).astype(np.uint8)[None] + noise
        header = wkw.Header(np.uint8, block_len=BLOCK_LEN, file_len=FILE_LEN)
        raw = self.mag if self.kind == "raw" else self.data / "raw"
        with wkw.Dataset.create(str(raw), header) as dataset:
            dataset.write((0, 0, 0), values)
            if self.kind != "raw":
                dataset.compress(str(self.mag), compress_files=True).close()
        if self.kind != "raw":
            shutil.rmtree(raw)
        layer = {
            "name": "color",
            "category": "color",
            "boundingBox": {"topLeft": [0, 0, 0], "width": n, "height": n, "depth": n},
            "elementClass": "uint8",
            "dataFormat": "wkw",
            "wkwResolutions": [{"resolution": 1, "cubeLength": BLOCK_LEN * FILE_LEN}],
        }
        properties = {"id": {"name": "bench"}, "scale": [1, 1, 1], "dataLayers": [layer]}
        (self.source / "datasource-properties.json").write_text(json.dumps(properties))
        mounted = start_mount(self.source, self.mountpoint, self.log)
        try:
            shutil.copytree(self.mountpoint / "color" / "1", self.plain)
        finally:
            stop_mount(mounted)
        self.made()


def timed(read: Callable[[], np.ndarray], expected: np.ndarray) -> float:
    start = time.perf_counter()
    data = read()
    took = time.perf_counter() - start
    assert np.array_equal(data.reshape(expected.shape), expected), "wrong bytes"
    return took


def decode_cost(layer: Layer) -> tuple[float, int]:
    """Seconds to decode every block of the layer in-process, and the bytes decoded."""
    header = Header.parse((layer.mag / "header.wkw").read_bytes())
    files = -(-layer.size // header.file_voxels)
    contents = [
        (layer.mag / wkw_file_key((x, y, z))).read_bytes()
        for x in range(files)
        for y in range(files)
        for z in range(files)
    ]
    start = time.perf_counter()
    total = 0
    for content in contents:
        for part in range(header.blocks // header.part_blocks):
            pieces = [content[o : o + n] for o, n in header.table_reads(part)]
            for offset, size in header.extents(pieces, len(content), part).tolist():
                total += len(header.decode(content[offset : offset + size]))
    return time.perf_counter() - start, total


def readers() -> dict[str, Callable[[Path], np.ndarray]]:
    """The Zarr readers of an array directory: zarr-python 3 and tensorstore."""

    def tensorstore(array: Path) -> np.ndarray:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{array}/"}}
        return ts.open(spec).result().read().result()

    return {"zarr": lambda array: zarr.open_array(array, mode="r")[...], "ts": tensorstore}


def measure(layer: Layer, size: int, repeat: int, interrupts: Interrupts, result: Result) -> None:
    """Every reader and temperature, `repeat` times; the table of medians and ratios."""

    def direct() -> np.ndarray:
        with wkw.Dataset.open(str(layer.mag)) as dataset:
            return dataset.read((0, 0, 0), (size,) * 3)

    expected = direct()
    mounts = MountManager(layer, interrupts)
    times: dict[tuple[str, str, str], list[float]] = {}
    try:
        for _ in range(repeat):
            for name, read in readers().items():
                sides: dict[str, Callable[[], np.ndarray]] = {
                    "wkw": direct,
                    "plain": lambda read=read: read(layer.plain),
                    "mount": lambda read=read: read(layer.mountpoint / "color" / "1"),
                }
                for temperature in ("cold", "warm"):
                    for side, run_side in sides.items():
                        if temperature == "cold":
                            drop_caches()
                            if side == "mount":
                                mounts.fresh()
                        took = timed(run_side, expected)
                        times.setdefault((name, temperature, side), []).append(took)
    finally:
        mounts.stop()
    stored = sum(p.stat().st_size for p in layer.mag.rglob("*.wkw"))
    table = result.table(
        f"{layer.kind} blocks ({stored / 2**20:.1f} MiB stored): the whole layer read by each "
        f"reader; median s, and ratios per repetition, median (range) of {repeat}",
        ["reader", "wkw s", "plain s", "mount s", "wkw / mount", "plain / mount"],
    )
    for name in readers():
        for temperature in ("cold", "warm"):
            wkw_s, plain, mounted = (
                times[(name, temperature, s)] for s in ("wkw", "plain", "mount")
            )
            table.row(
                f"{name} {temperature}",
                *(Spread.of(t, 3) for t in (wkw_s, plain, mounted)),
                Spread.of(paired(wkw_s, mounted)),
                Spread.of(paired(plain, mounted)),
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=512, help="edge of the layer in voxels")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, help="where the data sets are kept (default: tmp)")
    results.add_option(parser, "wkw_read")
    args = parser.parse_args()
    interrupts = Interrupts()
    base = args.data or Path(tempfile.mkdtemp(prefix="wkw-bench-"))
    result = Result("wkw_read", {"size": args.size, "repeat": args.repeat})
    result.note(
        f"layer: uint8, {args.size}^3 voxels, blocks of {BLOCK_LEN}^3, files of {FILE_LEN}^3; "
        "readers zarr-python 3 (zarr) and tensorstore (ts); COLD: page cache dropped before "
        "each side and a fresh daemon; WARM: the same reads again at once"
    )
    for kind in KINDS:
        layer = Layer(base / kind, kind, args.size)
        if not layer.ready():
            layer.make()
        measure(layer, args.size, args.repeat, interrupts, result)
        if kind != "raw":
            took, total = decode_cost(layer)
            result.note(
                f"decoding every {kind} block in-process: {took:.3f} s for "
                f"{total / 2**20:.0f} MiB ({total / 2**20 / took:.0f} MiB/s)"
            )
    if args.data is None:
        shutil.rmtree(base)
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
