"""`shardfs fsck` and `shardfs compact` on sources written by zarr-python 3 (no FUSE).

Dead space is made the way a read-write mount makes it: chunks stored again
by an append of new chunk bytes plus a new index (`append_update` and
`Storage.append`; shards with the index at the start are rewritten whole
around their old body). Stored again are copies of chunks of the same shard,
so the values are known without encoding anything. After compacting, the
source is read directly by zarr-python 3 and tensorstore.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr
from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec

from shardfs.cli import main
from shardfs.formats.shard_index import EMPTY
from shardfs.formats.shard_write import append_update
from shardfs.formats.zarr_draft import DRAFT_FORMAT
from shardfs.formats.zarr_v3 import ShardLevel, sharded_layout
from shardfs.maintenance import Policy, compact, find_shards, fsck, progress_bar
from shardfs.maintenance.info import survey
from shardfs.maintenance.report import format_size
from shardfs.primitives.errors import SourceChanged
from shardfs.storage import LocalStorage, Stat, journal

pytestmark = pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")

SHAPE = (16, 24)
CHUNK = (4, 6)
SHARD = (8, 12)

#: name -> zarr.create_array options. Every sharded array has 2 x 2 shards of 2 x 2 chunks.
ARRAYS: dict[str, dict[str, Any]] = {
    "end": {"chunks": CHUNK, "shards": SHARD},
    "start": {
        "serializer": ShardingCodec(
            chunk_shape=CHUNK, codecs=[BytesCodec(), GzipCodec()], index_location="start"
        ),
        "chunks": SHARD,
        "compressors": None,
    },
    "sub/dots": {"chunks": CHUNK, "shards": SHARD, "chunk_key_encoding": {"name": "v2"}},
    "sub/slashes": {
        "chunks": CHUNK,
        "shards": SHARD,
        "chunk_key_encoding": {"name": "v2", "separator": "/"},
    },
    "cdots": {
        "chunks": CHUNK,
        "shards": SHARD,
        "chunk_key_encoding": {"name": "default", "separator": "."},
    },
    "nested": {
        "serializer": ShardingCodec(chunk_shape=CHUNK, codecs=[ShardingCodec(chunk_shape=(2, 3))]),
        "chunks": SHARD,
        "compressors": None,
    },
    "plain": {"chunks": CHUNK},
}
SHARDED = [name for name in ARRAYS if name != "plain"]


def _values(seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(1, 1000, SHAPE).astype("uint16")
    data[0:4, 6:12] = 0  # chunk (0, 1), slot 1 of shard (0, 0): empty, not stored
    return data


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("maintenance") / "src"
    group = zarr.open_group(root, mode="w")
    for seed, (name, options) in enumerate(ARRAYS.items()):
        array = group.create_array(name, shape=SHAPE, dtype="uint16", fill_value=0, **options)
        array[:] = _values(seed)
    # Sharded, but in a way shardfs does not take apart: reported as skipped.
    meta = json.loads((root / "end" / "zarr.json").read_text())
    meta["custom"] = {"must_understand": True}
    (root / "weird").mkdir()
    (root / "weird" / "zarr.json").write_text(json.dumps(meta))
    return root


@pytest.fixture
def source(template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the template source for one test."""
    root = tmp_path / "src"
    shutil.copytree(template, root)
    return root


def expected_values() -> dict[str, np.ndarray]:
    return {name: _values(seed) for seed, name in enumerate(ARRAYS)}


def assert_values(root: Path, expected: dict[str, np.ndarray]) -> None:
    """The source, read directly by zarr-python 3 and by tensorstore, holds `expected`."""
    for name, data in expected.items():
        np.testing.assert_array_equal(zarr.open_array(root / name, mode="r")[...], data, name)
        store = ts.open({"driver": "zarr3", "kvstore": f"file://{root}/{name}"}).result()
        np.testing.assert_array_equal(store.read().result(), data, name)


def level_of(root: Path, name: str) -> ShardLevel:
    layout = sharded_layout(json.loads((root / name / "zarr.json").read_text()))
    assert layout is not None
    return layout.levels[0]


