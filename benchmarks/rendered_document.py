"""What a big metadata document costs to read through a mount: the zarr.json the view
writes for a sharded array (its stored attributes spliced in), against a group's zarr.json
of the same size passed through as stored, and against `cat` of the source file.

zarr-python 3 writes the array and the group, each with about `--size-mib` MiB of
attributes. Each repetition mounts the source afresh (read-only, kernel-served) and reads
the passed-through document and then the rendered one whole, with the source's page cache
warm: what is timed is the mount's own cost, the lookup that parses the document included.
Ratios are per repetition, rendered / passed through.

    .venv/bin/python -m benchmarks.rendered_document [--size-mib 64] [--repeat 5]
        [--data DIR] [--results PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import zarr

from benchmarks.harness import results
from benchmarks.harness.daemons import DataDir, MountManager
from benchmarks.harness.results import Result, Spread
from benchmarks.harness.runs import Interrupts, paired, run


class Documents(DataDir):
    def __init__(self, data: Path, size_mib: int) -> None:
        super().__init__(data)
        self.size_mib = size_mib

    @property
    def params(self) -> dict[str, object]:
        return {"size_mib": self.size_mib}

    def make(self) -> None:
        """An array and a group whose attributes hold `size_mib` MiB of 1 KiB strings."""
        if self.ready():
            return
        blob = {"blob": ["x" * 1000 + str(i) for i in range(self.size_mib * 1024)]}
        zarr.create_group(self.source, overwrite=True)
        array = zarr.create_array(
            self.source / "array", shape=(64,), chunks=(8,), shards=(32,), dtype="int32"
        )
        array.attrs.update(blob)
        zarr.open_group(self.source / "group", mode="a").attrs.update(blob)
        self.made()


def timed_read(path: Path) -> tuple[float, int]:
    start = time.perf_counter()
    size = len(path.read_bytes())
    return time.perf_counter() - start, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=Path("bench-data/rendered-document"))
    results.add_option(parser, "rendered_document")
    args = parser.parse_args()
    dataset = Documents(args.data, args.size_mib)
    dataset.data.mkdir(parents=True, exist_ok=True)
    dataset.make()
    stored = dataset.source / "array" / "zarr.json"
    print(f"stored array zarr.json: {stored.stat().st_size / (1 << 20):.1f} MiB")
    mounts = MountManager(dataset, Interrupts())
    rows: dict[str, list[float]] = {"cat source": [], "passed through": [], "rendered": []}
    try:
        for _ in range(args.repeat):
            rows["cat source"].append(timed_read(stored)[0])
            mounted = mounts.fresh()
            passed, _ = timed_read(mounted.path / "group" / "zarr.json")
            rendered, size = timed_read(mounted.path / "array" / "zarr.json")
            mounts.stop()
            rows["passed through"].append(passed)
            rows["rendered"].append(rendered)
    finally:
        mounts.stop()
    result = Result("rendered_document", {"size_mib": args.size_mib, "repeat": args.repeat})
    table = result.table(
        f"The array's zarr.json as the view renders it ({size / (1 << 20):.1f} MiB, stored "
        f"{stored.stat().st_size / (1 << 20):.1f} MiB), read whole after a fresh `-o ro` "
        f"mount, source page cache warm; median (range) of {args.repeat}",
        ["read", "s", "rendered / this"],
    )
    for name, times in rows.items():
        table.row(name, Spread.of(times, 3), Spread.of(paired(rows["rendered"], times), 2, "x"))
    result.note("target: rendered / passed through <= 2")
    result.write(results.results_path(args.results))
    return 0


if __name__ == "__main__":
    run(main)
