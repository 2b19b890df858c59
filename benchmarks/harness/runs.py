"""Running a workload: signals that never lose track of a daemon, repetitions in rotated
order, and ratios of cases that ran back to back."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class Interrupts:
    """SIGINT and SIGTERM raise KeyboardInterrupt, except inside `deferred()`, which
    raises it at its end: a daemon is never started or stopped without being tracked."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.depth:
            self.pending = signum
        else:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise KeyboardInterrupt(signal.Signals(signum).name)


def run(main: Callable[[], int]) -> None:
    """Run a benchmark's `main` as a program: exit with its status, or with 130 when
    interrupted (SIGINT, SIGTERM), once every mount it made is unmounted."""
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); every mount it made is unmounted", file=sys.stderr)
        sys.exit(130)


def rotated(items: Sequence[T], rep: int) -> list[T]:
    """`items` starting at the `rep`th (modulo): each repetition another case goes first,
    so that no case always runs right after the same neighbour."""
    first = rep % len(items)
    return [*items[first:], *items[:first]]


def paired(over: Sequence[float], under: Sequence[float]) -> list[float]:
    """over / under, per repetition: the two ran back to back, so a noisy neighbour slows
    both, and their ratio is steadier than the ratio of their medians."""
    return [a / b for a, b in zip(over, under, strict=True)]


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Say `what ...`, and how long the block took."""
    started = time.perf_counter()
    print(f"{what} ...", flush=True)
    yield
    print(f"  {time.perf_counter() - started:.1f} s", flush=True)
