"""Eight processes read random chunks of one array through a mount at the same time.

Why: a mount is shared by every process on a machine (a pool of workers, a
viewer and a batch job), so the daemon serves many readers at once. Each reader
here checks every read against data it knows independently of shardfs: the
bytes of a chunk file against the same chunk in a plain unsharded copy that
tensorstore (the writer of the sharded array) wrote with the same codecs, and
values read by zarr-python through the mount against the formula the data was
made from. Read-only and read-write mounts serve reads differently (kernel
caching, the workspace's overlay), so both are tested. The readers are forked
from a forkserver that imported this module once, so that eight starts do not
cost eight imports of zarr. Scaling with the number of readers is measured by
`benchmarks/concurrency.py`, not asserted here: the machine is shared and noisy.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import zarr

from tests.conftest import Mounted

pytestmark = pytest.mark.fuse

#: uint16, not a multiple of the chunks or shards: partial edge chunks and shards.
SHAPE = (1500, 2000)
CHUNKS = (32, 32)
SHARDS = (512, 512)
GRID = tuple(-(-n // c) for n, c in zip(SHAPE, CHUNKS, strict=True))  # 47 x 63 = 2961 chunks
ARRAY = "data"
GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}
READERS = 8
SECONDS = 5.0
#: Every DECODED_EVERY-th read is a zarr-python read; the others are raw chunk files.
DECODED_EVERY = 4
#: Fewest reads of each kind per reader: far below what a reader does in SECONDS even with
#: eight readers on two busy cores, yet enough that each one really took part.
MIN_RAW = 50
MIN_DECODED = 10


def values(rows: slice, cols: slice) -> np.ndarray:
    """The array's content, from its coordinates alone; never the fill value 0, so every
    chunk is stored."""
    y = np.arange(rows.start, rows.stop, dtype=np.uint32)[:, None]
    x = np.arange(cols.start, cols.stop, dtype=np.uint32)[None, :]
    return (1 + (y * 131 + x * 7 + (y ^ x)) % 65521).astype(np.uint16)


@dataclass
class Tally:
    """What one reader did; `problems` holds the first few wrong reads and errors."""

    seed: int
    raw: int = 0
    decoded: int = 0
    wrong: int = 0
    errors: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < 5:
            self.problems.append(text)


def read_randomly(
    view: str, plain: str, seed: int, start: Barrier, seconds: float, results: Queue[Tally]
) -> None:
    """One reader process: random chunk files and random zarr windows for `seconds`."""
    tally = Tally(seed)
    rng = random.Random(seed)
    try:
        array = zarr.open_array(view, mode="r")
        start.wait(timeout=120)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if (tally.raw + tally.decoded) % DECODED_EVERY == DECODED_EVERY - 1:
                _check(tally, "decoded", lambda: _read_decoded(array, rng))
            else:
                _check(tally, "raw", lambda: _read_raw(view, plain, rng))
    except Exception:
        start.abort()  # the others and the test stop waiting; every tally says what happened
        tally.errors += 1
        tally.problem(traceback.format_exc())
    results.put(tally)


def _check(tally: Tally, kind: str, read: Callable[[], str | None]) -> None:
    """Run one read: it returns None if right, else what was wrong. Any exception, OSError
    included, is an error."""
    try:
        wrong = read()
    except Exception as e:
        tally.errors += 1
        tally.problem(f"{kind}: {e!r}")
        return
    setattr(tally, kind, getattr(tally, kind) + 1)
    if wrong is not None:
        tally.wrong += 1
        tally.problem(wrong)


def _read_raw(view: str, plain: str, rng: random.Random) -> str | None:
    """A whole chunk file through the mount, against the plain copy's file."""
    key = f"c/{rng.randrange(GRID[0])}/{rng.randrange(GRID[1])}"
    with open(f"{view}/{key}", "rb") as file:
        size = os.fstat(file.fileno()).st_size
        data = file.read()
    with open(f"{plain}/{key}", "rb") as file:
        expected = file.read()
    if data != expected or size != len(expected):
        return f"{key}: {len(data)} bytes (st_size {size}), expected {len(expected)}, differ"
    return None


