"""The S3 storage against a real S3 API (moto's server), through the fault-injecting proxy.

Each test checks one promise of `Storage` as S3 keeps it: listings and stats
from one cached LIST, reads pinned to an ETag, conditional writes, appends
as a rebuild or a server-side multipart copy, retries of failed, slow and cut
short requests, and clean-up of uploads that writers left behind.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import timedelta
from typing import Any

import botocore.exceptions
import pytest

from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.errors import (
    CorruptData,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
    UsageError,
)
from shardfs.storage.base import ABSENT
from shardfs.storage.s3 import MIN_PART, PROBE_DIR, S3Config, S3Storage, parse_url
from tests.support.s3 import S3Env


def storage(s3: S3Env, prefix: str = "root", **config: object) -> S3Storage:
    settings = {"endpoint_url": s3.endpoint, "region": s3.region, "metadata_ttl": 60.0}
    settings.update(config)
    return S3Storage(s3.bucket, prefix, S3Config(**settings))  # type: ignore[arg-type]


def test_parse_url() -> None:
    assert parse_url("s3://bucket/a/b/") == ("bucket", "a/b")
    assert parse_url("s3://bucket") == ("bucket", "")
    for bad in ("bucket/a", "s3:///a"):
        with pytest.raises(UsageError):
            parse_url(bad)


def test_tree_from_listings(s3: S3Env) -> None:
    for key in ("root/a/x", "root/a/y", "root/a/sub/z", "root/b", "root/a/marker/", "other/q"):
        s3.put(key, key.encode())
    st = storage(s3)
    assert {e.name: e.stat.is_dir for e in st.list("")} == {"a": True, "b": False}
    assert {e.name: e.stat.is_dir for e in st.list("a")} == {
        "x": False,
        "y": False,
        "sub": True,
        "marker": True,
    }
    s3.proxy.reset_counts()
    x = st.stat("a/x")
    assert x is not None and x.size == 8 and not x.is_dir
    assert st.stat("a/nothing") is None
    sub = st.stat("a/sub")
    assert sub is not None and sub.is_dir
    assert s3.proxy.counts() == {}, "stats of listed entries cost no request"
    assert st.read("a/sub/z", 0, 12, None) == b"root/a/sub/z"
    with pytest.raises(NotFound):
        st.list("nothing")
    with pytest.raises(NotADirectory):
        st.list("b")
    assert st.describe("a/x") == f"s3://{s3.bucket}/root/a/x"


def test_one_list_answers_the_subtree(s3: S3Env) -> None:
    keys = ["root/a/1", "root/a/2", "root/b/c/1", "root/b/c/2", "root/b/d/1", "root/z"]
    for key in keys:
        s3.put(key, key.encode())
    st = storage(s3)
    s3.proxy.reset_counts()
    assert st.stat("z") is not None  # lists the root's whole subtree
    assert st.stat("b/d/1") is not None
    assert {e.name for e in st.list("b/c")} == {"1", "2"}
    assert st.stat("a/3") is None and st.stat("b/e") is None
    assert s3.proxy.counts() == {"LIST": 1}, "one page of the whole tree answered all"

    # A truncated page answers the directories it went past, and no more.
    small = storage(s3)
    small.page_size = 3  # the page ends at root/b/c/1
    s3.proxy.reset_counts()
    assert small.stat("a/1") is not None and small.stat("a/3") is None
    assert s3.proxy.counts() == {"LIST": 1}
    assert small.stat("b/c/2") is not None, "b/c was cut by the page: listed again"
    assert s3.proxy.counts() == {"LIST": 2}
    assert [e.name for e in small.list("")] == ["a", "b", "z"]
    assert {e.name: e.stat.size for e in small.list("b")} == {"c": 0, "d": 0}
    assert small.stat("z") is not None and small.stat("b/d/1") is not None


def test_stat_without_a_cached_listing_is_one_list(s3: S3Env) -> None:
    s3.put("root/d/e/f", b"123")
    st = storage(s3)
    s3.proxy.reset_counts()
    f = st.stat("d/e/f")
    assert f is not None and f.size == 3
    assert s3.proxy.counts() == {"LIST": 1}
    with nonblocking():
        assert st.stat("d/e/f") == f  # cached: answered without waiting
        with pytest.raises(WouldBlock):
            st.stat("d/other/g")
        with pytest.raises(WouldBlock):
            st.read("d/e/f", 0, 1)


def test_reads_are_pinned_to_the_version(s3: S3Env) -> None:
    s3.put("root/k", b"old content")
    st = storage(s3)
    old = st.stat("k")
    assert old is not None
    assert st.read("k", 4, 7, old.version) == b"content"
    s3.put("root/k", b"new content!")
    with pytest.raises(SourceChanged):
        st.read("k", 4, 7, old.version)
    new = st.stat("k")  # the failed read dropped the cached listing entry
    assert new is not None and new.version != old.version and new.size == 12
    assert st.read("k", 0, 3) == b"new"
    with pytest.raises(CorruptData):
        st.read("k", 10, 5, new.version)  # past the end


def test_conditional_put_and_delete(s3: S3Env) -> None:
    st = storage(s3)
    first = st.put("d/k", [b"one"], ABSENT)
    assert st.stat("d/k") == first
    assert [e.name for e in st.list("d")] == ["k"]
    with pytest.raises(SourceChanged):
        st.put("d/k", [b"again"], ABSENT)
    second = st.put("d/k", [b"t", memoryview(b"wo")], first.version)
    assert s3.get("root/d/k") == b"two"
    with pytest.raises(SourceChanged):
        st.put("d/k", [b"three"], first.version)
    with pytest.raises(SourceChanged):
        st.delete("d/k", first.version)
    st.delete("d/k", second.version)
    assert st.stat("d/k") is None
    assert "root/d/k" not in s3.keys("root/")
    with pytest.raises(NotFound):
        st.delete("d/k", ABSENT)


def ignore_if_match_on_delete(st: S3Storage) -> None:
    """Make `st`'s store behave like one that ignores If-Match on DeleteObject (as MinIO
    does): the header is taken off every DeleteObject before it is signed and sent."""

    def strip(request: Any, **_kwargs: Any) -> None:
        if "If-Match" in request.headers:
            del request.headers["If-Match"]

    st._s3.meta.events.register("before-sign.s3.DeleteObject", strip)


def probe_key(key: str) -> str:
    """`key`, which must be one of a delete probe's objects."""
    assert re.fullmatch(f"root/{re.escape(PROBE_DIR)}/delete-probe-[0-9a-f]{{32}}", key), key
    return key


