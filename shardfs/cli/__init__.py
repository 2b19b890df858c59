"""The `shardfs` command: `mount` and `umount`, maintenance, `info`.

`shardfs mount` without `-f` forks the daemon into its own session and exits
0 only once the mount answers; any failure is one line on stderr, a non-zero exit, and nothing left
mounted. `shardfs SOURCE MOUNTPOINT -o OPTS`, without a command, is a mount
too: that is how mount.fuse3 runs a file system for `mount -t fuse.shardfs`
and /etc/fstab.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import select
import signal
import stat as stat_mod
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from shardfs import __version__
from shardfs.cli import checksum, info, logs, manifest, stats
from shardfs.fuse.mounts import (
    is_stale,
    mount_type,
    open_lock,
    runtime_dir,
    unmount,
    wait_for_daemon,
)
from shardfs.maintenance import (
    DEFAULT_MIN_DEAD,
    DEFAULT_THRESHOLD,
    Policy,
    compact,
    fsck,
    progress_bar,
)
from shardfs.options import MountOptions, help_text, parse_options, parse_size
from shardfs.primitives.errors import ShardfsError, UsageError
from shardfs.primitives.private import UnsafeState, home_dir, own_directory
from shardfs.sources import (
    is_local,
    note_nothing_sharded,
    open_leftovers,
    open_source,
    open_view,
)
from shardfs.storage import LocalStorage, Storage
from shardfs.view.hierarchy import Hierarchy
from shardfs.view.precomputed import PrecomputedSource
from shardfs.view.wkw import WkwSource

log = logging.getLogger("shardfs")

#: How long `shardfs mount` waits for the daemon to answer before giving up.
READY_TIMEOUT = 60.0
#: After this many seconds `shardfs umount` says that it waits for the daemon to commit.
UMOUNT_NOTICE = 2.0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line starting `shardfs:`, as every other failure
    (docs/troubleshooting.md), with where the usage is, not the usage itself."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"shardfs: {message} (see: {self.prog} --help)\n")


def _parser() -> tuple[argparse.ArgumentParser, frozenset[str]]:
    """The parser, and the names of its commands (see `_implied_mount`). Its commands'
    parsers are of its class."""
    parser = _Parser(
        prog="shardfs", description="Show sharded Zarr arrays as plain, unsharded chunk files."
    )
    parser.add_argument("--version", action="version", version=f"shardfs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    mount = commands.add_parser(
        "mount",
        help="mount SOURCE at MOUNTPOINT (also without the word `mount`, as mount.fuse3 runs it)",
        description="Mount SOURCE at MOUNTPOINT: its sharded arrays appear unsharded.",
        epilog=help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mount.add_argument(
        "source",
        help=(
            "a local directory or s3://BUCKET/PREFIX holding a Zarr v3 hierarchy, a "
            "Neuroglancer precomputed volume or a WKW dataset"
        ),
    )
    mount.add_argument("mountpoint", help="an existing, empty directory (see nonempty)")
    mount.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPT[,OPT...]",
        help="mount options, comma-separated, repeatable: see the list below",
    )
    mount.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    umount = commands.add_parser(
        "umount",
        help="commit what MOUNTPOINT buffers, unmount it and wait until its daemon has exited",
    )
    umount.add_argument("mountpoint")
    check = commands.add_parser(
        "fsck",
        help="check the shards of SOURCE and report their dead space",
        description=(
            "Check every shard of the sharded arrays of SOURCE: its index has the right "
            "size and crc32c and points inside the shard. Appends that a crashed writer "
            "left torn are rolled back first (always safe; mounts may stay up). Prints per "
            "array the shards, live bytes and dead bytes (left behind by appends; "
            "`shardfs compact` frees them). Exit status: 0 no damage (or all repaired), "
            "1 damaged shards left, 2 usage error."
        ),
    )
    check.add_argument("source", help="a local directory holding a Zarr v3 hierarchy")
    check.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: report unfinished appends instead of rolling them back",
    )
    check.add_argument(
        "--settle",
        action="append",
        default=[],
        metavar="KEY",
        help=(
            "settle the unfinished append of KEY (a path below SOURCE) that fsck reports as "
            "possibly torn, taking the file there for the one appended to: a tail that "
            "verifies is kept, any other cut back (repeatable)"
        ),
    )
    rewrite = commands.add_parser(
        "compact",
        help="rewrite shards of SOURCE that are mostly dead space",
        description=(
            "Rewrite the shards of SOURCE whose dead space (old chunks and indexes that "
            "appends left behind) is over both limits, with only their live chunks, copied "
            "byte for byte. Safe while SOURCE is mounted, also read-write: a shard changed "
            "meanwhile is read again; files of moved chunks that a mount holds open then "
            "fail with EIO. Corrupt shards are reported and left as they are. Exit status: "
            "0 done, 1 corrupt or unreadable shards, 2 usage error."
        ),
    )
    rewrite.add_argument("source", help="a local directory holding a Zarr v3 hierarchy")
    rewrite.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        metavar="FRACTION",
        help=(
            "rewrite a shard when more than this fraction of it is dead, in [0, 1) (default "
            "%(default)s: a rewrite then copies at most as many bytes as it frees, and no "
            "shard stays over twice its live size)"
        ),
    )
    rewrite.add_argument(
        "--min-dead",
        default=f"{DEFAULT_MIN_DEAD >> 10}K",
        metavar="SIZE",
        help=(
            "... and at least SIZE bytes of it are dead, with an optional K/M/G suffix "
            "(default %(default)s: below that a rewrite costs more than it frees)"
        ),
    )
    checksum.add_parser(commands)
    info.add_parser(commands)
    manifest.add_parser(commands)
    stats.add_parser(commands)
    return parser, frozenset(commands.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 done; 2 a usage error (refused as given, before anything was done: a
    bad argument or option, a SOURCE that is missing or not one the command takes, a
    mountpoint or device that cannot be used), as argparse exits; 1 any other failure."""
    parser, names = _parser()
    argv = _implied_mount(names, sys.argv[1:] if argv is None else argv)
    misplaced = _misplaced_option(argv)
    if misplaced:
        print(f"shardfs: {misplaced}", file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    if extra:  # (argparse would name the top-level usage, not the command's)
        unknown = " ".join(extra)
        print(f"shardfs: {args.command}: unrecognized arguments: {unknown} "
              f"(see: shardfs {args.command} --help)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        if args.command == "mount":
            return _mount(args)
        if args.command == "fsck":
            return _fsck(args)
        if args.command == "compact":
            return _compact(args)
        if args.command == "checksum":
            return checksum.run(args)
        if args.command == "info":
            return info.run(args)
        if args.command == "manifest":
            return manifest.run(args)
        if args.command == "stats":
            return stats.run(args)
        return _umount(args.mountpoint)
    except UsageError as e:
        print(f"shardfs: {e}", file=sys.stderr)
        return 2
    except ShardfsError as e:
        print(f"shardfs: {e}", file=sys.stderr)
        return 1


def _implied_mount(commands: frozenset[str], argv: Sequence[str]) -> list[str]:
    """`shardfs SOURCE MOUNTPOINT [-o OPTS]` means `shardfs mount ...`: mount.fuse3 (behind
    `mount -t fuse.shardfs` and fstab) runs the file system's command that way. A source
    named like a command must then be written as a path (`./info`)."""
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        return ["mount", *argv]
    return list(argv)


#: What people write for a mount option as a command-line flag (`mount -r` in mount(8)).
_FLAG_OPTIONS = {"-r": "ro", "--ro": "ro", "--read-only": "ro", "-w": "rw", "--rw": "rw"}


def _misplaced_option(argv: Sequence[str]) -> str | None:
    """The one line for a mount option given to `shardfs mount` as a flag (`--ro`, `-r`,
    `--allow_other`), which argparse would only answer with the top-level usage."""
    if not argv or argv[0] != "mount":
        return None
    from shardfs.options import OWN

    after_o = False
    positional = 0
    for arg in argv[1:]:
        if arg == "--":
            break
        if after_o or arg == "-o":
            after_o = not after_o
            continue
        if not arg.startswith("-"):
            positional += 1
            if positional > 2 and _are_options(arg):  # `shardfs mount SRC MNT ro`
                return f"mount takes SOURCE MOUNTPOINT: mount options go after -o (-o {arg})"
            continue
        name, equals, value = arg.lstrip("-").partition("=")
        option = _FLAG_OPTIONS.get(arg) or (
            f"{name.replace('-', '_')}{equals}{value}"
            if arg.startswith("--") and name.replace("-", "_") in OWN
            else None
        )
        if option:
            return f"mount has no {arg.partition('=')[0]} flag: mount options go after -o (-o {option})"
    return None


def _are_options(arg: str) -> bool:
    """Whether `arg` parses as the argument of -o."""
    from shardfs.options import parse_options

    try:
        parse_options([arg])
    except UsageError:
        return False
    return True


# -- checks shared by the parent and the daemon ------------------------------------------


#: The device every FUSE mount opens, and libfuse's configuration (`user_allow_other`).
FUSE_DEVICE, FUSE_CONF = "/dev/fuse", "/etc/fuse.conf"


def check_mountpoint(mountpoint: str, source: str, nonempty: bool = False) -> None:
    clear_stale(mountpoint)
    try:
        is_dir = stat_mod.S_ISDIR(os.stat(mountpoint).st_mode)
    except FileNotFoundError:
        raise UsageError(f"mountpoint {mountpoint} does not exist") from None
    except OSError as e:
        raise UsageError(f"mountpoint {mountpoint}: {e.strerror}") from None
    if not is_dir:
        raise UsageError(f"mountpoint {mountpoint} is not a directory")
    kind = mount_type(mountpoint)
    if kind is not None:
        raise UsageError(f"mountpoint {mountpoint} is busy: {kind} is already mounted there")
    real_mp, real_src = os.path.realpath(mountpoint), os.path.realpath(source)
    inside = real_mp == real_src or real_mp.startswith(real_src + os.sep)
    if is_local(source) and inside:
        raise UsageError(f"mountpoint {mountpoint} must not be inside the source")
    if not nonempty and _has_entries(mountpoint):
        raise UsageError(
            f"mountpoint {mountpoint} is not empty (the mount would hide what is in it); "
            "use an empty directory, or -o nonempty to mount over it anyway"
        )
    check_fuse_device()


def _has_entries(directory: str) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except OSError:
        return False  # cannot be listed: the mount itself says what is wrong


def check_fuse_device(device: str = FUSE_DEVICE) -> None:
    """UsageError, naming the cause and the fix, unless this user can open the FUSE device:
    a missing device (no module, or a container without it) is another matter than one
    this user may not open (mode 0600 where Debian has 0666)."""
    try:
        info = os.stat(device)
    except FileNotFoundError:
        raise UsageError(
            f"cannot open {device}: it does not exist; load the fuse module (modprobe fuse), "
            "or give the container the device (--device /dev/fuse)"
        ) from None
    except OSError as e:
        raise UsageError(f"cannot open {device}: {e.strerror}") from None
    if os.access(device, os.R_OK | os.W_OK):
        return
    mode = stat_mod.S_IMODE(info.st_mode)
    owner, group = _user_name(info.st_uid), _group_name(info.st_gid)
    fix = (
        f"an administrator can let every user mount with `sudo chmod 0666 {device}` "
        "(Debian's default)"
    )
    if info.st_gid != 0:
        fix += f", or let you in with mode 0660 and membership of its group {group}"
    raise UsageError(
        f"cannot open {device}: permission denied (mode {mode:04o}, owner {owner}, group "
        f"{group}): the device is there, but this user may not use it; {fix}"
    )


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def check_allow_other(options: MountOptions) -> None:
    """UsageError before mounting if a user other than root asks for allow_other and
    FUSE_CONF does not allow it (fusermount3 would refuse the mount with nothing but
    "fuse_session_mount failed")."""
    if not options.allow_other or os.geteuid() == 0:
        return
    try:
        with open(FUSE_CONF) as conf:
            allowed = any(line.strip() == "user_allow_other" for line in conf)
    except FileNotFoundError:
        allowed, problem = False, "does not exist"
    except OSError as e:
        allowed, problem = False, f"cannot be read ({e.strerror})"
    else:
        problem = "has no line user_allow_other"
    if not allowed:
        raise UsageError(
            f"option allow_other needs user_allow_other in {FUSE_CONF} for users other than "
            f"root, and {FUSE_CONF} {problem}; an administrator can add that line "
            f"(echo user_allow_other | sudo tee -a {FUSE_CONF}), or mount without allow_other"
        )


def clear_stale(mountpoint: str) -> None:
    """Unmount (lazily) a FUSE mount at `mountpoint` whose daemon is gone, saying so: a
    daemon that died leaves its mount behind, answering "transport endpoint is not
    connected", and a restarted daemon (systemd's Restart=) must be able to mount again."""
    if not is_stale(mountpoint):
        return
    kind = mount_type(mountpoint) or "a FUSE file system"
    result = unmount(mountpoint, lazy=True)
    if result.returncode != 0 or is_stale(mountpoint):
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
        raise ShardfsError(
            f"mountpoint {mountpoint} is a stale mount whose daemon is gone, and clearing it "
            f"failed: {detail}"
        )
    message = (
        f"mountpoint {mountpoint} was a stale {kind} mount whose daemon is gone "
        "(transport endpoint is not connected); cleared it (lazy unmount)"
    )
    print(f"shardfs: {message}", file=sys.stderr)  # before logging is set up, if ever


def _fsname(source: str) -> str:
    """The name shown in the mount table; libfuse options cannot hold commas."""
    real = os.path.realpath(source) if is_local(source) else source
    return real if not any(c in real for c in ",\\ \t\n") else "shardfs"


# -- mount --------------------------------------------------------------------------


def _mount(args: argparse.Namespace) -> int:
    options = parse_options(args.options)
    _use_own_home()
    with logs.early() as early:
        source = open_source(args.source, options)
        check_mountpoint(args.mountpoint, args.source, options.nonempty)
        check_allow_other(options)
        # Here, where it shows: the warning if /tmp/shardfs-UID is another user's, or the
        # one line that refuses an unsafe runtime directory.
        runtime_dir(make=True)
        note_nothing_sharded(source, args.source, options.view)
    if args.foreground:
        return _run_daemon(args, options, source, early)
    early.print()  # the daemon's log (syslog, a file) gets them too, but is not here
    return _detach_daemon(args, options, source, early)


def _use_own_home() -> None:
    """Make $HOME the user's own home directory (of the passwd database) where it names a
    directory that is not the user's: mount.fuse3 runs the daemon of a user's fstab mount
    with HOME=/root, and what is found below `~` (boto3's ~/.aws) must be the user's."""
    if os.geteuid() == 0 or own_directory(os.environ.get("HOME")):
        return
    with contextlib.suppress(UnsafeState):
        os.environ["HOME"] = home_dir(os.geteuid())


def _kernel_served(options: MountOptions) -> bool:
    """Whether the kernel serves re-reads and listings of this mount itself: read-only
    mounts, unless `kernel_cache=no`, where pyfuse3 carries the patch that makes it
    possible (one log line says why not otherwise)."""
    import pyfuse3

    from shardfs.fuse.adapter import INODE_AS_FH

    if not (options.read_only and options.kernel_cache):
        return False
    if not INODE_AS_FH:
        log.info(
            "pyfuse3 %s lacks the patch in patches/ (scripts/setup builds it): the kernel "
            "cannot serve re-reads and listings itself, so every open and listing is asked",
            pyfuse3.__version__,
        )
    return INODE_AS_FH


def _raise_file_limit() -> None:
    """Let the daemon open as many files as the system allows it: every open file of a
    local source holds its shard open (see `Pin`), and systemd starts services with a
    soft limit of 1024, which a tool opening many chunk files at once would reach."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _run_daemon(
    args: argparse.Namespace,
    options: MountOptions,
    source: Hierarchy | PrecomputedSource | WkwSource,
    early: logs.Early,
    ready_fd: int | None = None,
) -> int:
    """Serve the mount; a detached daemon says "ready" or "error ..." on `ready_fd`.
    `early` holds what was logged while the source was opened, before the log was set up."""
    from shardfs.fuse.adapter import MountConfig
    from shardfs.fuse.daemon import serve

    ready = os.fdopen(ready_fd, "w") if ready_fd is not None else None
    served = False

    def report(message: str) -> None:
        nonlocal served
        served = True
        if ready is not None and not ready.closed:
            ready.write(message + "\n")
            ready.close()

    def fail(problem: object) -> int:
        """Say why the daemon ends: in its log, and before it serves, to `shardfs mount`
        (in the foreground on stderr) too."""
        message = (
            f"the daemon of {args.mountpoint} failed: {problem}"
            if served
            else f"cannot mount {args.mountpoint}: {problem}"
        )
        log.error("%s", message)
        if not served:
            report(f"error {message}")
            if ready is None:
                print(f"shardfs: {message}", file=sys.stderr)
        return 1

    try:
        logs.setup(options.log_file, foreground=ready_fd is None, debug=options.debug)
    except OSError as e:
        return fail(f"cannot open the log file {options.log_file}: {e.strerror}")
    early.replay()
    log.info(
        "shardfs %s: mounting %s at %s (options: %s)",
        __version__,
        args.source,
        args.mountpoint,
        options.argument() or "none",
    )
    try:
        _raise_file_limit()
        view = open_view(source, options, args.source)
        outcome = serve(
            view,
            args.mountpoint,
            MountConfig(
                read_only=options.read_only,
                timeout=options.cache_timeout,
                inodes=options.inodes,
                kernel_served=_kernel_served(options),
                front=options.front,
                uid=options.uid,
                gid=options.gid,
                file_mode=options.file_mode,
                dir_mode=options.dir_mode,
            ),
            options.fuse_options(_fsname(args.source)),
            on_ready=lambda: report("ready"),
            flush_interval=options.flush_interval,
            leftovers=open_leftovers(view, options, args.source),
            stats_interval=options.stats_interval,
            metrics=options.metrics,
        )
    except (ShardfsError, RuntimeError) as e:  # foreseen: its message says it all
        return fail(e)
    except Exception as e:
        # Unforeseen: the traceback goes to the log (folded into its line), for a report.
        log.exception("unexpected error")
        return fail(f"{type(e).__name__}: {e}" if not isinstance(e, OSError) else e)
    return 1 if outcome else 0


def _detach_daemon(
    args: argparse.Namespace,
    options: MountOptions,
    source: Hierarchy | PrecomputedSource | WkwSource,
    early: logs.Early,
) -> int:
    """Fork the daemon into its own session and wait until it reports. The child goes on
    with what this process has imported and opened, which halves the time to a mount."""
    read_end, write_end = os.pipe()
    # The daemon runs in "/", so every path it uses must be absolute.
    args.mountpoint = os.path.abspath(args.mountpoint)
    if is_local(args.source):
        args.source = os.path.abspath(args.source)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the daemon
        code = 1
        try:
            os.close(read_end)
            os.setsid()
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            # systemd hears from a daemon it started in the foreground; never from this one.
            os.environ.pop("NOTIFY_SOCKET", None)
            code = _run_daemon(args, options, source, early, ready_fd=write_end)
        finally:
            logging.shutdown()
            os._exit(code)
    os.close(write_end)
    message = _read_line(read_end, READY_TIMEOUT)
    os.close(read_end)
    if message == "ready":
        return 0
    if message.startswith("error "):
        print(f"shardfs: {message[6:]}", file=sys.stderr)
    else:
        os.kill(pid, signal.SIGKILL)  # ours, by PID: it never answered
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        reason = "did not answer in time" if message == "timeout" else f"exited ({status})"
        if options.log_file or os.path.exists("/dev/log"):
            where = options.log_file or "the system log (journalctl -t shardfs)"
            logged = f"its log, if any, is in {where}"
        else:  # see logs.setup: a detached daemon without syslog logs to its stderr, /dev/null
            logged = "it had no log (there is no /dev/log): mount with -f or -o log=FILE to see why"
        print(
            f"shardfs: cannot mount {args.mountpoint}: the daemon {reason}; {logged}",
            file=sys.stderr,
        )
    if mount_type(args.mountpoint) is not None:
        unmount(args.mountpoint, lazy=True)
    return 1


def _read_line(fd: int, timeout: float) -> str:
    """One line from the readiness pipe; "timeout", or "" if the daemon died first."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return "timeout"
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


# -- umount -------------------------------------------------------------------------


def _umount(mountpoint: str) -> int:
    kind = mount_type(mountpoint)
    if kind is None:
        raise UsageError(f"{mountpoint} is not mounted")
    if kind != "fuse.shardfs":
        raise UsageError(f"{mountpoint} is not a shardfs mount ({kind})")
    if is_stale(mountpoint):
        clear_stale(mountpoint)
        return 0
    _sync(mountpoint)
    lock = open_lock(mountpoint)  # before the unmount: the daemon removes it as it exits
    result = unmount(mountpoint)
    if result.returncode != 0:
        if lock is not None:
            os.close(lock)
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
        if "busy" in detail.lower():
            detail = (
                "a process has a file or its working directory in it: find it with "
                f"`fuser -vm {mountpoint}` and end it, or unmount once it is done with "
                f"`fusermount3 -uz {mountpoint}`"
            )
        raise ShardfsError(f"cannot unmount {mountpoint}: {detail}")
    if lock is None:
        return 0
    outcome = wait_for_daemon(lock, timeout=UMOUNT_NOTICE)
    if outcome is None:
        print(
            f"shardfs: waiting for the daemon of {mountpoint} to commit what it buffers",
            file=sys.stderr,
        )
        outcome = wait_for_daemon(lock)
    if outcome:
        raise ShardfsError(f"{mountpoint} is unmounted, but: {outcome} (see the daemon's log)")
    return 0


def _sync(mountpoint: str) -> None:
    """Ask a read-write mount to commit what it buffers before it is unmounted, so the
    data is in the source when `umount` returns (fsync of the mount's root directory)."""
    try:
        fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # the unmount below reports what is wrong
    try:
        os.fsync(fd)
    except OSError as e:
        print(
            f"shardfs: warning: {mountpoint}: commit before unmount failed: {e.strerror}",
            file=sys.stderr,
        )
    finally:
        os.close(fd)


# -- fsck and compact -----------------------------------------------------------------


def _zarr_storage(source: str, command: str, writes: bool = True) -> Storage:
    """The storage of a Zarr source; fsck and compact have nothing to do on other sources.
    A local source that the command `writes` is checked first: root refuses to write a
    source that other users could change under it (see `LocalStorage.check_writable`)."""
    opened = open_source(source)
    if isinstance(opened, PrecomputedSource | WkwSource):
        kind = "WKW dataset" if isinstance(opened, WkwSource) else "Neuroglancer precomputed volume"
        raise UsageError(f"source {source} is a {kind}: {command} works on Zarr shards only")
    if writes and isinstance(opened.storage, LocalStorage):
        try:
            opened.storage.check_writable()
        except ShardfsError as e:
            raise UsageError(str(e)) from None
    return opened.storage


def _fsck(args: argparse.Namespace) -> int:
    """Exit 0 if no damage is left, 1 if some is; usage errors are 2 here, because 1 means damage."""
    try:
        if args.settle and args.dry_run:
            raise UsageError("--settle changes the source: it cannot go with --dry-run")
        storage = _zarr_storage(args.source, "fsck", writes=not args.dry_run)
        if args.settle and not isinstance(storage, LocalStorage):
            raise UsageError("--settle is for local sources (S3 uploads settle themselves)")
    except UsageError as e:
        print(f"shardfs: {e}", file=sys.stderr)
        return 2
    for key in args.settle:
        assert isinstance(storage, LocalStorage)
        print(storage.settle(key.strip("/")))
    with progress_bar("fsck", "shards") as progress:
        report = fsck(storage, repair=not args.dry_run, progress=progress)
    if not args.dry_run:
        _tidy(storage)
    print("\n".join(report.lines()))
    return 0 if report.clean else 1


def _tidy(storage: Storage) -> None:
    """Leave no trace of a run that wrote (see `Storage.tidy`); failing that, say so."""
    try:
        storage.tidy()
    except ShardfsError as e:
        print(f"shardfs: warning: {e}", file=sys.stderr)


def _compact(args: argparse.Namespace) -> int:
    """Exit 0 if every shard was compacted or left alone on purpose, 1 if some are corrupt or
    unreadable, 2 on usage errors (as for fsck)."""
    try:
        policy = Policy(args.threshold, parse_size(args.min_dead, "--min-dead"))
        storage = _zarr_storage(args.source, "compact")
    except (UsageError, ValueError) as e:  # ValueError: Policy refuses the threshold
        print(f"shardfs: {e}", file=sys.stderr)
        return 2
    with progress_bar("compact", "shards") as progress:
        report = compact(storage, policy, progress)
    _tidy(storage)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1
