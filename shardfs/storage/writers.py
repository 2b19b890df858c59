"""Who writes a local source when root runs shardfs: the check of its path, and the
identity that root's writes run with.

Why: a writer running as root can do what the source's users cannot (replace a
file root owns, create one anywhere), so whatever a user plants in a source is a
lever on root. Names below the source are resolved beneath its root (see
`shardfs.storage.beneath`); on top of that, as OpenSSH does when it reads a
user's `~/.ssh` (StrictModes, with that user's rights):

* root writes a source owned by another user with that user's file-system
  identity (fsuid, fsgid and groups, set per thread around each write), so
  nothing there can make it do more than the owner could; what it creates is
  the owner's;
* root refuses to write at all where another user could replace the source or
  what is in it: a directory above the source root that is not owned by root
  or the source's owner, or that group or others may write without the sticky
  bit (in a sticky directory such as /tmp nobody else can rename or remove our
  entries); and, in a source root owns, the source root or its `.shardfs/`
  area when they are writable by group or others, or that area when owned by
  another user.

Other users write as themselves: whoever shares a source with them can already
change everything in it, and resolution beneath the root keeps them from
reaching anything outside it.
"""

from __future__ import annotations

import ctypes
import grp
import os
import pwd
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shardfs.primitives.errors import StorageError
from shardfs.storage.beneath import Tree

#: setgroups, setfsuid, setfsgid. Raw syscalls change the calling thread only (libc's
#: wrappers of setgroups change every thread of the process).
_SYSCALLS = {"x86_64": (116, 122, 123), "aarch64": (159, 151, 152)}
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
#: The private area (`journal.PRIVATE`) and what is in it, relative to the source root.
PRIVATE_DIRS = (".shardfs", ".shardfs/journal", ".shardfs/tmp")


class UnsafeSource(StorageError):
    """Root refuses to write a source another user could change under it; one line
    naming the directory, why, and what to do instead."""


@dataclass(frozen=True)
class Identity:
    """The file-system identity that root's writes of a source run with."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _refuse(root: str, what: str, why: str, user: str) -> UnsafeSource:
    """The one line of a refusal; `user` is who to run shardfs as instead (a user name,
    or words for whoever may write there)."""
    run = (
        f"runuser -u {user} -- shardfs ..." if " " not in user else "runuser -u USER -- shardfs ..."
    )
    return UnsafeSource(
        f"source {root}: refused to write it as root: {what} {why}, so another user could "
        f"change what root writes; run shardfs as {user} instead ({run})"
    )


def _loose(info: os.stat_result, sticky_ok: bool) -> str:
    """Why others may change entries of a directory with `info`; "" if they may not."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_mode & 0o022 and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        return f"is writable by group or others (mode {mode:04o})"
    return ""


def writer_of(tree: Tree) -> Identity | None:
    """The identity to write `tree` (a source root) with: None for this process's own;
    UnsafeSource if root must not write it at all (see the module docstring)."""
    if os.geteuid() != 0:
        return None
    root = tree.root
    own = os.fstat(tree.fd)
    owner = own.st_uid
    user = _name(owner)
    try:
        named = os.lstat(root)
    except OSError as e:
        raise UnsafeSource(f"source {root}: {e.strerror}") from None
    if (named.st_dev, named.st_ino) != (own.st_dev, own.st_ino):
        raise _refuse(root, "its path", "names another directory since it was opened", user)
    directory = os.path.dirname(root)
    while True:
        try:
            info = os.lstat(directory)
        except OSError as e:
            raise UnsafeSource(f"source {root}: {directory}: {e.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise _refuse(root, f"the directory {directory} above it", "is no directory", user)
        if info.st_uid not in (0, owner):
            raise _refuse(
                root,
                f"the directory {directory} above it",
                f"is owned by {_name(info.st_uid)}",
                _name(info.st_uid),
            )
        if why := _loose(info, sticky_ok=True):
            raise _refuse(root, f"the directory {directory} above it", why, user)
        if directory == "/":
            break
        directory = os.path.dirname(directory)
    if owner != 0:
        return _identity(owner, own.st_gid)
    for rel in ("", *PRIVATE_DIRS):
        try:
            info = tree.lstat(rel)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not stat.S_ISDIR(info.st_mode):
            continue  # not the area: the journal removes a symlink planted there
        what = tree.path(rel) if rel else "the source root"
        if info.st_uid != 0:
            owner_name = _name(info.st_uid)
            raise _refuse(root, what, f"is owned by {owner_name}", owner_name)
        if why := _loose(info, sticky_ok=False):
            group = _group_name(info.st_gid)
            raise _refuse(root, what, why, f"a user of group {group}")
    return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _identity(uid: int, gid: int) -> Identity:
    """`uid` with its primary group and groups from the user database (a user it does not
    know: the group of the source root, no others)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return Identity(uid, gid, (gid,))
    return Identity(uid, entry.pw_gid, tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)))


_depth = threading.local()


@contextmanager
def acting_as(identity: Identity | None) -> Iterator[None]:
    """Run the block's file-system calls, in this thread, as `identity` (None: as is).
    Nested blocks keep the outermost identity."""
    depth: int = getattr(_depth, "n", 0)
    if identity is None or depth:
        _depth.n = depth + 1
        try:
            yield
        finally:
            _depth.n -= 1
        return
    calls = _SYSCALLS.get(os.uname().machine)
    if calls is None:
        raise UnsafeSource(
            f"cannot write as uid {identity.uid} on {os.uname().machine}: run shardfs as "
            f"that user (runuser -u {_name(identity.uid)} -- shardfs ...)"
        )
    groups = os.getgroups()
    _set(calls, identity.uid, identity.gid, identity.groups)
    _depth.n = 1
    try:
        yield
    finally:
        _depth.n = 0
        _set(calls, os.geteuid(), os.getegid(), tuple(groups))


def _set(calls: tuple[int, int, int], uid: int, gid: int, groups: tuple[int, ...]) -> None:
    """Set this thread's groups, fsgid and fsuid. An fsuid other than 0 also drops the
    thread's file capabilities (CAP_DAC_OVERRIDE and the like); fsuid 0 gives them back."""
    setgroups, setfsuid, setfsgid = calls
    array = (ctypes.c_uint * len(groups))(*groups)
    if _libc.syscall(setgroups, len(groups), array) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setgroups: {os.strerror(code)}")
    _libc.syscall(setfsgid, gid)
    _libc.syscall(setfsuid, uid)
    # set*fsid answer the previous value whatever happens: ask again (-1 changes nothing)
    if _libc.syscall(setfsuid, -1) != uid or _libc.syscall(setfsgid, -1) != gid:
        raise OSError(f"could not take uid {uid}, gid {gid} for writing")
