"""Where the nodes of a source hierarchy and their documents are stored.

The namespace shows nodes at view paths. A Zarr v3 source stores each node
at the same path (`<path>/zarr.json`, chunks beside it) and everything else
in it passes through. A draft v3 source (zarr-python 2.14-2.18) keeps
metadata under `meta/root/` and chunks under `data/root/`; the view shows it
as final Zarr v3, so nothing of its own layout passes through.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from shardfs.formats import jsondoc, zarr_draft
from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.zarr_v3 import parse_node, parse_node_spans
from shardfs.primitives.errors import (
    InvalidMetadata,
    NotADirectory,
    NotFound,
    SourceChanged,
    StorageError,
)
from shardfs.primitives.retry import attempts
from shardfs.storage.base import Stat, Storage

METADATA = "zarr.json"


def join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


@dataclass(frozen=True)
class NodeDoc:
    """The stored document of a node: `key` is None for a draft group without one."""

    key: str | None
    stat: Stat

    @property
    def version(self) -> tuple[str | None, object]:
        return self.key, self.stat.version


class Hierarchy(ABC):
    """A source layout: how view paths map to node documents and chunk objects."""

    #: Whether source entries that are not nodes are shown (at the same path).
    passthrough: bool
    #: Whether documents are translated, so every node needs a rewritten `zarr.json`.
    translates: bool

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        #: the root `zarr.json` as `open_hierarchy` read it (its version, its bytes): what a
        #: look at the source before the mount reads instead of asking the store again
        self.root_document: tuple[Hashable, bytes] | None = None

    @abstractmethod
    def find(self, path: str) -> NodeDoc | None:
        """The document of the node at view directory `path`, if there is a node."""

    def document_key(self, path: str) -> str | None:
        """The one key whose stat alone is the version of the document of a node at view
        directory `path` (what `find` stats), where the layout has one; None where `find`
        may look at several (see `DraftV3`)."""
        return None

    def read(self, doc: NodeDoc) -> bytes | None:
        """The stored document `doc` (None if the node has none), exactly that version:
        SourceChanged if it has changed since."""
        if doc.key is None:
            return None
        return self.storage.read(doc.key, 0, doc.stat.size, doc.stat.version)

    @abstractmethod
    def parse(self, raw: bytes | None) -> dict[str, Any]:
        """The node's metadata in final Zarr v3 form; InvalidMetadata if it has none."""

    def parse_spans(self, raw: bytes | None) -> tuple[dict[str, Any], tuple[int, int] | None]:
        """`parse`, with the byte span of the attributes in `raw` where a document the view
        writes can take them as stored (see `zarr_v3.with_attributes`), else None."""
        return self.parse(raw), None

    @abstractmethod
    def children(self, path: str) -> list[str]:
        """Names of the directories below node `path` that may hold nodes."""

    @abstractmethod
    def listed(self, path: str) -> str:
        """The source directory whose listing `children(path)` names them from."""

    @abstractmethod
    def data_dir(self, path: str) -> str:
        """The source directory holding the chunk objects of the array at `path`."""

    def chunk_keys(self, keys: ChunkKeyEncoding) -> Any:
        """How chunk objects (shards) are named in `data_dir`, given the metadata's encoding."""
        return keys

    def _stored(self, key: str) -> NodeDoc | None:
        """The document stored at `key`, if that is a file."""
        stat = self.storage.stat(key)
        return NodeDoc(key, stat) if stat is not None and not stat.is_dir else None


class ZarrV3(Hierarchy):
    passthrough = True
    translates = False

    def find(self, path: str) -> NodeDoc | None:
        return self._stored(join(path, METADATA))

    def document_key(self, path: str) -> str | None:
        return join(path, METADATA)

    def parse(self, raw: bytes | None) -> dict[str, Any]:
        return self.parse_spans(raw)[0]

    def parse_spans(self, raw: bytes | None) -> tuple[dict[str, Any], tuple[int, int] | None]:
        assert raw is not None
        return parse_node_spans(raw)

    def children(self, path: str) -> list[str]:
        return [e.name for e in self.storage.list(path) if e.stat.is_dir]

    def listed(self, path: str) -> str:
        return path

    def data_dir(self, path: str) -> str:
        return path


class DraftV3(Hierarchy):
    """zarr-python 2's draft layout, whose groups may be implicit (a directory only)."""

    passthrough = False
    translates = True

    def find(self, path: str) -> NodeDoc | None:
        for key in zarr_draft.metadata_keys(path):
            doc = self._stored(key)
            if doc is not None:
                return doc
        stat = self.storage.stat(join("meta/root", path) if path else "meta/root")
        if stat is not None and stat.is_dir:
            return NodeDoc(None, stat)  # an implicit group
        if not path:
            root = self.storage.stat(METADATA)
            return NodeDoc(None, root) if root is not None else None
        return None

    def parse(self, raw: bytes | None) -> dict[str, Any]:
        if raw is None:
            return zarr_draft.translate_group({})
        try:
            doc = jsondoc.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidMetadata(f"not valid JSON: {e}") from None
        if isinstance(doc, dict) and "shape" in doc:
            return zarr_draft.translate_array(doc)
        return zarr_draft.translate_group(doc)

    def children(self, path: str) -> list[str]:
        try:
            entries = self.storage.list(self.listed(path))
        except (NotFound, NotADirectory):
            return []
        names = set()
        for entry in entries:
            if entry.stat.is_dir:
                names.add(entry.name)
            else:
                for suffix in (".array.json", ".group.json"):
                    if entry.name.endswith(suffix) and len(entry.name) > len(suffix):
                        names.add(entry.name.removesuffix(suffix))
        return sorted(names)

    def listed(self, path: str) -> str:
        return join("meta/root", path) if path else "meta/root"

    def data_dir(self, path: str) -> str:
        return zarr_draft.data_prefix(path)

    def chunk_keys(self, keys: ChunkKeyEncoding) -> Any:
        return zarr_draft.DraftChunkKeys(keys.separator)


def open_hierarchy(storage: Storage) -> Hierarchy:
    """The layout of the source, from its root `zarr.json`; InvalidMetadata if it has none.
    (Read by its version, as every read of a document is: a disk cache then keeps it.)"""
    for _ in attempts():
        stat = storage.stat(METADATA)
        if stat is None or stat.is_dir:
            raise InvalidMetadata("no zarr.json at the root")
        try:
            raw = storage.read(METADATA, 0, stat.size, stat.version)
            break
        except SourceChanged:
            continue  # replaced between the stat and the read: read the new one
    else:
        raise StorageError(f"{storage.describe(METADATA)} keeps changing")
    hierarchy: Hierarchy
    if zarr_draft.is_draft_entry_point(raw):
        hierarchy = DraftV3(storage)
    else:
        parse_node(raw)
        hierarchy = ZarrV3(storage)
    hierarchy.root_document = (stat.version, raw)
    return hierarchy
