"""`shardfs stats MOUNTPOINT`: what a mount has done since it started, read from its daemon.

The figures come over the daemon's control socket (`shardfs.fuse.control`): asking
costs no request to the source and none through the mount.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardfs.cli.options import Commands
from shardfs.fuse.control import hit_rate, query, size_text, socket_path
from shardfs.fuse.mounts import is_stale, mount_type
from shardfs.primitives.private import UnsafeState


def add_parser(commands: Commands) -> None:
    parser = commands.add_parser(
        "stats",
        help="print what the mount at MOUNTPOINT has done since it started",
        description=(
            "Print the figures of the daemon serving MOUNTPOINT since it started: requests "
            "to the source by kind and the bytes they moved, errors and retries, the hit "
            "rates of each cache (shard indexes, listings, metadata, read-ahead, the disk "
            "cache), FUSE requests by kind, and the commits of a read-write mount. Sends no "
            "request to the source. Exit status: 0 done, 1 the daemon did not answer (gone, or"
            " failing), 2 MOUNTPOINT is not a shardfs mount."
        ),
    )
    parser.add_argument("mountpoint")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    if mount_type(args.mountpoint) != "fuse.shardfs":
        print(f"shardfs: {args.mountpoint} is not a shardfs mount", file=sys.stderr)
        return 2
    if is_stale(args.mountpoint):
        print(_gone(args.mountpoint), file=sys.stderr)
        return 1
    try:
        path = socket_path(args.mountpoint)
        stats = query(args.mountpoint)
    except UnsafeState as e:
        print(f"shardfs: the daemon of {args.mountpoint} is not asked: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        if is_stale(args.mountpoint):  # it died while asked
            print(_gone(args.mountpoint), file=sys.stderr)
            return 1
        print(
            f"shardfs: the daemon of {args.mountpoint} does not answer at {path}: {e}",
            file=sys.stderr,
        )
        return 1
    if not stats:
        print(f"shardfs: the daemon of {args.mountpoint} could not gather its figures "
              "(its log says why)", file=sys.stderr)  # fmt: skip
        return 1
    print(json.dumps(stats, indent=2) if args.json else "\n".join(lines(stats)))
    return 0


def _gone(mountpoint: str) -> str:
    """The line for a mount whose daemon died (killed, out of memory): nothing answers."""
    return (
        f"shardfs: the daemon of {mountpoint} is gone (the mount is stale: transport endpoint "
        f"is not connected); `shardfs umount {mountpoint}` clears it"
    )


def lines(stats: dict[str, Any]) -> list[str]:
    """The figures as a report for people: sizes in binary units (`--json` has the bytes)."""
    source, fuse = stats["source"], stats["fuse"]
    out = [f"up {stats['uptime']:.0f} s", "", "source requests:"]
    out += [f"  {kind:<24} {n:>12}" for kind, n in source["requests"].items()] or ["  none"]
    out += [
        f"  {'bytes read':<24} {size_text(source['bytes_read']):>12}",
        f"  {'bytes written':<24} {size_text(source['bytes_written']):>12}",
        f"  {'retries':<24} {source['retries']:>12}",
    ]
    out += [f"  error {error:<18} {n:>12}" for error, n in source["errors"].items()]
    descriptors = source.get("descriptors")  # a local source's pins
    if descriptors is not None:
        out.append(
            f"  {'descriptors open':<24} {descriptors['open']:>12} of {descriptors['limit']}"
        )
    out += [
        "",
        f"  {'cache':<24} {'hits':>12} {'misses':>12} {'hit rate':>9} {'used of budget':>22}",
    ]
    for name, figures in stats["caches"].items():
        used = f"{size_text(figures.get('used', 0))} of {size_text(figures.get('budget', 0))}"
        out.append(
            f"  {name:<24} {figures['hits']:>12} {figures['misses']:>12} "
            f"{hit_rate(figures):>9} {used:>22}"
        )
    out += ["", "FUSE requests answered in Python:"]
    out += [f"  {kind:<24} {n:>12}" for kind, n in fuse["requests"].items()]
    out += [f"  error {error:<18} {n:>12}" for error, n in fuse["errors"].items()]
    kept = fuse.get("kept")  # kernel-served mounts
    if kept is not None:
        out += ["", "kept for the kernel:", f"  {'shows':<24} {kept['shows']:>12}"]
        out.append(f"  {'versions':<24} {kept['versions']:>12} of {kept['versions_limit']}")
    out += _front_lines(fuse.get("front"))
    commits = stats.get("commits")
    if commits is not None:
        out += ["", "commits:"]
        out += [f"  {name:<24} {n:>12}" for name, n in commits.items()]
    return out


def _front_lines(front: dict[str, Any] | None) -> list[str]:
    """The native front's figures (docs/semantics.md, "Statistics")."""
    if front is None:
        return []
    if "off" in front:
        return ["", f"native front: off ({front['off']})"]
    out = ["", "native front, answered:"]
    out += [f"  {kind:<24} {n:>12}" for kind, n in front["answered"].items()]
    out.append(f"  {'of them read from disk':<24} {front['read from disk']:>12}")
    out += ["  passed on to Python:"]
    out += [f"  {kind:<24} {n:>12}" for kind, n in front["passed on"].items()]
    out += [f"  because {why:<16} {n:>12}" for why, n in front["misses"].items() if n]
    tables = ", ".join(f"{front[k]} {k}" for k in ("rows", "versions", "directories", "slots"))
    return [*out, f"  tables: {tables}"]
