"""A chunk costs the same under 32 MiB of attributes as under none (issue 19, item 6).

An array whose `zarr.json` is bigger than the metadata budget was read and
parsed again on every lookup of one of its chunks. Its document is now read
and parsed once per version: what lookups keep of it is its layout, small
whatever the attributes, and the documents the view renders from it
(`zarr.json`, `.zarray`, `.zattrs`, `.zmetadata`) are made again from the same
version when they are read and too big to keep. The counts here are of reads
of the document (a counting storage) and of its parses (`ZarrV3.parse_spans`), and
through a mount of the bytes the daemon reads (`rchar` of /proc/PID/io).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardfs.formats.zarr_v2 import render as render_v2
from shardfs.formats.zarr_v2 import v2_array, zattrs
from shardfs.formats.zarr_v3 import sharded_layout
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, View
from shardfs.view.hierarchy import ZarrV3
from tests.conftest import start_mount, stop_mount

#: Twice the metadata budget (16 MiB): the size that made every lookup parse the document.
ATTRIBUTES = 32 << 20
SHAPE, SHARDS, CHUNKS = (64, 64), (32, 32), (8, 8)
BIG = "big/zarr.json"


def attributes(tag: str) -> dict[str, Any]:
    """About `ATTRIBUTES` bytes of JSON, in 1 KiB strings (quick to write and parse)."""
    count = ATTRIBUTES // 1024
    return {"tag": tag, "notes": [f"{tag}-{i:08d}".ljust(1024, ".") for i in range(count)]}


VALUES = np.arange(np.prod(SHAPE), dtype="uint16").reshape(SHAPE)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A group holding `big` (sharded, big attributes) and `small` (sharded, small ones)."""
    root = tmp_path / "src"
    group = zarr.open_group(root, mode="w", attributes={"title": "cost"})
    big = group.create_array(
        "big",
        shape=SHAPE,
        dtype="uint16",
        shards=SHARDS,
        chunks=CHUNKS,
        attributes=attributes("first"),
        dimension_names=["y", "x"],
    )
    big[...] = VALUES
    small = group.create_array(
        "small", shape=SHAPE, dtype="uint16", shards=SHARDS, chunks=CHUNKS, attributes={"n": 1}
    )
    small[...] = VALUES
    assert (root / BIG).stat().st_size > ATTRIBUTES
    return root


class CountingStorage(LocalStorage):
    """A local source that counts the whole-object reads of each key (documents are
    read so; shards through pins)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: Counter[str] = Counter()

    def read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        self.reads[key] += 1
        return super().read(key, offset, length, version)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times a document at least `ATTRIBUTES` big was parsed."""
    counts: Counter[str] = Counter()
    parse = ZarrV3.parse_spans

    def counting(self: ZarrV3, raw: bytes | None) -> tuple[dict[str, Any], Any]:
        if raw is not None and len(raw) >= ATTRIBUTES:
            counts["big"] += 1
        return parse(self, raw)

    monkeypatch.setattr(ZarrV3, "parse_spans", counting)
    return counts


