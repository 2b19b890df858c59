"""The zarr v2 form of Zarr v3 nodes, for readers that only know v2.

Pure: it turns parsed v3 metadata (for a sharded array, the metadata of its
unsharded view) into `.zarray`, `.zgroup` and `.zattrs` documents, and says
how each stored chunk becomes a v2 chunk:

- `RAW`: the stored bytes are a valid v2 chunk as they are;
- `STRIP_CRC32C`: the chain ends in crc32c, which no v2 reader knows; it is
  verified and cut off;
- `DECODE`: the chain has no v2 equivalent (an axis order other than C or F,
  a crc32c in the middle); the chunk is decoded and served uncompressed, so
  its size is known without reading it.

The v2 forms of data types, fill values and codecs are the table in
`shardfs.formats.codecs` (`v2_dtype`, `v2_fill`, `v2_codec`). A v3 chain
`[array-to-array codecs] serializer [bytes-to-bytes codecs]` becomes v2
`filters` (the array-to-array codecs, the object codec of `|O` arrays, and
all but the last bytes-to-bytes codec) and `compressor` (the last one).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from shardfs.formats import ome
from shardfs.formats.codecs import (
    V2_FIELD,
    VLEN_CODECS,
    ChunkDecoder,
    ChunkEncoder,
    big_endian_filter,
    byte_decoder,
    byte_encoder,
    codec_kind,
    compose_transposes,
    crc32c_encode,
    is_crc32c,
    v2_codec,
    v2_dtype,
    v2_fill,
    v3_fill,
)
from shardfs.formats.keys import ChunkKeyEncoding
from shardfs.formats.shard_index import normalize_codec
from shardfs.formats.zarr_v3 import transpose_order
from shardfs.primitives.errors import InvalidMetadata

ZARRAY, ZGROUP, ZATTRS, ZMETADATA = ".zarray", ".zgroup", ".zattrs", ".zmetadata"


class Untranslatable(Exception):
    """The node has no zarr v2 form; the view shows it unchanged."""


class Transform(Enum):
    RAW = "raw"
    STRIP_CRC32C = "strip crc32c"
    DECODE = "decode"


def render(doc: dict[str, Any]) -> bytes:
    """JSON as zarr-python 2 writes it: sorted keys, 4-space indent, ASCII."""
    return (json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True) + "\n").encode()


@dataclass(frozen=True)
class V2Array:
    """A v3 array as zarr v2: its documents and how its chunks are served."""

    zarray: dict[str, Any]
    keys: ChunkKeyEncoding
    transform: Transform
    decoder: ChunkDecoder | None = None  #: set for DECODE
    encoder: ChunkEncoder | None = None  #: set for DECODE

    def served_size(self, stored: int) -> int:
        """The size of a v2 chunk whose stored form has `stored` bytes (may be < 0 if corrupt)."""
        if self.transform is Transform.RAW:
            return stored
        if self.transform is Transform.STRIP_CRC32C:
            return stored - 4
        assert self.decoder is not None
        return self.decoder.nbytes

    def serve(self, stored: bytes) -> bytes:
        """The v2 chunk for a stored chunk; CorruptData if it fails verification."""
        if self.transform is Transform.RAW:
            return stored
        if self.transform is Transform.STRIP_CRC32C:
            return byte_decoder("crc32c")(stored)
        assert self.decoder is not None
        return self.decoder(stored)

    def store(self, chunk: bytes) -> bytes:
        """The stored form of a v2 chunk written through the view (the inverse of `serve`).

        Raises ValueError if a chunk served uncompressed has the wrong size.
        """
        if self.transform is Transform.RAW:
            return chunk
        if self.transform is Transform.STRIP_CRC32C:
            return crc32c_encode(chunk)
        assert self.encoder is not None
        return self.encoder(chunk)


def _float(value: Any, dtype: np.dtype) -> float | str:
    """A v3 float fill value (number, "NaN", "Infinity", "-Infinity" or hex bits) for v2."""
    if isinstance(value, str) and value.startswith("0x"):
        bits = int(value, 16)
        fmt = {2: "<e", 4: "<f", 8: "<d"}[dtype.itemsize]
        value = struct.unpack(fmt, bits.to_bytes(dtype.itemsize, "little"))[0]
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return value
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise Untranslatable(f"float fill value {value!r} is not understood")
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float(value)


def fill_value(value: Any, dtype: np.dtype) -> Any:
    """The v2 JSON form of a v3 fill value."""
    if dtype.kind == "b":
        if not isinstance(value, bool):
            raise Untranslatable(f"bool fill value {value!r} is not true or false")
        return value
    if dtype.kind in "iu":
        if not isinstance(value, int) or isinstance(value, bool):
            raise Untranslatable(f"integer fill value {value!r} is not an integer")
        return value
    if dtype.kind == "f":
        return _float(value, dtype)
    if dtype.kind == "c":
        part = np.dtype(f"<f{dtype.itemsize // 2}")
        if not isinstance(value, list) or len(value) != 2:
            raise Untranslatable(f"complex fill value {value!r} is not [real, imag]")
        return [_float(value[0], part), _float(value[1], part)]
    try:
        return v2_fill(value, dtype)
    except InvalidMetadata as e:
        raise Untranslatable(str(e)) from None


def _fill_value(meta: dict[str, Any], dtype: np.dtype) -> Any:
    """The v2 fill value of an array: the one a v2 writer gave, where the source recorded it
    (`V2_FIELD`) and the v3 one is still what it became; else the v3 one in v2 form."""
    value = meta.get("fill_value")
    recorded = meta.get(V2_FIELD)
    if isinstance(recorded, dict) and "fill_value" in recorded:
        try:
            if v3_fill(recorded["fill_value"], dtype, meta.get("data_type")) == value:
                return recorded["fill_value"]
        except InvalidMetadata:
            pass
    return fill_value(value, dtype)


def zattrs(meta: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`.zattrs`: the attributes, OME-Zarr 0.5 metadata in its 0.4 form (see
    `shardfs.formats.ome`), plus `_ARRAY_DIMENSIONS` (what xarray reads) for named axes;
    and what of the attributes the 0.4 form could not show."""
    attrs, dropped = ome.v04_attributes(dict(meta.get("attributes") or {}))
    names = meta.get("dimension_names")
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        attrs.setdefault("_ARRAY_DIMENSIONS", names)
    return attrs, dropped


