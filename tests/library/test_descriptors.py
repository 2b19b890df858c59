"""The descriptors local pins hold (`shardfs.storage.descriptors`), without FUSE: one per
version whatever the number of pins, never more than the budget, the least recently used
closed first and opened again at the next read of a pin, only if the file is unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardfs.primitives.errors import SourceChanged
from shardfs.storage import LocalStorage
from shardfs.storage import descriptors as descriptors_module
from shardfs.storage.base import Pin


def open_files(root: Path) -> list[str]:
    """The names of the files below `root` this process holds open, once per descriptor."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue  # the listing's own descriptor, closed by now
        if link.startswith(f"{root}/"):
            names.append(Path(link.removesuffix(" (deleted)")).name)
    return sorted(names)


def files(root: Path, n: int) -> LocalStorage:
    for i in range(n):
        (root / str(i)).write_bytes(b"file %d" % i)
    return LocalStorage(root)


def pin(storage: LocalStorage, key: str) -> Pin:
    stat = storage.stat(key)
    assert stat is not None
    return storage.pin(key, stat)


def test_pins_of_one_version_share_one_descriptor(tmp_path: Path) -> None:
    storage = files(tmp_path, 1)
    pins = [pin(storage, "0") for _ in range(100)]
    pins += [p.clone() for p in pins]
    assert open_files(tmp_path) == ["0"]
    assert {p.read(0, 6) for p in pins} == {b"file 0"}
    for p in pins[1:100]:
        p.close()
    assert open_files(tmp_path) == ["0"]
    del pins[1:]  # dropped without close: let go at the next pin made (their finalizer)
    pins[0].close()
    pin(storage, "0").close()
    assert open_files(tmp_path) == []


def test_beyond_the_budget_the_least_recently_used_descriptor_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten pins under a budget of four hold four descriptors; each still reads its file
    (opened again), and the one read last is the one kept longest."""
    monkeypatch.setattr(descriptors_module, "budget", lambda: 4)
    storage = files(tmp_path, 10)
    pins = [pin(storage, str(i)) for i in range(10)]
    assert open_files(tmp_path) == ["6", "7", "8", "9"]
    for _ in range(2):
        for i, p in enumerate(pins):
            assert p.read(0, 6) == b"file %d" % i
            assert len(open_files(tmp_path)) <= 4
    assert open_files(tmp_path) == ["6", "7", "8", "9"]
    pins[0].read(0, 1)
    assert open_files(tmp_path) == ["0", "7", "8", "9"]
    for p in pins:
        p.close()
    assert open_files(tmp_path) == []


def test_a_descriptor_closed_for_the_budget_reopens_only_an_unchanged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held, a version renamed over stays readable; closed for the budget meanwhile, it
    is gone (SourceChanged, as a version changed while open), and so is one appended to.
    A new pin on the new file is not troubled by the old one."""
    monkeypatch.setattr(descriptors_module, "budget", lambda: 1)
    storage = files(tmp_path, 3)
    first, second = pin(storage, "0"), pin(storage, "1")  # "0" is closed for "1"
    (tmp_path / "new").write_bytes(b"newer!")
    os.replace(tmp_path / "new", tmp_path / "0")
    with pytest.raises(SourceChanged, match="descriptor budget"):
        first.read(0, 6)  # which closed "1" to reopen "0"
    with open(tmp_path / "1", "ab") as f:
        f.write(b"more")
    with pytest.raises(SourceChanged, match="descriptor budget"):
        second.read(0, 6)
    fresh = pin(storage, "0")
    assert fresh.read(0, 6) == b"newer!"
    monkeypatch.setattr(descriptors_module, "budget", lambda: 2)
    held = pin(storage, "2")
    os.unlink(tmp_path / "2")
    assert held.read(0, 6) == b"file 2"  # within the budget: the removed file is held
    for p in (first, second, fresh, held):
        p.close()
    assert open_files(tmp_path) == []


def test_a_descriptor_in_a_read_is_never_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read on another thread holds its descriptor: the pool goes beyond its budget
    rather than close (and let the number be reused) under it."""
    monkeypatch.setattr(descriptors_module, "budget", lambda: 1)
    storage = files(tmp_path, 2)
    first = pin(storage, "0")
    pool = storage._descriptors
    descriptor = first._descriptor  # type: ignore[attr-defined]
    fd = pool.acquire(descriptor)  # as `_FilePin.read` does around its pread
    second = pin(storage, "1")  # (its own descriptor is closed for the budget at once)
    assert "0" in open_files(tmp_path)
    assert os.pread(fd, 6, 0) == b"file 0"
    pool.release(descriptor)
    assert second.read(0, 6) == b"file 1"
    assert open_files(tmp_path) == ["1"]  # the first read ended: back within the budget
    assert first.read(0, 6) == b"file 0"
    first.close()
    second.close()
