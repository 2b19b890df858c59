"""Plain-text tables for the maintenance reports."""

from __future__ import annotations

from collections.abc import Sequence

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_size(nbytes: int) -> str:
    """A byte count for people: "812 B", "24.0 KiB", "1.2 GiB"."""
    if abs(nbytes) < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Aligned lines: the first `left` columns to the left, the others (numbers) to the right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