def v2_array(meta: dict[str, Any]) -> V2Array:
    """The v2 form of an unsharded v3 array (or of a sharded array's view metadata).

    Raises Untranslatable (with the reason) if no v2 reader could read it.
    """
    if meta.get("storage_transformers"):
        raise Untranslatable("storage transformers have no zarr v2 form")
    grid = meta.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        raise Untranslatable(f"chunk grid {grid!r} is not 'regular'")
    shape = list(meta.get("shape") or [])
    chunks = list((grid.get("configuration") or {}).get("chunk_shape") or [])
    if len(chunks) != len(shape):
        raise InvalidMetadata("chunk_shape and shape differ in rank")
    keys = ChunkKeyEncoding.from_metadata(meta.get("chunk_key_encoding"))
    codecs = meta.get("codecs")
    if not isinstance(codecs, list):
        raise InvalidMetadata("array metadata has no codecs list")

    ndim = len(shape)
    position, orders, filters = 0, [], []
    while position < len(codecs):
        name, config = normalize_codec(codecs[position])
        if name == "transpose":
            orders.append(transpose_order(config, ndim))
        else:
            v2 = v2_codec(name, config)
            if v2 is None or codec_kind(v2) != "array":
                break
            filters.append(v2)
        position += 1
    if position == len(codecs):
        raise InvalidMetadata("codec chain has no array-to-bytes codec")
    name, config = normalize_codec(codecs[position])
    perm = compose_transposes(orders, ndim)
    data_type = meta.get("data_type")
    serializer: dict[str, Any] | None = None  # the v2 form of a serializer other than `bytes`
    try:
        if name == "bytes":
            dtype = v2_dtype(data_type, config.get("endian"))
            if dtype.kind == "O":
                raise Untranslatable(f"data type {data_type!r} needs a vlen codec, not bytes")
        else:
            serializer = v2_codec(name, config)
            if serializer is None or codec_kind(serializer) != "array-bytes":
                raise Untranslatable(f"array codec {name!r} has no zarr v2 form")
            dtype = v2_dtype(data_type, "little")  # what zarr-python 3 hands the codec
            if (dtype.kind == "O") != (name in VLEN_CODECS) or (
                dtype.kind == "O" and data_type not in VLEN_CODECS[name]
            ):
                raise Untranslatable(f"data type {data_type!r} cannot take codec {name!r}")
    except InvalidMetadata as e:
        raise Untranslatable(str(e)) from None
    if filters and serializer is not None and serializer["id"] in VLEN_CODECS:
        raise Untranslatable(f"numcodecs filters before {name!r} have no zarr v2 form")
    if filters and (
        orders or (dtype.byteorder == ">") or any(big_endian_filter(f) for f in filters)
    ):
        raise Untranslatable(
            "numcodecs filters under a transpose or with big-endian data have no zarr v2 form"
        )
    byte_codecs = codecs[position + 1 :]

    transform = Transform.RAW
    direct = byte_codecs
    if direct and is_crc32c(*normalize_codec(direct[-1])):
        transform, direct = Transform.STRIP_CRC32C, direct[:-1]
    byte_forms = [
        None if is_crc32c(*normalize_codec(c)) else v2_codec(*normalize_codec(c)) for c in direct
    ]
    order = "C" if perm == tuple(range(ndim)) else None
    if ndim > 1 and perm == tuple(reversed(range(ndim))) and serializer is None:
        order = "F"
    decoder = encoder = None
    chain: list[dict[str, Any]] = [*filters, *([serializer] if serializer else [])]
    if order is not None and all(f is not None and codec_kind(f) == "bytes" for f in byte_forms):
        chain += [f for f in byte_forms if f is not None]
    elif filters or serializer is not None:
        raise Untranslatable(
            f"no zarr v2 form: {name!r} or numcodecs filters with a chain the view cannot "
            "translate (a crc32c in the middle, an axis order other than C or F)"
        )
    else:
        try:
            decoders = tuple(byte_decoder(c) for c in reversed(byte_codecs))
            encoders = tuple(byte_encoder(c) for c in byte_codecs)
        except InvalidMetadata as e:
            raise Untranslatable(f"no zarr v2 form and {e}") from None
        transform, order, chain = Transform.DECODE, "C", []
        decoder = ChunkDecoder(dtype, tuple(chunks), perm, decoders)
        encoder = ChunkEncoder(dtype, tuple(chunks), perm, encoders)
    compressor = None
    if chain and codec_kind(chain[-1]) != "array" and chain[-1]["id"] not in VLEN_CODECS:
        compressor = chain.pop()

    zarray = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": chunks,
        "dtype": dtype.str,
        "compressor": compressor,
        "fill_value": _fill_value(meta, dtype),
        "order": order,
        "filters": chain or None,
        "dimension_separator": keys.separator,
    }
    v2_keys = ChunkKeyEncoding("v2", keys.separator)
    return V2Array(zarray, v2_keys, transform, decoder, encoder)


def consolidated(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `.zmetadata` document of a group, from its subtree's documents by relative key."""
    return {"metadata": dict(sorted(documents.items())), "zarr_consolidated_format": 1}
