"""Every result the benchmarks write: what it measures, against which reference and which
floor. One table, so that the report shows them in this order and a new workload has one
place to say what it compares. `{name}` in a title is filled from the run's parameters."""

from __future__ import annotations

from typing import NamedTuple


class Workload(NamedTuple):
    title: str
    reference: str
    floor: str = ""


FLOOR_READ = "`benchmarks.floor serve-read`: the plain copy's files from memory, kernel-served"
FLOOR_TREE = "`benchmarks.floor serve --noopen`: pyfuse3 + trio handlers that do nothing"

WORKLOADS = {
    "read_throughput": Workload(
        "Read throughput, {size_mib} MiB: zarr-python through a mount against a plain copy",
        "zarr-python 3 on a plain unsharded copy with byte-identical chunk files",
    ),
    "cold_path-reads": Workload(
        "The cold read, broken down",
        "zarr-python 3 on the plain unsharded copy, page cache dropped",
        FLOOR_READ,
    ),
    "cold_path-variants": Workload(
        "The cold read beside experiments on the daemon",
        "zarr-python 3 on the plain unsharded copy, page cache dropped",
    ),
    "per_file": Workload(
        "Per-file cost: tiny chunk files opened, read and closed through a mount",
        "the same number of files through the floor",
        "`benchmarks.floor serve` (and `--noopen`): pyfuse3 + trio handlers that do nothing",
    ),
    "handler_cost": Workload(
        "What a handler costs in the daemon, in-process",
        "",
        "the floor's handlers (an integer lookup, bytes from memory) for as many files",
    ),
    "chunk_cost": Workload(
        "CPU per chunk read, layer by layer", "the library alone (no FUSE, no event loop)"
    ),
    "concurrency": Workload(
        "Random chunk reads by several processes at once",
        "the same readers on a plain unsharded copy (byte-identical chunk files)",
    ),
    "scale-2d": Workload(
        "Scale, 2d layout: walking a mount of 10,000-file chunk directories",
        "the same tree as plain files on local disk",
    ),
    "scale-dandi": Workload(
        "Scale, DANDI layout: walking a mount of 100-file chunk directories",
        "the same tree as plain files on local disk",
        FLOOR_TREE + ", serving the chunk tree's shape",
    ),
    "manifest_scale": Workload(
        "A mount pinned to a DANDI Zarr manifest of {entries} entries: parse, mount, memory",
        "the targets of issue 44: mounted within 10 s, daemon RSS within 256 MiB",
    ),
    "pinned_find": Workload(
        "The first `find` of a pinned tree of {objects} objects on moto",
        "the same tree mounted unpinned (listed by ListObjects); target: pinned no slower",
    ),
    "s3_read": Workload(
        "Reading a sharded array from S3: a mount against zarr-python's own S3 support",
        "zarr-python 3 reading the same array straight from S3 (obstore)",
        FLOOR_READ + " (case m)",
    ),
    "write_throughput": Workload(
        "Write throughput through a read-write mount",
        "zarr-python 3 writing a plain local directory (and natively sharded)",
    ),
    "write_throughput-small": Workload(
        "Small-chunk writes through a read-write mount",
        "the same zarr-python writing a plain local directory, with os.sync()",
    ),
    "cold_path-writes": Workload(
        "Small-chunk writes, broken down",
        "the same zarr-python writing a plain directory, with os.sync()",
        "`benchmarks.floor serve-write`: a read-write tree in memory",
    ),
    "checksum": Workload(
        "DANDI zarr checksums: the unsharded view's against zarrsum on a plain copy",
        "`zarrsum local` (the zarr_checksum package) on a plain copy of the view",
    ),
    "wkw_read": Workload(
        "A whole WKW layer read through a mount",
        "the `wkw` library reading the layer itself; the same reader on a plain copy",
    ),
    "metadata_cost": Workload(
        "A chunk file read under a big zarr.json",
        "the same array layout with a small zarr.json; shardfs at another revision",
    ),
    "rendered_document": Workload(
        "A big metadata document read through a mount",
        "a group's zarr.json of the same size passed through as stored; cat of the source file",
    ),
}


def workload(name: str) -> Workload:
    """The entry of result `name` (`read_throughput-512mib` is `read_throughput`'s)."""
    return WORKLOADS.get(name) or WORKLOADS[name.rsplit("-", 1)[0]]
