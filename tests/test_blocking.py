"""Non-blocking attempts: storage and caches refuse to wait instead of waiting."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from shardfs.storage import LocalStorage
from shardfs.storage.blocking import WouldBlock, may_block, nonblocking
from shardfs.view.cache import LruCache


def test_mode_is_per_thread_and_nests() -> None:
    seen: list[bool] = []
    with nonblocking():
        assert not may_block()
        with nonblocking():
            pass
        assert not may_block()  # the inner block restored the outer state
        worker = threading.Thread(target=lambda: seen.append(may_block()))
        worker.start()
        worker.join()
    assert may_block()
    assert seen == [True]


def test_local_read_from_page_cache_does_not_block(tmp_path: Path) -> None:
    path = tmp_path / "f"
    data = os.urandom(1 << 20)
    path.write_bytes(data)
    storage = LocalStorage(tmp_path)
    stat = storage.stat("f")
    assert stat is not None
    storage.read("f", 0, len(data))  # now in the page cache
    with nonblocking():
        assert storage.read("f", 4096, 8192, stat.version) == data[4096 : 4096 + 8192]


def test_local_read_of_evicted_data_would_block(tmp_path: Path) -> None:
    """POSIX_FADV_DONTNEED is advice: on a busy machine the kernel may keep some pages.
    So each attempt uses a new file, and one attempt out of five must find it evicted
    and refuse to wait; a read that never refuses fails all five."""
    storage = LocalStorage(tmp_path)
    for attempt in range(5):
        path = tmp_path / f"f{attempt}"
        data = os.urandom(4 << 20)
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        try:
            with nonblocking():
                storage.read(path.name, 2 << 20, 65536)
        except WouldBlock:
            assert storage.read(path.name, 2 << 20, 65536) == data[2 << 20 : (2 << 20) + 65536]
            return
    pytest.fail("no read of evicted data refused to wait")


def test_local_listing_would_block(tmp_path: Path) -> None:
    with nonblocking(), pytest.raises(WouldBlock):
        LocalStorage(tmp_path).list("")


def test_cache_does_not_wait_for_another_load_in_nonblocking_mode() -> None:
    cache: LruCache[int] = LruCache(100, lambda v: 1)
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(10)
        return 7

    results: list[int] = []
    loader = threading.Thread(target=lambda: results.append(cache.get("k", slow)))
    loader.start()
    try:
        assert started.wait(10)
        with nonblocking(), pytest.raises(WouldBlock):
            cache.get("k", lambda: 0)
    finally:
        release.set()
        loader.join()
    assert results == [7]
    with nonblocking():
        assert cache.get("k", lambda: 0) == 7  # a hit needs no waiting


def test_waiter_loads_itself_when_the_loader_gave_up() -> None:
    """A non-blocking loader that hits I/O gives up; a blocking waiter must not fail with it."""
    cache: LruCache[int] = LruCache(100, lambda v: 1)
    entered, waiting = threading.Event(), threading.Event()

    def gives_up() -> int:
        entered.set()
        waiting.wait(10)
        time.sleep(0.05)  # let the waiter block on this load
        raise WouldBlock

    def first() -> None:
        with nonblocking(), pytest.raises(WouldBlock):
            cache.get("k", gives_up)

    loader = threading.Thread(target=first)
    loader.start()
    assert entered.wait(10)
    waiting.set()
    assert cache.get("k", lambda: 42) == 42
    loader.join()
    assert cache.stats.loads == 2
