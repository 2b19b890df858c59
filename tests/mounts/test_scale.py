"""A hundred thousand chunk files through a real mount: listings, inode numbers, memory.

The array is written by tensorstore (10 x 10,000 chunks of 8 x 8 uint16 in
shards of 32 x 32 chunks): 10 chunk directories of 10,000 files. The issue's
million-chunk figures come from `benchmarks/scale.py`; this test checks the
same properties at a size a test run can afford.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

ROWS, COLS = 10, 10_000
CHUNK, SHARD = 8, 32
#: What the daemon may grow by while the kernel lists, stats and reads every file: its
#: caches of indexes (about 5 MiB here) and listings (about 4 MiB), and the native front's
#: rows and their groups (about 5 MiB: 18 MiB in all with front=no, 23-27 MiB with it in
#: six runs). A node and an inode table entry per chunk took 56 MiB more.
GROWTH_LIMIT = 28 << 20


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "src"
    shape = [ROWS * CHUNK, COLS * CHUNK]
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}]
    sharding = {
        "name": "sharding_indexed",
        "configuration": {"chunk_shape": [CHUNK, CHUNK], "codecs": inner},
    }
    array = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(root / "data")},
            "metadata": {
                "shape": shape,
                "data_type": "uint16",
                "chunk_grid": {
                    "name": "regular",
                    "configuration": {"chunk_shape": [CHUNK * SHARD] * 2},
                },
                "codecs": [sharding],
                "fill_value": 0,
            },
        },
        create=True,
    ).result()
    y, x = np.ogrid[: shape[0], : shape[1]]
    array.write((1 + (y * 7 + x) % 4093).astype(np.uint16)).result()
    (root / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    return root


def status(pid: int, field: str) -> int:
    """A memory figure of /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no {field} for {pid}")


def run(command: str) -> str:
    return subprocess.run(command, shell=True, check=True, capture_output=True, text=True).stdout


def drop_kernel_caches() -> None:
    """Make the kernel forget dentries and inodes (it sends FORGET for ours)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("2\n")


@pytest.mark.fuse
@pytest.mark.alone  # it drops the kernel's caches
def test_a_hundred_thousand_chunks_list_stat_and_read_in_bounded_memory(
    source: Path, mount
) -> None:
    mounted = mount(source, "ro")
    mp, pid = mounted.path, mounted.process.pid
    chunks = mp / "data" / "c"
    start = status(pid, "VmRSS")

    for _ in range(2):  # cold, then warm
        assert run(f"find {mp} -type f | wc -l").strip() == str(ROWS * COLS + 2)
    listing = run(f"ls -l {chunks / '0'}").splitlines()
    assert listing[0].startswith("total ") and len(listing) == COLS + 1
    ls_sizes = {line.split()[-1]: int(line.split()[4]) for line in listing[1:]}
    assert ls_sizes == {str(j): os.stat(chunks / "0" / str(j)).st_size for j in range(COLS)}

    total = int(run(f"du -sb {chunks}").split()[0])
    sizes = [int(n) for n in run(f"find {chunks} -type f -printf '%s\\n'").split()]
    assert len(sizes) == ROWS * COLS and total == sum(sizes)

    # Every chunk has its own inode number, and keeps it after the kernel forgot it.
    numbers = run(f"find {chunks} -type f -printf '%i\\n'").split()
    assert len(set(numbers)) == ROWS * COLS
    before = os.stat(chunks / "7" / "4321").st_ino
    drop_kernel_caches()
    assert os.stat(chunks / "7" / "4321").st_ino == before

    # A full read of one directory with an independent reader: the bytes of every file.
    read = int(run(f"tar cf - -C {chunks} 3 | wc -c"))
    assert read > sum(ls_sizes.values()) / 2

    grown = status(pid, "VmRSS") - start
    assert grown < GROWTH_LIMIT, f"the daemon grew by {grown >> 20} MiB"
    assert status(pid, "VmHWM") < 256 << 20
    assert mounted.process.poll() is None
    assert "ERROR" not in mounted.log() and "Traceback" not in mounted.log()


@pytest.mark.fuse
@pytest.mark.alone  # it drops the kernel's caches
def test_the_inode_budget_makes_the_kernel_forget_directories(source: Path, mount) -> None:
    """With `inodes=4`, walking the chunk directories keeps only a few counted entries:
    the daemon asks the kernel to drop the oldest, and the walk still sees everything."""
    mounted = mount(source, "ro", "inodes=4", "debug")
    chunks = mounted.path / "data" / "c"
    for row in range(ROWS):
        assert len(os.listdir(chunks / str(row))) == COLS
    assert sorted(os.listdir(chunks), key=int) == [str(i) for i in range(ROWS)]
    assert "asking the kernel to forget" in mounted.log()
    assert os.stat(chunks / "0" / "17").st_size > 0
