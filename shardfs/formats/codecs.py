"""Decoding and encoding one Zarr v3 chunk through its codec chain, for views that must convert.

The views serve stored bytes unchanged wherever they can. Only when the
target format has no way to describe the source's chain (a zarr v2 reader and
an axis order other than C or F, say) is a chunk decoded here and served raw,
and a raw chunk written through such a view encoded again before it is stored.
The byte codecs come from numcodecs, the library zarr-python itself uses.

It also holds the one table of zarr v2 forms of v3 data types, fill values and
codecs (`v2_dtype`/`v3_data_type`, `v2_fill`/`v3_fill`, `v2_codec`/`v3_codec`),
used both ways: for what the v2 view shows, and for what a v2 writer's
`.zarray` becomes in the source. Every entry keeps the chunk bytes: a chunk a
v3 chain stores is, as it is, the chunk of the v2 form (see docs/semantics.md,
"The zarr v2 view").
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import crc32c
import numcodecs
import numpy as np

from shardfs.formats.shard_index import normalize_codec
from shardfs.primitives.errors import CorruptData, InvalidMetadata

#: v3 data type name -> numpy kind and item size.
DATA_TYPES: dict[str, str] = {
    "bool": "b1",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "complex64": "c8",
    "complex128": "c16",
}

_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_SHUFFLE_NAMES = {v: k for k, v in _SHUFFLE.items()}


# -- The zarr v2 forms of v3 data types, fill values and codecs ---------------------------
#
# Data types (the v2 `dtype` takes its byte order from the `bytes` codec's `endian`):
#   bool, int8..uint64, float16..64, complex64/128  <->  |b1, <i4, >f8, ...
#   {"name": "fixed_length_utf32", "configuration": {"length_bytes": 4N}}  <->  <UN
#   {"name": "null_terminated_bytes", "configuration": {"length_bytes": N}}  <->  |SN
#   {"name": "raw_bytes", "configuration": {"length_bytes": N}}  <->  |VN
#   {"name": "numpy.datetime64", "configuration": {"unit": u, "scale_factor": k}}  <->  <M8[ku]
#   {"name": "numpy.timedelta64", "configuration": {"unit": u, "scale_factor": k}}  <->  <m8[ku]
#   "string" (array-to-bytes codec `vlen-utf8`)  <->  |O, first filter {"id": "vlen-utf8"}
#   "variable_length_bytes" or "bytes" (`vlen-bytes`)  <->  |O, first filter {"id": "vlen-bytes"}
# Codecs: gzip, zstd, blosc  <->  {"id": ...} in numcodecs' form; `numcodecs.<id>` (what
# zarr-python 3 writes for the codecs of zarr.codecs.numcodecs)  <->  {"id": <id>, ...config};
# crc32c (and numcodecs' with its checksum at the end: the same bytes) has no v2 form that
# zarr-python 2.18 reads: the v2 view strips it at the end of a chain (`is_crc32c`).

#: The extension field (`must_understand: false`, which zarr-python 3 and tensorstore
#: accept and zarr-python 3 keeps) that records a v2 writer's `fill_value` where the v3
#: one cannot say it: `null` (v3 needs a value; xarray on zarr 2 masks whatever value the
#: view would show instead), or a number for an `|O` array.
V2_FIELD = "shardfs_zarr_v2"

#: The codecs zarr-python 3 writes as `numcodecs.<id>` (zarr.codecs.numcodecs), by kind.
NUMCODECS_ARRAY_TO_ARRAY = frozenset(
    {"astype", "bitround", "delta", "fixedscaleoffset", "packbits", "quantize"}
)
NUMCODECS_ARRAY_TO_BYTES = frozenset({"pcodec", "zfpy"})
NUMCODECS_BYTES_TO_BYTES = frozenset(
    {
        "adler32",
        "blosc",
        "bz2",
        "crc32",
        "crc32c",
        "fletcher32",
        "gzip",
        "jenkins_lookup3",
        "lz4",
        "lzma",
        "shuffle",
        "zlib",
        "zstd",
    }
)
NUMCODECS = NUMCODECS_ARRAY_TO_ARRAY | NUMCODECS_ARRAY_TO_BYTES | NUMCODECS_BYTES_TO_BYTES
NUMCODECS_PREFIX = "numcodecs."
#: v3 array-to-bytes codecs of variable-length data types (the v2 object codec has the same id)
#: -> the v3 data type names they serve (the first is what zarr-python 3 writes).
VLEN_CODECS: dict[str, tuple[str, ...]] = {
    "vlen-utf8": ("string",),
    "vlen-bytes": ("variable_length_bytes", "bytes"),
}
#: Keys of numcodecs filter configurations that name a dtype (checked for byte order).
_DTYPE_KEYS = ("dtype", "astype", "encode_dtype", "decode_dtype")
_FIXED_LENGTH = {"fixed_length_utf32": "U", "null_terminated_bytes": "S", "raw_bytes": "V"}
_TIME = {"numpy.datetime64": "M8", "numpy.timedelta64": "m8"}
_TIME_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"})
_NAT = -(2**63)


def _order(endian: str | None, data_type: Any) -> str:
    if endian not in ("little", "big"):
        raise InvalidMetadata(f"a multi-byte {data_type} needs the bytes codec's endian")
    return "<" if endian == "little" else ">"


def v2_dtype(data_type: Any, endian: str | None) -> np.dtype:
    """The numpy (zarr v2) dtype of a v3 data type stored with the `bytes` codec's byte order
    (`endian`; None where the chain has no `bytes` codec). Variable-length types are `|O`.

    Raises InvalidMetadata for a data type with no v2 form.
    """
    if isinstance(data_type, str):
        if any(data_type in names for names in VLEN_CODECS.values()):
            return np.dtype("O")
        code = DATA_TYPES.get(data_type)
        if code is None:
            raise InvalidMetadata(f"data type {data_type!r} has no numpy equivalent")
        if code.endswith("1") and code != "c16":
            return np.dtype("|" + code)
        return np.dtype(_order(endian, data_type) + code)
    if not isinstance(data_type, dict) or not isinstance(data_type.get("name"), str):
        raise InvalidMetadata(f"data type {data_type!r} has no numpy equivalent")
    name, config = data_type["name"], data_type.get("configuration")
    if not isinstance(config, dict):
        raise InvalidMetadata(f"data type {name!r} has no configuration")
    if name in _FIXED_LENGTH:
        length = config.get("length_bytes")
        kind = _FIXED_LENGTH[name]
        unit = 4 if kind == "U" else 1
        if not _positive_int(length) or length % unit:
            raise InvalidMetadata(f"data type {name!r}: length_bytes {length!r} is not valid")
        order = _order(endian, name) if kind == "U" else "|"
        return np.dtype(f"{order}{kind}{length // unit}")
    if name in _TIME:
        time_unit, scale = config.get("unit"), config.get("scale_factor", 1)
        if time_unit not in _TIME_UNITS | {"generic"} or not _positive_int(scale) or scale >= 2**31:
            raise InvalidMetadata(f"data type {name!r}: unit {time_unit!r}, scale {scale!r}")
        suffix = "" if time_unit == "generic" else f"[{'' if scale == 1 else scale}{time_unit}]"
        return np.dtype(f"{_order(endian, name)}{_TIME[name]}{suffix}")
    raise InvalidMetadata(f"data type {name!r} has no numpy equivalent")


def v3_data_type(dtype: np.dtype, object_codec: str | None = None) -> Any:
    """The v3 data type of a v2 `dtype` (`object_codec`: the id of an `|O` array's object
    codec, its first filter). Raises InvalidMetadata if there is none."""
    if dtype.fields is not None or dtype.subdtype is not None:
        raise InvalidMetadata(f"dtype {dtype.str!r} has no Zarr v3 equivalent")
    if dtype.kind == "O":
        if object_codec not in VLEN_CODECS:
            raise InvalidMetadata(
                f"dtype '|O' with object codec {object_codec!r} has no Zarr v3 equivalent "
                "(vlen-utf8 and vlen-bytes have)"
            )
        return VLEN_CODECS[object_codec][0]
    if dtype.kind in "USV":
        name = next(n for n, kind in _FIXED_LENGTH.items() if kind == dtype.kind)
        if dtype.itemsize == 0:
            raise InvalidMetadata(f"dtype {dtype.str!r} has no length")
        return {"name": name, "configuration": {"length_bytes": dtype.itemsize}}
    if dtype.kind in "Mm":
        unit, scale = np.datetime_data(dtype)
        name = "numpy.datetime64" if dtype.kind == "M" else "numpy.timedelta64"
        return {"name": name, "configuration": {"unit": unit, "scale_factor": scale}}
    names = {v: k for k, v in DATA_TYPES.items()}
    data_type = names.get(f"{dtype.kind}{dtype.itemsize}")
    if data_type is None:
        raise InvalidMetadata(f"dtype {dtype.str!r} has no Zarr v3 equivalent")
    return data_type


def has_byte_order(dtype: np.dtype) -> bool:
    """Whether the v3 `bytes` codec of `dtype` needs an `endian`."""
    return dtype.byteorder != "|" and dtype.kind != "O"


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_base64(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        base64.standard_b64decode(value.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError):
        return False
    return True


def v2_fill(value: Any, dtype: np.dtype) -> Any:
    """The v2 JSON form of a v3 fill value of an array shown as v2 `dtype`, for the kinds
    outside bool, integers, floats and complex. Raises InvalidMetadata if not understood.

    Strings stay strings; bytes stay base64 (zarr-python 3 writes both forms so); times
    become the integer zarr-python 2 writes (NaT is -2**63).
    """
    if dtype.kind in "UO" and isinstance(value, str):
        return value
    if dtype.kind == "O" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # as zarr-python 3 reads a number for a string
    if dtype.kind in "SV" and _is_base64(value):
        return value
    if dtype.kind in "Mm":
        if value == "NaT":
            return _NAT
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise InvalidMetadata(f"fill value {value!r} of a {dtype.str} array is not understood")


def v3_fill(value: Any, dtype: np.dtype, data_type: Any) -> Any:
    """The v3 JSON fill value of a v2 `fill_value` of `dtype` (`data_type`: its v3 type).

    `null` becomes what zarr-python 3 reads for it (0, false, "", empty bytes, NaT);
    zarr-python 2's numbers for `|O` arrays become what zarr-python 3 makes of them.
    """
    kind = dtype.kind
    if kind in "biufc":
        if value is None:
            return False if kind == "b" else ([0.0, 0.0] if kind == "c" else 0)
        return value
    if kind in "Mm":
        if value is None or value == "NaT":
            return _NAT
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "U" or data_type == "string":
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # zarr-python 2 wrote 0 for strings; zarr-python 3 reads "0"
    elif kind == "O":  # vlen-bytes: base64, as zarr-python 3 writes it in both formats
        if value is None or value == 0:
            return ""
        if _is_base64(value):
            return value
    elif kind in "SV":
        if value is None or value == 0:
            value = ""
        if _is_base64(value):
            raw = base64.standard_b64decode(value)
            if kind == "V":  # zarr-python 3 wants all N bytes
                raw = raw.ljust(dtype.itemsize, b"\0")[: dtype.itemsize]
            return base64.standard_b64encode(raw).decode("ascii")
    raise InvalidMetadata(f"fill value {value!r} of a {dtype.str} array is not understood")


def v2_codec(name: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The numcodecs (zarr v2) configuration of a v3 codec other than `bytes`, if it has one."""
    if name == "gzip":
        return {"id": "gzip", "level": config.get("level", 5)}
    if name == "zstd":
        codec: dict[str, Any] = {"id": "zstd", "level": config.get("level", 0)}
        if config.get("checksum"):
            codec["checksum"] = True
        return codec
    if name == "blosc":
        shuffle = config.get("shuffle", "noshuffle")
        shuffle = _SHUFFLE.get(shuffle, shuffle)
        if shuffle not in (0, 1, 2, -1):
            return None
        return {
            "id": "blosc",
            "cname": config.get("cname", "lz4"),
            "clevel": config.get("clevel", 5),
            "shuffle": shuffle,
            "blocksize": config.get("blocksize", 0),
        }
    if name in VLEN_CODECS:
        return {"id": name}
    if name.startswith(NUMCODECS_PREFIX) and name.removeprefix(NUMCODECS_PREFIX) in NUMCODECS:
        return {**config, "id": name.removeprefix(NUMCODECS_PREFIX)}
    return None


