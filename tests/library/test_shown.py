"""What a kernel-served mount showed the kernel (`shardfs.view.shown`), without FUSE: reads
as of a show serve the versions it recorded, kept open on a local source, and fail where
a version is gone; shows expire with the kernel's copy."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr

from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import SourceChanged
from shardfs.storage import LocalStorage
from shardfs.storage import descriptors as descriptors_module
from shardfs.storage import watch as watch_module
from shardfs.storage.base import Pin, Stat
from shardfs.view import Namespace
from shardfs.view import shown as shown_module
from shardfs.view.nodes import Extent
from shardfs.view.shown import READ_AHEAD, TIDY_EVERY, KernelVersions, Shown
from tests.library.test_descriptors import open_files


def replace(path: Path, data: bytes) -> None:
    """Write `data` to a new file renamed over `path`, as zarr-python does."""
    path.with_suffix(".new").write_bytes(data)
    os.replace(path.with_suffix(".new"), path)


def shown_then_replaced(
    tmp_path: Path, versions_kept: int = 1024
) -> tuple[LocalStorage, KernelVersions, Shown, Stat]:
    """File `f` ("old") stat'ed and shown as inode 7, then renamed over with "newer"."""
    (tmp_path / "f").write_bytes(b"old")
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=300, versions=versions_kept)
    with storage.recording() as seen:
        stat = storage.stat("f")
    assert seen == {"f": stat}
    shown = versions.show(seen, inode=7)
    replace(tmp_path / "f", b"newer")
    return storage, versions, shown, stat


def test_a_show_records_what_was_consulted_and_reads_as_of_it(tmp_path: Path) -> None:
    storage, versions, shown, stat = shown_then_replaced(tmp_path)
    assert versions.latest(7, "") is shown
    assert storage.stat("f").size == 5
    with versions.as_of(shown):
        assert storage.stat("f") == stat
        assert storage.read("f", 0, 3, stat.version) == b"old"
        pin = storage.pin("f", stat)
    try:
        assert pin.read(0, 3) == b"old"
    finally:
        pin.close()
    with pytest.raises(SourceChanged):
        storage.read("f", 0, 3, stat.version)  # outside the block: as it is now


def test_a_version_not_kept_is_gone_once_replaced(tmp_path: Path) -> None:
    storage, versions, shown, stat = shown_then_replaced(tmp_path, versions_kept=0)
    with versions.as_of(shown), pytest.raises(SourceChanged):
        storage.read("f", 0, 3, stat.version)


def test_a_kept_version_dropped_while_read_leaves_the_reader_its_own(tmp_path: Path) -> None:
    storage, versions, shown, stat = shown_then_replaced(tmp_path, versions_kept=1)
    with versions.as_of(shown):
        pin = storage.pin("f", stat)
    (tmp_path / "g").write_bytes(b"other")
    with storage.recording() as other:
        storage.stat("g")
    versions.show(other, inode=8)  # the budget of one drops the kept "f"
    replacement = os.open(tmp_path / "g", os.O_RDONLY)  # may take the freed descriptor
    try:
        assert pin.read(0, 3) == b"old"
    finally:
        os.close(replacement)
        pin.close()


@pytest.mark.parametrize("kept", [1024, 0], ids=["kept", "not-kept"])
def test_a_located_file_is_read_from_its_kept_version_with_no_reader(
    tmp_path: Path, kept: int
) -> None:
    """`read_kept` serves the extent of a show from the version kept open, replaced since
    or not; None where the version is not kept (the caller then opens a reader)."""
    _, versions, _, stat = shown_then_replaced(tmp_path, versions_kept=kept)
    extent = Extent("f", stat, 1, 2)  # a file whose bytes are "ld" at 1 of "old"
    expected = [b"ld", b"d", b""] if kept else [None, None, None]
    assert [versions.read_kept(extent, offset, 4096) for offset in (0, 1, 2)] == expected


def test_a_kept_version_changed_in_place_is_not_read_from(tmp_path: Path) -> None:
    """An append makes the kept descriptor another version: `read_kept` says None, and
    the reader opened instead decides whether the chunk's bytes are still there."""
    (tmp_path / "f").write_bytes(b"old")
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=300)
    with storage.recording() as seen:
        stat = storage.stat("f")
    versions.show(seen, inode=7)
    extent = Extent("f", stat, 0, 3)
    assert versions.read_kept(extent, 0, 3) == b"old"
    with open(tmp_path / "f", "ab") as f:
        f.write(b"more")
    assert versions.read_kept(extent, 0, 3) is None


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """Pages of [offset, offset + length) of file `fd` in the page cache, by Linux's
    `cachestat` (6.5+), which unlike a read leaves the cache as it is; None without it."""
    libc = ctypes.CDLL(None, use_errno=True)
    span = (ctypes.c_uint64 * 2)(offset, length)
    counts = (ctypes.c_uint64 * 5)()
    if libc.syscall(451, fd, ctypes.byref(span), ctypes.byref(counts), 0) != 0:  # x86-64
        return None
    return counts[0]


