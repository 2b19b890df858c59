"""Neuroglancer precomputed volumes written sharded by tensorstore, read through a real mount
as unsharded precomputed by tensorstore.

tensorstore's `neuroglancer_precomputed` driver is an independent writer of
`neuroglancer_uint64_sharded_v1`: both hashes, raw and gzip minishard indexes and data,
`raw` and `compressed_segmentation` chunks, several data types, a negative
`voxel_offset` and sizes that are not multiples of the chunk size. Each scale is also
written unsharded by tensorstore, so the mount's chunk files are compared, name by name
and byte by byte, with what that writer makes of the same data.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts

from shardfs.cli import main
from shardfs.formats.precomputed import Sharding
from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import StorageError
from shardfs.storage import LocalStorage
from shardfs.view import Role
from shardfs.view import precomputed as precomputed_view
from shardfs.view.precomputed import PrecomputedNamespace
from tests.conftest import Mounted
from tests.support.backends import Source

pytestmark = pytest.mark.fuse

Region = tuple[slice, ...]


def sharding(
    hash: str, minishard_bits: int, shard_bits: int, index: str, data: str, preshift: int = 0
) -> dict[str, Any]:
    return {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": preshift,
        "hash": hash,
        "minishard_bits": minishard_bits,
        "shard_bits": shard_bits,
        "minishard_index_encoding": index,
        "data_encoding": data,
    }


@dataclass(frozen=True)
class ScaleCase:
    key: str
    size: tuple[int, int, int]
    chunk: tuple[int, int, int]
    sharding: dict[str, Any] | None
    offset: tuple[int, int, int] = (0, 0, 0)
    encoding: str = "raw"
    #: where values are written (in voxels from the offset); chunks outside stay absent
    region: Region = (slice(None),) * 3

    def metadata(self, sharded: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "key": self.key,
            "size": list(self.size),
            "voxel_offset": list(self.offset),
            "chunk_size": list(self.chunk),
            "resolution": [len(self.key), 1, 1],
            "encoding": self.encoding,
        }
        if self.encoding == "compressed_segmentation":
            meta["compressed_segmentation_block_size"] = [4, 4, 2]
        if sharded and self.sharding is not None:
            meta["sharding"] = self.sharding
        return meta

    def chunk_names(self, region: Region | None = None) -> set[str]:
        """The chunks `region` (default: the written one) touches, named as the precomputed
        format names them: voxel boxes including the offset, clipped at the size."""
        axes = []
        parts = self.region if region is None else region
        for n, c, o, part in zip(self.size, self.chunk, self.offset, parts, strict=True):
            lo, hi, _ = part.indices(n)
            boxes = [(o + b, o + min(b + c, n)) for b in range(0, n, c) if b < hi and b + c > lo]
            axes.append([f"{begin}-{end}" for begin, end in boxes])
        return {"_".join(parts) for parts in itertools.product(*axes)}


@dataclass(frozen=True)
class VolumeCase:
    name: str
    dtype: str
    scales: tuple[ScaleCase, ...]
    channels: int = 1
    kind: str = "image"
    expected: list[np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        arrays = []
        for scale in self.scales:
            shape = (*scale.size, self.channels)
            info = np.iinfo(self.dtype)
            # Few labels per volume, as segmentations have, and the full range of the type.
            labels = rng.integers(info.min, info.max, 40, dtype=self.dtype, endpoint=True)
            values = labels[rng.integers(0, len(labels), shape)]
            out = np.zeros(shape, dtype=self.dtype)
            out[scale.region] = values[scale.region]
            arrays.append(out)
        object.__setattr__(self, "expected", arrays)

    def write(self, kvstore: dict[str, Any], sharded: bool) -> None:
        for scale, values in zip(self.scales, self.expected, strict=True):
            store = ts.open(
                {
                    "driver": "neuroglancer_precomputed",
                    "kvstore": kvstore,
                    "multiscale_metadata": {
                        "type": self.kind,
                        "data_type": self.dtype,
                        "num_channels": self.channels,
                    },
                    "scale_metadata": scale.metadata(sharded),
                    "create": True,
                    "open": True,
                }
            ).result()
            store = store.translate_to[0]
            store[scale.region] = values[scale.region]


#: One volume holding every kind of sharded scale, plus an unsharded one.
MAIN = VolumeCase(
    "main",
    "uint64",
    (
        # identity hash, raw everything, a negative offset, partly written
        ScaleCase(
            "s0",
            (70, 45, 23),
            (16, 16, 8),
            sharding("identity", 2, 2, "raw", "raw"),
            offset=(-5, 10, 3),
            region=(slice(0, 40), slice(5, 45), slice(None)),
        ),
        # murmurhash3 with a preshift, gzip everything
        ScaleCase(
            "s1", (35, 23, 12), (8, 8, 8), sharding("murmurhash3_x86_128", 1, 3, "gzip", "gzip", 1)
        ),
        # compressed_segmentation: the file size is in the gzip trailer
        ScaleCase(
            "s2",
            (18, 12, 6),
            (8, 8, 4),
            sharding("murmurhash3_x86_128", 2, 1, "raw", "gzip"),
            offset=(7, 0, 2),
            encoding="compressed_segmentation",
            region=(slice(3, 18), slice(None), slice(None)),
        ),
        ScaleCase(
            "s3",
            (18, 12, 6),
            (8, 8, 4),
            sharding("identity", 0, 0, "gzip", "raw"),
            encoding="compressed_segmentation",
        ),
        ScaleCase("s4", (9, 6, 3), (4, 4, 2), None),  # unsharded: passes through
    ),
    kind="segmentation",
)
SHARDED_KEYS = ["s0", "s1", "s2", "s3"]

#: The other data types, one volume each.
TYPED = [
    VolumeCase(
        "u8",
        "uint8",
        (ScaleCase("a", (20, 17, 9), (8, 8, 4), sharding("identity", 1, 1, "raw", "gzip")),),
        channels=3,
    ),
    VolumeCase(
        "u16",
        "uint16",
        (
            ScaleCase(
                "b",
                (33, 9, 5),
                (16, 4, 4),
                sharding("murmurhash3_x86_128", 0, 2, "gzip", "raw"),
                offset=(1, 2, 3),
            ),
        ),
    ),
    VolumeCase(
        "u32",
        "uint32",
        (
            ScaleCase(
                "c",
                (21, 21, 7),
                (8, 8, 8),
                sharding("murmurhash3_x86_128", 3, 0, "gzip", "gzip"),
                encoding="compressed_segmentation",
                region=(slice(0, 9), slice(None), slice(0, 3)),
            ),
        ),
        kind="segmentation",
    ),
]


def local(path: Path) -> dict[str, Any]:
    return {"driver": "file", "path": f"{path}/"}


@dataclass
class Written:
    """A volume written sharded at `source` and unsharded at `reference`."""

    case: VolumeCase
    source: Path
    reference: Path


def write_both(case: VolumeCase, root: Path) -> Written:
    written = Written(case, root / "src", root / "ref")
    case.write(local(written.source), sharded=True)
    case.write(local(written.reference), sharded=False)
    return written


@pytest.fixture(scope="module")
def main_volume(tmp_path_factory: pytest.TempPathFactory) -> Written:
    written = write_both(MAIN, tmp_path_factory.mktemp("precomputed"))
    # Segment-keyed data named in info, and a stray file: both pass through.
    info_path = written.source / "info"
    info = json.loads(info_path.read_text())
    info["mesh"] = "mesh"
    info_path.write_text(json.dumps(info))
    (written.source / "mesh").mkdir()
    (written.source / "mesh" / "info").write_text('{"@type": "neuroglancer_multilod_draco"}')
    (written.source / "mesh" / "0.shard").write_bytes(os.urandom(300))
    (written.source / "provenance").write_text('{"owners": []}')
    return written


def read_scale(mountpoint: Path, index: int) -> np.ndarray:
    """Scale `index` read through the mount as unsharded precomputed, origin at 0."""
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": local(mountpoint),
            "scale_index": index,
            "open": True,
        }
    ).result()
    assert store.spec().to_json()["scale_metadata"].get("sharding") is None
    return store.translate_to[0].read().result()


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def error_lines(mounted: Mounted) -> list[str]:
    return [line for line in mounted.log().splitlines() if " ERROR " in line]


# -- reading ---------------------------------------------------------------------------------


def test_tensorstore_reads_every_scale(main_volume: Written, mount) -> None:
    mounted: Mounted = mount(main_volume.source)
    for index, expected in enumerate(MAIN.expected):
        np.testing.assert_array_equal(
            read_scale(mounted.path, index), expected, MAIN.scales[index].key
        )
    assert "mounted read-only" in mounted.log()
    assert not error_lines(mounted), mounted.log()
    done = subprocess.run(
        [sys.executable, "-m", "shardfs", "stats", str(mounted.path), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    figures = json.loads(done.stdout)
    assert figures["source"]["requests"]["read"] > 0 and figures["source"]["bytes_read"] > 0
    assert figures["caches"]["shard indexes"]["misses"] > 0
    assert "read-ahead" in figures["caches"] and figures["fuse"]["requests"]["read"] > 0


def test_chunk_files_are_what_an_unsharded_writer_makes(main_volume: Written, mount) -> None:
    """Same names, same bytes, exact sizes; chunks absent from the shards have no file."""
    mounted: Mounted = mount(main_volume.source, "ro")
    for scale in MAIN.scales:
        view = mounted.path / scale.key
        expected = files(main_volume.reference / scale.key)
        assert set(expected) == scale.chunk_names(), scale.key
        listing = {entry.name: entry.stat().st_size for entry in os.scandir(view)}
        assert listing == {name: len(data) for name, data in expected.items()}, scale.key
        for name, data in expected.items():
            assert (view / name).read_bytes() == data, f"{scale.key}/{name}"
            assert (view / name).stat().st_size == len(data)


def test_info_is_rewritten_without_sharding(main_volume: Written, mount) -> None:
    mounted: Mounted = mount(main_volume.source, "ro")
    source = json.loads((main_volume.source / "info").read_text())
    shown = json.loads((mounted.path / "info").read_bytes())
    assert all("sharding" not in scale for scale in shown["scales"])
    for scale in source["scales"]:
        scale.pop("sharding", None)
    assert shown == source
    assert (mounted.path / "info").stat().st_size == len((mounted.path / "info").read_bytes())


def test_everything_else_passes_through(main_volume: Written, mount) -> None:
    mounted: Mounted = mount(main_volume.source, "ro")
    assert sorted(os.listdir(mounted.path)) == sorted(os.listdir(main_volume.source))
    for path in ["provenance", "mesh/info", "mesh/0.shard"]:
        assert (mounted.path / path).read_bytes() == (main_volume.source / path).read_bytes()
    unsharded = main_volume.source / "s4"
    assert files(mounted.path / "s4") == files(unsharded) != {}
    # In a sharded scale, shards are hidden and only canonical chunk names resolve.
    s0 = mounted.path / "s0"
    assert (main_volume.source / "s0" / "0.shard").exists()
    assert (s0 / "-5-11_10-26_3-11").read_bytes()
    mangled = ["-5-11_010-26_3-11", "-5-11_+10-26_3-11", "-5-11.10-26.3-11", "-5-11_10-26_3-11.gz"]
    for missing in ["0.shard", "-5-10_10-26_3-11", *mangled]:
        with pytest.raises(FileNotFoundError):
            (s0 / missing).stat()
    scale = MAIN.scales[0]
    absent = scale.chunk_names((slice(None),) * 3) - scale.chunk_names()
    assert absent  # chunks of the grid that were never written have no file
    for missing in absent:
        with pytest.raises(FileNotFoundError):
            (s0 / missing).read_bytes()


def test_writes_are_refused(main_volume: Written, mount) -> None:
    mounted: Mounted = mount(main_volume.source)
    chunk = mounted.path / "s1" / sorted(MAIN.scales[1].chunk_names())[0]
    attempts = [
        lambda: os.open(chunk, os.O_WRONLY),
        lambda: os.open(mounted.path / "info", os.O_RDWR),
        lambda: os.open(mounted.path / "s1" / "new", os.O_WRONLY | os.O_CREAT, 0o644),
        lambda: os.truncate(chunk, 0),
        lambda: os.unlink(chunk),
        lambda: os.mkdir(mounted.path / "s1" / "d"),
        lambda: os.rename(chunk, mounted.path / "s1" / "moved"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as error:
            attempt()
        assert error.value.errno == errno.EROFS
    assert chunk.read_bytes()  # still there


@pytest.mark.parametrize("case", TYPED, ids=lambda c: c.name)
def test_data_types(case: VolumeCase, tmp_path: Path, mount) -> None:
    written = write_both(case, tmp_path)
    mounted: Mounted = mount(written.source, "ro")
    np.testing.assert_array_equal(read_scale(mounted.path, 0), case.expected[0])
    key = case.scales[0].key
    assert files(mounted.path / key) == files(written.reference / key)


def test_on_both_backends(src: Source, mount) -> None:
    """tensorstore writes straight into the source (a directory or a bucket)."""
    case = TYPED[2]
    case.write(src.kvstore(), sharded=True)
    mounted: Mounted = mount(src.url, *src.options, "ro")
    np.testing.assert_array_equal(read_scale(mounted.path, 0), case.expected[0])
    names = os.listdir(mounted.path / "c")
    assert set(names) == case.scales[0].chunk_names()
    for name in names:  # sizes from gzip trailers, read in merged ranges on S3
        path = mounted.path / "c" / name
        assert path.stat().st_size == len(path.read_bytes())
    assert not error_lines(mounted), mounted.log()


# -- corrupt shards --------------------------------------------------------------------------


def copy(written: Written, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(written.source, target)
    return target


def test_corrupt_shard_index_gives_eio_and_one_log_line(
    main_volume: Written, tmp_path: Path, mount
) -> None:
    source = copy(main_volume, tmp_path)
    shard = source / "s0" / "1.shard"
    data = bytearray(shard.read_bytes())
    data[8:16] = (len(data) * 2).to_bytes(8, "little")  # minishard 0 ends past the shard
    shard.write_bytes(bytes(data))
    mounted: Mounted = mount(source, "ro")
    view = mounted.path / "s0"
    failed, read = [], []
    for name, expected in files(main_volume.reference / "s0").items():
        try:
            assert (view / name).read_bytes() == expected
            read.append(name)
        except OSError as e:
            assert e.errno == errno.EIO
            failed.append(name)
    assert failed and read  # the chunks of the corrupt shard, and of the others
    with pytest.raises(OSError) as error:
        os.listdir(view)
    assert error.value.errno == errno.EIO
    lines = error_lines(mounted)
    assert len(lines) == 1 and str(shard) in lines[0], mounted.log()
    assert mounted.process.poll() is None  # still serving
    assert (mounted.path / "info").read_bytes()


def test_corrupt_chunk_data_gives_eio(main_volume: Written, tmp_path: Path, mount) -> None:
    source = copy(main_volume, tmp_path)
    scale = MAIN.scales[1]  # gzip data
    spec = Sharding.from_json(scale.sharding)
    shard = sorted((source / scale.key).iterdir())[0]
    data = bytearray(shard.read_bytes())
    index = spec.decode_shard_index(bytes(data[: spec.index_size]), len(data))
    # The first chunk follows the fixed index: flip a byte inside its deflate stream.
    assert min(start for start, end in index.tolist() if end > start) > spec.index_size + 20
    data[spec.index_size + 12] ^= 0xFF
    shard.write_bytes(bytes(data))
    mounted: Mounted = mount(source, "ro")
    view = mounted.path / scale.key
    failed = []
    for name in os.listdir(view):
        try:
            (view / name).read_bytes()
        except OSError as e:
            assert e.errno == errno.EIO
            failed.append(name)
    assert len(failed) == 1
    lines = error_lines(mounted)
    assert len(lines) == 1 and failed[0] in lines[0] and str(shard) in lines[0], mounted.log()


def hostile_info(scales: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An info of uint8 raw scales of chunks of one voxel, identity hash, no preshift."""
    docs = []
    for key, fields in scales.items():
        sharding_fields = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0}
        sharding_fields |= {"hash": "identity", "shard_bits": 0, "data_encoding": "raw"}
        docs.append(
            {
                "key": key,
                "size": fields["size"],
                "voxel_offset": [0, 0, 0],
                "chunk_sizes": [[1, 1, 1]],
                "resolution": [1, 1, 1],
                "encoding": "raw",
                "sharding": sharding_fields
                | {
                    "minishard_bits": fields["minishard_bits"],
                    "minishard_index_encoding": fields["index"],
                },
            }
        )
    return {
        "@type": "neuroglancer_multiscale_volume",
        "type": "image",
        "data_type": "uint8",
        "num_channels": 1,
        "scales": docs,
    }


