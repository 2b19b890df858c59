"""DANDI zarr checksums: the published vectors, and cross-checks with the `zarr_checksum` package
(the reference DANDI runs) on a local source and on S3 as stored, through a mount, and on an
unsharded copy; `--tree`, `--json`; the `user.md5` extended attribute of a mount."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import json
import os
import random
import shutil
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr_checksum import compute_zarr_checksum
from zarr_checksum.generators import (
    S3ClientOptions,
    ZarrArchiveFile,
    yield_files_local,
    yield_files_s3,
)

from shardfs.checksum import (
    EMPTY_CHECKSUM,
    Digest,
    DirectoryChecksum,
    Fold,
    hashing,
    stored_checksum,
    virtual,
)
from shardfs.checksum.digests import ChunkDigests
from shardfs.cli import main
from shardfs.maintenance import progress_bar
from shardfs.primitives.errors import SourceChanged
from shardfs.storage import LocalStorage
from shardfs.view import Namespace, View
from tests.mounts import test_mount_draft as draft_arrays
from tests.mounts.test_mount_v2_view import EXTRA, add_v2_chains
from tests.mounts.test_mount_zarr_python import build
from tests.support.backends import Source
from tests.support.s3 import S3Env
from tests.support.zarr2 import Zarr2

pytestmark = pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")

#: The published vectors: file N holds "This is the <ordinal> file.\n".
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]
EIGHT = dict(
    zip(
        [
            "file1.txt",
            "file2.txt",
            "sub1/file3.txt",
            "sub1/file4.txt",
            "sub1/file5.txt",
            "sub1/subsub/file6.txt",
            "sub2/file7.txt",
            "sub2/file8.txt",
        ],
        [f"This is the {ordinal} file.\n".encode() for ordinal in ORDINALS],
        strict=True,
    )
)
EIGHT_ROOT = "25627e0fc7c609d10100d020f7782a25-8--197"
EIGHT_SUB1 = "64af93ad7f8d471c00044d1ddbd4c0ba-4--97"
TWO = {"a/b": b"x", "c": b"y"}
TWO_ROOT = "26054e501f570a8bfa69a2bc75e7c82d-2--2"


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def reference(path: Path | str) -> str:
    """What the `zarr_checksum` package says of a local tree (a source, a copy or a mount)."""
    return str(compute_zarr_checksum(yield_files_local(path)))


def shardfs(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `shardfs checksum ARGS` in-process; its stdout (it must succeed)."""
    capsys.readouterr()
    assert main(["checksum", *args]) == 0
    return capsys.readouterr().out.strip()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# -- the algorithm --------------------------------------------------------------------


def test_published_vectors() -> None:
    two = Fold()
    for path, data in TWO.items():
        two.add(path, md5(data), len(data))
    assert str(two.finish()) == TWO_ROOT
    closed: list[DirectoryChecksum] = []
    eight = Fold(closed.append)
    for path, data in EIGHT.items():
        eight.add(path, md5(data), len(data))
    assert str(eight.finish()) == EIGHT_ROOT
    digests = {d.path: str(d.digest) for d in closed}
    assert digests["sub1"] == EIGHT_SUB1
    assert digests[""] == EIGHT_ROOT
    assert list(digests)[-1] == "", "the root comes last"
    assert str(Fold().finish()) == EMPTY_CHECKSUM
    assert Digest.parse(EIGHT_ROOT) == Digest("25627e0fc7c609d10100d020f7782a25", 8, 197)


