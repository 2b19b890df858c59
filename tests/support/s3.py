"""S3 for tests: moto's server in a subprocess, behind a loopback proxy that injects faults.

Every client under test (boto3 in the shardfs daemon, obstore under zarr-python, tensorstore's
curl) talks to `S3Proxy`, which forwards to a `MotoServer` and can delay, fail, stall or cut
requests, run a hook before one, and counts what it saw. Fixtures: `moto_server` (session) and
`s3` (per test: a fresh proxy and bucket, both gone at teardown, so no rule leaks across tests).

The proxy also supplies S3 semantics that moto 5.2.5 lacks (seen with its server mode):

* `If-Match` on CompleteMultipartUpload is ignored (`If-None-Match` is honoured). The proxy
  HEADs the key first: 412 PreconditionFailed if the ETag differs, 404 NoSuchKey if there is no
  object, as S3 and moto's own PutObject `If-Match` answer.
* `x-amz-copy-source-if-match` is ignored by UploadPartCopy (and by CopyObject). The proxy HEADs
  the copy source: 412 PreconditionFailed if the ETag differs, 404 NoSuchKey if it is missing.
* moto checks PutObject `If-Match`/`If-None-Match` and then writes, with no lock between
  (moto/s3/responses.py, put_object), so two concurrent conditional PUTs could both win; the
  window is narrow (never hit in 640 tries) but real S3 rules it out. The proxy serialises every
  request that replaces or deletes an object (PutObject, CopyObject, CompleteMultipartUpload,
  DeleteObject) per key, holding the lock across its own checks and the forward; a copy with a
  precondition also locks its source. DeleteObjects (POST ?delete) is not serialised.
* ListMultipartUploads gives every upload the same Initiated time, 2010-11-10T20:48:33Z. The
  proxy puts in when it first saw the upload id: in the answer to CreateMultipartUpload, or for
  an upload made behind its back (say with `S3Env.admin`), in the first listing that showed it.

moto's server closes the connection after every answer, so the proxy opens one upstream
connection per request; towards clients it keeps connections alive. Requests must be
path-style (`/bucket/key`), which is what all three clients send to an IP endpoint.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypedDict, Unpack
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

REGION = "us-east-1"
#: Socket reads and writes of this size keep 100 MB transfers cheap.
CHUNK = 1 << 20
#: Hop-by-hop headers, which a proxy must not forward (RFC 9110, section 7.6.1), and Expect:
#: the proxy answers 100-continue itself.
HOP_BY_HOP = frozenset(
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    ]
)
ERRORS = {
    400: ("BadRequest", "Bad Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    409: ("ConditionalRequestConflict", "A conflicting conditional operation is in progress."),
    412: ("PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    502: ("BadGateway", "The test proxy could not get an answer from moto."),
    503: ("SlowDown", "Please reduce your request rate."),
}
UPLOAD = re.compile(rb"<Upload>.*?</Upload>", re.DOTALL)
UPLOAD_ID = re.compile(rb"<UploadId>([^<]+)</UploadId>")
INITIATED = re.compile(rb"<Initiated>[^<]*</Initiated>")
#: Runs moto's server, but first asks Linux to end it when the test process dies (SIGKILL too).
MOTO_MAIN = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("parent already gone")
from moto.server import main
main(sys.argv[2:])
"""


def configure_environment() -> None:
    """Fake credentials for every client, including the daemon (a child inheriting os.environ).

    The metadata service is always disabled: a client that finds no credentials would otherwise
    wait on 169.254.169.254 before failing.
    """
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", REGION),
    ):
        os.environ.setdefault(name, value)
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


