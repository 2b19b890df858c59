"""The view as a library, without FUSE: data written by zarr-python 3, read through `Namespace`."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec

from shardfs.fuse.owners import Owners
from shardfs.primitives.errors import CorruptData, IsADirectory, NotADirectory, NotFound
from shardfs.storage import LocalStorage, Stat
from shardfs.storage.base import Pin
from shardfs.view import Namespace, Node, Role, View, leaves
from tests.support.zarr2 import Zarr2


def materialize(ns: Namespace, node: Node, target: Path) -> None:
    """Copy the whole view below `node` into a plain directory, through the library API."""
    for name, child, attr in ns.listdir(node):
        path = target / name
        if child.is_dir:
            path.mkdir()
            materialize(ns, child, path)
        else:
            reader = ns.open(child)
            data = reader.read(0, attr.size + 1)
            assert len(data) == attr.size == reader.size
            path.write_bytes(data)


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w", attributes={"title": "t"})
    rng = np.random.default_rng(0)
    values = {
        "nested/sharded": rng.integers(0, 1000, (20, 30), dtype="int32"),
        "flat": rng.random((9, 10, 11)).astype("float32"),
        "plain": np.arange(50, dtype="uint8"),
    }
    sub = group.create_group("nested", attributes={"level": 1})
    a = sub.create_array("sharded", shape=(20, 30), dtype="int32", shards=(8, 16), chunks=(4, 4))
    a[:] = values["nested/sharded"]
    b = group.create_array(
        "flat",
        shape=(9, 10, 11),
        dtype="float32",
        shards=(4, 4, 6),
        chunks=(2, 2, 3),
        chunk_key_encoding={"name": "v2", "separator": "."},
        fill_value=float("nan"),
    )
    b[:] = values["flat"]
    c = group.create_array("plain", shape=(50,), dtype="uint8", chunks=(10,))
    c[:] = values["plain"]
    (root / "nested" / "sharded" / "README.txt").write_text("not a chunk")
    return root, values


def test_materialized_view_is_a_plain_zarr_with_the_same_values(
    source: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    root, values = source
    ns = Namespace(LocalStorage(root))
    copy = tmp_path / "copy"
    copy.mkdir()
    materialize(ns, ns.root(), copy)
    for path, expected in values.items():
        array = zarr.open_array(copy / path, mode="r")
        assert not any(isinstance(c, ShardingCodec) for c in array.metadata.codecs)
        np.testing.assert_array_equal(array[:], expected)
    # Passthrough files are byte-identical.
    for rel in [
        "zarr.json",
        "nested/zarr.json",
        "plain/zarr.json",
        "plain/c/3",
        "nested/sharded/README.txt",
    ]:
        assert (copy / rel).read_bytes() == (root / rel).read_bytes(), rel
    # No shard file survives in the view of a sharded array.
    assert sorted(os.listdir(copy / "nested" / "sharded")) == ["README.txt", "c", "zarr.json"]
    chunk_names = set(os.listdir(copy / "flat")) - {"zarr.json"}
    assert chunk_names == {f"{i}.{j}.{k}" for i in range(5) for j in range(5) for k in range(4)}


def test_lookup_errors(source: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, _ = source
    ns = Namespace(LocalStorage(root))
    for missing in ["nope", "nested/sharded/c/5", "nested/sharded/c/0/8", "flat/5.0.0", "flat/0.0"]:
        with pytest.raises(NotFound):
            ns.resolve(missing)
    chunk = ns.resolve("nested/sharded/c/0/0")
    assert chunk.role is Role.CHUNK
    with pytest.raises(NotADirectory):
        ns.lookup(chunk, "x")
    with pytest.raises(NotADirectory):
        ns.listdir(chunk)
    with pytest.raises(IsADirectory):
        ns.open(ns.resolve("nested/sharded/c/0"))


def test_entry_is_lookup_and_attr_with_one_stat_per_object(
    source: tuple[Path, dict[str, np.ndarray]],
) -> None:
    """`entry` answers what `lookup` + `attr` answer, for every kind of node, and a chunk's
    costs one stat of its metadata and one of its shard (as does `lookup` alone)."""
    root, _ = source
    storage = LocalStorage(root)
    ns = Namespace(storage)
    stats: list[str] = []
    for method in ("stat", "version"):  # `version`: what a prepared chunk directory asks
        asked = getattr(storage, method)
        setattr(storage, method, lambda key, asked=asked: stats.append(key) or asked(key))
    for path in [
        "nested",
        "nested/zarr.json",
        "nested/sharded/c/0",
        "nested/sharded/c/3/7",
        "nested/sharded/README.txt",
        "flat/4.4.3",
        "plain/c/3",
        "plain",
    ]:
        parent_path, _, name = path.rpartition("/")
        parent = ns.resolve(parent_path)
        node = ns.lookup(parent, name)
        assert ns.entry(parent, name) == (node, ns.attr(node)), path
        if node.role is Role.CHUNK:
            stats.clear()
            ns.entry(parent, name)
            assert sorted(stats) == sorted(
                [f"{parent.array.key}/zarr.json", ns.shards.locate(parent.array, node.coords)[0]]
            ), stats
    for missing in ["nested/sharded/c/5", "nested/sharded/c/0/8", "flat/0.0"]:
        parent_path, _, name = missing.rpartition("/")
        with pytest.raises(NotFound):
            ns.entry(ns.resolve(parent_path), name)


def test_sparse_array_has_no_files_for_empty_chunks(tmp_path: Path) -> None:
    root = tmp_path / "sparse"
    a = zarr.create_array(root, shape=(16, 16), dtype="uint8", shards=(8, 8), chunks=(2, 2))
    a[0:2, 0:2] = 1  # one chunk of shard (0, 0)
    a[10:12, 12:14] = 2  # one chunk of shard (1, 1)
    ns = Namespace(LocalStorage(root))
    files = {
        f"{row_name}/{name}"
        for row_name, row, _ in ns.listdir(ns.resolve("c"))
        for name, _, _ in ns.listdir(row)
    }
    assert files == {"0/0", "5/6"}
    assert {name for name, _, _ in ns.listdir(ns.resolve("c"))} == {str(i) for i in range(8)}
    with pytest.raises(NotFound):
        ns.resolve("c/0/1")  # empty inner chunk of an existing shard
    with pytest.raises(NotFound):
        ns.resolve("c/0/6")  # inside a missing shard
    with pytest.raises(NotFound):
        ns.resolve("c/3/0")  # an empty chunk in an empty row of an existing shard
    assert ns.listdir(ns.resolve("c/3")) == []  # rows are shown wherever a shard row exists


class CountingStorage(LocalStorage):
    """Local storage that counts and slows down reads, to observe the index cache."""

    def __init__(self, root: Path, delay: float = 0.0) -> None:
        super().__init__(root)
        self.reads = 0
        self.delay = delay
        self._lock = threading.Lock()

    def read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        with self._lock:
            self.reads += 1
        time.sleep(self.delay)
        return super().read(key, offset, length, version)

    def pin(self, key: str, stat: Stat) -> Pin:
        return Pin(self, key, stat)  # reads by name, so they are counted


def test_concurrent_lookups_share_one_index_read(
    source: tuple[Path, dict[str, np.ndarray]],
) -> None:
    root, _ = source
    storage = CountingStorage(root, delay=0.2)
    ns = Namespace(storage)
    array = ns.resolve("nested/sharded")
    before = storage.reads
    errors: list[BaseException] = []

    def look(j: int) -> None:
        try:
            ns.lookup(ns.lookup(ns.lookup(array, "c"), "0"), str(j))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=look, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert storage.reads - before == 1  # four chunks of one shard, one index read
    assert ns.shards.indexes.stats.loads == 1


def test_index_cache_stays_within_budget(source: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, _ = source
    ns = Namespace(LocalStorage(root), index_cache=2000)
    flat = ns.resolve("flat")
    names = [name for name, _, _ in ns.listdir(flat)]
    assert len(names) == 101
    assert ns.shards.indexes.used <= 2000
    assert ns.shards.indexes.stats.evictions > 0


def test_source_rewritten_behind_the_view_is_reread(tmp_path: Path) -> None:
    root = tmp_path / "changing"
    a = zarr.create_array(root, shape=(8,), dtype="uint8", shards=(8,), chunks=(2,), fill_value=0)
    a[:] = 1
    ns = Namespace(LocalStorage(root))
    assert {n for n, _, _ in ns.listdir(ns.resolve("c"))} == {"0", "1", "2", "3"}
    a[:4] = 0  # zarr-python rewrites the shard without chunks 0 and 1
    assert {n for n, _, _ in ns.listdir(ns.resolve("c"))} == {"2", "3"}


def test_corrupt_shard_is_reported_once_and_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "corrupt"
    a = zarr.create_array(root, shape=(8,), dtype="uint8", shards=(4,), chunks=(2,))
    a[:] = np.arange(8, dtype="uint8")
    shard = root / "c" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0xFF  # flip a bit of the index, so its crc32c no longer matches
    shard.write_bytes(bytes(raw))
    ns = Namespace(LocalStorage(root))
    with caplog.at_level(logging.ERROR, logger="shardfs"):
        for _ in range(3):
            with pytest.raises(CorruptData, match="checksum"):
                ns.resolve("c/0")
        with pytest.raises(CorruptData):
            ns.listdir(ns.resolve("c"))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(shard) in errors[0].getMessage()
    assert ns.open(ns.resolve("c/2")).read(0, 100)  # the healthy shard still serves


def test_whole_shard_compression_is_shown_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "whole"
    a = zarr.create_array(
        root,
        shape=(8,),
        dtype="uint8",
        chunks=(4,),
        serializer=ShardingCodec(chunk_shape=(2,), codecs=[BytesCodec()]),
        compressors=[ZstdCodec()],
    )
    a[:] = 7
    ns = Namespace(LocalStorage(root))
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        node = ns.resolve("")
    assert node.role is Role.DIR
    assert "whole-shard" in caplog.text
    meta = ns.resolve("zarr.json")
    assert ns.open(meta).read(0, 1 << 20) == (root / "zarr.json").read_bytes()
    assert ns.resolve("c/0").role is Role.FILE  # the real shard passes through


def test_v2_view_materializes_to_a_plain_zarr_v2_copy(
    source: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, zarr2: Zarr2
) -> None:
    """The v2 view through the library API alone, copied out and read by zarr-python 2."""
    root, values = source
    ns = Namespace(LocalStorage(root), view=View.V2)
    target = tmp_path / "copy"
    target.mkdir()
    materialize(ns, ns.root(), target)
    assert not list(target.rglob("zarr.json"))
    assert (target / "nested" / "sharded" / "README.txt").read_text() == "not a chunk"
    assert (target / "flat" / "0.0.0").is_file() and (target / "plain" / "0").is_file()
    out = tmp_path / "out"
    out.mkdir()
    zarr2.run(
        """
