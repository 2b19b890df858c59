"""zarr-python 2.18 in its own virtual environment, for writing and reading test data.

zarr-python 2 cannot live beside zarr-python 3, so the test set-up makes
`.venv-zarr2` in the repository (git-ignored) the first time it is needed and
reuses it while its requirements are unchanged. Tests hand it small scripts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-zarr2"
#: pytest too: zarr 2.18's draft v3 metadata decoder imports one of its test modules.
#: xarray for the tests of xarray on zarr 2: a 2024 release (2024.11 installs beside
#: zarr 2.18 and its numpy), with a pandas of its time (pandas 3 came after it).
REQUIREMENTS = ("zarr>=2.18,<2.19", "pytest>=8", "xarray>=2024.6,<2025", "pandas>=2.1,<3")


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
            raise RuntimeError(f"zarr-python 2 script failed:\n{result.stderr}")
        out = result.stdout.strip()
        return json.loads(out) if out else None


def ensure_zarr2() -> Zarr2:
    """The zarr-python 2 environment, created on first use."""
    marker = VENV / "shardfs-requirements.json"
    python = VENV / "bin" / "python"
    wanted = json.dumps(REQUIREMENTS)
    if not (python.exists() and marker.exists() and marker.read_text() == wanted):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *REQUIREMENTS,
            ],
            check=True,
        )
        marker.write_text(wanted)
    return Zarr2(python)
