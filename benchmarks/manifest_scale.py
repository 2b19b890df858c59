"""A mount pinned to a DANDI Zarr manifest of a million entries: parse and mount time, RSS.

DANDI Zarrs hold up to about a million entries, so a manifest can be about 100 MB of
JSON. This writes one of ENTRIES entries (ten sharded arrays of ENTRIES / 10 shards each,
in directories of 1,000, sorted as DANDI's published ones are) and mounts it with
`-o manifest=FILE` over moto (on 127.0.0.1): listings come from the manifest, so the
bucket holds only the metadata documents, at the versions the manifest names. Measured
per mount: seconds from `shardfs mount -f` until the mount's root answers (reading and
parsing the manifest, checking its zarrChecksum, opening the hierarchy), and the
daemon's RSS then and after listing a directory of shards' chunk files. Targets (issue
44): mounted within 10 s, RSS within 256 MiB. The parse alone, in this process, is
shown beside it.

    .venv/bin/python -m benchmarks.manifest_scale [--entries 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import results
from benchmarks.harness.daemons import Child
from benchmarks.harness.moto import moto_run
from benchmarks.harness.procs import memory
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts
from shardfs.checksum.pinned import tree_checksum
from shardfs.formats.dandi_manifest import parse
from tests.support.backends import bucket
from tests.support.s3 import S3Env

ARRAYS = 10
#: Shards per directory (`c/<i>/` holds this many `c/<i>/<j>`).
ROW = 1000
SHARD = 64
CHUNK = 16
TARGET_SECONDS = 10.0
TARGET_RSS_MIB = 256


def array_document(rows: int) -> bytes:
    """The zarr.json of a sharded uint8 array of `rows` x ROW shards of SHARD x SHARD."""
    return json.dumps(
        {
            "zarr_format": 3,
            "node_type": "array",
            "shape": [rows * SHARD, ROW * SHARD],
            "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [SHARD, SHARD]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [CHUNK, CHUNK],
                        "codecs": [{"name": "bytes"}],
                        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    },
                }
            ],
        }
    ).encode()


def put_documents(s3: S3Env, rows: int) -> dict[str, list[Any]]:
    """Store the metadata documents; their manifest entries, by key below `data/`."""
    s3.admin.put_bucket_versioning(Bucket=s3.bucket, VersioningConfiguration={"Status": "Enabled"})
    documents = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group"}).encode()}
    documents |= {f"a{n}/zarr.json": array_document(rows) for n in range(ARRAYS)}
    entries = {}
    for key, body in documents.items():
        answer = s3.admin.put_object(Bucket=s3.bucket, Key=f"data/{key}", Body=body)
        etag = answer["ETag"].strip('"')
        entries[key] = [answer["VersionId"], "2024-01-01T00:00:00+00:00", len(body), etag]
    return entries


def write_manifest(path: Path, entries: int, documents: dict[str, list[Any]]) -> int:
    """Write a manifest of about `entries` entries; how many it has."""
    rows = entries // ARRAYS // ROW
    count = 0
    with open(path, "w") as out:
        out.write('{"schemaVersion": 2, "fields": ["versionId", "lastModified", "size", "ETag"], ')
        out.write('"statistics": {"entries": 0, "zarrChecksum": "unknown"}, "entries": {')
        out.write(f'"zarr.json": {json.dumps(documents["zarr.json"])}')
        for n in range(ARRAYS):
            out.write(f', "a{n}": {{"c": {{')
            for i, row in enumerate(sorted(map(str, range(rows)))):
                cells = []
                for j in sorted(map(str, range(ROW))):
                    digest = hashlib.md5(f"{n}/{row}/{j}".encode()).hexdigest()
                    version = digest[::-1]
                    second = (int(row) * ROW + int(j)) % 86400
                    when = (
                        f"2024-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
                    )
                    cells.append(f'"{j}": ["{version}", "{when}+00:00", 4096, "{digest}"]')
                    count += 1
                out.write(f'{", " if i else ""}"{row}": {{{", ".join(cells)}}}')
            out.write(f'}}, "zarr.json": {json.dumps(documents[f"a{n}/zarr.json"])}}}')
        out.write("}}\n")
    return count + len(documents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    results.add_option(parser, "manifest_scale")
    args = parser.parse_args()
    interrupts = Interrupts()
    rows = max(1, args.entries // ARRAYS // ROW)
    with (
        moto_run("shardfs-manifest-bench-", interrupts) as (work, server),
        bucket(server, "bench") as s3,
    ):
        try:
            result = measure(s3, work, rows, args, interrupts)
        finally:
            for page in s3.admin.get_paginator("list_object_versions").paginate(Bucket=s3.bucket):
                for v in page.get("Versions", ()):
                    s3.admin.delete_object(Bucket=s3.bucket, Key=v["Key"], VersionId=v["VersionId"])
    result.write(results.results_path(args.results))


def measure(
    s3: S3Env, work: Path, rows: int, args: argparse.Namespace, interrupts: Interrupts
) -> Result:
    documents = put_documents(s3, rows)
    manifest = work / "manifest.json"
    entries = write_manifest(manifest, args.entries, documents)
    size = manifest.stat().st_size
    parse_times, check_times, mount_times, rss, listed_rss, peak = [], [], [], [], [], []
    for _ in range(args.repeat):
        started = time.perf_counter()
        with open(manifest, "rb") as f:
            tree = parse(f, str(manifest))
        parse_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        tree_checksum(tree)
        check_times.append(time.perf_counter() - started)
        del tree
        options = [*s3.mount_options(direct=True), f"manifest={manifest}", "ro"]
        mountpoint = work / "mnt"
        command = [sys.executable, "-m", "shardfs", "mount", s3.url("data"), str(mountpoint)]
        command += ["-f", "-o", ",".join(options)]
        with Child(interrupts, mountpoint, work / "mount.log", "fuse.shardfs") as child:
            mount_times.append(child.start(command))
            rss.append(memory(child.pid, "VmRSS") / 1024)
            # The rows of chunks: what a walk lists first (chunk files would need the shards'
            # indexes, which this bucket does not hold).
            listed = os.listdir(mountpoint / "a3" / "c")
            assert len(listed) == rows * (SHARD // CHUNK), len(listed)
            listed_rss.append(memory(child.pid, "VmRSS") / 1024)
            peak.append(memory(child.pid, "VmHWM") / 1024)
    result = Result(
        "manifest_scale",
        {"entries": entries, "manifest_mib": round(size / (1 << 20)), "repeat": args.repeat},
    )
    table = result.table(
        f"A manifest of {entries:,} entries ({size / (1 << 20):.0f} MiB of JSON) mounted with "
        f"-o manifest= over moto; median (range) of {args.repeat}",
        ["step", "value", "target"],
    )
    table.row("parse alone, in-process (s)", Spread.of(parse_times), None)
    table.row("its zarrChecksum check alone, in-process (s)", Spread.of(check_times), None)
    table.row(
        "`shardfs mount -f` until the root answers (s)",
        Spread.of(mount_times),
        f"<= {TARGET_SECONDS:g}",
    )
    table.row("daemon RSS when mounted (MiB)", Spread.of(rss, 0), f"<= {TARGET_RSS_MIB}")
    table.row(
        "daemon RSS after listing an array's rows of chunks (MiB)", Spread.of(listed_rss, 0),
        f"<= {TARGET_RSS_MIB}",
    )  # fmt: skip
    table.row("daemon peak RSS, VmHWM (MiB)", Spread.of(peak, 0), f"<= {TARGET_RSS_MIB}")
    result.note(
        "The mount time includes reading the manifest from local disk, parsing it into "
        "per-directory tables and checking its entries against its zarrChecksum (which this "
        "generated manifest does not match: one log line); the peak is reached while parsing."
    )
    return result


if __name__ == "__main__":
    main()
