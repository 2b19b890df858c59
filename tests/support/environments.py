"""Build every environment the tests run outside `.venv` at once, ahead of the tests:
`python -m tests.support.environments`. scripts/check starts it beside lint and types, so
that on a fresh clone no test waits for pip in turn (each is a few tens of seconds: the
user's, which builds pyfuse3, a few minutes). The tests' fixtures build the same ones
under the same locks, and find them made; this only saves them the wait. It prints one
line per environment and exits 1 if any failed (the fixture that needs it then says why).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.users import build_user_venv, why_no_users
from tests.support.webknossos_env import ensure_webknossos
from tests.support.zarr2 import ensure_newest_zarr, ensure_zarr2


def _user() -> None:
    reason = why_no_users()
    if reason:
        pytest.skip(reason)
    reason = build_user_venv()
    if reason:
        raise RuntimeError(reason)


BUILDS: dict[str, Callable[[], object]] = {
    "the ordinary users' shardfs": _user,
    "zarr-python 2.18": ensure_zarr2,
    "the newest zarr-python": ensure_newest_zarr,
    "webknossos": ensure_webknossos,
}


def _build(name: str) -> str:
    started = time.monotonic()
    try:
        BUILDS[name]()
    except pytest.skip.Exception as e:
        return f"environments: {name}: skipped ({e.msg})"
    except Exception as e:
        return f"environments: {name} FAILED: {e}"
    return f"environments: {name} ready ({time.monotonic() - started:.0f} s)"


def main() -> int:
    with ThreadPoolExecutor(len(BUILDS)) as pool:
        lines = list(pool.map(_build, BUILDS))
    print("\n".join(lines), flush=True)
    return int(any(" FAILED: " in line for line in lines))


if __name__ == "__main__":
    sys.exit(main())
