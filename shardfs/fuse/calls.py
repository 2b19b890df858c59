"""How request handlers call the library: inline first, and in a worker thread only where
the call must wait for I/O (`shardfs.primitives.blocking`): most requests of a warm mount
then cost no thread hop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio

from shardfs.primitives.blocking import WouldBlock, attempt

T = TypeVar("T")


class Caller:
    """Runs library calls for the handlers of one mount, with at most `workers` threads."""

    def __init__(self, workers: int) -> None:
        self.limiter = trio.CapacityLimiter(workers)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` inline if it needs no waiting I/O, else in a worker thread."""
        try:
            return attempt(fn, *args)
        except WouldBlock:
            return await self.thread(fn, *args)

    async def thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)
