"""The kernel's caches: dropped before a COLD run, kept warm for a WARM one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def drop_caches() -> None:
    """Write back, then drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def set_read_ahead(mountpoint: Path, kb: int) -> None:
    """The read-ahead of the FUSE connection serving `mountpoint` (needs root): a READ
    request is at most this big (up to the connection's max_pages), 128 KiB by default."""
    dev = os.stat(mountpoint).st_dev
    Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb").write_text(f"{kb}\n")


def cache_drops() -> tuple[int, ...]:
    """How often anyone dropped the page cache or dentries (`drop_caches`) since boot."""
    with open("/proc/vmstat") as f:
        return tuple(int(line.split()[1]) for line in f if line.startswith("drop_"))


def warm(top: Path) -> None:
    """Read every file below `top` once: page cache and dentries warm."""
    for directory, _, names in os.walk(top):
        for name in names:
            with open(os.path.join(directory, name), "rb") as file:
                while file.read(1 << 20):
                    pass


class Warmth:
    """Trees kept warm on a shared machine, whose other jobs drop the caches now and
    then: warmed again whenever /proc/vmstat counts a drop since the last warming."""

    def __init__(self, *tops: Path) -> None:
        self.tops = tops
        self.warmed: tuple[int, ...] | None = None

    def ensure(self) -> None:
        while (drops := cache_drops()) != self.warmed:  # again if dropped while warming
            for top in self.tops:
                warm(top)
            self.warmed = drops


def resident_mib(paths: list[Path]) -> float:
    """MiB of `paths` in the page cache."""
    found = subprocess.run(
        ["fincore", "-b", "-n", "-o", "RES", *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return sum(int(x) for x in found.stdout.split()) / (1 << 20)
