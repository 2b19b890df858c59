"""docs/performance.md's figures, regenerated from the result files.

The page's prose is written by hand; between the markers

    <!-- result NAME -->        ...        <!-- end result -->

everything is generated from `benchmarks/results/NAME.json` (NAME may end in `*`: every
result whose name starts so, in name order). Edit the prose, or run a benchmark (it writes its result), then:

    .venv/bin/python -m benchmarks.report            # rewrite docs/performance.md
    .venv/bin/python -m benchmarks.report --check    # exit 1 if it is not up to date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks.harness.machine import ROOT
from benchmarks.harness.results import RESULTS, Result, load

PAGE = ROOT / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- result (\S+) -->\n).*?(<!-- end result -->)", re.S)


def results(folder: Path = RESULTS) -> dict[str, Result]:
    """Every result file in `folder`, by name."""
    return {path.stem: load(path) for path in sorted(folder.glob("*.json"))}


def matching(found: dict[str, Result], pattern: str) -> list[Result]:
    if pattern.endswith("*"):
        return [r for name, r in found.items() if name.startswith(pattern[:-1])]
    return [found[pattern]] if pattern in found else []


def block(result: Result) -> str:
    """One result: what it measures against what, how it was run, its tables and notes."""
    against = f", against {result.reference}" if result.reference else ""
    floor = f"; floor: {result.floor}" if result.floor else ""
    lines = [
        f"**{result.title}**{against}{floor}.",
        f"`{result.command}` at {result.commit}, {result.date}; {result.machine['text']}.",
    ]
    for table in result.tables:
        if not table.detail:
            lines += ["", table.markdown()]
    if result.notes:  # one paragraph: the page stays short
        lines += ["", "; ".join(note.rstrip(".") for note in result.notes) + "."]
    return "\n".join(lines) + "\n"


def render(page: str, found: dict[str, Result]) -> str:
    """`page` with every generated part made again from `found`; a marker whose result is
    missing says how to make it."""

    def one(match: re.Match[str]) -> str:
        chosen = matching(found, match[2])
        body = "\n".join(block(r) for r in chosen) if chosen else f"Not measured: no {match[2]}.\n"
        return f"{match[1]}{body}{match[3]}"

    return BLOCK.sub(one, page)


def unshown(page: str, found: dict[str, Result]) -> list[str]:
    """Result files no marker of `page` shows."""
    shown = {r.workload for m in BLOCK.finditer(page) for r in matching(found, m[2])}
    return sorted(set(found) - shown)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (docs/performance.md)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the result files' folder")
    args = parser.parse_args()
    found = results(args.results)
    page = args.page.read_text()
    fresh = render(page, found)
    for name in unshown(fresh, found):
        print(
            f"{name}.json is shown nowhere: add <!-- result {name} --> to the page", file=sys.stderr
        )
    if args.check:
        if fresh != page:
            print(f"{args.page} is stale: run python -m benchmarks.report", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
