"""A model-based interleaving test of kernel-served read-only mounts (issue 41), after
mountpoint-s3's reference-model tests.

A Hypothesis state machine drives a real `-o ro` mount (kernel-served: the kernel keeps
attributes, listings and pages for `cache_timeout`) with random sequences of lookups,
forced getattrs (statx AT_STATX_FORCE_SYNC), listings pulled a few names at a time with
getdents64 (a directory of 512 chunk files takes two READDIRPLUS replies, so a listing
can be left half-read while other steps run), descriptors held across steps and passes
over them split across steps, while the source changes between steps: zarr-python 3
replaces shards (a new file renamed over) and rewrites arrays with another chunk shape or
data type; hand-built shards are appended to in place, rewritten in place at the same
size with their mtime put back, compacted (renamed over) and removed; and chunk files are
written through a second, read-write shardfs mount of the same source (its commits append
to the shard). Generic steps also drop the kernel's dentries (which sends FORGETs) and
pages, wait past the kernel's timeout (it then asks again), and getxattr `user.md5`:
together they find a node id handed to the kernel after its slot was let go (the fourth
audit's r1 and r10: ENOENT for a chunk file that exists).

The oracle (tests/support/shard_model.py): a pass, one open-to-EOF read of one descriptor however
many read() calls it takes, gives exactly one version the file had at a boundary between
steps, whole, or fails with EIO (what it read before must then be the start of one); a
stat gives a size some version had; a listing names only files some boundary had; no
call fails with another errno than EIO (or ENOENT where the file was missing). The judge
names the kind of a wrong read (a version cut at another's size, the shard as rewritten
in place read at a shown extent, two versions mixed...) and the audit3 repro whose
mechanism gives it.

Each kind is shrunk on its own: once a search fails with some, they are only noted from
then on and the search runs again with the same seed (it then goes past them), or with
the next seed once it finds nothing new, until SHARDFS_MODEL_SECONDS (60 s; a search
runs at most 30 examples, the last one only as many as fit in the seconds left at the
pace so far, and shrinks for at most 12 s). The test fails with every kind
found: the minimal steps, the example's step log, the bytes read and the versions
allowed. The stress tier (`scripts/check --stress`) searches STRESS_BUDGET seconds each
way, from seeds the fast tier does not reach. SHARDFS_SOAK_SECONDS=N searches for N seconds
with random seeds instead;
SHARDFS_MODEL_LOG=FILE appends every violation seen (shrunk or not) to FILE;
SHARDFS_MODEL_SEED sets the first seed. The same machine over a plain directory, into
which the model writes each boundary by renames, must pass: the model has no false
positives.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zarr
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from shardfs.fuse.adapter import INODE_AS_FH
from shardfs.fuse.kernel_served.front import unavailable
from tests.conftest import Mounted
from tests.support.shard_model import KINDS, Layout, Source, encode, judge, values

#: The arrays (an example works on one): `w` has 512 chunk files in one directory (2
#: shards of 256 chunks of 128 B raw, zstd: about 70 B as written, 137 B random, 20 B
#: constant; two READDIRPLUS replies), `s` 8 small ones in 2 shards (the last one
#: partial), `b` two uncompressed chunks of 4 MiB + 4 KiB (over the size the daemon reads
#: whole at a pass's first read, so a pass takes several reads of the shard).
BIG = (1 << 20) + 1024
LAYOUTS = {
    "w": Layout(shape=16384, shard=8192, chunk=32, dtype="int32", compressed=True),
    "s": Layout(shape=60, shard=32, chunk=8, dtype="int32", compressed=True),
    "b": Layout(shape=2 * BIG, shard=2 * BIG, chunk=BIG, dtype="int32", compressed=False),
}
#: The chunk files the steps name (ALL): for `w` the first and last of each shard and
#: one in its second READDIRPLUS reply; then every file the example named before.
HOT = {"w": [0, 255, 256, 450, 511], "s": [0, 3, 7], "b": [0, 1]}
#: The chunk files a step's index picks from (`s` has 16 with half its chunk shape).
SPAN = {"w": 512, "s": 16, "b": 4}

#: `w` 3/5 of the examples (the listings), `s` and `b` 1/5 each.
ARRAYS = st.sampled_from(["w", "s", "w", "b", "w"])
#: One chunk file, or (half the time) all the steps name.
ALL = -1
INDEX = st.one_of(st.just(ALL), st.integers(0, 1023))
#: getdents64 calls a listing step makes (0: to the end).
CALLS = st.sampled_from([1, 10, 0])
HOWS = [
    "replace random",
    "replace const",
    "append random",
    "append const",
    "in-place",
    "in-place then-replace",
    "compact",
    "unlink",
]
#: getdents64 buffer: about 40 names a call, so a listing of `w` takes ~14 calls.
DIRENT_BUFFER = 1024
SEED = int(os.environ.get("SHARDFS_MODEL_SEED", "44"))
TICK = 0.02
STEPS = 25
#: Seconds the searches run for (a search is cut to the examples that fit in what is left,
#: so the test ends about then, or up to SHRINK seconds later where it shrinks a failure).
BUDGET = float(os.environ.get("SHARDFS_MODEL_SECONDS", "60"))
#: The seconds of the search without the native front (its rules are those the front's
#: rows follow, searched with the front on for `BUDGET`).
WITHOUT_FRONT_BUDGET = float(os.environ.get("SHARDFS_MODEL_SECONDS_WITHOUT_FRONT", "25"))
#: The mount's cache_timeout: short enough for a step to wait past it.
TIMEOUT = 1.0
#: The plain variant's seconds, and examples a search.
PLAIN_BUDGET, PLAIN_EXAMPLES = 20, 20
SOAK = float(os.environ.get("SHARDFS_SOAK_SECONDS", "0"))
#: Seconds of each search of the stress tier (`test_model_kernel_served_long`).
STRESS_BUDGET = 240
#: Seconds Hypothesis may shrink one search's failures (the rest is left for others).
SHRINK = 12 if not SOAK else 120
#: A file every violation seen is appended to (with its example's steps), shrunk or not.
LOG = os.environ.get("SHARDFS_MODEL_LOG")

libc = ctypes.CDLL(None, use_errno=True)
SYS_getdents64 = 217  # x86_64
AT_FDCWD, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS = -100, 0x2000, 0x7FF


def statx_size(path: Path, forced: bool) -> int:
    """st_size by statx; `forced` (AT_STATX_FORCE_SYNC) makes the kernel send a GETATTR
    whatever it holds, as `stat --cached=never`."""
    buf = ctypes.create_string_buffer(256)
    flags = AT_STATX_FORCE_SYNC if forced else 0
    if libc.statx(AT_FDCWD, os.fsencode(path), flags, STATX_BASIC_STATS, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(path))
    return struct.unpack_from("<Q", buf, 40)[0]


def getdents(fd: int) -> list[str] | None:
    """The names one getdents64 call with a small buffer returns; None at the end."""
    buf = ctypes.create_string_buffer(DIRENT_BUFFER)
    n = libc.syscall(SYS_getdents64, fd, buf, DIRENT_BUFFER)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    if n == 0:
        return None
    names, at, raw = [], 0, buf.raw
    while at < n:
        reclen = struct.unpack_from("<H", raw, at + 16)[0]
        name = raw[at + 19 : at + reclen].split(b"\0", 1)[0].decode()
        if name not in (".", ".."):
            names.append(name)
        at += reclen
    return names


class ModelViolation(AssertionError):
    """What the mount did that the model does not allow; `kind` sorts them (one search
    shrinks each kind separately, as Hypothesis tells failures apart by type)."""

    kind = ""


VIOLATIONS = {
    kind: type(f"Violation_{kind.replace('-', '_')}", (ModelViolation,), {"kind": kind})
    for kind in [*KINDS, "stat", "listing", "errno", "xattr"]
}


@dataclass
class Run:
    """One test's search: where it reads, its budget, what it found and counted."""

    source_root: Path
    target: Path
    templates: Path
    plain: bool
    deadline: float
    per_search: int = 30
    #: the first search's seed (the next search's is one more)
    seed: int = SEED
    #: a read-write mount of the same source (None: no writes through one)
    other: Path | None = None
    started: float = field(default_factory=time.monotonic)
    known: set[str] = field(default_factory=set)
    examples: int = 0
    steps: int = 0
    passes: int = 0
    eio: int = 0
    noted: Counter[str] = field(default_factory=Counter)
    first_seen: dict[str, str] = field(default_factory=dict)
    first_message: dict[str, str] = field(default_factory=dict)


