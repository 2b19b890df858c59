"""Prometheus metrics of a mount (`-o metrics=HOST:PORT`): the figures of `shardfs stats`,
rendered by `prometheus_client` and served over HTTP by a bounded server of our own.

Why a collector over the snapshot, and not counters of prometheus_client updated where
things happen: `shardfs stats` and the metrics must never disagree, so both read one
source of numbers, the daemon's `Operations.stats()`, each scrape taking a snapshot as
`shardfs stats` does. The only figures of the metrics alone are the latencies of the
requests Python serves (`Latency`), kept only while metrics are served.

What is exported is listed in docs/configuration.md ("Metrics"). Labels name request
kinds, caches, errnos and error kinds, never a path or a key, so their values are few
(docs/semantics.md, "Resource bounds"). The server answers anyone who can reach its
address: the metrics hold no names of files and nothing secret.
"""

from __future__ import annotations

import gzip
import logging
import os
import selectors
import socket
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from time import monotonic, perf_counter_ns
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from shardfs.primitives.errors import ShardfsError

log = logging.getLogger("shardfs")

#: The upper bounds of the latency buckets, in seconds: from a request answered from
#: memory (tens of µs) to one that waited for a slow object store.
BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
           0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_BOUNDS_NS = tuple(round(b * 1e9) for b in BUCKETS)
_LE = (*(f"{b:g}" for b in BUCKETS), "+Inf")

#: The bounds of the metrics server (docs/semantics.md, "Resource bounds"). Connections at
#: once: beyond, a new one closes the oldest still sending its request or already answered
#: (or, if every one is being answered, is closed itself), so that clients holding
#: connections idle keep no scraper out.
CONNECTIONS = 16
#: Seconds a connection has to send its request, from its accept, and then again for its
#: answer to go (its wait for its turn included): then it is closed, whatever it does.
TIMEOUT = 5.0
#: Bytes of a request's line and headers (a scraper sends a few hundred; no body is read).
REQUEST_BYTES = 8192
#: A scrape that took t is followed by the next one t * PAUSE later at the earliest: scrapes
#: take at most a tenth of the interpreter's time from the requests of the mount, however
#: fast they come.
PAUSE = 9
#: Connections not yet accepted (the kernel's queue), and accepted at a time.
BACKLOG = 128
#: Descriptors the server holds at most: the connections, and one more accepted to be
#: closed or one of /proc that `ProcessCollector` reads, the listening socket, the selector
#: and the eventfd that stops it. Set aside from the pins' budget (`Storage.reserve_descriptors`).
DESCRIPTORS = CONNECTIONS + 4


