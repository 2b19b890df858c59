"""Writing an array in a writer process of its own (zarr-python 3, or 2.18 from its own
environment), timed from inside it; and the arrays and data the write workloads share
(`write_throughput`, `cold_path writes`)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

CHUNK = 64
SHARD = 256
PLANE = (1024, 1024)  # one z plane of uint8 is 1 MiB
ARRAY = "data"
#: zarr-python 3's default compressor for numeric data, given explicitly so all three
#: cases are sure to use the same inner codecs.
COMPRESSOR = ZstdCodec(level=0, checksum=False)
#: Skewed small noise (P(0)=150/256 ... P(3)=16/256) on a slowly varying field, as in
#: the read data set: zstd gets chunks of 64^3 bytes (256 KiB) down to about 90 KiB.
NOISE = np.repeat(np.arange(4, dtype=np.uint8), [150, 60, 30, 16])

#: --small-chunks (issue 21): 512 x 512 x 256 uint16 = 128 MiB in 2048 chunk files of 32^3.
SMALL_SHAPE = (512, 512, 256)
SMALL_CHUNK = 32
#: What each mount of --small-chunks adds to --mount-options: (1) the v2 view, new arrays
#: sharded with 8 chunks per shard per axis (so 256^3 shards, as (3)'s); (3) the v3 view.
SMALL_MOUNT_OPTIONS = {
    "v2-mount": ["rw", "view=v2", f"shard_new={SHARD // SMALL_CHUNK}"],
    "v3-mount": ["rw"],
}
#: The source of (1): a root group and nothing else.
ROOT_GROUP = '{"zarr_format":3,"node_type":"group","attributes":{}}'


def generate_small(shape: tuple[int, int, int], seed: int = 1) -> np.ndarray:
    """--small-chunks: uint16, a ramp along every axis (1000 up to about 4300) plus the
    same small skewed noise; zstd gets a chunk to about a third, Blosc lz4 to 0.45."""
    out = np.empty(shape, dtype=np.uint16)
    ramp = 2 * np.arange(shape[1])[:, None] + np.arange(shape[2])[None, :]
    rng = np.random.default_rng(seed)
    for x0 in range(0, shape[0], SMALL_CHUNK):
        x = np.arange(x0, min(x0 + SMALL_CHUNK, shape[0]))
        slab = 1000 + 4 * x[:, None, None] + ramp[None]
        out[x0 : x0 + len(x)] = slab + NOISE[rng.integers(0, 256, size=slab.shape, dtype=np.uint8)]
    return out


def create_array(
    path: Path,
    shape: tuple[int, ...],
    sharded: bool,
    chunk: int = CHUNK,
    dtype: np.dtype | str = "uint8",
) -> None:
    """The array's metadata only (no chunk written), under group `path` as ARRAY."""
    group = zarr.open_group(path, mode="w")
    group.create_array(
        ARRAY,
        shape=shape,
        dtype=dtype,
        chunks=(chunk,) * 3,
        shards=(SHARD,) * 3 if sharded else None,
        compressors=COMPRESSOR,
        fill_value=0,
    )


def writer_main(spec_text: str) -> int:
    """The writer process: load the data, make the array if asked (untimed), say "ready",
    and on "go" open the array, check its layout and write all of it; report the time and
    CPU of that (and of a following os.sync() if asked) as one JSON line.

    It runs as `python -c` from its own source (see `timed_write`), under zarr-python 3
    or 2.18, which cannot import this module: it imports what it needs itself.
    """
    import json
    import os
    import resource
    import sys
    import time

    import numpy as np
    import zarr

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    spec = json.loads(spec_text)
    data = np.load(spec["data"])
    if spec["create"]:  # with this zarr-python's defaults (zarr-python 2: its compressor)
        zarr.open_array(
            spec["target"], mode="w", shape=data.shape, chunks=spec["chunks"], dtype=data.dtype
        )
    print("ready", flush=True)
    if sys.stdin.readline() != "go\n":
        return 1
    cpu0 = cpu()
    started = time.perf_counter()
    array = zarr.open_array(spec["target"], mode="r+")
    layout = [list(array.chunks), getattr(array, "shards", None) is not None]
    if layout != [spec["chunks"], spec["sharded"]]:
        raise RuntimeError(f"{spec['target']}: unexpected layout (chunks, sharded) {layout}")
    array[...] = data
    written = time.perf_counter()
    cpu1 = cpu()
    if spec["sync"]:
        os.sync()
    synced = time.perf_counter()
    result = {"write": written - started, "sync": synced - written, "cpu": cpu1 - cpu0}
    print(json.dumps(result), flush=True)
    return 0


@dataclass(frozen=True)
class Writer:
    """A zarr-python that writes: its interpreter, and whether it makes the array itself
    (zarr-python 2.18, with its defaults) or finds it made."""

    python: str = sys.executable
    creates: bool = False


ZARR3 = Writer()


def timed_write(
    target: Path,
    data_file: Path,
    sharded: bool,
    sync: bool,
    chunk: int = CHUNK,
    writer: Writer = ZARR3,
) -> dict[str, float]:
    """Write the array in a writer process of its own (`writer_main`).

    A process, not a call: if the benchmark is interrupted, killing the writer
    (by its PID) closes every file it has open in the mount, so the unmount
    that follows is not refused as busy, and no write outlives it. The writer
    runs in its own session, so a Ctrl-C reaches only this process, which kills it.
    """
    spec = {"target": str(target), "data": str(data_file), "chunks": [chunk] * 3}
    spec |= {"sharded": sharded, "sync": sync, "create": writer.creates}
    program = f"import sys\n{inspect.getsource(writer_main)}\nsys.exit(writer_main(sys.argv[1]))"
    process = subprocess.Popen(
        [writer.python, "-c", program, json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        if process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the writer of {target} did not start")
        process.stdin.write(b"go\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the writer of {target} failed (exit status {process.wait()})")
        process.wait(timeout=60)
        return json.loads(line)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