def normalized_v2_codec(v2: Any) -> Any:
    """A numcodecs configuration with every default spelled out, as zarr-python 2 writes it
    back (the configuration as given if numcodecs does not know it)."""
    if not isinstance(v2, dict) or not isinstance(v2.get("id"), str):
        return v2
    try:
        return numcodecs.get_codec(dict(v2)).get_config()
    except Exception:  # an unknown id or a configuration numcodecs rejects: compare as given
        return v2


def is_crc32c(name: str, config: dict[str, Any]) -> bool:
    """The spec's `crc32c` codec, or numcodecs' with its checksum at the end (the same bytes).

    zarr-python 2.18's numcodecs has no crc32c, so the v2 view strips it instead of
    naming it.
    """
    if name == "crc32c":
        return True
    return name == "numcodecs.crc32c" and config.get("location", "end") == "end"


def codec_kind(v2: Any) -> str:
    """`array`, `array-bytes` or `bytes`: the v3 kind of a numcodecs codec configuration."""
    codec_id = v2.get("id") if isinstance(v2, dict) else None
    if codec_id in NUMCODECS_ARRAY_TO_ARRAY:
        return "array"
    if codec_id in NUMCODECS_ARRAY_TO_BYTES or codec_id in VLEN_CODECS:
        return "array-bytes"
    return "bytes"