class Latency:
    """How long the requests Python serves take, by FUSE operation, in the buckets of a
    histogram. Cheap per request: a clock read, a bisection and two additions, about 0.4 µs
    where prometheus_client's `Histogram.labels(op).observe`, with its locks, takes 2.3 µs.
    Observed on the event loop only; a scrape reads it from another thread, a request or
    so behind."""

    def __init__(self) -> None:
        #: by operation: the count in each bucket (not cumulative), then the sum in ns
        self._rows: dict[str, list[int]] = {}

    def observe(self, op: str, start: int) -> None:
        """A request `op` that began at `start` (`time.perf_counter_ns`) is answered."""
        elapsed = perf_counter_ns() - start
        row = self._rows.get(op)
        if row is None:
            row = self._rows[op] = [0] * (len(_BOUNDS_NS) + 2)
        row[bisect_left(_BOUNDS_NS, elapsed)] += 1  # `le`: the first bound not below it
        row[-1] += elapsed

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "shardfs_fuse_request_duration_seconds",
            "Time to answer the FUSE requests Python serves, by operation",
            labels=["op"],
        )
        for op, row in sorted(self._rows.items()):
            counts, total = row[:-1], row[-1]  # (copied: the event loop goes on counting)
            cumulative, buckets = 0, []
            for le, n in zip(_LE, counts, strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            family.add_metric([op], buckets, total / 1e9)
        return family


def _counter(name: str, doc: str, labels: list[str], values: dict[str, Any]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for label, value in sorted(values.items()):
        family.add_metric([label], value)
    return family


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(name, doc, value=value)


def _counters(figures: dict[str, Any], table: tuple[tuple[str, str, str], ...]) -> Iterator[Metric]:
    """An unlabelled counter per row (name, key of `figures`, help) of `table`."""
    for name, key, doc in table:
        yield CounterMetricFamily(name, doc, value=figures[key])


class StatsCollector(Collector):
    """Every figure of `shardfs stats` as metric families: one `snapshot()` per scrape."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], latency: Latency) -> None:
        self._snapshot = snapshot
        self._latency = latency

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self._snapshot()
        except Exception:  # the figures are not worth the mount; the process's still come
            log.exception("metrics: the figures could not be gathered")
            return
        yield from self._fuse(stats["fuse"])
        yield self._latency.family()
        yield from self._source(stats["source"])
        yield from self._caches(stats["caches"])
        commits = stats.get("commits")
        if commits is not None:
            yield from self._commits(commits)

    @staticmethod
    def _fuse(fuse: dict[str, Any]) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "shardfs_fuse_requests",
            "FUSE requests by operation, and whether Python or the native front answered",
            labels=["op", "served_by"],
        )
        for op, n in sorted(fuse["requests"].items()):
            requests.add_metric([op, "python"], n)
        front = fuse.get("front") or {}
        for op, n in sorted(front.get("answered", {}).items()):
            requests.add_metric([op, "native"], n)
        yield requests
        yield _counter(
            "shardfs_fuse_errors", "FUSE requests answered with an error, by errno",
            ["errno"], fuse["errors"],
        )  # fmt: skip
        if "answered" in front:
            yield from _front(front)
        kept = fuse.get("kept")
        if kept is not None:
            yield _gauge("shardfs_kept_shows", "Shows the kernel may still hold", kept["shows"])
            yield _gauge(
                "shardfs_kept_shows_objects", "Object versions the kept shows hold", kept["held"]
            )
            yield _gauge(
                "shardfs_kept_versions",
                "File versions kept readable for the kernel, each a descriptor",
                kept["versions"],
            )
            yield _gauge(
                "shardfs_kept_versions_limit", "The most versions kept", kept["versions_limit"]
            )

    @staticmethod
    def _source(source: dict[str, Any]) -> Iterable[Metric]:
        yield _counter(
            "shardfs_source_requests", "Requests to the source (S3: HTTP requests), by kind",
            ["kind"], source["requests"],
        )  # fmt: skip
        yield from _counters(source, (
            ("shardfs_source_read_bytes", "bytes_read", "Bytes read from the source"),
            ("shardfs_source_written_bytes", "bytes_written", "Bytes written to the source"),
            ("shardfs_source_retries", "retries", "Requests to the source retried"),
        ))  # fmt: skip
        yield _counter(
            "shardfs_source_errors",
            "Failed requests to the source, by HTTP status or exception class",
            ["kind"], source["errors"],
        )  # fmt: skip
        descriptors = source.get("descriptors")
        if descriptors is not None:
            yield _gauge(
                "shardfs_descriptors_open",
                "Descriptors the pins of a local source hold open",
                descriptors["open"],
            )
            yield _gauge(
                "shardfs_descriptors_limit", "The most descriptors pins hold", descriptors["limit"]
            )
            yield from _counters(descriptors, (
                ("shardfs_descriptors_evicted", "evicted", "Descriptors closed for the limit"),
                ("shardfs_descriptors_reopened", "reopened",
                 "Descriptors closed for the limit and opened again"),
            ))  # fmt: skip

    @staticmethod
    def _caches(caches: dict[str, dict[str, int]]) -> Iterable[Metric]:
        """Each cache's figures under its name in `shardfs stats`: those all caches have,
        and those of a kind (the disk cache's bytes, read-ahead's fetches) where present."""
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "hits": CounterMetricFamily("shardfs_cache_hits", "Cache hits", labels=["cache"]),
            "misses": CounterMetricFamily(
                "shardfs_cache_misses", "Cache misses (loads)", labels=["cache"]
            ),
            "evictions": CounterMetricFamily(
                "shardfs_cache_evictions", "Entries dropped for the budget", labels=["cache"]
            ),
            "used": GaugeMetricFamily(
                "shardfs_cache_used_bytes", "Bytes a cache holds", labels=["cache"]
            ),
            "budget": GaugeMetricFamily(
                "shardfs_cache_budget_bytes", "Bytes a cache may hold", labels=["cache"]
            ),
            "bytes_read": CounterMetricFamily(
                "shardfs_cache_read_bytes", "Bytes served from the disk cache", labels=["cache"]
            ),
            "bytes_written": CounterMetricFamily(
                "shardfs_cache_written_bytes", "Bytes written to the disk cache", labels=["cache"]
            ),
            "failures": CounterMetricFamily(
                "shardfs_cache_failures",
                "Disk cache reads or writes that failed (the source was used)",
                labels=["cache"],
            ),
            "dropped": CounterMetricFamily(
                "shardfs_cache_damaged", "Disk cache blocks found damaged", labels=["cache"]
            ),
            "fetches": CounterMetricFamily(
                "shardfs_cache_fetches", "Ranged reads read-ahead issued", labels=["cache"]
            ),
            "prefetched": CounterMetricFamily(
                "shardfs_cache_prefetched_chunks",
                "Chunks read-ahead brought before they were asked for",
                labels=["cache"],
            ),
        }
        for name, figures in sorted(caches.items()):
            for key, value in figures.items():
                family = families.get(key)
                if family is not None and value >= 0:  # the disk cache's `used` is -1 if unknown
                    family.add_metric([name], value)
        yield from (family for family in families.values() if family.samples)

    @staticmethod
    def _commits(commits: dict[str, int]) -> Iterable[Metric]:
        return _counters(commits, (
            ("shardfs_commit_appends", "appends", "Shard appends committed"),
            ("shardfs_commit_rewrites", "rewrites", "Whole shards or chunk objects committed"),
            ("shardfs_commit_chunks", "chunks", "Chunks stored or deleted by commits"),
            ("shardfs_commit_bytes", "chunk_bytes", "Bytes of the chunks commits stored"),
        ))  # fmt: skip


def _front(front: dict[str, Any]) -> Iterable[Metric]:
    """The native front's own figures (its answers are in `shardfs_fuse_requests_total`)."""
    yield _counter(
        "shardfs_native_passed_on", "Requests the native front passed on to Python, by opcode",
        ["op"], front["passed on"],
    )  # fmt: skip
    yield _counter(
        "shardfs_native_misses", "Requests the native front could not answer, by reason",
        ["reason"], front["misses"],
    )  # fmt: skip
    yield CounterMetricFamily(
        "shardfs_native_disk_reads",
        "Reads the native front answered from disk",
        value=front["read from disk"],
    )
    entries = GaugeMetricFamily(
        "shardfs_native_table_entries", "Entries of the native front's tables", labels=["table"]
    )
    for table in ("rows", "versions", "directories", "slots"):
        entries.add_metric([table], front[table])
    yield entries


class _Connection:
    """A client of the server: its request as it comes, then its answer as it goes, then
    what it still sends read and dropped until it closes (a close with data unread would
    reset the connection, and the client could lose its answer)."""

    __slots__ = ("answer", "answered", "closable", "deadline", "headers", "request", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        #: when it is closed, whatever it is doing (`TIMEOUT` from each step's start)
        self.deadline = deadline
        #: still sending its request, or answered: one the cap may close
        self.closable = True
        #: its answer all sent
        self.answered = False
        self.request = bytearray()
        #: a scrape's header fields, names in lower case, while it waits for its turn
        self.headers: dict[str, str] = {}
        #: what is left to send of its answer, once made
        self.answer = memoryview(b"")


class MetricsServer:
    """The HTTP server of one mount's metrics: one thread with a selector, within the bounds
    above however many clients come and whatever they send (prometheus_client's own server
    took a thread and a descriptor per connection, with no limit and no timeout, and so
    held connections exhausted the daemon's descriptors). Answers `GET /metrics` (and
    `GET /`) in the format the `Accept` header asks for, gzipped if accepted, one request
    per connection."""

    def __init__(
        self,
        address: tuple[str, int],
        snapshot: Callable[[], dict[str, Any]],
        latency: Latency,
        *,
        connections: int = CONNECTIONS,
        timeout: float = TIMEOUT,
        request_bytes: int = REQUEST_BYTES,
    ) -> None:
        """Listen on `address` at once (port 0: any free port): ShardfsError, one line, if
        that cannot be done (the port is taken, the host unknown), so that the daemon
        refuses to mount. The bounds are the module's unless given (for tests)."""
        host, port = address
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(StatsCollector(snapshot, latency))
        ProcessCollector(namespace="shardfs", registry=self._registry)  # RSS, descriptors, CPU
        self._cap, self._timeout, self._request_bytes = connections, timeout, request_bytes
        try:
            self._listener = _listen(host, port)
        except OSError as e:  # (socket.gaierror too)
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise ShardfsError(f"metrics: cannot listen on {shown}: {e.strerror or e}") from None
        self.port: int = self._listener.getsockname()[1]
        shown = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # (`stop` writes it)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake, selectors.EVENT_READ)
        self._connections: dict[socket.socket, _Connection] = {}  # oldest first
        #: scrapes whose request came, in turn, and when the next may be made (`PAUSE`)
        self._waiting: deque[_Connection] = deque()
        self._next_scrape = 0.0
        #: while accept fails (descriptors or memory short), when to listen again
        self._deaf_until: float | None = None
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()
        self.url = f"http://{shown}/metrics"
        log.info("metrics at %s", self.url)

    def stop(self) -> None:
        """Stop answering and close every socket (at the unmount)."""
        os.eventfd_write(self._wake, 1)
        self._thread.join()
        for sock in [*self._connections, self._listener]:
            sock.close()
        self._selector.close()
        os.close(self._wake)

    def _serve(self) -> None:
        """The server's thread, until `stop`: accept, read, answer, close what timed out."""
        while True:
            for key, _ in self._selector.select(self._wait()):
                if key.fileobj is self._wake:
                    return
                if key.fileobj is self._listener:
                    self._accept()
                elif key.data.sock not in self._connections:  # closed since, by the cap
                    continue
                elif key.data.answer:
                    self._send(key.data)
                else:
                    self._read(key.data)
            now = monotonic()
            if self._waiting and now >= self._next_scrape:
                self._scrape(self._waiting.popleft())
            for connection in [c for c in self._connections.values() if c.deadline <= now]:
                self._close(connection)
            if self._deaf_until is not None and now >= self._deaf_until:
                self._deaf_until = None
                self._selector.register(self._listener, selectors.EVENT_READ)

    def _wait(self) -> float | None:
        """Seconds until the next thing to do that no socket tells of, None if nothing."""
        times = [c.deadline for c in self._connections.values()]
        if self._waiting:
            times.append(self._next_scrape)
        if self._deaf_until is not None:
            times.append(self._deaf_until)
        return max(0.0, min(times) - monotonic()) if times else None

    def _accept(self) -> None:
        """Take the connections waiting, at most `BACKLOG` at a time; beyond the cap, each
        closes the oldest one the cap may close (`_Connection.closable`), or itself if
        there is none."""
        for _ in range(BACKLOG):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, ConnectionAbortedError):
                return
            except OSError as e:  # out of descriptors or memory: not a busy loop meanwhile
                log.warning("metrics: cannot accept a connection, for a second: %s", e)
                self._selector.unregister(self._listener)
                self._deaf_until = monotonic() + 1.0
                return
            if len(self._connections) >= self._cap:
                oldest = next((c for c in self._connections.values() if c.closable), None)
                if oldest is None:
                    sock.close()
                    continue
                self._close(oldest)
            sock.setblocking(False)
            connection = self._connections[sock] = _Connection(sock, monotonic() + self._timeout)
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: _Connection) -> None:
        """Read what came of a request (never more than `request_bytes` and one); once it
        is whole, answer it, or queue it for its scrape."""
        request = connection.request
        try:
            data = connection.sock.recv(
                4096 if connection.answered else self._request_bytes + 1 - len(request)
            )
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(connection)
        if not data or connection.answered:
            return
        request += data
        end = request.find(b"\n\r\n", max(0, len(request) - len(data) - 2))
        if end < 0:
            end = request.find(b"\n\n", max(0, len(request) - len(data) - 1))
        if end < 0:
            if len(request) > self._request_bytes:
                self._answer(connection, _response(
                    "431 Request Header Fields Too Large", [],
                    f"a request line and headers of at most {self._request_bytes} bytes\n",
                ))  # fmt: skip
            return
        try:
            method, path, connection.headers = _parse(request[:end].decode("latin-1"))
        except ValueError:
            self._answer(connection, _response("400 Bad Request", [], "not an HTTP request\n"))
            return
        if method != "GET":
            self._answer(connection, _response(
                "405 Method Not Allowed", [("Allow", "GET")], f"{method}: only GET is served\n"
            ))  # fmt: skip
        elif path not in ("/metrics", "/"):
            self._answer(connection, _response("404 Not Found", [], "the metrics: /metrics\n"))
        else:
            connection.closable = False
            connection.deadline = monotonic() + self._timeout
            self._selector.unregister(connection.sock)
            self._waiting.append(connection)

    def _scrape(self, connection: _Connection) -> None:
        """Answer a scrape with the metrics; the next one waits `PAUSE` times as long as
        this one took."""
        if connection.sock not in self._connections:  # timed out while waiting
            return
        start = monotonic()
        headers = connection.headers
        try:
            encode, content_type = choose_encoder(headers.get("accept", ""))
            body = encode(self._registry)
            fields = [("Content-Type", content_type)]
            if gzip_accepted(headers.get("accept-encoding", "")):
                body = gzip.compress(body)
                fields.append(("Content-Encoding", "gzip"))
            answer = _response("200 OK", fields, body)
        except Exception as e:  # an encoder's, on a header's values: not worth the server
            log.warning("metrics: a scrape failed: %s", e)
            answer = _response("500 Internal Server Error", [], "the scrape failed\n")
        end = monotonic()
        self._next_scrape = end + (end - start) * PAUSE
        self._selector.register(connection.sock, selectors.EVENT_WRITE, connection)
        connection.answer = memoryview(answer)

    def _answer(self, connection: _Connection, answer: bytes) -> None:
        """Send `answer`, and then close the connection."""
        connection.closable = False
        connection.deadline = monotonic() + self._timeout
        connection.answer = memoryview(answer)
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)

    def _send(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.answer)
        except BlockingIOError:
            return
        except OSError:
            sent = len(connection.answer)  # the client went: nothing more to send it
        connection.answer = connection.answer[sent:]
        if connection.answer:
            return
        try:
            connection.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(connection)
            return
        connection.answered = connection.closable = True
        self._selector.modify(connection.sock, selectors.EVENT_READ, connection)

    def _close(self, connection: _Connection) -> None:
        del self._connections[connection.sock]
        if connection.sock in self._selector.get_map():
            self._selector.unregister(connection.sock)
        connection.sock.close()


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host` (its first address) and `port`, not blocking."""
    family, *_, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(BACKLOG)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener


def _parse(head: str) -> tuple[str, str, dict[str, str]]:
    """The method, path and header fields (names in lower case) of a request's line and
    headers; ValueError if they are no HTTP request's."""
    line, *fields = (text.removesuffix("\r") for text in head.split("\n"))
    method, target, version = line.split(" ")
    if not version.startswith("HTTP/") or not target.startswith("/"):
        raise ValueError(line)
    headers = {}
    for field in fields:
        name, colon, value = field.partition(":")
        if not colon or not name or name != name.strip():
            raise ValueError(field)
        headers[name.lower()] = value.strip()
    return method, target.partition("?")[0], headers


def _response(status: str, fields: list[tuple[str, str]], body: bytes | str) -> bytes:
    """An HTTP response that closes its connection: `body` is text if a str."""
    if isinstance(body, str):
        body = body.encode()
        fields = [("Content-Type", "text/plain; charset=utf-8"), *fields]
    head = "".join(f"{name}: {value}\r\n" for name, value in fields)
    return (
        f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
