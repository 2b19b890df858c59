"""DANDI Zarr manifests parsed into tables, written back, and refused where they are not one."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from zarr_checksum import compute_zarr_checksum
from zarr_checksum.generators import ZarrArchiveFile

from shardfs.checksum.pinned import tree_checksum
from shardfs.formats import dandi_manifest
from shardfs.formats.dandi_manifest import (
    MAX_DEPTH,
    MAX_PATH,
    MAX_STRING,
    MAX_VALUE_DEPTH,
    MAX_VALUE_ITEMS,
    RECOMMENDED_FIELDS,
    PinnedTree,
    PinnedVersion,
    Row,
    TreeBuilder,
    parse,
    parse_time,
    write,
)
from shardfs.primitives.errors import UsageError

MD5 = "fc3d1270cd950f1e5430226db4c38c0e"


def entry(version: str, size: int, etag: str = MD5) -> list[Any]:
    return [version, "2022-03-16T02:39:36+00:00", size, etag]


def document(entries: dict[str, Any], **top: Any) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "fields": list(RECOMMENDED_FIELDS),
        "statistics": {"entries": 0, "zarrChecksum": "x"},
        "entries": entries,
    }
    manifest.update(top)
    return manifest


def parsed(manifest: dict[str, Any] | bytes) -> Any:
    raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    return parse(io.BytesIO(raw), "test.json")


def rows(tree: PinnedTree, key: str) -> list[Row]:
    directory = tree.directory(key)
    assert directory is not None
    return list(directory.rows())


# The example of the specification (doc/design/zarr-manifests.md), with its entry arrays.
SPEC = {
    ".zgroup": entry("VI067uTlzPTTyL750Ibkx3hAUm67A_sI", 27935),
    "arr_0": {".zarray": entry("a0", 300), "0": entry("a1", 17, "0" * 32 + "-3")},
    "arr_1": {".zarray": entry("b0", 301), "0": entry("b1", 18)},
}


def test_the_specification_example_is_parsed_into_tables() -> None:
    tree = parsed(document(SPEC))
    assert tree.entries == 5 and tree.total_size == 27935 + 300 + 17 + 301 + 18
    assert tree.depth == 1
    assert [path for path, _ in tree.files()] == ["", "arr_0", "arr_1"]
    assert tree.directories == 2
    assert [row.name for row in rows(tree, "")] == [".zgroup", "arr_0", "arr_1"]
    row = tree.lookup(".zgroup")
    assert row is not None and not row.is_dir and row.size == 27935
    assert row.version == PinnedVersion("VI067uTlzPTTyL750Ibkx3hAUm67A_sI", MD5, 27935)
    assert row.mtime == parse_time("2022-03-16T02:39:36+00:00")
    multipart = tree.lookup("arr_0/0")
    assert multipart is not None and multipart.version.etag == "0" * 32 + "-3"
    directory = tree.lookup("arr_1")
    assert directory is not None and directory.is_dir
    assert tree.lookup("arr_1/nope") is None and tree.lookup("nope/0") is None
    assert tree.statistics == {"entries": 0, "zarrChecksum": "x"}


def test_written_and_parsed_again_is_the_same_tree() -> None:
    tree = parsed(document(SPEC))
    out = io.StringIO()
    write(tree, out, "digest-5--1")
    again = json.loads(out.getvalue())
    assert again["schemaVersion"] == 2 and again["fields"] == list(RECOMMENDED_FIELDS)
    assert again["statistics"]["zarrChecksum"] == "digest-5--1"
    assert again["statistics"]["entries"] == 5 and again["statistics"]["depth"] == 1
    assert again["entries"] == SPEC
    back = parsed(out.getvalue().encode())
    for key in (".zgroup", "arr_0/.zarray", "arr_0/0", "arr_1/0"):
        assert back.lookup(key) == tree.lookup(key)


def test_unsorted_names_are_sorted_and_other_field_orders_are_taken() -> None:
    fields = ["size", "ETag", "extra", "versionId"]
    entries = {name: [len(name), MD5, None, f"v-{name}"] for name in ("b", "a", "c", "aa")}
    tree = parsed(document(entries, fields=fields))
    assert [row.name for row in rows(tree, "")] == ["a", "aa", "b", "c"]
    for name in ("b", "a", "c", "aa"):
        row = tree.lookup(name)
        assert row is not None and row.version == PinnedVersion(f"v-{name}", MD5, len(name))
        assert row.mtime == 0  # no lastModified field


def test_unsorted_directories_keep_their_subdirectories_and_multipart_etags() -> None:
    """Sorting a directory's rows carries each subdirectory's number and odd ETag along."""
    multipart = f"{MD5}-12"
    entries = {"z": {"y": entry("zy", 1), "x": {"w": entry("zxw", 2, multipart)}},
               "b": entry("b", 3, multipart), "a": {}, "c": entry("c", 4)}  # fmt: skip
    tree = parsed(document(entries))
    assert [row.name for row in rows(tree, "")] == ["a", "b", "c", "z"]
    assert [row.name for row in rows(tree, "z")] == ["x", "y"]
    assert tree.lookup("z/x/w").version == PinnedVersion("zxw", multipart, 2)
    assert tree.lookup("b").version.etag == multipart and tree.lookup("c").version.etag == MD5
    assert rows(tree, "a") == [] and tree.directory("c") is None and tree.directory("q") is None
    out = io.StringIO()
    write(tree, out, "x")
    assert json.loads(out.getvalue())["entries"] == entries


def test_fields_after_the_entries_must_be_the_recommended_ones() -> None:
    manifest = {"entries": {"a": entry("v", 1)}, "fields": list(RECOMMENDED_FIELDS)}
    assert parsed(manifest).lookup("a") is not None
    reordered = {"entries": {"a": entry("v", 1)}, "fields": ["size", "ETag", "versionId"]}
    with pytest.raises(UsageError, match="after entries"):
        parsed(reordered)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (b'{"fields": ["versionId"', "not valid JSON"),
        (b"not json at all", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (document(SPEC, fields=["versionId", "lastModified", "size"]), "lacks ETag"),
        (document(SPEC, fields=["versionId", "size", "ETag", "size"]), "twice"),
        (document(SPEC, schemaVersion=3), "schemaVersion 3"),
        (document({"..": {"a": entry("v", 1)}}), "'..'"),
        (document({"a": {".": entry("v", 1)}}), "'.'"),
        (document({"": entry("v", 1)}), "empty name"),
        (document({"/etc": entry("v", 1)}), "holds a '/'"),
        (document({"a/../../b": entry("v", 1)}), "holds a '/'"),
        (document({"a\\b": entry("v", 1)}), "holds a '/'"),
        (document({"a": ["v", "2022-03-16T02:39:36+00:00", "12", MD5]}), "strings and a size"),
        (document({"a": ["v", "yesterday", 12, MD5]}), "not a time"),
        (document({"a": ["v", "2022-03-16T02:39:36+00:00", 12]}), "array of 4 values"),
        (document({"a": 12}), "neither an entry"),
        (
            b'{"fields": ["versionId", "size", "ETag"], "entries": {"a": ["v", 1, "e"], '
            b'"a": ["w", 1, "e"]}}',
            "twice",
        ),
    ],
)
def test_bad_manifests_are_refused_in_one_line(manifest: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        parsed(manifest)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("manifest test.json")


def test_a_listing_leaves_odd_keys_out_and_a_directory_wins_over_its_object() -> None:
    left: list[tuple[str, str]] = []
    builder = TreeBuilder(strict=False, left_out=lambda key, why: left.append((key, why)))
    for key in ("a", "a-b", "a/x", "b//c", "c/../d", "z"):
        builder.key(key, 1, 0, MD5, "v")
    tree = builder.finish()
    assert [row.name for row in rows(tree, "")] == ["a", "a-b", "z"]
    assert tree.lookup("a") is not None and tree.lookup("a").is_dir  # type: ignore[union-attr]
    assert {key for key, _ in left} == {"a", "b//c", "c/../d"}


def test_the_checksum_of_a_tree_is_zarr_checksums() -> None:
    """Directories without files, multipart ETags and nesting fold as `zarr_checksum` does."""
    entries = {**SPEC, "empty": {"deeper": {}}, "b": {"c": {"d": entry("d0", 5, MD5[:31] + "f-2")}}}
    tree = parsed(document(entries))
    files = [
        ZarrArchiveFile(path=Path(key), size=row.size, digest=row.version.etag)
        for key in ("arr_0/.zarray", "arr_0/0", "arr_1/.zarray", "arr_1/0", ".zgroup", "b/c/d")
        if (row := tree.lookup(key)) is not None and row.version is not None
    ]
    assert len(files) == 6
    assert str(tree_checksum(tree)) == str(compute_zarr_checksum(files))
    assert [path for path, _ in tree.files()] == ["", "arr_0", "arr_1", "b", "b/c", "empty",
                                                   "empty/deeper"]  # fmt: skip


# -- bounds, checked while the manifest is read ---------------------------------------------


def traced(raw: bytes) -> tuple[Any, int, int]:
    """`raw` parsed (or the UsageError refusing it), with the bytes the parse left allocated
    and the most it had allocated at once."""
    tracemalloc.start()
    try:
        try:
            found: Any = parse(io.BytesIO(raw), "test.json")
        except UsageError as e:
            found = e
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return found, held, peak


def one_line(error: Any, message: str) -> None:
    assert isinstance(error, UsageError), error
    assert message in str(error) and "\n" not in str(error), str(error)
    assert str(error).startswith("manifest test.json: "), str(error)


def test_a_directory_costs_no_more_than_an_entry() -> None:
    """Directories are rows of the one table, as objects are (no table, object or path of
    their own): 10,000 empty ones hold less than 10,000 objects. While read, the parse holds
    besides only the directories on the way down and ijson's events of one buffer."""
    n = 10_000
    tree, held, peak = traced(json.dumps(document({f"d{i}": {} for i in range(n)})).encode())
    assert isinstance(tree, PinnedTree) and tree.directories == n and tree.entries == 0
    assert tree.lookup("d9999") == Row("d9999", True, 0, 0, None)
    objects = {f"d{i}": entry(f"{i:032}", 1) for i in range(n)}  # S3's version ids: 32 bytes
    files = parsed(document(objects))
    assert isinstance(files, PinnedTree) and files.entries == n
    assert tree.cost() < files.cost() < 80 * n
    # Nothing else is held per directory (besides, Python's free lists keep some tuples).
    assert held < tree.cost() + (1 << 20)
    assert peak < held + (8 << 20)  # ijson's events of a 64 KiB buffer: at most about 4 MiB


