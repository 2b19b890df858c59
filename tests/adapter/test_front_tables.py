"""The native front's tables on their own (`_front.Front`, not started: no mount): what
Python gives them, what they keep within their bounds, and what they drop."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardfs.fuse.kernel_served.front import unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")

MODE = 0o100444


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Any]:
    """A front of at most 8 rows, and a kept version (id 1) of a file to read from."""
    from shardfs.fuse.kernel_served import _front

    device = os.open("/dev/null", os.O_RDWR)  # (never read: the front is not started)
    try:
        made = _front.Front(device, 1.0, 4, rows_max=8)
    finally:
        os.close(device)
    shard = tmp_path / "shard"
    shard.write_bytes(bytes(64))
    st = os.stat(shard)
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert made.keep(1, os.open(shard, os.O_RDONLY), str(shard).encode(), version)
    yield made


def fill(front: Any, slot: int, parent: int, position: int = -1, n: int = 4) -> int:
    """`n` rows of `slot` (node ids from its base) in directory `parent`."""
    base = (slot + 1) << 40
    names = [str(i).encode() for i in range(n)]
    added: int = front.fill(
        parent, 1, slot, names, [base + i for i in range(n)], [8 * i for i in range(n)],
        [8] * n, 0, MODE, 0, 0, position,
    )  # fmt: skip
    return added


def test_a_full_table_drops_the_least_recently_used_groups_and_their_listings(front: Any) -> None:
    assert front.listing(100, 4, 0)
    assert fill(front, 1, 100, position=0) == 4  # the listing of 100: slot 1's rows
    assert fill(front, 2, 200) == 4
    assert front.stats()["rows"] == 8 and front.stats()["listings"] == 1
    assert fill(front, 3, 300) == 4  # full: the oldest group goes, to three quarters at most
    figures = front.stats()
    assert figures["rows"] == 4 and figures["listings"] == 0, figures
    assert figures["slots"] == 3  # (slots stay, with the kernel's references)
    assert fill(front, 3, 300) == 0  # held: its rows are there
    assert fill(front, 1, 400) == 4  # filled again, as Python may
    for slot in (1, 2, 3):
        assert front.unref(slot, 0) == 0  # no references: each slot let go
    assert front.stats()["slots"] == 0 and front.stats()["rows"] == 0


def test_a_fill_bigger_than_the_table_is_cut(front: Any) -> None:
    """Even one group (r9: an array in one shard of a million chunks) holds no more than
    the table's rows; the rest stay Python's."""
    assert front.listing(100, 20, 0)
    assert fill(front, 1, 100, position=0, n=20) == 8
    figures = front.stats()
    assert figures["rows"] == 8 and figures["groups"] == 1, figures
    assert fill(front, 2, 200, n=3) == 3  # the group filled before is not protected now
    assert front.stats()["rows"] == 3 and front.stats()["listings"] == 0


def test_the_group_used_last_is_dropped_last(front: Any) -> None:
    assert fill(front, 1, 100, n=3) == 3
    assert fill(front, 2, 200, n=3) == 3
    assert fill(front, 1, 100, n=3) == 0  # filled before: used again, nothing added
    assert fill(front, 3, 300, n=3) == 3  # slot 2's group, the least recently used, goes
    assert fill(front, 1, 100, n=3) == 0 and fill(front, 3, 300, n=3) == 0  # (held)
    assert fill(front, 2, 200, n=3) == 3  # (dropped: filled again)


def test_the_kernels_references_are_counted_here_alone(front: Any) -> None:
    """r1/r10: a slot, and its rows, go only when every reference the kernel took (from
    either side) is forgotten; and they go then, in the same step."""
    assert fill(front, 1, 100) == 4
    front.ref(1, 2)  # two lookups Python answered
    assert front.unref(1, 1) == 1
    assert front.stats()["rows"] == 4  # still held: its rows stay
    assert front.unref(1, 1) == 0
    assert front.stats()["rows"] == 0 and front.stats()["slots"] == 0
    assert front.unref(1, 5) == 0  # (a slot not here holds none)
    front.ref(7, 1)  # a slot Python made with no rows here
    assert front.stats()["slots"] == 1 and front.unref(7, 0) == 1
    assert front.unref(7, 3) == 0 and front.stats()["slots"] == 0


def test_a_listing_goes_before_its_slots_rows(front: Any) -> None:
    """Letting a slot go drops the listings that hold its rows first (they would hand out
    its node ids), and only those."""
    assert front.listing(100, 8, 0) and front.listing(200, 4, 0)
    assert fill(front, 1, 100, position=0) == 4
    assert fill(front, 2, 200, position=0) == 4
    assert front.unref(1, 0) == 0
    figures = front.stats()
    assert figures["listings"] == 1 and figures["rows"] == 4, figures
    front.unlist(200)
    assert front.stats()["listings"] == 0