@pytest.mark.parametrize("honoured", [True, False], ids=["if-match-honoured", "if-match-ignored"])
def test_a_stale_delete_changes_nothing(s3: S3Env, honoured: bool) -> None:
    st = storage(s3)
    if not honoured:
        ignore_if_match_on_delete(st)
    ours = st.put("a/shard", [b"ours"], ABSENT)
    s3.put("root/a/shard", b"theirs")  # another writer replaces it
    with pytest.raises(SourceChanged):
        st.delete("a/shard", ours.version)
    assert st._deletes_conditional is honoured
    assert s3.get("root/a/shard") == b"theirs"
    theirs = st.stat("a/shard")  # the refusal dropped the cached entry
    assert theirs is not None and theirs.size == 6
    s3.admin.delete_object(Bucket=s3.bucket, Key="root/a/shard")  # and another removes it
    with pytest.raises(SourceChanged):
        st.delete("a/shard", theirs.version)
    s3.put("root/a/shard", b"theirs")  # same bytes, same ETag: still the version we know
    st.delete("a/shard", theirs.version)
    assert s3.keys("root/") == {} and st.stat("a/shard") is None


def test_moto_honours_if_match_on_delete(s3: S3Env) -> None:
    """What the delete probe relies on, as moto's server (5.2.5) answers it."""
    c = s3.client(retries={"total_max_attempts": 1})
    etag = s3.put("k", b"v")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        c.delete_object(Bucket=s3.bucket, Key="k", IfMatch='"' + "0" * 32 + '"')
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert s3.get("k") == b"v"
    c.delete_object(Bucket=s3.bucket, Key="k", IfMatch=etag)
    assert s3.keys() == {}
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        c.delete_object(Bucket=s3.bucket, Key="k", IfMatch=etag)
    assert excinfo.value.response["Error"]["Code"] == "NoSuchKey"


def test_the_delete_probe_runs_once_and_leaves_nothing(s3: S3Env) -> None:
    st = storage(s3)
    s3.put("root/a", b"a")
    s3.put("root/b", b"b")
    assert st.read("a", 0, 1, st.stat("a").version) == b"a"  # type: ignore[union-attr]
    assert st.put("c", [b"c"], ABSENT) is not None
    assert st._deletes_conditional is None, "no probe before the first delete"
    assert s3.proxy.counts()["DELETE"] == 0
    s3.proxy.reset_counts()
    st.delete("a", st.stat("a").version)  # type: ignore[union-attr]
    # The probe: PUT, DELETE with a wrong ETag (412), HEAD, DELETE with its ETag, HEAD.
    assert s3.proxy.counts() == {"PUT": 1, "DELETE": 3, "HEAD": 2}
    deadline = time.monotonic() + 10
    while True:  # the proxy logs a request just after answering it: the PUT of c may come late
        log = [entry for entry in s3.proxy.log() if entry[1] != "root/c"]
        if len(log) >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    log.sort(key=lambda entry: entry[1] == "root/a")
    assert [(method, status) for method, _, _, status in log] == [
        ("PUT", 200),
        ("DELETE", 412),
        ("HEAD", 200),
        ("DELETE", 204),
        ("HEAD", 404),
        ("DELETE", 204),
    ]
    assert {key for _, key, _, _ in log[:5]} == {probe_key(log[0][1])}
    assert st._deletes_conditional is True
    s3.proxy.reset_counts()
    st.delete("b", st.stat("b").version)  # type: ignore[union-attr]
    assert s3.proxy.counts() == {"DELETE": 1}, "one DeleteObject with If-Match, no more probes"
    assert set(s3.keys("root/")) == {"root/c"}
    assert [e.name for e in st.list("")] == ["c"]


