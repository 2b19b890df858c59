"""The one retry policy (`shardfs.primitives.retry.attempts`): how many tries, which wait, and never on
the event loop."""

from __future__ import annotations

import time

import pytest

from shardfs.primitives.blocking import WouldBlock, nonblocking
from shardfs.primitives.retry import attempts


def test_tries_at_once_then_with_growing_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    assert list(attempts(6, at_once=2, first=0.01, longest=0.03)) == [0, 1, 2, 3, 4, 5]
    assert len(pauses) == 3, "none before tries 1 and 2"
    bounds = [(0.005, 0.015), (0.01, 0.03), (0.015, 0.045)]  # 0.01, 0.02, 0.03 capped, jittered
    for pause, (low, high) in zip(pauses, bounds, strict=True):
        assert low <= pause <= high


def test_a_pause_on_the_event_loop_sends_the_call_to_a_thread() -> None:
    tried = []
    with nonblocking(), pytest.raises(WouldBlock):
        for attempt in attempts(5, at_once=1):
            tried.append(attempt)
    assert tried == [0, 1], "the tries that need no pause run inline"