def chunk_paths(array: str, view: View) -> list[str]:
    """Every chunk file of a `SHAPE` / `CHUNKS` array in `view`, by view path."""
    rows, cols = (s // c for s, c in zip(SHAPE, CHUNKS, strict=True))
    prefix = f"{array}/c/" if view is View.V3 else f"{array}/"
    return [f"{prefix}{i}/{j}" for i in range(rows) for j in range(cols)]


def read_chunk(ns: Namespace, path: str) -> int:
    """Look up, stat, open and read one chunk file as the kernel asks for it; its size."""
    parent, _, name = path.rpartition("/")
    node, attr = ns.entry(ns.resolve(parent), name)
    with ns.open(node) as reader:
        data = reader.read(0, attr.size + 1)
    assert len(data) == attr.size > 0
    return len(data)


def read_document(ns: Namespace, path: str) -> bytes:
    """A metadata document of the view, read whole; its stat and listing agree with it."""
    node = ns.resolve(path)
    with ns.open(node) as reader:
        data = reader.read(0, reader.size + 1)
    assert ns.attr(node).size == len(data)
    parent, _, name = path.rpartition("/")
    listed = {entry: attr.size for entry, _, attr in ns.listdir(ns.resolve(parent))}
    assert listed[name] == len(data)
    return data


@pytest.mark.parametrize("view", [View.V3, View.V2], ids=["v3", "v2"])
def test_warm_chunk_lookups_neither_read_nor_parse_the_document(
    source: Path, parses: Counter[str], view: View
) -> None:
    storage = CountingStorage(source)
    ns = Namespace(storage, view=view)
    paths = chunk_paths("big", view)
    read_chunk(ns, paths[0])
    assert (storage.reads[BIG], parses["big"]) == (1, 1)  # once for this version
    for path in paths:
        read_chunk(ns, path)
    for path in reversed(paths):
        read_chunk(ns, path)
    assert (storage.reads[BIG], parses["big"]) == (1, 1)


def test_what_lookups_keep_does_not_grow_with_the_attributes(source: Path) -> None:
    ns = Namespace(LocalStorage(source))
    for path in chunk_paths("big", View.V3) + chunk_paths("small", View.V3):
        read_chunk(ns, path)
    read_document(ns, BIG)
    read_document(ns, "small/zarr.json")
    assert ns.presentation.nodes.used < 16 << 10  # two arrays' layouts, not 32 MiB of attributes
    # The rendered documents have their own budget: the small one is kept, the big not.
    assert ns.presentation.documents.used < 16 << 10
    assert ns.presentation.documents.used <= ns.presentation.documents.budget


def test_v3_documents_read_exactly(source: Path, parses: Counter[str]) -> None:
    """The rewritten `zarr.json` is byte for byte what the layout of the whole document
    renders, also when rendered again (too big to keep), and its attributes are all there."""
    storage = CountingStorage(source)
    ns = Namespace(storage)
    stored = json.loads((source / BIG).read_bytes())
    expected = sharded_layout(stored).view_metadata  # type: ignore[union-attr]
    read_chunk(ns, chunk_paths("big", View.V3)[0])
    first = read_document(ns, BIG)
    assert first == expected
    shown = json.loads(first)
    assert shown["attributes"] == attributes("first")
    assert shown["chunk_grid"]["configuration"]["chunk_shape"] == list(CHUNKS)
    assert "sharding_indexed" not in first.decode()
    assert read_document(ns, BIG) == expected
    # Each open of a document too big to keep renders it again; lookups never do.
    reads = storage.reads[BIG]
    for path in chunk_paths("big", View.V3):
        read_chunk(ns, path)
    assert storage.reads[BIG] == reads
    # A small document is rendered once per version and kept.
    for _ in range(3):
        read_document(ns, "small/zarr.json")
    assert storage.reads["small/zarr.json"] == 1


def test_v2_documents_read_exactly(source: Path) -> None:
    """`.zattrs`, `.zarray` and the consolidated `.zmetadata` hold the attributes, exactly."""
    ns = Namespace(CountingStorage(source), view=View.V2)
    stored = json.loads((source / BIG).read_bytes())
    layout = sharded_layout(stored)
    assert layout is not None
    v2 = v2_array(json.loads(layout.view_metadata))
    read_chunk(ns, chunk_paths("big", View.V2)[0])
    assert read_document(ns, "big/.zattrs") == render_v2(zattrs(stored)[0])
    assert read_document(ns, "big/.zarray") == render_v2(v2.zarray)
    consolidated = json.loads(read_document(ns, ".zmetadata"))["metadata"]
    assert consolidated["big/.zattrs"] == {**attributes("first"), "_ARRAY_DIMENSIONS": ["y", "x"]}
    assert consolidated["big/.zarray"] == v2.zarray
    assert consolidated["small/.zattrs"] == {"n": 1}
    assert consolidated[".zattrs"] == {"title": "cost"}


def test_a_changed_document_is_read_again_once(source: Path, parses: Counter[str]) -> None:
    storage = CountingStorage(source)
    ns = Namespace(storage)
    paths = chunk_paths("big", View.V3)
    for path in paths:
        read_chunk(ns, path)
    assert json.loads(read_document(ns, BIG))["attributes"]["tag"] == "first"
    zarr.open_array(source / "big", mode="r+").update_attributes(attributes("second"))
    reads, parsed = storage.reads[BIG], parses["big"]
    for path in paths:
        read_chunk(ns, path)
    assert (storage.reads[BIG], parses["big"]) == (reads + 1, parsed + 1)
    shown = json.loads(read_document(ns, BIG))
    assert shown["attributes"] == attributes("second")
    assert shown["chunk_grid"]["configuration"]["chunk_shape"] == list(CHUNKS)


def test_a_view_bigger_than_the_budget_is_refused_once(
    source: Path, parses: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose layout alone exceeds the metadata budget is shown unchanged, with one
    log line per version, rather than parsed again on every lookup."""
    storage = CountingStorage(source)
    ns = Namespace(storage, metadata_cache=1024)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        for _ in range(5):
            node = ns.resolve("small")
            names = {name for name, _, _ in ns.listdir(node)}
    assert names == {"zarr.json", "c"}  # as stored: its shards under c/, not its chunks
    assert storage.reads["small/zarr.json"] == 1
    refused = [r for r in caplog.records if "shown unchanged" in r.getMessage()]
    assert len(refused) == 1 and "metadata_cache" in refused[0].getMessage()
    assert ns.resolve("small/c/0/0").role.name == "FILE"  # a shard, passed through


def rchar(pid: int) -> int:
    """Bytes the process has read so far (read, pread, ... of any file)."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.fixture
def mounted(source: Path, tmp_path: Path) -> Iterator[Any]:
    """A read-write mount: the kernel keeps what it learns for one second only."""
    mounted = start_mount(source, tmp_path / "mnt", tmp_path / "mnt.log")
    try:
        yield mounted
    finally:
        stop_mount(mounted)


def read_chunk_files(view: Path) -> None:
    """Open and read every chunk file of `big` through the mount, each once."""
    for path in chunk_paths("big", View.V3):
        with open(view / path, "rb") as file:
            assert file.read()


@pytest.mark.fuse
def test_through_a_mount(source: Path, mounted: Any) -> None:
    """zarr-python 3 reads the array and its attributes through the mount; then opening
    and reading every chunk file reads next to nothing in the daemon (not the document),
    and after a change of the document, the new attributes show."""
    view, pid = mounted.path, mounted.process.pid
    size = (source / BIG).stat().st_size
    array = zarr.open_array(view / "big", mode="r")
    assert array.shards is None and array.chunks == CHUNKS
    assert array.attrs.asdict() == attributes("first")
    np.testing.assert_array_equal(array[...], VALUES)
    shown = (view / BIG).read_bytes()
    assert len(shown) == os.stat(view / BIG).st_size
    assert json.loads(shown)["attributes"] == attributes("first")

    before = rchar(pid)
    read_chunk_files(view)
    assert rchar(pid) - before < size // 8  # the shards' indexes and chunks, no document

    zarr.open_array(source / "big", mode="r+").update_attributes(attributes("second"))
    time.sleep(1.2)  # what the kernel may keep of the old zarr.json on a read-write mount
    array = zarr.open_array(view / "big", mode="r")
    assert array.attrs.asdict() == attributes("second")
    np.testing.assert_array_equal(array[...], VALUES)
    before = rchar(pid)
    read_chunk_files(view)
    assert rchar(pid) - before < size // 8