def big_endian_filter(v2: dict[str, Any]) -> bool:
    """Whether a numcodecs filter configuration names a big-endian multi-byte dtype.

    zarr-python 3 hands array-to-array codecs arrays in native (little-endian) order and the
    `bytes` codec serializes their output in its `endian`; v2 stores a filter's output as it is.
    The two agree only when every dtype is little-endian (or of one byte).
    """
    for key in _DTYPE_KEYS:
        value = v2.get(key)
        if value is None:
            continue
        try:
            dtype = np.dtype(value)
        except (TypeError, ValueError):
            return True
        if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
            return True
    return False


def v3_codec(v2: Any, itemsize: int) -> dict[str, Any]:
    """The v3 codec of a numcodecs (zarr v2) filter or compressor configuration.

    `itemsize` is the item size of what the codec is given (only blosc's `typesize`, and what
    numcodecs' AUTOSHUFFLE picks for it, depend on it). Raises InvalidMetadata if it has none.
    """
    codec_id = v2.get("id") if isinstance(v2, dict) else None
    if not isinstance(codec_id, str):
        raise InvalidMetadata(f"codec {v2!r} has no id")
    config = {k: v for k, v in v2.items() if k != "id"}
    if codec_id == "gzip":
        return {"name": "gzip", "configuration": {"level": config.get("level", 1)}}
    if codec_id == "zstd" and set(config) <= {"level", "checksum"}:
        return {
            "name": "zstd",
            "configuration": {
                "level": config.get("level", 0),
                "checksum": bool(config.get("checksum")),
            },
        }
    if codec_id == "blosc" and set(config) <= {
        "cname",
        "clevel",
        "shuffle",
        "blocksize",
        "typesize",
    }:
        shuffle = config.get("shuffle", 1)
        if shuffle == -1:  # AUTOSHUFFLE: what numcodecs picks for the item size
            shuffle = 2 if itemsize == 1 else 1
        return {
            "name": "blosc",
            "configuration": {
                "cname": config.get("cname", "lz4"),
                "clevel": config.get("clevel", 5),
                "shuffle": _SHUFFLE_NAMES.get(shuffle, "noshuffle"),
                "typesize": itemsize,
                "blocksize": config.get("blocksize", 0),
            },
        }
    if codec_id == "crc32c" and config.get("location", "end") == "end":
        return {"name": "crc32c"}
    if codec_id in VLEN_CODECS:
        return {"name": codec_id, "configuration": {}}
    if codec_id in NUMCODECS:
        return {"name": NUMCODECS_PREFIX + codec_id, "configuration": config}
    raise InvalidMetadata(f"codec {codec_id!r} has no Zarr v3 equivalent")


