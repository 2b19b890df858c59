"""What both benchmark scripts need: signal handling that never loses track of a daemon,
and the description of the machine a run was made on."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import Mounted, start_mount, stop_mount


class Interrupts:
    """SIGINT and SIGTERM raise KeyboardInterrupt, except inside `deferred()`, which
    raises it at its end: a daemon is never started or stopped without being tracked."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.depth:
            self.pending = signum
        else:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise KeyboardInterrupt(signal.Signals(signum).name)


def machine() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        ram_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return (
        f"machine: {cpu}, {os.cpu_count()} cores, {ram_kib / (1 << 20):.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"zarr {zarr.__version__} (async.concurrency={zarr.config.get('async.concurrency')}, "
        f"threading.max_workers={zarr.config.get('threading.max_workers')}), "
        f"numpy {np.__version__}"
    )


@dataclass
class DataDir:
    """A benchmark's data directory: the sharded source, its plain copy, a mountpoint, the
    daemon's log, and a marker of the parameters the data was made with, so that a data
    set is reused only by a run that would make the same one."""

    data: Path

    @property
    def source(self) -> Path:
        return self.data / "sharded.zarr"

    @property
    def plain(self) -> Path:
        return self.data / "plain.zarr"

    @property
    def mountpoint(self) -> Path:
        return self.data / "mnt"

    @property
    def log(self) -> Path:
        return self.data / "mount.log"

    @property
    def marker(self) -> Path:
        return self.data / "dataset.json"

    @property
    def params(self) -> dict[str, object]:
        raise NotImplementedError

    def ready(self) -> bool:
        try:
            return json.loads(self.marker.read_text()) == self.params
        except (OSError, ValueError):
            return False


class MountManager:
    """At most one `shardfs mount -f ... -o ro` child at a time, always unmounted by `stop`."""

    def __init__(self, dataset: DataDir, interrupts: Interrupts) -> None:
        self.dataset = dataset
        self.interrupts = interrupts
        self.current: Mounted | None = None

    def fresh(self) -> Mounted:
        """A new daemon (the old one unmounted first)."""
        self.stop()
        with self.interrupts.deferred():  # a daemon must never start without being recorded
            self.current = start_mount(
                self.dataset.source, self.dataset.mountpoint, self.dataset.log, "ro"
            )
        return self.current

    def stop(self) -> None:
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            if self.current is not None:
                stop_mount(self.current)
                self.current = None


def run(main: Callable[[], int]) -> None:
    """Run a benchmark's `main` as a script: exit with its status, or with 130 when
    interrupted (SIGINT, SIGTERM), once every mount it made is unmounted."""
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); every mount it made is unmounted", file=sys.stderr)
        sys.exit(130)
