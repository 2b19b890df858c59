"""What a read-write mount stores in the source outside commits, all I/O: metadata
documents translated back (`formats.metadata_write`), and files stored whole, as
written, at chunk keys of arrays the view shows unchanged. Every call raises
WouldBlock inline before it changes anything (storage writes always do), and the
caller holds the mutation lock.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Hashable
from typing import Any

from shardfs.formats import jsondoc, ome
from shardfs.formats import metadata_write as mw
from shardfs.formats.zarr_v2 import ZARRAY
from shardfs.formats.zarr_v3 import render
from shardfs.primitives.errors import IsADirectory, NotFound
from shardfs.storage.base import ABSENT
from shardfs.view.hierarchy import METADATA, join
from shardfs.view.namespace import Namespace
from shardfs.view.presentation import View
from shardfs.writeback.overlay import Buffered


class Stores:
    def __init__(self, namespace: Namespace, shard_new: int | None) -> None:
        self.ns = namespace
        self.storage = namespace.storage
        self.shard_new = shard_new

    def metadata(self, path: str, raw: bytes) -> None:
        """Translate the metadata document written at `path` back and store it."""
        directory, _, name = path.rpartition("/")
        source, version = self._read_metadata(directory)
        array = self.ns.presentation.array_at(directory) if source is not None else None
        data: bytes | None
        if self.ns.view is View.V3:
            view = None
            if array is not None and array.layout.levels:  # sharded: the view shows it unsharded
                view = json.loads(array.layout.view_metadata)
            data = mw.stored_v3(raw, source, view, self.shard_new, path)
        else:
            axes = self._image_axes(directory) if source is None and name == ZARRAY else None
            zarray = array.v2.zarray if array is not None and array.v2 is not None else None
            data = mw.stored_v2(directory, name, raw, source, zarray, axes, self.shard_new)
        if data is None:
            return
        self.storage.put(join(directory, METADATA), [data], version)
        if self.ns.view is View.V2:
            attributes = json.loads(data).get("attributes") or {}
            for level, names in ome.dimension_names(attributes).items():
                self._name_axes(join(directory, level), names)

    def entry(self, entry: Buffered) -> None:
        """Store a buffered file of kind PASSTHROUGH at its key, as it is now."""
        generation, content = snapshot(entry)
        self.object(entry.path, content)
        entry.committed = generation

    def object(self, key: str, content: bytes) -> None:
        """Put `content` at `key` in the source, whole and durably, over what is there."""
        stat = self.storage.stat(key)
        if stat is not None and stat.is_dir:
            raise IsADirectory(key)
        self.storage.put(key, [content], ABSENT if stat is None else stat.version)

    def delete(self, key: str) -> None:
        """Remove the object at `key` from the source, if there is one."""
        stat = self.storage.stat(key)
        if stat is not None and not stat.is_dir:
            with contextlib.suppress(NotFound):  # removed by someone else meanwhile
                self.storage.delete(key, stat.version)

    def _read_metadata(self, directory: str) -> tuple[dict[str, Any] | None, Hashable]:
        """The stored `zarr.json` of `directory` (None if none) and its version (ABSENT if
        none), to store the next one over it."""
        stat = self.storage.stat(join(directory, METADATA))
        if stat is None or stat.is_dir:
            return None, ABSENT
        raw = self.storage.read(join(directory, METADATA), 0, stat.size, stat.version)
        return jsondoc.loads(raw), stat.version

    def _name_axes(self, directory: str, names: list[str]) -> None:
        """Give the level array at `directory` of an OME-Zarr image the dimension names
        0.5 requires (its image's axes): a 0.4 writer has no words for them."""
        meta, version = self._read_metadata(directory)
        named = mw.with_dimension_names(meta, names) if meta is not None else None
        if named is not None:
            self.storage.put(join(directory, METADATA), [render(named)], version)

    def _image_axes(self, directory: str) -> list[str] | None:
        """The axes names of the OME-Zarr image (above `directory`) whose level it is."""
        group = directory
        while group:
            group = group.rpartition("/")[0]
            meta, _ = self._read_metadata(group)
            if meta is not None and ome.is_v05(meta.get("attributes")):
                level = directory[len(group) + 1 :] if group else directory
                return ome.dimension_names(meta["attributes"]).get(level)
        return None


def snapshot(entry: Buffered) -> tuple[int, bytes]:
    """(generation, content) of a buffered file that is pinned or not yet placed."""
    taken = entry.blob.snapshot()
    assert taken is not None, "a pinned blob is never released"
    return taken
