"""Run one mount: init pyfuse3, serve until unmounted or signalled, clean up.

pyfuse3 keeps global state, so there is one mount per process.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

import pyfuse3
import trio

from shardfs.fuse.adapter import MountConfig, Operations
from shardfs.fuse.mounts import mount_type
from shardfs.view import Namespace
from shardfs.view.precomputed import PrecomputedNamespace
from shardfs.writeback import Workspace

log = logging.getLogger("shardfs")


#: How often the committer looks for shards that are due.
TICK = 0.25


async def _commit_loop(workspace: Workspace, interval: float) -> None:
    """Commit shards whose oldest change is `interval` seconds old, or everything once
    the write buffer is filling up."""
    pressure, committer = workspace.buffer.pressure, workspace.committer
    while True:
        await trio.sleep(min(TICK, interval))
        age = 0.0 if pressure.is_set() else interval
        pressure.clear()
        if committer.due(age):
            await trio.to_thread.run_sync(committer.commit_due, age)


def serve(
    view: Namespace | Workspace | PrecomputedNamespace,
    mountpoint: str,
    config: MountConfig,
    fuse_options: set[str],
    on_ready: Callable[[], None] | None = None,
    flush_interval: float = 5.0,
) -> None:
    """Mount `view` at `mountpoint` and serve it until it is unmounted.

    `on_ready` is called once the mount answers requests (a stat of the
    mountpoint went through the kernel to this process and back). SIGTERM and
    SIGINT unmount cleanly. A workspace commits every `flush_interval` seconds
    and, after the unmount, everything still buffered. Raises RuntimeError if
    the kernel refuses the mount.
    """
    operations = Operations(view, config)
    pyfuse3.init(operations, mountpoint, fuse_options)
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
            if isinstance(view, Workspace):
                nursery.start_soon(_commit_loop, view, flush_interval)

    try:
        trio.run(main)
    finally:
        # After a kernel-side unmount the session is already detached; after a
        # signal (or a crash of the loop) we must unmount ourselves.
        pyfuse3.close(unmount=signalled or mount_type(mountpoint) is not None)
        log.info("unmounted %s", mountpoint)
        if isinstance(view, Workspace):
            _final_commit(view)


def _final_commit(workspace: Workspace) -> None:
    """Commit what is still buffered; what cannot be committed is named in the log."""
    failed = workspace.sync()
    if failed:
        log.error(
            "%d shards could not be committed at unmount; their buffered chunks are lost", failed
        )
    else:
        committer = workspace.committer
        log.info(
            "all buffered chunks committed (this mount: %d shard appends, %d whole writes)",
            committer.appends,
            committer.rewrites,
        )
    workspace.buffer.close()
