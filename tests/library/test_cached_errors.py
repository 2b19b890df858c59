"""Errors kept to be raised again (a corrupt shard's, cached so it is logged once; an open
file's after its chunk failed to decode) hold no traceback, context or cause: those pin the
frames of the code that failed, and every buffer those frames were decoding."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from shardfs.primitives.cache import LruCache
from shardfs.primitives.errors import CorruptData
from shardfs.storage import LocalStorage
from shardfs.view.base import Reader, logged_corruption


class Buffer:
    """Stands for a decoded buffer (a weakref can follow it, unlike bytes)."""

    def __init__(self) -> None:
        self.data = bytes(1 << 20)


def failing_decode(buffers: list[weakref.ref[Buffer]]) -> None:
    """Decodes into a buffer, then finds it corrupt: as an index decoder does, a
    CorruptData raised again with a message, `from None` (which keeps `__context__`)."""
    buffer = Buffer()
    buffers.append(weakref.ref(buffer))
    try:
        raise CorruptData(f"ids do not ascend in {len(buffer.data)} bytes")
    except CorruptData as e:
        raise logged_corruption(f"shard: corrupt: {e}") from None


def test_a_cached_failure_holds_no_traceback_context_or_cause() -> None:
    cache: LruCache[int] = LruCache(1 << 20, lambda v: 1, cache_errors=(CorruptData,))
    buffers: list[weakref.ref[Buffer]] = []
    for _ in range(2):  # loaded once, then raised from the cache
        with pytest.raises(CorruptData, match="ids do not ascend") as raised:
            cache.get("shard", lambda: failing_decode(buffers))
        assert raised.value.logged  # its one log line is not written again
        del raised
    assert len(buffers) == 1 and cache.stats.loads == 1
    kept = cache._items["shard"][0].error  # type: ignore[union-attr]
    assert type(kept) is CorruptData and kept.logged
    assert kept.__traceback__ is None and kept.__context__ is None and kept.__cause__ is None
    gc.collect()
    assert buffers[0]() is None  # nothing keeps the failed decoder's buffer


def test_an_open_file_keeps_no_buffer_of_its_failed_decode(tmp_path: Path) -> None:
    (tmp_path / "chunk").write_bytes(b"stored")
    storage = LocalStorage(tmp_path)
    stat = storage.stat("chunk")
    assert stat is not None
    buffers: list[weakref.ref[Buffer]] = []

    def decode(stored: bytes) -> bytes:
        buffer = Buffer()
        buffers.append(weakref.ref(buffer))
        raise CorruptData(f"{len(buffer.data)} bytes decoded, not {len(stored)}")

    with Reader(storage, "chunk", stat, storage.pin("chunk", stat), 0, 6, 6, decode=decode) as r:
        for _ in range(2):  # decoded once; the second read raises the kept error again
            with pytest.raises(CorruptData, match="bytes decoded") as raised:
                r.read(0, 6)
            assert raised.value.logged
            del raised
        assert len(buffers) == 1
        gc.collect()
        assert buffers[0]() is None  # while the file is still open
