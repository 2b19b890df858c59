"""The reference model behind tests/mounts/test_model_kernel.py: a source of 1-D sharded Zarr v3
arrays that an independent writer changes between the steps of a test, and every version
each chunk file of the mount's default v3 view had at the boundaries between steps.

A chunk file's bytes are its inner chunk's bytes as stored; the model reads them from the
shards' own indexes (its own decoder, not shardfs's), so the reference does not share
the code it judges. zarr-python 3 writes the arrays and replaces shards (it writes a
temporary file and renames it over); the writes zarr-python has no form of (an append
after the index, an in-place rewrite at the same size, a repacked shard) are built here
in the layout the sharding codec specifies (chunks, then the index: offset and size per
chunk, 2^64-1 for an empty one, and its crc32c).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import crc32c
import numcodecs
import numpy as np
import zarr
from zarr.codecs import ZstdCodec

EMPTY = 2**64 - 1
ZSTD = numcodecs.Zstd(level=1)
#: zarr-python encodes a shard's inner chunks in one batch (twice as fast here).
ZARR_CONFIG = {"codec_pipeline.batch_size": 4096}


@dataclass(frozen=True)
class Layout:
    """A 1-D sharded array: `shape` elements, `shard` per shard, `chunk` per inner chunk."""

    shape: int
    shard: int
    chunk: int
    dtype: str
    compressed: bool

    @property
    def per_shard(self) -> int:
        return self.shard // self.chunk

    @property
    def shards(self) -> int:
        return math.ceil(self.shape / self.shard)


def shard_entries(shard: bytes, n: int) -> list[tuple[int, int] | None]:
    """The (offset, size) of each of the `n` chunks of a shard with its index at the end."""
    index = np.frombuffer(shard[-(16 * n + 4) : -4], "<u8").reshape(n, 2)
    return [None if int(o) == EMPTY else (int(o), int(s)) for o, s in index]


def index_bytes(entries: list[tuple[int, int] | None]) -> bytes:
    """A shard index (`bytes` codec, then its crc32c) for these entries."""
    raw = b"".join(
        np.array([EMPTY, EMPTY] if e is None else list(e), "<u8").tobytes() for e in entries
    )
    return raw + crc32c.crc32c(raw).to_bytes(4, "little")


def build_shard(chunks: list[bytes | None], order: list[int], pad: int = 0) -> bytes:
    """A shard whose body holds `chunks` laid out in `order` after `pad` zero bytes."""
    body, entries = bytearray(pad), [None] * len(chunks)
    for j in order:
        if chunks[j] is not None:
            entries[j] = (len(body), len(chunks[j]))
            body += chunks[j]
    return bytes(body) + index_bytes(entries)


def values(rng: np.random.Generator, style: str, n: int, dtype: str) -> np.ndarray:
    """`n` values, never the fill value 0 (so no chunk is left out as empty): 'random'
    ones barely compress (a chunk grows), 'ramp' and 'const' ones do (it shrinks)."""
    top = 2**15 if dtype == "int16" else 2**31
    if style == "random":
        out = rng.integers(1, top, n)
    elif style == "ramp":
        out = np.arange(n) % (top - 1) + 1 + int(rng.integers(0, 100))
    else:
        out = np.full(n, int(rng.integers(1, 100)))
    return out.astype(dtype)


def encode(layout: Layout, data: np.ndarray) -> bytes:
    """An inner chunk as the array's codecs store it (little-endian bytes, zstd or not)."""
    raw = data.astype(np.dtype(layout.dtype).newbyteorder("<")).tobytes()
    return ZSTD.encode(raw) if layout.compressed else raw


