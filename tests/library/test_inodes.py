"""Listings in bulk and inode numbers by position, as a library (no FUSE): arrays written
by zarr-python 3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from shardfs.fuse.inodes import SHIFT, InodeTable
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, Node, Role


@pytest.fixture
def ns(tmp_path: Path) -> Namespace:
    """A sparse 2-D array: 7 x 9 chunks of 2 x 2 in shards of 3 x 4 chunks, some empty."""
    group = zarr.open_group(tmp_path / "src", mode="w")
    a = group.create_array("a", shape=(14, 18), chunks=(2, 2), shards=(6, 8), dtype="uint8")
    values = np.arange(14 * 18, dtype=np.uint8).reshape(14, 18) % 251 + 1
    values[4:8, 0:4] = 0  # chunks (2,0),(2,1),(3,0),(3,1) hold only the fill value
    a[:] = values
    return Namespace(LocalStorage(tmp_path / "src"))


def chunk_names(ns: Namespace, path: str) -> list[str]:
    return sorted(name for name, node, _ in ns.listdir(ns.resolve(path)) if node.role is Role.CHUNK)


def test_a_listing_holds_chunks_in_bulk_and_agrees_with_lookups(ns: Namespace) -> None:
    """One run per directory, across shards; every row is what a lookup of its name gives."""
    for row in range(7):
        listing = ns.listing(ns.resolve(f"a/c/{row}"))
        assert listing.entries == [] and len(listing.runs) == 1
        run = listing.runs[0]
        expected = [str(j) for j in range(9) if not (row in (2, 3) and j < 2)]
        assert run.names() == expected
        assert len(listing) == len(expected)
        assert len({key for key, _ in run.shards}) == 3  # the row crosses three shards
        for name, node, attr in listing.items():
            looked_up = ns.lookup(ns.resolve(f"a/c/{row}"), name)
            assert (node.path, node.coords) == (looked_up.path, looked_up.coords)
            assert attr == ns.attr(looked_up)
            reader = ns.open(looked_up)
            assert len(reader.read(0, attr.size)) == attr.size


def test_listing_positions_page_through_runs(ns: Namespace) -> None:
    listing = ns.listing(ns.resolve("a/c/0"))
    seen = [(position, run.names(row, row + 1)[0]) for position, run, row in listing.chunks(4)]
    assert seen == [(4, "4")]  # one stretch, from the fifth chunk on
    assert list(listing.chunks(len(listing))) == []


def test_chunk_inodes_are_derived_from_positions_without_entries(ns: Namespace) -> None:
    table = InodeTable(ns.root())
    before = len(table)
    listing = ns.listing(ns.resolve("a/c/5"))
    run = listing.runs[0]
    numbers = table.run_inodes(run, 0, len(run))
    assert numbers is not None and len(set(numbers)) == len(run)
    assert all(n >> SHIFT for n in numbers)
    for n, (name, node, _) in zip(numbers, listing.items(), strict=True):
        assert table.assign(node) == n
        table.ref(n)
        assert table.node(n).path == node.path == f"a/c/5/{name}"
        assert table.node(n).coords == node.coords
    assert len(table) == before  # nothing kept per chunk
    table.forget(numbers[0], 1)  # the kernel forgetting a derived number changes nothing
    assert table.node(numbers[0]).path == "a/c/5/0"
    with pytest.raises(KeyError):
        table.node((1 << SHIFT) + 7 * 9)  # beyond the grid
    with pytest.raises(KeyError):
        table.node(99 << SHIFT)  # no such array


def test_other_nodes_are_counted_and_dropped_when_forgotten(ns: Namespace) -> None:
    table = InodeTable(ns.root())
    node = ns.resolve("a/c/3")
    ino = table.assign(node)
    assert ino < 1 << SHIFT and table.assign(node) == ino
    table.ref(ino)
    table.ref(ino)
    table.forget(ino, 1)
    assert table.node(ino) == node
    table.forget(ino, 1)
    with pytest.raises(KeyError):
        table.node(ino)
    assert table.assign(node) != ino  # a new number once forgotten


def test_a_renamed_chunk_keeps_its_inode_and_a_new_file_gets_another(ns: Namespace) -> None:
    table = InodeTable(ns.root())
    old = ns.resolve("a/c/0/1")
    new = Node("a/c/0/8", Role.CHUNK, old.meta, (0, 8))
    ino = table.assign(old)
    table.move(old, new)
    assert table.node(ino).path == "a/c/0/8"
    assert table.assign(new) == ino
    replacement = table.assign(old)  # a new file where the moved one was
    assert replacement != ino and replacement < 1 << SHIFT
    run = ns.listing(ns.resolve("a/c/0")).runs[0]
    assert table.run_inodes(run, 0, len(run)) is None  # the run holds a claimed number
    table.forget(ino, 3)  # evicted by the kernel: the number means its position again
    assert table.node(ino).path == "a/c/0/1"


def test_an_unlinked_chunk_inode_lives_until_forgotten(ns: Namespace) -> None:
    table = InodeTable(ns.root())
    node = ns.resolve("a/c/1/1")
    ino = table.assign(node)
    table.unlink(node)
    assert table.node(ino) is node  # still open somewhere
    assert table.removed(ino)  # its path no longer speaks for it
    new = table.assign(node)  # a file created at the path is another inode
    assert new != ino and not table.removed(new)
    table.forget(ino, 1)
    assert table.node(ino).path == node.path and not table.removed(ino)


def test_a_counted_inode_renamed_over_is_removed(ns: Namespace) -> None:
    table = InodeTable(ns.root())
    doc = ns.resolve("a/zarr.json")  # counted, not derived
    ino = table.assign(doc)
    table.ref(ino)
    table.unlink(doc)
    assert table.removed(ino) and table.assign(doc) != ino
    table.forget(ino, 1)
    assert not table.removed(ino)
    with pytest.raises(KeyError):
        table.node(ino)


def test_the_budget_names_the_oldest_entries_once(ns: Namespace) -> None:
    table = InodeTable(ns.root(), budget=3)
    directory = ns.resolve("a/c")
    parent = table.assign(directory)
    table.ref(parent)
    rows = [ns.resolve(f"a/c/{i}") for i in range(7)]
    for node in rows:
        table.ref(table.assign(node))
    # Eight counted entries, three allowed: the five oldest that have a parent in the
    # table ("a/c" has none here) are named for the kernel to forget.
    assert table.over_budget() == [(parent, str(i)) for i in range(5)]
    assert table.over_budget() == []  # not asked twice while the kernel has not forgotten


def test_listings_are_cached_under_the_versions_of_their_shards(tmp_path: Path) -> None:
    group = zarr.open_group(tmp_path / "src", mode="w")
    a = group.create_array("a", shape=(16, 32), chunks=(8, 8), shards=(16, 16), dtype="uint8")
    a[:] = 1
    ns = Namespace(LocalStorage(tmp_path / "src"))
    first = ns.listing(ns.resolve("a/c/0")).runs[0]
    assert ns.listing(ns.resolve("a/c/0")).runs[0] is first  # nothing made again
    a[0:8, 16:24] = np.random.default_rng(0).integers(1, 255, (8, 8))  # rewrites one shard
    again = ns.listing(ns.resolve("a/c/0")).runs[0]
    assert again is not first
    sizes = dict(zip(again.names(), again.sizes.tolist(), strict=True))
    assert sizes["2"] == ns.attr(ns.resolve("a/c/0/2")).size
    assert sizes["2"] != dict(zip(first.names(), first.sizes.tolist(), strict=True))["2"]


def test_a_versioned_table_names_one_version_per_number(ns: Namespace, tmp_path: Path) -> None:
    """Kernel-served numbering: a chunk's number stands for its shard's version. A shard
    rewritten gives its chunks new numbers (the others keep theirs), the old numbers
    still name the old version, and a version's numbers are let go (and their slot given
    to the next version) once the kernel forgets the last of them, but not before."""
    table = InodeTable(ns.root(), versioned=True)
    node = ns.lookup(ns.resolve("a/c/0"), "0")
    attr = ns.attr(node)
    assert attr.shard is not None and attr.shard[0] == "a/c/0/0"
    first = table.assign(node, attr.shard)
    table.ref(first)
    listing = ns.listing(ns.resolve("a/c/0"))
    run = listing.runs[0]
    numbers = table.run_inodes(run, 0, len(run))
    assert numbers is not None and numbers[0] == first
    other = numbers[-1]  # chunk (0, 8), in shard (0, 2)
    for n in numbers:
        table.ref(n)

    a = zarr.open_array(tmp_path / "src" / "a", mode="r+")
    a[0:2, 0:2] = 99  # zarr-python rewrites shard (0, 0) only
    node = ns.lookup(ns.resolve("a/c/0"), "0")
    attr = ns.attr(node)
    second = table.assign(node, attr.shard)
    assert second != first and second & ((1 << SHIFT) - 1) == first & ((1 << SHIFT) - 1)
    run = ns.listing(ns.resolve("a/c/0")).runs[0]
    again = table.run_inodes(run, 0, len(run))
    assert again is not None and again[0] == second and again[-1] == other
    slot = table.slot(first)
    assert slot is not None and slot.shown is not None
    assert slot.shown.stats["a/c/0/0"] != attr.shard[1]  # the old shard's version

    table.forget(first, 1)  # the lookup's reference; the listing's are still held
    assert table.slot(first) is slot
    listed = [n for n in numbers if n >> SHIFT == first >> SHIFT]
    assert len(listed) == 4  # the row's chunks in shard (0, 0)
    for n in listed:
        assert table.slot(first) is slot
        table.forget(n, 1)
    assert table.slot(first) is None  # let go
    with pytest.raises(KeyError):
        table.node(first)
    # the same version, shown again (the kernel forgot it, nothing changed): the same numbers
    assert slot.shard is not None
    assert table.chunk_base(slot.array, slot.shard) == first - (first & ((1 << SHIFT) - 1))
    table.ref(second)
    third = table.slot(second)
    assert third is not None and table.holds({(second >> SHIFT) - 1: third})