def test_a_read_that_must_wait_for_the_disk_has_the_kernel_read_ahead(tmp_path: Path) -> None:
    """Inline (non-blocking), a read of a kept version whose pages are not in the page
    cache raises WouldBlock, and has the kernel read the next READ_AHEAD bytes, so that
    the reads of the chunks after it are served inline."""
    (tmp_path / "f").write_bytes(os.urandom(2 * READ_AHEAD))
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=300)
    with storage.recording() as seen:
        stat = storage.stat("f")
    versions.show(seen, inode=7)
    ahead = (READ_AHEAD // 2, READ_AHEAD // 2)  # beyond what the kernel reads ahead itself
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache
        if platform.machine() != "x86_64" or cached_pages(fd, 0, 2 * READ_AHEAD) != 0:
            pytest.skip("cannot see or empty this file's pages in the page cache here")
        with nonblocking(), pytest.raises(WouldBlock):
            versions.read_kept(Extent("f", stat, 0, 64 << 10), 0, 4096)
        deadline = time.monotonic() + 10
        while cached_pages(fd, *ahead) != ahead[1] // mmap.PAGESIZE:
            assert time.monotonic() < deadline, "the bytes ahead were never read"
            time.sleep(0.01)
        assert cached_pages(fd, READ_AHEAD, READ_AHEAD) == 0, "no more than READ_AHEAD"
    finally:
        os.close(fd)


def test_the_latest_show_wins_and_shows_expire(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=0.0)
    first = versions.show({}, inode=7)
    listing = versions.show({}, directory="d")
    assert versions.latest(7, "d") is listing
    assert versions.latest(7, "e") is first
    versions.lifetime = 0.0
    assert versions.latest(7, "d") is None


def test_a_chunk_is_served_as_shown_after_its_shard_is_renamed_over(tmp_path: Path) -> None:
    """The Zarr view, opened as of a listing's show: the chunk's bytes and size of the
    version listed, though zarr-python has since replaced the shard with bigger chunks."""
    array = zarr.create_array(tmp_path, shape=(64,), chunks=(16,), shards=(64,), dtype="int32")
    array[...] = np.ones(64, "int32")
    storage = LocalStorage(tmp_path)
    ns = Namespace(storage)
    versions = KernelVersions(storage, timeout=300)
    directory = ns.resolve("c")
    with storage.recording() as seen:
        listed = {name: attr.size for name, _, attr in ns.listing(directory).items()}
    shown = versions.show(seen, directory="c")
    with ns.open(ns.resolve("c/0")) as reader:
        old = reader.read(0, 1 << 20)
    array[...] = np.random.default_rng(1).integers(0, 2**31, 64, dtype="int32")
    with versions.as_of(shown):
        reader = ns.open(ns.resolve("c/0"))
    with reader:
        assert reader.read(0, 1 << 20) == old
        assert reader.attr().size == listed["0"] == len(old)
    with ns.open(ns.resolve("c/0")) as now:
        assert len(now.read(0, 1 << 20)) > len(old)


def test_shows_are_dropped_beyond_the_versions_they_may_hold(tmp_path: Path) -> None:
    """A listing of a directory of plain files holds a version per file: the oldest shows
    go first once all of them hold more than their budget."""
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=300, stats=10)
    first = versions.show({f"a/{i}": None for i in range(6)}, directory="a")
    versions.show({"x": None}, inode=3)
    assert versions.latest(9, "a") is first
    second = versions.show({f"b/{i}": None for i in range(6)}, directory="b")
    assert versions.latest(9, "a") is None  # 6 + 1 + 6 > 10: the oldest went
    assert versions.latest(3, "") is not None and versions.latest(9, "b") is second


