"""Read-ahead of neighbouring chunks (`shardfs.view.readahead`), on a store that counts reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from shardfs.formats.shard_index import EMPTY
from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.storage import LocalStorage, Stat
from shardfs.storage.base import Pin
from shardfs.view import readahead
from shardfs.view.readahead import AHEAD, WALKED, HasExtents, ReadAhead

KIB = 1 << 10


class CountingStorage(LocalStorage):
    """A local directory that claims costly requests and records every read."""

    request_cost = 1 << 20

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[int, int]] = []
        self.keys: list[str] = []

    def read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        self.reads.append((offset, length))
        self.keys.append(key)
        return super().read(key, offset, length, version)


@dataclass(frozen=True, eq=False)
class Table(HasExtents):
    stat: Stat
    entries: np.ndarray


def shard(tmp_path: Path, sizes: list[int], gaps: dict[int, int] | None = None, name: str = "s"):
    """A shard file of chunks of `sizes` (chunk i holds byte i), `gaps[i]` bytes before chunk i."""
    data, entries = bytearray(), []
    for i, size in enumerate(sizes):
        data += b"\xff" * (gaps or {}).get(i, 0)
        entries.append((len(data), size))
        data += bytes([i]) * size
    entries.append((int(EMPTY), int(EMPTY)))  # an empty slot is never fetched
    (tmp_path / name).write_bytes(bytes(data))
    storage = CountingStorage(tmp_path)
    stat = storage.stat(name)
    assert stat is not None
    table = Table(stat, np.array(entries, dtype=np.uint64).reshape(len(entries), 2))
    return storage, table, entries[:-1]


def test_a_walk_costs_two_reads_and_chunks_come_back_exact(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [300 * KIB] * 10)
    ahead = ReadAhead(storage, 64 << 20)
    order = [4, 5, 3, 6, 0, 1, 2, 7, 8, 9]  # concurrent readers do not ask in order
    for i in order:
        offset, size = entries[i]
        assert ahead.read(Pin(storage, "s", table.stat), table, offset, size) == bytes([i]) * size
    # The first read takes 1 MiB around chunk 4; the second, the rest of the shard.
    assert len(storage.reads) == 2, storage.reads
    assert storage.reads[0][1] <= 1 << 20


def test_a_single_read_fetches_little(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [300 * KIB] * 10)
    ahead = ReadAhead(storage, 64 << 20)
    ahead.read(Pin(storage, "s", table.stat), table, *entries[0])
    assert storage.reads == [(0, 900 * KIB)]


def test_big_gaps_are_not_read_over(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [100 * KIB] * 4, gaps={2: 2 << 20})
    ahead = ReadAhead(storage, 64 << 20)
    ahead.read(Pin(storage, "s", table.stat), table, *entries[0])
    ahead.read(Pin(storage, "s", table.stat), table, *entries[1])
    assert ahead.read(Pin(storage, "s", table.stat), table, *entries[2]) == bytes([2]) * 100 * KIB
    assert storage.reads == [(0, 200 * KIB), (entries[2][0], 200 * KIB)]


def test_cached_reads_need_no_blocking_and_misses_say_so(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [100 * KIB] * 3)
    ahead = ReadAhead(storage, 64 << 20)
    ahead.read(Pin(storage, "s", table.stat), table, *entries[0])
    with nonblocking():
        assert (
            ahead.read(Pin(storage, "s", table.stat), table, *entries[1]) == bytes([1]) * 100 * KIB
        )
        ahead.cache.discard(("s", table.stat.version, *entries[2]))
        with pytest.raises(WouldBlock):
            ahead.read(Pin(storage, "s", table.stat), table, *entries[2])


def test_versions_never_mix(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [100 * KIB] * 3)
    ahead = ReadAhead(storage, 64 << 20)
    ahead.read(Pin(storage, "s", table.stat), table, *entries[0])
    _, table2, _ = shard(tmp_path, [100 * KIB] * 3, gaps={0: 1})  # rewritten
    other = Table(table2.stat, table.entries)  # the old places, in the new version
    offset, size = entries[1]
    expected = (tmp_path / "s").read_bytes()[offset : offset + size]
    assert expected != bytes([1]) * size
    assert ahead.read(Pin(storage, "s", other.stat), other, offset, size) == expected


def test_stores_with_cheap_requests_only_pass_reads_through(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [100 * KIB] * 3)
    storage.request_cost = 0
    ahead = ReadAhead(storage, 64 << 20)
    for entry in entries:
        ahead.read(Pin(storage, "s", table.stat), table, *entry)
    assert storage.reads == entries


class HeldStorage(CountingStorage):
    """As if the bytes in `held` (block-aligned) were in a disk cache: `local_span` says
    so for ranges within them, in blocks of `block`."""

    def __init__(self, root: Path, block: int, held: tuple[int, int]) -> None:
        super().__init__(root)
        self.block, self.held = block, held

    def local_span(
        self, key: str, offset: int, length: int, version: Hashable
    ) -> tuple[int, int] | None:
        start = offset // self.block * self.block
        end = -(-(offset + length) // self.block) * self.block
        return (start, end) if self.held[0] <= start and end <= self.held[1] else None


def test_chunks_held_locally_are_read_a_block_at_a_time(tmp_path: Path) -> None:
    """No window sized for round trips where the store holds the bytes (a disk cache): a
    walker reads the block of each chunk it misses, and the shard's uncached part the
    usual way."""
    _, table, entries = shard(tmp_path, [100 * KIB] * 20)
    storage = HeldStorage(tmp_path, 512 * KIB, (0, 1 << 20))
    ahead = ReadAhead(storage, 64 << 20)
    for i, entry in enumerate(entries):
        assert ahead.read(Pin(storage, "s", table.stat), table, *entry) == bytes([i]) * 100 * KIB
    # Chunks 0-4 lie in block 0; 5 in blocks 0-1, read with what else they hold that is
    # not cached (the chunks a reader asked for are not kept: the kernel keeps those).
    # Chunk 10 is not held: a walker's window takes the rest of the shard, as ever.
    assert storage.reads == [(0, 500 * KIB), (0, 1000 * KIB), (500 * KIB, 1500 * KIB)]


def test_a_walker_of_a_shard_gets_the_next_shards_fetched_ahead(tmp_path: Path) -> None:
    tables = {}
    for name in ("s0", "s1", "s2", "s3"):
        storage, tables[name], entries = shard(tmp_path, [300 * KIB] * 4, name=name)
    ahead = ReadAhead(storage, 64 << 20)
    asked: list[int] = []

    def next_shard(n: int):
        asked.append(n)
        name = f"s{n}"
        return (name, tables[name]) if name != "s2" else None  # s2 does not exist

    ahead.read(Pin(storage, "s0", tables["s0"].stat), tables["s0"], *entries[0], next_shard)
    assert asked == [], "one read is not a walk: nothing is fetched ahead"
    ahead.read(Pin(storage, "s0", tables["s0"].stat), tables["s0"], *entries[3], next_shard)
    deadline = time.monotonic() + 10
    while sorted(asked) != list(range(1, AHEAD + 1)) or "s1" not in storage.keys:
        assert time.monotonic() < deadline, (asked, storage.keys)
        time.sleep(0.01)
    before = len(storage.reads)
    for i in range(4):
        assert (
            ahead.read(Pin(storage, "s1", tables["s1"].stat), tables["s1"], *entries[i])
            == bytes([i]) * 300 * KIB
        )
    assert len(storage.reads) == before, "the walker finds the next shard in memory"
    assert storage.keys.count("s1") == 1, storage.keys


def test_prefetches_go_past_the_shards_that_readers_walk_already(tmp_path: Path) -> None:
    """A whole-array read walks every shard a row of chunks crosses at once: a walker's
    next shards are often being read already, and the prefetches take the next ones that
    nobody reads, one each, and no more than `AHEAD` of them."""
    tables = {}
    names = [f"s{i}" for i in range(AHEAD + 5)]
    for name in names:
        storage, tables[name], entries = shard(tmp_path, [300 * KIB] * 4, name=name)
    ahead = ReadAhead(storage, 64 << 20)

    def next_shard(n: int):
        name = f"s{n}"
        return (name, tables[name]) if name in tables else None

    for name in ("s1", "s2"):  # other readers of the same row
        ahead.read(Pin(storage, name, tables[name].stat), tables[name], *entries[0])
    s0 = Pin(storage, "s0", tables["s0"].stat)
    ahead.read(s0, tables["s0"], *entries[0], next_shard)
    ahead.read(s0, tables["s0"], *entries[3], next_shard)  # a walk
    deadline = time.monotonic() + 10
    ahead_of_it = names[3 : 3 + AHEAD]
    while not set(ahead_of_it) <= set(storage.keys):
        assert time.monotonic() < deadline, storage.keys
        time.sleep(0.01)
    time.sleep(0.1)
    counts = [storage.keys.count(name) for name in names]
    assert counts == [2, 1, 1] + [1] * AHEAD + [0, 0], storage.keys
    last = ahead_of_it[-1]
    before = len(storage.reads)
    for i in range(4):
        assert (
            ahead.read(Pin(storage, last, tables[last].stat), tables[last], *entries[i])
            == bytes([i]) * 300 * KIB
        )
    assert len(storage.reads) == before, "the walker finds it in memory"


def test_prefetches_fetch_at_most_half_the_read_cache(tmp_path: Path) -> None:
    """What prefetches bring must not push out what walkers are about to read: a shard
    whose window would take more than half the cache is left to its walker."""
    tables = {}
    for name in ("s0", "s1"):
        storage, tables[name], entries = shard(tmp_path, [300 * KIB] * 4, name=name)
    ahead = ReadAhead(storage, 1536 * KIB)  # windows of 1 MiB (3 chunks): over half of it

    def next_shard(n: int):
        return ("s1", tables["s1"]) if n == 1 else None

    s0 = Pin(storage, "s0", tables["s0"].stat)
    for i in range(4):
        assert ahead.read(s0, tables["s0"], *entries[i], next_shard) == bytes([i]) * 300 * KIB
    time.sleep(0.3)
    assert "s1" not in storage.keys, storage.keys
    s1 = Pin(storage, "s1", tables["s1"].stat)
    assert ahead.read(s1, tables["s1"], *entries[0], next_shard) == bytes([0]) * 300 * KIB


def test_a_hit_serves_a_chunk_as_a_read_would_once_a_read_came_by(tmp_path: Path) -> None:
    """`hit` is how a front end serves a chunk it located with no open: from memory only,
    and only for a shard version a `read` came by, whose walk it then goes on with."""
    tables = {}
    for name in ("s0", "s1"):
        storage, tables[name], entries = shard(tmp_path, [300 * KIB] * 4, name=name)
    ahead = ReadAhead(storage, 64 << 20)
    version = tables["s0"].stat.version
    asked: list[int] = []

    def next_shard(n: int):
        asked.append(n)
        return ("s1", tables["s1"]) if n == 1 else None

    assert ahead.hit("s0", version, *entries[1]) is None, "nothing read: nothing cached"
    ahead.read(Pin(storage, "s0", tables["s0"].stat), tables["s0"], *entries[0], next_shard)
    assert ahead.hit("s0", version, *entries[1]) == bytes([1]) * 300 * KIB
    assert ahead.hit("s0", "another version", *entries[1]) is None
    assert ahead.hit("s0", version, *entries[3]) is None, "not fetched: the long way"
    assert storage.keys.count("s0") == 1, "a hit makes no request"
    deadline = time.monotonic() + 10
    while "s1" not in storage.keys:  # the hit showed a walker: its next shard came
        assert time.monotonic() < deadline, (asked, storage.keys)
        time.sleep(0.01)
    s1 = tables["s1"].stat.version
    assert ahead.hit("s1", s1, *entries[0]) is None, "fetched ahead, but no read came by"


def test_prefetch_threads_end_when_idle_and_come_back_for_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readahead, "WORKER_IDLE", 0.2)
    tables = {}
    for name in ("s0", "s1", "s2"):
        storage, tables[name], entries = shard(tmp_path, [300 * KIB] * 4, name=name)
    ahead = ReadAhead(storage, 64 << 20)

    def next_shard(n: int):
        name = f"s{n}"
        return (name, tables[name]) if name in tables else None

    def workers() -> int:
        return sum(t.name == "shardfs-prefetch" and t.is_alive() for t in threading.enumerate())

    before = workers()
    for walked in ("s0", "s1"):
        pin = Pin(storage, walked, tables[walked].stat)
        for i in (0, 3):  # a walk: its next shard is fetched ahead
            ahead.read(pin, tables[walked], *entries[i], next_shard)
        deadline = time.monotonic() + 10
        while workers() > before or f"s{int(walked[1]) + 1}" not in storage.keys:
            assert time.monotonic() < deadline, (workers(), storage.keys)
            time.sleep(0.05)
        assert ahead._workers == 0


def test_a_failed_prefetch_leaves_reads_alone(tmp_path: Path) -> None:
    storage, table, entries = shard(tmp_path, [300 * KIB] * 4)
    ahead = ReadAhead(storage, 64 << 20)
    failures: list[int] = []

    def broken(n: int):
        failures.append(n)
        raise OSError("index unreadable")

    for i in range(4):
        assert (
            ahead.read(Pin(storage, "s", table.stat), table, *entries[i], broken)
            == bytes([i]) * 300 * KIB
        )
    deadline = time.monotonic() + 10
    while len(failures) < AHEAD:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    assert sorted(failures) == list(range(1, AHEAD + 1)), "asked once per walked shard"


def test_a_read_of_a_chunk_fetched_ahead_shows_a_walker(tmp_path: Path) -> None:
    """A shard its first fetch brings whole is walked too: reading a second chunk of it from
    memory gets the next shard fetched ahead."""
    tables = {}
    for name in ("s0", "s1"):
        storage, tables[name], entries = shard(tmp_path, [100 * KIB] * 4, name=name)
    ahead = ReadAhead(storage, 64 << 20)

    def next_shard(n: int):
        return ("s1", tables["s1"]) if n == 1 else None

    s0 = Pin(storage, "s0", tables["s0"].stat)
    ahead.read(s0, tables["s0"], *entries[0], next_shard)
    assert storage.keys == ["s0"], "the whole shard in one read"
    time.sleep(0.1)
    assert storage.keys == ["s0"], "one read is not a walk"
    ahead.read(s0, tables["s0"], *entries[1], next_shard)
    deadline = time.monotonic() + 10
    while "s1" not in storage.keys:
        assert time.monotonic() < deadline, storage.keys
        time.sleep(0.01)


def test_settle_waits_for_the_prefetches_in_flight(tmp_path: Path) -> None:
    """At the end of a mount the daemon waits (a while) for prefetches under way, so that
    what they fetch reaches the disk cache instead of being cut off at exit."""
    ahead = ReadAhead(CountingStorage(tmp_path), 64 << 20)
    landed: list[int] = []

    def slow_next_shard(n: int) -> None:
        time.sleep(0.4)
        landed.append(n)

    walk = ("s", "v1", None)
    ahead._seen[walk] = WALKED  # a reader walks it, so its next shards are fetched
    ahead._ask_next(walk, slow_next_shard)  # type: ignore[arg-type]
    started = time.monotonic()
    ahead.settle(0.05)
    assert time.monotonic() - started < 0.3 and not landed, "no longer than asked"
    ahead.settle(5.0)
    assert sorted(landed) == list(range(1, AHEAD + 1)), "all landed before settle returned"
    ahead.settle(5.0)  # nothing in flight: at once
