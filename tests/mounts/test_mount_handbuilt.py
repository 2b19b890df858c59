"""Shards no writer produces, built byte by byte, read through a shardfs mount.

Writers lay inner chunks out densely and in order, so the odd but valid layouts the spec allows
(shuffled chunks, gaps, dead bytes, two slots sharing bytes) and corrupt indexes must be built by
hand. Indexes are encoded here with numpy and the `crc32c` package straight from the spec, so
these tests do not trust shardfs's own encoder. The source is first checked with zarr-python and
tensorstore (reading the shards directly), so a failure through the mount is shardfs's fault.
One source and one mount are shared by the module. The Hypothesis properties at the end need no
mount.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import numcodecs
import numpy as np
import pytest
import tensorstore as ts
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.storage import LocalStore

from shardfs.formats.shard_index import IndexCodec, check_entries
from shardfs.primitives.errors import CorruptData
from tests.conftest import Mounted, start_mount, stop_mount

EMPTY = 2**64 - 1  # the spec's marker of an empty inner chunk (offset and nbytes)
GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}
SLASH = {"name": "default", "configuration": {"separator": "/"}}

# Every hand-built array: uint16, 2x2 chunks in 4x4 shards, so a shard has 4 slots (C order).
DTYPE, FILL = "uint16", 7
SHARD, CHUNK = (4, 4), (2, 2)
SLOTS = math.prod(s // c for s, c in zip(SHARD, CHUNK, strict=True))


def encode_index(entries: np.ndarray, *, big_endian: bool, crc: bool) -> bytes:
    """The spec's index encoding: (offset, nbytes) uint64 pairs in C order, then a crc32c."""
    raw = np.asarray(entries, dtype=">u8" if big_endian else "<u8").tobytes()
    return raw + crc32c.crc32c(raw).to_bytes(4, "little") if crc else raw


def index_size(crc: bool) -> int:
    return 16 * SLOTS + (4 if crc else 0)


def chunk_key(keys: dict[str, Any], coords: tuple[int, ...]) -> str:
    """A chunk's key under a Zarr v3 chunk key encoding (the spec's rule, not shardfs's)."""
    default_sep = "/" if keys["name"] == "default" else "."
    sep = keys.get("configuration", {}).get("separator", default_sep)
    parts = [str(i) for i in coords]
    return sep.join(["c", *parts] if keys["name"] == "default" else parts)


@dataclass(frozen=True)
class Layout:
    """How one hand-built array stores its shards and inner chunks."""

    index_at_start: bool = False
    big_index: bool = False
    crc: bool = True
    compressor: str | None = None  # "gzip" or "zstd" after the bytes codec
    chunk_endian: str = "little"
    keys: dict[str, Any] = field(default_factory=lambda: SLASH)

    def inner_codecs(self) -> list[Any]:
        codecs: list[Any] = [{"name": "bytes", "configuration": {"endian": self.chunk_endian}}]
        if self.compressor == "gzip":
            codecs.append({"name": "gzip", "configuration": {"level": 5}})
        elif self.compressor == "zstd":
            codecs.append({"name": "zstd", "configuration": {"level": 3, "checksum": False}})
        return codecs

    def metadata(self, shape: tuple[int, ...]) -> dict[str, Any]:
        index_codecs: list[Any] = [
            {"name": "bytes", "configuration": {"endian": "big" if self.big_index else "little"}}
        ]
        if self.crc:
            index_codecs.append({"name": "crc32c"})
        sharding = {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": list(CHUNK),
                "codecs": self.inner_codecs(),
                "index_codecs": index_codecs,
                "index_location": "start" if self.index_at_start else "end",
            },
        }
        return {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(shape),
            "data_type": DTYPE,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHARD)}},
            "chunk_key_encoding": self.keys,
            "fill_value": FILL,
            "codecs": [sharding],
            "attributes": {},
        }

    def encode_chunk(self, block: np.ndarray) -> bytes:
        raw = block.astype(np.dtype(DTYPE).newbyteorder(self.chunk_endian[0])).tobytes()
        if self.compressor == "gzip":
            return bytes(numcodecs.GZip(level=5).encode(raw))
        if self.compressor == "zstd":
            return bytes(numcodecs.Zstd(level=3).encode(raw))
        return raw

    def pack(
        self, chunks: dict[int, bytes], aliases: dict[int, int], rng: np.random.Generator
    ) -> tuple[bytes, np.ndarray]:
        """Data region and index entries: chunks in shuffled order, junk gaps, dead bytes at both ends.

        `aliases` maps a slot to another slot whose bytes it shares.
        """
        base = index_size(self.crc) if self.index_at_start else 0
        data = bytearray(rng.bytes(int(rng.integers(1, 24))))
        entries = np.full((SLOTS, 2), EMPTY, dtype=np.uint64)
        for slot in rng.permutation(sorted(chunks)):
            data += rng.bytes(int(rng.integers(0, 16)))
            entries[slot] = (base + len(data), len(chunks[slot]))
            data += chunks[slot]
        for slot, target in aliases.items():
            entries[slot] = entries[target]
        data += rng.bytes(int(rng.integers(1, 24)))
        return bytes(data), entries

    def assemble(self, data: bytes, index: bytes) -> bytes:
        return index + data if self.index_at_start else data + index


