"""Reading a sharded array from S3: through a shardfs mount vs zarr-python's own S3 support.

Why: on an object store every request costs a round trip, so a reader of
plain chunk files through the mount must not pay one per chunk, and a node
that mounts the same data again (every job, every restart) should not pay
for it again. This script puts a fixed delay on every request (the test
proxy in front of moto's S3 server, both on 127.0.0.1) and compares in one
run, interleaved:

  (a) zarr-python 3 reading the whole array through a `-o ro` mount of the bucket
      (a fresh daemon each time, so nothing is cached);
  (b) zarr-python 3 reading the same sharded array directly from the same
      endpoint, with its own S3 support (ObjectStore on obstore);
  (c) as (a), with read-ahead off (`-o read_cache=0`): one GET per chunk;
  (d) zarr-python 3 reading the first `--chunk-reads` chunks one at a time
      (one `array[region]` per chunk, in C order, as a tile viewer or a
      per-chunk processing loop does), through the mount;
  (e) as (d), directly from S3;
  (f) as (a), from a local copy of the bucket: no S3 at all, so what the
      mount and the FUSE round trips of each chunk file cost by themselves;
  (g) as (a), the first mount with a disk cache (`-o cache_dir=DIR`, DIR
      new and empty in every repetition), which fills it;
  (h) as (a), a remount (a fresh daemon) with the cache (g) filled: the
      case of issue 22, which should send no data request at all;
  (i), (j) as (g), (h) for the chunk-by-chunk read of (d);
  (k) as (d), from the local copy of (f): the floor of (j), what a remount
      whose every byte came from local disk could reach at best;
  (l) as (b), from a plain (unsharded) local copy, its files in the page cache:
      what a reader of chunk files pays with no FUSE and no S3;
  (m) as (l), through the floor `benchmarks.floor serve-read` (a pyfuse3 + trio
      daemon with trivial handlers serving that plain copy from memory, kernel-served
      like `-o ro`): what any pyfuse3 daemon answering the same requests costs, the
      bound of (f) and so of (a).

Every mount is a fresh daemon, so the kernel's page cache of the mount
dies with each unmount and only the disk cache carries over.

It prints median seconds with their range, the requests each read made
(counted by the proxy, mount start-up included; GETs of shard objects,
whose keys hold `/c/`, apart from those of metadata documents), the disk
cache's block hits and misses (from the daemon, as `shardfs stats` shows
them), and ratios per repetition: (b)/(a) and (e)/(d), above 1 the mount
is faster; (g)/(h), (i)/(j), what the warm cache gains over the first mount
(the target is at least 3); (b)/(h), (e)/(j), above 1 the warm remount is
faster than zarr-python direct; (b)/(m), the most (b)/(f) and (b)/(a) can be. The data is written by zarr-python
straight into moto.

    .venv/bin/python -m benchmarks.s3_read [--size-mib 64] [--delay-ms 20] [--repeat 3]
        [--chunk-reads 64] [--cases abf...] [--results PATH]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from benchmarks.harness import results
from benchmarks.harness.daemons import Child
from benchmarks.harness.moto import moto_run
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, run
from shardfs.fuse.control import query
from tests.conftest import Mounted, start_mount, stop_mount
from tests.support.backends import bucket
from tests.support.s3 import S3Env, S3Proxy

CHUNKS = (32, 64, 64)  # 128 KiB of uint8
CHUNK_BYTES = 32 * 64 * 64
SHARDS = (128, 256, 256)  # 64 chunks, 8 MiB before compression
PLANE = (512, 512)
#: What the remount with a warm disk cache must beat the first mount by (issue 22).
TARGET = 3.0
#: The kinds of the requests that fetch array data: GETs of shard objects (under `/c/`).
DATA = "GET data"


@dataclass
class Run:
    """One read: its time, the requests it cost by kind, and the mount's disk cache figures."""

    seconds: float
    requests: Counter[str]
    disk: dict[str, Any] | None = None