def write_shard(
    path: Path, minishard_bits: int, entry: tuple[int, int], body: bytes, at: int = 0
) -> None:
    """A shard whose fixed index has one entry, for minishard 0 (`entry`, relative to the end
    of the fixed index), the others empty; `body` written `at` bytes after the fixed index.
    What lies between is a hole: a big fixed index costs no disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(np.asarray(entry, dtype="<u8").tobytes())
        f.seek((16 << minishard_bits) + at)
        f.write(body)


def gzip_of_zeros(n: int) -> bytes:
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(4 << 20)
    out = [stream.compress(piece[: min(len(piece), n - i)]) for i in range(0, n, len(piece))]
    return b"".join([*out, stream.flush()])


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) >> 10
    return fields


def bytes_read(pid: int) -> int:
    """What a process has read so far (`rchar`: every read call, page cache or not)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.fixture(scope="module")
def hostile_volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sharded scales, each within the sharding spec's fields, handcrafted:
    - `bomb`: 2^60 chunks; its one minishard's gzip index (700 KiB) inflates to 384 MiB;
    - `claims`: its raw minishard index claims 512 MiB of a sparse shard;
    - `sparse`: 2^24 minishards: a fixed index of 256 MiB, a hole but for one entry,
      locating one chunk (id 0, the byte 7)."""
    source = tmp_path_factory.mktemp("hostile")
    scales = {
        "bomb": {"size": [1 << 20] * 3, "minishard_bits": 0, "index": "gzip"},
        "claims": {"size": [1 << 20] * 3, "minishard_bits": 0, "index": "raw"},
        "sparse": {"size": [64, 64, 64], "minishard_bits": 24, "index": "raw"},
    }
    (source / "info").write_text(json.dumps(hostile_info(scales)))
    bomb = gzip_of_zeros(384 << 20)
    write_shard(source / "bomb" / "0.shard", 0, (0, len(bomb)), bomb)
    write_shard(source / "claims" / "0.shard", 0, (0, 512 << 20), b"\0", at=(512 << 20) - 1)
    index = np.asarray([0, 24, 1], dtype="<u8").tobytes()  # id 0, after the index, 1 byte
    write_shard(source / "sparse" / "0.shard", 24, (0, 24), index + b"\x07")
    return source


@pytest.mark.fuse
def test_minishard_index_bombs_give_eio_and_leave_the_daemon_small(
    hostile_volume: Path, mount
) -> None:
    """A gzip minishard index bomb and a raw minishard index claiming 512 MiB give EIO and
    one log line each, and leave the daemon small, its peak too: the bomb is inflated no
    further than its bound, the claim is not read, and the cached errors hold nothing of
    what was decoded."""
    mounted: Mounted = mount(hostile_volume, "ro")
    for key in ("bomb", "claims"):
        for _ in range(2):  # the second is answered by the cached error
            with pytest.raises(OSError) as error:
                os.stat(mounted.path / key / "0-1_0-1_0-1")
            assert error.value.errno == errno.EIO
    memory = status(mounted.process.pid)
    assert memory["VmHWM"] < 300 and memory["VmRSS"] < 300, memory
    lines = error_lines(mounted)
    assert len(lines) == 2, lines
    assert "bomb/0.shard" in lines[0] and "decompresses to more than" in lines[0], lines
    assert "claims/0.shard" in lines[1] and "bytes stored, beyond" in lines[1], lines
    assert mounted.process.poll() is None


@pytest.mark.fuse
def test_a_lookup_reads_one_entry_of_a_big_fixed_index(hostile_volume: Path, mount) -> None:
    """In a shard with a 256 MiB fixed index, a lookup reads its one entry, not the index,
    even for a chunk that is not there; a listing reads the index a piece at a time."""
    mounted: Mounted = mount(hostile_volume, "ro")
    pid = mounted.process.pid
    before = bytes_read(pid)
    for name in ("1-2_0-1_0-1", "0-1_1-2_0-1", "5-6_7-8_9-10"):
        assert not (mounted.path / "sparse" / name).exists()
    assert (mounted.path / "sparse" / "0-1_0-1_0-1").read_bytes() == b"\x07"
    assert bytes_read(pid) - before < 1 << 20
    assert os.listdir(mounted.path / "sparse") == ["0-1_0-1_0-1"]
    assert status(pid)["VmHWM"] < 300, status(pid)
    assert not error_lines(mounted)


# -- the view without FUSE -------------------------------------------------------------------


def test_small_index_cache_and_nonblocking_calls(main_volume: Written) -> None:
    """Every call either answers in non-blocking mode or asks for a thread (WouldBlock),
    and the answers hold while a tiny cache keeps evicting indexes."""
    namespace = PrecomputedNamespace(LocalStorage(main_volume.source), index_cache=4096)

    def call(fn: Any, *args: Any) -> Any:
        try:
            with nonblocking():
                return fn(*args)
        except WouldBlock:
            return fn(*args)

    for scale in MAIN.scales[:4]:
        directory = call(namespace.resolve, scale.key)
        listing = call(namespace.listdir, directory)
        expected = files(main_volume.reference / scale.key)
        assert [name for name, _, _ in listing] == sorted(expected)
        for name, node, attr in listing:
            assert call(namespace.lookup, directory, name) == node
            assert call(namespace.attr, node) == attr
            reader = call(namespace.open, node)
            assert call(reader.read, 0, attr.size + 10) == expected[name]
    assert namespace.indexes.used <= 4096
    assert namespace.indexes.stats.evictions > 0


class CountingStorage(LocalStorage):
    """A local source that counts reads, and may claim costly requests like S3's."""

    def __init__(self, root: Path, request_cost: int) -> None:
        super().__init__(root)
        self.request_cost = request_cost
        self.reads = 0

    def read(self, key: str, offset: int, length: int, version: Any = None) -> bytes:
        self.reads += 1
        return super().read(key, offset, length, version)


