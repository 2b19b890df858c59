"""Non-blocking attempts: run a core call on the event loop unless it would wait for I/O.

Why: a worker-thread round trip costs more than serving a request whose data
is already in memory (a cached index, a chunk in the page cache), yet running
every call on the single event-loop thread would serialise cold disk reads.
So the FUSE adapter first runs a call inside `nonblocking()`; any storage
access that would have to wait raises `WouldBlock` instead, and the adapter
runs the call again in a worker thread. A retry is safe: reads change
nothing, and a mutation does all the I/O that may raise WouldBlock before it
changes any state (see `Workspace`). The mode is per thread: worker threads
always block normally.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

_state = threading.local()
T = TypeVar("T")


class WouldBlock(Exception):
    """The call needs I/O that may wait; retry it where blocking is allowed."""


class nonblocking:
    """Within this block, this thread must not wait for I/O. A plain class: every request
    enters one, and a generator-based context manager costs a few µs each time."""

    __slots__ = ("_previous",)

    def __enter__(self) -> None:
        self._previous = getattr(_state, "active", False)
        _state.active = True

    def __exit__(self, *exc: object) -> None:
        _state.active = self._previous


def attempt(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` within `nonblocking()`: what the FUSE adapter runs every request with,
    in one Python frame where the block takes two (`__enter__`, `__exit__`)."""
    previous = getattr(_state, "active", False)
    _state.active = True
    try:
        return fn(*args)
    finally:
        _state.active = previous


def may_block() -> bool:
    """Whether the current thread may wait for I/O."""
    return not getattr(_state, "active", False)


def check_may_block() -> None:
    """Raise WouldBlock in a non-blocking section (for I/O that has no cheap probe)."""
    if getattr(_state, "active", False):
        raise WouldBlock
