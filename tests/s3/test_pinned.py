"""Mounts pinned to one version of every object: `-o manifest=FILE` and `-o as_of=TIMESTAMP`.

On moto with versioning enabled, zarr-python 3 writes a sharded array, `shardfs manifest`
pins it, zarr-python overwrites it (a shard rewritten, one deleted, new ones added) and a
read-write mount rewrites it again. The pinned mounts must still read the first state, in
both views (v3 with zarr-python 3, v2 with zarr-python 2.18); `as_of` between the writes
reads that time's state; and the checksum of the pinned source is the manifest's.
"""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr_checksum import compute_zarr_checksum
from zarr_checksum.generators import ZarrArchiveFile

from tests.conftest import Mounted
from tests.support.s3 import RequestInfo, S3Env
from tests.support.zarr2 import Zarr2

pytestmark = [pytest.mark.fuse]

SHAPE = (8, 8)
FIELDS = ["versionId", "lastModified", "size", "ETag"]


def shardfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardfs", *args], capture_output=True, text=True, timeout=120
    )


def delete_everything(client: Any, bucket: str) -> None:
    """Every version and delete marker, so that the bucket can be removed."""
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        found = [*page.get("Versions", ()), *page.get("DeleteMarkers", ())]
        if found:
            objects = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in found]
            client.delete_objects(Bucket=bucket, Delete={"Objects": objects})


@pytest.fixture
def versioned(s3: S3Env) -> Iterator[S3Env]:
    """The test's bucket with versioning on; emptied of every version at teardown."""
    s3.admin.put_bucket_versioning(Bucket=s3.bucket, VersioningConfiguration={"Status": "Enabled"})
    yield s3
    delete_everything(s3.admin, s3.bucket)


def next_second() -> int:
    """Wait until the clock is in a later whole second than now (S3 keeps LastModified in
    whole seconds); the second that ended, which every earlier write is at or before."""
    done = int(time.time())
    time.sleep(done + 1.05 - time.time())
    return done


def latest(s3: S3Env, prefix: str) -> dict[str, dict[str, Any]]:
    """The current version of every object below `prefix`, by key below it."""
    found = {}
    for page in s3.admin.get_paginator("list_object_versions").paginate(
        Bucket=s3.bucket, Prefix=prefix + "/"
    ):
        for version in page.get("Versions", ()):
            if version["IsLatest"]:
                found[version["Key"][len(prefix) + 1 :]] = version
    return found