def entries_of(data: bytes, level: ShardLevel) -> np.ndarray:
    """The flat index of shard bytes `data`, decoded here, independently of the code under test."""
    at = 0 if level.index_at_start else len(data) - level.index_size
    raw = data[at : at + level.index_size]
    return level.index.decode(raw, level.chunks_per_shard).reshape(-1, 2)


def dead_of(path: Path, level: ShardLevel) -> int:
    data = path.read_bytes()
    sizes = entries_of(data, level)[:, 1]
    return len(data) - level.index_size - int(sizes[sizes != EMPTY].sum())


def store_again(storage: LocalStorage, key: str, level: ShardLevel, changes: dict[int, int]) -> int:
    """Store chunks of shard `key` again, as a mount's commit would: slot -> the slot whose
    current bytes it gets. Returns the bytes this leaves dead. SourceChanged if another
    writer changed the shard meanwhile."""
    stat = storage.stat(key)
    assert stat is not None
    data = storage.read(key, 0, stat.size, stat.version)
    entries = entries_of(data, level)
    chunks = {}
    for slot, origin in changes.items():
        offset, nbytes = (int(v) for v in entries[origin])
        chunks[slot] = data[offset : offset + nbytes]
    freed = sum(int(entries[s, 1]) for s in changes if entries[s, 1] != EMPTY)
    if not level.index_at_start:
        update = append_update(level, entries, stat.size, chunks)
        storage.append(key, update.parts, stat.version)
        return freed + level.index_size
    index, position = entries.copy(), stat.size
    for slot in sorted(chunks):
        index[slot] = (position, len(chunks[slot]))
        position += len(chunks[slot])
    head = level.index.encode(index.reshape((*level.chunks_per_shard, 2)))
    body = data[level.index_size :]
    storage.put(key, [head, body, *(chunks[s] for s in sorted(chunks))], stat.version)
    return freed


def chunk_region(shard: tuple[int, int], slot: int) -> tuple[slice, slice]:
    """The array region of slot `slot` (C order, 2 x 2 per shard) of shard `shard`."""
    row, col = shard[0] * 2 + slot // 2, shard[1] * 2 + slot % 2
    return slice(row * CHUNK[0], (row + 1) * CHUNK[0]), slice(col * CHUNK[1], (col + 1) * CHUNK[1])


def make_mostly_dead(storage: LocalStorage, key: str, level: ShardLevel) -> None:
    """Store every chunk of the shard again, twice: about two thirds of it is then dead."""
    sizes = entries_of((storage.root / key).read_bytes(), level)[:, 1]
    for _ in range(2):
        store_again(storage, key, level, {s: s for s in range(4) if sizes[s] != EMPTY})


# -- finding shards --------------------------------------------------------------------


def test_shards_are_found_under_every_chunk_key_encoding(source: Path) -> None:
    inventory = find_shards(LocalStorage(source))
    assert [a.path for a in inventory.arrays] == sorted(SHARDED)
    for array in inventory.arrays:
        on_disk = sorted(
            os.path.relpath(os.path.join(d, f), source)
            for d, _, files in os.walk(source / array.path)
            for f in files
            if f != "zarr.json"
        )
        assert array.shards == on_disk and len(on_disk) == 4, array.path
    assert [(s.path, s.reason) for s in inventory.skipped] == [
        ("weird", "unknown metadata field 'custom' must be understood")
    ]
    assert inventory.shard_count == 4 * len(SHARDED)


def test_draft_sources_are_not_supported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    entry = {
        "extensions": [],
        "metadata_encoding": DRAFT_FORMAT,
        "metadata_key_suffix": ".json",
        "zarr_format": DRAFT_FORMAT,
    }
    (tmp_path / "zarr.json").write_text(json.dumps(entry))
    assert main(["fsck", str(tmp_path)]) == 0
    assert "skipped /: draft Zarr v3 sources are not supported" in capsys.readouterr().out


# -- fsck --------------------------------------------------------------------------------


