"""The daemon's log: one line per event with its level, to stderr, the journal, syslog or a
file, and never a credential.

Under systemd, stderr is a stream into the journal (`$JOURNAL_STREAM` names
it): lines then start with a syslog priority prefix (`<3>`), which journald
turns into the entry's level, and carry neither time nor PID, which the
journal records itself. Tracebacks and other multi-line messages are folded
into their one line, so one event stays one entry.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import re
import sys
from collections.abc import Iterator

log = logging.getLogger("shardfs")

#: Environment variables whose values are secrets, scrubbed from every line.
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_URL_PASSWORD = re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+@")
_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
_PRIORITIES = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def redact(text: str) -> str:
    """`text` without passwords in URLs, AWS access key ids, or the values of secret
    environment variables."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 8:
            text = text.replace(value, "[secret]")
    text = _URL_PASSWORD.sub("[secret]@", text)
    return _ACCESS_KEY_ID.sub("[access key]", text)


class OneLine(logging.Formatter):
    """Formats a record as one redacted line; with `journal`, behind its syslog priority."""

    def __init__(self, fmt: str, journal: bool = False) -> None:
        super().__init__(fmt)
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        text = redact(super().format(record)).replace("\r", "").replace("\n", " | ")
        if self.journal:
            return f"<{_PRIORITIES.get(record.levelno, 6)}>{text}"
        return text


def stderr_is_journal() -> bool:
    """Whether stderr is the journal stream systemd connected this service to."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    try:
        st = os.fstat(sys.stderr.fileno())
        return bool(inode) and (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (OSError, ValueError):
        return False


def setup(log_file: str | None, foreground: bool, debug: bool) -> None:
    """Send the `shardfs` log to `log_file`, else stderr (foreground, or no syslog), else
    syslog; DEBUG with `debug` (every request), else INFO."""
    handler: logging.Handler
    fmt = "%(asctime)s shardfs[%(process)d] %(levelname)s %(message)s"
    journal = False
    if log_file:
        handler = logging.FileHandler(log_file)
    elif foreground or not os.path.exists("/dev/log"):
        handler = logging.StreamHandler(sys.stderr)
        journal = stderr_is_journal()
        if journal:
            fmt = "%(levelname)s %(message)s"
    else:
        handler = logging.handlers.SysLogHandler("/dev/log")
        fmt = "shardfs[%(process)d]: %(levelname)s %(message)s"
    handler.setFormatter(OneLine(fmt, journal))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if debug else logging.INFO)


class Early(logging.Handler):
    """Keeps what is logged before `setup` has chosen where the log goes: while a mount
    opens its source, S3 keys that no path can hold are logged (one line each), and both
    the person running the command and the daemon's log must see them."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.setFormatter(OneLine("shardfs: %(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def print(self) -> None:
        """Show what was kept on stderr, where whoever runs the command sees it."""
        for record in self.records:
            print(self.format(record), file=sys.stderr)

    def replay(self) -> None:
        """Log what was kept again, now that `setup` has set the log up."""
        for record in self.records:
            log.handle(record)


@contextlib.contextmanager
def early() -> Iterator[Early]:
    """Keep what the `shardfs` log gets within the block; if the block fails, show it on
    stderr (before the error that ends the command)."""
    handler = Early()
    log.addHandler(handler)
    try:
        yield handler
    except BaseException:
        handler.print()
        raise
    finally:
        log.removeHandler(handler)
