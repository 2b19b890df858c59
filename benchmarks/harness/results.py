"""A benchmark run's result: the small JSON file it writes, and the tables it prints.

The schema is `benchmarks/results/SCHEMA.md`; `validate` checks a document against it, so
the report generator and the tests refuse a file that does not follow it. A run's tables
are built once, as `Table`s whose cells are text, numbers or `Spread`s (a median with its
range and count), and rendered both as the markdown printed at the end of a run and as
the JSON kept in `benchmarks/results/`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.machine import ROOT, commit, describe
from benchmarks.harness.workloads import workload

SCHEMA = 1
#: Where a workload's result goes unless `--results` says otherwise.
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Spread:
    """The median of n values with their range, shown `median (low-high)` with `digits`
    decimals (the median alone when there is one value, or when all are equal)."""

    median: float
    low: float
    high: float
    n: int
    digits: int = 2
    suffix: str = ""

    @classmethod
    def of(cls, values: Iterable[float], digits: int = 2, suffix: str = "") -> Spread:
        ordered = sorted(values)
        if not ordered:
            raise ValueError("a spread of no values")
        median = statistics.median(ordered)
        return cls(median, ordered[0], ordered[-1], len(ordered), digits, suffix)

    def __str__(self) -> str:
        f = f"{{:.{self.digits}f}}"
        text = f.format(self.median) + self.suffix
        if self.n > 1 and f.format(self.low) != f.format(self.high):
            text += f" ({f.format(self.low)}-{f.format(self.high)})"
        return text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"median": self.median, "min": self.low, "max": self.high}
        out |= {"n": self.n, "digits": self.digits}
        return out | ({"suffix": self.suffix} if self.suffix else {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Spread:
        return cls(
            data["median"],
            data["min"],
            data["max"],
            data["n"],
            data["digits"],
            data.get("suffix", ""),
        )


Cell = str | int | float | Spread | None


def cell_text(cell: Cell) -> str:
    if cell is None:
        return ""
    if isinstance(cell, float):
        return f"{cell:.3g}" if abs(cell) < 100 else f"{cell:.0f}"
    return str(cell)


def cell_json(cell: Cell) -> Any:
    return cell.to_json() if isinstance(cell, Spread) else cell


def cell_from_json(data: Any) -> Cell:
    return Spread.from_json(data) if isinstance(data, dict) else data


@dataclass
class Table:
    """One table of a result: a title (what is measured), its columns, and its rows."""

    title: str
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    #: A detail: printed and kept in the result, but not shown in docs/performance.md.
    detail: bool = False

    def row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def markdown(self) -> str:
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        numeric = [
            all(isinstance(r[i], (int, float, Spread)) or r[i] is None for r in self.rows)
            for i in range(len(self.columns))
        ]
        lines = [self.title, "", line(self.columns)]
        lines.append(
            "|" + "|".join("---:" if n and i else "---" for i, n in enumerate(numeric)) + "|"
        )
        lines += [line([cell_text(c) for c in r]) for r in self.rows]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        rows = [[cell_json(c) for c in r] for r in self.rows]
        out = {"title": self.title, "columns": self.columns, "rows": rows}
        return out | ({"detail": True} if self.detail else {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Table:
        rows = [[cell_from_json(c) for c in r] for r in data["rows"]]
        return cls(data["title"], list(data["columns"]), rows, bool(data.get("detail")))


@dataclass
class Result:
    """What one run of a workload found (see SCHEMA.md for every field)."""

    workload: str
    parameters: dict[str, Any]
    title: str = ""
    reference: str = ""
    floor: str = ""
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: str = ""
    date: str = ""
    commit: str = ""
    machine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.title:  # a new run: what it compares comes from the workloads' table
            known = workload(self.workload)
            self.title = known.title.format(**self.parameters)
            self.reference, self.floor = known.reference, known.floor
        self.command = self.command or command_line()
        self.date = self.date or datetime.date.today().isoformat()
        self.commit = self.commit or commit()
        self.machine = self.machine or describe()

    def table(self, title: str, columns: list[str], detail: bool = False) -> Table:
        self.tables.append(Table(title, columns, detail=detail))
        return self.tables[-1]

    def note(self, text: str) -> None:
        self.notes.append(text)

    def markdown(self) -> str:
        parts = [f"$ {self.command}", self.machine["text"], f"shardfs at {self.commit}"]
        parts += [f"\n{t.markdown()}" for t in self.tables]
        if self.notes:
            parts.append("")
            parts += self.notes
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "workload": self.workload,
            "title": self.title,
            "reference": self.reference,
            "floor": self.floor,
            "command": self.command,
            "date": self.date,
            "commit": self.commit,
            "machine": self.machine,
            "parameters": self.parameters,
            "tables": [t.to_json() for t in self.tables],
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        validate(data)
        fields = {k: v for k, v in data.items() if k not in ("schema", "tables")}
        return cls(**fields, tables=[Table.from_json(t) for t in data["tables"]])

    def write(self, path: Path | None) -> None:
        """Write the JSON to `path` (None: nowhere) and print the tables."""
        print()
        print(self.markdown())
        if path is None:
            return
        document = self.to_json()
        validate(document)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
        print(f"\nresult written to {os.path.relpath(path)}")


def command_line() -> str:
    """The command that is running, as one would type it at the project's root."""
    return " ".join([os.path.relpath(sys.executable, ROOT), "-m", _module(), *sys.argv[1:]])


def _module() -> str:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def load(path: Path) -> Result:
    return Result.from_json(json.loads(path.read_text()))


def add_option(parser: argparse.ArgumentParser, name: str) -> None:
    """`--results PATH` (default benchmarks/results/NAME.json; `--results none`: no file)."""
    parser.add_argument(
        "--results",
        default=str(RESULTS / f"{name}.json"),
        help=f"where the result goes (default benchmarks/results/{name}.json; 'none': nowhere)",
    )


def results_path(text: str) -> Path | None:
    return None if text == "none" else Path(text).resolve()


#: Each top-level field and its type (SCHEMA.md).
FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "workload": str,
    "title": str,
    "reference": str,
    "floor": str,
    "command": str,
    "date": str,
    "commit": str,
    "machine": dict,
    "parameters": dict,
    "tables": list,
    "notes": list,
}
SPREAD_FIELDS = {"median", "min", "max", "n", "digits"}


def validate(data: dict[str, Any]) -> None:
    """Raise ValueError where `data` does not follow SCHEMA.md."""
    problems = [
        f"{k}: missing or not {t}" for k, t in FIELDS.items() if not isinstance(data.get(k), t)
    ]
    problems += [f"{k}: not in the schema" for k in data if k not in FIELDS]
    if data.get("schema") != SCHEMA:
        problems.append(f"schema: {data.get('schema')}, this reader knows {SCHEMA}")
    if not isinstance(data.get("machine", {}).get("text"), str):
        problems.append("machine.text: missing")
    for table in data.get("tables") or []:
        if not {"title", "columns", "rows"} <= set(table):
            problems.append(f"table {table.get('title')!r}: title, columns and rows needed")
            continue
        for row in table["rows"]:
            if len(row) != len(table["columns"]):
                problems.append(f"table {table['title']!r}: a row of {len(row)} cells")
            for cell in row:
                if isinstance(cell, dict) and not set(cell) >= SPREAD_FIELDS:
                    problems.append(f"table {table['title']!r}: a spread without {SPREAD_FIELDS}")
                elif not isinstance(cell, (dict, str, int, float, type(None))):
                    problems.append(f"table {table['title']!r}: a cell of {type(cell).__name__}")
    if problems:
        raise ValueError("; ".join(problems))
