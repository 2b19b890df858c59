"""The metrics server (`shardfs.fuse.metrics.MetricsServer`) without a mount: it answers a
scrape in the format asked for, and stays within its bounds whatever clients do: connections
held idle beyond its cap are closed (the oldest first) and keep no scraper out, a request
trickled slowly is closed at its timeout, a request too large is refused before more of it
is read, scrapes asked back to back are spaced, and none of it costs a thread."""

from __future__ import annotations

import gzip
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardfs.fuse.metrics import PAUSE, Latency, MetricsServer
from shardfs.primitives.errors import ShardfsError
from shardfs.storage import descriptors as descriptors_module
from shardfs.storage.descriptors import DescriptorPool

#: What `Operations.stats()` gives, as little of it as the collector reads.
STATS: dict[str, Any] = {
    "fuse": {"requests": {"read": 7}, "errors": {}},
    "source": {"requests": {}, "bytes_read": 0, "bytes_written": 0, "retries": 0, "errors": {}},
    "caches": {},
}


@contextmanager
def serving(**bounds: Any) -> Iterator[MetricsServer]:
    server = MetricsServer(("127.0.0.1", 0), lambda: STATS, Latency(), **bounds)
    try:
        yield server
    finally:
        server.stop()


def get(server: MetricsServer, path: str = "/metrics", **headers: str) -> tuple[Any, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers, answer.read()


def reads(text: bytes) -> float:
    families = text_string_to_metric_families(text.decode())
    return next(
        s.value for f in families for s in f.samples if s.name == "shardfs_fuse_requests_total"
    )


def idle(server: MetricsServer) -> socket.socket:
    """A connection that sends half a request line and then nothing."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /metrics HTT")
    return sock


def closed_by_server(sock: socket.socket, wait: float = 0.0) -> bool:
    """Whether the server closed `sock` (its data unread or not) within `wait` seconds."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except (BlockingIOError, TimeoutError):
        return False
    except ConnectionResetError:
        return True


def test_a_scrape_is_answered_in_the_format_asked_for() -> None:
    with serving() as server:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        headers, text = get(server)
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert reads(text) == 7
        headers, body = get(server, "/", **{"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip" and reads(gzip.decompress(body)) == 7
        headers, body = get(server, Accept="application/openmetrics-text; version=1.0.0")
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n")


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (b"GET /nothing HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"GET /metrics\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", b"400"),
        (b"\x00\xff\r\n\r\n", b"400"),
    ],
)
def test_other_requests_get_one_line(request_: bytes, status: bytes) -> None:
    with serving() as server, socket.create_connection(("127.0.0.1", server.port), 10) as sock:
        sock.sendall(request_)
        answer = b"".join(iter(lambda: sock.recv(4096), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), answer
    assert body.count(b"\n") == 1 and body.endswith(b"\n"), answer


def test_idle_connections_beyond_the_cap_are_closed_and_keep_no_scraper_out() -> None:
    """Under a cap of 4, of 100 connections held idle the 96 oldest are closed at once, and
    a scrape is answered (closing one more); the server never started a thread for them."""
    threads = threading.active_count()
    with serving(connections=4, timeout=30) as server:
        held = [idle(server) for _ in range(100)]
        try:
            assert all(closed_by_server(sock, 10) for sock in held[:96])
            assert reads(get(server)[1]) == 7
            assert closed_by_server(held[96], 10)
            assert [closed_by_server(sock) for sock in held[97:]] == [False] * 3
            assert threading.active_count() == threads + 1
        finally:
            for sock in held:
                sock.close()


def test_connections_closed_for_the_cap_in_the_round_that_saw_them_are_let_be() -> None:
    """While a scrape holds the server up, four connections come and the four idle ones
    send more: at the next select, the new ones close the idle ones (cap 5, the scrape's
    the fifth), whose data is then not read from a closed socket (before: the server's
    thread died of it, and the scrape was never answered)."""
    busy, go = threading.Event(), threading.Event()

    def held_up() -> dict[str, Any]:
        busy.set()
        go.wait(10)
        return STATS

    server = MetricsServer(("127.0.0.1", 0), held_up, Latency(), connections=5, timeout=30)
    scraped: list[bytes] = []
    scraper = threading.Thread(target=lambda: scraped.append(get(server)[1]))
    try:
        old = [idle(server) for _ in range(4)]
        scraper.start()
        assert busy.wait(10)
        new = [socket.create_connection(("127.0.0.1", server.port), 10) for _ in range(4)]
        for sock in old:
            sock.sendall(b"P/1.1\r\n")
        go.set()
        scraper.join(15)
        assert reads(scraped[0]) == 7
        assert all(closed_by_server(sock, 10) for sock in old)
        assert reads(get(server)[1]) == 7
        for sock in old + new:
            sock.close()
    finally:
        go.set()
        server.stop()


def test_a_request_trickled_in_is_closed_at_its_timeout() -> None:
    """A byte every 50 ms does not keep a connection: it is closed `timeout` after its
    accept."""
    with serving(timeout=0.3) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        start = time.monotonic()
        with sock:
            for byte in b"GET /metrics HTTP/1.1\r\nUser-Agent: " + b"x" * 200:
                with suppress(OSError):
                    sock.send(bytes([byte]))
                if select.select([sock], [], [], 0.05)[0] and closed_by_server(sock):
                    break
            else:
                pytest.fail("the connection was never closed")
        assert 0.3 <= time.monotonic() - start < 2


def test_a_request_too_large_is_refused_before_more_of_it_is_read() -> None:
    with serving(request_bytes=1024) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Long: " + b"x" * 1100)
            answer = b"".join(iter(lambda: sock.recv(4096), b""))
        assert answer.startswith(b"HTTP/1.1 431 "), answer
        assert answer.endswith(b"a request line and headers of at most 1024 bytes\n")
        assert reads(get(server)[1]) == 7


def test_scrapes_back_to_back_are_spaced() -> None:
    """A scrape that takes 20 ms makes the next one wait `PAUSE` times as long."""

    def slow() -> dict[str, Any]:
        time.sleep(0.02)
        return STATS

    server = MetricsServer(("127.0.0.1", 0), slow, Latency())
    try:
        get(server)
        start = time.monotonic()
        get(server)
        assert time.monotonic() - start >= 0.02 * PAUSE
    finally:
        server.stop()


def test_a_port_taken_is_one_line() -> None:
    with serving() as server, pytest.raises(ShardfsError) as raised:
        MetricsServer(("127.0.0.1", server.port), lambda: STATS, Latency())
    assert str(raised.value) == (
        f"metrics: cannot listen on 127.0.0.1:{server.port}: Address already in use"
    )


def test_its_descriptors_are_set_aside_from_the_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shares set aside add up (the native front's, the metrics server's), and leave the
    pins at least half of the budget."""
    monkeypatch.setattr(descriptors_module, "budget", lambda: 100)
    pool = DescriptorPool(lambda stat: stat.st_ino)
    assert pool.reserve(25) == 25 and pool.reserve(20) == 20
    assert pool.limit() == 55
    assert pool.reserve(10) == 5 and pool.limit() == 50
