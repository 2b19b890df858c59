"""The draft Zarr v3 format of zarr-python 2.14-2.18, translated to final Zarr v3.

zarr-python 2 wrote this format (with `ZARR_V3_EXPERIMENTAL_API=1`) before the
v3 spec was final: a `zarr.json` entry point, metadata under `meta/root`,
chunks under `data/root`, and sharding as a storage transformer. Pure: it maps
node paths to storage keys and draft metadata to the final v3 metadata that
describes the same stored bytes, so a view can serve draft data to v3 readers
without touching a byte. Anything without an exact final v3 equivalent is
refused with InvalidMetadata rather than approximated.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from shardfs.formats import jsondoc
from shardfs.formats.keys import parse_index
from shardfs.primitives.errors import InvalidMetadata

#: `zarr_format` and `metadata_encoding` of the draft entry point.
DRAFT_FORMAT = "https://purl.org/zarr/spec/protocol/core/3.0"

SHARDING_TRANSFORMER = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
COMPLEX_EXTENSION = (
    "https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/extensions/"
    "complex-dtypes/v1.0.html"
)
_CODEC_URI = re.compile(r"https://purl\.org/zarr/spec/codec/([a-z0-9]+)/1\.0")
_NUMPY_TYPE = re.compile(r"([<>|])([biufc])([0-9]+)")

#: Fields zarr-python 2.18 writes in an array document.
_ARRAY_FIELDS = frozenset(
    {
        "attributes",
        "chunk_grid",
        "chunk_memory_layout",
        "compressor",
        "data_type",
        "dimension_separator",
        "extensions",
        "fill_value",
        "shape",
        "storage_transformers",
    }
)

#: Compressors without a core v3 codec; zarr-python 3 registers them as `numcodecs.<id>`.
_NUMCODECS_COMPRESSORS = frozenset({"zlib", "bz2", "lz4", "lzma"})

#: numcodecs filters that zarr-python 3 registers as array->array `numcodecs.<id>` codecs,
#: with the configuration fields naming their input and output data types (None: the
#: filter keeps the type, except packbits, which turns bool into uint8).
_FILTER_DTYPES: dict[str, tuple[str, str] | None] = {
    "delta": ("dtype", "astype"),
    "fixedscaleoffset": ("dtype", "astype"),
    "quantize": ("dtype", "astype"),
    "astype": ("decode_dtype", "encode_dtype"),
    "bitround": None,
    "packbits": None,
}

_BLOSC_SHUFFLE = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}
_BLOSC_CNAMES = frozenset({"lz4", "lz4hc", "blosclz", "snappy", "zlib", "zstd"})
_FLOAT_SPECIALS = frozenset({"NaN", "Infinity", "-Infinity"})


def is_draft_entry_point(raw: bytes) -> bool:
    """Whether a root `zarr.json` is the draft entry point.

    False for final v3 metadata and for anything unparsable. A draft entry
    point that asks for something the key layout here does not follow (another
    metadata suffix or encoding, extensions) raises InvalidMetadata, so that
    the hierarchy is refused with the reason instead of being misread.
    """
    try:
        doc = jsondoc.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(doc, dict) or doc.get("zarr_format") != DRAFT_FORMAT:
        return False
    if doc.get("metadata_encoding") != DRAFT_FORMAT:
        raise InvalidMetadata(
            f"draft zarr.json has unsupported metadata_encoding {doc.get('metadata_encoding')!r}"
        )
    if doc.get("metadata_key_suffix") != ".json":
        raise InvalidMetadata(
            f"draft zarr.json has unsupported metadata_key_suffix {doc.get('metadata_key_suffix')!r}"
        )
    if doc.get("extensions", []) != []:
        raise InvalidMetadata(f"draft zarr.json requires extensions {doc['extensions']!r}")
    return True


def metadata_keys(path: str) -> tuple[str, str]:
    """Storage keys of the array and of the group document of the node at `path` ("" is the root)."""
    base = f"meta/root/{path}" if path else "meta/root"
    return f"{base}.array.json", f"{base}.group.json"


def data_prefix(path: str) -> str:
    """The storage prefix under which the chunks (or shards) of the array at `path` live."""
    return f"data/root/{path}" if path else "data/root"


@dataclass(frozen=True)
class DraftChunkKeys:
    """Draft chunk keys, relative to the array's data prefix: `c0/1`, `c0.1`, `c3`.

    With the sharding transformer the same keys name shards. zarr-python 2.18
    names the single chunk of a zero-dimensional array `c0`, as if it had one
    axis, so that is its key here too.
    """

    separator: str
    #: as `ChunkKeyEncoding.name`: with the separator, what tells encodings apart
    name: ClassVar[str] = "draft"

    def encode(self, coords: Sequence[int]) -> str:
        """The key of the chunk at `coords`."""
        return "c" + self.separator.join(str(i) for i in (coords if len(coords) else (0,)))

    def decode(self, key: str, ndim: int) -> tuple[int, ...] | None:
        """The coordinates named by `key`, or None if it is not a chunk key of `ndim` axes."""
        if not key.startswith("c"):
            return None
        parts = key[1:].split(self.separator)
        if ndim == 0:
            return () if parts == ["0"] else None
        if len(parts) != ndim:
            return None
        coords = tuple(parse_index(p) for p in parts)
        return None if None in coords else coords  # type: ignore[return-value]

    def dir_path(self, prefix: Sequence[int]) -> str:
        """The directory holding the keys that start with `prefix` ("" is the data prefix).

        Only meaningful with separator `/`, the only one whose keys form directories.
        """
        return "c" + "/".join(str(i) for i in prefix) if prefix else ""

    def component(self, name: str, depth: int) -> int | None:
        """The grid index named by one directory component `depth` levels below the prefix."""
        if depth == 0:
            return parse_index(name[1:]) if name.startswith("c") else None
        return parse_index(name)


def translate_group(doc: Any) -> dict[str, Any]:
    """The final v3 group metadata of a draft `.group.json` document."""
    if not isinstance(doc, dict):
        raise InvalidMetadata("draft group metadata is not a JSON object")
    if doc.get("extensions", []) != []:
        raise InvalidMetadata(f"draft group requires extensions {doc['extensions']!r}")
    attributes = doc.get("attributes", {})
    if not isinstance(attributes, dict):
        raise InvalidMetadata("draft group attributes are not a JSON object")
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes}


def translate_array(doc: Any) -> dict[str, Any]:
    """The final v3 array metadata describing the same stored bytes as a draft `.array.json`.

    Shards and chunks keep their bytes: a sharded array becomes a
    `sharding_indexed` array whose shards are the draft shards (index at the
    end, little-endian, no checksum), and each chunk's codec chain is the
    draft's memory layout, filters and compressor, spelled as v3 codecs.
    """
    if not isinstance(doc, dict):
        raise InvalidMetadata("draft array metadata is not a JSON object")
    unknown = sorted(set(doc) - _ARRAY_FIELDS)
    if unknown:
        raise InvalidMetadata(f"draft array metadata has unknown fields {unknown}")
    if doc.get("extensions", []) != []:
        raise InvalidMetadata(f"draft array requires extensions {doc['extensions']!r}")
    shape = _shape(doc.get("shape"), "shape", minimum=0)
    name, dtype = _data_type(doc.get("data_type"))
    grid = doc.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("type") != "regular":
        raise InvalidMetadata(f"draft chunk_grid {grid!r} is not a regular grid")
    chunk_shape = _shape(grid.get("chunk_shape"), "chunk_shape", minimum=1)
    if len(chunk_shape) != len(shape):
        raise InvalidMetadata(
            f"chunk_shape {list(chunk_shape)} and shape {list(shape)} differ in rank"
        )
    separator = grid.get("separator")
    if separator not in ("/", "."):
        raise InvalidMetadata(f"unsupported chunk key separator {separator!r}")
    # zarr-python 2.18 reads keys with the grid's separator and writes this field equal to it.
    if doc.get("dimension_separator", separator) != separator:
        raise InvalidMetadata(
            f"dimension_separator {doc['dimension_separator']!r} contradicts "
            f"the chunk grid separator {separator!r}"
        )
    attributes = doc.get("attributes", {})
    if not isinstance(attributes, dict):
        raise InvalidMetadata("draft array attributes are not a JSON object")
    # zarr-python 2.18 keeps the filters among the attributes; they are codecs, not user data.
    attributes = dict(attributes)
    filters = attributes.pop("filters", None) or []

    codecs = _chunk_codecs(doc, dtype, len(shape), filters)
    cps = _chunks_per_shard(doc.get("storage_transformers") or [], len(shape))
    if cps is None:
        grid_shape = chunk_shape
    else:
        grid_shape = tuple(c * n for c, n in zip(chunk_shape, cps, strict=True))
        sharding = {
            "chunk_shape": list(chunk_shape),
            "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end",
        }
        codecs = [{"name": "sharding_indexed", "configuration": sharding}]
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
        "fill_value": _fill_value(doc.get("fill_value"), dtype),
        "codecs": codecs,
        "attributes": attributes,
    }


def _shape(value: Any, what: str, minimum: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= minimum for i in value
    ):
        raise InvalidMetadata(f"{what} must be a list of integers >= {minimum}, got {value!r}")
    return tuple(value)


def _data_type(value: Any) -> tuple[str, np.dtype]:
    """The v3 name and the numpy dtype of a draft `data_type`.

    Complex types come wrapped in zarr-python 2.18's extension object; other
    extensions (datetimes, strings, structured and object types) have no
    byte-compatible core v3 type and are refused.
    """
    if isinstance(value, dict):
        if value.get("extension") != COMPLEX_EXTENSION:
            raise InvalidMetadata(
                f"data type {value.get('type')!r} of extension {value.get('extension')!r} "
                "has no Zarr v3 equivalent"
            )
        value = value.get("type")
        if not isinstance(value, str) or value[1:2] != "c":
            raise InvalidMetadata(f"complex data type extension names {value!r}")
    if value in ("bool", "i1", "u1"):
        value = "|" + {"bool": "b1"}.get(value, value)
    match = _NUMPY_TYPE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidMetadata(f"unsupported data type {value!r}")
    order, kind, size = match.group(1), match.group(2), int(match.group(3))
    valid = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}
    if size not in valid[kind] or (order == "|") != (size == 1):
        raise InvalidMetadata(f"unsupported data type {value!r}")
    prefix = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}[kind]
    return (prefix if kind == "b" else f"{prefix}{8 * size}"), np.dtype(value)


def _bytes_codec(dtype: np.dtype) -> dict[str, Any]:
    if dtype.itemsize == 1:
        return {"name": "bytes"}
    endian = "big" if dtype.byteorder == ">" else "little"
    return {"name": "bytes", "configuration": {"endian": endian}}


def _chunk_codecs(
    doc: dict[str, Any], dtype: np.dtype, ndim: int, filters: list[Any]
) -> list[dict[str, Any]]:
    """The v3 codecs of one draft chunk: memory layout, filters, bytes, compressor.

    zarr-python 2 hands the chunk in its memory layout to the filters and then
    the compressor; numcodecs filters flatten in that layout, which is exactly
    what a transpose reversing the axes followed by C-order encoding does.
    """
    layout = doc.get("chunk_memory_layout")
    if layout not in ("C", "F"):
        raise InvalidMetadata(f"unknown chunk_memory_layout {layout!r}")
    codecs: list[dict[str, Any]] = []
    if layout == "F" and ndim > 1:
        codecs.append({"name": "transpose", "configuration": {"order": list(range(ndim))[::-1]}})
    if not isinstance(filters, list):
        raise InvalidMetadata(f"draft filters {filters!r} are not a list")
    encoded = dtype
    for config in filters:
        codec, encoded = _filter_codec(config, encoded)
        codecs.append(codec)
    codecs.append(_bytes_codec(encoded))
    if "compressor" in doc:
        codecs.append(_compressor_codec(doc["compressor"], encoded))
    return codecs


def _filter_codec(config: Any, dtype: np.dtype) -> tuple[dict[str, Any], np.dtype]:
    """A numcodecs filter as a `numcodecs.<id>` codec, and the data type it produces.

    zarr-python 2 passes each filter the array as it is and lets numcodecs
    view it as the filter's declared input type; zarr-python 3 types the
    decoded bytes from the declared types instead. The two agree only when a
    filter declares the type it really receives, so anything else is refused.
    """
    if not isinstance(config, dict) or not isinstance(config.get("id"), str):
        raise InvalidMetadata(f"malformed filter {config!r}")
    fid = config["id"]
    if fid not in _FILTER_DTYPES:
        raise InvalidMetadata(f"filter {fid!r} has no array-to-array codec in zarr-python 3")
    fields = _FILTER_DTYPES[fid]
    out = dtype
    if fid == "packbits":
        if dtype.kind != "b":
            raise InvalidMetadata(f"filter 'packbits' receives {dtype.str}, not bool")
        out = np.dtype("u1")
    elif fields is not None:
        source, target = fields
        declared = _numpy_dtype(config.get(source), f"filter {fid!r} {source}")
        if declared != dtype:
            raise InvalidMetadata(
                f"filter {fid!r} declares {source} {declared.str}, but receives {dtype.str}"
            )
        if config.get(target) is not None:
            out = _numpy_dtype(config[target], f"filter {fid!r} {target}")
            _data_type(out.str)
    if fid == "quantize" and out != dtype:
        # zarr-python 3's numcodecs.quantize does not report its astype as the encoded type.
        raise InvalidMetadata(f"filter 'quantize' with astype {out.str} differing from its dtype")
    configuration = {k: v for k, v in config.items() if k != "id"}
    return {"name": f"numcodecs.{fid}", "configuration": configuration}, out


def _numpy_dtype(value: Any, what: str) -> np.dtype:
    try:
        dtype: np.dtype = np.dtype(value)
        return dtype
    except (TypeError, ValueError):
        raise InvalidMetadata(f"{what} {value!r} is not a data type") from None


def _compressor_codec(compressor: Any, dtype: np.dtype) -> dict[str, Any]:
    """A draft compressor (codec URI plus numcodecs configuration) as a v3 codec."""
    if not isinstance(compressor, dict):
        raise InvalidMetadata(f"malformed compressor {compressor!r}")
    uri, config = compressor.get("codec"), compressor.get("configuration")
    match = _CODEC_URI.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise InvalidMetadata(f"unknown compressor {uri!r}")
    if not isinstance(config, dict):
        raise InvalidMetadata(f"compressor {uri} has no configuration object")
    codec = match.group(1)
    if codec in _NUMCODECS_COMPRESSORS:
        return {"name": f"numcodecs.{codec}", "configuration": dict(config)}
    if codec == "gzip":
        _expect_fields(config, {"level"}, set(), codec)
        return {"name": "gzip", "configuration": {"level": config["level"]}}
    if codec == "zstd":
        _expect_fields(config, {"level"}, {"checksum"}, codec)
        zstd = {"level": config["level"], "checksum": config.get("checksum", False)}
        return {"name": "zstd", "configuration": zstd}
    if codec == "blosc":
        return {"name": "blosc", "configuration": _blosc_configuration(config, dtype)}
    raise InvalidMetadata(f"unknown compressor {uri!r}")


def _blosc_configuration(config: dict[str, Any], dtype: np.dtype) -> dict[str, Any]:
    """numcodecs Blosc settings in v3 form.

    numcodecs' AUTOSHUFFLE (-1) picks bit shuffling for 1-byte items and byte
    shuffling otherwise, from the itemsize of the array it compresses; the
    choice is recorded in each chunk's header, so decoding does not depend on
    it, and naming the choice made keeps the metadata true for re-encoding.
    """
    _expect_fields(config, {"cname", "clevel", "shuffle", "blocksize"}, {"typesize"}, "blosc")
    shuffle = config["shuffle"]
    if shuffle == -1:
        shuffle = 2 if dtype.itemsize == 1 else 1
    if shuffle not in _BLOSC_SHUFFLE or isinstance(shuffle, bool):
        raise InvalidMetadata(f"blosc shuffle {config['shuffle']!r} is not -1, 0, 1 or 2")
    if config["cname"] not in _BLOSC_CNAMES:
        raise InvalidMetadata(f"unknown blosc cname {config['cname']!r}")
    return {
        "cname": config["cname"],
        "clevel": config["clevel"],
        "shuffle": _BLOSC_SHUFFLE[shuffle],
        "typesize": config.get("typesize") or dtype.itemsize,
        "blocksize": config["blocksize"],
    }


def _expect_fields(
    config: dict[str, Any], required: set[str], optional: set[str], codec: str
) -> None:
    missing, extra = required - set(config), set(config) - required - optional
    if missing or extra:
        raise InvalidMetadata(
            f"{codec} configuration {config!r}: missing {sorted(missing)}, unknown {sorted(extra)}"
        )


def _chunks_per_shard(transformers: Any, ndim: int) -> tuple[int, ...] | None:
    """chunks_per_shard of the sharding transformer, or None without one.

    zarr-python 2.18 pads a short chunks_per_shard with ones (arrays of
    sub-array types gain trailing axes), and a zero-dimensional array stores
    [1] for its single chunk; both are read the way it reads them.
    """
    if not isinstance(transformers, list):
        raise InvalidMetadata(f"storage_transformers {transformers!r} is not a list")
    if not transformers:
        return None
    if len(transformers) > 1:
        raise InvalidMetadata(f"{len(transformers)} storage transformers; only one is supported")
    (transformer,) = transformers
    if not isinstance(transformer, dict) or transformer.get("extension") != SHARDING_TRANSFORMER:
        raise InvalidMetadata(f"unknown storage transformer {transformer!r}")
    if transformer.get("type") != "indexed":
        raise InvalidMetadata(
            f"sharding transformer type {transformer.get('type')!r} is not 'indexed'"
        )
    config = transformer.get("configuration")
    cps = _shape(
        config.get("chunks_per_shard") if isinstance(config, dict) else None,
        "chunks_per_shard",
        minimum=1,
    )
    if ndim == 0 and math.prod(cps) == 1 and len(cps) <= 1:
        return ()
    if len(cps) > ndim:
        raise InvalidMetadata(f"chunks_per_shard {list(cps)} has more axes than the array ({ndim})")
    return cps + (1,) * (ndim - len(cps))


def _fill_value(value: Any, dtype: np.dtype) -> Any:
    """A draft fill value in v3 JSON form.

    A null fill value leaves unwritten chunks undefined in zarr-python 2 (they
    read as uninitialised memory), so the type's zero is as faithful as any.
    """
    kind = dtype.kind
    if value is None:
        return {"b": False, "c": [0.0, 0.0]}.get(kind, 0)
    if kind == "b":
        if not isinstance(value, bool):
            raise InvalidMetadata(f"fill_value {value!r} is not a boolean")
        return value
    if kind in "iu":
        info = np.iinfo(dtype)
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not info.min <= value <= info.max
        ):
            raise InvalidMetadata(f"fill_value {value!r} is not an integer of type {dtype.name}")
        return value
    if kind == "f":
        return _float_fill(value)
    if not isinstance(value, list) or len(value) != 2:
        raise InvalidMetadata(f"complex fill_value {value!r} is not [real, imaginary]")
    return [_float_fill(part) for part in value]


def _float_fill(value: Any) -> float | int | str:
    if isinstance(value, str) and value in _FLOAT_SPECIALS:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidMetadata(f"fill_value {value!r} is not a number")
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
