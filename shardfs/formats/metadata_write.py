"""Metadata written through a view, translated back into what the source stores.

Pure. A writer sees the view's documents (an unsharded `zarr.json`, or
`.zarray`/`.zattrs`) and writes them back changed. What the source can take
from such a document is what does not depend on how chunks are stored:
attributes, dimension names and the shape (a resize). Anything else (another
chunk shape, other codecs, another data type) cannot be expressed without
rewriting every shard, so it is refused with InvalidWrite.

New nodes are stored as written (a v2 `.zarray` becomes the equivalent v3
array), optionally sharded (`shard_new`). A `zarr.json` that asks for sharded
storage itself is refused (see `check_sharding`): the view shows every array
unsharded, so the writer's shards would be taken for inner chunks.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from shardfs.errors import InvalidMetadata, InvalidWrite
from shardfs.formats.codecs import DATA_TYPES
from shardfs.formats.shard_index import normalize_codec
from shardfs.formats.zarr_v3 import SHARDING, is_array, parse_node, render, sharded_layout

#: Fields of an array's metadata a writer may change through the view.
MUTABLE = frozenset({"attributes", "shape", "dimension_names"})
_SHUFFLE_NAMES = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def parse_written(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidWrite(f"{what} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidWrite(f"{what} is not a JSON object")
    return doc


def _same(a: Any, b: Any) -> bool:
    """Equal as metadata: numbers by value, NaN equal to NaN, codec configurations
    equal on the keys both give (writers differ in which defaults they spell out)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same(a[k], b[k]) for k in a.keys() & b.keys()) and all(
            not d[k] for d, other in ((a, b), (b, a)) for k in d.keys() - other.keys()
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    numeric = (int, float, str)
    if isinstance(a, numeric) and isinstance(b, numeric) and a != b:
        try:
            x, y = float(a), float(b)
        except (TypeError, ValueError):
            return False
        return x == y or (math.isnan(x) and math.isnan(y))
    return a == b


def _codecs(value: Any) -> Any:
    """Codec lists compared by (name, configuration), so bare strings match objects."""
    if not isinstance(value, list):
        return value
    try:
        return [list(normalize_codec(c)) for c in value]
    except InvalidMetadata:
        return value


def _check_same(
    current: dict[str, Any], written: dict[str, Any], mutable: frozenset[str], what: str
) -> None:
    for field in (current.keys() | written.keys()) - mutable:
        a, b = current.get(field), written.get(field)
        if field == "codecs":
            a, b = _codecs(a), _codecs(b)
        if not _same(a, b):
            raise InvalidWrite(
                f"{what}: {field!r} cannot change through the view (only "
                f"{', '.join(sorted(mutable))} can); it is {json.dumps(a)}, written {json.dumps(b)}"
            )


def _check_shape(source: dict[str, Any], shape: Any) -> list[int]:
    old = source.get("shape")
    if (
        not isinstance(shape, list)
        or not isinstance(old, list)
        or len(shape) != len(old)
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in shape)
    ):
        raise InvalidWrite(
            f"shape {shape!r} is not a list of {len(old or [])} non-negative integers"
        )
    return shape


def updated_v3(
    source: dict[str, Any],
    view: dict[str, Any],
    written: dict[str, Any],
    shard_new: int | None = None,
    what: str = "zarr.json",
) -> dict[str, Any]:
    """The source metadata of an array (or group) whose view `zarr.json` was replaced.

    `shard_new` (the mount's option) and `what` (the document's path) only shape the
    refusal of a document that changes the sharding (see `check_sharding`).
    """
    if written.get("node_type") != source.get("node_type"):
        raise InvalidWrite(f"{what}: node_type cannot change through the view")
    check_sharding(view, written, shard_new, what)
    mutable = MUTABLE if is_array(source) else frozenset({"attributes"})
    _check_same(view, written, mutable, what)
    new = dict(source)
    for field in mutable:
        if field in written:
            new[field] = written[field]
        else:
            new.pop(field, None)
    if is_array(new):
        new["shape"] = _check_shape(source, new.get("shape"))
    return new


