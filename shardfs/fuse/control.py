"""The daemon's control socket, through which `shardfs stats` reads a mount's figures.

Why a Unix socket beside the daemon's lock file, and not a file in the mounted
tree (s3ql's control file) or an extended attribute: reading it sends no FUSE
request and no request to the source, adds nothing to the tree that a walker
of it could trip over, and its mode (0600, in the 0700 runtime directory)
lets only the mounting user in. A client connects and reads one JSON document
until the daemon closes the connection; it sends nothing.

The socket lives in the runtime directory, which is the daemon user's alone
(0700; `shardfs.fuse.mounts.runtime_dir`), so no one else can reach it; the
daemon binds, and a client connects, only inside a directory that passes
`check_private_dir` (a socket another user could have put there would hear the
client, or answer it). The socket is 0600 besides, from the moment it has its
name: it is bound under a name of its own (with the umask's mode), made 0600,
and then renamed to its name, which also replaces a dead daemon's socket at
once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import trio

from shardfs.fuse.mounts import lock_path
from shardfs.primitives.private import UnsafeState, check_private_dir

log = logging.getLogger("shardfs")

#: Seconds a client may take to read the figures before the daemon hangs up.
SEND_TIMEOUT = 5.0

Snapshot = Callable[[], dict[str, Any]]


def socket_path(mountpoint: str) -> str:
    """The control socket of the daemon serving `mountpoint`, next to its lock file."""
    return lock_path(mountpoint).removesuffix(".lock") + ".sock"


async def serve(path: str, snapshot: Snapshot) -> None:
    """Answer every connection to `path` with `snapshot()` as JSON, until cancelled.

    The caller holds the daemon lock of the mountpoint, so a socket file already
    there is a dead daemon's and is replaced."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path + ".new"  # see the module docstring
    try:
        check_private_dir(os.path.dirname(path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)  # a dead daemon's
        await sock.bind(staging)
        os.chmod(staging, 0o600)
        sock.listen()
        os.rename(staging, path)
    except (OSError, UnsafeState) as e:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(staging)
        log.warning("no control socket at %s (shardfs stats will not answer): %s", path, e)
        return
    listener = trio.SocketListener(sock)
    try:
        while True:
            stream = await listener.accept()
            async with stream:
                try:  # in a thread: the disk cache's figures come from its database
                    data = json.dumps(await trio.to_thread.run_sync(snapshot)).encode()
                except Exception:  # the figures are not worth the mount
                    log.exception("shardfs stats: the figures could not be gathered")
                    data = b"{}"
                with (
                    trio.move_on_after(SEND_TIMEOUT),
                    contextlib.suppress(trio.BrokenResourceError),
                ):
                    await stream.send_all(data)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock.close()  # not `await listener.aclose()`: cancelled, it would not get to close


def query(mountpoint: str, timeout: float = SEND_TIMEOUT) -> dict[str, Any]:
    """The figures of the daemon serving `mountpoint`. OSError if it does not answer;
    UnsafeState if its runtime directory is not the user's alone (it is not asked)."""
    path = socket_path(mountpoint)
    check_private_dir(os.path.dirname(path))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        parts = []
        while chunk := sock.recv(1 << 16):
            parts.append(chunk)
    return json.loads(b"".join(parts))


def summary(stats: dict[str, Any]) -> str:
    """One line of the figures, for the journal (`-o stats_interval`)."""
    fuse, source = stats["fuse"], stats["source"]
    parts = [
        f"fuse {sum(fuse['requests'].values())} requests",
        f"{sum(fuse['errors'].values())} errors",
        "source " + _kinds(source["requests"]),
        f"{size_text(source['bytes_read'])} read",
    ]
    if source["bytes_written"]:
        parts.append(f"{size_text(source['bytes_written'])} written")
    parts.append(f"{sum(source['errors'].values())} errors, {source['retries']} retries")
    rates = [
        f"{name} {hit_rate(figures)}"
        for name, figures in stats["caches"].items()
        if figures["hits"] + figures["misses"]
    ]
    if rates:
        parts.append("hits: " + ", ".join(rates))
    commits = stats.get("commits")
    if commits:
        parts.append(f"{commits['chunks']} chunks committed ({size_text(commits['chunk_bytes'])})")
    return "; ".join(parts)


def hit_rate(figures: dict[str, int]) -> str:
    asked = figures["hits"] + figures["misses"]
    return f"{100 * figures['hits'] / asked:.0f}%" if asked else "-"


def _kinds(requests: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in requests.items()) or "none"


def size_text(n: int) -> str:
    """Bytes for people: `512 B`, `4.0 KiB`, `64.0 MiB`, `1.5 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")