class Source:
    """Arrays `{prefix}_{name}` in the directory `root` (a shardfs mount's source), their
    changes, and the history of every chunk file: `history[path]` lists `(state, bytes or
    None)` each time the file's bytes changed, `state` counting the boundaries between
    steps. `ghosts` are versions that existed only inside one change step (no request
    could see them)."""

    def __init__(self, root: Path, scratch: Path, prefix: str) -> None:
        self.root, self.scratch, self.prefix = root, scratch, prefix
        self.layouts: dict[str, Layout] = {}
        self.state = 0
        self.current: dict[str, bytes] = {}
        self.history: dict[str, list[tuple[int, bytes | None]]] = {}
        self.ghosts: dict[str, list[bytes]] = {}
        self.regrids: dict[str, list[int]] = {}
        self.extents: dict[str, set[tuple[str, int, int]]] = {}
        self.in_place: dict[str, list[bytes]] = {}
        self.changes = 0
        scratch.mkdir(parents=True, exist_ok=True)

    # -- names --------------------------------------------------------------------------
    def array_dir(self, name: str) -> Path:
        return self.root / f"{self.prefix}_{name}"

    def chunk_path(self, name: str, index: int) -> str:
        """The chunk file of inner chunk `index`, relative to the mount's root."""
        return f"{self.prefix}_{name}/c/{index}"

    def shard_file(self, name: str, shard: int) -> Path:
        return self.array_dir(name) / "c" / str(shard % self.layouts[name].shards)

    def rng(self) -> np.random.Generator:
        """A generator for one change: the data depend only on the steps run before."""
        self.changes += 1
        return np.random.default_rng(self.changes)

    # -- changes (each leaves the source valid; `commit` records the boundary after it) --
    def create(self, name: str, layout: Layout, style: str) -> None:
        """zarr-python (over)writes the whole array (an overwrite deletes it first)."""
        with zarr.config.set(ZARR_CONFIG):
            self._create(name, layout, style)
        self.layouts[name] = layout

    def _create(self, name: str, layout: Layout, style: str) -> None:
        array = zarr.create_array(
            store=str(self.array_dir(name)),
            shape=(layout.shape,),
            chunks=(layout.chunk,),
            shards=(layout.shard,),
            dtype=layout.dtype,
            compressors=[ZstdCodec(level=1)] if layout.compressed else None,
            fill_value=0,
            overwrite=True,
        )
        array[...] = values(self.rng(), style, layout.shape, layout.dtype)

    def copy_from(self, template: Path, name: str, layout: Layout) -> None:
        """The array as zarr-python wrote it once into `template` (saves writing it anew)."""
        shutil.copytree(template, self.array_dir(name))
        self.layouts[name] = layout

    def replace_shard(self, name: str, shard: int, style: str) -> str:
        """zarr-python rewrites one shard's region (a new file renamed over the shard)."""
        layout = self.layouts[name]
        s = shard % layout.shards
        lo, hi = s * layout.shard, min((s + 1) * layout.shard, layout.shape)
        with zarr.config.set(ZARR_CONFIG):
            array = zarr.open_array(str(self.array_dir(name)), mode="r+")
            array[lo:hi] = values(self.rng(), style, hi - lo, layout.dtype)
        return f"shard {s} rewritten ({style})"

    def rewrite_in_place(self, name: str, shard: int, then_replace: bool) -> str:
        """The shard rewritten in place at the same size, its mtime put back (only its
        ctime shows it): chunks of equal size trade contents (uncompressed ones get new
        values) and the body is laid out in reverse order. Then, if asked, zarr-python
        renames a new shard over it in the same step."""
        layout, path = self.layouts[name], self.shard_file(name, shard)
        if not path.exists():
            return "no shard"
        old = path.read_bytes()
        st = os.stat(path)
        entries = shard_entries(old, layout.per_shard)
        chunks = [None if e is None else old[e[0] : e[0] + e[1]] for e in entries]
        rng = self.rng()
        if layout.compressed:
            by_size: dict[int, list[int]] = {}
            for j, c in enumerate(chunks):
                if c is not None:
                    by_size.setdefault(len(c), []).append(j)
            new = list(chunks)
            for group in by_size.values():
                for a, b in zip(group, group[1:] + group[:1], strict=True):
                    new[a] = chunks[b]
        else:
            new = [
                None
                if c is None
                else encode(layout, values(rng, "random", layout.chunk, layout.dtype))
                for c in chunks
            ]
        order = [j for j in reversed(range(len(new))) if new[j] is not None]
        need = sum(len(c) for c in new if c is not None) + 16 * len(new) + 4
        data = build_shard(new, order, pad=len(old) - need)
        assert len(data) == len(old)
        with open(path, "r+b") as f:
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.in_place.setdefault(str(path.relative_to(self.root)), []).append(data)
        said = f"shard {path.name} rewritten in place, same size and mtime"
        if then_replace:
            for p, b in self.scan(name).items():
                if b != self.current.get(p):
                    self.ghosts.setdefault(p, []).append(b)
            said += "; then " + self.replace_shard(name, shard, "random")
        return said

    def append_to_shard(self, name: str, shard: int, which: str, style: str) -> str:
        """New bytes for some chunks of the shard appended in place after its end, then a
        new index (as another mount's commit does): what lay before the old end is kept."""
        layout, path = self.layouts[name], self.shard_file(name, shard)
        if not path.exists():
            return "no shard"
        old = path.read_bytes()
        entries = shard_entries(old, layout.per_shard)
        s = int(path.name)
        inside = [
            j
            for j in range(layout.per_shard)
            if (s * layout.per_shard + j) * layout.chunk < layout.shape
        ]
        picked = {"first": inside[:1], "last": inside[-1:], "all": inside}[which]
        rng, tail = self.rng(), bytearray()
        for j in picked:
            chunk = encode(layout, values(rng, style, layout.chunk, layout.dtype))
            entries[j] = (len(old) + len(tail), len(chunk))
            tail += chunk
        with open(path, "ab") as f:
            f.write(bytes(tail) + index_bytes(entries))
        return f"shard {s}: chunks {picked} appended ({style})"

    def compact_shard(self, name: str, shard: int) -> str:
        """A compaction: the same chunks packed anew in another order (no gaps), written
        to a temporary file and renamed over the shard."""
        layout, path = self.layouts[name], self.shard_file(name, shard)
        if not path.exists():
            return "no shard"
        old = path.read_bytes()
        entries = shard_entries(old, layout.per_shard)
        chunks = [None if e is None else old[e[0] : e[0] + e[1]] for e in entries]
        order = [j for j in reversed(range(len(chunks))) if chunks[j] is not None]
        tmp = self.array_dir(name) / f".compact-{path.name}"
        tmp.write_bytes(build_shard(chunks, order))
        os.replace(tmp, path)
        return f"shard {path.name} compacted"

    def unlink_shard(self, name: str, shard: int) -> str:
        path = self.shard_file(name, shard)
        if not path.exists():
            return "no shard"
        path.unlink()
        return f"shard {path.name} removed"

    def recreate(self, name: str, grid: str, dtype: str, style: str) -> str:
        """zarr-python overwrites the array with another inner chunk shape and/or data type
        (the shard shape kept: its chunk count changes)."""
        old = self.layouts[name]
        chunk = {"half": old.chunk // 2, "same": old.chunk, "double": old.chunk * 2}[grid]
        chunk = min(max(chunk, 1), old.shard)
        if chunk != old.chunk:
            self.regrids.setdefault(name, []).append(self.state + 1)
        self.create(name, replace(old, chunk=chunk, dtype=dtype), style)
        return f"array rewritten: chunk {old.chunk}->{chunk}, {old.dtype}->{dtype} ({style})"

    # -- the model ----------------------------------------------------------------------
    def scan(self, name: str) -> dict[str, bytes]:
        """Every chunk file of the array as the source holds it now: decoded from its own
        zarr.json and shard indexes. (Where each lies is kept in `extents`.)"""
        meta = json.loads((self.array_dir(name) / "zarr.json").read_text())
        shape = meta["shape"][0]
        shard = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
        chunk = meta["codecs"][0]["configuration"]["chunk_shape"][0]
        n = shard // chunk
        files = {}
        directory = self.array_dir(name) / "c"
        for entry in os.scandir(directory) if directory.is_dir() else ():
            if not entry.name.isdigit():
                continue
            data = Path(entry.path).read_bytes()
            key = str(Path(entry.path).relative_to(self.root))
            for j, e in enumerate(shard_entries(data, n)):
                index = int(entry.name) * n + j
                if e is not None and index * chunk < shape:
                    path = self.chunk_path(name, index)
                    files[path] = data[e[0] : e[0] + e[1]]
                    self.extents.setdefault(path, set()).add((key, *e))
        return files

    def commit(self, *names: str) -> list[str]:
        """Record the boundary after a step that changed these arrays; the changed paths."""
        self.state += 1
        changed = []
        for name in names:
            files = self.scan(name)
            mine = {p for p in self.current if p.startswith(f"{self.prefix}_{name}/")}
            for path in sorted(mine | files.keys()):
                new = files.get(path)
                if new != self.current.get(path):
                    self.history.setdefault(path, []).append((self.state, new))
                    changed.append(path)
                    if new is None:
                        del self.current[path]
                    else:
                        self.current[path] = new
        return changed

    def versions(self, path: str) -> list[tuple[int, bytes]]:
        """The versions the file had, as (state it appeared at, bytes), oldest first."""
        return [(s, b) for s, b in self.history.get(path, []) if b is not None]

    def may_be_absent(self, path: str) -> bool:
        """True if the file was missing at some boundary a step could see (or never
        existed): from the first commit on, which writes the example's arrays before any
        step reads them."""
        h = self.history.get(path, [])
        return not h or h[0][0] > 1 or any(b is None for _, b in h)


#: A verdict's kind, and the audit3 repro whose mechanism gives that outcome.
KINDS = {
    "cut-newer-at-older-size": "r1 (a newer version's bytes cut at an older version's size)",
    "cut-older-at-newer-size": "r4 (an older version's bytes cut at a newer version's size)",
    "cut-across-grid-change": "r3 (the version after a chunk-shape change cut at the size before)",
    "cut": "a version's bytes cut at a size no version had",
    "in-place-served": "r2 (a shown extent read from the shard as rewritten in place)",
    "in-place-mixed": "r2 (a version, then the shard as rewritten in place, in one pass)",
    "foreign": "another chunk file's bytes",
    "ghost": "a version that existed only inside a change step",
    "mixed": "the start of one version, then the rest of another (at the same offsets)",
    "unknown": "bytes of no version of any chunk file",
}


def common(a: bytes, b: bytes) -> int:
    """The length of the common prefix of two byte strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


def in_place_slices(source: Source, path: str) -> list[bytes]:
    """What each extent the file ever had holds in each in-place rewrite of its shard."""
    return [
        data[offset : offset + size]
        for shard, offset, size in source.extents.get(path, ())
        for data in source.in_place.get(shard, [])
    ]


def describe(b: bytes) -> str:
    import hashlib

    return f"{len(b)} B sha256 {hashlib.sha256(b).hexdigest()[:12]}"


def judge(source: Source, path: str, data: bytes, whole: bool) -> tuple[str, str] | None:
    """None if `data` (a whole pass, or the start of one cut short by EIO or unfinished)
    is a version of `path` the model allows: one the file had at a boundary (the kernel
    may hold attributes from any earlier show: the example's names are fresh, so its
    history starts with the example). Otherwise (kind, explanation)."""
    versions = source.versions(path)
    fits = [(s, b) for s, b in versions if (b == data if whole else b.startswith(data))]
    if fits:
        return None
    lines = [f"read {describe(data)} from {path} ({'whole pass' if whole else 'start of a pass'})"]
    lines += [f"  version of state {s}: {describe(b)}" for s, b in versions]
    lines += [f"  ghost (inside a change step): {describe(b)}" for b in source.ghosts.get(path, [])]
    kind = "unknown"
    sizes = {len(b): s for s, b in versions}
    prefix_of = [(s, b) for s, b in versions if b.startswith(data) and len(b) > len(data)]
    stale = in_place_slices(source, path)
    served = next((w for w in stale if w.startswith(data)), None)
    mixed = next(
        (
            (s, k)
            for w in stale
            for s, b in versions
            if (k := common(b, data)) > 0 and data[k:] == w[k : len(data)]
        ),
        None,
    )
    if served is not None:
        kind = "in-place-served"
        lines.append("  = the bytes at a shown extent of the shard as rewritten in place")
    elif mixed is not None:
        kind = "in-place-mixed"
        lines.append(
            f"  = state {mixed[0]}'s first {mixed[1]} B, then the shard as rewritten in place"
        )
    elif prefix_of:
        s, b = prefix_of[-1]
        at = sizes.get(len(data))
        name = path.split("/", 1)[0].split("_", 1)[1]
        across = at is not None and any(
            min(at, s) < g <= max(at, s) for g in source.regrids.get(name, [])
        )
        kind = (
            "cut"
            if at is None
            else "cut-across-grid-change"
            if across
            else "cut-newer-at-older-size"
            if at < s
            else "cut-older-at-newer-size"
        )
        lines.append(
            f"  = the version of state {s} cut at {len(data)} B"
            + (f" (the size of state {at}'s)" if at is not None else "")
        )
    elif any(g == data or g.startswith(data) for g in source.ghosts.get(path, [])):
        kind = "ghost"
        lines.append("  = a ghost version (or its start)")
    else:
        everything = versions + [(-1, g) for g in source.ghosts.get(path, [])]
        for s, b in everything:
            k = common(b, data)
            rest = next((t for t, c in everything if k and c[k : len(data)] == data[k:]), None)
            if rest is not None and len(data) > k:
                kind = "mixed"
                lines.append(f"  = state {s}'s first {k} B, then state {rest}'s (-1: a ghost)")
                break
        else:
            for other, hist in source.history.items():
                hit = next((s for s, b in hist if b is not None and b.startswith(data)), None)
                if other != path and hit is not None:
                    kind = "foreign"
                    lines.append(
                        f"  = {'the start of ' if len(data) else ''}{other}'s version of state {hit}"
                    )
                    break
    return kind, "\n".join(lines)
