"""The S3 test set-up works: each proxy control, the semantics it adds to moto, the 3 clients."""

from __future__ import annotations

import hashlib
import http.client
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import obstore
import pytest
import tensorstore as ts
import zarr
from botocore.exceptions import ClientError, ReadTimeoutError, ResponseStreamingError

from tests.support.s3 import RequestInfo, S3Env

NO_RETRIES = {"retries": {"total_max_attempts": 1}}


def error_of(excinfo: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    response = excinfo.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def test_counts_every_kind_over_one_kept_alive_connection(s3: S3Env) -> None:
    c = s3.client()
    b = s3.bucket
    c.put_object(Bucket=b, Key="a/x", Body=b"0123456789")
    c.get_object(Bucket=b, Key="a/x")["Body"].read()
    assert c.get_object(Bucket=b, Key="a/x", Range="bytes=2-4")["Body"].read() == b"234"
    c.head_object(Bucket=b, Key="a/x")
    c.list_objects_v2(Bucket=b, Prefix="a/")
    upload = c.create_multipart_upload(Bucket=b, Key="a/y")["UploadId"]
    part = dict(Bucket=b, Key="a/y", UploadId=upload)
    one = c.upload_part(**part, PartNumber=1, Body=b"p" * (5 << 20))["ETag"]
    two = c.upload_part_copy(**part, PartNumber=2, CopySource=f"{b}/a/x")["CopyPartResult"]
    parts = [{"PartNumber": 1, "ETag": one}, {"PartNumber": 2, "ETag": two["ETag"]}]
    c.complete_multipart_upload(**part, MultipartUpload={"Parts": parts})
    other = c.create_multipart_upload(Bucket=b, Key="a/z")["UploadId"]
    c.abort_multipart_upload(Bucket=b, Key="a/z", UploadId=other)
    c.delete_object(Bucket=b, Key="a/x")
    kinds = ["PUT", "GET", "GET range", "HEAD", "LIST", "UploadPart", "UploadPartCopy"]
    kinds += ["CompleteMultipartUpload", "AbortMultipartUpload", "DELETE"]
    assert s3.proxy.counts() == Counter(kinds) + Counter({"CreateMultipartUpload": 2})
    assert s3.proxy.log()[2] == ("GET", "a/x", "bytes=2-4", 206)
    assert s3.proxy.accepted == 1
    assert s3.get("a/y") == b"p" * (5 << 20) + b"0123456789"
    s3.proxy.reset_counts()
    assert s3.proxy.counts() == Counter() and s3.proxy.log() == []


def test_trees_go_up_and_come_back(s3: S3Env, tmp_path: Path) -> None:
    (tmp_path / "up" / "a" / "b").mkdir(parents=True)
    (tmp_path / "up" / "a" / "b" / "c").write_bytes(b"deep")
    (tmp_path / "up" / "top").write_bytes(b"")
    s3.upload_tree(tmp_path / "up", "p/q")
    assert s3.keys("p/") == {
        "p/q/a/b/c": (4, '"' + hashlib.md5(b"deep").hexdigest() + '"'),
        "p/q/top": (0, '"' + hashlib.md5(b"").hexdigest() + '"'),
    }
    s3.download_tree("p/q", tmp_path / "down")
    assert (tmp_path / "down" / "a" / "b" / "c").read_bytes() == b"deep"
    assert (tmp_path / "down" / "top").read_bytes() == b""
    assert s3.proxy.counts() == Counter()  # the helpers go straight to moto


def test_delay_holds_every_request(s3: S3Env) -> None:
    c = s3.client()
    s3.put("k", b"v")
    s3.proxy.delay(0.1)
    start = time.monotonic()
    for _ in range(3):
        c.head_object(Bucket=s3.bucket, Key="k")
    assert time.monotonic() - start >= 0.3
    s3.proxy.delay(0)
    start = time.monotonic()
    c.head_object(Bucket=s3.bucket, Key="k")
    assert time.monotonic() - start < 0.1


def test_fail_answers_an_s3_error_then_lets_requests_through(s3: S3Env) -> None:
    c = s3.client(**NO_RETRIES)
    s3.put("d/k", b"v")
    rule = s3.proxy.fail(503, method="GET", key=r"^d/", count=2)
    internal = s3.proxy.fail(500, method="PUT")
    for _ in range(2):
        with pytest.raises(ClientError) as excinfo:
            c.get_object(Bucket=s3.bucket, Key="d/k")
        assert error_of(excinfo) == (503, "SlowDown")
    assert c.get_object(Bucket=s3.bucket, Key="d/k")["Body"].read() == b"v"
    with pytest.raises(ClientError) as excinfo:
        c.put_object(Bucket=s3.bucket, Key="d/k", Body=b"w" * 100_000)
    assert error_of(excinfo) == (500, "InternalError")
    assert s3.get("d/k") == b"v"  # never forwarded
    assert (rule.hits, internal.hits) == (2, 1)
    assert [status for *_, status in s3.proxy.log()] == [503, 503, 200, 500]
    # With boto3's own retries the client gets past a SlowDown.
    s3.proxy.fail(503, method="HEAD")
    s3.client(retries={"mode": "standard", "max_attempts": 3}).head_object(
        Bucket=s3.bucket, Key="d/k"
    )


def test_truncated_body_fails_the_read(s3: S3Env) -> None:
    c = s3.client(**NO_RETRIES)
    s3.put("big", bytes(range(256)) * 4096)
    s3.proxy.truncate(method="GET", key="big", range=False)
    with pytest.raises(ResponseStreamingError):
        c.get_object(Bucket=s3.bucket, Key="big")["Body"].read()
    assert c.get_object(Bucket=s3.bucket, Key="big")["Body"].read() == bytes(range(256)) * 4096


def test_slow_answer_times_the_client_out_but_takes_effect(s3: S3Env) -> None:
    c = s3.client(read_timeout=0.3, **NO_RETRIES)
    s3.proxy.slow(5, method="PUT", key="k")
    with pytest.raises(ReadTimeoutError):
        c.put_object(Bucket=s3.bucket, Key="k", Body=b"late")
    assert s3.get("k") == b"late"
    c.put_object(Bucket=s3.bucket, Key="k", Body=b"on time")


def test_before_hook_replaces_an_object_between_two_reads(s3: S3Env) -> None:
    c = s3.client()
    s3.put("shard", b"old contents")
    seen: list[RequestInfo] = []

    def replace(request: RequestInfo) -> None:
        seen.append(request)
        s3.put("shard", b"new contents")

    s3.proxy.before(replace, method="GET", key="shard", range=True)
    assert c.get_object(Bucket=s3.bucket, Key="shard")["Body"].read() == b"old contents"
    ranged = c.get_object(Bucket=s3.bucket, Key="shard", Range="bytes=0-2")
    assert ranged["Body"].read() == b"new"
    assert [(r.kind, r.key, r.range) for r in seen] == [("GET range", "shard", "bytes=0-2")]


def test_complete_multipart_upload_honours_if_match(s3: S3Env) -> None:
    c = s3.client(**NO_RETRIES)
    etag = s3.put("k", b"first")

    def complete(key: str, if_match: str) -> dict:
        upload = c.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
        part = c.upload_part(Bucket=s3.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"2")
        parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
        return c.complete_multipart_upload(
            Bucket=s3.bucket, Key=key, UploadId=upload, MultipartUpload=parts, IfMatch=if_match
        )

    with pytest.raises(ClientError) as excinfo:
        complete("k", '"0123456789abcdef0123456789abcdef"')
    assert error_of(excinfo) == (412, "PreconditionFailed")
    with pytest.raises(ClientError) as excinfo:
        complete("missing", etag)
    assert error_of(excinfo) == (404, "NoSuchKey")
    assert s3.get("k") == b"first"
    complete("k", etag)
    assert s3.get("k") == b"2"


def test_upload_part_copy_honours_copy_source_if_match(s3: S3Env) -> None:
    c = s3.client(**NO_RETRIES)
    etag = s3.put("src", b"source")
    upload = c.create_multipart_upload(Bucket=s3.bucket, Key="dst")["UploadId"]
    copy = dict(Bucket=s3.bucket, Key="dst", UploadId=upload, PartNumber=1)
    with pytest.raises(ClientError) as excinfo:
        c.upload_part_copy(**copy, CopySource=f"{s3.bucket}/src", CopySourceIfMatch='"0"')
    assert error_of(excinfo) == (412, "PreconditionFailed")
    with pytest.raises(ClientError) as excinfo:
        c.upload_part_copy(**copy, CopySource=f"{s3.bucket}/gone", CopySourceIfMatch=etag)
    assert error_of(excinfo) == (404, "NoSuchKey")
    c.upload_part_copy(**copy, CopySource=f"{s3.bucket}/src", CopySourceIfMatch=etag)


def test_uploads_are_listed_with_when_they_began(s3: S3Env) -> None:
    c = s3.client()
    c.create_multipart_upload(Bucket=s3.bucket, Key="through/the/proxy")
    s3.admin.create_multipart_upload(Bucket=s3.bucket, Key="behind/its/back")
    time.sleep(0.01)
    first = c.list_multipart_uploads(Bucket=s3.bucket)["Uploads"]
    assert len(first) == 2
    for upload in first:  # moto says 2010-11-10 for all
        assert datetime.now(UTC) - upload["Initiated"] < timedelta(seconds=10)
    again = c.list_multipart_uploads(Bucket=s3.bucket)["Uploads"]
    assert [u["Initiated"] for u in again] == [u["Initiated"] for u in first]
    assert first[0]["Initiated"] != first[1]["Initiated"]


def test_conditional_puts_on_one_key_have_one_winner(s3: S3Env) -> None:
    c = s3.client(**NO_RETRIES, max_pool_connections=32)
    results: list[int] = []
    barrier = threading.Barrier(32)

    def create(n: int) -> None:
        barrier.wait()
        try:
            c.put_object(Bucket=s3.bucket, Key="lock", Body=b"%d" % n, IfNoneMatch="*")
            results.append(n)
        except ClientError as error:
            assert error.response["Error"]["Code"] == "PreconditionFailed"

    threads = [threading.Thread(target=create, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 1
    assert s3.get("lock") == b"%d" % results[0]


def test_chunked_request_body_is_forwarded_whole(s3: S3Env) -> None:
    conn = http.client.HTTPConnection(urlsplit(s3.endpoint).netloc)
    chunks = iter([b"abc", b"defg"])
    conn.request("PUT", f"/{s3.bucket}/chunked", body=chunks, encode_chunked=True)
    assert conn.getresponse().status == 200
    assert s3.get("chunked") == b"abcdefg"


def test_zarr_python_writes_and_reads_through_the_proxy(s3: S3Env) -> None:
    data = np.arange(64, dtype="int32").reshape(8, 8)
    array = zarr.create_array(s3.zarr_store("z"), name="a", shape=(8, 8), chunks=(4, 4), dtype="i4")
    array[...] = data
    assert sorted(s3.keys("z/a/c/")) == [f"z/a/c/{i}/{j}" for i in (0, 1) for j in (0, 1)]
    s3.proxy.reset_counts()
    read = zarr.open_array(s3.zarr_store("z", read_only=True), path="a")
    assert np.array_equal(read[...], data)
    assert s3.proxy.counts()["GET"] >= 4


def test_tensorstore_writes_and_reads_through_the_proxy(s3: S3Env) -> None:
    spec = {
        "driver": "zarr3",
        "kvstore": s3.tensorstore_kvstore("ts/a"),
        "metadata": {
            "shape": [8, 8],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
            "data_type": "int32",
        },
    }
    data = np.arange(64, dtype="int32").reshape(8, 8)
    ts.open(spec, create=True).result().write(data).result()
    assert "ts/a/c/1/1" in s3.keys("ts/")
    s3.proxy.reset_counts()
    assert np.array_equal(ts.open(spec).result().read().result(), data)
    assert s3.proxy.counts()["GET"] >= 5
    kv = ts.KvStore.open(s3.tensorstore_kvstore("ts")).result()
    assert kv.read("a/zarr.json", byte_range=slice(0, 1)).result().value == b"{"
    assert s3.proxy.counts()["GET range"] == 1


def test_obstore_through_the_proxy(s3: S3Env) -> None:
    store = s3.obstore("o")
    obstore.put(store, "x", b"0123456789")
    assert bytes(obstore.get_range(store, "x", start=2, end=5)) == b"234"
    assert [item["path"] for item in obstore.list(store).collect()] == ["x"]
    obstore.delete(store, "x")  # sent as DeleteObjects, which counts as "other"
    assert s3.keys() == {}
    assert s3.proxy.counts() == Counter(["PUT", "GET range", "LIST", "other"])
