"""DANDI Zarr manifests parsed into tables, written back, and refused where they are not one."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from shardfs.formats.dandi_manifest import (
    RECOMMENDED_FIELDS,
    PinnedVersion,
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
    assert sorted(tree.directories) == ["", "arr_0", "arr_1"]
    assert [row.name for row in tree.directories[""].rows()] == [".zgroup", "arr_0", "arr_1"]
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
    assert [row.name for row in tree.directories[""].rows()] == ["a", "aa", "b", "c"]
    for name in ("b", "a", "c", "aa"):
        row = tree.lookup(name)
        assert row is not None and row.version == PinnedVersion(f"v-{name}", MD5, len(name))
        assert row.mtime == 0  # no lastModified field


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
    assert [row.name for row in tree.directories[""].rows()] == ["a", "a-b", "z"]
    assert tree.lookup("a") is not None and tree.lookup("a").is_dir  # type: ignore[union-attr]
    assert {key for key, _ in left} == {"a", "b//c", "c/../d"}