@dataclass
class Pass:
    """A descriptor held across steps and the pass over it so far."""

    path: str
    fd: int
    opened: int
    data: bytearray = field(default_factory=bytearray)
    reads: list[int] = field(default_factory=list)


@dataclass
class Listing:
    """A directory being listed a getdents64 call at a time."""

    array: str
    fd: int
    started: int
    names: list[str] = field(default_factory=list)
    calls: int = 0


def step(f: Callable) -> Callable:
    """Count a rule's runs (the searches report how many steps they ran)."""

    @functools.wraps(f)
    def counted(self: KernelModel, *args: object, **kwargs: object) -> None:
        self.run.steps += 1
        f(self, *args, **kwargs)

    return counted


class KernelModel(RuleBasedStateMachine):
    """Steps over one example's arrays (fresh names: the kernel's caches of earlier
    examples cannot answer for them) through `run.target`."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run
        self.source: Source
        self.passes: list[Pass] = []
        self.listings: list[Listing] = []
        self.log: list[str] = []
        self.last_change = 0.0
        self.named: list[str] = []
        self.waited = False

    # -- plumbing -----------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.log.append(f"#{len(self.log)} [state {self.source.state}] {text}")

    def fail(self, kind: str, message: str) -> None:
        """Raise a violation of `kind`, unless an earlier search found that kind already
        (then it is only counted, and the steps go on)."""
        self.run.first_seen.setdefault(
            kind, f"example {self.run.examples}, {time.monotonic() - self.run.started:.0f} s"
        )
        if LOG:
            with open(LOG, "a") as f:
                f.write(
                    f"== {kind} (example {self.run.examples})\n{message}\n"
                    + "\n".join(self.log)
                    + "\n"
                )
        self.run.first_message.setdefault(kind, message + "\nsteps:\n" + "\n".join(self.log[-60:]))
        if kind in self.run.known:
            self.run.noted[kind] += 1
            self.log.append(f"   (known kind {kind}: {message.splitlines()[0]})")
            return
        steps = "\n".join(self.log[-60:])
        raise VIOLATIONS[kind](
            f"{kind}: {KINDS.get(kind, kind)}\n{message}\nsteps of this example "
            f"(state = boundaries between steps so far):\n{steps}"
        )

    def path(self, array: str, index: int) -> str:
        """Chunk file `index` modulo SPAN, remembered as named by the example."""
        path = self.source.chunk_path(array, index % SPAN[array])
        if path not in self.named:
            self.named.append(path)
        return path

    def error(self, path: str, e: OSError, what: str) -> None:
        """EIO is allowed anywhere; ENOENT where some boundary lacked the file."""
        self.note(f"{what} {path}: {errno.errorcode.get(e.errno, e.errno)}")
        if e.errno == errno.EIO:
            self.run.eio += 1
        elif not (e.errno == errno.ENOENT and self.source.may_be_absent(path)):
            self.fail("errno", f"{what} {path} failed: {e}")

    def check_names(self, array: str, names: list[str], how: str) -> None:
        bad = [
            n
            for n in names
            if not self.source.versions(self.source.chunk_path(array, int(n)) if n.isdigit() else n)
        ]
        if bad:
            self.fail("listing", f"{how} of {array} named files no boundary had: {bad[:10]}")

    def tick(self) -> None:
        """Changes TICK apart: two versions of a shard written within one tick of the
        file system's clock can show the same size and mtime, which the kernel cannot
        tell apart (docs/semantics.md, Consistency); so no step depends on timing."""
        time.sleep(max(0.0, self.last_change + TICK - time.monotonic()))
        self.last_change = time.monotonic()

    def change(self, array: str, said: str) -> None:
        """Record the boundary after a change (the next change waits a tick, see
        `tick`), and in the plain variant write it into the copy."""
        changed = self.source.commit(array)
        self.note(f"change {array}: {said}; {len(changed)} chunk files changed")
        if self.run.plain:
            self.materialize(changed)

    def materialize(self, paths: list[str]) -> None:
        """The plain variant: each changed file renamed over (or removed) in the copy."""
        for path in paths:
            dest = self.run.target / path
            data = self.source.current.get(path)
            if data is None:
                dest.unlink(missing_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".new-{dest.name}")
            tmp.write_bytes(data)
            os.replace(tmp, dest)

    def finish(self, p: Pass, whole: bool) -> None:
        """End a pass: close its descriptor and judge what it read."""
        os.close(p.fd)
        self.passes.remove(p)
        self.run.passes += 1
        how = "to EOF" if whole else "cut short"
        self.note(
            f"pass over {p.path} (opened at state {p.opened}, reads {p.reads}) {how}: {len(p.data)} B"
        )
        verdict = judge(self.source, p.path, bytes(p.data), whole)
        if verdict is not None:
            self.fail(verdict[0], verdict[1])

    def read_pass(self, p: Pass, size: int) -> None:
        """One read() of `size` bytes (0: to EOF) of a pass; EIO ends it."""
        try:
            while True:
                piece = os.read(p.fd, size or (1 << 20))
                p.reads.append(len(piece))
                if not piece:
                    return self.finish(p, whole=True)
                p.data += piece
                if size:
                    return None
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            self.note(f"{name} in a pass over {p.path} after {len(p.data)} B")
            if e.errno != errno.EIO:
                os.close(p.fd)
                self.passes.remove(p)
                return self.fail("errno", f"a read of {p.path} failed: {e}")
            self.run.eio += 1
            return self.finish(p, whole=False)

    # -- the example --------------------------------------------------------------------
    @initialize(array=ARRAYS, held=st.lists(st.integers(0, 3), max_size=2), listing=st.booleans())
    def start(self, array: str, held: list[int], listing: bool) -> None:
        """An example works on one array (so each step is about it), written by
        zarr-python under a fresh name; it may begin with readers holding some of its
        first chunk files open (files every chunk shape has) and a listing under way (so
        fewer steps lead to what they are for)."""
        run = self.run
        run.examples += 1
        self.array = array
        self.source = Source(run.source_root, run.templates / "scratch", f"x{run.examples}")
        self.source.copy_from(run.templates / f"t_{array}", array, LAYOUTS[array])
        self.source.commit(array)
        if run.plain:
            self.materialize(list(self.source.current))
        self.note(f"example {self.source.prefix}: array {array} written by zarr-python")
        for index in held:
            self.open_file(index)
        if listing:
            self.list_start(False, 1, False, True)

    def teardown(self) -> None:
        """Read the passes left unfinished on to EOF (each is still one pass), close
        what the example holds and remove its array."""
        problems = []
        for listing in self.listings:
            os.close(listing.fd)
        for p in list(self.passes):
            try:
                self.read_pass(p, 0)
            except ModelViolation as e:
                problems.append(e)
        shutil.rmtree(self.source.array_dir(self.array), ignore_errors=True)
        if self.run.plain:
            shutil.rmtree(
                self.run.target / self.source.array_dir(self.array).name, ignore_errors=True
            )
        if problems:
            raise problems[0]

    # -- observations -------------------------------------------------------------------
    def paths(self, array: str, index: int) -> list[str]:
        """The chunk file `index` names, or (ALL) the example's usual ones (HOT) and
        every other it named before (as a reader goes back to the files it used)."""
        if index != ALL:
            return [self.path(array, index)]
        hot = [self.source.chunk_path(array, i) for i in HOT[array]]
        return hot + [p for p in self.named if p not in hot]

    @rule(index=INDEX, forced=st.booleans())
    @step
    def stat(self, index: int, forced: bool) -> None:
        """Lookups (os.stat: the kernel asks unless it holds the entry) or forced
        getattrs of chunk files; then, as a checksum tool does, the md5 attribute (a
        request by node id that the front passes on)."""
        array = self.array
        what = "forced getattr" if forced else "stat"
        for path in self.paths(array, index):
            try:
                size = statx_size(self.run.target / path, forced)
            except OSError as e:
                self.error(path, e, what)
                continue
            self.note(f"{what} {path}: {size} B")
            sizes = sorted({len(b) for _, b in self.source.versions(path)})
            if size not in sizes:
                self.fail("stat", f"{what} {path} gave {size} B; its versions had {sizes}")
            if not self.run.plain:
                self.md5(path)

    def md5(self, path: str) -> None:
        """getxattr user.md5: one version's, EIO, or ENOENT where the file was missing."""
        try:
            digest = os.getxattr(self.run.target / path, "user.md5").decode()
        except OSError as e:
            return self.error(path, e, "getxattr")
        self.note(f"getxattr {path}: {digest[:8]}")
        if digest not in {hashlib.md5(b).hexdigest() for _, b in self.source.versions(path)}:
            self.fail("xattr", f"user.md5 of {path} is {digest}: no version's")
        return None

    def directory(self, array: str, expired: bool) -> Path:
        """The chunk directory; `expired`: a forced getattr of it first, as when its
        attributes expire (the kernel drops its cached listing if the mtime is new)."""
        directory = self.run.target / self.source.array_dir(array).name / "c"
        if expired:
            with contextlib.suppress(OSError):
                statx_size(directory, True)
        return directory

    def read_listed(self, array: str, names: list[str]) -> None:
        """Read the files of the example's (`paths(ALL)`) that a listing named."""
        listed = set(names)
        for path in self.paths(array, ALL):
            if path.rsplit("/", 1)[1] in listed:
                self.read_path(path)

    @precondition(lambda self: len(self.listings) < 2)
    @rule(expired=st.booleans(), calls=CALLS, then_read=st.booleans(), parent=st.booleans())
    @step
    def list_start(self, expired: bool, calls: int, then_read: bool, parent: bool) -> None:
        """Open the chunk directory (at most two at once) and pull `calls` getdents64
        buffers of names (0: all, a whole listing); see `list_more`. `parent`: the array's
        directory listed first (where it shows the chunk directory to the kernel, the
        native front is given the chunk directory's listing ahead of its read)."""
        array = self.array
        if parent:
            above = self.run.target / self.source.array_dir(array).name
            try:
                self.note(f"listed {array}: {sorted(os.listdir(above))}")
            except OSError as e:
                return self.error(array, e, "listing")
        try:
            fd = os.open(self.directory(array, expired), os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            return self.error(f"{array}/c", e, "opendir")
        listing = Listing(array, fd, self.source.state)
        self.listings.append(listing)
        self.note(f"listing of {array}/c started{' (expired)' if expired else ''}")
        self.list_calls(listing, calls, then_read)

    @precondition(lambda self: self.listings)
    @rule(which=st.integers(0, 1), calls=CALLS, then_read=st.booleans())
    @step
    def list_more(self, which: int, calls: int, then_read: bool) -> None:
        """Continue a listing by `calls` getdents64 calls (0: to its end); if it ends,
        read the named files it listed (`then_read`)."""
        self.list_calls(self.listings[which % len(self.listings)], calls, then_read)

    def list_calls(self, listing: Listing, calls: int, then_read: bool) -> None:
        done = 0
        while not calls or done < calls:
            try:
                names = getdents(listing.fd)
            except OSError as e:
                os.close(listing.fd)
                self.listings.remove(listing)
                return self.error(f"{listing.array}/c", e, "listing")
            listing.calls += 1
            done += 1
            if names is None:
                os.close(listing.fd)
                self.listings.remove(listing)
                self.note(
                    f"listing of {listing.array}/c (started at state {listing.started}) "
                    f"ended: {len(listing.names)} names"
                )
                self.check_names(listing.array, listing.names, "a listing read in parts")
                if then_read:
                    self.read_listed(listing.array, listing.names)
                return
            listing.names += names
        self.note(f"listing of {listing.array}/c: {len(listing.names)} names so far")

    def open_path(self, path: str) -> Pass | None:
        """Open a chunk file for a pass, read-ahead off (each read() is one request of
        its own, so a pass over a big file takes several)."""
        try:
            fd = os.open(self.run.target / path, os.O_RDONLY)
        except OSError as e:
            self.error(path, e, "open")
            return None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        p = Pass(path, fd, self.source.state)
        self.passes.append(p)
        return p

    @precondition(lambda self: len(self.passes) < 4)
    @rule(index=st.integers(0, 1023))
    @step
    def open_file(self, index: int) -> None:
        """Open a chunk file and hold the descriptor (at most four at once)."""
        if self.open_path(self.path(self.array, index)):
            self.note(f"opened {self.path(self.array, index)} (held)")

    @precondition(lambda self: self.passes)
    @rule(which=st.integers(0, 3), size=st.sampled_from([4096, 1 << 20, 0]))
    @step
    def read(self, which: int, size: int) -> None:
        """One read() of a held descriptor (0: read on to EOF); EOF ends its pass."""
        p = self.passes[which % len(self.passes)]
        self.read_pass(p, size)
        if p in self.passes:
            self.note(f"read {p.path}: {len(p.data)} B so far")

    def read_path(self, path: str) -> None:
        p = self.open_path(path)
        if p is not None:
            self.read_pass(p, 0)

    @rule(index=INDEX)
    @step
    def read_files(self, index: int) -> None:
        """Open, read to EOF, close: a chunk file, or every one the steps name."""
        array = self.array
        for path in self.paths(array, index):
            self.read_path(path)

    @rule(what=st.sampled_from(["1", "2", "3"]), then_stat=st.booleans())
    @step
    def drop_caches(self, what: str, then_stat: bool) -> None:
        """The kernel drops pages (1), dentries and inodes (2: FORGETs of what no
        descriptor or directory held open keeps), or both, as under memory pressure;
        `then_stat`: the readers come back at once, to every file the steps name."""
        try:
            Path("/proc/sys/vm/drop_caches").write_text(what)
        except OSError as e:  # (not root)
            self.note(f"drop_caches: {e}")
            return
        self.note(f"dropped caches ({what})")
        if then_stat:
            self.stat(ALL, False)

    @precondition(lambda self: not self.run.plain and not self.waited)
    @rule()
    @step
    def wait(self) -> None:
        """Wait past the kernel's timeout: its entries and attributes expire (once an
        example: it costs seconds)."""
        self.waited = True
        time.sleep(TIMEOUT + 0.1)
        self.note(f"waited {TIMEOUT + 0.1} s")

    # -- changes of the source ----------------------------------------------------------
    @rule(shard=st.integers(0, 3), how=st.sampled_from(HOWS))
    @step
    def change_shard(self, shard: int, how: str) -> None:
        """A writer changes one shard: zarr-python replaces it ('replace': random values
        make chunks grow, constant ones shrink), or it is appended to in place, rewritten
        in place at the same size (mtime put back; then, or not, replaced), compacted
        (renamed over) or removed."""
        array = self.array
        source = self.source
        self.tick()
        verb, _, arg = how.partition(" ")
        if verb == "replace":
            said = source.replace_shard(array, shard, arg)
        elif verb == "append":
            said = source.append_to_shard(array, shard, "all" if arg == "const" else "last", arg)
        elif verb == "in-place":
            said = source.rewrite_in_place(array, shard, then_replace=arg == "then-replace")
        elif verb == "compact":
            said = source.compact_shard(array, shard)
        else:
            said = source.unlink_shard(array, shard)
        self.change(array, said)

    @precondition(lambda self: self.run.other is not None)
    @rule(index=st.integers(0, 1023), style=st.sampled_from(["random", "const"]))
    @step
    def write_other_mount(self, index: int, style: str) -> None:
        """A chunk file written through another shardfs mount, read-write, of the same
        source, and fsynced: its commit appends the chunk and a new index to the shard."""
        assert self.run.other is not None
        array = self.array
        layout = self.source.layouts[array]
        path = self.path(array, index)
        chunk = encode(layout, values(self.source.rng(), style, layout.chunk, layout.dtype))
        self.tick()
        try:
            fd = os.open(self.run.other / path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:  # (a file the grid no longer has)
            self.note(f"write {path} through the rw mount: {e.strerror}")
        self.change(array, f"{path} written through the rw mount ({style})")

    @rule(
        grid=st.sampled_from(["double", "half", "same"]),
        dtype=st.sampled_from(["int32", "float64", "int16"]),
    )
    @step
    def recreate_array(self, grid: str, dtype: str) -> None:
        """zarr-python overwrites the array with another chunk shape and/or data type
        (random values: chunks grow)."""
        array = self.array
        self.tick()
        self.change(array, self.source.recreate(array, grid, dtype, "random"))


# -- the searches ------------------------------------------------------------------------


def stats(mountpoint: Path) -> dict:
    """The figures of `shardfs stats --json` of a mount."""
    done = subprocess.run(
        [sys.executable, "-m", "shardfs", "stats", str(mountpoint), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def leaves(e: BaseException) -> list[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in leaves(sub)]
    return [e]


def search(run: Run) -> list[tuple[str, str]]:
    """Searches until the deadline: each failure kind found is reported with its shrunk
    steps, then only noted. A search that found a new kind is run again with the same
    seed (the same examples: it goes on past those kinds, as Hypothesis stops looking
    soon after a first failure); one that found none moves to the next seed (random
    seeds in a soak)."""
    findings: list[tuple[str, str]] = []
    attempt = 0
    first = time.monotonic()
    while time.monotonic() < run.deadline:
        factory: Callable[[], KernelModel] = lambda: KernelModel(run)  # noqa: E731
        if not SOAK:
            factory = seed(run.seed + attempt)(factory)
        config = settings(
            max_examples=examples_that_fit(run, first),
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )
        # Hypothesis stops shrinking after this many seconds (documented as patchable).
        engine.MAX_SHRINKING_SECONDS = max(1, min(SHRINK, int(run.deadline - time.monotonic())))
        new = False
        try:
            run_state_machine_as_test(factory, settings=config)
        except Exception as e:  # every failure is reported; a flaky one too
            for leaf in leaves(e):
                kind = getattr(leaf, "kind", f"error {type(leaf).__name__}")
                notes = "\n".join(getattr(leaf, "__notes__", []))
                if kind not in {k for k, _ in findings}:
                    findings.append((kind, f"{leaf}\n{notes}"))
                    new = True
                if isinstance(leaf, ModelViolation):
                    run.known.add(kind)
        if not new:
            attempt += 1
    return findings


def examples_that_fit(run: Run, first: float) -> int:
    """Examples for the next search: `run.per_search`, or fewer where that many would run
    past the deadline at the pace of the examples since `first` (a search started near
    the deadline would otherwise take the whole of one more search)."""
    now = time.monotonic()
    if not run.examples:
        return run.per_search
    pace = (now - first) / run.examples
    return max(1, min(run.per_search, math.ceil((run.deadline - now) / pace)))


def make_templates(directory: Path) -> None:
    """zarr-python writes each example's arrays once (examples copy them)."""
    source = Source(directory, directory / "scratch", "t")
    for name, layout in LAYOUTS.items():
        source.create(name, layout, "ramp")


def report(run: Run, findings: list[tuple[str, str]], started: float) -> str:
    """The counts, then each kind found with its shrunk steps; then each kind seen in an
    example whose search did not report it (seen while another failure was shrunk):
    its first sighting's step log, not shrunk."""
    unshrunk = [k for k in run.first_seen if k not in {k for k, _ in findings}]
    lines = [
        f"{run.examples} examples, {run.steps} steps, {run.passes} passes judged, "
        f"{run.eio} EIO, in {time.monotonic() - started:.0f} s; kinds found: "
        f"{[k for k, _ in findings]}; seen, not shrunk: {unshrunk}; first seen: "
        f"{run.first_seen}; noted again later: {dict(run.noted)}"
    ]
    for kind, text in findings:
        lines += ["", "=" * 80, f"{kind}: {KINDS.get(kind, '')}", text]
    for kind in unshrunk:
        lines += ["", "=" * 80, f"{kind} (seen, not shrunk): {KINDS.get(kind, '')}"]
        lines.append(run.first_message[kind])
    return "\n".join(lines)


@pytest.mark.fuse
@pytest.mark.alone  # it drops the kernel's caches
@pytest.mark.skipif(not INODE_AS_FH, reason="this pyfuse3 lacks the patch in patches/")
@pytest.mark.parametrize("front", ["yes", "no"])
def test_model_kernel_served(tmp_path: Path, mount: Callable[..., Mounted], front: str) -> None:
    """Random interleavings of reads, listings and source changes on a kernel-served
    mount: every pass gives one version, whole, or EIO; with the native front answering
    what it can, and without it (a shorter search: the front's rows are what is new)."""
    budget = SOAK or (BUDGET if front == "yes" else WITHOUT_FRONT_BUDGET)
    search_kernel_served(tmp_path, mount, front, budget)


@pytest.mark.fuse
@pytest.mark.alone
@pytest.mark.stress
@pytest.mark.skipif(not INODE_AS_FH, reason="this pyfuse3 lacks the patch in patches/")
@pytest.mark.parametrize("front", ["yes", "no"])
def test_model_kernel_served_long(
    tmp_path: Path, mount: Callable[..., Mounted], front: str
) -> None:
    """The same search for STRESS_BUDGET seconds, from the seeds after those the fast
    tier searches (the stress tier: `scripts/check --stress`)."""
    search_kernel_served(tmp_path, mount, front, SOAK or STRESS_BUDGET, first_seed=SEED + 100)


def search_kernel_served(
    tmp_path: Path,
    mount: Callable[..., Mounted],
    front: str,
    budget: float,
    first_seed: int = SEED,
) -> None:
    if front == "yes" and unavailable() is not None:
        pytest.skip(f"the native front cannot run here: {unavailable()}")
    started = time.monotonic()
    source = tmp_path / "src"
    zarr.create_group(source)
    make_templates(tmp_path / "templates")
    mounted = mount(source, "ro", f"cache_timeout={TIMEOUT:g}", f"front={front}")
    other = mount(source)  # read-write: its commits append to shards
    run = Run(
        source, mounted.path, tmp_path / "templates", False, started + budget, seed=first_seed
    )
    run.other = other.path
    findings = search(run)
    summary = report(run, findings, started)
    print(summary)
    for daemon in (mounted, other):
        assert daemon.process.poll() is None, daemon.log()
        assert "Traceback" not in daemon.log(), daemon.log()
    assert not findings and not run.first_seen, summary
    answered = stats(mounted.path)["fuse"].get("front", {}).get("answered", {})
    if front == "yes":  # the search went through the front, not around it
        assert answered.get("lookup", 0) > 0 and answered.get("read", 0) > 0, answered
    else:
        assert not answered, answered


def test_model_plain_directory(tmp_path: Path) -> None:
    """The same machine where the 'mount' is a plain directory holding each boundary's
    chunk files (renamed over): it must pass, or the model itself is wrong. (The copy is
    on tmpfs where there is one: it writes every chunk file of every example.)"""
    started = time.monotonic()
    source = tmp_path / "src"
    zarr.create_group(source)
    make_templates(tmp_path / "templates")
    shm = Path("/dev/shm")
    target = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else tmp_path))
    try:
        run = Run(
            source, target, tmp_path / "templates", True, started + PLAIN_BUDGET, PLAIN_EXAMPLES
        )
        findings = search(run)
    finally:
        shutil.rmtree(target, ignore_errors=True)
    summary = report(run, findings, started)
    print(summary)
    assert not findings and not run.first_seen, summary
