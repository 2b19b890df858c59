"""A tiny progress bar for long maintenance runs, without a dependency.

On a terminal it redraws one line in place (at most `INTERVAL` apart, so a
fast run does not spend its time printing); anywhere else (a log, a pipe) it
writes only the final line, so no control characters end up in files.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

#: Seconds between two redraws on a terminal.
INTERVAL = 0.1
_WIDTH = 30


def _bytes(done: int, total: int) -> str:
    """`12.3/456.7 MiB`: both in the total's unit, so a redrawn line never gets shorter."""
    unit, scale = "B", 1
    for name in ("KiB", "MiB", "GiB", "TiB"):
        if total < scale << 10:
            break
        unit, scale = name, scale << 10
    if scale == 1:
        return f"{done}/{total} B"
    return f"{done / scale:.1f}/{total / scale:.1f} {unit}"


class Progress:
    """Counts the done items of a known total: `start(total)`, `advance()`, then `finish()`
    (or use it as a context manager, which finishes it even on an error). With
    `start(total, total_bytes)` it counts bytes too, for runs whose items vary in size."""

    def __init__(
        self,
        label: str,
        stream: TextIO,
        unit: str = "shards",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = 0
        self.done = 0
        self.total_bytes: int | None = None
        self.done_bytes = 0
        self._stream = stream
        self._tty = stream.isatty()
        self._clock = clock
        self._started: float | None = None
        self._drawn = -math.inf

    def start(self, total: int, total_bytes: int | None = None) -> None:
        self.total, self.done = total, 0
        self.total_bytes, self.done_bytes = total_bytes, 0
        self._started = self._clock()
        self._redraw(force=True)

    def advance(self, count: int = 1, nbytes: int = 0) -> None:
        self.done += count
        self.done_bytes += nbytes
        self._redraw()

    def finish(self) -> None:
        """Write the final line (once), ending the redrawn one on a terminal."""
        if self._started is None:
            return
        elapsed = self._clock() - self._started
        self._stream.write(f"{self._prefix()}{self.line()}, {elapsed:.1f} s\n")
        self._stream.flush()
        self._started = None

    def line(self) -> str:
        """`compact  [#####.....] 123/456 shards` (`, 12.3/456.7 MiB` when counting bytes)"""
        filled = _WIDTH * self.done // self.total if self.total else _WIDTH
        bar = "#" * filled + "." * (_WIDTH - filled)
        line = f"{self.label}  [{bar}] {self.done}/{self.total} {self.unit}"
        if self.total_bytes is None:
            return line
        return f"{line}, {_bytes(self.done_bytes, self.total_bytes)}"

    def _prefix(self) -> str:
        return "\r" if self._tty else ""

    def _redraw(self, force: bool = False) -> None:
        if not self._tty:
            return
        now = self._clock()
        if force or now - self._drawn >= INTERVAL:
            self._drawn = now
            self._stream.write(self._prefix() + self.line())
            self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish()
