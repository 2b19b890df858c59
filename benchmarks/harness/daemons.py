"""The daemons a benchmark starts and stops: shardfs mounts (in the foreground as our
child, or detached as a user runs them) and floors, always tracked, always unmounted.

Every start happens inside `Interrupts.deferred()`, so a SIGINT or SIGTERM never lands
between a daemon's start and its being recorded; every `stop` unmounts (lazily if busy),
waits for the daemon to exit, and kills it, by its PID, only if it does not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from benchmarks.harness.caches import drop_caches
from benchmarks.harness.machine import ROOT
from benchmarks.harness.runs import Interrupts
from shardfs.fuse.mounts import lock_path, mount_type, open_lock, unmount, wait_for_daemon
from tests.conftest import Mounted, stop_mount, wait_mounted

SHARDFS = [sys.executable, "-m", "shardfs"]


def _below(name: str) -> property:
    return property(lambda self: self.data / name, doc=f"DATA/{name}")


@dataclass
class DataDir:
    """A benchmark's data directory: the sharded source, its plain copy, a mountpoint, the
    daemon's log, and a marker of the parameters the data was made with, so that a data
    set is reused only by a run that would make the same one."""

    data: Path
    source = _below("sharded.zarr")
    plain = _below("plain.zarr")
    mountpoint = _below("mnt")
    log = _below("mount.log")
    marker = _below("dataset.json")

    @property
    def params(self) -> dict[str, object]:
        raise NotImplementedError

    def ready(self) -> bool:
        try:
            return json.loads(self.marker.read_text()) == self.params
        except (OSError, ValueError):
            return False

    def clear(self) -> None:
        """Unmark the data and remove the source and the plain copy, to make them again."""
        self.marker.unlink(missing_ok=True)
        for path in (self.source, self.plain):
            shutil.rmtree(path, ignore_errors=True)

    def made(self) -> None:
        """Mark the data as made with `params`."""
        self.marker.write_text(json.dumps(self.params))


def layout(grid: object, chunk: int, shard: int, generator: int, writer: str) -> dict[str, object]:
    """A data set's parameters: its chunk grid, chunk and shard edges, the version of its
    generator and of the library (`writer`) that wrote it."""
    params = {"grid": grid, "chunk": chunk, "shard": shard, "generator": generator}
    return params | {writer: version(writer)}


def start_shardfs(
    source: Path | str,
    mountpoint: Path,
    log: Path,
    *options: str,
    command: Sequence[str] = SHARDFS,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 30,
) -> Mounted:
    """`COMMAND mount SOURCE MOUNTPOINT -f -o OPTIONS` as our child, once it answers;
    `command` may be another program with shardfs's command line (a counting wrapper, or
    the package of another tree with `env` and `cwd`)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    args = [*command, "mount", str(source), str(mountpoint), "-f"]
    if options:
        args += ["-o", ",".join(options)]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env, cwd=cwd
        )
    return wait_mounted(Mounted(mountpoint, process, log, tuple(options)), timeout=timeout)


class MountManager:
    """At most one `shardfs mount -f -o ro` child of a data set at a time, always
    unmounted by `stop`; with `cold`, each fresh one starts on empty caches."""

    def __init__(self, dataset: DataDir, interrupts: Interrupts, cold: bool = False) -> None:
        self.dataset = dataset
        self.interrupts = interrupts
        self.cold = cold
        self.current: Mounted | None = None

    def fresh(self, *options: str, **how: object) -> Mounted:
        """A new daemon (the old one unmounted first; with `cold`, the caches dropped),
        `-o ro` and `options`; `how` goes to `start_shardfs`."""
        self.stop()
        if self.cold:
            drop_caches()
        with self.interrupts.deferred():  # a daemon must never start without being recorded
            self.current = start_shardfs(
                self.dataset.source,
                self.dataset.mountpoint,
                self.dataset.log,
                "ro",
                *options,
                **how,  # type: ignore[arg-type]
            )
        return self.current

    def stop(self) -> None:
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            if self.current is not None:
                stop_mount(self.current)
                self.current = None


