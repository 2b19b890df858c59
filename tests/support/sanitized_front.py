"""A pytest plugin of `scripts/sanitize-front` (`-p tests.support.sanitized_front`): the native
front is the build at $SHARDFS_FRONT_SO (with the sanitizers), in place of the installed one,
and a run in which a test is skipped, or none passes, fails: a sanitized run that tests
nothing must not look like one that found nothing."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

import pytest

NAME = "shardfs.fuse.kernel_served._front"


def _load() -> object:
    """Import the build as the front's module, before anything imports the installed one."""
    if NAME in sys.modules:
        raise pytest.UsageError(f"{NAME} was imported before this plugin")
    path = os.environ["SHARDFS_FRONT_SO"]
    loader = importlib.machinery.ExtensionFileLoader(NAME, path)
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[NAME] = module
    return module


_front = _load()
_outcomes = {"passed": 0, "skipped": 0}


def pytest_collection_finish(session: pytest.Session) -> None:
    from shardfs.fuse.kernel_served import front

    if front._front is not _front:
        raise pytest.UsageError("the tests would run the installed front, not the sanitized one")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _outcomes["skipped"] += 1
    elif report.passed and report.when == "call":
        _outcomes["passed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == 0 and (_outcomes["skipped"] or not _outcomes["passed"]):
        print(f"\nsanitized front: {_outcomes} (every test must run)", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