def test_versions_past_their_lifetime_are_let_go_by_a_later_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shows and kept versions past their lifetime are looked for at most every
    TIDY_EVERY seconds, not at every show: they still go, descriptors closed."""
    clock = [1000.0]
    monkeypatch.setattr(shown_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    for name in "fg":
        (tmp_path / name).write_bytes(name.encode())
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=10)

    def show(name: str, inode: int) -> None:
        with storage.recording() as seen:
            storage.stat(name)
        versions.show(seen, inode=inode)

    show("f", 1)
    assert open_files(tmp_path) == ["f"]
    clock[0] += versions.lifetime + TIDY_EVERY
    show("g", 2)
    assert open_files(tmp_path) == ["g"]
    assert versions.latest(1, "") is None and versions.latest(2, "") is not None


def test_versions_past_their_lifetime_are_let_go_by_the_timer_with_no_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tidy` (the daemon's timer) lets a kept version go once its show's lifetime is
    over, with no later show: a removed file frees its space on an idle mount."""
    clock = [1000.0]
    monkeypatch.setattr(shown_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    (tmp_path / "f").write_bytes(b"f")
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=10)
    with storage.recording() as seen:
        storage.stat("f")
    versions.show(seen, inode=1)
    os.unlink(tmp_path / "f")
    removed = f"{tmp_path}/f (deleted)"
    assert removed in held_open()
    clock[0] += versions.lifetime - 0.5
    versions.tidy()
    assert removed in held_open()
    clock[0] += 1
    versions.tidy()
    assert removed not in held_open()


def held_open() -> list[str]:
    """What this process's descriptors name."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed by now
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return links


def test_versions_kept_are_half_the_descriptor_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a small RLIMIT_NOFILE the kept versions leave half the budget to the files
    read meanwhile; the pool never holds more than the budget."""
    monkeypatch.setattr(descriptors_module, "budget", lambda: 20)
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=300)
    for i in range(30):
        (tmp_path / str(i)).write_bytes(b"x")
        with storage.recording() as seen:
            storage.stat(str(i))
        versions.show(seen, inode=i + 1)
    assert len(storage._descriptors) == 10


