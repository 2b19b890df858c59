"""The WKW view's memory bounds (`shardfs.view.wkw`), without FUSE: what open chunk files
hold between reads stays within one byte budget, whatever the number of files left open
half read, and a block of a file with a huge jump table costs one part of that table."""

from __future__ import annotations

import random
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import wkw

from shardfs.formats.wkw import PART_BLOCKS, morton_index
from shardfs.storage import LocalStorage
from shardfs.view.base import Reader
from shardfs.view.wkw import WkwNamespace
from tests.support.wkw_data import BLOCK_LEN, FILE_LEN, HUGE_FILE, sparse_huge_file, write_mag

#: A block of the magnification below: 8^3 uint64 voxels.
BLOCK = BLOCK_LEN**3 * 8


@pytest.fixture(scope="module")
def lz4_mag(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """A bare magnification `wkw` wrote: one file of 4^3 LZ4HC blocks of 8^3 uint64 voxels,
    every voxel distinct; and each chunk file's bytes by view path."""
    n = BLOCK_LEN * FILE_LEN
    data = np.arange(n**3, dtype=np.uint64).reshape(1, n, n, n)
    directory = tmp_path_factory.mktemp("wkw") / "mag"
    write_mag(directory, data, (0, 0, 0), compressed=True)
    b = BLOCK_LEN
    chunks = {
        f"c/0/{x}/{y}/{z}": data[:, x * b : (x + 1) * b, y * b : (y + 1) * b, z * b : (z + 1) * b]
        .transpose(3, 2, 1, 0)
        .tobytes()
        for x, y, z in np.ndindex(FILE_LEN, FILE_LEN, FILE_LEN)
    }
    return directory, chunks


def opened(view: WkwNamespace, path: str) -> Reader:
    return view.open(view.resolve(path))


def test_what_idle_open_files_hold_stays_within_the_budget(
    lz4_mag: tuple[Path, dict[str, bytes]],
) -> None:
    """64 files read in part and left open hold at most the budget (5 blocks, room for a
    decode included): the oldest are dropped, and each reads on correctly, decoding its
    block again."""
    directory, chunks = lz4_mag
    budget = 5 * BLOCK
    view = WkwNamespace(LocalStorage(str(directory)), held_blocks=budget)
    readers = {path: opened(view, path) for path in chunks}
    for path, reader in readers.items():
        assert reader.read(0, 100) == chunks[path][:100]
        assert view.held.used <= budget
    held = view.held.used // BLOCK
    assert 1 < held < 5 and view.held.used == held * BLOCK
    for path, reader in reversed(readers.items()):  # the last read first: those still held
        assert reader.read(100, BLOCK) == chunks[path][100:]  # to the end: let go
    figures = view.held.snapshot()
    assert figures["misses"] == 2 * len(chunks) - held and figures["used"] == 0
    for reader in readers.values():
        reader.close()


def test_a_block_bigger_than_the_budget_is_held_alone(
    lz4_mag: tuple[Path, dict[str, bytes]],
) -> None:
    directory, chunks = lz4_mag
    view = WkwNamespace(LocalStorage(str(directory)), held_blocks=BLOCK // 2)
    first, second = (opened(view, path) for path in list(chunks)[:2])
    assert first.read(0, 10) == chunks["c/0/0/0/0"][:10]
    assert view.held.used == BLOCK
    assert second.read(0, 10) == chunks["c/0/0/0/1"][:10]
    assert view.held.used == BLOCK  # the first one's was dropped to make room
    first.close()
    assert view.held.used == BLOCK
    second.close()
    assert view.held.used == 0


def test_an_idle_block_is_dropped(lz4_mag: tuple[Path, dict[str, bytes]]) -> None:
    directory, chunks = lz4_mag
    view = WkwNamespace(LocalStorage(str(directory)))
    view.held.idle = 0.2
    reader = opened(view, "c/0/1/2/3")
    assert reader.read(0, 10) == chunks["c/0/1/2/3"][:10]
    assert view.held.used == BLOCK
    deadline = time.monotonic() + 5
    while view.held.used and time.monotonic() < deadline:
        time.sleep(0.02)
    assert view.held.used == 0
    assert reader.read(10, BLOCK) == chunks["c/0/1/2/3"][10:]
    reader.close()


def test_concurrent_readers_in_a_small_budget(lz4_mag: tuple[Path, dict[str, bytes]]) -> None:
    """8 threads read 64 files in pieces, in random order, with room for 3 blocks (and
    several reads of one file at once, as the kernel sends them): every byte right, and
    the budget kept throughout."""
    directory, chunks = lz4_mag
    budget = 3 * BLOCK
    view = WkwNamespace(LocalStorage(str(directory)), held_blocks=budget)
    readers = {path: opened(view, path) for path in chunks}
    pieces = [(path, offset) for path in chunks for offset in range(0, BLOCK, 512)]
    random.Random(1).shuffle(pieces)
    peak = 0

    def read(piece: tuple[str, int]) -> bool:
        nonlocal peak
        path, offset = piece
        got = readers[path].read(offset, 512)
        peak = max(peak, view.held.used)
        return got == chunks[path][offset : offset + 512]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, pieces, timeout=60))
    assert peak <= budget
    for reader in readers.values():
        reader.close()
    assert view.held.used == 0


