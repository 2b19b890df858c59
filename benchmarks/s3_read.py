"""Reading a sharded array from S3: through a shardfs mount vs zarr-python's own S3 support.

Why: on an object store every request costs a round trip, so a reader of
plain chunk files through the mount must not pay one per chunk. This script
puts a fixed delay on every request (the test proxy in front of moto's S3
server, both on 127.0.0.1) and compares in one run, interleaved:

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
      mount and the FUSE round trips of each chunk file cost by themselves.

It prints median seconds, the requests each read made (counted by the proxy,
mount start-up included), and the ratios (b)/(a) and (e)/(d) per repetition:
above 1 the mount is faster. The data is written by zarr-python straight
into moto.

    .venv/bin/python benchmarks/s3_read.py [--size-mib 64] [--delay-ms 20] [--repeat 3]
        [--chunk-reads 64]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import zarr
from common import Interrupts, machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.backends import bucket  # noqa: E402
from tests.conftest import Mounted, start_mount, stop_mount  # noqa: E402
from tests.s3 import MotoServer, S3Env, configure_environment  # noqa: E402

CHUNKS = (32, 64, 64)  # 128 KiB of uint8
CHUNK_BYTES = 32 * 64 * 64
SHARDS = (128, 256, 256)  # 64 chunks, 8 MiB before compression
PLANE = (512, 512)


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


def read_through_mount(
    source: str,
    work: Path,
    interrupts: Interrupts,
    *options: str,
    chunks: int | None = None,
) -> float:
    with interrupts.deferred():
        mounted: Mounted = start_mount(source, work / "mnt", work / "mnt.log", "ro", *options)
    try:
        return read(zarr.open_array(mounted.path / "a", mode="r"), chunks)
    finally:
        with interrupts.deferred():
            stop_mount(mounted)


def read_directly(s3: S3Env, chunks: int | None = None) -> float:
    return read(zarr.open_array(s3.zarr_store("data/a", read_only=True), mode="r"), chunks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-reads", type=int, default=64)
    args = parser.parse_args()
    interrupts = Interrupts()
    configure_environment()
    data = generate(args.size_mib)
    with tempfile.TemporaryDirectory(prefix="shardfs-s3-bench-") as tmp:
        work = Path(tmp)
        server = MotoServer(work / "moto.log")
        with interrupts.deferred():
            server.start()
        try:
            with bucket(server, "bench") as s3:
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
                url, options = s3.url("data"), s3.mount_options()
                s3.proxy.delay(args.delay_ms / 1000)
                cases = {
                    "a": lambda: read_through_mount(url, work, interrupts, *options),
                    "b": lambda: read_directly(s3),
                    "c": lambda: read_through_mount(
                        url, work, interrupts, *options, "read_cache=0"
                    ),
                    "d": lambda: read_through_mount(
                        url, work, interrupts, *options, chunks=args.chunk_reads
                    ),
                    "e": lambda: read_directly(s3, chunks=args.chunk_reads),
                    "f": lambda: read_through_mount(str(local), work, interrupts),
                }
                times: dict[str, list[float]] = {name: [] for name in cases}
                requests: dict[str, Counter[str]] = {}
                for rep in range(args.repeat):
                    for name, run in cases.items():
                        s3.proxy.reset_counts()
                        times[name].append(run())
                        requests[name] = s3.proxy.counts()
                    print(
                        f"repetition {rep + 1}: "
                        + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
                        file=sys.stderr,
                    )
                print(report(times, requests, data.nbytes, stored, args))
        finally:
            with interrupts.deferred():
                server.stop()
    return 0


def report(
    times: dict[str, list[float]],
    requests: dict[str, Counter[str]],
    nbytes: int,
    stored: int,
    args: argparse.Namespace,
) -> str:
    labels = {
        "a": "(a) zarr-python 3 through the mount",
        "b": "(b) zarr-python 3 direct from S3 (obstore)",
        "c": "(c) through the mount, read_cache=0",
        "d": f"(d) {args.chunk_reads} chunks one by one, through the mount",
        "e": f"(e) {args.chunk_reads} chunks one by one, direct from S3",
        "f": "(f) as (a), from a local copy: the cost of the mount alone",
    }
    read_bytes = dict.fromkeys("abcf", nbytes) | dict.fromkeys("de", args.chunk_reads * CHUNK_BYTES)
    lines = [
        f"{nbytes >> 20} MiB uint8 array ({stored / (1 << 20):.1f} MiB stored), chunks {CHUNKS},"
        f" shards {SHARDS}; {args.delay_ms:g} ms added to every request; "
        f"median of {args.repeat}",
        "",
        "| read | seconds | MiB/s | requests (by kind) |",
        "|---|---|---|---|",
    ]
    for name, label in labels.items():
        seconds = statistics.median(times[name])
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(requests[name].items()))
        total = sum(requests[name].values())
        rate = read_bytes[name] / seconds / (1 << 20)
        lines.append(f"| {label} | {seconds:.2f} | {rate:.0f} | {total}: {kinds} |")
    lines.append("")
    for mount, direct in (("a", "b"), ("f", "b"), ("d", "e")):
        ratios = [d / m for m, d in zip(times[mount], times[direct], strict=True)]
        lines.append(
            f"({direct})/({mount}), time direct over time through the mount: median "
            f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
            "above 1 the mount is faster"
        )
    lines.append(machine())
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
