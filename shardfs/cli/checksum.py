"""`shardfs checksum`: the DANDI zarr checksum of a source as stored, or of its unsharded view."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from functools import partial

from tqdm import tqdm

from shardfs.checksum import Digest, DirectoryChecksum, stored_checksum, virtual_checksum
from shardfs.cli.options import Commands, MountOptions, add_option_argument, parse_options_for
from shardfs.maintenance import progress_bar
from shardfs.maintenance.report import format_size
from shardfs.primitives.errors import ShardfsError, UsageError
from shardfs.sources import open_source, open_storage

#: The `-o` options that mean something here: how to reach S3, the index cache, and the
#: versions to pin (a pinned source's checksum needs no request beyond its listing).
OPTIONS = (
    "endpoint_url",
    "region",
    "profile",
    "anon",
    "timeout",
    "metadata_ttl",
    "index_cache",
    "manifest",
    "as_of",
)


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "checksum",
        help="print the DANDI zarr checksum of SOURCE, as stored or as the unsharded view",
        description=(
            "Print the DANDI zarr checksum (the tree hash the DANDI Archive keeps for a zarr "
            "asset, as the zarr_checksum package computes it) of SOURCE as stored, shard files "
            "included; on S3 from the listings' ETags alone, without reading objects. With "
            "--virtual, of the unsharded view instead: every file as a mount of SOURCE shows "
            "it, so it equals the checksum of a mount or of an unsharded copy."
        ),
    )
    parser.add_argument("source", help="a local directory or s3://BUCKET/PREFIX")
    parser.add_argument(
        "--virtual", action="store_true", help="the checksum of the unsharded view of SOURCE"
    )
    parser.add_argument(
        "--view", choices=("v3", "v2"), help="with --virtual: the view (as -o view=; default v3)"
    )
    parser.add_argument(
        "--tree",
        metavar="DIR",
        help="also write each directory's .checksum document into DIR (new or empty)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the digest, file count and size as JSON"
    )
    add_option_argument(parser, OPTIONS)


def run(args: argparse.Namespace) -> int:
    options = _options(args)
    if args.view is not None and not args.virtual:
        raise UsageError("--view applies to --virtual only")
    if args.tree is not None:
        _check_empty(args.tree)
    try:
        with progress_bar("checksum", "files") as progress, documents(args.tree) as on_directory:
            digest = _compute(args, options, progress, on_directory)
    except ShardfsError as e:
        if not e.logged:
            raise
        return 1  # its line is written already
    if args.json:
        print(json.dumps({"digest": str(digest), "count": digest.count, "size": digest.size}))
    else:
        print(digest)
        if sys.stdout.isatty():  # for people; scripts reading a pipe get the bare digest
            print(_meaning(args, digest))
    return 0


def _meaning(args: argparse.Namespace, digest: Digest) -> str:
    """What the digest on a terminal is: the line under it."""
    if args.virtual:
        what = (
            f"the unsharded view (--view {args.view or 'v3'}) of {args.source}, as a mount shows it"
        )
    else:
        what = f"{args.source} as stored"
    return (
        f"  the DANDI zarr checksum ({{md5}}-{{files}}--{{bytes}}) of {what}: "
        f"{digest.count} files, {format_size(digest.size)}"
    )


def _options(args: argparse.Namespace) -> MountOptions:
    options = parse_options_for(args.options, OPTIONS, "checksum")
    options.read_only = True  # nothing is written: listings may be cached as a ro mount does
    return options


def _compute(
    args: argparse.Namespace,
    options: MountOptions,
    progress: tqdm,
    on_directory: Callable[[DirectoryChecksum], None] | None,
) -> Digest:
    if args.virtual:
        from shardfs.view import Namespace, View
        from shardfs.view.hierarchy import Hierarchy
        from shardfs.view.wkw import WkwNamespace, WkwSource

        hierarchy = open_source(args.source, options)
        if isinstance(hierarchy, WkwSource):
            view = WkwNamespace(
                hierarchy.storage,
                View(args.view or "v3"),
                index_cache=options.index_cache,
                read_cache=options.read_cache,  # blocks are read one by one: fetch ahead
            )
            return virtual_checksum(view, progress, on_directory=on_directory)
        if not isinstance(hierarchy, Hierarchy):
            raise UsageError(f"--virtual: {args.source} is not a Zarr or WKW source")
        namespace = Namespace(
            hierarchy.storage,
            index_cache=options.index_cache,
            view=View(args.view or "v3"),
            hierarchy=hierarchy,
            read_cache=0,  # shards are read in big pieces, never chunk by chunk
            listing_cache=0,  # the walk lists each directory once
        )
        return virtual_checksum(namespace, progress, on_directory=on_directory)

    storage = open_storage(args.source, options)
    digest = stored_checksum(storage, progress, on_directory=on_directory)
    if args.source.startswith("s3://") and not digest.count:
        raise UsageError(f"source {args.source} holds no objects")
    return digest


def _check_empty(directory: str) -> None:
    """Refuse a DIR with files: stale documents of directories gone since would mislead."""
    if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        raise UsageError(f"--tree {directory} must be a new or empty directory")


@contextlib.contextmanager
def documents(directory: str | None) -> Iterator[Callable[[DirectoryChecksum], None] | None]:
    """Where each directory's `.checksum` document goes as the checksum makes it: below
    `directory` (new or empty), or nowhere (None). A run that fails leaves `directory` as
    it found it, never a partial tree."""
    if directory is None:
        yield None
        return
    created = not os.path.exists(directory)
    os.makedirs(directory, exist_ok=True)
    try:
        yield partial(write_document, directory)
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        raise


def write_document(directory: str, node: DirectoryChecksum) -> None:
    """Write a directory's `.checksum` document at its path below `directory`, as DANDI
    stores them."""
    parts = node.path.split("/") if node.path else []
    if any(part in ("", ".", "..") for part in parts):
        raise UsageError(f"cannot write a .checksum document for the path {node.path!r}")
    target = os.path.join(directory, *parts)
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, ".checksum"), "w", encoding="ascii") as f:
        f.write(node.document())