def spec_manifest(versions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A manifest as doc/design/zarr-manifests.md of dandi-archive specifies it, written here
    from the listing (not by `shardfs manifest`), with the checksum of `zarr_checksum`."""
    entries: dict[str, Any] = {}
    for key, version in sorted(versions.items()):
        *directories, name = key.split("/")
        node = entries
        for directory in directories:
            node = node.setdefault(directory, {})
        node[name] = [
            version["VersionId"],
            version["LastModified"].strftime("%Y-%m-%dT%H:%M:%S+00:00"),
            version["Size"],
            version["ETag"].strip('"'),
        ]
    files = [
        ZarrArchiveFile(path=Path(key), size=v["Size"], digest=v["ETag"].strip('"'))
        for key, v in versions.items()
    ]
    return {
        "schemaVersion": 2,
        "fields": FIELDS,
        "statistics": {
            "entries": len(versions),
            "depth": max(key.count("/") for key in versions),
            "totalSize": sum(v["Size"] for v in versions.values()),
            "lastModified": max(v["LastModified"] for v in versions.values()).isoformat(),
            "zarrChecksum": str(compute_zarr_checksum(files)),
        },
        "entries": entries,
    }


def read_v3(mounted: Mounted) -> np.ndarray:
    return np.asarray(zarr.open_array(mounted.path / "a", mode="r")[...])


def test_pinned_mounts_read_the_version_they_name(
    versioned: S3Env, mount, zarr2: Zarr2, tmp_path: Path
) -> None:
    s3 = versioned
    options = ",".join(s3.mount_options())
    first = np.arange(1, 65, dtype="int32").reshape(SHAPE)
    group = zarr.open_group(s3.zarr_store("z", direct=True), mode="w")
    array = group.create_array(
        "a", shape=SHAPE, dtype="int32", chunks=(2, 2), shards=(4, 4), fill_value=0,
        compressors=None,
    )  # fmt: skip
    array[...] = first
    pinned = latest(s3, "z")
    assert sum("/c/" in key for key in pinned) == 4
    made = shardfs("manifest", s3.url("z"), "-o", options, "--output", str(tmp_path / "m1.json"))
    assert made.returncode == 0, made.stderr
    written = json.loads((tmp_path / "m1.json").read_text())
    spec = spec_manifest(pinned)
    (tmp_path / "spec.json").write_text(json.dumps(spec, indent=1))
    assert written["schemaVersion"] == 2 and written["fields"] == FIELDS
    assert written["statistics"] == {
        **spec["statistics"],
        "lastModified": written["statistics"]["lastModified"],
    }
    assert written["entries"] == spec["entries"]
    t1 = next_second()

    # zarr-python overwrites: shard (0, 0) rewritten, (1, 1) emptied (deleted), two new.
    second = np.zeros((8, 12), dtype="int32")
    second[:, :8] = first
    second[:4, :4] = -first[:4, :4]
    second[4:, 4:8] = 0
    second[:, 8:] = 1000 + np.arange(32, dtype="int32").reshape((8, 4))
    array.resize((8, 12))
    array[...] = second
    now = latest(s3, "z")
    assert "a/c/1/1" not in now and {"a/c/0/2", "a/c/1/2"} <= set(now)
    t2 = next_second()

    # ... and a read-write mount rewrites shard (1, 0).
    writer = mount(s3.url("z"), *s3.mount_options())
    zarr.open_array(writer.path / "a", mode="r+")[4:6, 0:2] = 99
    writer.stop()
    assert latest(s3, "z")["a/c/1/0"]["VersionId"] != now["a/c/1/0"]["VersionId"]

    seen: list[RequestInfo] = []
    s3.proxy.before(seen.append, count=None)
    s3.proxy.reset_counts()
    by_spec = mount(s3.url("z"), *s3.mount_options(), f"manifest={tmp_path / 'spec.json'}")
    np.testing.assert_array_equal(read_v3(by_spec), first)
    assert s3.proxy.counts()["LIST"] == 0, s3.proxy.log()
    gets = [request for request in seen if request.method == "GET" and request.key]
    assert gets and all(
        request.query.get("versionId") == [pinned[request.key[2:]]["VersionId"]] for request in gets
    ), [(request.key, request.query) for request in gets]
    assert {request.kind for request in seen} <= {"GET", "GET range"}, seen
    assert "does not add up" not in by_spec.log() and "not to its zarrChecksum" not in by_spec.log()
    v2 = mount(s3.url("z"), *s3.mount_options(), f"manifest={tmp_path / 'm1.json'}", "view=v2")
    got = zarr2.run(
        "import zarr\nprint(json.dumps(zarr.open_array(params['path'], mode='r')[...].tolist()))",
        path=str(v2.path / "a"),
    )
    np.testing.assert_array_equal(np.array(got, dtype="int32"), first)
    at_first = mount(
        s3.url("z"),
        *s3.mount_options(),
        f"as_of={time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t1))}",
    )
    np.testing.assert_array_equal(read_v3(at_first), first)
    at_second = mount(
        s3.url("z"),
        *s3.mount_options(),
        f"as_of={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t2))}",
    )
    np.testing.assert_array_equal(read_v3(at_second), second)

    checksum = shardfs("checksum", s3.url("z"), "-o", f"{options},manifest={tmp_path / 'm1.json'}")
    assert checksum.returncode == 0, checksum.stderr
    assert checksum.stdout.strip() == written["statistics"]["zarrChecksum"]


def test_a_version_gone_is_eio_on_its_file_only(versioned: S3Env, mount, tmp_path: Path) -> None:
    s3 = versioned
    data = np.arange(1, 65, dtype="int32").reshape(SHAPE)
    group = zarr.open_group(s3.zarr_store("z", direct=True), mode="w")
    array = group.create_array(
        "a", shape=SHAPE, dtype="int32", chunks=(2, 2), shards=(4, 4), fill_value=0,
        compressors=None,
    )  # fmt: skip
    array[...] = data
    (tmp_path / "m.json").write_text(json.dumps(spec_manifest(latest(s3, "z"))))
    gone = latest(s3, "z")["a/c/1/1"]["VersionId"]
    array[4:, 4:] = 7  # a new version of shard (1, 1); the pinned one then goes
    s3.admin.delete_object(Bucket=s3.bucket, Key="z/a/c/1/1", VersionId=gone)
    mounted = mount(s3.url("z"), *s3.mount_options(), f"manifest={tmp_path / 'm.json'}")
    for _ in range(2):
        with pytest.raises(OSError) as caught:
            (mounted.path / "a" / "c" / "2" / "2").read_bytes()
        assert caught.value.errno == errno.EIO
    assert (mounted.path / "a" / "c" / "0" / "0").read_bytes() == data[:2, :2].tobytes()
    lines = [line for line in mounted.log().splitlines() if gone in line]
    assert len(lines) == 1 and "z/a/c/1/1" in lines[0], mounted.log()


def refused(*args: str) -> str:
    """The one line `shardfs` refused `args` with (exit status 2)."""
    done = shardfs(*args)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_bad_pinning_is_refused_in_one_line(versioned: S3Env, mount, tmp_path: Path) -> None:
    s3 = versioned
    s3.put("z/zarr.json", b'{"zarr_format": 3, "node_type": "group"}')
    url, where = s3.url("z"), str(tmp_path / "mnt")
    (tmp_path / "mnt").mkdir()
    options = ",".join(s3.mount_options())
    good = spec_manifest(latest(s3, "z"))

    def manifest(name: str, content: str | dict[str, Any]) -> str:
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return f"{options},manifest={path}"

    outside = {**good, "entries": {"..": {"zarr.json": good["entries"]["zarr.json"]}}}
    # An integer Python does not convert, which ijson raises as it reads a file (as a
    # ValueError or within a SystemError); tests/formats/test_dandi_manifest.py has the rest.
    digits = json.dumps({**good, "entries": {"a": ["v", "2024-01-01T00:00:00Z", 0, "e"]}})
    digits = digits.replace(", 0, ", f", {'9' * 100_000}, ")
    for given, expected in [
        (manifest("digits.json", digits), "Exceeds the limit (4300 digits)"),
        (manifest("bad.json", '{"fields": ['), "not valid JSON"),
        (manifest("fields.json", {**good, "fields": ["versionId", "size"]}), "lacks ETag"),
        (manifest("outside.json", outside), "'..'"),
        (
            manifest("slash.json", {**good, "entries": {"/etc": good["entries"]["zarr.json"]}}),
            "'/etc'",
        ),
        (f"{options},manifest={tmp_path / 'missing.json'}", "No such file"),
        (f"{options},as_of=2001-01-01T00:00:00", "no object of its prefix existed at 2001"),
        (f"{options},as_of=yesterday", "ISO 8601"),
        (f"{options},as_of=2001-01-01,rw", "mount ro"),
    ]:
        assert expected in refused("mount", url, where, "-o", given), given
    assert "for S3 sources" in refused("mount", str(tmp_path), where, "-o", "as_of=2001-01-01")

    # A bucket that never had versioning: its objects carry the version id "null".
    plain = f"test-{uuid.uuid4().hex[:20]}"
    s3.admin.create_bucket(Bucket=plain)
    try:
        s3.admin.put_object(Bucket=plain, Key="z/zarr.json", Body=b"{}")
        line = refused("mount", f"s3://{plain}/z", where, "-o", f"{options},as_of=2100-01-01")
        assert "carry no version ids" in line
        assert "carry no version ids" in refused("manifest", f"s3://{plain}/z", "-o", options)
    finally:
        delete_everything(s3.admin, plain)
        s3.admin.delete_bucket(Bucket=plain)

    # A manifest whose entries do not add up to its zarrChecksum: one line, and it mounts.
    wrong = {**good, "statistics": {**good["statistics"], "zarrChecksum": "0" * 32 + "-1--1"}}
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    mounted = mount(url, *s3.mount_options(), f"manifest={tmp_path / 'wrong.json'}")
    assert json.loads((mounted.path / "zarr.json").read_bytes())["node_type"] == "group"
    assert mounted.log().count("not to its zarrChecksum") == 1, mounted.log()


def test_a_manifest_is_fetched_from_s3_and_over_http(
    versioned: S3Env, mount, tmp_path: Path
) -> None:
    """`manifest=` takes an s3:// URL (reached as the source is) and an http(s):// URL; a
    body longer than it announced, or past the bound, is cut off (`storage.pinned._Bounded`)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    s3 = versioned
    s3.put("z/zarr.json", b'{"zarr_format": 3, "node_type": "group", "attributes": {"v": 1}}')
    manifest = json.dumps(spec_manifest(latest(s3, "z")))
    s3.put("z/zarr.json", b'{"zarr_format": 3, "node_type": "group", "attributes": {"v": 2}}')
    s3.put("manifests/m.json", manifest.encode())
    (tmp_path / "mnt").mkdir()
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "m.json").write_text(manifest)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        http = f"http://127.0.0.1:{server.server_address[1]}/m.json"
        for location in (s3.url("manifests/m.json"), http):
            mounted = mount(s3.url("z"), *s3.mount_options(), f"manifest={location}")
            assert json.loads((mounted.path / "zarr.json").read_bytes())["attributes"] == {"v": 1}
            mounted.stop()
        missing = refused(
            "mount", s3.url("z"), str(tmp_path / "mnt"), "-o",
            ",".join([*s3.mount_options(), f"manifest={http}x"]),
        )  # fmt: skip
        assert "HTTP 404" in missing
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_manifest_past_the_bound_is_cut_off_while_read(tmp_path: Path) -> None:
    import io

    from shardfs.primitives.errors import UsageError
    from shardfs.storage.pinned import _Bounded

    stream = _Bounded(io.BytesIO(b"x" * 100), 64, "m.json")
    assert stream.read(60) == b"x" * 60
    with pytest.raises(UsageError, match="bigger than 64 bytes"):
        stream.read(60)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key, and the key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_a_manifest_is_fetched_over_https(
    versioned: S3Env, mount, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An https:// manifest is fetched with the system's trust (here SSL_CERT_FILE, which the
    default SSL context reads); a server whose certificate is not trusted is refused in one
    line naming the URL and the certificate's problem."""
    import functools
    import ssl
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    s3 = versioned
    s3.put("z/zarr.json", b'{"zarr_format": 3, "node_type": "group", "attributes": {"v": 1}}')
    manifest = json.dumps(spec_manifest(latest(s3, "z")))
    s3.put("z/zarr.json", b'{"zarr_format": 3, "node_type": "group", "attributes": {"v": 2}}')
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "m.json").write_text(manifest)
    (tmp_path / "mnt").mkdir()
    cert, key = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        https = f"https://127.0.0.1:{server.server_address[1]}/m.json"
        options = [*s3.mount_options(), f"manifest={https}"]
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the system's trust only
        line = refused("mount", s3.url("z"), str(tmp_path / "mnt"), "-o", ",".join(options))
        assert https in line and re.search("certificate is not trusted: self.signed", line), line
        assert "SSL_CERT_FILE" in line and "Traceback" not in line, line
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        mounted = mount(s3.url("z"), *options)
        assert json.loads((mounted.path / "zarr.json").read_bytes())["attributes"] == {"v": 1}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