# -- a local pin renamed over: the version it pinned, unless written to since ------------


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Write `data` over `path` in place, at its size, and set its mtime back: only its
    ctime tells, as it tells of an unlink."""
    st = path.stat()
    assert len(data) == st.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def fails_and_closes(pin: Pin) -> None:
    """A read of `pin` is SourceChanged; the pin is closed either way."""
    try:
        with pytest.raises(SourceChanged):
            pin.read(0, 3)
    finally:
        pin.close()


def pinned(tmp_path: Path) -> tuple[LocalStorage, Pin]:
    (tmp_path / "f").write_bytes(b"old")
    storage = LocalStorage(tmp_path)
    return storage, storage.pin("f", storage.stat("f"))


@pytest.mark.parametrize("gone", ["renamed over", "removed"])
def test_a_pin_rewritten_in_place_then_unlinked_is_another_version(
    tmp_path: Path, gone: str
) -> None:
    """Same inode, size and mtime as pinned and unlinked, as after a plain rename over:
    the write in place before it (seen by the watch) makes it another version."""
    _, pin = pinned(tmp_path)
    kept = pin.clone()  # a clone shares the watch, also once the original is closed
    pin.close()
    rewrite_in_place(tmp_path / "f", b"bad")
    if gone == "removed":
        os.unlink(tmp_path / "f")
    else:
        replace(tmp_path / "f", b"newer")
    fails_and_closes(kept)


@pytest.mark.parametrize("gone", ["renamed over", "removed"])
def test_a_pin_unlinked_reads_the_version_it_pinned(tmp_path: Path, gone: str) -> None:
    _, pin = pinned(tmp_path)
    if gone == "removed":
        os.unlink(tmp_path / "f")
    else:
        replace(tmp_path / "f", b"newer")
    kept = pin.clone()
    try:
        assert pin.read(0, 3) == b"old"
        pin.close()
        assert kept.read(0, 3) == b"old"
    finally:
        pin.close()
        kept.close()


def test_a_kept_version_rewritten_in_place_then_renamed_over_is_not_served(
    tmp_path: Path,
) -> None:
    """The kept pin of a show, with and without a reader: neither serves the rewrite."""
    (tmp_path / "f").write_bytes(b"old")
    storage = LocalStorage(tmp_path)
    versions = KernelVersions(storage, timeout=300)
    with storage.recording() as seen:
        stat = storage.stat("f")
    shown = versions.show(seen, inode=7)
    rewrite_in_place(tmp_path / "f", b"bad")
    replace(tmp_path / "f", b"newer")
    assert versions.read_kept(Extent("f", stat, 0, 3), 0, 3) is None
    with versions.as_of(shown), pytest.raises(SourceChanged):
        storage.read("f", 0, 3, stat.version)
    versions.close()


def test_an_unlinked_pin_written_through_a_descriptor_held_is_another_version(
    tmp_path: Path,
) -> None:
    """Nobody can open a file renamed over by name, but a writer that held it open can
    still write to it."""
    _, pin = pinned(tmp_path)
    writer = os.open(tmp_path / "f", os.O_WRONLY)
    replace(tmp_path / "f", b"newer")
    st = os.fstat(writer)
    try:
        os.pwrite(writer, b"bad", 0)
        os.utime(writer, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(SourceChanged):
            pin.read(0, 3)
    finally:
        os.close(writer)
        pin.close()


def test_a_version_rewritten_before_its_pin_is_not_vouched_for(tmp_path: Path) -> None:
    """The write came between the stat and the pin: the pin's own stat sees the ctime
    moved, so no watch vouches for the version once it is renamed over."""
    (tmp_path / "f").write_bytes(b"old")
    storage = LocalStorage(tmp_path)
    stat = storage.stat("f")
    time.sleep(0.01)  # past a tick of a coarse ctime
    rewrite_in_place(tmp_path / "f", b"bad")
    pin = storage.pin("f", stat)
    replace(tmp_path / "f", b"newer")
    fails_and_closes(pin)


def test_a_pin_that_followed_an_append_reads_it_once_renamed_over(tmp_path: Path) -> None:
    """`follow` moves the watch on: the append followed is not held against the version."""
    _, pin = pinned(tmp_path)
    with open(tmp_path / "f", "ab") as f:
        f.write(b"+more")
    now = pin.current()
    assert now is not None
    pin.follow(now)
    replace(tmp_path / "f", b"newer")
    try:
        assert pin.read(0, 8) == b"old+more"
    finally:
        pin.close()


def kernel_watches(storage: LocalStorage) -> int:
    """The watches the kernel holds for `storage`'s pins (its inotify descriptor's fdinfo)."""
    info = Path(f"/proc/self/fdinfo/{storage._watches._fd}").read_text()
    return sum(line.startswith("inotify wd:") for line in info.splitlines())


def test_pins_of_a_file_share_one_watch_kept_a_while_after_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module, "LINGER", 2)
    storage = LocalStorage(tmp_path)
    pins = []
    for name in "abcd":
        (tmp_path / name).write_bytes(b"x")
        stat = storage.stat(name)
        pins += [storage.pin(name, stat), storage.pin(name, stat)]
    pins.append(pins[0].clone())
    assert kernel_watches(storage) == 4
    for pin in pins:
        pin.close()
    assert kernel_watches(storage) == 2  # of "c" and "d", closed last
    storage.pin("d", storage.stat("d")).close()
    storage.pin("a", storage.stat("a")).close()  # watched again, "c" let go
    assert kernel_watches(storage) == 2


def test_without_a_watch_an_unlinked_version_with_a_new_ctime_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where no watch can be had (here: the cap on watches), nothing rules a write out:
    the sound answer, and one log line for all pins."""
    monkeypatch.setattr(watch_module, "WATCHES", 0)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        storage, pin = pinned(tmp_path)
        storage.pin("f", storage.stat("f")).close()
    replace(tmp_path / "f", b"newer")
    fails_and_closes(pin)
    assert len([r for r in caplog.records if "files watched" in r.getMessage()]) == 1


def test_lost_events_count_as_writes_to_every_file_watched(tmp_path: Path) -> None:
    """Writes to two other pinned files, alternating (the kernel merges repeats), past the
    event queue's size: the events lost may have been this file's, so it is not vouched
    for once renamed over."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 1 << 16:
        pytest.skip(f"an event queue of {limit} takes too long to fill")
    storage, pin = pinned(tmp_path)
    writers, others = [], []
    for name in "gh":
        (tmp_path / name).write_bytes(b"x")
        others.append(storage.pin(name, storage.stat(name)))
        writers.append(os.open(tmp_path / name, os.O_WRONLY))
    try:
        for _ in range(limit // 2 + 1):
            for fd in writers:
                os.pwrite(fd, b"y", 0)
        replace(tmp_path / "f", b"newer")
        with pytest.raises(SourceChanged):
            pin.read(0, 3)
        fresh = storage.pin("g", storage.stat("g"))  # watched after: vouched for
        replace(tmp_path / "g", b"new")
        assert fresh.read(0, 1) == b"y"
        fresh.close()
    finally:
        for fd in writers:
            os.close(fd)
        for other in [pin, *others]:
            other.close()