def free_port() -> int:
    """A port free right now (the OS may hand it out again; callers retry)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate one process we started, by its PID, and reap it; kill it if it lingers."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait(timeout=10)


class MotoServer:
    """`python -m moto.server` on a free loopback port, logging to `log_path`."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, attempts: int = 5, timeout: float = 30) -> None:
        """Start and wait until it answers HTTP; retry on another port if this one was taken."""
        for _ in range(attempts):
            port = free_port()
            args = [sys.executable, "-c", MOTO_MAIN, str(os.getpid()), "-H", "127.0.0.1"]
            with open(self.log_path, "ab") as log:
                process = subprocess.Popen(
                    [*args, "-p", str(port)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
                )
            if _answers(process, port, time.monotonic() + timeout):
                self.process, self.port = process, port
                return
            stop_process(process)
        log = self.log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"moto server did not start; its log ends:\n{log}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None


def _answers(process: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
    """Whether `process` came up and serves HTTP on `port` before `deadline`."""
    while process.poll() is None and time.monotonic() < deadline:
        if _listens(process.pid, port):  # not someone else's server on a port we lost
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
                return True
            except OSError:
                pass
            finally:
                conn.close()
        time.sleep(0.05)
    return False


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on 127.0.0.1:`port` (from /proc)."""
    try:
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:  # gone, or an fd closed while we looked
        return False
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        listening = fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A"
        if listening and f"socket:[{fields[9]}]" in sockets:
            return True
    return False


@dataclass(frozen=True)
class RequestInfo:
    """One client request as the proxy saw it, for rules, hooks and the log."""

    method: str
    path: str  # path and query as sent (percent-encoded)
    bucket: str
    key: str  # decoded object key; "" for requests on the bucket
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    kind: str

    @property
    def range(self) -> str | None:
        return self.headers.get("range")


def classify(method: str, key: str, query: dict[str, list[str]], headers: dict[str, str]) -> str:
    """The kind of S3 request, as counted by `S3Proxy.counts` (CopyObject is "other")."""
    if not key:
        return "LIST" if method == "GET" and query.get("list-type") == ["2"] else "other"
    copy = "x-amz-copy-source" in headers
    if method == "GET":
        return "GET range" if "range" in headers else "GET"
    if method == "HEAD":
        return "HEAD"
    if method == "PUT" and "uploadId" in query:
        return "UploadPartCopy" if copy else "UploadPart"
    if method == "PUT":
        return "other" if copy else "PUT"
    if method == "POST" and "uploads" in query:
        return "CreateMultipartUpload"
    if method == "POST" and "uploadId" in query:
        return "CompleteMultipartUpload"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DELETE"
    return "other"


def copy_source(headers: dict[str, str]) -> tuple[str, str] | None:
    """(bucket, key) of an `x-amz-copy-source` header, if any."""
    source = headers.get("x-amz-copy-source")
    if source is None:
        return None
    bucket, _, key = unquote(source.split("?", 1)[0]).lstrip("/").partition("/")
    return bucket, key


def etag_matches(condition: str, etag: str) -> bool:
    """Whether an `If-Match` value (a list of ETags or "*") accepts `etag`."""
    wanted = {tag.strip().removeprefix("W/").strip('"') for tag in condition.split(",")}
    return "*" in wanted or etag.strip('"') in wanted


KeyMatch = str | Callable[[str], bool] | None


class Match(TypedDict, total=False):
    """Which requests a rule affects (see `Rule`); `count` is how many (None: all, default 1)."""

    method: str | None
    key: KeyMatch
    range: bool | None
    query: str | None
    count: int | None


@dataclass
class Rule:
    """A fault for requests that match; `hits` counts those it affected."""

    action: str  # fail, slow, truncate or before
    method: str | None
    key: KeyMatch  # regex (re.search) or predicate on the object key
    range: bool | None  # True: only with a Range header; False: only without
    query: str | None  # a query parameter that must be present, e.g. "uploadId"
    remaining: int | None  # None: every match
    status: int = 0
    code: str = ""
    seconds: float = 0.0
    keep: int | None = None
    callback: Callable[[RequestInfo], Any] | None = None
    hits: int = 0

    def matches(self, request: RequestInfo) -> bool:
        if self.remaining == 0 or self.method not in (None, request.method):
            return False
        if self.range is not None and self.range != (request.range is not None):
            return False
        if self.query is not None and self.query not in request.query:
            return False
        if isinstance(self.key, str):
            return re.search(self.key, request.key) is not None
        return self.key is None or self.key(request.key)


class S3Proxy:
    """A threaded HTTP/1.1 proxy on a free loopback port in front of `upstream` (moto).

    Rules apply in the order they were added; a request takes the first that matches and
    has uses left. The delay, the rules and the counters may change while requests run.
    """

    def __init__(self, upstream: str) -> None:
        host, _, port = urlsplit(upstream).netloc.partition(":")
        self.upstream = (host, int(port))
        self.errors: list[BaseException] = []  # unexpected failures inside the proxy
        self.accepted = 0  # client connections accepted, to check keep-alive
        self._lock = threading.Lock()
        #: Requests received and not yet logged (a response reaches the client before
        #: its handler logs it): `log` waits for them.
        self._in_flight = 0
        self._settled = threading.Condition(self._lock)
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self._initiated: dict[bytes, bytes] = {}  # upload id: when first seen
        self._rules: list[Rule] = []
        self._delay = 0.0
        self._counts: Counter[str] = Counter()
        self._log: list[tuple[str, str, str | None, int]] = []
        self._stopping = threading.Event()
        self._clients: set[socket.socket] = set()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Stop serving, cut client connections and wait for every handler thread."""
        self._stopping.set()
        self._server.shutdown()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        self._thread.join()

    # Controls

    def delay(self, seconds: float) -> None:
        """Hold every request this long before acting on it (0 turns it off)."""
        with self._lock:
            self._delay = seconds

    def fail(self, status: int = 503, *, code: str | None = None, **match: Unpack[Match]) -> Rule:
        """Answer matching requests with `status` and an S3 error body, without forwarding."""
        if code is None and status not in ERRORS:
            raise ValueError(f"give the S3 error code for status {status}")
        code = code or ERRORS[status][0]
        return self._add("fail", match, status=status, code=code)

    def slow(self, seconds: float, **match: Unpack[Match]) -> Rule:
        """Forward at once (the request takes effect) but hold the answer back `seconds`."""
        return self._add("slow", match, seconds=seconds)

    def truncate(self, *, keep: int | None = None, **match: Unpack[Match]) -> Rule:
        """Forward, send the real headers but only `keep` body bytes (default half), then close."""
        return self._add("truncate", match, keep=keep)

    def before(self, callback: Callable[[RequestInfo], Any], **match: Unpack[Match]) -> Rule:
        """Run `callback(request)` in the proxy just before forwarding a matching request."""
        return self._add("before", match, callback=callback)

    def counts(self) -> Counter[str]:
        """Requests received per kind (see `classify`), injected failures included."""
        with self._lock:
            return Counter(self._counts)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()
            self._log.clear()

    def log(self, timeout: float = 10.0) -> list[tuple[str, str, str | None, int]]:
        """(method, key, Range header, status sent) per finished request, in finishing order;
        once the requests in flight are logged (waiting up to `timeout` seconds for them)."""
        with self._settled:
            self._settled.wait_for(lambda: not self._in_flight, timeout)
            return list(self._log)

    # Used by the handler

    def _add(self, action: str, match: Match, **effect: Any) -> Rule:
        rule = Rule(
            action,
            match.get("method"),
            match.get("key"),
            match.get("range"),
            match.get("query"),
            match.get("count", 1),
            **effect,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def _receive(self, request: RequestInfo) -> tuple[float, Rule | None]:
        """Count a request and take the rule it uses up, if any."""
        with self._lock:
            self._counts[request.kind] += 1
            self._in_flight += 1
            for rule in self._rules:
                if rule.matches(request):
                    rule.hits += 1
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return self._delay, rule
            return self._delay, None

    def _finish(self, request: RequestInfo, status: int) -> None:
        with self._lock:
            self._log.append((request.method, request.key, request.range, status))
            self._in_flight -= 1
            self._settled.notify_all()

    def _fix_initiated(self, body: bytes) -> bytes:
        """Note when each upload id in an answer was first seen; list uploads with that time."""
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        with self._lock:
            for upload_id in UPLOAD_ID.findall(body):
                self._initiated.setdefault(upload_id, now.encode())
            seen = dict(self._initiated)

        def fix(upload: re.Match[bytes]) -> bytes:
            found = UPLOAD_ID.search(upload[0])
            if found is None:
                return upload[0]
            return INITIATED.sub(b"<Initiated>%s</Initiated>" % seen[found[1]], upload[0])

        return UPLOAD.sub(fix, body)

    def _key_lock(self, bucket: str, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault((bucket, key), threading.Lock())

    @contextlib.contextmanager
    def _serialised(self, request: RequestInfo) -> Iterator[None]:
        """Hold the locks of the keys this request changes, or whose ETag it checks."""
        keys = set()
        if request.kind in ("CompleteMultipartUpload", "DELETE") or (
            request.method == "PUT" and request.key and "uploadId" not in request.query
        ):  # PutObject and CopyObject
            keys.add((request.bucket, request.key))
        source = copy_source(request.headers)
        if source and "x-amz-copy-source-if-match" in request.headers:
            keys.add(source)
        with contextlib.ExitStack() as stack:
            for bucket, key in sorted(keys):  # one order for all: no deadlock
                stack.enter_context(self._key_lock(bucket, key))
            yield

    def _precondition_failure(self, request: RequestInfo) -> tuple[int, str] | None:
        """Enforce the conditions moto ignores: (status, condition) if the request must fail."""
        source = copy_source(request.headers)
        if request.kind == "CompleteMultipartUpload" and "if-match" in request.headers:
            target, condition = (request.bucket, request.key), "If-Match"
        elif source and request.method == "PUT" and "x-amz-copy-source-if-match" in request.headers:
            target, condition = source, "x-amz-copy-source-If-Match"
        else:
            return None
        etag = self._head_etag(*target, request.headers)
        if etag is None:
            return 404, condition
        if not etag_matches(request.headers[condition.lower()], etag):
            return 412, condition
        return None

    def _head_etag(self, bucket: str, key: str, headers: dict[str, str]) -> str | None:
        """The ETag of an object as moto has it now, or None if there is none.

        The client's Authorization goes along: moto refuses anonymous requests (403) but does
        not check signatures.
        """
        auth = {name: headers[name] for name in ("authorization", "host") if name in headers}
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request("HEAD", f"/{quote(bucket)}/{quote(key)}", headers=auth)
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        if response.status == 404:
            return None
        if response.status != 200:
            raise RuntimeError(f"HEAD {bucket}/{key} for a precondition: {response.status}")
        return response.getheader("ETag")


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads
    block_on_close = True
    request_queue_size = 128  # the default 5 drops bursts of connects (a 1 s SYN retry each)

    def __init__(self, proxy: S3Proxy) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Note the connection before its thread starts, so that `S3Proxy.stop` can cut it."""
        with self.proxy._lock:
            self.proxy._clients.add(request)
            self.proxy.accepted += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.proxy._lock:
            self.proxy._clients.discard(request)
        super().shutdown_request(request)


class _UpstreamError(Exception):
    """moto could not be reached or broke off: the client gets a 502."""


@contextlib.contextmanager
def _upstream_errors(where: str) -> Iterator[None]:
    """Tell moto's socket errors from the client's, which stay OSError."""
    try:
        yield
    except OSError as error:
        raise _UpstreamError(f"{where}: {error!r}") from error


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the log of requests is `S3Proxy.log()`."""

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _handle(self) -> None:
        proxy = self.server.proxy
        url = urlsplit(self.path)
        bucket, _, key = (unquote(part) for part in url.path.lstrip("/").partition("/"))
        query = parse_qs(url.query, keep_blank_values=True)
        headers = {name.lower(): value for name, value in self.headers.items()}
        kind = classify(self.command, key, query, headers)
        request = RequestInfo(self.command, self.path, bucket, key, query, headers, kind)
        delay, rule = proxy._receive(request)
        self._status = 0
        try:
            if delay:
                proxy._stopping.wait(delay)
            if rule is not None and rule.action == "fail":
                self._discard_body()
                self._send_error(request, rule.status, rule.code)
            else:
                if rule is not None and rule.action == "before":
                    assert rule.callback is not None
                    rule.callback(request)
                self._forward(request, rule)
        except OSError:
            self.close_connection = True  # the client went away
        except Exception as error:  # a hook, moto or the proxy failed: tell the test
            self.close_connection = True
            with proxy._lock:
                proxy.errors.append(error)
            if not self._status:
                with contextlib.suppress(OSError):
                    self._send_error(request, 502, ERRORS[502][0])
        finally:
            proxy._finish(request, self._status)

    def _forward(self, request: RequestInfo, rule: Rule | None) -> None:
        proxy = self.server.proxy
        with proxy._serialised(request):
            failure = proxy._precondition_failure(request)
            if failure is not None:
                self._discard_body()
                status, condition = failure
                self._send_error(request, status, ERRORS[status][0], condition)
                return
            response = self._send_upstream()
        with response:
            if rule is not None and rule.action == "slow":
                proxy._stopping.wait(rule.seconds)
            self._relay(request, response, rule)

    def _send_upstream(self) -> http.client.HTTPResponse:
        """Send the request (headers as received, body streamed) to moto; its answer's head.

        The client's errors surface as OSError, moto's as _UpstreamError.
        """
        body: Iterable[bytes] = self._body()
        length = self.headers.get("Content-Length")
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            whole = b"".join(body)  # moto gets the whole body with its length
            body, length = (whole,), str(len(whole))
        where = f"{self.command} {self.path}"
        conn = http.client.HTTPConnection(*self.server.proxy.upstream, timeout=300)
        try:
            with _upstream_errors(where):
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP | {"content-length"}:
                        conn.putheader(name, value)
                if length is not None:
                    conn.putheader("Content-Length", length)
                conn.endheaders()
            for data in body:
                with _upstream_errors(where):
                    conn.send(data)
            with _upstream_errors(where):
                return conn.getresponse()
        finally:
            conn.close()  # an open response keeps the socket until it is closed itself

    def _body(self) -> Iterator[bytes]:
        """The request body in pieces: by Content-Length, or decoded from chunked encoding."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while size := int(self.rfile.readline(1024).split(b";")[0], 16):
                yield self.rfile.read(size)
                self.rfile.readline(1024)
            while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return
        remaining = int(self.headers.get("Content-Length") or 0)
        while remaining:
            data = self.rfile.read(min(remaining, CHUNK))
            if not data:
                raise ConnectionError("client closed during the request body")
            remaining -= len(data)
            yield data

    def _discard_body(self) -> None:
        for _ in self._body():
            pass

    def _relay(
        self, request: RequestInfo, response: http.client.HTTPResponse, rule: Rule | None
    ) -> None:
        """Pass moto's answer on; for a truncate rule, cut the body short and close."""
        source: Any = response
        length = response.getheader("Content-Length")
        if response.status == 200 and "uploads" in request.query and request.method != "HEAD":
            fixed = self.server.proxy._fix_initiated(response.read())
            source, length = io.BytesIO(fixed), str(len(fixed))
        self._status = response.status
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(name, value)
        if length is not None:
            self.send_header("Content-Length", length)
        has_body = request.method != "HEAD" and response.status not in (204, 304)
        chunked = has_body and length is None
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not has_body:
            return
        limit = math.inf
        if rule is not None and rule.action == "truncate":
            self.close_connection = True
            limit = rule.keep if rule.keep is not None else int(length or 0) // 2
        sent = 0
        while sent < limit and (data := source.read(int(min(CHUNK, limit - sent)))):
            sent += len(data)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        if chunked and limit == math.inf:  # a cut body gets no end marker
            self.wfile.write(b"0\r\n\r\n")

    def _send_error(
        self, request: RequestInfo, status: int, code: str, condition: str | None = None
    ) -> None:
        message = ERRORS.get(status, (code, code))[1]
        resource = f"/{request.bucket}/{request.key}" if request.key else f"/{request.bucket}"
        extra = f"<Condition>{condition}</Condition>" if condition else ""
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>{extra}"
            f"<Resource>{resource}</Resource><RequestId>{uuid.uuid4().hex}</RequestId></Error>"
        ).encode()
        self._status = status
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", uuid.uuid4().hex[:16])
        self.send_header("Content-Length", "0" if request.method == "HEAD" else str(len(body)))
        self.end_headers()
        if request.method != "HEAD":
            self.wfile.write(body)


@dataclass
class S3Env:
    """A bucket of its own on moto, reached through a proxy of its own (see `s3`).

    `endpoint` is the proxy, which clients under test use; `direct_endpoint` is moto. The
    helpers `put`, `get`, `keys`, `upload_tree` and `download_tree` go straight to moto, so they
    are neither counted nor hit by rules, and hooks may call them.
    """

    server: MotoServer
    proxy: S3Proxy
    bucket: str
    region: str = REGION
    _admin: Any = field(default=None, init=False, repr=False)

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    @property
    def direct_endpoint(self) -> str:
        return self.server.endpoint

    def client(self, *, direct: bool = False, **config: Any) -> Any:
        """A boto3 S3 client; `config` goes to botocore's Config (timeouts, retries).

        Clients are imported where used: conftest imports this module for every test run.
        """
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.direct_endpoint if direct else self.endpoint,
            region_name=self.region,
            config=Config(**config),
        )

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def mount_options(self, *, direct: bool = False) -> list[str]:
        """The `-o` options that point a shardfs mount of `url()` at this server."""
        endpoint = self.direct_endpoint if direct else self.endpoint
        return [f"endpoint_url={endpoint}", f"region={self.region}"]

    def obstore(self, prefix: str = "", *, direct: bool = False) -> Any:
        """An obstore S3Store on `prefix` (a directory), speaking plain HTTP."""
        from obstore.store import S3Store

        return S3Store(
            self.bucket,
            prefix=prefix or None,
            endpoint=self.direct_endpoint if direct else self.endpoint,
            region=self.region,
            client_options={"allow_http": True},
        )

    def zarr_store(self, prefix: str = "", *, direct: bool = False, read_only: bool = False) -> Any:
        """A zarr-python 3 store on `prefix`, for writing test data straight to S3."""
        from zarr.storage import ObjectStore

        return ObjectStore(self.obstore(prefix, direct=direct), read_only=read_only)

    def tensorstore_kvstore(self, prefix: str = "", *, direct: bool = False) -> dict[str, Any]:
        """A tensorstore "s3" kvstore spec on `prefix`, treated as a directory."""
        path = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        return {
            "driver": "s3",
            "bucket": self.bucket,
            "path": path,
            "endpoint": self.direct_endpoint if direct else self.endpoint,
            "aws_region": self.region,
            # Only the variables: the default chain logs about a missing ~/.aws.
            "aws_credentials": {"type": "environment"},
        }

    @property
    def admin(self) -> Any:
        """A boto3 client on moto itself, made once (clients are thread-safe)."""
        if self._admin is None:
            self._admin = self.client(direct=True)
        return self._admin

    def put(self, key: str, data: bytes) -> str:
        """Store an object; returns its ETag."""
        return self.admin.put_object(Bucket=self.bucket, Key=key, Body=data)["ETag"]

    def get(self, key: str) -> bytes:
        return self.admin.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def keys(self, prefix: str = "") -> dict[str, tuple[int, str]]:
        """Every key starting with `prefix`, with its size and ETag."""
        pages = self.admin.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return {
            item["Key"]: (item["Size"], item["ETag"])
            for page in pages
            for item in page.get("Contents", ())
        }

    def upload_tree(self, local_dir: Path, prefix: str = "") -> None:
        """Store every file under `local_dir` as `prefix/relative/path`."""
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                self.put(_join(prefix, path.relative_to(local_dir).as_posix()), path.read_bytes())

    def download_tree(self, prefix: str, local_dir: Path) -> None:
        """Write every object under the directory `prefix` to `local_dir/relative/path`."""
        base = prefix.rstrip("/") + "/" if prefix else ""
        for key in self.keys(base):
            path = Path(local_dir, key[len(base) :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.get(key))

    def create_bucket(self) -> None:
        self.admin.create_bucket(Bucket=self.bucket)

    def remove_bucket(self) -> None:
        """Delete the bucket with its objects and uploads: moto keeps everything in memory."""
        uploads = self.admin.list_multipart_uploads(Bucket=self.bucket).get("Uploads", ())
        for upload in uploads:
            self.admin.abort_multipart_upload(
                Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        keys = list(self.keys())
        for start in range(0, len(keys), 1000):
            objects = [{"Key": key} for key in keys[start : start + 1000]]
            self.admin.delete_objects(Bucket=self.bucket, Delete={"Objects": objects})
        self.admin.delete_bucket(Bucket=self.bucket)


def _join(prefix: str, relative: str) -> str:
    return f"{prefix.rstrip('/')}/{relative}" if prefix else relative


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto server for the session; the environment is set up before it starts."""
    configure_environment()
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(moto_server: MotoServer) -> Iterator[S3Env]:
    """A fresh bucket behind a fresh proxy, both gone at teardown.

    Errors inside the proxy (a hook that raised, moto unreachable) fail the test at teardown;
    a test that provokes them on purpose clears `s3.proxy.errors`. Mounts using the proxy must
    be torn down first: request `s3` before `mount`.
    """
    proxy = S3Proxy(moto_server.endpoint)
    env = S3Env(moto_server, proxy, f"test-{uuid.uuid4().hex[:20]}")
    try:
        env.create_bucket()
        yield env
    finally:
        proxy.stop()
        env.remove_bucket()
    if proxy.errors:
        raise RuntimeError(f"the S3 test proxy failed: {proxy.errors!r}")
