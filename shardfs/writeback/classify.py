"""What a file written at a path of the view is, and where it will be stored.

A read-write mount routes every file by the path it is written to (see `Kind`): a
chunk of an array the view serves, a metadata document, a file at a chunk key of an
array the view shows unchanged (stored whole, as written), or a scratch file that
never reaches the source. Reads only; no state but a bounded cache of what arrays
shown unchanged name their chunk files.
"""

from __future__ import annotations

import logging

from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.zarr_v2 import ZARRAY, ZATTRS, ZGROUP, ZMETADATA, Transform
from shardfs.formats.zarr_v3 import parse_node
from shardfs.primitives.errors import InvalidMetadata, InvalidWrite, ReadOnly
from shardfs.view.hierarchy import METADATA, NodeDoc, join
from shardfs.view.namespace import ArrayView, Namespace, Node, Role
from shardfs.view.presentation import View
from shardfs.writeback.overlay import Kind, ShardRef

log = logging.getLogger("shardfs")

V2_DOCS = (ZARRAY, ZATTRS, ZGROUP, ZMETADATA)
#: Bound on `Classifier._unchanged` (arrays shown unchanged, by document version).
UNCHANGED_CACHE = 4096


class Classifier:
    def __init__(self, namespace: Namespace) -> None:
        self.ns = namespace
        #: (directory, document version) -> what files below the node there are: see
        #: `_unchanged_keys`
        self._unchanged: dict[tuple[str, object], tuple[ChunkKeyEncoding, int] | str | None] = {}

    def current(self, node: Node) -> Node:
        """A directory node as it is now: writes turn directories into groups and arrays."""
        if node.role in (Role.DIR, Role.GROUP, Role.ARRAY):
            return self.ns.presentation.dir_node(node.path)
        return node

    def classify(
        self, parent: Node, name: str, writing: bool = False
    ) -> tuple[Node, Kind, ShardRef | None]:
        """What a file written at `name` in `parent` is, and where it will be stored.
        `writing` (a file created, renamed or linked there): ReadOnly where it could be
        neither stored nor kept as scratch (see `_stored_as_written`)."""
        parent = self.current(parent)
        path = join(parent.path, name)
        if writing:
            check_format(path, name, self.ns.view)
        if parent.role in (Role.ARRAY, Role.CHUNK_DIR):
            if parent.role is Role.CHUNK_DIR:
                parent = self.ns.refresh(parent)  # `current` made only an array's fresh
            array = parent.array
            if parent.role is Role.ARRAY and name in array.docs:
                return Node(path, Role.METADATA, array), Kind.METADATA, None
            node = self.ns.shards.key_node(parent, name)
            # A key outside the chunk grid names no chunk: committed, it would land where
            # the view never shows it (a shard or chunk object past the grid, a slot past
            # the edge of a partial shard). Like any name that is not a key, it is scratch.
            if node is not None and node.role is Role.CHUNK and array.layout.in_bounds(node.coords):
                shard, _ = array.layout.shard_of(node.coords)
                return node, Kind.CHUNK, (array.key, shard)
            return Node(path, Role.FILE), Kind.SCRATCH, None
        if parent.role is Role.GROUP and name in parent.meta.docs:  # type: ignore[union-attr]
            return Node(path, Role.METADATA, parent.meta), Kind.METADATA, None
        documents = V2_DOCS if self.ns.view is View.V2 else (METADATA,)
        if parent.role in (Role.DIR, Role.GROUP) and name in documents:
            return Node(path, Role.FILE), Kind.METADATA, None
        if parent.role is Role.DIR and self._stored_as_written(path, writing):
            return Node(path, Role.FILE), Kind.PASSTHROUGH, None
        return Node(path, Role.FILE), Kind.SCRATCH, None

    def _stored_as_written(self, path: str, writing: bool) -> bool:
        """Whether a file at `path`, in a plain directory of the view, lies at a chunk key of
        an array the view shows unchanged (real shards or chunks and its own `zarr.json`):
        such a file is stored whole, as written (kind PASSTHROUGH). The array is the nearest
        node above the file. Below a node whose `zarr.json` does not tell its chunk keys
        (not Zarr v3 metadata, an unknown chunk key encoding), nothing is known to be
        scratch: `writing` there is refused (ReadOnly, logged), never taken and dropped."""
        if self.ns.tree.translates:
            return False  # translated sources are mounted read-only
        directory = path.rpartition("/")[0]
        while True:
            doc = self.ns.tree.find(directory)
            if doc is not None:
                break
            if not directory:
                return False
            directory = directory.rpartition("/")[0]
        keys = self._unchanged_keys(directory, doc)
        if isinstance(keys, str):
            if not writing:
                return False
            error = ReadOnly(
                f"{path}: cannot be written: {join(directory, METADATA)} is shown unchanged and "
                f"does not tell which files are its chunks ({keys})"
            )
            log.error("%s", error)
            error.logged = True
            raise error
        if keys is None:
            return False
        encoding, ndim = keys
        key = path[len(directory) + 1 :] if directory else path
        return encoding.decode(key, ndim) is not None

    def _unchanged_keys(
        self, directory: str, doc: NodeDoc
    ) -> tuple[ChunkKeyEncoding, int] | str | None:
        """The chunk key encoding and rank of the array at `directory` if the view shows it
        unchanged; None if the node there is a group or an array the view serves; a
        reason if its document does not tell. Kept per version of the document."""
        cached = self._unchanged.get((directory, doc.version), False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        result: tuple[ChunkKeyEncoding, int] | str | None = None
        if self.ns.presentation.dir_node(directory).role is Role.DIR:
            try:
                meta = parse_node(self.ns.tree.read(doc) or b"")
                if meta["node_type"] == "array":
                    shape = meta.get("shape")
                    if not isinstance(shape, list):
                        raise InvalidMetadata(f"shape is {shape!r}")
                    result = (
                        ChunkKeyEncoding.from_metadata(meta.get("chunk_key_encoding")),
                        len(shape),
                    )
            except InvalidMetadata as e:
                result = str(e)
        if len(self._unchanged) >= UNCHANGED_CACHE:
            self._unchanged.clear()
        self._unchanged[(directory, doc.version)] = result
        return result


def check_format(path: str, name: str, view: View) -> None:
    """Refuse a metadata document of the other Zarr format than the view shows. Taken as a
    scratch file, it would vanish at unmount, and the chunks written after it would land
    at keys the view does not serve: a writer's whole array would be lost unseen."""
    if view is View.V2 and name == METADATA:
        raise InvalidWrite(
            f"{path}: Zarr v3 metadata cannot be written in the v2 view "
            "(mount without -o view=v2 to write Zarr v3)"
        )
    if view is View.V3 and name in V2_DOCS:
        raise InvalidWrite(
            f"{path}: Zarr v2 metadata cannot be written in the v3 view "
            "(mount with -o view=v2 to write Zarr v2)"
        )


def check_chunk(array: ArrayView, path: str, size: int) -> None:
    """A chunk the v2 view serves uncompressed must be written back whole."""
    v2 = array.v2
    if v2 is not None and v2.transform is Transform.DECODE:
        assert v2.encoder is not None
        if size != v2.encoder.nbytes:
            raise InvalidWrite(
                f"{path}: an uncompressed chunk of this array has {v2.encoder.nbytes} "
                f"bytes, not {size}"
            )
