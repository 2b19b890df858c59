"""`shardfs manifest`: a DANDI Zarr manifest of an S3 Zarr as it is now (or was at a time),
so that any user of the bucket can pin that state and mount it later (`-o manifest=`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

from shardfs.cli.options import Commands, add_option_argument, parse_options_for
from shardfs.primitives.errors import StorageError, UsageError
from shardfs.sources import is_local

#: The `-o` options that mean something here: how to reach S3, and the time to pin.
OPTIONS = ("endpoint_url", "region", "profile", "anon", "timeout", "as_of")


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "manifest",
        help="write a DANDI Zarr manifest of the S3 Zarr SOURCE: every object's version now",
        description=(
            "Write a DANDI Zarr manifest (schemaVersion 2, fields versionId, lastModified, "
            "size, ETag, statistics with the zarrChecksum) of the S3 Zarr SOURCE: each "
            "object's current version, from ListObjectVersions (with -o as_of=TIMESTAMP, its "
            "version at that time). Mount it later with -o manifest=FILE to read exactly this "
            "state; the bucket must keep the versions (versioning on, old versions not expired)."
        ),
    )
    parser.add_argument("source", help="s3://BUCKET/PREFIX of a bucket with versioning")
    parser.add_argument(
        "--output", metavar="FILE", help="where to write it (default: standard output)"
    )
    add_option_argument(parser, OPTIONS)


def run(args: argparse.Namespace) -> int:
    # Imported here: boto3 and the manifest code would slow every other command's start,
    # `shardfs mount` included (as shardfs.sources imports them only for S3 sources).
    from shardfs.checksum.pinned import tree_checksum
    from shardfs.formats.dandi_manifest import format_time, write
    from shardfs.storage.pinned import PinnedS3Storage
    from shardfs.storage.s3 import parse_url

    options = parse_options_for(args.options, OPTIONS, "manifest")
    if is_local(args.source):
        raise UsageError(
            f"source {args.source}: a manifest is of an S3 source (s3://BUCKET/PREFIX)"
        )
    bucket, prefix = parse_url(args.source)
    storage = PinnedS3Storage(bucket, prefix, options.s3_config())
    try:
        tree = storage.versions(options.as_of)
    except StorageError as e:
        raise UsageError(f"source {args.source}: {e}") from None
    if not tree.entries:
        when = "" if options.as_of is None else f" at {format_time(options.as_of)}"
        raise UsageError(f"source {args.source} holds no objects{when}")
    checksum = str(tree_checksum(tree))
    if args.output is None:
        write(tree, sys.stdout, checksum)
        return 0
    # Written whole or not at all: a manifest cut short would pin nothing it names.
    directory = os.path.dirname(os.path.abspath(args.output))
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".manifest-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            write(tree, out, checksum)
        os.chmod(temporary, 0o644)
        os.replace(temporary, args.output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return 0
