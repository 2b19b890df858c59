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


def test_a_full_table_drops_other_slots_rows_and_the_listings_holding_them(front: Any) -> None:
    assert front.listing(100, 4, 0)
    assert fill(front, 1, 100, position=0) == 4  # the listing of 100: slot 1's rows
    assert fill(front, 2, 200) == 4
    assert front.stats()["rows"] == 8 and front.stats()["listings"] == 1
    assert fill(front, 3, 300) == 4  # full: the others' rows go, to three quarters at most
    figures = front.stats()
    assert figures["rows"] == 4 and figures["listings"] == 0, figures
    assert figures["slots"] == 3  # (their counts of the kernel's references stay)
    assert fill(front, 1, 400) == 4  # filled again, as Python may
    assert fill(front, 4, 500, n=9) == 0  # bigger than the whole table: refused
    for slot in (1, 2, 3):
        assert front.retire(slot) == 0  # no references here: each slot let go
    assert front.stats()["slots"] == 0 and front.stats()["rows"] == 0


def test_a_listing_goes_before_its_slots_rows(front: Any) -> None:
    """Retiring a slot drops the listings that hold its rows first (they would hand out
    its node ids), and only those."""
    assert front.listing(100, 8, 0) and front.listing(200, 4, 0)
    assert fill(front, 1, 100, position=0) == 4
    assert fill(front, 2, 200, position=0) == 4
    assert front.retire(1) == 0
    figures = front.stats()
    assert figures["listings"] == 1 and figures["rows"] == 4, figures
    front.unlist(200)
    assert front.stats()["listings"] == 0