def crc32c_encode(data: bytes) -> bytes:
    return bytes(data) + crc32c.crc32c(data).to_bytes(4, "little")


def _crc32c_decode(data: bytes) -> bytes:
    if len(data) < 4:
        raise CorruptData(f"chunk of {len(data)} bytes cannot hold its crc32c")
    body, stored = data[:-4], int.from_bytes(data[-4:], "little")
    if crc32c.crc32c(body) != stored:
        raise CorruptData("chunk checksum (crc32c) does not match")
    return body


def _numcodecs_codec(name: str, config: dict[str, Any]) -> numcodecs.abc.Codec:
    v2 = v2_codec(name, config)
    if v2 is None or codec_kind(v2) != "bytes":
        raise InvalidMetadata(f"cannot decode codec {name!r}")
    if v2["id"] == "blosc" and name == "blosc" and isinstance(config.get("typesize"), int):
        v2["typesize"] = config["typesize"]  # only shapes how blosc shuffles when encoding
    try:
        return numcodecs.get_codec(v2)
    except Exception as e:  # an unknown id, or a configuration numcodecs rejects
        raise InvalidMetadata(f"cannot decode codec {name!r}: {e}") from None


def byte_encoder(codec: Any) -> Callable[[bytes], bytes]:
    """The encoding function of one v3 bytes-to-bytes codec; InvalidMetadata if unknown."""
    name, config = normalize_codec(codec)
    if name == "crc32c":
        return crc32c_encode
    encoder = _numcodecs_codec(name, config)
    return lambda data: bytes(encoder.encode(data))


