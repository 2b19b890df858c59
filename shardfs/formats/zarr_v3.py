"""Zarr v3 array metadata: recognise sharded arrays and describe their unsharded view.

Pure: it turns a parsed `zarr.json` into a `ShardedLayout` (or says why the
array must be shown unchanged) and renders the rewritten `zarr.json`.

Coordinates. A sharded array is a chain of levels. Level 0 splits a shard
(`chunk_grid` shape, in array axis order) after the transposes that precede
its `sharding_indexed` codec; each nested level splits one inner chunk of the
level above in the same way. The view's chunks are the innermost chunks,
described in array axis order, and the view's codec chain is every transpose
met on the way down followed by the innermost codecs, so each view chunk's
bytes are exactly the stored inner chunk's bytes.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfs.formats import jsondoc
from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.shard_index import IndexCodec, check_entries, normalize_codec
from shardfs.primitives.errors import CorruptData, InvalidMetadata

SHARDING = "sharding_indexed"

#: Array metadata fields defined by the core spec.
KNOWN_ARRAY_FIELDS = frozenset(
    {
        "zarr_format",
        "node_type",
        "shape",
        "data_type",
        "chunk_grid",
        "chunk_key_encoding",
        "fill_value",
        "codecs",
        "attributes",
        "dimension_names",
        "storage_transformers",
    }
)


#: Extents, and numbers of chunks in a grid, must be below this: numpy (int64) computes
#: with chunk coordinates, offsets and positions in C order.
INDEXABLE = 1 << 63


class Unshardable(Exception):
    """The array is sharded but its view cannot be built; it is shown unchanged."""


@dataclass(frozen=True)
class ShardLevel:
    """One `sharding_indexed` codec in the chain.

    `perm` is the axis order applied by the transposes just before this codec
    (axis i of the level's space is axis perm[i] of its input). `chunk_shape`
    and `chunks_per_shard` are in the level's space.
    """

    perm: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    chunks_per_shard: tuple[int, ...]
    index: IndexCodec
    index_at_start: bool

    @property
    def index_size(self) -> int:
        return self.index.size(self.chunks_per_shard)

    def index_offset(self, length: int) -> int:
        """Where the index of a shard of `length` bytes starts; CorruptData if it cannot hold one."""
        if length < self.index_size:
            raise CorruptData(f"{length} bytes cannot hold a {self.index_size}-byte shard index")
        return 0 if self.index_at_start else length - self.index_size

    def decode_index(self, raw: bytes, length: int) -> np.ndarray:
        """The verified index of a shard of `length` bytes: flat (slots, 2), offsets in the shard."""
        index = self.index.decode(raw, self.chunks_per_shard).reshape(-1, 2)
        if self.index_at_start:
            check_entries(index, self.index_size, length)
        else:
            check_entries(index, 0, length - self.index_size)
        return index


@dataclass(frozen=True)
class ShardedLayout:
    """Everything needed to serve a sharded array as an unsharded one."""

    shape: tuple[int, ...]
    shard_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    levels: tuple[ShardLevel, ...]
    keys: ChunkKeyEncoding
    view_metadata: bytes

    @property
    def ndim(self) -> int:
        return len(self.shape)

    # Cached: asked on every lookup, open and read of a chunk (the layout is immutable).
    @functools.cached_property
    def chunks_per_shard(self) -> tuple[int, ...]:
        """View chunks per shard along each array axis."""
        return tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))

    @property
    def slots_nbytes(self) -> int:
        """What `level_slots` builds: 8 bytes per view chunk of a shard and level."""
        return 8 * math.prod(self.chunks_per_shard) * len(self.levels)

    @functools.cached_property
    def grid(self) -> tuple[int, ...]:
        """Number of view chunks along each axis (covering the array)."""
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunk_shape, strict=True))

    @functools.cached_property
    def shard_grid(self) -> tuple[int, ...]:
        """Number of shards along each axis."""
        return tuple(-(-n // s) for n, s in zip(self.shape, self.shard_shape, strict=True))

    # These two run on every lookup and read of a chunk: `map` over C functions, where
    # generator expressions cost a Python frame resumed per axis.
    def shard_of(self, chunk: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(shard coordinates, chunk coordinates within that shard) of a view chunk."""
        cps = self.chunks_per_shard
        if len(chunk) != len(cps):
            raise ValueError(f"chunk {tuple(chunk)} has not {len(cps)} coordinates")
        return tuple(map(operator.floordiv, chunk, cps)), tuple(map(operator.mod, chunk, cps))

    def in_bounds(self, chunk: Sequence[int]) -> bool:
        grid = self.grid
        if len(chunk) != len(grid):
            raise ValueError(f"chunk {tuple(chunk)} has not {len(grid)} coordinates")
        return min(chunk, default=0) >= 0 and all(map(operator.lt, chunk, grid))


def transpose_order(config: dict[str, Any], ndim: int) -> tuple[int, ...]:
    """The axis order of a `transpose` codec's configuration ("C", "F" or a permutation)."""
    order = config.get("order")
    if order == "C":
        return tuple(range(ndim))
    if order == "F":
        return tuple(reversed(range(ndim)))
    if (
        not isinstance(order, list)
        or sorted(order) != list(range(ndim))
        or not all(isinstance(i, int) for i in order)
    ):
        raise InvalidMetadata(f"transpose order {order!r} is not a permutation of {ndim} axes")
    return tuple(order)


def _int_shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise InvalidMetadata(f"{what} must be a list of non-negative integers, got {value!r}")
    return tuple(value)


def render(meta: dict[str, Any]) -> bytes:
    """A `zarr.json` document the view writes (indented, UTF-8)."""
    return (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode()


def is_array(meta: dict[str, Any]) -> bool:
    return meta.get("node_type") == "array"


def is_sharded(meta: dict[str, Any]) -> bool:
    """Whether an array's codecs hold a `sharding_indexed` codec (checked or not)."""
    codecs = meta.get("codecs")
    return isinstance(codecs, list) and any(normalize_codec(c)[0] == SHARDING for c in codecs)


def parse_node(raw: bytes) -> dict[str, Any]:
    """Parse a Zarr v3 `zarr.json` document (array or group)."""
    return parse_node_spans(raw)[0]


def parse_node_spans(raw: bytes) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """`parse_node`, with the byte span of its top-level `attributes` value in `raw`
    (None if it has none): what `with_attributes` splices into a document the view
    writes, so that big attributes are copied as they are stored, never decoded and
    encoded again."""
    try:
        meta, spans, text = jsondoc.object_spans(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidMetadata(f"zarr.json is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
        raise InvalidMetadata("zarr.json is not Zarr v3 metadata (zarr_format is not 3)")
    if meta.get("node_type") not in ("array", "group"):
        raise InvalidMetadata(f"zarr.json has unknown node_type {meta.get('node_type')!r}")
    span = spans.get("attributes")
    if span is not None and len(text) != len(raw):  # not ASCII: characters to bytes
        start = len(text[: span[0]].encode())
        span = (start, start + len(text[span[0] : span[1]].encode()))
    return meta, span


#: Where a document the view renders (`render`) from metadata with empty attributes holds
#: them: a top-level key, indented once.
_EMPTY_ATTRIBUTES = b'\n  "attributes": {}'


def with_attributes(document: bytes, raw: bytes, span: tuple[int, int]) -> bytes:
    """`document`, rendered from metadata whose attributes were emptied, with the
    attributes of the stored document `raw` (at `span`) in their place, as stored."""
    at = document.index(_EMPTY_ATTRIBUTES) + len(_EMPTY_ATTRIBUTES) - 2
    return b"".join((document[:at], raw[span[0] : span[1]], document[at + 2 :]))


def size_with_attributes(document: bytes, span: tuple[int, int]) -> int:
    """The size of `with_attributes(document, raw, span)`, without `raw`."""
    return len(document) - 2 + span[1] - span[0]


def _regular_grid(
    meta: dict[str, Any],
) -> tuple[tuple[int, ...], tuple[int, ...], ChunkKeyEncoding]:
    """(shape, chunk_grid chunk shape, chunk key encoding) of an array the view can split.

    Raises Unshardable for what the view cannot serve and InvalidMetadata
    for what is not valid metadata.
    """
    for field, value in meta.items():
        if field not in KNOWN_ARRAY_FIELDS and not (
            isinstance(value, dict) and value.get("must_understand") is False
        ):
            raise Unshardable(f"unknown metadata field {field!r} must be understood")
    if meta.get("storage_transformers"):
        raise Unshardable("storage transformers are not supported")
    grid = meta.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        raise Unshardable(f"chunk grid {grid!r} is not 'regular'")
    shape = _int_shape(meta.get("shape"), "shape")
    chunk_shape = _int_shape((grid.get("configuration") or {}).get("chunk_shape"), "chunk_shape")
    if len(chunk_shape) != len(shape):
        raise InvalidMetadata("chunk_shape and shape differ in rank")
    if not shape:
        raise Unshardable("zero-dimensional arrays are not supported")
    if 0 in chunk_shape:
        raise InvalidMetadata("chunk_shape has a zero extent")
    if max(shape + chunk_shape) >= INDEXABLE:
        raise Unshardable("extents of 2^63 or more are not supported")
    return shape, chunk_shape, ChunkKeyEncoding.from_metadata(meta.get("chunk_key_encoding"))


def plain_layout(meta: dict[str, Any], raw: bytes) -> ShardedLayout:
    """An unsharded array as a layout of zero levels: each chunk object is one view chunk.

    Views that rename chunks (zarr v2) then serve plain arrays like sharded ones.
    """
    shape, chunk_shape, keys = _regular_grid(meta)
    return _indexable(ShardedLayout(shape, chunk_shape, chunk_shape, (), keys, raw))


def sharded_layout(meta: dict[str, Any]) -> ShardedLayout | None:
    """The view of a sharded array, or None if the array is not sharded.

    Raises Unshardable (with the reason) if the array is sharded in a way the
    view cannot serve byte for byte; such arrays are shown unchanged.
    """
    codecs = meta.get("codecs")
    if not isinstance(codecs, list):
        raise InvalidMetadata("array metadata has no codecs list")
    if not is_sharded(meta):
        return None
    shape, shard_shape, keys = _regular_grid(meta)

    levels: list[ShardLevel] = []
    view_codecs: list[Any] = []
    chain: list[Any] = codecs
    block = shard_shape  # the block the current chain encodes, in its own space
    total_perm = tuple(range(len(shape)))  # level space axis i = array axis total_perm[i]
    while True:
        perm = tuple(range(len(shape)))
        position = 0
        while position < len(chain) and normalize_codec(chain[position])[0] == "transpose":
            step = transpose_order(normalize_codec(chain[position])[1], len(shape))
            perm = tuple(perm[i] for i in step)
            view_codecs.append(chain[position])
            position += 1
        if position == len(chain):
            raise InvalidMetadata("codec chain has no array-to-bytes codec")
        name, config = normalize_codec(chain[position])
        if name != SHARDING:
            if any(normalize_codec(c)[0] == SHARDING for c in chain[position:]):
                raise Unshardable(f"sharding_indexed after the array codec {name!r}")
            view_codecs.extend(chain[position:])
            break
        trailing = chain[position + 1 :]
        if trailing:
            names = ", ".join(normalize_codec(c)[0] for c in trailing)
            raise Unshardable(f"whole-shard codecs after sharding_indexed ({names})")
        inner = _int_shape(config.get("chunk_shape"), "sharding chunk_shape")
        space = tuple(block[i] for i in perm)
        if len(inner) != len(space) or any(
            c == 0 or s % c for s, c in zip(space, inner, strict=True)
        ):
            raise InvalidMetadata(
                f"sharding chunk_shape {list(inner)} does not divide {list(space)}"
            )
        location = config.get("index_location", "end")
        if location not in ("start", "end"):
            raise InvalidMetadata(f"unknown index_location {location!r}")
        try:
            index = IndexCodec.from_codecs(
                config.get("index_codecs", [{"name": "bytes"}, "crc32c"])
            )
        except InvalidMetadata as e:
            raise Unshardable(str(e)) from None
        levels.append(
            ShardLevel(
                perm=perm,
                chunk_shape=inner,
                chunks_per_shard=tuple(s // c for s, c in zip(space, inner, strict=True)),
                index=index,
                index_at_start=location == "start",
            )
        )
        total_perm = tuple(total_perm[i] for i in perm)
        block = inner
        inner_codecs = config.get("codecs")
        if not isinstance(inner_codecs, list) or not inner_codecs:
            raise InvalidMetadata("sharding_indexed has no inner codecs")
        chain = inner_codecs

    chunk_shape = [0] * len(shape)
    for axis, extent in zip(total_perm, block, strict=True):
        chunk_shape[axis] = extent
    view = dict(meta)
    view["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": chunk_shape}}
    view["codecs"] = view_codecs
    layout = ShardedLayout(
        shape=shape,
        shard_shape=shard_shape,
        chunk_shape=tuple(chunk_shape),
        levels=tuple(levels),
        keys=keys,
        view_metadata=render(view),
    )
    return _indexable(layout)


def _indexable(layout: ShardedLayout) -> ShardedLayout:
    """`layout`, if numpy can number its chunks; Unshardable otherwise."""
    if math.prod(layout.grid) >= INDEXABLE:
        raise Unshardable(f"its grid has {math.prod(layout.grid)} chunks, 2^63 or more")
    return layout


def level_slots(layout: ShardedLayout, budget: int) -> list[np.ndarray]:
    """For every view chunk of a shard, its slot at each level.

    Returns one array per level whose m-th value is the flat C-order slot, in
    that level's index, holding the m-th view chunk of the shard (view chunks
    enumerated in C order over `chunks_per_shard`). It depends only on the
    layout, so it is computed once per array and shared by all its shards.
    Unshardable, before anything is built, if they would take more than `budget`
    bytes (`slots_nbytes`). Each axis is resolved on its own, so what is built
    besides them is one more array of their size and one entry per chunk along
    an axis.
    """
    if layout.slots_nbytes > budget:
        raise Unshardable(
            f"its layout takes {layout.slots_nbytes} bytes (8 per inner chunk of a shard and "
            f"level of sharding), more than the {budget} of metadata_cache"
        )
    # Per array axis, the offset (in elements) of each view chunk of a shard along it,
    # within the block the level at hand splits.
    offsets = [
        np.arange(n, dtype=np.int64) * c
        for n, c in zip(layout.chunks_per_shard, layout.chunk_shape, strict=True)
    ]
    axes = tuple(range(layout.ndim))  # the array axis of each axis of the level's space
    result = []
    for level in layout.levels:
        axes = tuple(axes[i] for i in level.perm)
        strides = [math.prod(level.chunks_per_shard[i + 1 :]) for i in range(layout.ndim)]
        parts: list[np.ndarray] = [np.zeros(0)] * layout.ndim
        for i, (axis, chunk) in enumerate(zip(axes, level.chunk_shape, strict=True)):
            within = offsets[axis] // chunk
            offsets[axis] = offsets[axis] - within * chunk
            parts[axis] = within * strides[i]
        slot = np.zeros((), dtype=np.int64)
        for part in parts:  # the sum over axes, laid out in C order of the array axes
            slot = slot[..., np.newaxis] + part
        result.append(slot.reshape(-1))
    assert not any(o.any() for o in offsets), "view chunks must align with the innermost chunks"
    return result