def generate(size_mib: int) -> np.ndarray:
    """A smooth field with small noise: zstd shrinks each chunk to about a third."""
    planes = (size_mib << 20) // (PLANE[0] * PLANE[1])
    depth = max(SHARDS[0], planes // SHARDS[0] * SHARDS[0])
    z, y, x = np.ogrid[:depth, : PLANE[0], : PLANE[1]]
    smooth = (40 * np.sin(z / 50) + 40 * np.cos(y / 70) + 30 * np.sin(x / 40) + 128).astype(
        np.uint8
    )
    noise = np.random.default_rng(1).integers(0, 4, smooth.shape, dtype=np.uint8)
    return smooth + noise


def read(array: zarr.Array, chunks: int | None) -> float:
    """Seconds to read the whole array in one call, or its first `chunks` chunks one by one."""
    start = time.perf_counter()
    if chunks is None:
        array[...]
    else:
        for coords in itertools.islice(np.ndindex(*array.cdata_shape), chunks):
            array[tuple(slice(i * n, (i + 1) * n) for i, n in zip(coords, CHUNKS, strict=True))]
    return time.perf_counter() - start


def requests_by_kind(proxy: S3Proxy) -> Counter[str]:
    """What the proxy saw since its last reset, with the GETs of objects split by what they
    fetch: `GET data` (shard objects, below a `/c/`) and `GET metadata` (the rest), so that
    a warm cache's data requests, which must be none, are not hidden among the metadata
    reads every mount makes. LISTs and requests on the bucket keep the proxy's kinds."""
    kinds = proxy.counts()
    for kind in ("GET", "GET range"):  # every GET of an object; re-counted from the log
        kinds.pop(kind, None)
    for method, key, _, _ in proxy.log():
        if method == "GET" and key:
            kinds[DATA if "/c/" in f"/{key}" else "GET metadata"] += 1
    return kinds


def read_through_mount(
    source: str,
    work: Path,
    interrupts: Interrupts,
    *options: str,
    chunks: int | None = None,
) -> tuple[float, dict[str, Any] | None]:
    """Seconds of one read through a fresh daemon, and its disk cache figures if it has one
    (asked before the unmount, which ends the daemon that knows them)."""
    with interrupts.deferred():
        mounted: Mounted = start_mount(source, work / "mnt", work / "mnt.log", "ro", *options)
    try:
        seconds = read(zarr.open_array(mounted.path / "a", mode="r"), chunks)
        disk = None
        if any(option.startswith("cache_dir=") for option in options):
            disk = query(str(mounted.path))["caches"].get("disk")
        return seconds, disk
    finally:
        with interrupts.deferred():
            stop_mount(mounted)


def read_through_floor(plain: Path, work: Path, interrupts: Interrupts) -> tuple[float, None]:
    """Seconds of one whole read of the plain copy through a fresh floor daemon."""
    command = [sys.executable, "-m", "benchmarks.floor", "serve-read", str(plain)]
    with Child(interrupts, work / "floor-mnt", work / "floor.log") as floor:
        floor.start([*command, str(floor.mountpoint)])
        return read(zarr.open_array(floor.mountpoint / "a", mode="r"), None), None


def read_directly(s3: S3Env, chunks: int | None = None) -> tuple[float, None]:
    return read(zarr.open_array(s3.zarr_store("data/a", read_only=True), mode="r"), chunks), None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-reads", type=int, default=64)
    parser.add_argument("--cases", default="abcdefghijklm", help="the cases to run (letters)")
    results.add_option(parser, "s3_read")
    args = parser.parse_args()
    interrupts = Interrupts()
    data = generate(args.size_mib)
    with moto_run("shardfs-s3-bench-", interrupts) as (work, server), bucket(server, "bench") as s3:
        group = zarr.open_group(s3.zarr_store("data", direct=True), mode="w")
        array = group.create_array(
            "a",
            shape=data.shape,
            dtype=data.dtype,
            chunks=CHUNKS,
            shards=SHARDS,
            fill_value=0,
        )
        array[...] = data
        stored = sum(size for size, _ in s3.keys("data/").values())
        local = work / "local"
        s3.download_tree("data", local)
        plain = work / "plain"
        zarr.open_group(plain, mode="w").create_array(
            "a", shape=data.shape, dtype=data.dtype, chunks=CHUNKS, fill_value=0
        )[...] = data
        url, options = s3.url("data"), s3.mount_options()
        s3.proxy.delay(args.delay_ms / 1000)
        caches = {"whole": work / "cache-whole", "chunks": work / "cache-chunks"}

        def fresh_cache(which: str) -> str:
            """The option of a new, empty cache directory: each (g) and (i) is a
            first mount, whatever the repetitions before it left."""
            shutil.rmtree(caches[which], ignore_errors=True)
            return f"cache_dir={caches[which]}"

        def mount(*extra: str, chunks: int | None = None) -> tuple[float, Any]:
            return read_through_mount(url, work, interrupts, *options, *extra, chunks=chunks)

        n = args.chunk_reads
        cases: dict[str, Callable[[], tuple[float, dict[str, Any] | None]]] = {
            "a": lambda: mount(),
            "b": lambda: read_directly(s3),
            "c": lambda: mount("read_cache=0"),
            "d": lambda: mount(chunks=n),
            "e": lambda: read_directly(s3, chunks=n),
            "f": lambda: read_through_mount(str(local), work, interrupts),
            "g": lambda: mount(fresh_cache("whole")),
            "h": lambda: mount(f"cache_dir={caches['whole']}"),
            "i": lambda: mount(fresh_cache("chunks"), chunks=n),
            "j": lambda: mount(f"cache_dir={caches['chunks']}", chunks=n),
            "k": lambda: read_through_mount(str(local), work, interrupts, chunks=n),
            "l": lambda: (read(zarr.open_array(plain / "a", mode="r"), None), None),
            "m": lambda: read_through_floor(plain, work, interrupts),
        }
        cases = {name: case for name, case in cases.items() if name in args.cases}
        runs: dict[str, list[Run]] = {name: [] for name in cases}
        for rep in range(args.repeat):
            for name, case in cases.items():
                s3.proxy.reset_counts()
                seconds, disk = case()
                runs[name].append(Run(seconds, requests_by_kind(s3.proxy), disk))
            print(
                f"repetition {rep + 1}: "
                + ", ".join(
                    f"{name} {r[-1].seconds:.2f} s ({r[-1].requests[DATA]} data GETs)"
                    for name, r in runs.items()
                ),
                file=sys.stderr,
            )
        report(runs, data.nbytes, stored, args).write(results.results_path(args.results))
    return 0


def report(
    runs: dict[str, list[Run]], nbytes: int, stored: int, args: argparse.Namespace
) -> Result:
    n = args.chunk_reads
    labels = {
        "a": "(a) zarr-python 3 through the mount",
        "b": "(b) zarr-python 3 direct from S3 (obstore)",
        "c": "(c) through the mount, read_cache=0",
        "d": f"(d) {n} chunks one by one, through the mount",
        "e": f"(e) {n} chunks one by one, direct from S3",
        "f": "(f) as (a), from a local copy: the cost of the mount alone",
        "g": "(g) as (a), first mount, empty cache_dir",
        "h": "(h) as (a), remount, warm cache_dir",
        "i": f"(i) as (d), {n} chunks, first mount, empty cache_dir",
        "j": f"(j) as (d), {n} chunks, remount, warm cache_dir",
        "k": f"(k) as (d), {n} chunks, from a local copy: the floor of (j)",
        "l": "(l) as (b), from a plain local copy (page cache): no FUSE, no S3",
        "m": "(m) as (l), through a trivial pyfuse3 daemon: the bound of (f) and (a)",
    }
    labels = {name: label for name, label in labels.items() if runs.get(name)}
    read_bytes = dict.fromkeys("abcfghlm", nbytes) | dict.fromkeys("deijk", n * CHUNK_BYTES)
    result = Result(
        "s3_read",
        {
            "size_mib": args.size_mib,
            "delay_ms": args.delay_ms,
            "repeat": args.repeat,
            "chunk_reads": n,
            "cases": args.cases,
        },
    )
    table = result.table(
        f"{nbytes >> 20} MiB uint8 array ({stored / (1 << 20):.1f} MiB stored), chunks {CHUNKS},"
        f" shards {SHARDS}; {args.delay_ms:g} ms added to every request; "
        f"median (range) of {args.repeat}",
        ["read", "seconds", "MiB/s", "data GETs", "other requests (by kind)", "disk cache blocks"],
    )
    for name, label in labels.items():
        times = [run.seconds for run in runs[name]]
        data = [float(run.requests[DATA]) for run in runs[name]]
        last = runs[name][-1]
        other = Counter({k: v for k, v in last.requests.items() if k != DATA})
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(other.items())) or "none"
        disk = None if last.disk is None else disk_figures([run.disk for run in runs[name]])
        rate = read_bytes[name] / statistics.median(times) / (1 << 20)
        table.row(
            label,
            Spread.of(times),
            round(rate),
            Spread.of(data, 0),
            f"{sum(other.values())}: {kinds}",
            disk,
        )
    table = result.table(
        "Ratios of times, per repetition: median (range)",
        ["ratio", "value", "meaning"],
        detail=True,
    )
    ratios = (
        ("b", "a", "direct over mount; above 1 the mount is faster"),
        ("b", "f", "direct over mount of a local copy; above 1 the mount is faster"),
        ("e", "d", "direct over mount; above 1 the mount is faster"),
        ("g", "h", f"first mount over warm remount, whole array; target >= {TARGET:g}"),
        ("i", "j", f"first mount over warm remount, chunk by chunk; target >= {TARGET:g}"),
        ("b", "h", "direct over warm remount; above 1 the remount is faster"),
        ("e", "j", "direct over warm remount; above 1 the remount is faster"),
        ("g", "f", "first mount over the local floor, whole array: the most (h) can gain"),
        ("i", "k", "the same, chunk by chunk: the most (j) can gain"),
        ("b", "m", "direct over the trivial daemon: the most (b)/(f) and (b)/(a) can be"),
        ("m", "f", "the trivial daemon over the mount of a local copy; 1 is the floor"),
    )
    for over, under, meaning in ratios:
        if runs.get(over) and runs.get(under):
            table.row(f"({over})/({under})", Spread.of(ratio(runs, over, under)), meaning)
    for first, warm, what in (("g", "h", "whole array"), ("i", "j", "chunk by chunk")):
        if not (runs.get(first) and runs.get(warm)):
            continue
        data = sum(run.requests[DATA] for run in runs[warm])
        gain = statistics.median(ratio(runs, first, warm))
        met = data == 0 and gain >= TARGET
        result.note(
            f"target ({what}): the warm remount sends 0 data GETs (it sent {data} in "
            f"{len(runs[warm])} repetitions) and is >= {TARGET:g}x faster than the first "
            f"mount (median {gain:.2f}x): {'met' if met else 'NOT MET'}"
        )
    return result


def ratio(runs: dict[str, list[Run]], over: str, under: str) -> list[float]:
    """Time of `over` divided by time of `under`, per repetition (both ran side by side)."""
    return paired([r.seconds for r in runs[over]], [r.seconds for r in runs[under]])


def disk_figures(figures: list[dict[str, Any] | None]) -> str:
    """Disk cache block hits and misses of each repetition's daemon, as `hits/misses`."""
    pairs = {f"{f['hits']}/{f['misses']}" for f in figures if f is not None}
    return "hits/misses " + ", ".join(sorted(pairs))


if __name__ == "__main__":
    run(main)
