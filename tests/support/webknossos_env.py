"""webknossos-libs (the `webknossos` package) in a virtual environment of its own, to write
WKW datasets as webknossos itself lays them out: its `datasource-properties.json` (`mags`
with `path`), its magnification directories, its downsampling.

It cannot live in the project's environment: it pins versions of packages the tests use
(httpx, rich, typing_extensions, fsspec, networkx, psutil, ...), so pip would change
them under the other tests. Made on first use as `.venv-webknossos` (git-ignored), like
the zarr-python 2 environment (tests/support/zarr2.py), and reused while its requirements are
unchanged. Tests hand it small scripts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.zarr2 import Zarr2, _ensure

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-webknossos"
#: The newest release when this was written; it writes WKW through `wkw` 1.1.24.
REQUIREMENTS = ("webknossos>=4.3,<4.4",)


def ensure_webknossos() -> Zarr2:
    """The webknossos environment (a `Zarr2` runs scripts in any environment)."""
    return _ensure(VENV, sys.executable, REQUIREMENTS)
