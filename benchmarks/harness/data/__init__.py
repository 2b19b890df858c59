"""The data sets more than one workload reads (one module each)."""

from __future__ import annotations

import os
from pathlib import Path


def tree_size(top: Path) -> tuple[int, int]:
    """(files, bytes) below `top`."""
    files = nbytes = 0
    for directory, _, names in os.walk(top):
        files += len(names)
        nbytes += sum(os.stat(os.path.join(directory, name)).st_size for name in names)
    return files, nbytes
