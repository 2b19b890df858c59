"""docs/performance.md shows the committed benchmark results, generated from them: they
cannot drift apart. Every result file follows the published schema, and every one is
shown on the page."""

from __future__ import annotations

import json

import pytest

from benchmarks import report
from benchmarks.harness.results import RESULTS, Result, Spread, Table, validate


def test_the_page_is_generated_from_the_committed_results() -> None:
    found = report.results()
    page = report.PAGE.read_text()
    assert found, "no result files in benchmarks/results"
    assert report.render(page, found) == page, "run: python -m benchmarks.report"
    assert report.unshown(page, found) == []


def test_every_result_file_follows_the_schema() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        validate(data)
        assert data["workload"] == path.stem
        assert Result.from_json(data).to_json() == data  # nothing lost in a round trip


def test_the_check_finds_a_figure_edited_by_hand() -> None:
    found = report.results()
    name = next(iter(found))
    page = report.render(f"# t\n\n<!-- result {name} -->\n<!-- end result -->\n", found)
    table = next(t for t in found[name].tables if not t.detail)
    first = table.markdown().splitlines()[4]  # the first row
    edited = page.replace(first, first.replace("|", "| 9", 2), 1)
    assert edited != page
    assert report.render(edited, found) == page


def test_a_spread_shows_median_and_range() -> None:
    assert str(Spread.of([3.0, 1.0, 2.0])) == "2.00 (1.00-3.00)"
    assert str(Spread.of([1.5], 1, "x")) == "1.5x"
    table = Table("t", ["a", "b"])
    table.row("x | y", Spread.of([1, 2, 3], 0))
    assert table.markdown().splitlines()[-1] == "| x \\| y | 2 (1-3) |"


def test_a_result_off_the_schema_is_refused() -> None:
    data = json.loads(next(RESULTS.glob("*.json")).read_text())
    with pytest.raises(ValueError, match="commit"):
        validate({k: v for k, v in data.items() if k != "commit"})
    data["tables"][0]["rows"].append(["one cell"])
    with pytest.raises(ValueError, match="a row of 1 cells"):
        validate(data)