def test_entries_with_multipart_etags_cost_no_object_each() -> None:
    """An ETag that is no md5 hex (a multipart upload's `md5-N`) costs its text and 8 bytes
    in the table, no Python object."""
    n = 10_000
    plain = parsed(document({str(i): entry("v", 1) for i in range(n)}))
    raw = json.dumps(document({str(i): entry("v", 1, f"{MD5}-{i % 10}") for i in range(n)}))
    tree, held, _ = traced(raw.encode())
    assert isinstance(tree, PinnedTree) and tree.lookup("77").version.etag == f"{MD5}-7"
    assert tree.cost() - plain.cost() == n * (len(f"{MD5}-7") + 8)
    # Nothing else is held per entry: besides the table and its slack (at most an eighth),
    # Python's free lists keep a few thousand tuples.
    assert held < tree.cost() * 9 / 8 + (512 << 10)


def test_directories_deeper_than_the_bound_are_refused_as_they_open() -> None:
    """10,000 levels (a 70 KB manifest) are refused at level MAX_DEPTH + 1, before the rest
    is read; MAX_DEPTH levels are a tree, written and read back the same."""
    levels = 10_000
    deep = b'{"entries": ' + b'{"d": ' * levels + b"{}" + b"}" * levels + b"}"
    found, _, peak = traced(deep)
    one_line(found, f"a directory {MAX_DEPTH + 1} levels deep, deeper than the {MAX_DEPTH}")
    assert peak < 8 << 20  # ijson's events of a 64 KiB buffer: at most about 4 MiB

    inner: dict[str, Any] = {"f": entry("v", 3)}
    for _ in range(MAX_DEPTH):
        inner = {"dddddd": inner}
    tree = parsed(document(inner))
    key = "dddddd/" * MAX_DEPTH + "f"
    assert tree.depth == MAX_DEPTH and tree.lookup(key).size == 3
    out = io.StringIO()
    write(tree, out, "x")
    assert parsed(out.getvalue().encode()).lookup(key) == tree.lookup(key)