@dataclass
class Built:
    """What a hand-built array must look like through the mount."""

    values: np.ndarray
    files: dict[str, bytes]  # view chunk key -> exact bytes of that file


def build_array(
    path: Path,
    shape: tuple[int, int],
    layout: Layout,
    plan: dict[tuple[int, int], dict[int, int | None]],
    rng: np.random.Generator,
) -> tuple[Built, dict[tuple[int, int], tuple[bytes, np.ndarray]]]:
    """Write an array whose shards follow `plan`; also return each shard's (data, entries).

    `plan[shard][slot]` is None for a chunk of its own or the slot whose bytes it
    shares; slots not in the plan are empty and shards not in it are missing.
    """
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(layout.metadata(shape)))
    grid = [-(-n // c) for n, c in zip(shape, CHUNK, strict=True)]
    padded = np.full([g * c for g, c in zip(grid, CHUNK, strict=True)], FILL, dtype=DTYPE)
    files: dict[str, bytes] = {}
    parts = {}
    per_row = SHARD[1] // CHUNK[1]
    for shard, slots in plan.items():
        blocks = {
            slot: rng.integers(100, 60000, CHUNK).astype(DTYPE)
            for slot, target in slots.items()
            if target is None
        }
        chunks = {slot: layout.encode_chunk(block) for slot, block in blocks.items()}
        aliases = {slot: target for slot, target in slots.items() if target is not None}
        data, entries = layout.pack(chunks, aliases, rng)
        index = encode_index(entries, big_endian=layout.big_index, crc=layout.crc)
        shard_file = path / chunk_key(layout.keys, shard)
        shard_file.parent.mkdir(parents=True, exist_ok=True)
        shard_file.write_bytes(layout.assemble(data, index))
        parts[shard] = (data, entries)
        for slot, target in slots.items():
            own = slot if target is None else target
            row = shard[0] * (SHARD[0] // CHUNK[0]) + slot // per_row
            col = shard[1] * per_row + slot % per_row
            if row >= grid[0] or col >= grid[1]:
                continue  # beyond the array edge: stored, but not part of the array
            padded[row * 2 : row * 2 + 2, col * 2 : col * 2 + 2] = blocks[own]
            files[chunk_key(layout.keys, (row, col))] = chunks[own]
    values = padded[: shape[0], : shape[1]].copy()
    return Built(values, files), parts


# -- valid but unusual layouts ------------------------------------------------------------------

#: A 6x8 array has 2x2 shards; the bottom row of shards is half outside the array.
ODD_SHAPE = (6, 8)
ODD_PLAN: dict[tuple[int, int], dict[int, int | None]] = {
    (0, 0): {0: None, 1: None, 2: None, 3: None},
    (0, 1): {0: None, 2: None, 3: 0},  # slot 1 empty, slot 3 shares slot 0's bytes
    (1, 0): {0: None, 1: None, 2: None},  # slot 2 lies beyond the array edge
    # shard (1, 1) is missing
}
ODD_LAYOUTS = {
    "end-crc-raw": Layout(),
    "start-nocrc-gzip": Layout(index_at_start=True, crc=False, compressor="gzip"),
    "end-bigindex-zstd-bigchunks": Layout(big_index=True, compressor="zstd", chunk_endian="big"),
    "start-crc-v2-dot": Layout(
        index_at_start=True, keys={"name": "v2", "configuration": {"separator": "."}}
    ),
    "end-nocrc-default-dot": Layout(
        crc=False, keys={"name": "default", "configuration": {"separator": "."}}
    ),
}


# -- corrupt indexes --------------------------------------------------------------------------

#: A 4x8 array of two full shards: c/0/0 is healthy, c/0/1 is corrupted.
CORRUPT_SHAPE = (4, 8)
FULL_PLAN: dict[tuple[int, int], dict[int, int | None]] = {
    (0, 0): {0: None, 1: None, 2: None, 3: None},
    (0, 1): {0: None, 1: None, 2: None, 3: None},
}
HEALTHY_CHUNKS = [(0, 0), (0, 1), (1, 0), (1, 1)]
CORRUPT_CHUNKS = [(0, 2), (1, 3)]  # slot 0 (left intact) and slot 3 (the broken entry)


def reindexed(change: Callable[[np.ndarray, Layout, int], None]) -> Callable[..., bytes]:
    """A corruption that alters entries (slot 3 by convention) and re-encodes a valid crc32c."""

    def corrupt(layout: Layout, data: bytes, entries: np.ndarray) -> bytes:
        entries = entries.copy()
        change(entries, layout, len(data))
        index = encode_index(entries, big_endian=layout.big_index, crc=layout.crc)
        return layout.assemble(data, index)

    return corrupt


def stale_crc(layout: Layout, data: bytes, entries: np.ndarray) -> bytes:
    """Shrink slot 3 by a byte (still in bounds) but keep the old checksum."""
    good = encode_index(entries, big_endian=layout.big_index, crc=True)
    changed = entries.copy()
    changed[3, 1] -= 1
    body = encode_index(changed, big_endian=layout.big_index, crc=False)
    return layout.assemble(data, body + good[-4:])


def set_entry(slot_value: Callable[[Layout, int], tuple[int, int]]) -> Callable[..., bytes]:
    def change(entries: np.ndarray, layout: Layout, data_len: int) -> None:
        entries[3] = slot_value(layout, data_len)

    return reindexed(change)


def truncated(layout: Layout, data: bytes, entries: np.ndarray) -> bytes:
    """The last bytes of a valid shard, one byte fewer than its index needs."""
    good = layout.assemble(data, encode_index(entries, big_endian=layout.big_index, crc=True))
    return good[-(index_size(layout.crc) - 1) :]


@dataclass(frozen=True)
class Corruption:
    """A corruption of shard c/0/1, and the words the daemon's log line must give as the reason."""

    name: str
    corrupt: Callable[[Layout, bytes, np.ndarray], bytes]
    reason: str
    layout: Layout = field(default_factory=Layout)


CORRUPTIONS = [
    Corruption("crc-mismatch", stale_crc, "checksum"),
    Corruption(
        "crc-mismatch-big-index-start",
        stale_crc,
        "checksum",
        Layout(index_at_start=True, big_index=True),
    ),
    Corruption(
        "crc-mismatch-v2-dot-keys",
        stale_crc,
        "checksum",
        Layout(keys={"name": "v2", "configuration": {"separator": "."}}),
    ),
    # Index at the end: the data region is [0, len(data)), the index follows it.
    Corruption(
        "offset-past-end", set_entry(lambda lo, n: (n + index_size(lo.crc) + 8, 4)), "outside"
    ),
    Corruption(
        "offset-past-end-nocrc", set_entry(lambda lo, n: (n + 100, 4)), "outside", Layout(crc=False)
    ),
    Corruption("runs-past-end", set_entry(lambda lo, n: (16, 2**63)), "runs past"),
    Corruption("overlaps-index-end", set_entry(lambda lo, n: (n - 4, 8)), "runs past"),
    Corruption(
        "overlaps-index-start",
        set_entry(lambda lo, n: (index_size(lo.crc) - 4, 8)),
        "outside",
        Layout(index_at_start=True),
    ),
    Corruption("half-empty-offset", set_entry(lambda lo, n: (EMPTY, 8)), "only one of"),
    Corruption("half-empty-nbytes", set_entry(lambda lo, n: (16, EMPTY)), "only one of"),
    Corruption("shorter-than-index", truncated, "cannot hold"),
    Corruption("zero-bytes", lambda layout, data, entries: b"", "cannot hold"),
]


# -- the shared source and mount -----------------------------------------------------------------


@dataclass
class Source:
    root: Path
    mounted: Mounted
    odd: dict[str, Built]
    corrupt: dict[str, Built]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    base = tmp_path_factory.mktemp("handbuilt")
    root = base / "src"
    rng = np.random.default_rng(20240611)
    for group in [root, root / "odd", root / "corrupt"]:
        group.mkdir(parents=True)
        (group / "zarr.json").write_text(json.dumps(GROUP))
    odd = {
        name: build_array(root / "odd" / name, ODD_SHAPE, layout, ODD_PLAN, rng)[0]
        for name, layout in ODD_LAYOUTS.items()
    }
    corrupt = {}
    for case in CORRUPTIONS:
        path = root / "corrupt" / case.name
        built, parts = build_array(path, CORRUPT_SHAPE, case.layout, FULL_PLAN, rng)
        data, entries = parts[(0, 1)]
        (path / chunk_key(case.layout.keys, (0, 1))).write_bytes(
            case.corrupt(case.layout, data, entries)
        )
        corrupt[case.name] = built
    mounted = start_mount(root, base / "mnt", base / "mnt.log", "ro")
    try:
        yield Source(root, mounted, odd, corrupt)
    finally:
        stop_mount(mounted)


def read_zarr(path: Path, region: Any = ...) -> np.ndarray:
    return zarr.open_array(LocalStore(path, read_only=True), mode="r")[region]


def read_tensorstore(path: Path, region: Any = ...) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/"}}
    return ts.open(spec, open=True, read=True).result()[region].read().result()


def view_files(array: Path) -> dict[str, bytes]:
    """Every file below a view array except its zarr.json, by relative path."""
    return {
        os.path.relpath(os.path.join(d, f), array): Path(d, f).read_bytes()
        for d, _, names in os.walk(array)
        for f in names
        if not (f == "zarr.json" and d == str(array))
    }


@pytest.mark.fuse
@pytest.mark.parametrize("name", ODD_LAYOUTS)
def test_source_is_valid_for_other_readers(source: Source, name: str) -> None:
    """zarr-python and tensorstore read the hand-built shards directly: the test data is right."""
    path = source.root / "odd" / name
    np.testing.assert_array_equal(read_zarr(path), source.odd[name].values)
    np.testing.assert_array_equal(read_tensorstore(path), source.odd[name].values)


@pytest.mark.fuse
@pytest.mark.parametrize("name", ODD_LAYOUTS)
def test_view_files_are_exactly_the_stored_chunks(source: Source, name: str) -> None:
    """One file per in-bounds non-empty slot (shared slots included), holding its exact bytes."""
    assert view_files(source.mounted.path / "odd" / name) == source.odd[name].files


@pytest.mark.fuse
@pytest.mark.parametrize("name", ODD_LAYOUTS)
def test_readers_see_the_values_through_the_mount(source: Source, name: str) -> None:
    path = source.mounted.path / "odd" / name
    view = json.loads((path / "zarr.json").read_text())
    assert view["chunk_grid"]["configuration"]["chunk_shape"] == list(CHUNK)
    assert view["codecs"] == ODD_LAYOUTS[name].inner_codecs()
    np.testing.assert_array_equal(read_zarr(path), source.odd[name].values, strict=True)
    np.testing.assert_array_equal(read_tensorstore(path), source.odd[name].values, strict=True)


def expect_eio(action: Callable[[], object]) -> None:
    with pytest.raises(OSError) as info:
        action()
    assert info.value.errno == errno.EIO, os.strerror(info.value.errno or 0)


@pytest.mark.fuse
@pytest.mark.parametrize("case", CORRUPTIONS, ids=[c.name for c in CORRUPTIONS])
def test_corrupt_index_gives_eio_and_one_log_line(source: Source, case: Corruption) -> None:
    """Chunks of a corrupt shard fail with EIO (never ENOENT or wrong bytes), repeatedly,
    logged once; its healthy neighbour and the daemon carry on."""
    array = source.mounted.path / "corrupt" / case.name
    keys = case.layout.keys
    for _ in range(3):
        for coords in CORRUPT_CHUNKS:
            expect_eio(lambda c=coords: (array / chunk_key(keys, c)).read_bytes())
        expect_eio(lambda: os.listdir((array / chunk_key(keys, CORRUPT_CHUNKS[0])).parent))

    built = source.corrupt[case.name]
    for coords in HEALTHY_CHUNKS:
        key = chunk_key(keys, coords)
        assert (array / key).read_bytes() == built.files[key]
    np.testing.assert_array_equal(read_zarr(array, np.s_[:, :4]), built.values[:, :4])
    np.testing.assert_array_equal(read_tensorstore(array, np.s_[:, :4]), built.values[:, :4])

    assert source.mounted.process.poll() is None
    assert (source.mounted.path / "corrupt" / "zarr.json").read_bytes()
    shard = source.root / "corrupt" / case.name / chunk_key(keys, (0, 1))
    naming = [line for line in source.mounted.log().splitlines() if f"{shard}:" in line]
    assert len(naming) == 1, naming
    assert " ERROR " in naming[0] and case.reason in naming[0]


@pytest.mark.fuse
def test_healthy_arrays_log_nothing(source: Source) -> None:
    """Unusual but valid layouts are not mistaken for corruption."""
    for name in ODD_LAYOUTS:
        view_files(source.mounted.path / "odd" / name)
    odd = str(source.root / "odd")
    assert not [line for line in source.mounted.log().splitlines() if odd in line]


# -- properties of the index codec (no mount) ---------------------------------------------------

chunks_per_shard = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
codecs = st.builds(IndexCodec, big_endian=st.booleans(), checksums=st.integers(0, 2))


def with_checksums(body: bytes, checksums: int) -> bytes:
    for _ in range(checksums):
        body += crc32c.crc32c(body).to_bytes(4, "little")
    return body


@settings(max_examples=300, deadline=None)
@given(data=st.data(), cps=chunks_per_shard, codec=codecs)
def test_random_index_bytes_only_ever_raise_corrupt_data(
    data: st.DataObject, cps: tuple[int, ...], codec: IndexCodec
) -> None:
    """Whatever a shard's index bytes hold, decoding and checking fail only with CorruptData."""
    body_size = 16 * math.prod(cps)
    raw = data.draw(
        st.one_of(
            st.binary(max_size=2 * body_size + 12),  # any length
            st.binary(min_size=body_size, max_size=body_size).map(
                lambda body: with_checksums(body, codec.checksums)  # right size, valid crc
            ),
        )
    )
    start = data.draw(st.integers(0, 2**64 - 1))
    end = data.draw(st.integers(start, 2**64 - 1))
    with contextlib.suppress(CorruptData):
        check_entries(codec.decode(raw, cps), start, end)


entry_value = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 2), st.just(EMPTY))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), cps=chunks_per_shard, codec=codecs)
def test_index_round_trip_and_bounds(
    data: st.DataObject, cps: tuple[int, ...], codec: IndexCodec
) -> None:
    """decode inverts the spec encoding, encode matches it, and check_entries accepts exactly
    the entries that are empty or lie inside the data region."""
    count = math.prod(cps)
    pairs = data.draw(
        st.lists(
            st.one_of(st.just((EMPTY, EMPTY)), st.tuples(entry_value, entry_value)),
            min_size=count,
            max_size=count,
        )
    )
    entries = np.array(pairs, dtype=np.uint64).reshape((*cps, 2))
    raw = with_checksums(
        entries.astype(">u8" if codec.big_endian else "<u8").tobytes(), codec.checksums
    )
    assert len(raw) == codec.size(cps)
    decoded = codec.decode(raw, cps)
    assert decoded.shape == (*cps, 2)
    np.testing.assert_array_equal(decoded, entries)
    assert codec.encode(entries) == raw

    start = data.draw(st.integers(0, 400))
    end = data.draw(st.integers(start, 600))
    valid = all(
        (off, n) == (EMPTY, EMPTY) or (EMPTY not in (off, n) and start <= off and off + n <= end)
        for off, n in pairs
    )
    if valid:
        check_entries(decoded, start, end)
    else:
        with pytest.raises(CorruptData):
            check_entries(decoded, start, end)
