"""`-o metrics=HOST:PORT`: a live mount scraped over HTTP, the text parsed by
prometheus_client's own parser, and its counters compared with what the test did and with
`shardfs stats` of the same mount (one source of numbers, two renderings)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardfs.fuse.kernel_served.front import unavailable
from shardfs.fuse.metrics import DESCRIPTORS
from shardfs.fuse.mounts import mount_type, unmount
from shardfs.options import parse_options
from tests.conftest import one_shard_array
from tests.mounts import test_mount_descriptors as low_limit
from tests.mounts.test_stats import stats
from tests.support.s3 import free_port

#: A scrape: value by (sample name, sorted labels).
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(figures: Scrape, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled sample not exported yet (a counter never moved)."""
    key = (name, tuple(sorted(labels.items())))
    return figures.get(key, 0.0) if labels else figures[key]


def requests(figures: Scrape, op: str) -> float:
    return value(figures, "shardfs_fuse_requests_total", op=op, served_by="python")


@pytest.mark.fuse
def test_a_scrape_counts_what_the_mount_did_as_shardfs_stats_does(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    one_shard_array(source, "a", (64, 64), (16, 16), 3)  # 16 chunk files of 256 bytes
    port = free_port()
    # Python serves every request here (what the front answers: the next test).
    mounted = mount(source, "ro", "front=no", f"metrics=127.0.0.1:{port}")
    assert f"metrics at http://127.0.0.1:{port}/metrics" in mounted.log()
    before = scrape(port)
    chunks = [mounted.path / "a" / "c" / str(i) / str(j) for i in range(4) for j in range(4)]
    for chunk in chunks:
        assert chunk.read_bytes() == b"\x03" * 256
    assert not (mounted.path / "nothing").exists()
    after = scrape(port)
    figures = stats(mounted)
    again = scrape(port)

    assert requests(after, "read") - requests(before, "read") == len(chunks)
    assert requests(after, "lookup") - requests(before, "lookup") >= len(chunks)
    errors = "shardfs_fuse_errors_total"
    assert value(after, errors, errno="ENOENT") - value(before, errors, errno="ENOENT") == 1
    # The same counters both ways: nothing between the scrapes looks anything up or reads.
    fuse = figures["fuse"]
    for op in ("lookup", "read"):
        assert requests(after, op) == fuse["requests"][op] == requests(again, op)
    assert value(again, errors, errno="ENOENT") == fuse["errors"]["ENOENT"]
    source_reads = value(again, "shardfs_source_requests_total", kind="read")
    assert source_reads == figures["source"]["requests"]["read"] > 0
    assert value(again, "shardfs_source_read_bytes_total") == figures["source"]["bytes_read"]
    index = figures["caches"]["shard indexes"]
    assert value(again, "shardfs_cache_misses_total", cache="shard indexes") == index["misses"]
    assert value(again, "shardfs_cache_hits_total", cache="shard indexes") == index["hits"]
    assert value(again, "shardfs_cache_budget_bytes", cache="shard indexes") == 64 << 20
    # Python served every read: each was timed.
    timed = value(again, "shardfs_fuse_request_duration_seconds_count", op="read")
    assert timed == requests(again, "read")
    inf = value(again, "shardfs_fuse_request_duration_seconds_bucket", op="read", le="+Inf")
    assert inf == timed and value(again, "shardfs_fuse_request_duration_seconds_sum", op="read")
    # A kernel-served mount keeps versions, each a descriptor of the pins' pool.
    kept = fuse["kept"]
    assert value(again, "shardfs_kept_versions") == kept["versions"] >= 1
    descriptors = figures["source"]["descriptors"]
    assert value(again, "shardfs_descriptors_open") == descriptors["open"] >= 1
    assert value(again, "shardfs_process_resident_memory_bytes") > 10 << 20
    assert not any("/" in label for _, labels in again for _, label in labels), "no paths"


@pytest.mark.fuse
@pytest.mark.skipif(unavailable() is not None, reason=f"no native front: {unavailable()}")
def test_the_native_fronts_answers_are_counted_not_timed(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    one_shard_array(source, "a", (64, 64), (16, 16), 3)
    port = free_port()
    mounted = mount(source, "ro", "front=yes", f"metrics={port}")
    held = []  # the kernel keeps the files' inodes, and the front their rows, whoever
    try:  # drops the kernel's caches meanwhile
        for i in range(4):
            for j in range(4):
                path = mounted.path / "a" / "c" / str(i) / str(j)
                held.append(os.open(path, os.O_PATH))
                assert path.read_bytes() == b"\x03" * 256
        figures = scrape(port)
        front = stats(mounted)["fuse"]["front"]
    finally:
        for fd in held:
            os.close(fd)
    native = "shardfs_fuse_requests_total"
    for op in ("lookup", "read"):
        assert value(figures, native, op=op, served_by="native") == front["answered"][op]
    assert value(figures, native, op="lookup", served_by="native") >= 1, front
    served = requests(figures, "read") + value(figures, native, op="read", served_by="native")
    assert served == 16
    timed = value(figures, "shardfs_fuse_request_duration_seconds_count", op="read")
    assert timed == requests(figures, "read"), "only what Python answers is timed"
    rows = value(figures, "shardfs_native_table_entries", table="rows")
    assert rows == front["rows"] >= 1


@pytest.mark.fuse
def test_commits_are_exported_until_the_unmount(tmp_path: Path, mount) -> None:
    source = tmp_path / "src"
    one_shard_array(source, "a", (64, 64), (16, 16), 1)
    port = free_port()
    mounted = mount(source, f"metrics={port}", "flush_interval=0.1")  # no host: 127.0.0.1
    (mounted.path / "a" / "c" / "0" / "1").write_bytes(b"\x08" * 256)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        figures = scrape(port)
        if value(figures, "shardfs_commit_chunks_total") >= 1:
            break
        time.sleep(0.05)
    assert value(figures, "shardfs_commit_chunks_total") == 1
    assert value(figures, "shardfs_commit_bytes_total") == 256
    assert requests(figures, "write") >= 1
    assert value(figures, "shardfs_source_written_bytes_total") >= 256
    mounted.stop()
    with pytest.raises(OSError):  # the server stopped with the mount
        scrape(port)


@contextlib.contextmanager
def idle_connections(port: int, count: int, within: float = 10) -> Iterator[list[socket.socket]]:
    """`count` connections to `port` (fewer if they do not all connect within `within`
    seconds), each having sent half a request line and then nothing, held open meanwhile
    (this process's soft RLIMIT_NOFILE raised for them)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + within
        while len(held) < count and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=left))
                held[-1].send(b"GET /metrics HTTP/1.1\r\n")  # (it may be closed already)
        yield held
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.fuse
def test_a_thousand_idle_connections_leave_reads_and_scrapes_alone(tmp_path: Path) -> None:
    """A daemon under RLIMIT_NOFILE 256: 1,000 connections to its metrics port held idle
    cost it at most the metrics' descriptors, set aside from its pins', and every chunk file
    then reads and a scrape answers (before: a thread and a descriptor each, and every read
    failed with EIO, "Too many open files")."""
    data = low_limit.make_source(tmp_path / "src", shards=100)
    port = free_port()
    with low_limit.limited_mount(tmp_path / "src", tmp_path, "ro", f"metrics={port}") as mounted:
        before = len(low_limit.descriptors(mounted.process.pid))
        with idle_connections(port, 1000) as held:
            assert len(held) == 1000, "the server keeps taking connections"
            during = len(low_limit.descriptors(mounted.process.pid))
            for i in range(200):
                assert (mounted.path / "c" / str(i)).read_bytes() == low_limit.chunk(data, i)
            figures = scrape(port)
    assert during <= before + DESCRIPTORS
    assert value(figures, "shardfs_descriptors_limit") <= 192 - DESCRIPTORS  # (at 256: 192)
    assert value(figures, "shardfs_fuse_errors_total", errno="EIO") == 0


def _mount_line(source: Path, mountpoint: Path, option: str) -> subprocess.CompletedProcess[str]:
    """`shardfs mount` (detached, as users run it) that is expected to refuse."""
    mountpoint.mkdir(exist_ok=True)
    try:
        return subprocess.run(
            [sys.executable, "-m", "shardfs", "mount", str(source), str(mountpoint), "-o", option],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if mount_type(str(mountpoint)) is not None:  # refused, or the test fails: no mount left
            unmount(str(mountpoint), lazy=True)


@pytest.mark.fuse
@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("nowhere", "option metrics needs HOST:PORT, :PORT or PORT"),
        ("::1:9464", "an IPv6 host in brackets: [::1]:PORT"),
        ("127.0.0.1:0", "option metrics: port 0 is not from 1 to 65535"),
        ("127.0.0.1:", "option metrics needs HOST:PORT"),
    ],
)
def test_a_bad_address_is_refused_in_one_line(tmp_path: Path, address: str, said: str) -> None:
    one_shard_array(tmp_path / "src", "a", (16, 16), (16, 16), 1)
    done = _mount_line(tmp_path / "src", tmp_path / "mnt", f"ro,metrics={address}")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert mount_type(str(tmp_path / "mnt")) is None


@pytest.mark.fuse
def test_a_busy_port_is_refused_in_one_line_before_mounting(tmp_path: Path) -> None:
    one_shard_array(tmp_path / "src", "a", (16, 16), (16, 16), 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _mount_line(tmp_path / "src", tmp_path / "mnt", f"ro,metrics=127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"shardfs: cannot mount {tmp_path / 'mnt'}: metrics: cannot listen on "
        f"127.0.0.1:{port}: Address already in use"
    ]
    assert mount_type(str(tmp_path / "mnt")) is None


def test_the_address_forms() -> None:
    """Off by default; an address without a host is 127.0.0.1's."""
    assert parse_options(["ro"]).metrics is None
    assert parse_options(["metrics=9464"]).metrics == ("127.0.0.1", 9464)
    assert parse_options(["metrics=[::1]:9464"]).metrics == ("::1", 9464)
    assert parse_options(["metrics=localhost:9464"]).metrics == ("localhost", 9464)
