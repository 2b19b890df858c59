"""What the commands share of argparse: the `-o` argument of mount options (see
`shardfs.options`), and the type of the object commands are added to."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from shardfs.options import MountOptions, parse_options
from shardfs.primitives.errors import UsageError


class Commands(Protocol):
    """What `ArgumentParser.add_subparsers` returns, as far as a command module uses it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_option_argument(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """`-o OPT[,OPT...]` for a command that takes only the mount options `names`."""
    parser.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPT[,OPT...]",
        help="as for mount: " + ", ".join(names),
    )


def parse_options_for(groups: Iterable[str], names: Sequence[str], command: str) -> MountOptions:
    """`parse_options`, refusing the options that do not apply to `command` (not in `names`)."""
    options = parse_options(groups)
    for item in options.given:
        name = item.partition("=")[0]
        if name not in names:
            raise UsageError(f"option {name!r} does not apply to shardfs {command}")
    return options
