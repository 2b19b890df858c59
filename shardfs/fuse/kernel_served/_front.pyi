"""Types of the native front's C module (`_front.c`)."""

from typing import Any

ROWS_MAX: int
SLOTS_MAX: int

class Front:
    channel: int
    def __init__(self, device: int, timeout: float, kept_max: int, rows_max: int = ...) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> bool: ...
    def directory(
        self, nodeid: int, doc_path: bytes, doc_version: tuple[int, int, int, int, int]
    ) -> None: ...
    def keep(
        self, id: int, fd: int, path: bytes, version: tuple[int, int, int, int, int]
    ) -> bool: ...
    def fill(
        self,
        parent: int,
        kept_id: int,
        slot: int,
        names: list[bytes],
        nodeids: list[int],
        offsets: list[int],
        lengths: list[int],
        mtime_ns: int,
        mode: int,
        uid: int,
        gid: int,
        position: int = -1,
    ) -> int: ...
    def listing(
        self,
        nodeid: int,
        total: int,
        first: int,
        made_from: list[tuple[bytes, tuple[int, int, int, int, int] | None, bool]] | None = None,
    ) -> bool: ...
    def unlist(self, nodeid: int) -> None: ...
    def ref(self, slot: int, count: int) -> None: ...
    def unref(self, slot: int, count: int) -> int: ...
    def shown_at(self, id: int) -> float: ...
    def drop(self, id: int) -> None: ...
    def stats(self) -> dict[str, Any]: ...
