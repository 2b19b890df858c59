"""Non-blocking attempts: storage and caches refuse to wait instead of waiting."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from shardfs.primitives.blocking import WouldBlock, may_block, nonblocking
from shardfs.primitives.cache import LruCache
from shardfs.storage import LocalStorage, local


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


def listed(storage: LocalStorage, key: str) -> dict[str, int]:
    return {entry.name: entry.stat.size for entry in storage.list(key)}


def test_a_settled_small_directory_is_listed_again_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory listed once is listed again in non-blocking mode from its kept names,
    each stated afresh, for as long as the directory itself has not changed."""
    monkeypatch.setattr(local, "NAMES_SETTLED", 0)  # no waiting for its mtime to age
    (tmp_path / "d").mkdir()
    for name in "abc":
        (tmp_path / "d" / name).write_bytes(b"x")
    storage = LocalStorage(tmp_path)
    assert listed(storage, "d") == {"a": 1, "b": 1, "c": 1}  # may block: the first time
    with (tmp_path / "d" / "b").open("ab") as f:
        f.write(b"yy")  # an append in place changes the file, not the directory
    with nonblocking():
        assert listed(storage, "d") == {"a": 1, "b": 3, "c": 1}
    time.sleep(0.02)  # past a tick of the file system's clock
    (tmp_path / "d" / "e").write_bytes(b"")  # the directory changed: listed afresh
    with nonblocking(), pytest.raises(WouldBlock):
        storage.list("d")
    assert listed(storage, "d") == {"a": 1, "b": 3, "c": 1, "e": 0}


def test_names_are_not_kept_while_a_directory_may_change_unseen(tmp_path: Path) -> None:
    """A directory changed within the last moments may change again within the same
    clock tick, leaving its mtime as it was: its names are not kept."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"")
    storage = LocalStorage(tmp_path)
    storage.list("d")
    with nonblocking(), pytest.raises(WouldBlock):
        storage.list("d")


def test_names_of_a_big_directory_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "NAMES_SETTLED", 0)
    for i in range(local.NAMES_DIR_SIZE + 1):
        (tmp_path / str(i)).write_bytes(b"")
    storage = LocalStorage(tmp_path)
    storage.list("")
    with nonblocking(), pytest.raises(WouldBlock):
        storage.list("")


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
