"""One moto server for a benchmark run that reads or writes S3."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks.harness.runs import Interrupts
from tests.support.s3 import MotoServer, configure_environment


@contextlib.contextmanager
def moto_run(prefix: str, interrupts: Interrupts) -> Iterator[tuple[Path, MotoServer]]:
    """A scratch directory (named from `prefix`) and a moto server on 127.0.0.1 logging into
    it, for one run; both gone at its end. Started and stopped with interrupts deferred, so
    that a Ctrl-C cannot leave the server running."""
    configure_environment()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        server = MotoServer(work / "moto.log")
        with interrupts.deferred():
            server.start()
        try:
            yield work, server
        finally:
            with interrupts.deferred():
                server.stop()
