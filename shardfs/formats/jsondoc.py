"""The one way JSON documents of a source are decoded: `zarr.json` (final and draft),
precomputed `info`, WKW `datasource-properties.json`, and the metadata documents
written through the view.

Pure. Python's `json` refuses some valid JSON with errors other than
`JSONDecodeError`: nesting deeper than the interpreter's recursion limit
(`RecursionError`, whose depth also depends on how deep the caller's stack is)
and integers of more than `sys.get_int_max_str_digits()` digits (`ValueError`).
Here every document Python cannot take raises `Refused`, a `JSONDecodeError`, so
that each caller's handling of invalid JSON (shown unchanged, refused write)
applies to them too. Nesting is bounded by a fixed `MAX_DEPTH`, checked on the
bytes before decoding: whatever is decoded can then be encoded again (the view
renders documents with `json.dumps`) and walked by recursive code, however deep
the stack that asks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

#: The string scanner `json` decodes with (typeshed declares it only in the private `_json`).
scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]

#: The deepest nesting of arrays and objects a document may have (Zarr metadata,
#: OME-Zarr's included, nests less than 10 levels).
MAX_DEPTH = 128

#: Brackets and quotes are counted in slices of this many, carrying the counts over.
_SLICE = 1 << 20

#: Every byte but those of brackets and quotes, the bytes that tell the depth.
_NOT_MARKS = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


class Refused(json.JSONDecodeError):
    """A document Python's `json` cannot take, or nested deeper than `MAX_DEPTH`."""

    def __init__(self, msg: str) -> None:
        ValueError.__init__(self, msg)
        self.msg, self.doc, self.pos, self.lineno, self.colno = msg, "", 0, 1, 1

    def __reduce__(self) -> tuple[type, tuple[str]]:  # copied and pickled by its one argument
        return type(self), (self.msg,)


def loads(raw: bytes) -> Any:
    """`raw` decoded as `json.loads` decodes bytes; JSONDecodeError (`Refused` for JSON
    Python cannot take) or UnicodeDecodeError where it cannot be."""
    encoding = json.detect_encoding(raw)
    text = raw.decode(encoding, "surrogatepass")
    utf8 = encoding in ("utf-8", "utf-8-sig")  # as it is (a BOM holds no ASCII byte)
    check_depth(raw if utf8 else text.encode("utf-8", "surrogatepass"))
    return _guarded(json.loads, text)


def object_spans(raw: bytes) -> tuple[Any, dict[str, tuple[int, int]], str]:
    """`raw` decoded from UTF-8, with the character span of each top-level value if it is
    an object (the last of a duplicated key, as `json.loads` keeps; none otherwise), and
    the text decoded. One pass of the C decoder, value by top-level value. Raises as
    `loads`."""
    text = raw.decode("utf-8")
    check_depth(raw)
    found = _guarded(_top_level, text)
    if found is None:  # not an object: let the decoder say what it is
        return _guarded(json.loads, text), {}, text
    return (*found, text)


def check_depth(utf8: bytes) -> None:
    """Refused if the JSON text `utf8` nests arrays and objects deeper than `MAX_DEPTH`.
    A few passes of C over the bytes (escapes taken out, then the quotes and brackets
    counted), none for a document with fewer brackets than that."""
    if utf8.count(b"[") + utf8.count(b"{") <= MAX_DEPTH:
        return
    if b"\\" in utf8:  # an escaped backslash, then an escaped quote, ends no string
        utf8 = utf8.replace(b"\\\\", b"").replace(b'\\"', b"")
    # UTF-8 encodes no other character with these bytes.
    marks = np.frombuffer(utf8.translate(None, _NOT_MARKS), dtype=np.uint8)
    depth = quotes = 0
    for start in range(0, len(marks), _SLICE):
        part = marks[start : start + _SLICE]
        quote = part == ord('"')
        inside = (np.cumsum(quote, dtype=np.int64) + quotes) & 1
        running = np.cumsum(np.where(inside, 0, _STEP[part]), dtype=np.int64) + depth
        if running.max() > MAX_DEPTH:
            raise Refused(f"JSON nested deeper than {MAX_DEPTH} levels")
        depth, quotes = int(running[-1]), quotes + int(np.count_nonzero(quote))


def _guarded(decode: Any, text: str) -> Any:
    """`decode(text)`, with what Python raises for JSON it cannot take as `Refused`."""
    try:
        return decode(text)
    except RecursionError:
        raise Refused(f"JSON nested too deeply for Python (over {MAX_DEPTH} levels)") from None
    except MemoryError:
        raise Refused("JSON too big to decode in memory") from None
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError):
            raise
        raise Refused(f"JSON Python cannot read ({e})") from None


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _top_level(text: str) -> tuple[dict[str, Any], dict[str, tuple[int, int]]] | None:
    """A JSON object and the character span of each of its values (the last of a
    duplicated key, as `json.loads` keeps); None if `text` is not an object;
    JSONDecodeError where it is not valid JSON."""
    at = _SPACE.match(text).end()  # type: ignore[union-attr]
    if not text.startswith("{", at):
        return None
    meta: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    if text.startswith("}", at):
        at += 1
    else:
        while True:
            if not text.startswith('"', at):
                raise json.JSONDecodeError(
                    "Expecting property name enclosed in double quotes", text, at
                )
            key, at = scanstring(text, at + 1)
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if not text.startswith(":", at):
                raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
            start = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
            meta[key], at = _DECODER.raw_decode(text, start)
            spans[key] = (start, at)
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if text.startswith(",", at):
                at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
                continue
            if not text.startswith("}", at):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at += 1
            break
    if _SPACE.match(text, at).end() != len(text):  # type: ignore[union-attr]
        raise json.JSONDecodeError("Extra data", text, at)
    return meta, spans