import numpy as np, zarr
root = zarr.open_consolidated(params["path"], mode="r")
for name in params["names"]:
    np.save(f"{params['out']}/{name.replace('/', '__')}.npy", root[name][...])
""",
        path=str(target),
        out=str(out),
        names=list(values),
    )
    for name, expected in values.items():
        np.testing.assert_array_equal(np.load(out / f"{name.replace('/', '__')}.npy"), expected)


def _consolidated(ns: Namespace, group: str = "") -> set[str]:
    """The nodes a group's `.zmetadata` holds documents of."""
    node = ns.resolve(f"{group}/.zmetadata" if group else ".zmetadata")
    doc = json.loads(ns.open(node).read(0, ns.attr(node).size))
    return {key.rpartition("/")[0] for key in doc["metadata"]}


def test_a_v2_zmetadata_holds_only_what_every_reader_of_it_may_read(
    source: tuple[Path, dict[str, np.ndarray]],
) -> None:
    """Where other users read through the mount (`covers`), a group's `.zmetadata`, shown
    as its own `zarr.json`, leaves out a node that one of them could not find or read in
    the source, with all below it (repro r4 of audit 4); it is back once the source lets
    them. Where no one else reads through the mount, it holds every node."""
    root, _ = source
    for path in (root / "nested", root / "nested" / "zarr.json"):
        os.chown(path, 1234, 1234)
        path.chmod(0o700 if path.is_dir() else 0o600)
    (root / "plain" / "zarr.json").chmod(0o600)  # root's, but no one else's
    owners = Owners(read_only=True)
    shared = Namespace(LocalStorage(root), view=View.V2, covers=owners.covers)
    assert _consolidated(shared) == {"", "flat"}
    # the group's own `.zmetadata` is 1234's (0600): what 1234 may read is in it
    assert _consolidated(shared, "nested") == {"", "sharded"}
    everything = {"", "flat", "plain", "nested", "nested/sharded"}
    assert _consolidated(Namespace(LocalStorage(root), view=View.V2)) == everything
    (root / "nested").chmod(0o755)  # its document still 1234's alone: still out
    assert _consolidated(shared) == {"", "flat"}
    (root / "nested" / "zarr.json").chmod(0o644)
    (root / "plain" / "zarr.json").chmod(0o644)
    assert _consolidated(shared) == everything
    (root / "nested").chmod(0o711)  # searched, but not listed: its children not named
    assert _consolidated(shared) == {"", "flat", "plain", "nested"}