def test_deletes_where_the_store_ignores_if_match(
    s3: S3Env, caplog: pytest.LogCaptureFixture
) -> None:
    st = storage(s3)
    ignore_if_match_on_delete(st)
    first = st.put("k", [b"one"], ABSENT)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        st.delete("k", first.version)
    assert st._deletes_conditional is False
    assert "does not honour If-Match on DeleteObject" in caplog.text
    assert "deleted although If-Match named another ETag" in caplog.text
    assert s3.keys("root/") == {}, "the probe object is gone too"
    second = st.put("k", [b"two"], ABSENT)
    s3.proxy.reset_counts()
    st.delete("k", second.version)
    assert s3.proxy.counts() == {"HEAD": 1, "DELETE": 1}, "a HEAD checks the ETag first"
    assert s3.keys("root/") == {}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        st.put("k", [b"three"], ABSENT)
        st.delete("k", st.stat("k").version)  # type: ignore[union-attr]
    assert caplog.text == "", "the warning is given once"


def test_ignored_if_match_leaves_one_round_trip_unguarded(s3: S3Env) -> None:
    """The documented limit of the fallback: a version stored between its HEAD and its
    DELETE is deleted. (Where the store honours If-Match, the same race is refused.)"""
    for honoured in (True, False):
        st = storage(s3)
        if not honoured:
            ignore_if_match_on_delete(st)
        st._deletes_conditional = honoured  # as the probe would find
        ours = st.put("k", [b"ours"], ABSENT)
        rule = s3.proxy.before(
            lambda _request: s3.put("root/k", b"theirs"), method="DELETE", key="root/k"
        )
        if honoured:
            with pytest.raises(SourceChanged):
                st.delete("k", ours.version)
            assert s3.get("root/k") == b"theirs"
            s3.admin.delete_object(Bucket=s3.bucket, Key="root/k")
        else:
            st.delete("k", ours.version)
            assert s3.keys("root/") == {}, "their version was lost"
        assert rule.hits == 1


@pytest.mark.parametrize(
    ("status", "code", "count", "why"),
    [
        (501, "NotImplemented", 1, "DeleteObject with If-Match answered NotImplemented"),
        (412, "PreconditionFailed", 2, "naming its own ETag answered PreconditionFailed"),
        (403, "AccessDenied", 1, "DeleteObject with If-Match answered AccessDenied"),
    ],
    ids=["501", "always-412", "403"],
)
def test_a_store_that_refuses_conditional_deletes(
    s3: S3Env, caplog: pytest.LogCaptureFixture, status: int, code: str, count: int, why: str
) -> None:
    """A store may answer If-Match on DeleteObject with an error rather than ignore it (AWS
    general-purpose buckets answered 501 before September 2025): deletes then go without it."""
    st = storage(s3)
    first = st.put("k", [b"one"], ABSENT)
    s3.proxy.fail(status, code=code, method="DELETE", key="delete-probe-", count=count)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        st.delete("k", first.version)
    assert st._deletes_conditional is False
    assert why in caplog.text
    assert s3.keys("root/") == {}, "the object and the probe's are gone"


def test_a_probe_that_fails_for_now_is_tried_again(s3: S3Env) -> None:
    st = storage(s3, attempts=2)
    first = st.put("k", [b"one"], ABSENT)
    rule = s3.proxy.fail(503, method="PUT", key="delete-probe-", count=None)
    with pytest.raises(StorageError) as error:
        st.delete("k", first.version)
    assert "SlowDown" in str(error.value)
    rule.remaining = 0  # the store is well again
    assert st._deletes_conditional is None, "the question stays open"
    assert s3.get("root/k") == b"one"
    st.delete("k", first.version)
    assert st._deletes_conditional is True
    assert s3.keys("root/") == {}