def test_fsck_of_a_clean_source(source: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["fsck", str(source)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["array", "shards", "live", "dead", "dead%"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1 : len(SHARDED) + 2]}
    assert sorted(rows) == sorted(["/" + n for n in SHARDED] + ["total"])
    for name, row in rows.items():
        shards = 4 * len(SHARDED) if name == "total" else 4
        assert row[0] == str(shards) and row[-3:] == ["0", "B", "0.0%"], (name, row)
    assert "skipped /weird: unknown metadata field 'custom' must be understood" in lines
    assert lines[-1] == "fsck: no damage"
    assert err == ""  # not a terminal: no progress bar
    assert not (source / ".shardfs").exists()  # checking leaves no trace

    shards = {a.path: a.shards for a in find_shards(LocalStorage(source)).arrays}
    for usage in fsck(LocalStorage(source)).arrays:
        assert usage.size == sum((source / k).stat().st_size for k in shards[usage.path])
        index_size = level_of(source, usage.path).index_size
        assert usage.live == usage.size - 4 * index_size and usage.dead == 0


def test_fsck_counts_dead_bytes_exactly(source: Path, capsys: pytest.CaptureFixture) -> None:
    storage = LocalStorage(source)
    dead = dict.fromkeys(SHARDED, 0)
    dead["end"] += store_again(storage, "end/c/0/0", level_of(source, "end"), {0: 0, 3: 3})
    dead["end"] += store_again(storage, "end/c/1/1", level_of(source, "end"), {2: 2})
    dead["end"] += store_again(storage, "end/c/1/1", level_of(source, "end"), {2: 2})
    dead["start"] += store_again(storage, "start/c/0/1", level_of(source, "start"), {1: 1})
    dead["sub/dots"] += store_again(storage, "sub/dots/1.0", level_of(source, "sub/dots"), {0: 0})
    dead["nested"] += store_again(storage, "nested/c/1/0", level_of(source, "nested"), {3: 3})

    report = fsck(storage)
    assert {a.path: a.dead for a in report.arrays} == dead
    assert report.clean and not report.recovery
    end = next(a for a in report.arrays if a.path == "end")
    assert end.dead_fraction == dead["end"] / end.size

    assert main(["fsck", str(source)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("/end "))
    assert row.split()[1] == "4" and f"{format_size(dead['end'])}  {end.dead_fraction:.1%}" in row
    assert_values(source, expected_values())  # stored again, unchanged


class Crash(BaseException):
    """A writer's death: not an Exception, so no failure path of the writer handles it."""


def test_fsck_rolls_back_a_torn_append(
    source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    storage = LocalStorage(source)
    key, path = "end/c/1/0", source / "end/c/1/0"
    before = path.read_bytes()
    real_write_all = journal.write_all

    def die_in_write(fd: int, views: Sequence[memoryview], offset: int) -> None:
        real_write_all(fd, [memoryview(b"".join(views)[:10])], offset)
        raise Crash

    monkeypatch.setattr(journal, "write_all", die_in_write)
    with pytest.raises(Crash):
        store_again(storage, key, level_of(source, "end"), {0: 0})
    monkeypatch.undo()
    torn = path.read_bytes()
    assert len(torn) == len(before) + 10

    assert main(["fsck", "--dry-run", str(source)]) == 1
    out = capsys.readouterr().out
    name = storage.describe(key)
    assert f"unfinished append in {name}" in out.splitlines()
    damaged = next(line for line in out.splitlines() if line.startswith("DAMAGED"))
    assert damaged.startswith(f"DAMAGED {name}: index checksum (crc32c) does not match")
    assert "unfinished append" in damaged
    assert out.splitlines()[-1] == "fsck: 1 damaged shards, left as they are"
    assert path.read_bytes() == torn  # a dry run changes nothing

    assert main(["fsck", str(source)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        f"repaired {name}: rolled back a torn append (kept {len(before)} of {len(torn)} bytes)"
        in lines
    )
    assert lines[-1] == "fsck: no damage left"
    assert path.read_bytes() == before
    assert storage.pending_recovery() == []
    assert_values(source, expected_values())


def _crc(data: bytearray, level: ShardLevel) -> bytearray:
    """Flip a bit of the index checksum."""
    at = level.index_size - 1 if level.index_at_start else len(data) - 1
    data[at] ^= 0x01
    return data


def _outside(data: bytearray, level: ShardLevel) -> bytearray:
    """Point slot 0 past the end of the shard, with a valid checksum."""
    entries = entries_of(bytes(data), level).copy()
    entries[0] = (len(data) + 100, 5)
    raw = level.index.encode(entries.reshape((*level.chunks_per_shard, 2)))
    at = 0 if level.index_at_start else len(data) - level.index_size
    data[at : at + len(raw)] = raw
    return data


def _short(data: bytearray, level: ShardLevel) -> bytearray:
    return data[:10]


@pytest.mark.parametrize(
    ("name", "key", "damage", "message"),
    [
        ("end", "end/c/0/1", _crc, "index checksum (crc32c) does not match"),
        ("start", "start/c/1/1", _outside, "index entry points outside the shard's data"),
        ("sub/dots", "sub/dots/0.0", _short, "10 bytes cannot hold a 68-byte shard index"),
    ],
)
def test_corrupt_shards_fail_fsck_and_compact_leaves_them_alone(
    source: Path,
    capsys: pytest.CaptureFixture,
    name: str,
    key: str,
    damage: Callable[[bytearray, ShardLevel], bytearray],
    message: str,
) -> None:
    storage = LocalStorage(source)
    level = level_of(source, name)
    make_mostly_dead(storage, key, level)  # compact would rewrite it if it were healthy
    path = source / key
    path.write_bytes(damage(bytearray(path.read_bytes()), level))
    corrupt = path.read_bytes()
    healthy = "end/c/1/1"
    make_mostly_dead(storage, healthy, level_of(source, "end"))

    assert main(["fsck", str(source)]) == 1
    lines = capsys.readouterr().out.splitlines()
    damaged = [line for line in lines if line.startswith("DAMAGED")]
    assert len(damaged) == 1 and damaged[0].startswith(
        f"DAMAGED {storage.describe(key)}: {message}"
    )
    assert lines[-1] == "fsck: 1 damaged shards, left as they are"

    assert main(["compact", str(source), "--threshold", "0", "--min-dead", "0"]) == 1
    lines = capsys.readouterr().out.splitlines()
    corrupt_lines = [line for line in lines if line.startswith("CORRUPT")]
    assert len(corrupt_lines) == 1
    assert corrupt_lines[0].startswith(f"CORRUPT {storage.describe(key)}: {message}")
    assert corrupt_lines[0].endswith("(not rewritten)")
    assert lines[-1] == "compact: 1 corrupt and 0 failed shards left as they are"
    assert path.read_bytes() == corrupt
    assert dead_of(source / healthy, level_of(source, "end")) == 0  # the others are compacted


# -- compact ---------------------------------------------------------------------------

#: Array -> its shard made mostly dead in the compaction tests; and one with a little dead space.
MOSTLY_DEAD = {
    "end": "end/c/0/0",
    "start": "start/c/0/1",
    "sub/dots": "sub/dots/1.1",
    "cdots": "cdots/c.1.0",
    "nested": "nested/c/0/0",
}
LITTLE_DEAD = "end/c/1/1"


def test_compact_rewrites_exactly_the_shards_over_the_threshold(
    source: Path, capsys: pytest.CaptureFixture
) -> None:
    storage = LocalStorage(source)
    for name, key in MOSTLY_DEAD.items():
        make_mostly_dead(storage, key, level_of(source, name))
    store_again(storage, LITTLE_DEAD, level_of(source, "end"), {0: 0})
    shard_files = [source / k for a in find_shards(storage).arrays for k in a.shards]
    before = {f: (f.read_bytes(), f.stat().st_ino) for f in shard_files}

    # With the default --min-dead (64 KiB) these small shards are not worth it.
    assert main(["compact", str(source)]) == 0
    assert {f: (f.read_bytes(), f.stat().st_ino) for f in shard_files} == before
    capsys.readouterr()

    assert main(["compact", str(source), "--min-dead", "0"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # not a terminal: no progress bar
    rewritten = {f for f in shard_files if f.stat().st_ino != before[f][1]}
    assert rewritten == {source / k for k in MOSTLY_DEAD.values()}
    for f in shard_files:
        if f not in rewritten:
            assert f.read_bytes() == before[f][0], f
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    for name, key in MOSTLY_DEAD.items():
        f = source / key
        reclaimed = len(before[f][0]) - f.stat().st_size
        assert reclaimed > 0 and dead_of(f, level_of(source, name)) == 0
        assert rows["/" + name] == ["4", "1", *format_size(reclaimed).split()]
    assert rows["/sub/slashes"] == ["4", "0", "0", "B"]
    assert rows["total"][:2] == [str(4 * len(SHARDED)), str(len(MOSTLY_DEAD))]
    assert_values(source, expected_values())

    # The shard with a little dead space goes too once any dead byte is enough.
    report = compact(storage, Policy(threshold=0, min_dead=0))
    assert [(a.path, a.rewritten) for a in report.arrays if a.rewritten] == [("end", 1)]
    assert all(a.dead == 0 for a in fsck(storage).arrays)
    assert_values(source, expected_values())


def test_compact_keeps_the_index_location(source: Path) -> None:
    storage = LocalStorage(source)
    level = level_of(source, "start")
    make_mostly_dead(storage, "start/c/1/1", level)
    assert compact(storage, Policy(min_dead=0)).ok
    data = (source / "start/c/1/1").read_bytes()
    entries = entries_of(data, level)  # decodes from the start: the checksum holds
    used = entries[entries[:, 1] != EMPTY]
    assert int(used[:, 0].min()) == level.index_size
    assert len(data) == level.index_size + int(used[:, 1].sum())


def test_compact_deletes_a_shard_with_no_chunk_left(source: Path) -> None:
    storage = LocalStorage(source)
    key, level = "end/c/0/0", level_of(source, "end")
    stat = storage.stat(key)
    assert stat is not None
    empty = np.full((*level.chunks_per_shard, 2), EMPTY, dtype=np.uint64)
    storage.append(key, [level.index.encode(empty)], stat.version)  # every chunk deleted
    report = compact(storage, Policy(min_dead=0))
    assert not (source / key).exists()
    end = next(a for a in report.arrays if a.path == "end")
    assert (end.rewritten, end.reclaimed) == (1, stat.size + level.index_size)
    expected = expected_values()
    expected["end"][0:8, 0:12] = 0
    assert_values(source, expected)


class RacingStorage(LocalStorage):
    """Runs `race` in another thread just before the first put, which then finds the shard changed."""

    def __init__(self, root: Path, race: Callable[[], None]) -> None:
        super().__init__(root)
        self.race: Callable[[], None] | None = race
        self.puts = 0

    def put(self, key: str, parts: Sequence[bytes | memoryview], expect: Hashable) -> Stat:
        self.puts += 1
        if self.race is not None:
            thread = threading.Thread(target=self.race)
            self.race = None
            thread.start()
            thread.join()
        return super().put(key, parts, expect)


def test_compact_retries_when_a_writer_appends_meanwhile(source: Path) -> None:
    key, level = "end/c/1/1", level_of(source, "end")
    make_mostly_dead(LocalStorage(source), key, level)

    def append_elsewhere() -> None:  # another writer: chunk 0 gets the bytes of chunk 3
        store_again(LocalStorage(source), key, level, {0: 3})

    storage = RacingStorage(source, append_elsewhere)
    report = compact(storage, Policy(min_dead=0))
    assert storage.puts == 2  # refused once, done again from the new version
    assert report.ok and not report.busy
    assert [(a.path, a.rewritten) for a in report.arrays if a.rewritten] == [("end", 1)]
    assert dead_of(source / key, level) == 0
    expected = expected_values()
    end = expected["end"]
    end[chunk_region((1, 1), 0)] = end[chunk_region((1, 1), 3)]
    assert_values(source, expected)


def test_compact_gives_up_on_a_shard_that_keeps_changing(
    source: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, level = "end/c/1/1", level_of(source, "end")
    make_mostly_dead(LocalStorage(source), key, level)

    def refuse(self: LocalStorage, key: str, parts: object, expect: Hashable) -> Stat:
        raise SourceChanged(f"{key} changed")

    monkeypatch.setattr(LocalStorage, "put", refuse)
    assert main(["compact", str(source), "--min-dead", "0"]) == 0
    name = LocalStorage(source).describe(key)
    assert f"left for later: {name} kept changing; not compacted" in capsys.readouterr().out


def test_compact_loses_nothing_while_a_writer_keeps_appending(source: Path) -> None:
    key, level = "end/c/1/1", level_of(source, "end")
    storage = LocalStorage(source)
    origin = [0, 1, 2, 3]  # the slot whose original bytes each slot holds
    done = threading.Event()

    def writer() -> None:
        own = LocalStorage(source)
        try:
            for step in range(30):
                slot, other = step % 4, (step + 1) % 4
                while True:
                    try:
                        store_again(own, key, level, {slot: other})
                        break
                    except SourceChanged:
                        continue  # compacted meanwhile: store it again on the new version
                origin[slot] = origin[other]
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    rewritten = 0
    while not done.is_set():
        report = compact(storage, Policy(threshold=0, min_dead=0))
        assert report.ok
        rewritten += sum(a.rewritten for a in report.arrays)
    thread.join()
    compact(storage, Policy(threshold=0, min_dead=0))
    assert rewritten > 0
    assert all(a.dead == 0 for a in fsck(storage).arrays)
    expected = expected_values()
    original = expected["end"].copy()
    for slot in range(4):
        expected["end"][chunk_region((1, 1), slot)] = original[chunk_region((1, 1), origin[slot])]
    assert_values(source, expected)


# -- command line and progress -----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fsck", "{missing}"], "does not exist"),
        (["compact", "{missing}"], "does not exist"),
        (["fsck", "{empty}"], "not a Zarr v3 hierarchy"),
        (["compact", "{source}", "--threshold", "1"], "threshold 1.0 is not a fraction in [0, 1)"),
        (["compact", "{source}", "--threshold", "-0.1"], "threshold -0.1 is not a fraction"),
        (["compact", "{source}", "--min-dead", "12Q"], "bad size '12Q'"),
    ],
)
def test_usage_errors_exit_2(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    paths = {"missing": tmp_path / "missing", "empty": tmp_path, "source": source}
    assert main([a.format(**paths) for a in args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("shardfs: ") and message in err


def test_argparse_errors_exit_2(source: Path, capsys: pytest.CaptureFixture) -> None:
    for args in (["compact", str(source), "--threshold", "half"], ["fsck"], ["fsck", "--bogus"]):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
    capsys.readouterr()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("command", ["fsck", "compact", "info"])
def test_progress_on_a_terminal_counts_the_walk_then_the_shards(
    source: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The bar starts with the listing walk, as a count of the shards found so far, and
    becomes a bar of their total once the walk is done."""
    stream = FakeTerminal()
    storage = LocalStorage(source)
    with progress_bar(command, "shards", stream, mininterval=0) as bar:
        counts: list[int] = []
        listed = storage.list
        monkeypatch.setattr(storage, "list", lambda key: counts.append(bar.n) or listed(key))
        if command == "info":
            survey(storage, bar)
        else:
            {"fsck": fsck, "compact": compact}[command](storage, progress=bar)
    total = 4 * len(SHARDED)
    assert 0 < max(counts) < total, counts  # the walk counts the shards it finds
    frames = [frame.strip() for frame in stream.getvalue().split("\r") if frame.strip()]
    walk = [f for f in frames if "listing" in f]
    assert walk and all(f"/{total}" not in f for f in walk), frames
    assert frames.index(walk[-1]) < frames.index(next(f for f in frames if f"/{total}" in f))
    assert f"{total}/{total}" in frames[-1], frames


@pytest.mark.parametrize(
    "args", [["fsck"], ["fsck", "--dry-run"], ["compact"], ["info"], ["checksum"]]
)
def test_progress_is_off_outside_a_terminal(source: Path, args: list[str]) -> None:
    """A pipe (or a log) gets no bar at all: no carriage returns, nothing on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "shardfs", *args, str(source)], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout, done.stderr
    assert done.stderr == ""
