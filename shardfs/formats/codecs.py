"""Decoding and encoding one Zarr v3 chunk through its codec chain, for views that must convert.

The views serve stored bytes unchanged wherever they can. Only when the
target format has no way to describe the source's chain (a zarr v2 reader and
an axis order other than C or F, say) is a chunk decoded here and served raw,
and a raw chunk written through such a view encoded again before it is stored.
The byte codecs come from numcodecs, the library zarr-python itself uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import numcodecs
import numpy as np

from shardfs.errors import CorruptData, InvalidMetadata
from shardfs.formats.shard_index import normalize_codec

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


def numpy_dtype(data_type: Any, endian: str | None) -> np.dtype:
    """The numpy dtype of a v3 data type stored with the `bytes` codec's byte order."""
    code = DATA_TYPES.get(data_type) if isinstance(data_type, str) else None
    if code is None:
        raise InvalidMetadata(f"data type {data_type!r} has no fixed-size numpy equivalent")
    if code.endswith("1") and code != "c16":
        return np.dtype("|" + code)
    if endian not in ("little", "big"):
        raise InvalidMetadata(f"a multi-byte {data_type} needs the bytes codec's endian")
    return np.dtype(("<" if endian == "little" else ">") + code)


def crc32c_encode(data: bytes) -> bytes:
    return bytes(data) + crc32c.crc32c(data).to_bytes(4, "little")


def _crc32c_decode(data: bytes) -> bytes:
    if len(data) < 4:
        raise CorruptData(f"chunk of {len(data)} bytes cannot hold its crc32c")
    body, stored = data[:-4], int.from_bytes(data[-4:], "little")
    if crc32c.crc32c(body) != stored:
        raise CorruptData("chunk checksum (crc32c) does not match")
    return body


def v2_compressor(name: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The numcodecs (zarr v2) compressor config of a v3 bytes-to-bytes codec, if it has one."""
    if name == "gzip":
        return {"id": "gzip", "level": config.get("level", 5)}
    if name in ("zstd", "numcodecs.zstd"):
        codec: dict[str, Any] = {"id": "zstd", "level": config.get("level", 0)}
        if config.get("checksum"):
            codec["checksum"] = True
        return codec
    if name in ("blosc", "numcodecs.blosc"):
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
    if name in ("numcodecs.zlib", "numcodecs.gzip"):
        return {"id": name.removeprefix("numcodecs."), "level": config.get("level", 1)}
    return None


def _numcodecs_codec(name: str, config: dict[str, Any]) -> numcodecs.abc.Codec:
    v2 = v2_compressor(name, config)
    if v2 is None:
        raise InvalidMetadata(f"cannot decode codec {name!r}")
    if v2["id"] == "blosc" and isinstance(config.get("typesize"), int):
        v2["typesize"] = config["typesize"]  # only shapes how blosc shuffles when encoding
    return numcodecs.get_codec(v2)


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