def test_paths_longer_than_s3_keys_are_refused() -> None:
    """A path below the prefix of more than MAX_PATH bytes, S3's longest key, whether it ends
    in an object or a directory."""
    above = {"a" * 250: {"b" * 250: {"c" * 250: {"d" * 250: {}}}}}  # 4 * 251 bytes to here
    last = above["a" * 250]["b" * 250]["c" * 250]["d" * 250]
    last["e" * (MAX_PATH - 4 * 251)] = entry("v", 1)
    tree = parsed(document(above))
    assert tree.lookup("/".join(("a" * 250, "b" * 250, "c" * 250, "d" * 250, "e" * 20)))
    for longer in (entry("v", 1), {}):
        last.clear()
        last["e" * (MAX_PATH - 4 * 251 + 1)] = longer
        with pytest.raises(UsageError, match=f"a path of {MAX_PATH + 1} bytes, longer than"):
            parsed(document(above))


def test_directories_count_as_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dandi_manifest, "MAX_ENTRIES", 10)
    fits = {**{f"d{i}": {} for i in range(5)}, **{f"f{i}": entry("v", 1) for i in range(5)}}
    assert parsed(document(fits)).entries == 5
    for more in ({"d5": {}}, {"f5": entry("v", 1)}, {"d0": {"x": {}}}):
        with pytest.raises(UsageError, match="more than 10 entries"):
            parsed(document({**fits, **more}))
    builder = TreeBuilder(strict=False)
    for key in ("a/b/c/d/e/1", "a/b/c/d/e/2", "a/b/c/d/e/3", "a/b/c/d/e/4"):
        builder.key(key, 1, 0, MD5, "v")  # 5 directories, 4 objects
    with pytest.raises(UsageError, match="more than 10 entries"):
        builder.key("a/b/c/d/f/1", 1, 0, MD5, "v")