def updated_from_zattrs(source: dict[str, Any], written: dict[str, Any]) -> dict[str, Any]:
    """The source metadata after `.zattrs` was replaced (`_ARRAY_DIMENSIONS` names the axes)."""
    new = dict(source)
    attrs = dict(written)
    names = attrs.pop("_ARRAY_DIMENSIONS", None)
    new["attributes"] = attrs
    if is_array(source) and names is not None:
        if not (
            isinstance(names, list)
            and len(names) == len(source.get("shape") or [])
            and all(isinstance(n, str) for n in names)
        ):
            raise InvalidWrite(f"_ARRAY_DIMENSIONS {names!r} does not name each axis")
        new["dimension_names"] = names
    return new


def updated_from_zarray(
    source: dict[str, Any], view: dict[str, Any], written: dict[str, Any]
) -> dict[str, Any]:
    """The source metadata after `.zarray` (`view` is the one the view showed) was replaced."""
    _check_same(view, written, frozenset({"shape"}), ".zarray")
    new = dict(source)
    new["shape"] = _check_shape(source, written.get("shape"))
    return new


# -- new nodes ---------------------------------------------------------------------------


def new_v3(
    raw: bytes,
    shard_new: int | None,
    shown: Any = None,
    what: str = "zarr.json",
) -> bytes:
    """A `zarr.json` the source stores as written: a new node's (`shown` None; an array
    is stored sharded with `shard_new`), or the replacement of what the view `shown`
    as stored (a group, an unsharded array, an array the view shows unchanged).

    A document that changes how an array is sharded is refused (`check_sharding`).
    """
    try:
        meta = parse_node(raw)
    except InvalidMetadata as e:
        raise InvalidWrite(str(e)) from None
    check_sharding(shown, meta, shard_new, what)
    if shown is not None or not is_array(meta) or not shard_new:
        return raw
    return render(shard(meta, shard_new))


def _codec_name(codec: Any) -> Any:
    return codec.get("name") if isinstance(codec, dict) else codec


def _sharding(meta: Any) -> tuple[Any, Any] | None:
    """How `meta` shards an array: its chunk grid and codecs if a codec is
    `sharding_indexed`; None for an unsharded array, a group, or no node."""
    if not isinstance(meta, dict) or not is_array(meta):
        return None
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or not any(_codec_name(c) == SHARDING for c in codecs):
        return None
    return meta.get("chunk_grid"), _codecs(codecs)


def check_sharding(shown: Any, written: dict[str, Any], shard_new: int | None, what: str) -> None:
    """Refuse (InvalidWrite) a `zarr.json` that shards an array otherwise than the
    document the view showed at its place (`shown`; None where there was none).

    The view shows sharded arrays unsharded, so a writer never sees a sharded array
    it could write: a writer asking for sharding (a new sharded array, sharding added
    to an array or group, the sharding of an array changed or removed) would write
    whole shards at keys the mount takes for inner chunks (or leave stored chunks to
    be read in another layout). The documents the view shows, and arrays it shows
    unchanged, rewritten with the same sharding, pass.
    """
    old, new = _sharding(shown), _sharding(written)
    if old is None and new is None:
        return
    if old is not None and new is not None and _same(old[0], new[0]) and _same(old[1], new[1]):
        return
    option = f"-o shard_new={shard_new}" if shard_new else "-o shard_new=N"
    if not isinstance(shown, dict) or not is_array(shown):
        if shard_new:
            hint = f"this mount ({option}) stores it sharded, {shard_new} inner chunks"
        else:
            hint = f"mount with {option} to store it sharded, N inner chunks"
        raise InvalidWrite(
            f"{what}: a sharded array cannot be created through the mount, which shows every "
            "array unsharded (the writer's shards would be stored as inner chunks); create it "
            f"unsharded: {hint} per shard along each axis"
        )
    raise InvalidWrite(
        f"{what}: the sharding of an existing array cannot change through the mount, which "
        "shows arrays unsharded and keeps how the source stores them (new arrays are stored "
        f"sharded with {option})"
    )


