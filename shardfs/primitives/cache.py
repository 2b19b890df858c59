"""A thread-safe LRU cache with a byte budget and single-flight loading."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from shardfs.primitives.blocking import WouldBlock, may_block

V = TypeVar("V")
E = TypeVar("E", bound=BaseException)


@dataclass
class CacheStats:
    hits: int = 0
    loads: int = 0
    evictions: int = 0


def detached(error: E) -> E:
    """A fresh copy of `error` to keep: its type, arguments and attributes (`logged`),
    without the traceback, context and cause that the raised one holds. Those pin the
    frames of the code that failed, and with them every buffer it was decoding (an
    inflated index, say) for as long as the error is kept."""
    return copy.copy(error)  # copies args and __dict__, never __traceback__ or the chain


class _Failure:
    """A cached load error, so a corrupt object is reported once, not on every request.
    It keeps a `detached` copy, and raises a fresh copy of that each time, so the kept
    one never gets a traceback either."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = detached(error)


class LruCache(Generic[V]):
    """Values by key, least recently used evicted first once `budget` is exceeded.

    `cost(value)` is the size charged against the budget. Concurrent `get`s
    of a missing key share one call of the loader: the first caller loads,
    the others wait for its result. Errors of the types in `cache_errors`
    are cached like values (costing `error_cost`); others are not. In a
    non-blocking section a caller does not wait for another's load: it
    raises WouldBlock; and a waiter whose loader gave up with WouldBlock
    loads the value itself.
    """

    def __init__(
        self,
        budget: int,
        cost: Callable[[V], int],
        cache_errors: tuple[type[BaseException], ...] = (),
        error_cost: int = 256,
    ) -> None:
        self.budget = budget
        self._cost = cost
        self._cache_errors = cache_errors
        self._error_cost = error_cost
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, tuple[V | _Failure, int]] = OrderedDict()
        self._loading: dict[Hashable, Future[V | _Failure]] = {}
        self.used = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._items)

    def snapshot(self) -> dict[str, int]:
        """Its figures for `shardfs stats`: hits, misses (loads), evictions, bytes used."""
        with self._lock:
            stats = self.stats
            return {
                "hits": stats.hits,
                "misses": stats.loads,
                "evictions": stats.evictions,
                "used": self.used,
                "budget": self.budget,
            }

    def get(self, key: Hashable, load: Callable[[], V]) -> V:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                self.stats.hits += 1
                return self._unwrap(item[0])
            pending = self._loading.get(key)
            if pending is None:
                future: Future[V | _Failure] = Future()
                self._loading[key] = future
                self.stats.loads += 1
        if pending is not None:
            if not may_block():
                raise WouldBlock
            try:
                return self._unwrap(pending.result())
            except WouldBlock:
                return self.get(key, load)
        try:
            value: V | _Failure = load()
        except self._cache_errors as e:
            value = _Failure(e)
        except BaseException as e:
            with self._lock:
                del self._loading[key]
            future.set_exception(e)
            raise
        cost = self._error_cost if isinstance(value, _Failure) else self._cost(value)
        with self._lock:
            del self._loading[key]
            self._store(key, value, cost)
        future.set_result(value)
        return self._unwrap(value)

    def peek(self, key: Hashable) -> V | None:
        """The cached value of `key`, or None; never loads."""
        with self._lock:
            item = self._items.get(key)
            if item is None or isinstance(item[0], _Failure):
                return None
            self._items.move_to_end(key)
            self.stats.hits += 1
            return item[0]

    def put(self, key: Hashable, value: V) -> None:
        """Cache a value loaded by the caller (several at once, say, from one request)."""
        with self._lock:
            self._discard(key)
            self.stats.loads += 1
            self._store(key, value, self._cost(value))

    def _store(self, key: Hashable, value: V | _Failure, cost: int) -> None:
        if cost > self.budget:
            return
        self._items[key] = (value, cost)
        self.used += cost
        while self.used > self.budget:
            _, (_, evicted) = self._items.popitem(last=False)
            self.used -= evicted
            self.stats.evictions += 1

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._discard(key)

    def _discard(self, key: Hashable) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.used -= item[1]

    @staticmethod
    def _unwrap(value: V | _Failure) -> V:
        if isinstance(value, _Failure):
            # A copy, so that callers in several threads do not share one traceback.
            raise detached(value.error)
        return value