def test_a_listing_leaves_out_keys_past_the_bounds() -> None:
    left: list[tuple[str, str]] = []
    builder = TreeBuilder(strict=False, left_out=lambda key, why: left.append((key, why)))
    deep = "d/" * (MAX_DEPTH + 1) + "f"
    for key, version in [("a/b", "v"), (deep, "v"), ("/".join(["e"] + ["x" * 250] * 5), "v"),
                         ("m", "v" * (MAX_STRING + 1)), ("x/y", "v"), ("w", "v")]:  # fmt: skip
        builder.key(key, 1, 0, MD5, version)
    tree = builder.finish()
    assert [row.name for row in rows(tree, "")] == ["a", "x"]
    assert tree.lookup("a/b") is not None and tree.lookup("x/y") is not None
    assert [(key[:5], why.split(",")[0][:24]) for key, why in left] == [
        ("d/d/d", "a directory 129 levels d"),
        ("e/xxx", "a path of 1256 bytes"),
        ("m", "a version id or ETag lon"),
        ("w", "listed out of order"),
    ]


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


FIELDS = json.dumps(list(RECOMMENDED_FIELDS))
ENTRY = json.dumps(entry("v", 1))


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        pytest.param(
            f'{{"statistics": {{"x": {nested(200_000)}}}, "entries": {{"a": {ENTRY}}}}}',
            f"statistics nests deeper than {MAX_VALUE_DEPTH} levels",
            id="deep statistics",
        ),
        pytest.param(
            f'{{"fields": {nested(200_000)}, "entries": {{"a": {ENTRY}}}}}',
            f"fields nests deeper than {MAX_VALUE_DEPTH} levels",
            id="deep fields",
        ),
        pytest.param(
            f'{{"schemaVersion": {nested(MAX_VALUE_DEPTH + 1)}, "entries": {{}}}}',
            f"schemaVersion nests deeper than {MAX_VALUE_DEPTH} levels",
            id="deep schemaVersion",
        ),
        pytest.param(
            f'{{"statistics": {{"x": {list(range(MAX_VALUE_ITEMS))}}}, "entries": {{}}}}',
            f"statistics holds more than {MAX_VALUE_ITEMS} values",
            id="long statistics",
        ),
        pytest.param(
            f'{{"fields": {json.dumps([*RECOMMENDED_FIELDS, "x" * (MAX_STRING + 1)])}}}',
            f"fields holds a string longer than {MAX_STRING} characters",
            id="long field name",
        ),
        pytest.param(
            f'{{"fields": {FIELDS}, "entries": {{"a": ["v", "2022-03-16T02:39:36Z", '
            f'{"9" * 100_000}, "e"]}}}}',
            "not JSON Python can read: Exceeds the limit (4300 digits)",
            id="100,000-digit size",
        ),
        pytest.param(
            f'{{"statistics": {{"entries": {"9" * 5_000}}}, "entries": {{}}}}',
            "not JSON Python can read: Exceeds the limit (4300 digits)",
            id="5,000-digit statistic",
        ),
        pytest.param(
            f'{{"entries": {{"a": ["v", "2022-03-16T02:39:36Z", {1 << 63}, "{MD5}"]}}}}',
            "strings and a size",
            id="size of 2^63",
        ),
        pytest.param(
            f'{{"entries": {{"a": ["{"v" * (MAX_STRING + 1)}", "2022-03-16T02:39:36Z", 1, '
            f'"{MD5}"]}}}}',
            f"versionId or ETag longer than {MAX_STRING} characters",
            id="long versionId",
        ),
        pytest.param(
            f'{{"entries": {{"a": ["v", "2022-03-16T02:39:36Z", 1, "{"e" * (MAX_STRING + 1)}"]}}}}',
            f"versionId or ETag longer than {MAX_STRING} characters",
            id="long ETag",
        ),
    ],
)
def test_hostile_values_are_refused_in_one_line_while_read(manifest: str, message: str) -> None:
    """Values Python would decode into deep recursion, many objects or an integer it cannot
    convert: refused as they come, in one line."""
    found, _, peak = traced(manifest.encode())
    one_line(found, message)
    assert peak < 8 << 20  # ijson's events of a 64 KiB buffer: at most about 4 MiB