def test_gzip_trailers_are_read_together_where_requests_cost(main_volume: Written) -> None:
    listings, reads = [], []
    for cost in (0, 1 << 20):
        storage = CountingStorage(main_volume.source, cost)
        namespace = PrecomputedNamespace(storage)
        listing = namespace.listdir(namespace.resolve("s2"))
        listings.append([(name, attr.size) for name, _, attr in listing])
        reads.append(storage.reads)
    expected = files(main_volume.reference / "s2")
    assert listings[0] == listings[1] == [(n, len(expected[n])) for n in sorted(expected)]
    chunks = len(expected)
    assert reads[0] - reads[1] == chunks - len(list((main_volume.source / "s2").iterdir()))


class RecordingStorage(LocalStorage):
    """A local source that records every read: (key, offset, length)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int, int]] = []

    def read(self, key: str, offset: int, length: int, version: Any = None) -> bytes:
        self.reads.append((key, offset, length))
        return super().read(key, offset, length, version)


def test_fixed_indexes_read_an_entry_at_a_time_show_the_same(
    main_volume: Written, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no fixed index small enough to be read whole, a lookup reads its one entry (16
    bytes) and a listing pieces of entries (here 2 at a time): the same listings, sizes and
    bytes as reading each index whole; and a walker finds the same next minishards (within
    the piece's worth of minishards it looks ahead)."""
    whole = PrecomputedNamespace(LocalStorage(main_volume.source))
    monkeypatch.setattr(precomputed_view, "INDEX_PIECE", 2)
    storage = RecordingStorage(main_volume.source)
    namespace = PrecomputedNamespace(storage)
    namespace.whole_index = 0
    for scale in MAIN.scales[:4]:
        spec = Sharding.from_json(scale.sharding)
        expected = files(main_volume.reference / scale.key)
        directory = namespace.resolve(scale.key)
        for name in sorted(expected):  # lookups before any listing: single entries
            node = namespace.lookup(directory, name)
            assert namespace.open(node).read(0, 1 << 20) == expected[name]
        listing = namespace.listdir(directory)
        assert listing == whole.listdir(whole.resolve(scale.key))
        assert [name for name, _, _ in listing] == sorted(expected)
        index_reads = {
            length
            for key, offset, length in storage.reads
            if key.endswith(".shard") and offset < spec.index_size
        }
        assert index_reads <= {16, 32}, (scale.key, index_reads)
        storage.reads.clear()
    monkeypatch.setattr(precomputed_view, "INDEX_PIECE", 4)  # s0's 4 minishards a shard
    namespace = PrecomputedNamespace(LocalStorage(main_volume.source))
    namespace.whole_index = 0
    scale = MAIN.scales[0]
    for name in scale.chunk_names():  # where a walker of each minishard goes next
        chunk = namespace._target(namespace.volume(), f"{scale.key}/{name}")
        reference = whole._target(whole.volume(), f"{scale.key}/{name}")
        assert isinstance(chunk, precomputed_view._Chunk)
        assert isinstance(reference, precomputed_view._Chunk)
        for n in (1, 2, 3):
            ahead, walked = namespace.next_run(chunk.run, n), whole.next_run(reference.run, n)
            assert (ahead and (ahead[0], ahead[1].shard, ahead[1].part)) == (
                walked and (walked[0], walked[1].shard, walked[1].part)
            ), (name, n)