def test_published_vectors_of_local_trees(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    eight = write_files(tmp_path / "eight", EIGHT)
    (eight / "empty").mkdir()  # ignored: no files below it
    (eight / "sub2" / "empty_too" / "deeper").mkdir(parents=True)
    assert shardfs(capsys, str(eight)) == EIGHT_ROOT == reference(eight)
    assert shardfs(capsys, str(eight / "sub1")) == EIGHT_SUB1
    assert shardfs(capsys, str(write_files(tmp_path / "two", TWO))) == TWO_ROOT
    (tmp_path / "nothing").mkdir()
    assert (
        shardfs(capsys, str(tmp_path / "nothing"))
        == EMPTY_CHECKSUM
        == reference(tmp_path / "nothing")
    )


def test_names_are_escaped_and_sorted_as_dandi_does(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Non-ASCII names are \\u-escaped in the hashed JSON, quotes and backslashes escaped,
    entries sorted by code point (upper case first), files and directories apart."""
    files = {
        "café/ü.bin": b"1",
        'a"quote': b"2",
        "back\\slash": b"3",
        "B": b"",
        "a/Z": b"4" * 5000,
        "a b/😀": b"5",
        "ä": b"6",
    }
    root = write_files(tmp_path / "names", files)
    assert shardfs(capsys, str(root)) == reference(root)


# -- folding directory by directory ----------------------------------------------------


def zarr_checksum_of(files: dict[str, bytes]) -> str:
    """What the `zarr_checksum` package computes for these files (in memory, all at once)."""
    return str(
        compute_zarr_checksum(
            ZarrArchiveFile(path=Path(path), size=len(data), digest=md5(data))
            for path, data in files.items()
        )
    )


def folded(files: dict[str, bytes], order: list[str]) -> str:
    fold = Fold()
    for path in order:
        fold.add(path, md5(files[path]), len(files[path]))
    return str(fold.finish())


def depth_first(paths: list[str], rng: random.Random) -> list[str]:
    """`paths` in a random depth-first order: each directory's files and subtrees shuffled
    together, a subtree always whole (files of a directory may come between its subtrees)."""
    files = [p for p in paths if "/" not in p]
    below: dict[str, list[str]] = {}
    for path in paths:
        if "/" in path:
            top, _, rest = path.partition("/")
            below.setdefault(top, []).append(rest)
    parts: list[list[str]] = [[f] for f in files]
    parts += [[f"{top}/{p}" for p in depth_first(rest, rng)] for top, rest in below.items()]
    rng.shuffle(parts)
    return [path for part in parts for path in part]


ODD_TREES = {
    "one file": {"only": b"x"},
    "one file deep down": {"a/b/c/d/e/f/g/h": b"deep"},
    "numbers sort as strings": {
        **{f"c/{i}/{j}": bytes([i, j]) for i in (0, 1, 2, 9, 10, 11, 99, 100) for j in (0, 10, 9)},
        "9": b"nine",
        "10": b"ten",
        "zarr.json": b"{}",
    },
    "a file and a directory of one name (S3 keys)": {"a": b"1", "a/b": b"2", "a b/c": b"3"},
    "code points, not locale": {"Z": b"", "_": b"1", "a": b"2", "\u00e9/\u00e9": b"3", "z/A": b"4"},
    "depths mixed": {"x": b"1", "d/x": b"2", "d/e/x": b"3", "d/e/f/x": b"4", "d/e2/x": b"5"},
}


@pytest.mark.parametrize("files", ODD_TREES.values(), ids=ODD_TREES.keys())
def test_the_fold_is_zarr_checksum_in_any_depth_first_order(files: dict[str, bytes]) -> None:
    expected = zarr_checksum_of(files)
    assert folded(files, sorted(files)) == expected
    assert folded(files, sorted(files, reverse=True)) == expected
    rng = random.Random(7)
    for _ in range(20):
        assert folded(files, depth_first(list(files), rng)) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.lists(st.text("019aZ_\u00e9", min_size=1, max_size=2), min_size=1, max_size=4).map(
            "/".join
        ),
        st.binary(max_size=3),
        max_size=30,
    ),
    st.randoms(use_true_random=False),
)
def test_the_fold_is_zarr_checksum_on_random_trees(
    files: dict[str, bytes], rng: random.Random
) -> None:
    assert folded(files, depth_first(list(files), rng)) == zarr_checksum_of(files)


def test_directories_without_files_do_not_exist() -> None:
    fold = Fold()
    fold.add_files("empty", [])
    fold.add_files("a/empty/too", [])
    fold.add("a/x", md5(b"x"), 1)
    fold.add_files("b", [])
    assert str(fold.finish()) == zarr_checksum_of({"a/x": b"x"})
    fold = Fold()
    fold.add_files("", [])
    fold.add_files("nothing/here", [])
    assert str(fold.finish()) == EMPTY_CHECKSUM


def test_coming_back_to_a_directory_left_is_an_error() -> None:
    """Its digest was made when the walk left it: a second part would give it two."""
    fold = Fold()
    fold.add("a/x", md5(b"x"), 1)
    fold.add("b/y", md5(b"y"), 1)
    fold.add("a/z", md5(b"z"), 1)
    with pytest.raises(ValueError, match="a added twice"):
        fold.finish()


def fold_peak(depth: int, width: int = 8, files: int = 16) -> int:
    """Peak bytes allocated while folding a tree of `width` directories per level, `depth`
    levels, `files` files in each leaf directory (width**depth * files files)."""
    entries = [(str(k), "0" * 32, 26) for k in range(files)]
    tracemalloc.start()
    try:
        fold = Fold()
        for leaf in itertools.product(range(width), repeat=depth):
            fold.add_files("/".join(map(str, leaf)), list(entries))
        fold.finish()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_memory_of_the_fold_does_not_grow_with_the_files() -> None:
    """8x the files (one level deeper): the same peak, give or take one open directory
    (the whole tree would take about 150 bytes a file: 10 MB at 65,536 files)."""
    small, big = fold_peak(3), fold_peak(4)  # 8,192 and 65,536 files
    assert big < small + (64 << 10), (small, big)


def test_tree_documents_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    eight = write_files(tmp_path / "eight", EIGHT)
    (eight / "empty").mkdir()
    out = tmp_path / "checksums"
    printed = json.loads(shardfs(capsys, str(eight), "--tree", str(out), "--json"))
    assert printed == {"digest": EIGHT_ROOT, "count": 8, "size": 197}
    documents = sorted(p.relative_to(out).as_posix() for p in out.rglob(".checksum"))
    assert documents == [".checksum", "sub1/.checksum", "sub1/subsub/.checksum", "sub2/.checksum"]
    text = (out / "sub1" / ".checksum").read_text()
    document = json.loads(text)
    assert document["digest"] == EIGHT_SUB1
    checksums = document["checksums"]
    assert [d["name"] for d in checksums["directories"]] == ["subsub"]
    assert [f["name"] for f in checksums["files"]] == ["file3.txt", "file4.txt", "file5.txt"]
    assert checksums["files"][0] == {
        "digest": md5(EIGHT["sub1/file3.txt"]),
        "name": "file3.txt",
        "size": len(EIGHT["sub1/file3.txt"]),
    }
    # Compact, keys in DANDI's order; the digest is the md5 of exactly the "checksums" part.
    compact = json.dumps(checksums, separators=(",", ":"))
    assert text == f'{{"checksums":{compact},"digest":"{EIGHT_SUB1}"}}'
    assert EIGHT_SUB1.startswith(md5(compact.encode()))
    assert json.loads((out / ".checksum").read_text())["digest"] == EIGHT_ROOT
    # A DIR with files in it is refused: stale documents would mislead.
    capsys.readouterr()
    assert main(["checksum", str(eight), "--tree", str(out)]) == 2
    assert "must be a new or empty directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/missing"], "does not exist"),
        (["{tmp}/file"], "is not a directory"),
        (["{tmp}", "--view", "v2"], "--view applies to --virtual only"),
        (["{tmp}", "-o", "rw"], "option 'rw' does not apply"),
        (["--virtual", "{tmp}"], "not a Zarr v3 hierarchy"),
        (["s3://"], "names no bucket"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    (tmp_path / "file").write_bytes(b"")
    assert main(["checksum", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_files_and_bytes_on_a_terminal(tmp_path: Path) -> None:
    stream = FakeTerminal()
    with progress_bar("checksum", "files", stream, mininterval=0) as bar:
        stored_checksum(LocalStorage(write_files(tmp_path / "eight", EIGHT)), bar)
    final = stream.getvalue().split("\r")[-1]
    assert final.startswith("checksum: 8 files [") and final.endswith(", 197 B]\n"), final


@pytest.mark.parametrize("kind", ["stored", "virtual"])
def test_the_walk_runs_only_a_few_batches_ahead_of_the_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Files are hashed and folded (and counted by the bar) while the walk goes on, which
    lists directories only a few batches ahead: the files listed and not folded yet stay
    few, however many the tree holds (here batches of 2 files, 1 thread)."""
    monkeypatch.setattr(hashing, "BATCH_FILES", 2)
    monkeypatch.setattr(virtual, "BATCH_FILES", 2)
    files = {f"d{i}/{j}": bytes([i, j]) for i in range(64) for j in range(8)}
    source = write_files(tmp_path / "src", files)
    if kind == "virtual":
        shutil.rmtree(source)
        array = zarr.create_array(
            source, shape=(8, 8, 8), chunks=(1, 1, 1), shards=(4, 4, 4), dtype="u1"
        )
        array[...] = np.arange(512).reshape(8, 8, 8) % 250 + 1  # every chunk stored
    storage = LocalStorage(source)
    namespace = Namespace(storage, listing_cache=0)
    ahead: list[int] = []
    listed = 0
    with progress_bar("checksum", "files", FakeTerminal()) as bar:

        def count(found: int) -> None:
            nonlocal listed
            ahead.append(listed - bar.n)
            listed += found

        if kind == "stored":
            list_storage = storage.list

            def list_counted(key: str) -> list[Any]:
                entries = list_storage(key)
                count(sum(not e.stat.is_dir for e in entries))
                return entries

            monkeypatch.setattr(storage, "list", list_counted)
            got = str(stored_checksum(storage, bar, workers=1))
            assert got == reference(source)
        else:
            list_view = namespace.listing

            def listing_counted(node: Any) -> Any:
                listing = list_view(node)
                count(
                    sum(not a.is_dir for _, _, a in listing.entries) + sum(map(len, listing.runs))
                )
                return listing

            monkeypatch.setattr(namespace, "listing", listing_counted)
            virtual.virtual_checksum(namespace, bar, workers=1)
        assert bar.n == listed >= 512
    window = (hashing.AHEAD + 2) * 2  # tasks submitted ahead and due, one being gathered
    assert max(ahead) <= window + 8, ahead  # and the files of the directory listed last


# -- a source written by zarr-python 3 --------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case of the mount tests (key encodings, index layouts, nested sharding, unsharded
    arrays, whole-shard compression), plus the chains the v2 view serves other bytes for
    (a trailing crc32c cut off, a crc32c mid-chain decoded)."""
    source = tmp_path_factory.mktemp("checksum") / "src"
    build(source)
    add_v2_chains(source)
    return source


@pytest.fixture
def source(src: Source, written: Path) -> Source:
    """`written` on each backend (on S3, uploaded as it is: no shardfs involved)."""
    if src.s3 is None:
        shutil.copytree(written, src.root)
    else:
        src.s3.upload_tree(written, src.root)
    return src


def s3_reference(source: Source) -> str:
    assert source.s3 is not None
    options = S3ClientOptions(endpoint_url=source.s3.endpoint, region_name=source.s3.region)
    return str(compute_zarr_checksum(yield_files_s3(source.s3.bucket, source.root, options)))


def test_stored_matches_zarr_checksum(source: Source, capsys: pytest.CaptureFixture) -> None:
    """As stored, shard files included; on S3 from listings alone: not one object is read."""
    if source.s3 is None:
        assert shardfs(capsys, source.url) == reference(source.root)
        return
    expected = s3_reference(source)
    source.s3.proxy.reset_counts()
    assert shardfs(capsys, source.url, "-o", ",".join(source.options)) == expected
    assert set(source.s3.proxy.counts()) == {"LIST"}


@pytest.mark.fuse
@pytest.mark.parametrize("view", ["v3", "v2"])
def test_virtual_matches_a_mount_and_an_unsharded_copy(
    written: Path, mount: Any, tmp_path: Path, capsys: pytest.CaptureFixture, view: str
) -> None:
    """`--virtual` is what zarr_checksum says of a mount of the same source, and of a plain
    copy made from the mount (the same chunk bytes and metadata files, one file per chunk)."""
    got = shardfs(capsys, "--virtual", "--view", view, str(written))
    mounted = mount(written, "ro", f"view={view}")
    assert got == reference(mounted.path)
    copy = tmp_path / "copy"
    shutil.copytree(mounted.path, copy)
    assert got == reference(copy) == shardfs(capsys, str(copy))
    assert got != shardfs(capsys, str(written)), "the view is not the stored tree"


@pytest.mark.parametrize("view", ["v3", "v2"])
def test_virtual_of_s3_is_that_of_the_same_local_source(
    s3: S3Env, tmp_path: Path, capsys: pytest.CaptureFixture, view: str
) -> None:
    """A few objects only: every request to the test server takes tens of milliseconds."""
    local = tmp_path / "src"
    root = zarr.open_group(local, mode="w")
    crc = next(case for case in EXTRA if case.name == "v2/crc32c")
    sharded = root.create_array("crc", shape=crc.data.shape, dtype=crc.data.dtype, **crc.options)
    sharded[...] = crc.data
    root.create_array("plain", shape=(4, 4), chunks=(2, 2), dtype="i4")[...] = 5
    s3.upload_tree(local, "src")
    options = ["-o", ",".join(s3.mount_options())]
    got = shardfs(capsys, "--virtual", "--view", view, s3.url("src"), *options)
    assert got == shardfs(capsys, "--virtual", "--view", view, str(local))


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory, zarr2: Zarr2) -> Path:
    """A draft v3 source, written by zarr-python 2.18 (chunk keys of the draft's own form)."""
    base = tmp_path_factory.mktemp("draft")
    path, data = base / "src", base / "data"
    data.mkdir()
    for name in draft_arrays.ARRAYS:
        np.save(data / f"{name.replace('/', '__')}.npy", draft_arrays.values(name))
    zarr2.run(
        draft_arrays.WRITE, draft=True, path=str(path), data=str(data), arrays=draft_arrays.ARRAYS
    )
    return path


@pytest.mark.fuse
@pytest.mark.parametrize("view", ["v3", "v2"])
def test_virtual_of_a_draft_source_matches_a_mount(
    draft: Path, mount: Any, capsys: pytest.CaptureFixture, view: str
) -> None:
    got = shardfs(capsys, "--virtual", "--view", view, str(draft))
    assert got == reference(mount(draft, "ro", f"view={view}").path)


def test_each_shard_is_read_once_in_pieces(written: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards are read once, in pieces of at most PIECE bytes (here small, so there are many and
    chunks bigger than a piece are streamed), and the digest does not change."""
    storage = LocalStorage(written)
    namespace = Namespace(storage)
    expected = virtual.virtual_checksum(namespace)  # and the indexes are cached now
    monkeypatch.setattr(hashing, "PIECE", 64)
    monkeypatch.setattr(virtual, "GAP", 0)
    reads: dict[str, list[tuple[int, int]]] = {}
    original = storage.read

    def read(key: str, offset: int, length: int, version: Any = None) -> bytes:
        reads.setdefault(key, []).append((offset, length))
        return original(key, offset, length, version)

    monkeypatch.setattr(storage, "read", read)
    assert virtual.virtual_checksum(namespace, workers=3) == expected
    assert any(len(ranges) > 1 for ranges in reads.values())
    for key, ranges in reads.items():
        assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(sorted(ranges))), key
        assert max(n for _, n in ranges) <= 64, key


def test_a_shard_replaced_between_two_of_its_listings_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its chunks in one directory were hashed at one version, those of the next would be
    at another: no checksum is both."""
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(4, 4), chunks=(1, 1), shards=(4, 4), dtype="u1")
    array[...] = 1
    namespace = Namespace(LocalStorage(source), listing_cache=0)
    listing = namespace.listing

    def replacing(node: Any) -> Any:
        if node.path == "c/1":
            array[3, 3] = 2  # the one shard, written anew
        return listing(node)

    monkeypatch.setattr(namespace, "listing", replacing)
    with pytest.raises(SourceChanged, match="changed during the checksum"):
        virtual.virtual_checksum(namespace)


@pytest.mark.fuse
def test_virtual_after_appends_matches_a_mount(
    tmp_path: Path, mount: Any, capsys: pytest.CaptureFixture
) -> None:
    """Chunks rewritten through a mount leave dead space in their shard: never hashed."""
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(16, 16), chunks=(2, 2), shards=(8, 8), dtype="u2")
    array[:] = np.arange(256, dtype="u2").reshape(16, 16)
    shard = source / "c" / "0" / "0"
    before = shard.stat().st_size
    writer = mount(source)
    zarr.open_array(writer.path, mode="r+")[2:6, 2:4] = 999
    writer.stop()
    assert shard.stat().st_size > before  # appended: the old chunks and index are dead space
    got = shardfs(capsys, "--virtual", str(source))
    assert got == reference(mount(source, "ro").path)
    assert zarr.open_array(source)[3, 3] == 999


def test_a_chunk_failing_its_crc32c_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The v2 view verifies a trailing crc32c before cutting it off: as the mount gives EIO,
    the checksum fails, naming the chunk; the v3 view serves the stored bytes as they are."""
    crc = next(case for case in EXTRA if case.name == "v2/crc32c")
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=crc.data.shape, dtype=crc.data.dtype, **crc.options)
    array[...] = crc.data
    namespace = Namespace(LocalStorage(source))
    key, _, offset, _ = namespace.shards.locate(namespace.resolve("c/1/1").array, (1, 1))
    with open(source / key, "r+b") as f:
        f.seek(offset + 2)
        byte = f.read(1)
        f.seek(offset + 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert Digest.parse(shardfs(capsys, "--virtual", str(source))).count > 1
    assert main(["checksum", "--virtual", "--view", "v2", str(source)]) == 1
    err = capsys.readouterr().err.strip().splitlines()  # the progress so far, then the error
    assert [line for line in err if line.startswith("shardfs:")] == err[-1:], err
    assert err[-1].startswith("shardfs: 1/1 (stored in ") and "crc32c" in err[-1], err
    # --tree: the documents written before the failure go with it.
    for out in (tmp_path / "new", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        args = ["checksum", "--virtual", "--view", "v2", "--tree", str(out), str(source)]
        assert main(args) == 1
        assert not out.exists() if out.name == "new" else not any(out.iterdir())


# -- user.md5 -----------------------------------------------------------------------------


def chunk_files(top: Path) -> Iterator[Path]:
    for path in sorted(top.rglob("*")):
        if path.is_file() and path.name not in (
            "zarr.json",
            ".zarray",
            ".zattrs",
            ".zgroup",
            ".zmetadata",
        ):
            yield path


@pytest.mark.fuse
@pytest.mark.parametrize("view", ["v3", "v2"])
def test_user_md5_is_the_md5_of_what_is_served(written: Path, mount: Any, view: str) -> None:
    mounted = mount(written, "ro", f"view={view}")
    crc = mounted.path / "v2" / "crc32c"
    checked = 0
    for path in chunk_files(crc):
        assert os.listxattr(path) == ["user.md5"]
        assert os.getxattr(path, "user.md5").decode() == md5(path.read_bytes())
        checked += 1
    assert checked > 4
    chunk = next(chunk_files(crc))
    for path, name in [
        (crc / ("zarr.json" if view == "v3" else ".zarray"), "user.md5"),
        (crc, "user.md5"),
        (chunk, "user.other"),
        (chunk, "security.capability"),
    ]:
        with pytest.raises(OSError) as failed:
            os.getxattr(path, name)
        assert failed.value.errno == errno.ENODATA, (path, name)
    assert os.listxattr(crc) == []


def eventually(check: Any, timeout: float = 10) -> Any:
    """`check()` once it stops raising OSError (the kernel sends `release` asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.fuse
def test_user_md5_on_a_read_write_mount(tmp_path: Path, mount: Any) -> None:
    """A chunk written and not yet committed has no user.md5 (its bytes are in the buffer);
    once committed, the attribute is the md5 of the new bytes."""
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")
    array[:] = 1
    mounted = mount(source, "flush_interval=3600")
    chunk = mounted.path / "c" / "0" / "0"
    before = os.getxattr(chunk, "user.md5").decode()
    assert before == md5(chunk.read_bytes())
    zarr.open_array(mounted.path, mode="r+")[0:2, 0:2] = 7
    assert os.listxattr(chunk) == []
    with pytest.raises(OSError) as failed:
        os.getxattr(chunk, "user.md5")
    assert failed.value.errno == errno.ENODATA
    root = os.open(mounted.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(root)  # commits every shard
    finally:
        os.close(root)
    after = eventually(lambda: os.getxattr(chunk, "user.md5")).decode()
    assert after == md5(chunk.read_bytes()) != before


def test_chunk_digests_are_cached_by_shard_version(tmp_path: Path) -> None:
    source = tmp_path / "src"
    array = zarr.create_array(source, shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="u1")
    array[:] = 3

    def digests_of(view: View) -> tuple[ChunkDigests, str]:
        namespace = Namespace(LocalStorage(source), view=view)
        chunk = namespace.resolve("c/1/1" if view is View.V3 else "1/1")
        digests = ChunkDigests(namespace)
        digest = digests.md5(chunk)
        assert digest == digests.md5(chunk) == md5(namespace.open(chunk).read(0, 1 << 20))
        assert digests.cache.stats.loads == 1
        metadata = namespace.resolve("zarr.json" if view is View.V3 else ".zarray")
        assert digests.md5(metadata) is None
        return digests, digest

    digests, first = digests_of(View.V3)
    assert digests_of(View.V2)[1] == first  # zstd without a crc32c: the same bytes
    array[2:, 2:] = 4  # a new version of the shard: hashed again
    chunk = digests.ns.resolve("c/1/1")
    assert digests.md5(chunk) == md5(digests.ns.open(chunk).read(0, 1 << 20)) != first
    assert digests.cache.stats.loads == 2


def test_on_a_terminal_the_checksum_says_what_it_is(tmp_path: Path) -> None:
    """A pipe gets the bare digest (for scripts); a terminal also a line saying what it is."""
    import pty
    import subprocess
    import sys

    source = tmp_path / "src"
    zarr.create_array(source, shape=(8, 8), dtype="u1", chunks=(4, 4), shards=(8, 8))[:] = 1
    command = [sys.executable, "-m", "shardfs", "checksum", str(source)]
    piped = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    digest = piped.stdout.strip()
    assert digest == reference(source) and "\n" not in digest
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(command, stdout=follower, stderr=subprocess.PIPE, timeout=120)
        os.close(follower)
        follower = -1
        assert done.returncode == 0, done.stderr
        shown = b""
        with contextlib.suppress(OSError):  # EIO once everything is read
            while chunk := os.read(leader, 4096):
                shown += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    lines = shown.decode().splitlines()
    assert lines[0] == digest, lines
    assert "DANDI zarr checksum" in lines[1] and f"{source} as stored" in lines[1], lines
    assert "2 files" in lines[1], lines
