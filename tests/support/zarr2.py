"""zarr-python 2.18 (and the newest zarr-python) in virtual environments of their own, for
writing and reading test data.

zarr-python 2 cannot live beside zarr-python 3, so the test set-up makes
`.venv-zarr2` in the repository (git-ignored) the first time it is needed and
reuses it while its requirements are unchanged. Tests hand it small scripts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-zarr2"
#: pytest too: zarr 2.18's draft v3 metadata decoder imports one of its test modules.
#: xarray for the tests of xarray on zarr 2: a 2024 release (2024.11 installs beside
#: zarr 2.18 and its numpy), with a pandas of its time (pandas 3 came after it).
#: ome-zarr 0.10.x (0.10.3) for the OME-Zarr 0.4 reader and writer of legacy tools, on
#: zarr 2 (0.12 moved to zarr 3; 0.11.1 is zarr 2 too, with the same reader). It brings
#: dask, distributed, scikit-image (with scipy) and s3fs, which roughly doubles the
#: environment (about 565 MB, 35 s to install); pip cannot leave any of them out.
REQUIREMENTS = (
    "zarr>=2.18,<2.19",
    "pytest>=8",
    "xarray>=2024.6,<2025",
    "pandas>=2.1,<3",
    "ome-zarr>=0.10,<0.11",
    # numcodecs' array-to-bytes codecs, to read arrays zarr-python 3 writes with them
    "pcodec>=0.3",
    # (1.0.1.post0 breaks `import numcodecs` before 0.17: it cannot parse that version)
    "zfpy>=1.0,!=1.0.1.post0",
)


@dataclass(frozen=True)
class Zarr2:
    python: Path

    def run(self, script: str, *, draft: bool = False, **params: Any) -> Any:
        """Run `script` under zarr-python 2 and return what it prints as JSON.

        `params` reach the script as the dict `params`; `draft` enables the
        experimental v3 API with the sharding storage transformer.
        """
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        if draft:
            env |= {"ZARR_V3_EXPERIMENTAL_API": "1", "ZARR_V3_SHARDING": "1"}
        prelude = f"import json\nparams = json.loads({json.dumps(json.dumps(params))})\n"
        result = subprocess.run(
            [str(self.python), "-c", prelude + textwrap.dedent(script)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"script failed under {self.python}:\n{result.stderr}")
        out = result.stdout.strip()
        return json.loads(out) if out else None


def ensure_zarr2() -> Zarr2:
    """The zarr-python 2 environment, created on first use."""
    return _ensure(VENV, sys.executable, REQUIREMENTS)


#: The newest zarr-python release needs a newer Python than the project's (3.12 or later).
NEWEST_VENV = ROOT / ".venv-zarr-newest"
NEWEST_REQUIREMENTS = ("zarr>=3.2", "numpy", "pcodec>=0.3", "zfpy>=1.0,!=1.0.1.post0")
NEWEST_PYTHONS = ("3.13", "3.12")


def ensure_newest_zarr() -> Zarr2:
    """zarr-python's newest release in an environment of its own, on the newest Python
    that pyenv has (3.13 or 3.12); pytest skips, saying why, where there is none."""
    base = _newer_python()
    if base is None:
        pytest.skip(
            "the newest zarr-python needs Python >= 3.12, and pyenv has none here "
            f"(looked for {', '.join(NEWEST_PYTHONS)})"
        )
    return _ensure(NEWEST_VENV, base, NEWEST_REQUIREMENTS)


def _newer_python() -> str | None:
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return None
    versions = subprocess.run(
        [pyenv, "versions", "--bare"], capture_output=True, text=True
    ).stdout.split()
    for wanted in NEWEST_PYTHONS:
        for version in sorted(versions, reverse=True):
            if version == wanted or version.startswith(wanted + "."):
                found = subprocess.run(
                    [pyenv, "which", "python"],
                    capture_output=True,
                    text=True,
                    env=dict(os.environ, PYENV_VERSION=version),
                )
                if found.returncode == 0:
                    return found.stdout.strip()
    return None


def _ensure(venv: Path, base_python: str, requirements: tuple[str, ...]) -> Zarr2:
    """A virtual environment of `base_python` at `venv` with `requirements`, made on first
    use and kept while they are unchanged."""
    marker = venv / "shardfs-requirements.json"
    python = venv / "bin" / "python"
    wanted = json.dumps([base_python, *requirements])
    # (another pytest worker, or the build ahead that scripts/check starts, may be making
    # it: they take turns, and the later ones find it made)
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (python.exists() and marker.exists() and marker.read_text() == wanted):
            _make(venv, base_python, requirements)
            marker.write_text(wanted)
    return Zarr2(python)


def _make(venv: Path, base_python: str, requirements: tuple[str, ...]) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--disable-pip-version-check", *requirements], check=True)
