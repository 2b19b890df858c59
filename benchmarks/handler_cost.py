"""What shardfs's own handlers cost per chunk file, in-process, with the CPU caches as
the daemon finds them: beside the floor's handlers, in one run.

Why (issue 33): in the daemon, the lookup handler of a chunk file took 100-120 µs of
CPU, in-process 37-45 µs. Between two requests the daemon's caches are thrashed (the
kernel copies pages, the reader decompresses on the other core, libfuse, pyfuse3 and
trio run), so its code and data come back from memory at every request, and what a
handler costs there follows how much code and how many objects it touches more than
its instruction count. This script reproduces that in-process: before every call it
sweeps a buffer of `--flush` KiB (0: no sweep, the caches stay warm), then calls the
handler under trio and counts its thread CPU. It compares:

  shardfs   `Operations` over a `Namespace` of the source, as a kernel-served
            `-o ro` mount is: a LOOKUP then a READ of every chunk file of the
            first `--dirs` chunk directories `data/c/<i>/<j>` (100 files each),
            the first lookup of each directory included. The source is
            `per_file`'s data set (64-byte chunk files written by zarr-python
            3) or, with --source, any array at `data` laid out so, such as the
            DANDI layout of `scale --layout dandi` (written by tensorstore);
  floor     the `serve` floor's handlers (a dict-free integer lookup, the bytes from
            memory) for the same count of files, the least any handler costs;

for each sweep size given, the median of `--repeat` passes (each over fresh
`Operations`), in µs per call, and shardfs / floor. Only the handlers are counted:
no kernel, no request loop. No root needed.

    .venv/bin/python -m benchmarks.handler_cost [--data DIR | --source SHARDED]
        [--dirs 20] [--flush 0 8192] [--repeat 5] [--results PATH]

--data is a per_file data directory (made, with 20,000 files, if it holds none);
--source a sharded store to read instead, e.g. bench-data/scale-dandi-10/sharded.zarr.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyfuse3
import trio

from benchmarks.harness import results
from benchmarks.harness.data.tiny import ARRAY, PER_DIR, Dataset
from benchmarks.harness.floors import Floor
from benchmarks.harness.results import Result
from benchmarks.harness.runs import run
from shardfs.fuse.adapter import MountConfig, Operations
from shardfs.storage import LocalStorage
from shardfs.view import Namespace

Timed = dict[str, list[int]]
T = TypeVar("T")


class Sweep:
    """Evicts the CPU caches (as far as `kib` of memory can) before each timed call."""

    def __init__(self, kib: int) -> None:
        self.buffer = np.zeros(kib << 10, np.uint8)

    async def timed(self, into: list[int], handler: Callable[..., Awaitable[T]], *args: Any) -> T:
        np.add(self.buffer, 1, out=self.buffer)
        started = time.thread_time_ns()
        result = await handler(*args)
        into.append(time.thread_time_ns() - started)
        return result


async def shardfs_pass(source: Path, dirs: int, sweep: Sweep, timed: Timed) -> None:
    ops = Operations(
        Namespace(LocalStorage(source)), MountConfig(read_only=True, kernel_served=True)
    )
    ctx: Any = None  # the handlers never look at it

    async def inode(parent: int, name: object) -> int:
        return (await ops.lookup(parent, str(name).encode(), ctx)).st_ino

    ino = pyfuse3.ROOT_INODE
    for name in [*ARRAY.split("/"), "c"]:
        ino = await inode(ino, name)
    for d in range(dirs):
        parent = await inode(await inode(ino, d // PER_DIR), d % PER_DIR)
        for k in range(PER_DIR):
            entry = await sweep.timed(timed["lookup"], ops.lookup, parent, str(k).encode(), ctx)
            data = await sweep.timed(timed["read"], ops.read, entry.st_ino, 0, 131072)
            assert len(data) == entry.st_size


async def floor_pass(files: int, sweep: Sweep, timed: Timed) -> None:
    ops = Floor((files // PER_DIR + 1, PER_DIR), files, 64, noopen=True)
    for d in range(files // PER_DIR):
        parent = (await ops.lookup(pyfuse3.ROOT_INODE, str(d).encode())).st_ino
        for k in range(PER_DIR):
            entry = await sweep.timed(timed["lookup"], ops.lookup, parent, str(k).encode())
            await sweep.timed(timed["read"], ops.read, entry.st_ino, 0, 131072)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--source", type=Path)
    parser.add_argument("--dirs", type=int, default=20)
    parser.add_argument("--flush", type=int, nargs="+", default=[0, 8192])
    parser.add_argument("--repeat", type=int, default=5)
    results.add_option(parser, "handler_cost")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        source = args.source
        if source is None:
            dataset = Dataset(args.data or Path(scratch), 20000)
            if not dataset.ready():
                dataset.build()
            source = dataset.source
        files = args.dirs * PER_DIR
        result = Result(
            "handler_cost",
            {
                "dirs": args.dirs,
                "flush_kib": args.flush,
                "repeat": args.repeat,
                "source": "per_file data set" if args.source is None else str(args.source),
            },
        )
        table = result.table(
            f"{files} chunk files, a lookup and a read each; µs of thread CPU per call, median "
            f"of {args.repeat} passes (each pass: the mean over its calls)",
            ["sweep before each call", "handler", "shardfs µs", "floor µs", "shardfs / floor"],
        )
        for kib in args.flush:
            sweep = Sweep(kib)
            means: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.repeat):
                for kind in ("shardfs", "floor"):
                    timed: Timed = {"lookup": [], "read": []}
                    if kind == "shardfs":
                        trio.run(shardfs_pass, source, args.dirs, sweep, timed)
                    else:
                        trio.run(floor_pass, files, sweep, timed)
                    for handler, values in timed.items():
                        means.setdefault((kind, handler), []).append(statistics.mean(values) / 1e3)
            for handler in ("lookup", "read"):
                mine = statistics.median(means[("shardfs", handler)])
                floor = statistics.median(means[("floor", handler)])
                label = f"{kib} KiB" if kib else "none (caches warm)"
                table.row(label, handler, round(mine, 1), round(floor, 1), f"{mine / floor:.1f}x")
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
