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

from shardfs.formats import jsondoc, ome
from shardfs.formats.codecs import (
    V2_FIELD,
    VLEN_CODECS,
    big_endian_filter,
    codec_kind,
    has_byte_order,
    normalized_v2_codec,
    v3_codec,
    v3_data_type,
    v3_fill,
)
from shardfs.formats.shard_index import normalize_codec
from shardfs.formats.zarr_v2 import ZATTRS, ZGROUP, ZMETADATA
from shardfs.formats.zarr_v3 import (
    SHARDING,
    Unshardable,
    is_array,
    parse_node,
    plain_layout,
    render,
    sharded_layout,
)
from shardfs.primitives.errors import InvalidMetadata, InvalidWrite

#: Fields of an array's metadata a writer may change through the view.
MUTABLE = frozenset({"attributes", "shape", "dimension_names"})


def parse_written(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = jsondoc.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidWrite(f"{what} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidWrite(f"{what} is not a JSON object")
    return doc


def _same(a: object, b: object) -> bool:
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
    """The source metadata after `.zattrs` was replaced (`_ARRAY_DIMENSIONS` names the
    axes). OME-Zarr 0.4 metadata of a group (or of a node holding OME 0.5) is stored in
    its 0.5 form (see `shardfs.formats.ome`); an array's attributes are its own words."""
    new = dict(source)
    attrs = dict(written)
    names = attrs.pop("_ARRAY_DIMENSIONS", None)
    current = source.get("attributes")
    if not is_array(source) or ome.is_v05(current):
        attrs = ome.v05_attributes(attrs, current if isinstance(current, dict) else None)
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


def with_dimension_names(meta: dict[str, Any], names: list[str]) -> dict[str, Any] | None:
    """An array's metadata naming its axes `names` (as OME-Zarr 0.5 requires of a level
    array, from the image's axes), or None if it names them already or has another rank."""
    if not is_array(meta) or meta.get("dimension_names") is not None:
        return None
    if len(names) != len(meta.get("shape") or []):
        return None
    return {**meta, "dimension_names": list(names)}


def updated_from_zarray(
    source: dict[str, Any], view: dict[str, Any], written: dict[str, Any]
) -> dict[str, Any]:
    """The source metadata after `.zarray` (`view` is the one the view showed) was replaced.

    Codec configurations are compared as numcodecs spells them out (zarr-python 2 writes
    every default back: `{"id": "lzma"}` returns as `{"id": "lzma", "format": 1, ...}`).
    """
    _check_same(_v2_codecs(view), _v2_codecs(written), frozenset({"shape"}), ".zarray")
    new = dict(source)
    new["shape"] = _check_shape(source, written.get("shape"))
    return new


def _v2_codecs(zarray: dict[str, Any]) -> dict[str, Any]:
    """`zarray` with its compressor and filters in numcodecs' full form."""
    doc = dict(zarray)
    doc["compressor"] = normalized_v2_codec(doc.get("compressor"))
    filters = doc.get("filters")
    if isinstance(filters, list):
        doc["filters"] = [normalized_v2_codec(f) for f in filters] or None
    return doc


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


def v3_from_zarray(zarray: dict[str, Any], attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Zarr v3 metadata of a new array written as a zarr v2 `.zarray`.

    The inverse of the v2 view's mapping (the table in `shardfs.formats.codecs`): the chunks
    the v2 writer stores are, as they are, chunks of the v3 chain, and the view shows the
    array as written. Raises InvalidWrite for a `.zarray` with no such v3 form.
    """
    try:
        dtype = np.dtype(zarray["dtype"])
        shape, chunks = list(zarray["shape"]), list(zarray["chunks"])
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidWrite(f".zarray is incomplete or malformed: {e}") from None
    filters = zarray.get("filters") or []
    if not isinstance(filters, list):
        raise InvalidWrite(f".zarray filters {filters!r} are not a list")
    fortran = zarray.get("order", "C") == "F" and len(shape) > 1
    try:
        data_type, codecs = _v3_chain(
            dtype, filters, zarray.get("compressor"), len(shape) if fortran else 0
        )
        fill = v3_fill(zarray.get("fill_value"), dtype, data_type)
    except InvalidMetadata as e:
        raise InvalidWrite(f".zarray: {e}") from None
    separator = zarray.get("dimension_separator") or "."
    meta: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": separator}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": dict(attrs or {}),
    }
    written_fill = zarray.get("fill_value")
    if written_fill is None or (dtype.kind == "O" and not isinstance(written_fill, str)):
        meta[V2_FIELD] = {"must_understand": False, "fill_value": written_fill}
    return meta


def _v3_chain(
    dtype: np.dtype, filters: list[Any], compressor: Any, fortran: int
) -> tuple[Any, list[dict[str, Any]]]:
    """The v3 data type and codecs of a v2 dtype, filters and compressor, with `fortran`
    the number of axes of an `order: "F"` array (0 for C order). InvalidMetadata if they
    have no v3 chain that stores the same bytes."""
    object_codec = None
    if dtype.kind == "O":
        first = filters[0] if filters else None
        object_codec = first.get("id") if isinstance(first, dict) else None
        if object_codec not in VLEN_CODECS:
            raise InvalidMetadata(
                f"dtype '|O' needs vlen-utf8 or vlen-bytes as its first filter, not {first!r}"
            )
        filters = filters[1:]
    data_type = v3_data_type(dtype, object_codec)
    for codec in [*filters, *([compressor] if compressor is not None else [])]:
        if not isinstance(codec, dict) or not isinstance(codec.get("id"), str):
            raise InvalidMetadata(f"codec {codec!r} is not a numcodecs configuration")
    leading = 0
    while leading < len(filters) and codec_kind(filters[leading]) == "array":
        leading += 1
    array_filters, byte_filters = filters[:leading], filters[leading:]
    codec_ids = [f["id"] for f in filters] + ([compressor["id"]] if compressor else [])
    if any(codec_id in VLEN_CODECS for codec_id in codec_ids):
        raise InvalidMetadata("vlen-utf8 and vlen-bytes serve '|O' arrays, as their first filter")
    serializer = None  # pcodec or zfpy: a filter or compressor that takes the array itself
    if object_codec is None and byte_filters and codec_kind(byte_filters[0]) == "array-bytes":
        serializer, byte_filters = byte_filters[0], byte_filters[1:]
    elif object_codec is None and not byte_filters and codec_kind(compressor) == "array-bytes":
        serializer, compressor = compressor, None
    if serializer is not None and fortran:
        raise InvalidMetadata(f"order 'F' with {serializer['id']!r} has no Zarr v3 form here")
    for codec in byte_filters:
        if codec_kind(codec) != "bytes":
            raise InvalidMetadata(f"filter {codec['id']!r} after the array is serialized")
    if object_codec is not None and array_filters:
        raise InvalidMetadata("filters on the values of an '|O' array have no Zarr v3 form")
    if (array_filters or object_codec) and fortran:
        raise InvalidMetadata("order 'F' with filters or '|O' data has no Zarr v3 form here")
    if array_filters and (
        dtype.byteorder == ">" or any(big_endian_filter(f) for f in array_filters)
    ):
        raise InvalidMetadata("filters with big-endian data have no Zarr v3 form here")

    codecs: list[dict[str, Any]] = []
    if fortran:
        order = list(range(fortran))[::-1]
        codecs.append({"name": "transpose", "configuration": {"order": order}})
    itemsize = dtype.itemsize
    for codec in array_filters:
        codecs.append(v3_codec(codec, itemsize))
        itemsize = _output_itemsize(codec, itemsize)
    if object_codec is not None:
        codecs.append({"name": object_codec, "configuration": {}})
        itemsize = 1
    elif serializer is not None:
        codecs.append(v3_codec(serializer, itemsize))
        itemsize = 1
    else:
        endian = "big" if dtype.byteorder == ">" else "little"
        codecs.append(
            {"name": "bytes", "configuration": {"endian": endian} if has_byte_order(dtype) else {}}
        )
    for codec in [*byte_filters, *([compressor] if compressor is not None else [])]:
        if codec_kind(codec) != "bytes":
            raise InvalidMetadata(f"compressor {codec['id']!r} after the array is serialized")
        codecs.append(v3_codec(codec, itemsize))
        itemsize = 1
    return data_type, codecs


def _output_itemsize(codec: dict[str, Any], itemsize: int) -> int:
    """The item size of what a numcodecs array-to-array codec outputs."""
    if codec.get("id") == "packbits":
        return 1
    for key in ("astype", "encode_dtype"):
        if codec.get(key) is not None:
            try:
                dtype: np.dtype = np.dtype(codec[key])
            except (TypeError, ValueError):
                raise InvalidMetadata(f"codec {codec['id']!r}: {key} {codec[key]!r}") from None
            return dtype.itemsize
    return itemsize


def stored_v3(
    raw: bytes,
    source: dict[str, Any] | None,
    view: dict[str, Any] | None,
    shard_new: int | None,
    what: str,
) -> bytes:
    """What the source stores for a `zarr.json` written in the v3 view over `source` (the
    stored document, None if none), `view` being the unsharded document the view shows
    for a sharded array (None for anything else). A document that asks for sharding the
    view did not show (a new sharded array, the sharding of an array added, changed or
    removed) is refused: see `check_sharding`."""
    if source is None:
        # An array the view will show unchanged (whole-shard compression, say) is stored
        # as written, its sharding included: its shards pass through as written too.
        return new_v3(raw, shard_new, shown=shown_unchanged(raw), what=what)
    written = parse_written(raw, "zarr.json")
    if view is None:
        # A group, an unsharded array or an array shown unchanged: stored as written.
        return new_v3(raw, shard_new, shown=source, what=what)
    return render(updated_v3(source, view, written, shard_new, what))


def stored_v2(
    directory: str,
    name: str,
    raw: bytes,
    source: dict[str, Any] | None,
    zarray: dict[str, Any] | None,
    axes: list[str] | None,
    shard_new: int | None,
) -> bytes | None:
    """What the source stores for the v2 document `name` written in `directory` over
    `source` (the stored `zarr.json`, None if none); None if nothing changes. `zarray` is
    the `.zarray` the view shows for the array there (None for a group), `axes` the
    dimension names of the OME-Zarr image a new array is a level of."""
    written = parse_written(raw, name)
    if name == ZMETADATA:
        return None  # the view consolidates by itself
    if name == ZGROUP:
        if source is None:
            return render({"zarr_format": 3, "node_type": "group", "attributes": {}})
        if source.get("node_type") != "group":
            raise InvalidWrite(f"{directory}: .zgroup written over an array")
        return None
    if source is None:
        if name == ZATTRS:
            raise InvalidWrite(f"{directory}: .zattrs written before .zarray or .zgroup")
        meta = v3_from_zarray(written)
        meta = (with_dimension_names(meta, axes) if axes else None) or meta
        return render(shard(meta, shard_new) if shard_new else meta)
    if name == ZATTRS:
        return render(updated_from_zattrs(source, written))
    if zarray is None:
        raise InvalidWrite(f"{directory}: .zarray written over a group")
    return render(updated_from_zarray(source, zarray, written))


def shown_unchanged(raw: bytes) -> dict[str, Any] | None:
    """The metadata of a new `zarr.json` if it makes an array that the v3 view shows
    unchanged (see `Presentation._array_view`), else None."""
    try:
        meta = parse_node(raw)
        if meta["node_type"] != "array":
            return None
        if sharded_layout(meta) is None:
            plain_layout(meta, raw)
    except Unshardable:
        return meta
    except Exception:
        return None  # refused or stored by `new_v3`, which tells why
    return None