def test_changes_behind_the_view(main_volume: Written, tmp_path: Path) -> None:
    """An open chunk reads the shard it was opened on, also once that shard is renamed
    over or removed, and fails once its shard is changed in place; a changed info is
    followed, and an invalid one shows the source as is."""
    source = copy(main_volume, tmp_path)
    namespace = PrecomputedNamespace(LocalStorage(source))
    name = sorted(MAIN.scales[1].chunk_names())[0]
    expected = (main_volume.reference / "s1" / name).read_bytes()
    shards = sorted((source / "s1").iterdir())
    reader = namespace.open(namespace.resolve(f"s1/{name}"))
    for shard in shards:  # the same bytes, as new versions
        replacement = shard.with_name("new")
        shutil.copyfile(shard, replacement)
        replacement.replace(shard)
    assert reader.read(0, len(expected)) == expected
    reader = namespace.open(namespace.resolve(f"s1/{name}"))
    for shard in shards:
        shard.unlink()
    assert reader.read(0, len(expected)) == expected
    for shard in shards:
        shutil.copyfile(main_volume.source / "s1" / shard.name, shard)
    reader = namespace.open(namespace.resolve(f"s1/{name}"))
    for shard in shards:  # the same bytes again, but written in place: nothing proves it
        shard.write_bytes(shard.read_bytes())
    with pytest.raises(StorageError, match="rewritten while"):
        reader.read(0, len(expected))

    info = json.loads((source / "info").read_text())
    del info["scales"][0]["sharding"]
    (source / "info").write_text(json.dumps(info))
    listing = namespace.listdir(namespace.resolve("s0"))
    assert {entry: node.role for entry, node, _ in listing}["0.shard"] is Role.FILE
    (source / "info").write_text('{"@type": "neuroglancer_multiscale_volume"}')
    listing = namespace.listdir(namespace.resolve(""))
    assert {entry: node.role for entry, node, _ in listing}["info"] is Role.FILE
    assert namespace.open(namespace.resolve("info")).read(0, 100) == (source / "info").read_bytes()


# -- the command line ------------------------------------------------------------------------


def test_command_line(
    main_volume: Written, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mountpoint = tmp_path / "mp"
    mountpoint.mkdir()
    command = [sys.executable, "-m", "shardfs", "mount", str(main_volume.source), str(mountpoint)]
    result = subprocess.run(
        [*command, "-f", "-o", "rw"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "Neuroglancer precomputed source: it cannot be written" in result.stderr
    assert not os.listdir(mountpoint)
    for name in ("fsck", "compact"):
        assert main([name, str(main_volume.source)]) == 2
        assert "precomputed volume" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "info").write_text('{"@type": "neuroglancer_multiscale_volume", "scales": 3}')
    assert main(["fsck", str(broken)]) == 2
    assert "not a valid precomputed volume" in capsys.readouterr().err
