"""The native front started without a kernel: its device is one end of a SOCK_SEQPACKET
socketpair, so these tests write FUSE requests into it and read what it passes on to
Python's channel. The requests it hands on are read through their headers in its own buffers:
`scripts/sanitize-front` runs this file with the front built with ASan and UBSan, which then
also sees that they are aligned (audit 4, r8)."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardfs.fuse.kernel_served.front import unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")

HEADER = struct.Struct("<IIQQIIIHH")  # struct fuse_in_header
READ_IN = struct.Struct("<QQIIQII")  # struct fuse_read_in
FORGET_ONE = struct.Struct("<QQ")  # struct fuse_forget_one
READ, INIT, BATCH_FORGET = 15, 26, 42
MODE = 0o100444


def request(opcode: int, unique: int, nodeid: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), opcode, unique, nodeid, 0, 0, 0, 0, 0) + body


@dataclass
class Started:
    front: Any
    device: socket.socket  # the kernel's end of the front's device
    channel: socket.socket  # pyfuse3's end of what the front passes on


@pytest.fixture
def started() -> Iterator[Started]:
    """A front started on a socketpair, past the kernel's INIT (which it passes on)."""
    from shardfs.fuse.kernel_served import _front

    theirs, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        front = _front.Front(theirs.fileno(), 1.0, 4)  # (its own copy of the descriptor)
    front.start()
    channel = socket.socket(fileno=os.dup(front.channel))
    channel.settimeout(10)
    try:
        init = request(INIT, 1, 0, struct.pack("<IIII", 7, 31, 0, 0))
        ours.send(init)
        assert channel.recv(1 << 20) == init
        yield Started(front, ours, channel)
    finally:
        ours.close()  # the end of the device: the front's thread ends
        assert front.stop()
        channel.close()


def test_a_read_the_disk_cannot_finish_goes_to_python_unchanged(
    started: Started, tmp_path: Path
) -> None:
    """A row longer than its shard's file, which is not in the page cache: a worker thread
    reads it short and passes the request, kept since, on to Python as it came."""
    shard = tmp_path / "shard"
    shard.write_bytes(os.urandom(4096))
    fd = os.open(shard, os.O_RDONLY)
    os.fsync(fd)  # its pages clean, which the advice drops
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    st = os.fstat(fd)
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert started.front.keep(1, fd, str(shard).encode(), version)
    node = (3 + 1) << 40
    assert started.front.fill(100, 1, 3, [b"0"], [node], [0], [65536], 0, MODE, 0, 0) == 1
    read = request(READ, 2, node, READ_IN.pack(0, 0, 65536, 0, 0, 0, 0))
    started.device.send(read)
    assert started.channel.recv(1 << 20) == read
    misses = started.front.stats()["misses"]
    # the worker's miss: a miss of the front's own read ("not cached" would have been
    # counted had no worker taken it; "short read" had the page cache kept part of it)
    assert misses["changed"] == 1 and misses["short read"] == misses["error"] == 0, misses


def test_a_big_batch_forget_goes_to_python_in_pieces(started: Started) -> None:
    """In messages of at most 2,048 entries (a socket's biggest message is bounded), which
    together are the request's entries."""
    entries = [FORGET_ONE.pack((1 << 40) | i, i + 1) for i in range(5000)]
    body = struct.pack("<II", len(entries), 0) + b"".join(entries)
    started.device.send(request(BATCH_FORGET, 2, 0, body))
    got: list[bytes] = []
    while len(got) < len(entries):
        message = started.channel.recv(1 << 20)
        length, opcode, unique = HEADER.unpack_from(message)[:3]
        count = struct.unpack_from("<I", message, HEADER.size)[0]
        assert (length, opcode, unique) == (len(message), BATCH_FORGET, 2)
        assert 0 < count <= 2048 and len(message) == HEADER.size + 8 + count * FORGET_ONE.size
        body = message[HEADER.size + 8 :]
        got += [body[i : i + FORGET_ONE.size] for i in range(0, len(body), FORGET_ONE.size)]
    assert got == entries


def test_it_stops_while_requests_it_passed_on_wait(started: Started) -> None:
    """Readers busy at the unmount: requests passed on that Python will not answer keep the
    connection, so no ENODEV ends the front's read of the device; `stop` interrupts it
    (the daemon used to wait 5 s for it, then leave it to the process's end)."""
    started.device.send(request(READ, 2, (9 + 1) << 40, READ_IN.pack(0, 0, 4096, 0, 0, 0, 0)))
    assert started.channel.recv(1 << 20)  # passed on (no row), never answered
    began = time.monotonic()
    assert started.front.stop()  # while the device stays open
    assert time.monotonic() - began < 1
