"""Prometheus metrics of a mount (`-o metrics=HOST:PORT`): the figures of `shardfs stats`,
rendered by `prometheus_client` and served over HTTP by its own server.

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

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from shardfs.primitives.errors import ShardfsError

log = logging.getLogger("shardfs")

#: The upper bounds of the latency buckets, in seconds: from a request answered from
#: memory (tens of µs) to one that waited for a slow object store.
BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
           0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_BOUNDS_NS = tuple(round(b * 1e9) for b in BUCKETS)
_LE = (*(f"{b:g}" for b in BUCKETS), "+Inf")


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


class MetricsServer:
    """prometheus_client's HTTP server of one mount's metrics, in a thread of its own."""

    def __init__(self, address: tuple[str, int], snapshot: Callable[[], dict[str, Any]],
                 latency: Latency) -> None:  # fmt: skip
        """Listen on `address` at once: ShardfsError, one line, if that cannot be done
        (the port is taken, the host unknown), so that the daemon refuses to mount."""
        host, port = address
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatsCollector(snapshot, latency))
        ProcessCollector(namespace="shardfs", registry=registry)  # RSS, descriptors, CPU
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            server, thread = start_http_server(port, host, registry)
        except OSError as e:  # (socket.gaierror too)
            raise ShardfsError(f"metrics: cannot listen on {shown}: {e.strerror or e}") from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.url = f"http://{shown}/metrics"
        log.info("metrics at %s", self.url)

    def stop(self) -> None:
        """Stop answering and close the socket (at the unmount)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