class WriteMounts:
    """At most one read-write `shardfs mount -f` child at a time; `stop` waits for it to
    commit what it buffers and exit, and fails if it did not do so cleanly."""

    #: How long the daemon may take to commit what it buffers after the unmount.
    EXIT_TIMEOUT = 600.0

    def __init__(self, mountpoint: Path, log: Path, options: list[str], interrupts: Interrupts):
        self.mountpoint = mountpoint
        self.log = log
        self.options = options
        self.interrupts = interrupts
        self.current: Mounted | None = None

    def start(self, source: Path, *extra: str, command: Sequence[str] = SHARDFS) -> Mounted:
        """A daemon for `source`, with `extra` options after the run's."""
        self.stop()
        with self.interrupts.deferred():  # a daemon must never start without being recorded
            self.current = start_shardfs(
                source, self.mountpoint, self.log, *self.options, *extra, command=command
            )
        return self.current

    def stop(self) -> None:
        """`fusermount3 -u` (lazily if that fails), then wait for the daemon to commit and
        exit; it is killed, by its PID, only if it does not exit in EXIT_TIMEOUT."""
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            mounted, self.current = self.current, None
            if mounted is None:
                return
            path = str(mounted.path)
            problem = None
            if mount_type(path) == "fuse.shardfs":
                result = unmount(path)
                if result.returncode != 0:
                    problem = f"fusermount3 -u failed: {result.stderr.strip()}; unmounted lazily"
                    unmount(path, lazy=True)
            try:
                mounted.process.wait(timeout=self.EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                mounted.process.kill()
                mounted.process.wait(timeout=30)
                problem = f"the daemon did not exit in {self.EXIT_TIMEOUT:.0f} s; killed"
            if mount_type(path) == "fuse.shardfs":
                unmount(path, lazy=True)
            if problem is None and mounted.process.returncode != 0:
                problem = f"the daemon exited with status {mounted.process.returncode}"
            if problem is not None:
                raise RuntimeError(f"{problem} (see {self.log})")


class DetachedMount:
    """At most one detached `shardfs mount -o ro` daemon at a time, as a user starts it;
    its PID comes from its lock file, so it is the only process this ever kills (and
    only if it does not exit after the unmount)."""

    def __init__(
        self, dataset: DataDir, interrupts: Interrupts, options: tuple[str, ...] = ()
    ) -> None:
        self.dataset = dataset
        self.interrupts = interrupts
        #: mount options beyond `ro` and the log
        self.options = options
        self.pid: int | None = None

    def start(self) -> float:
        """Mount; the seconds from starting `shardfs mount` until the root answers."""
        self.stop()
        mountpoint = self.dataset.mountpoint
        mountpoint.mkdir(exist_ok=True)
        command = [*SHARDFS, "mount", str(self.dataset.source), str(mountpoint)]
        command += ["-o", ",".join(["ro", f"log={self.dataset.log}", *self.options])]
        with self.interrupts.deferred():  # a daemon must never start without being recorded
            started = time.perf_counter()
            # Its own session: a Ctrl-C reaches this script only, which then unmounts.
            done = subprocess.run(command, capture_output=True, text=True, start_new_session=True)
            if done.returncode == 0:
                os.stat(mountpoint)
            elapsed = time.perf_counter() - started
            if mount_type(str(mountpoint)) == "fuse.shardfs":
                with open(lock_path(str(mountpoint))) as f:
                    self.pid = int(json.load(f)["pid"])
        if done.returncode != 0:
            raise RuntimeError(f"shardfs mount failed: {done.stderr.strip()}")
        return elapsed

    def stop(self) -> None:
        """Unmount (lazily if busy) and wait until the daemon has exited."""
        path = str(self.dataset.mountpoint)
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            if mount_type(path) == "fuse.shardfs":
                lock = open_lock(path)  # before the unmount: the daemon removes it as it exits
                if unmount(path).returncode != 0:
                    unmount(path, lazy=True)
                if lock is not None and wait_for_daemon(lock, timeout=30) is None:
                    if self.pid is not None:
                        os.kill(self.pid, signal.SIGKILL)
                    if wait_for_daemon(lock, timeout=30) is None:
                        raise RuntimeError(f"the daemon of {path} (PID {self.pid}) does not exit")
            self.pid = None


class Child:
    """At most one daemon at a time serving `mountpoint` in the foreground as our child (a
    floor, or `shardfs mount -f`), in its own session so that a Ctrl-C reaches the
    benchmark only, which then unmounts. Usable as a context manager (`with
    Child(...).started(command)`)."""

    def __init__(
        self, interrupts: Interrupts, mountpoint: Path, log: Path, fstype: str = "fuse.floor"
    ) -> None:
        self.interrupts = interrupts
        self.mountpoint = mountpoint
        self.log = log
        self.fstype = fstype
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, command: Sequence[str], env: dict[str, str] | None = None) -> float:
        """Start `command`; the seconds until its mount's root answers."""
        self.stop()
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with self.interrupts.deferred(), open(self.log, "wb") as out:  # never untracked
            started = time.perf_counter()
            self.process = subprocess.Popen(
                list(command),
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=ROOT,  # `python -m benchmarks...` finds the package
            )
        deadline = time.monotonic() + 60
        while mount_type(str(self.mountpoint)) != self.fstype:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{command[2:4]} did not mount: {self.log.read_text(errors='replace')}"
                )
            time.sleep(0.005)
        os.stat(self.mountpoint)  # answered by the daemon
        return time.perf_counter() - started

    def started(self, command: Sequence[str]) -> Child:
        self.start(command)
        return self

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        with self.interrupts.deferred():  # an interrupted unmount would leave the daemon behind
            process, self.process = self.process, None
            if process is None:
                return
            path = str(self.mountpoint)
            if mount_type(path) == self.fstype and unmount(path).returncode != 0:
                unmount(path, lazy=True)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()  # our own child, by PID
                process.wait(timeout=30)
            if mount_type(path) == self.fstype:
                unmount(path, lazy=True)