def _read_decoded(array: zarr.Array, rng: random.Random) -> str | None:
    """A window of up to 2 x 2 chunks at a random place, decoded by zarr-python."""
    y0, x0 = rng.randrange(SHAPE[0]), rng.randrange(SHAPE[1])
    rows = slice(y0, min(SHAPE[0], y0 + rng.randint(1, 2 * CHUNKS[0])))
    cols = slice(x0, min(SHAPE[1], x0 + rng.randint(1, 2 * CHUNKS[1])))
    if not np.array_equal(array[rows, cols], values(rows, cols)):
        return f"zarr [{rows.start}:{rows.stop}, {cols.start}:{cols.stop}]: wrong values"
    return None


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sharded source, plain copy): the same data written by tensorstore, once sharded and
    once one file per chunk, with the same inner codecs (so the same chunk bytes)."""
    top = tmp_path_factory.mktemp("concurrency")
    inner = ["bytes", {"name": "zstd", "configuration": {"level": 3}}]
    sharding = {"chunk_shape": list(CHUNKS), "codecs": inner, "index_codecs": ["bytes", "crc32c"]}
    for name, grid, codecs in (
        ("sharded", SHARDS, [{"name": "sharding_indexed", "configuration": sharding}]),
        ("plain", CHUNKS, inner),
    ):
        (top / name).mkdir()
        (top / name / "zarr.json").write_text(json.dumps(GROUP))
        metadata = {
            "shape": list(SHAPE),
            "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid)}},
            "codecs": codecs,
            "fill_value": 0,
        }
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": f"{top / name / ARRAY}/"},
            "metadata": metadata,
        }
        ts.open(spec, create=True).result()[...] = values(slice(0, SHAPE[0]), slice(0, SHAPE[1]))
    return top / "sharded", top / "plain"


def _stored(source: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file of the source's array: reads must not change them."""
    return {
        str(p.relative_to(source)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted((source / ARRAY).rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("options", [("ro",), ()], ids=["ro", "rw"])
def test_eight_readers_read_random_chunks(
    arrays: tuple[Path, Path], mount: Callable[..., Mounted], options: tuple[str, ...]
) -> None:
    source, plain = arrays
    before = _stored(source)
    mounted = mount(source, *options)
    view = mounted.path / ARRAY
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # no effect once the server runs: then slower
    start = context.Barrier(READERS + 1)
    results = context.Queue()
    readers = [
        context.Process(
            target=read_randomly,
            args=(str(view), str(plain / ARRAY), seed, start, SECONDS, results),
        )
        for seed in range(READERS)
    ]
    try:
        for reader in readers:
            reader.start()
        # Every reader has opened the array; or one failed, and the tallies say why.
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(timeout=120)
        tallies: list[Tally] = [results.get(timeout=SECONDS + 60) for _ in readers]
        for reader in readers:
            reader.join(timeout=30)
    finally:
        for reader in readers:
            if reader.is_alive():
                reader.kill()
                reader.join()

    problems = [f"reader {t.seed}: {p}" for t in tallies for p in t.problems]
    assert sum(t.errors for t in tallies) == 0, problems
    assert sum(t.wrong for t in tallies) == 0, problems
    counts = {t.seed: (t.raw, t.decoded) for t in tallies}
    assert all(raw >= MIN_RAW and decoded >= MIN_DECODED for raw, decoded in counts.values()), (
        counts
    )
    assert mounted.process.poll() is None, mounted.log()
    assert (view / "zarr.json").is_file()  # the daemon still answers
    log = mounted.log()
    assert not re.search(r"ERROR|Traceback", log), log
    mounted.stop()
    assert _stored(source) == before