def _outcome(ns: Namespace, parent_path: str, name: str) -> object:
    """What `entry` answers (the node, the version of its metadata, its attributes and
    where its bytes are), or the kind of error."""
    try:
        node, attr = ns.entry(ns.resolve(parent_path), name)
    except Exception as e:  # the kind of error is the answer
        return type(e)
    meta = node.meta.version if node.meta is not None else None
    return node.path, node.role, node.coords, node.source, meta, attr, attr.extent


@pytest.mark.parametrize("view", [View.V3, View.V2])
def test_lookups_in_a_chunk_directory_seen_before_answer_as_a_fresh_view_does(
    tmp_path: Path, view: View
) -> None:
    """A lookup in a directory a chunk was found in skips finding out what the directory
    is (`Namespace._chunk_entry`). It must answer what a view that never looked there
    answers, for every kind of name, also after the array is rewritten behind it."""
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w")
    v2_keys = {"name": "v2", "separator": "."}

    def write(name: str, region: Any, value: int, **layout: Any) -> None:
        group.create_array(name, dtype="uint8", overwrite=True, **layout)[region] = value

    # nested: chunks (0, 0..2) written, the rest empty
    write("nested", np.s_[:2, :6], 7, shape=(8, 12), shards=(4, 4), chunks=(2, 2))
    write(
        "flat", np.s_[:3], 1, shape=(6, 6), shards=(6, 6), chunks=(3, 3), chunk_key_encoding=v2_keys
    )
    (root / "flat" / "README.txt").write_text("not a chunk")
    names = ["0", "1", "2", "3", "5", "6", "01", "-1", "x", "", "zarr.json", ".zarray"]
    names += ["0.0", "0.1", "1.1", "2.0", "00.0", "0.0.0", "README.txt", "c"]
    # the directories chunk files are in, in either view
    parents = ["nested/c/0", "nested", "flat"]

    primed = Namespace(LocalStorage(root), view=view)

    def compare() -> None:
        for parent in parents:
            for first in ["0", "0.0"]:  # a chunk found there, if either names one
                _outcome(primed, parent, first)
            for name in names:
                fresh = Namespace(LocalStorage(root), view=view)
                expected = _outcome(fresh, parent, name)
                assert _outcome(primed, parent, name) == expected, (parent, name)

    compare()
    # Rewritten with other chunks and another key encoding: the directories the primed
    # view remembers now hold other chunks, or none.
    write(
        "nested",
        np.s_[:],
        3,
        shape=(8, 12),
        shards=(8, 12),
        chunks=(4, 6),
        chunk_key_encoding=v2_keys,
    )
    write("flat", np.s_[:], 2, shape=(6, 6), chunks=(3, 3))
    compare()


