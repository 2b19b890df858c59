"""CPU per chunk read, layer by layer: where a mount's time goes.

Why: one reader through a mount costs the daemon several hundred µs of CPU per
chunk file, and the daemon serves every request on one thread, so that cost
caps the mount's throughput (see concurrency). This script measures, in one
run and on the data set of concurrency (kept with the same --data), the CPU
per chunk of the same random chunk reads at three layers:

  library: `Namespace.entry` + `open` + `read` (no FUSE, no event loop),
  adapter: the pyfuse3 handlers lookup, open, read and release, awaited
           directly in a trio loop (shardfs's whole share, without the kernel
           and without pyfuse3's request loop),
  mount:   the daemon's CPU (all threads, user + system) while one process
           opens and reads chunk files through a `-o ro` mount,

each with every shard index already cached, and prints the ratios. What the
mount costs beyond the adapter is the FUSE machinery: pyfuse3's request loop,
trio, and the daemon's side of the kernel's requests. The layers alternate;
each row is the median of the repetitions. Needs root (FUSE).

    .venv/bin/python -m benchmarks.chunk_cost --data bench-data/concurrency [--repeat 5]
        [--reads 3000] [--chunks 160000] [--results PATH]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from benchmarks.harness import results
from benchmarks.harness.data.grid import ARRAY, Dataset, Mounts, chunk_key
from benchmarks.harness.procs import cpu_split
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, rotated, run
from shardfs.fuse.adapter import MountConfig, Operations
from shardfs.storage import LocalStorage
from shardfs.view import Namespace


def library(dataset: Dataset, picks: list[int]) -> float:
    """CPU seconds of the core's work for `picks`, after a first pass that loads the indexes."""
    ns = Namespace(LocalStorage(dataset.source))
    chunks = ns.resolve(f"{ARRAY}/c")
    rows = {i: ns.lookup(chunks, str(i)) for i in range(dataset.grid)}

    def run() -> None:
        for index in picks:
            row, col = divmod(index, dataset.grid)
            node, attr = ns.entry(rows[row], str(col))
            ns.open(node).read(0, attr.size)

    run()
    return timed(run)


def adapter(dataset: Dataset, picks: list[int]) -> float:
    """CPU seconds of the handlers for `picks` (the kernel's requests for a chunk file)."""
    ops = Operations(Namespace(LocalStorage(dataset.source)), MountConfig())
    flags = os.O_RDONLY

    async def main() -> float:
        async def inode(parent: int, name: str) -> int:
            return (await ops.lookup(parent, name.encode(), None)).st_ino  # type: ignore[arg-type]

        chunks = await inode(await inode(1, ARRAY), "c")
        rows = {i: await inode(chunks, str(i)) for i in range(dataset.grid)}

        async def run() -> None:
            for index in picks:
                row, col = divmod(index, dataset.grid)
                ino = await inode(rows[row], str(col))
                handle = await ops.open(ino, flags, None)  # type: ignore[arg-type]
                await ops.read(handle.fh, 0, 1 << 17)
                await ops.release(handle.fh)

        await run()
        cpu = time.process_time()
        await run()
        return time.process_time() - cpu

    return trio.run(main)


def mount(mounts: Mounts, picks: list[int]) -> tuple[float, float]:
    """Daemon (user, system) CPU seconds while this process reads `picks` through a fresh
    mount whose daemon holds every index (a stat of one chunk per shard)."""
    mounted = mounts.warmed()
    top = mounted.path / ARRAY
    grid = mounts.dataset.grid
    user, system = cpu_split(mounted.process.pid)
    for index in picks:
        with open(top / chunk_key(index, grid), "rb") as file:
            file.read()
    user_after, system_after = cpu_split(mounted.process.pid)
    mounts.stop()
    return user_after - user, system_after - system


def timed(fn: Callable[[], None]) -> float:
    cpu = time.process_time()
    fn()
    return time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="the concurrency data set (default: temp)")
    parser.add_argument("--chunks", type=int, default=160_000, help="inner chunks (about)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median reported)")
    parser.add_argument("--reads", type=int, default=3000, help="distinct chunks per measurement")
    results.add_option(parser, "chunk_cost")
    args = parser.parse_args()
    if args.repeat < 1 or args.reads < 1 or args.chunks < args.reads:
        parser.error("--repeat and --reads must be positive, and --chunks at least --reads")
    if os.geteuid() != 0:
        parser.error("needs root: FUSE mounts")
    interrupts = Interrupts()
    data = args.data.resolve() if args.data else Path(tempfile.mkdtemp(prefix="shardfs-cost-"))
    dataset = Dataset(data, math.isqrt(args.chunks - 1) + 1)
    data.mkdir(parents=True, exist_ok=True)
    dataset.log.write_text("")
    mounts = Mounts(dataset, interrupts)
    layers: dict[str, list[float]] = {"library": [], "adapter": [], "mount": []}
    system: list[float] = []  #: the daemon's system time per chunk, of its CPU in `mount`
    try:
        if not dataset.ready():
            dataset.build(mounts)
        for rep in range(args.repeat):
            picks = random.Random(rep).sample(range(dataset.grid**2), args.reads)
            order = rotated(list(layers), rep)
            for name in order:
                if name == "mount":
                    user, kernel = mount(mounts, picks)
                    seconds = user + kernel
                    system.append(kernel / args.reads * 1e6)
                else:
                    seconds = (library if name == "library" else adapter)(dataset, picks)
                layers[name].append(seconds / args.reads * 1e6)
                print(f"  rep {rep + 1}/{args.repeat} {name:8} {layers[name][-1]:6.0f} µs")
    finally:
        mounts.stop()
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    spreads = {name: Spread.of(values, 0) for name, values in layers.items()}
    result = Result(
        "chunk_cost", {"chunks": dataset.grid**2, "reads": args.reads, "repeat": args.repeat}
    )
    table = result.table(
        f"{args.reads} distinct random chunks per measurement, indexes cached; CPU µs per "
        f"chunk, median (range) of {args.repeat}",
        ["layer", "CPU µs per chunk", "/ library"],
    )
    for name, spread in spreads.items():
        table.row(name, spread, f"{spread.median / spreads['library'].median:.2f}x")
    beyond = spreads["mount"].median - spreads["adapter"].median
    result.note(
        f"FUSE machinery (mount - adapter): {beyond:.0f} µs per chunk, "
        f"{beyond / spreads['mount'].median:.0%} of the daemon's CPU; of the daemon's CPU, "
        f"{Spread.of(system, 0).median:.0f} µs per chunk is system time"
    )
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