def shard(meta: dict[str, Any], per_axis: int) -> dict[str, Any]:
    """An unsharded array's metadata made sharded, `per_axis` inner chunks along each axis.

    Its view is the array as written: same chunks, same codecs.
    """
    try:
        if sharded_layout(meta) is not None:
            return meta  # sharded already
    except Exception as e:
        raise InvalidWrite(f"zarr.json: {e}") from None
    grid = meta.get("chunk_grid") or {}
    chunks = (grid.get("configuration") or {}).get("chunk_shape")
    if grid.get("name") != "regular" or not isinstance(chunks, list) or not chunks:
        return meta  # nothing the view could split again: store as written
    sharded = dict(meta)
    sharded["chunk_grid"] = {
        "name": "regular",
        "configuration": {"chunk_shape": [c * per_axis for c in chunks]},
    }
    sharded["codecs"] = [
        {
            "name": SHARDING,
            "configuration": {
                "chunk_shape": chunks,
                "codecs": meta["codecs"],
                "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
                "index_location": "end",
            },
        }
    ]
    return sharded


def _v3_fill(value: Any, dtype: np.dtype) -> Any:
    if value is None:
        return False if dtype.kind == "b" else 0
    return value


def v3_from_zarray(zarray: dict[str, Any], attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Zarr v3 metadata of a new array written as a zarr v2 `.zarray`."""
    try:
        dtype = np.dtype(zarray["dtype"])
        shape, chunks = list(zarray["shape"]), list(zarray["chunks"])
    except (KeyError, TypeError) as e:
        raise InvalidWrite(f".zarray is incomplete or malformed: {e}") from None
    names = {v: k for k, v in DATA_TYPES.items()}
    data_type = names.get(f"{dtype.kind}{dtype.itemsize}")
    if data_type is None or dtype.fields is not None:
        raise InvalidWrite(f".zarray dtype {zarray['dtype']!r} has no Zarr v3 equivalent")
    if zarray.get("filters"):
        raise InvalidWrite(".zarray filters have no Zarr v3 equivalent here")
    codecs: list[Any] = []
    if zarray.get("order", "C") == "F" and len(shape) > 1:
        codecs.append(
            {"name": "transpose", "configuration": {"order": list(range(len(shape)))[::-1]}}
        )
    bytes_config = (
        {} if dtype.itemsize == 1 else {"endian": "big" if dtype.byteorder == ">" else "little"}
    )
    codecs.append({"name": "bytes", "configuration": bytes_config})
    compressor = zarray.get("compressor")
    if compressor is not None:
        codecs.append(_v3_compressor(compressor, dtype))
    separator = zarray.get("dimension_separator") or "."
    meta: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": separator}},
        "fill_value": _v3_fill(zarray.get("fill_value"), dtype),
        "codecs": codecs,
        "attributes": dict(attrs or {}),
    }
    return meta


def _v3_compressor(config: Any, dtype: np.dtype) -> dict[str, Any]:
    name = config.get("id") if isinstance(config, dict) else None
    if name == "gzip":
        return {"name": "gzip", "configuration": {"level": config.get("level", 1)}}
    if name == "zstd":
        return {
            "name": "zstd",
            "configuration": {
                "level": config.get("level", 0),
                "checksum": bool(config.get("checksum")),
            },
        }
    if name == "blosc":
        shuffle = config.get("shuffle", 1)
        if shuffle == -1:  # AUTOSHUFFLE: what numcodecs picks for the item size
            shuffle = 2 if dtype.itemsize == 1 else 1
        return {
            "name": "blosc",
            "configuration": {
                "cname": config.get("cname", "lz4"),
                "clevel": config.get("clevel", 5),
                "shuffle": _SHUFFLE_NAMES.get(shuffle, "noshuffle"),
                "typesize": dtype.itemsize,
                "blocksize": config.get("blocksize", 0),
            },
        }
    raise InvalidWrite(f".zarray compressor {config!r} has no Zarr v3 equivalent here")