def test_a_dropped_block_is_freed(tmp_path: Path) -> None:
    """What the budget counts is what the daemon holds: a block dropped to make room for
    another (here of 2 MiB, each bigger than the budget) is freed, not kept alive
    elsewhere, and so is the last once it idles."""
    header = wkw.Header(np.uint64, block_len=64, file_len=1)
    data = np.arange(2 * 64**3, dtype=np.uint64).reshape(1, 128, 64, 64)
    with wkw.Dataset.create(str(tmp_path / "raw"), header) as dataset:
        dataset.write((0, 0, 0), data)
        dataset.compress(str(tmp_path / "mag"), compress_files=True).close()
    block = 64**3 * 8
    view = WkwNamespace(LocalStorage(str(tmp_path / "mag")), held_blocks=block // 2)
    view.held.idle = 0.5
    first, second = opened(view, "c/0/0/0/0"), opened(view, "c/0/1/0/0")
    tracemalloc.start()
    try:
        assert first.read(0, 8) == data[0, 0, 0, 0].tobytes()
        time.sleep(0.1)  # a pause: what drops idle blocks is waiting for the first
        assert second.read(0, 8) == data[0, 64, 0, 0].tobytes()
        assert view.held.used == block
        assert tracemalloc.get_traced_memory()[0] < block + block // 2
        deadline = time.monotonic() + 5
        while view.held.used and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tracemalloc.get_traced_memory()[0] < block // 2
    finally:
        tracemalloc.stop()
    first.close()
    second.close()


@pytest.mark.parametrize("compressed", [False, True])
def test_a_byte_of_a_file_with_a_huge_table(tmp_path: Path, compressed: bool) -> None:
    """A file of 256^3 blocks (a jump table of 128 MiB when compressed): opening one of its
    blocks reads and keeps one part of its table (2^15 entries), not all of it."""
    position = (200, 100, 50)
    index = morton_index(position, HUGE_FILE)
    assert index // PART_BLOCKS > 0  # a part after the first
    value = sparse_huge_file(tmp_path / "mag", compressed, index)
    view = WkwNamespace(LocalStorage(str(tmp_path / "mag")))
    tracemalloc.start()
    try:
        start = time.monotonic()
        with opened(view, "c/0/{}/{}/{}".format(*position)) as reader:
            assert reader.read(0, 10) == value
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert took < 0.2
    assert peak < 8 << 20, peak
    assert view.tables.used < 2 << 20
