"""sd_notify(3): tell systemd how a `Type=notify` service is doing, without libsystemd.

The protocol is one datagram of `KEY=value` lines to the unix socket named
by `$NOTIFY_SOCKET` (a name starting with `@` is in the abstract namespace).
Outside systemd the variable is unset and every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("shardfs")


def notify(*states: str) -> bool:
    """Send `states` (e.g. "READY=1", "STATUS=...") to systemd; whether a message was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a kind of socket (vsock) this does not speak
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(states).encode(), address)
    except OSError as e:
        log.warning("cannot notify systemd at %s: %s", os.environ["NOTIFY_SOCKET"], e.strerror)
        return False
    return True
