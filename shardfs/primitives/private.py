"""Local state that belongs to the daemon's user alone: its directories and files.

Why: a daemon keeps state on a host that many users share (the disk cache, the
runtime directory with its lock files and stats socket, the write spool). If
another user can write such a directory, that user can swap what the daemon
reads back, plant a symlink where it writes, or read what it caches. So, as
OpenSSH's StrictModes does for `~/.ssh`, a directory is used only if it is a
real directory (not a symlink) owned by the daemon's effective user and
writable by nobody else, and every directory above it is owned by that user or
root and writable by nobody else unless sticky (as /tmp is: others may add
entries there, but not rename or remove ours). What shardfs makes itself is
0700 (directories) and 0600 (files) whatever the umask, and files are opened
without following symlinks.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from typing import TypeGuard

from shardfs.primitives.errors import ShardfsError

#: Modes of what shardfs creates.
DIR_MODE, FILE_MODE = 0o700, 0o600


class UnsafeState(ShardfsError):
    """A directory for local state that another user controls (or could): refused.

    Its message is one line naming the path and the reason."""


def private_dir(path: str) -> str:
    """`path` as an absolute path, made (mode 0700, with any missing parents) if missing.
    UnsafeState if it, or a directory above it, is not the daemon user's alone."""
    path = os.path.abspath(path)
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile (another daemon): checked below like any existing one
        except OSError as e:
            raise UnsafeState(f"{directory}: cannot create it: {e.strerror}") from None
        else:
            _restore_mode(directory)
    check_private_dir(path)
    return path


def _restore_mode(directory: str) -> None:
    """Give a directory just made mode 0700: the umask may have taken bits away, never
    added. Through a descriptor opened without following symlinks, so that a directory
    someone swapped in meanwhile for a symlink never passes the mode on to its target
    (what was swapped in is refused by the check that follows)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone or replaced: the check that follows says why
    try:
        os.fchmod(fd, DIR_MODE)
    except OSError:
        pass  # not ours (replaced): the check that follows refuses it
    finally:
        os.close(fd)


def check_private_dir(path: str, shared: bool = False) -> None:
    """UnsafeState unless `path` is a directory only the daemon's user can change (see
    the module docstring). With `shared`, `path` only has to be as safe as a directory
    above one (root's will do, and others may write in it if it is sticky, as in /tmp): a
    directory in which the daemon makes a private directory of its own, such as the root
    of the write spool."""
    uid = os.geteuid()
    for directory, above in _path_and_parents(path):
        try:
            info = os.stat(directory) if above else os.lstat(directory)
        except OSError as e:
            where = f"{directory} (above {path})" if above else path
            raise UnsafeState(f"{where}: {e.strerror}") from None
        reason = _unsafe(info, uid, sticky_ok=above or shared, root_ok=above or shared)
        if reason and above:
            raise UnsafeState(
                f"{path}: the directory {directory} above it {reason}; "
                "refused (another user could replace it)"
            )
        if reason:
            raise UnsafeState(f"{path}: {reason}; refused (another user could change it)")


def _path_and_parents(path: str) -> Iterator[tuple[str, bool]]:
    """`path`, then every directory above its real path up to the root, each with whether
    it is above."""
    yield path, False
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        yield parent, True
        if parent == "/":
            return
        parent = os.path.dirname(parent)


def _unsafe(info: os.stat_result, uid: int, sticky_ok: bool, root_ok: bool = False) -> str:
    """Why a directory with `info` is not safe for state of user `uid`; "" if it is."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != uid and not (root_ok and info.st_uid == 0):
        return f"is owned by uid {info.st_uid}, not by the daemon's user (uid {uid})"
    if info.st_mode & 0o022 and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return ""


def open_private(path: str, flags: int, dir_fd: int | None = None) -> int:
    """`os.open` of a file of private state: never through a symlink, mode 0600 if it is
    created, not inherited by children."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd)


def home_dir(uid: int) -> str:
    """The home directory of user `uid` in the passwd database: where that user's state
    lives, whatever $HOME says (mount.fuse3 runs a user's fstab mount with HOME=/root).
    UnsafeState if there is none."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = ""
    if not os.path.isabs(home):
        raise UnsafeState(f"uid {uid} has no home directory in the passwd database")
    return home


def own_directory(path: str | None) -> TypeGuard[str]:
    """Whether `path` is an absolute path of a directory the effective user owns (so an
    environment variable naming it, such as $HOME, is that user's, not one inherited)."""
    if not path or not os.path.isabs(path):
        return False
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
