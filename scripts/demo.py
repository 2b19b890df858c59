"""The README's demo: write a sharded array with zarr-python, mount it, read it as a plain array.

Run it through the README command (it sets up .venv first). Data goes to
demo-data/ in the repository, which git ignores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ShardingCodec

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "demo-data"
SOURCE, MOUNT = DATA / "sharded.zarr", DATA / "mnt"
SHARDFS = str(Path(sys.executable).with_name("shardfs"))


def make_source() -> np.ndarray:
    shutil.rmtree(SOURCE, ignore_errors=True)
    group = zarr.open_group(SOURCE, mode="w", attributes={"description": "shardfs demo"})
    values = np.arange(64 * 64, dtype="uint16").reshape(64, 64)
    array = group.create_array(
        "image", shape=values.shape, dtype=values.dtype, shards=(32, 32), chunks=(8, 8)
    )
    array[:] = values
    return values


def run(*args: str) -> None:
    """Run a command as the reader would type it; if it fails, its own message (printed
    by it) is the demo's last word, not a traceback."""
    print("$", " ".join(args))
    status = subprocess.run(args, check=False).returncode
    if status:
        sys.exit(f"demo: {args[0]} {args[1]} failed ({status}); its message is above")


def main() -> None:
    values = make_source()
    print(f"source {SOURCE.relative_to(ROOT)}: 64x64 uint16, 32x32 shards of 8x8 chunks")
    print(
        "  stored files:",
        sorted(str(p.relative_to(SOURCE)) for p in SOURCE.rglob("*") if p.is_file()),
    )
    MOUNT.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(MOUNT):
        run("fusermount3", "-u", str(MOUNT))
    run(SHARDFS, "mount", str(SOURCE), str(MOUNT), "-o", "ro")
    try:
        chunk_dir = MOUNT / "image" / "c" / "0"
        print(f"virtual chunk files in {chunk_dir.relative_to(ROOT)}:")
        for name in sorted(os.listdir(chunk_dir), key=int):
            print(f"  c/0/{name}: {os.path.getsize(chunk_dir / name)} bytes")
        metadata = json.loads((MOUNT / "image" / "zarr.json").read_text())
        print("view zarr.json chunk_grid:", metadata["chunk_grid"])
        print("view zarr.json codecs:", [c["name"] for c in metadata["codecs"]])
        plain = zarr.open_array(MOUNT / "image", mode="r")
        assert not any(isinstance(c, ShardingCodec) for c in plain.metadata.codecs)
        read = plain[:]
        print("read through the mount, as a plain unsharded array: chunks", plain.chunks)
        print(read[:4, :8])
        assert np.array_equal(read, values), "values differ"
        print("all 4096 values match what was written")
        shards = sum(1 for p in (SOURCE / "image" / "c").rglob("*") if p.is_file())
        chunks = sum(len(files) for _, _, files in os.walk(MOUNT / "image" / "c"))
    finally:
        run(SHARDFS, "umount", str(MOUNT))
    print(
        f"\nwhat happened: the {shards} stored shards of image/ were shown as {chunks} plain "
        "chunk files, one per inner chunk, served from the shards (nothing was copied)"
    )
    print("next: mount your own sharded Zarr v3 directory (README: Quick start)")
    print('  export PATH="$PWD/.venv/bin:$PATH"')
    print("  mkdir -p ~/mnt/zarr && shardfs mount path/to/your.zarr ~/mnt/zarr -o ro")
    print("  ls ~/mnt/zarr; shardfs umount ~/mnt/zarr")


if __name__ == "__main__":
    main()