def byte_decoder(codec: Any) -> Callable[[bytes], bytes]:
    """The decoding function of one v3 bytes-to-bytes codec; InvalidMetadata if unknown."""
    name, config = normalize_codec(codec)
    if name == "crc32c":
        return _crc32c_decode
    decoder = _numcodecs_codec(name, config)

    def decode(data: bytes) -> bytes:
        try:
            return bytes(decoder.decode(data))
        except Exception as e:  # numcodecs raises whatever its C library reports
            raise CorruptData(f"{name} cannot decode the chunk: {e}") from None

    return decode


@dataclass(frozen=True)
class ChunkDecoder:
    """Decodes one stored chunk of a v3 array to its values, as C-order bytes of `dtype`."""

    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    #: the permutation of all transposes together (stored axis i = array axis perm[i])
    perm: tuple[int, ...]
    byte_decoders: tuple[Callable[[bytes], bytes], ...]  #: in decoding order

    @property
    def nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def __call__(self, stored: bytes) -> bytes:
        data = stored
        for decode in self.byte_decoders:
            data = decode(data)
        stored_shape = tuple(self.chunk_shape[i] for i in self.perm)
        if len(data) != math.prod(stored_shape) * self.dtype.itemsize:
            raise CorruptData(
                f"chunk decodes to {len(data)} bytes, expected {self.nbytes} for "
                f"{list(self.chunk_shape)} of {self.dtype}"
            )
        values = np.frombuffer(data, dtype=self.dtype).reshape(stored_shape)
        return np.ascontiguousarray(values.transpose(np.argsort(self.perm))).tobytes()


@dataclass(frozen=True)
class ChunkEncoder:
    """Encodes the values of one chunk (C-order bytes of `dtype`) into its stored form."""

    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    #: the permutation of all transposes together (stored axis i = array axis perm[i])
    perm: tuple[int, ...]
    byte_encoders: tuple[Callable[[bytes], bytes], ...]  #: in encoding order

    @property
    def nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def __call__(self, values: bytes) -> bytes:
        if len(values) != self.nbytes:
            raise ValueError(
                f"an uncompressed chunk of {list(self.chunk_shape)} {self.dtype} has "
                f"{self.nbytes} bytes, not {len(values)}"
            )
        array = np.frombuffer(values, dtype=self.dtype).reshape(self.chunk_shape)
        data = np.ascontiguousarray(array.transpose(self.perm)).tobytes()
        for encode in self.byte_encoders:
            data = encode(data)
        return data


def compose_transposes(orders: Sequence[tuple[int, ...]], ndim: int) -> tuple[int, ...]:
    """One permutation equal to applying `orders` in turn."""
    perm = tuple(range(ndim))
    for step in orders:
        perm = tuple(perm[i] for i in step)
    return perm
