"""Run one mount: init pyfuse3, serve until unmounted or signalled, clean up.

pyfuse3 keeps global state, so there is one mount per process. However the
mount ends (SIGTERM, SIGINT, `umount`, `fusermount3 -u`, `shardfs umount`),
a read-write daemon commits what it still buffers before it exits, and keeps
what it cannot commit on disk for the next mount (`shardfs.writeback.leftover`);
then it removes what it kept in the source for writing (`Storage.tidy`).
Under systemd it reports readiness and shutdown through sd_notify.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyfuse3
import trio

from shardfs.fuse import control
from shardfs.fuse.adapter import MountConfig, Operations
from shardfs.fuse.mounts import DaemonLock, mount_type
from shardfs.fuse.notify import notify
from shardfs.primitives.errors import ShardfsError
from shardfs.primitives.private import UnsafeState
from shardfs.view.interface import ViewInterface
from shardfs.view.shown import TIDY_EVERY, KernelVersions
from shardfs.writeback import Workspace
from shardfs.writeback.leftover import Leftovers
from shardfs.writeback.overlay import ShardRef

if TYPE_CHECKING:
    from shardfs.fuse.metrics import MetricsServer

log = logging.getLogger("shardfs")


#: How often the committer looks for shards that are due.
TICK = 0.25


async def _commit_loop(workspace: Workspace, interval: float) -> None:
    """Commit shards whose oldest change is `interval` seconds old, or everything once
    the write buffer is filling up. (Kept chunks of earlier mounts follow every commit by
    themselves: `Leftovers` observes the committer.)"""
    pressure, committer = workspace.buffer.pressure, workspace.committer
    while True:
        await trio.sleep(min(TICK, interval))
        age = 0.0 if pressure.is_set() else interval
        pressure.clear()
        if committer.due(age):
            await trio.to_thread.run_sync(committer.commit_due, age)


async def _let_go(versions: KernelVersions) -> None:
    """Let go the versions a kernel-served mount keeps once the kernel no longer holds
    their shows, on a timer: an idle mount would otherwise hold a removed file's space
    until its next lookup. In a worker thread: closing the last descriptor of a big
    removed file frees its blocks."""
    while True:
        await trio.sleep(TIDY_EVERY)
        await trio.to_thread.run_sync(versions.tidy)


async def _log_stats(operations: Operations, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        stats = await trio.to_thread.run_sync(operations.stats)
        log.info("stats: %s", control.summary(stats))


#: Seconds the daemon waits at the end for prefetches in flight (see `SourceView.settle`).
SETTLE = 5.0


def serve(
    view: ViewInterface,
    mountpoint: str,
    config: MountConfig,
    fuse_options: set[str],
    on_ready: Callable[[], None] | None = None,
    flush_interval: float = 5.0,
    leftovers: Leftovers | None = None,
    stats_interval: float = 0.0,
    metrics: tuple[str, int] | None = None,
) -> str:
    """Mount `view` at `mountpoint` and serve it until it is unmounted.

    `on_ready` is called once the mount answers requests (a stat of the
    mountpoint went through the kernel to this process and back); systemd is
    told then too. SIGTERM and SIGINT unmount cleanly. A workspace commits
    every `flush_interval` seconds and, after the unmount, everything still
    buffered; what fails is kept in `leftovers`. The figures of `shardfs stats`
    are served on the control socket, and logged every `stats_interval` seconds
    if that is not 0; and as Prometheus metrics at `metrics` (host, port) if given, from
    before the mount to the unmount. Returns "" if all went well,
    else what could not be committed. Raises RuntimeError if the kernel refuses
    the mount, ShardfsError if the metrics' address cannot be listened on.
    """
    if metrics is not None:  # first: the front and the kept versions share what is left
        from shardfs.fuse.metrics import DESCRIPTORS

        view.storage.reserve_descriptors(DESCRIPTORS)
    operations = Operations(view, config)
    lock = DaemonLock(mountpoint)
    # Named before the mount: naming it resolves the mountpoint, which would then ask us.
    control_path = control.socket_path(mountpoint)
    server: MetricsServer | None = None
    try:
        if metrics is not None:  # before the mount: a port taken is no mount
            server = _serve_metrics(operations, metrics)
        pyfuse3.init(operations, mountpoint, fuse_options)
    except BaseException:
        if server is not None:
            server.stop()
        lock.release("the mount failed")
        raise
    serving = operations.serving
    if serving is not None:
        serving.start_front()
    if serving is not None and serving.front_off is not None and config.front:
        # Not built, or could not start: a warning; a source it cannot serve: as designed.
        local = operations.view.storage.stat_path("") is not None
        (log.warning if local else log.info)("the native front is off: %s", serving.front_off)
    signalled = False

    async def main() -> None:
        nonlocal signalled
        async with trio.open_nursery() as nursery:

            async def fuse_loop() -> None:
                await pyfuse3.main(min_tasks=2, max_tasks=max(2, config.workers))
                nursery.cancel_scope.cancel()

            async def report_ready() -> None:
                await trio.to_thread.run_sync(os.stat, mountpoint)
                log.info("mounted %s", mountpoint)
                notify("READY=1", f"STATUS=serving {mountpoint}")
                if on_ready is not None:
                    on_ready()

            async def watch_signals() -> None:
                nonlocal signalled
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        log.info("%s received, unmounting", signal.Signals(signum).name)
                        signalled = True
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(fuse_loop)
            nursery.start_soon(report_ready)
            nursery.start_soon(watch_signals)
            nursery.start_soon(control.serve, control_path, operations.stats)
            if serving is not None:
                nursery.start_soon(_let_go, serving.versions)
                if serving.front is not None:
                    nursery.start_soon(serving.work_ahead)
            if stats_interval:
                nursery.start_soon(_log_stats, operations, stats_interval)
            if isinstance(view, Workspace):
                nursery.start_soon(_commit_loop, view, flush_interval)

    outcome = "the daemon failed"
    try:
        # What was made to start up lives as long as the daemon: keep the cyclic garbage
        # collector from walking it again and again while listings allocate.
        gc.freeze()
        trio.run(main)
        outcome = ""
    finally:
        _hold_signals()
        notify("STOPPING=1", f"STATUS=unmounting {mountpoint}")
        try:
            # After a kernel-side unmount the session is already detached; after a
            # signal (or a crash of the loop) we must unmount ourselves.
            pyfuse3.close(unmount=signalled or mount_type(mountpoint) is not None)
            log.info("unmounted %s", mountpoint)
            if server is not None:
                server.stop()
            if serving is not None and serving.front is not None:
                serving.front.stop()
            view.settle(SETTLE)
            if serving is not None:
                serving.versions.close()
            if isinstance(view, Workspace):
                notify("STATUS=committing what is still buffered")
                try:
                    outcome = _final_commit(view, leftovers) or outcome
                except Exception:
                    log.exception("the final commit failed")
                    outcome = "the final commit failed"
                _tidy(view)
        finally:
            lock.release(outcome)
    return outcome


def _serve_metrics(operations: Operations, address: tuple[str, int]) -> MetricsServer:
    """Serve the figures of `operations` as Prometheus metrics, timing its requests
    meanwhile (imported here: only mounts with metrics pay for prometheus_client)."""
    from shardfs.fuse.metrics import Latency, MetricsServer

    latency = Latency()
    server = MetricsServer(address, operations.stats, latency)
    operations.latency = latency
    return server


def _hold_signals() -> None:
    """From the unmount on, SIGTERM and SIGINT must not cut the final commit short: they
    are logged and otherwise ignored (SIGKILL still ends the daemon)."""

    def held(signum: int, _frame: object) -> None:
        log.warning(
            "%s received while unmounting: committing buffered chunks first",
            signal.Signals(signum).name,
        )

    signal.signal(signal.SIGTERM, held)
    signal.signal(signal.SIGINT, held)


def _final_commit(workspace: Workspace, leftovers: Leftovers | None) -> str:
    """Commit what is still buffered (kept chunks of earlier mounts that this commits leave
    their files as it goes); keep what fails in `leftovers`, naming each shard in the log.
    Returns "" or what went wrong."""
    workspace.sync()
    failed = [ref for ref, _ in workspace.overlay.dirty_shards()]
    kept: list[ShardRef] = []
    if leftovers is not None:
        try:
            kept = leftovers.save(workspace)
        except (OSError, UnsafeState) as e:
            log.error("cannot keep uncommitted chunks in %s: %s", leftovers.directory, e)
    workspace.buffer.close()
    if not failed:
        committer = workspace.committer
        log.info(
            "all buffered chunks committed (this mount: %d shard appends, %d whole writes)",
            committer.appends,
            committer.rewrites,
        )
        return ""
    lost = [_describe(workspace, ref) for ref in failed if ref not in kept]
    if kept:
        assert leftovers is not None
        log.error(
            "could not commit %s at unmount: %s; their chunks are kept in %s and committed "
            "by the next read-write mount of this source",
            _shards(len(kept)),
            ", ".join(_describe(workspace, ref) for ref in kept),
            leftovers.directory,
        )
    if lost:
        log.error(
            "could not commit %s at unmount, and their chunks are lost: %s",
            _shards(len(lost)),
            ", ".join(lost),
        )
    return f"could not commit {_shards(len(failed))}" + (
        f"; kept in {leftovers.directory}" if kept and leftovers is not None else ""
    )


def _tidy(workspace: Workspace) -> None:
    """Leave the source without a trace of shardfs (a local source's `.shardfs/`), unless
    something in it is left for the next mount's recovery or another writer is at work:
    the storage removes only what nobody uses, so this is safe whatever the final commit
    did (no commit of ours runs any more). A failure only costs that trace: logged."""
    try:
        workspace.storage.tidy()
    except (ShardfsError, OSError) as e:
        log.warning("could not remove the private area of the source: %s", e)


def _shards(count: int) -> str:
    return f"{count} shard" + ("" if count == 1 else "s")


def _describe(workspace: Workspace, ref: ShardRef) -> str:
    """The name of a shard for a log line: its file or object, if its array's metadata
    can still be read."""
    try:
        array = workspace.ns.presentation.array_at(ref[0])
    except ShardfsError:
        array = None
    if array is None:
        return f"shard {list(ref[1])} of {ref[0] or '/'}"
    return workspace.storage.describe(workspace.ns.shards.key(array, ref[1]))
