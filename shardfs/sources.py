"""Opening a source: its storage, what it holds, and the view a mount serves of it.

This is where the layers are put together, for the command line and for any
other front end: storage (local or S3, with the disk cache), the hierarchy or
precomputed volume or WKW dataset at the source's root, and the view over it
(read-only, read-write, precomputed or WKW), with what earlier mounts left to commit.
Errors a user can fix are UsageError, with a message that names the source.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from shardfs.formats.zarr_v3 import is_array, is_sharded
from shardfs.options import MountOptions
from shardfs.primitives.errors import InvalidMetadata, ShardfsError, StorageError, UsageError
from shardfs.primitives.private import UnsafeState
from shardfs.storage import LocalStorage, Storage
from shardfs.view import Namespace, View
from shardfs.view.hierarchy import METADATA, Hierarchy, join, open_hierarchy
from shardfs.view.interface import ViewInterface
from shardfs.view.precomputed import PrecomputedNamespace, PrecomputedSource, open_volume
from shardfs.view.presentation import Covers
from shardfs.view.wkw import WkwNamespace, WkwSource, open_wkw
from shardfs.writeback import Workspace, WriteBuffer
from shardfs.writeback.leftover import Leftovers

if TYPE_CHECKING:
    from shardfs.formats.dandi_manifest import PinnedTree
    from shardfs.storage.disk_cache import DiskCache

log = logging.getLogger("shardfs")


def is_local(source: str) -> bool:
    return not source.startswith("s3://")


def open_storage(source: str, options: MountOptions) -> Storage:
    """The storage at SOURCE (a directory or s3://BUCKET/PREFIX), whatever it holds."""
    pinned = (
        "manifest"
        if options.manifest is not None
        else "as_of"
        if options.as_of is not None
        else None
    )
    if not is_local(source):
        from shardfs.storage.s3 import S3Storage, parse_url  # boto3 only for S3 sources

        if pinned is not None:
            return _open_pinned(source, options)
        bucket, prefix = parse_url(source)
        return S3Storage(bucket, prefix, options.s3_config(), open_disk_cache(options))
    if pinned is not None:
        raise UsageError(f"option {pinned} is for S3 sources (s3://BUCKET/PREFIX)")
    if options.cache_dir:
        raise UsageError("option cache_dir is for S3 sources (a local source is on disk already)")
    if not os.path.isdir(source):
        problem = "is not a directory" if os.path.exists(source) else "does not exist"
        raise UsageError(f"source {source} {problem}")
    return LocalStorage(source)


def _open_pinned(source: str, options: MountOptions) -> Storage:
    """The S3 source pinned to a manifest or a time; a manifest whose own entries do not
    add up to its `zarrChecksum` is one line in the log (see `check_manifest`)."""
    from shardfs.storage.pinned import open_pinned

    storage = open_pinned(
        source, options.s3_config(), open_disk_cache(options), options.manifest, options.as_of
    )
    if options.manifest is not None:
        check_manifest(storage.tree, options.manifest)
    return storage


def check_manifest(tree: PinnedTree, name: str) -> None:
    """Log one warning if the manifest's entries (ETags and sizes) do not add up to its
    `zarrChecksum`: its entries, which are what is mounted, are then not what was
    published under that checksum. Costs no request."""
    from shardfs.checksum.pinned import tree_checksum

    given = tree.statistics.get("zarrChecksum")
    if given is None:
        return
    computed = str(tree_checksum(tree))
    if computed != given:
        log.warning(
            "manifest %s: its entries add up to the zarr checksum %s, not to its zarrChecksum "
            "%s; mounted as its entries name them",
            name,
            computed,
            given,
        )


def open_disk_cache(options: MountOptions) -> DiskCache | None:
    """The disk cache `cache_dir` names, if any. A directory another user could change
    (see `primitives.private`), or one that cannot be used (a full or read-only file
    system), only costs the caching: one line says why, and the mount goes on."""
    if not options.cache_dir:
        return None
    from shardfs.storage.disk_cache import CacheUnusable, DiskCache

    try:
        return DiskCache(options.cache_dir, options.cache_size)
    except UnsafeState as e:
        log.warning("cache_dir %s; going on without the disk cache", e)
    except CacheUnusable as e:
        log.warning("%s; going on without the disk cache", e)
    return None


def open_source(
    source: str, options: MountOptions | None = None
) -> Hierarchy | PrecomputedSource | WkwSource:
    """The hierarchy at SOURCE (a directory or s3://BUCKET/PREFIX), checked to be
    Zarr v3 (final or draft) at its root; or, with no zarr.json there, a WKW dataset
    (`datasource-properties.json` or a magnification's `header.wkw`) or a Neuroglancer
    precomputed volume (`info`)."""
    options = options or MountOptions()
    storage = open_storage(source, options)
    try:
        stat = storage.stat("zarr.json")
        if stat is None or stat.is_dir:
            found = _other_format(storage, View(options.view))
            if found is not None:
                return found
    except StorageError as e:
        raise UsageError(f"source {source}: {e}") from None
    except InvalidMetadata as e:
        raise UsageError(f"source {source} is not a valid {e}") from None
    if stat is None or stat.is_dir:
        hint = (
            " (it looks like Zarr v2)" if storage.stat(".zgroup") or storage.stat(".zarray") else ""
        )
        raise UsageError(f"source {source} is not a Zarr v3 hierarchy: no zarr.json{hint}")
    try:
        return open_hierarchy(storage)
    except InvalidMetadata as e:
        raise UsageError(f"source {source}: {e}") from None


#: How many nodes `note_nothing_sharded` looks at before it gives up and says nothing.
SHARDED_LOOKUP_NODES = 100


def note_nothing_sharded(
    source: Hierarchy | PrecomputedSource | WkwSource, name: str, view: str = "v3"
) -> None:
    """Log one warning if a Zarr source holds no sharded array, or a precomputed volume no
    sharded scale: the mount then shows every file as stored (but the metadata, in the
    v2 `view`), which is worth a word where the user expected shards unsharded. The walk reads node documents only, breadth first,
    and stops at the first sharded array or after SHARDED_LOOKUP_NODES nodes (then, or if
    a document cannot be read, it says nothing: the mount reports real errors itself)."""
    if isinstance(source, WkwSource):
        return  # always shown as Zarr
    if isinstance(source, PrecomputedSource):
        if not source.volume.scales and not source.volume.unchanged:
            log.warning("no sharded scale in %s: every file is shown as it is stored", name)
        return
    pending, looked = [""], 0
    try:
        while pending and looked < SHARDED_LOOKUP_NODES:
            path = pending.pop(0)
            looked += 1
            doc = source.find(path)
            if doc is None:
                continue
            first = source.root_document
            known = first is not None and doc.key == METADATA and doc.stat.version == first[0]
            meta = source.parse(first[1] if known and first is not None else source.read(doc))
            if is_array(meta):
                if is_sharded(meta):
                    return
            else:
                pending += [join(path, child) for child in source.children(path)]
    except ShardfsError:
        return
    if not pending:
        shown = (
            "chunk files are shown as stored, and the metadata as Zarr v2's"
            if view == "v2"
            else "every file is shown as it is stored"
        )
        log.warning("no sharded array in %s: %s", name, shown)


def _other_format(storage: Storage, view: View) -> PrecomputedSource | WkwSource | None:
    """A WKW dataset or precomputed volume at the root; InvalidMetadata says which is
    not valid."""
    try:
        wkw = open_wkw(storage, view)
    except InvalidMetadata as e:
        raise InvalidMetadata(f"WKW dataset: {e}") from None
    if wkw is not None:
        return wkw
    try:
        return open_volume(storage)
    except InvalidMetadata as e:
        raise InvalidMetadata(f"precomputed volume: {e}") from None


def open_view(
    source: Hierarchy | PrecomputedSource | WkwSource, options: MountOptions, name: str
) -> ViewInterface:
    """What the daemon serves: a Namespace, a Workspace over one (read-write), a
    PrecomputedNamespace or a WkwNamespace. Sources that cannot be written make the
    mount read-only."""
    if isinstance(source, PrecomputedSource):
        kind: str | None = "Neuroglancer precomputed"
    elif isinstance(source, WkwSource):
        kind = "WKW"
    else:
        kind = "draft Zarr v3" if source.translates else None
    if not options.read_only and kind is not None:
        if "rw" in options.given:
            raise UsageError(f"{name} is a {kind} source: it cannot be written")
        log.warning("%s is a %s source: mounted read-only", name, kind)
        options.read_only = True
    storage = source.storage
    if isinstance(source, WkwSource):
        return WkwNamespace(
            storage,
            View(options.view),
            index_cache=options.index_cache,
            read_cache=options.read_cache,
            covers=_covers(options),
        )
    if isinstance(source, PrecomputedSource):
        if options.view != View.V3.value:
            raise UsageError(f"view={options.view} applies to Zarr sources only")
        return PrecomputedNamespace(
            storage, index_cache=options.index_cache, read_cache=options.read_cache
        )
    namespace = Namespace(
        storage,
        index_cache=options.index_cache,
        view=View(options.view),
        hierarchy=source,
        serve_plain=not options.read_only,
        read_cache=options.read_cache,
        listing_cache=options.listing_cache,
        shard_mtimes=options.read_only,  # read-only mounts let the kernel cache listings
        covers=_covers(options),
    )
    if options.read_only:
        try:
            unfinished = storage.pending_recovery()
        except StorageError as e:  # credentials that may only read (no ListMultipartUploads)
            log.info("%s: not checked for unfinished commits: %s", name, e)
            return namespace
        if unfinished:
            log.warning(
                "%d shards have unfinished commits (a writer may be at work, or crashed); "
                "a read-write mount or `shardfs fsck` repairs them",
                len(unfinished),
            )
        return namespace
    for line in storage.recover():
        log.warning("recovery: %s", line)
    buffer = WriteBuffer(options.write_buffer, options.spool)
    return Workspace(namespace, buffer, shard_new=options.shard_new)  # type: ignore[return-value]


def _covers(options: MountOptions) -> Covers | None:
    """What decides the nodes a `.zmetadata` holds: the modes the mount shows, where other
    users read through it (see `Presentation.covers`); None where only its user does."""
    if not options.allow_other:
        return None
    from shardfs.fuse.owners import Owners  # (`shardfs.fuse` needs pyfuse3: mounts only)

    owners = Owners(
        options.read_only, options.uid, options.gid, options.file_mode, options.dir_mode
    )
    return owners.covers


def open_leftovers(view: ViewInterface, options: MountOptions, source: str) -> Leftovers | None:
    """For a read-write mount: where chunks it cannot commit at unmount are kept, with the
    chunks earlier mounts of the source kept there already put back into its overlay."""
    if is_local(source):
        source_id = os.path.realpath(source)
    else:
        source_id = f"{source} {options.s3.get('endpoint_url', '')}".rstrip()
    try:
        directory = options.leftover_dir(source_id)
    except UnsafeState as e:  # no home directory to keep them in
        if isinstance(view, Workspace):
            raise
        log.debug("kept chunks not looked for: %s", e)
        return None
    leftovers = Leftovers(directory, source_id)
    if isinstance(view, Workspace):
        if leftovers.claim():
            leftovers.restore(view)
        elif leftovers.waiting():
            log.warning(
                "chunks that an earlier mount could not commit (shards: %d) are with another "
                "running mount of this source, which commits them",
                leftovers.waiting(),
            )
        return leftovers
    # A read-only mount needs none of this state: it only says what waits there, if it can.
    try:
        waiting = leftovers.waiting()
    except OSError as e:
        log.debug("kept chunks not looked for in %s: %s", leftovers.directory, e.strerror)
        waiting = 0
    if waiting:
        log.warning(
            "chunks that an earlier mount could not commit wait in %s for a read-write "
            "mount of this source (shards: %d)",
            leftovers.directory,
            waiting,
        )
    return None