def test_only_one_of_racing_creators_wins(s3: S3Env) -> None:
    st = storage(s3)
    wins: list[int] = []
    losses: list[int] = []

    def create(n: int) -> None:
        try:
            st.put("race", [str(n).encode()], ABSENT)
            wins.append(n)
        except SourceChanged:
            losses.append(n)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1 and len(losses) == 7
    assert s3.get("root/race") == str(wins[0]).encode()


def test_append_to_a_small_object_rebuilds_it(s3: S3Env) -> None:
    st = storage(s3)
    first = st.put("small", [b"abc"], ABSENT)
    s3.proxy.reset_counts()
    second = st.append("small", [b"de", b"f"], first.version)
    assert s3.get("root/small") == b"abcdef" and second.size == 6
    assert s3.proxy.counts()["PUT"] == 1
    with pytest.raises(SourceChanged):
        st.append("small", [b"x"], first.version)
    with pytest.raises(NotFound):
        st.append("missing", [b"x"], ABSENT)
    assert s3.get("root/small") == b"abcdef"


def test_append_to_a_big_object_copies_it_on_the_server(s3: S3Env) -> None:
    st = storage(s3)
    body = bytes(range(256)) * (MIN_PART // 256 + 1)
    first = st.put("big", [body], ABSENT)
    s3.proxy.reset_counts()
    second = st.append("big", [b"tail"], first.version)
    counts = s3.proxy.counts()
    assert counts["UploadPartCopy"] == 1 and counts["UploadPart"] == 1
    assert counts["CompleteMultipartUpload"] == 1
    assert counts["GET"] + counts["GET range"] == 0, "nothing downloaded"
    assert s3.get("root/big") == body + b"tail"
    assert st.stat("big") == second and second.size == len(body) + 4
    assert st.read("big", len(body) - 2, 6, second.version) == body[-2:] + b"tail"


def test_a_big_append_that_loses_a_race_changes_nothing(s3: S3Env) -> None:
    st = storage(s3)
    body = b"x" * MIN_PART
    first = st.put("big", [body], ABSENT)
    # Another writer replaces the object after our HEAD, before our upload completes.
    s3.proxy.before(
        lambda _request: s3.put("root/big", b"theirs"),
        method="POST",
        key="root/big",
        query="uploadId",
    )
    with pytest.raises(SourceChanged):
        st.append("big", [b"ours"], first.version)
    assert s3.get("root/big") == b"theirs"
    uploads = s3.admin.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert uploads == [], "the failed upload was aborted"
    assert st.stat("big").size == 6  # type: ignore[union-attr]


def test_failed_and_cut_short_requests_are_retried(s3: S3Env) -> None:
    s3.put("root/k", bytes(range(200)))
    st = storage(s3, timeout=1.0)
    version = st.stat("k").version  # type: ignore[union-attr]
    s3.proxy.fail(503, method="GET", count=2)
    assert st.read("k", 0, 200, version) == bytes(range(200))
    s3.proxy.truncate(method="GET", count=2)
    assert st.read("k", 10, 100, version) == bytes(range(10, 110))
    s3.proxy.slow(3.0, method="GET", count=1)
    assert st.read("k", 0, 5, version) == bytes(range(5))
    s3.proxy.fail(500, method="PUT", count=1)
    st.put("k", [b"new"], version)
    assert s3.get("root/k") == b"new"


def test_persistent_failures_become_one_storage_error(s3: S3Env) -> None:
    s3.put("root/k", b"data")
    st = storage(s3, attempts=2)
    version = st.stat("k").version  # type: ignore[union-attr]
    s3.proxy.fail(503, method="GET", count=None)
    with pytest.raises(StorageError) as error:
        st.read("k", 0, 4, version)
    assert f"s3://{s3.bucket}/root/k" in str(error.value)
    assert "testing" not in str(error.value)  # no credentials in messages
    with pytest.raises(StorageError):
        storage(s3, prefix="", attempts=1).list("elsewhere")


def test_recover_aborts_uploads_of_dead_writers(s3: S3Env, monkeypatch: pytest.MonkeyPatch) -> None:
    st = storage(s3)
    dead = s3.admin.create_multipart_upload(Bucket=s3.bucket, Key="root/a/shard")
    s3.admin.create_multipart_upload(Bucket=s3.bucket, Key="elsewhere/shard")
    assert st.pending_recovery() == ["a/shard"]
    assert st.recover() == [], "a recent upload may be a live writer's"
    monkeypatch.setattr("shardfs.storage.s3.STALE_UPLOAD", timedelta(0))
    [line] = st.recover()
    assert "root/a/shard" in line
    uploads = s3.admin.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["elsewhere/shard"]
    assert dead["UploadId"] not in {u["UploadId"] for u in uploads}
