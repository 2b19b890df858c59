"""What a run was made on and with: the machine, the packages, the code's revision."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
#: The packages whose versions decide what a benchmark measures.
PACKAGES = ("zarr", "numpy", "pyfuse3", "trio", "tensorstore")


def describe() -> dict[str, Any]:
    """The machine as fields, and as the one line the tables show (`text`)."""
    import zarr

    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        ram_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    packages = {}
    for name in PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            packages[name] = version(name)
    fields: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(ram_kib / (1 << 20), 1),
        "linux": platform.release(),
        "python": platform.python_version(),
        "packages": packages,
        "zarr_config": {
            "async.concurrency": zarr.config.get("async.concurrency"),
            "threading.max_workers": zarr.config.get("threading.max_workers"),
        },
    }
    fields["text"] = (
        f"{cpu}, {fields['cores']} cores, {fields['ram_gib']} GiB RAM, Linux {fields['linux']}, "
        f"Python {fields['python']}, " + ", ".join(f"{name} {v}" for name, v in packages.items())
    )
    return fields


def machine() -> str:
    """The machine in one line, as the tables show it."""
    return "machine: " + describe()["text"]


def code_digest() -> str:
    """A digest of shardfs/*.py as they are on disk: every daemon runs the code as it is
    when it starts, so a change in mid-run must show."""
    digest = hashlib.sha1()
    for path in sorted((ROOT / "shardfs").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:8]


def commit() -> str:
    """The commit measured, with `+` and the digest of shardfs/*.py where they differ from
    it (edits not committed)."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "shardfs"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{head}+{code_digest()}" if dirty else head or "unknown"


def revision() -> str:
    """The code measured: the commit, and the digest of shardfs/*.py (which may differ
    from the commit's)."""
    return f"{commit()}, shardfs/*.py digest {code_digest()}"
