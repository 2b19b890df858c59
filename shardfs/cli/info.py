"""`shardfs info`: the hierarchy of a source, array by array (see `shardfs.maintenance.info`)."""

from __future__ import annotations

import argparse
import json
import sys

from shardfs.cli.options import Commands, add_option_argument, parse_options_for
from shardfs.maintenance import progress_bar
from shardfs.maintenance.info import survey
from shardfs.primitives.errors import UsageError
from shardfs.sources import open_source
from shardfs.view.wkw import WkwSource

#: The `-o` options that mean something here: how to reach S3.
OPTIONS = ("endpoint_url", "region", "profile", "anon", "timeout")


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "info",
        help="print the arrays of SOURCE: format, shape, shards, chunks, dead space",
        description=(
            "Print every group and array of SOURCE: an array's format (sharded or not), data "
            "type, shape, shard and inner chunk shapes, the shards found, the non-empty inner "
            "chunks (read from the shard indexes) and the dead space that appends left in the "
            "shards (`shardfs compact` frees it). Changes nothing; safe while SOURCE is mounted."
            " Exit status: 0 done, 1 damaged shards found, 2 usage error."
        ),
    )
    parser.add_argument("source", help="a local directory or s3://BUCKET/PREFIX")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_option_argument(parser, OPTIONS)


def run(args: argparse.Namespace) -> int:
    from shardfs.view.precomputed import PrecomputedSource

    try:
        options = parse_options_for(args.options, OPTIONS, "info")
        source = open_source(args.source, options)
        if isinstance(source, PrecomputedSource):
            raise UsageError(
                f"source {args.source} is a Neuroglancer precomputed volume: "
                "info describes Zarr v3 sources only"
            )
    except UsageError as e:
        print(f"shardfs: {e}", file=sys.stderr)
        return 2
    if isinstance(source, WkwSource):
        _print_wkw(source, args.json)
        return 0
    # Not left on the terminal: the report follows.
    with progress_bar("info", "shards", leave=False) as progress:
        report = survey(source.storage, progress)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 1 if any(n.damaged for n in report.nodes) else 0


def _print_wkw(source: WkwSource, as_json: bool) -> None:
    """A WKW source's magnifications: one line each, or JSON (`{"wkw": [...]}`)."""
    mags = source.report()
    if as_json:
        print(json.dumps({"wkw": mags}, indent=2))
        return
    layers = sorted({m["layer"] for m in mags if m["layer"] is not None})
    print(
        f"WKW dataset, read-only: layers {', '.join(layers) or 'none'}; {len(mags)} magnifications"
    )
    for m in mags:
        shape, chunks = ("x".join(map(str, m[k])) for k in ("shape", "chunk_shape"))
        print(f"{m['path']}: mag {m['mag']}, {m['layout']}; (c, x, y, z) {shape}, chunks {chunks}")