def _listed_chunks(ns: Namespace, path: str) -> dict[tuple[int, ...], int]:
    """Every chunk file listed below array directory `path`: its coordinates (from its
    path) and its listed size, checked against what a lookup of it answers."""
    found: dict[tuple[int, ...], int] = {}
    for name, child, attr in ns.listdir(ns.resolve(path)):
        if child.is_dir:
            for coords, size in _listed_chunks(ns, child.path).items():
                found[(int(name), *coords)] = size
        elif name not in ("zarr.json", ".zarray", ".zattrs"):
            assert ns.attr(ns.resolve(child.path)).size == attr.size, child.path
            found[tuple(int(part) for part in name.split("."))] = attr.size
    return found


@pytest.mark.parametrize("view", [View.V3, View.V2])
def test_listings_show_exactly_the_chunks_stored(tmp_path: Path, view: View) -> None:
    """The deepest chunk directories are listed from rows kept per shard version
    (`DirRows`): every chunk zarr-python stored, and no other, at the size a lookup
    gives, in shards cut short by the grid's edge and with chunks missing; again after
    the array is rewritten behind the view; and, once it is shrunk, none of the chunks
    its shards still hold beyond the new edge."""
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w")
    rng = np.random.default_rng(1)
    layouts = {
        "one": dict(shape=(21,), chunks=(2,), shards=(8,)),
        "three": dict(shape=(5, 7, 9), chunks=(2, 2, 2), shards=(4, 4, 4)),
    }

    def write(name: str, keep: float) -> set[tuple[int, ...]]:
        """Store a random part of the chunks of array `name` (the rest stay empty)."""
        layout = layouts[name]
        a = group.create_array(name, dtype="uint16", overwrite=True, **layout)
        grid = tuple(-(-s // c) for s, c in zip(layout["shape"], layout["chunks"], strict=True))
        stored = {c for c in np.ndindex(grid) if rng.random() < keep}
        for coords in stored:
            region = tuple(
                slice(i * c, (i + 1) * c) for i, c in zip(coords, layout["chunks"], strict=True)
            )
            a[region] = rng.integers(1, 60000, a[region].shape, dtype="uint16")
        return stored

    def check(expected: dict[str, set[tuple[int, ...]]]) -> None:
        for name, stored in expected.items():
            listed = _listed_chunks(ns, f"{name}/c" if view is View.V3 else name)
            assert set(listed) == stored, name
            assert all(size > 0 for size in listed.values())

    ns = Namespace(LocalStorage(root), view=view)
    for keep in (0.6, 0.3, 1.0):
        expected = {name: write(name, keep) for name in layouts}
        check(expected)
    # Shrunk: zarr-python keeps the shards across the new edge as they are, with the
    # chunks beyond it.
    grids = {"one": (7,), "three": (2, 3, 4)}
    group["one"].resize((13,))
    group["three"].resize((3, 5, 7))
    check(
        {
            name: {c for c in stored if all(i < g for i, g in zip(c, grids[name], strict=True))}
            for name, stored in expected.items()
        }
    )


@pytest.mark.parametrize("few", [64, 0])
def test_rows_for_a_front_end_are_what_lookups_find(
    tmp_path: Path, few: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows a front end that answers lookups and reads itself is given, after a lookup
    (`ChunkDirectory.shard_rows`, one by one for few rows or with numpy for many) and from
    a listing (`ChunkRun.stored_rows`), name every stored chunk of their shard in that
    directory, with the grid index, offset and length a lookup of it finds, and no other."""
    monkeypatch.setattr(leaves, "FEW_ROWS", few)
    root = tmp_path / "src"
    values = np.random.default_rng(5).integers(1, 255, (4, 40), dtype=np.uint8)
    values[0, 4:8] = 0  # chunks (0, 2) and (0, 3): never stored
    array = zarr.create_array(
        root, shape=(4, 40), chunks=(1, 2), shards=(2, 20), dtype="uint8", compressors=None,
        fill_value=0,
    )  # fmt: skip
    array[:] = values
    ns = Namespace(LocalStorage(root))
    parent = ns.resolve("c/0")
    ns.entry(parent, "0")  # prepares the directory
    leaf = ns.chunk_directory("c/0")
    assert leaf is not None

    def found(name: str) -> tuple[int, str, int, int]:
        hit = leaf.entry(name)
        assert hit is not None and hit[3].extent is not None
        extent = hit[3].extent
        return hit[2], extent.key, extent.offset, extent.length

    stored = {str(k) for k in range(20) if k not in (2, 3)}
    from_lookups: dict[str, tuple[int, str, int, int]] = {}
    for first in ("0", "10"):  # one chunk of each of the directory's two shards
        hit = leaf.entry(first)
        assert hit is not None and hit[3].shard is not None
        rows = leaf.shard_rows(hit)
        assert rows is not None
        for name, index, offset, length in zip(*rows, strict=True):
            from_lookups[name.decode()] = (index, hit[3].shard[0], offset, length)
    assert set(from_lookups) == stored
    assert all(from_lookups[name] == found(name) for name in stored)

    from_listing: dict[str, tuple[int, str, int, int]] = {}
    for _, run, _ in ns.listing(parent).chunks(0):
        names = [name.encode() for name in run.names()]
        for k, _, names_, flat, offsets, lengths in run.stored_rows(names, 0, len(run)):
            for name, index, offset, length in zip(names_, flat, offsets, lengths, strict=True):
                from_listing[name.decode()] = (index, run.shards[k][0], offset, length)
    assert from_listing == from_lookups
