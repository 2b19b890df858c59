"""Paths below a local source, resolved beneath its root with no symbolic link followed.

Why: whoever can write a source can plant a symlink at any name shardfs
opens there (a key, `.shardfs/lock`, a journal entry, a temp file), and a
writer that followed it would create, truncate or rename whatever the link
points to, with the writer's rights (root's, for an administrator's `fsck`).
So every path shardfs writes below a local source is a relative path that a
`Tree` resolves from a descriptor of the source root: with openat2(2) and
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it (5.6 and later),
else one component at a time with O_NOFOLLOW. Either way a symlink anywhere
on the path is ELOOP, and `..` or an absolute path is EXDEV before anything is
looked up, so nothing outside the root is ever reached.

Reads are resolved the same way, for the same reason: a reader that followed a
symlink planted at a key (or at a directory on its way) would show, through a
mount other users reach, what the link points to with the daemon's rights. So a
local source is only ever opened or stat'ed through a `Tree`.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
import struct
import threading

#: openat2(2) on every Linux architecture (syscalls added since 5.1 share their numbers).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
#: `struct open_how`: flags, mode, resolve.
_OPEN_HOW = struct.Struct("QQQ")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
#: Whether openat2 is known to be missing (ENOSYS: an old kernel, or a seccomp filter).
_no_openat2 = False
#: A directory opened only to resolve names in it.
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
#: A name opened only to stat it: a symlink there is opened itself, never followed.
_STAT_FLAGS = os.O_PATH | os.O_NOFOLLOW


def components(path: str) -> list[str]:
    """The names of relative `path`; EXDEV for `..` or an absolute path, which could lead out."""
    if path.startswith("/") or ".." in path.split("/"):
        raise OSError(errno.EXDEV, "leads out of the source", path)
    return [name for name in path.split("/") if name not in ("", ".")]


def open_beneath(dirfd: int, path: str, flags: int, mode: int = 0o666) -> int:
    """`os.open` of relative `path` below directory `dirfd`, never through a symlink
    (ELOOP) and never out of it (EXDEV); the descriptor is not inherited by children."""
    return _open_checked(dirfd, "/".join(components(path)), flags, mode, path)


def _open_checked(dirfd: int, joined: str, flags: int, mode: int, path: str) -> int:
    """`open_beneath` of `joined`, a relative path with no `..` (checked by the caller);
    `path` is for messages."""
    global _no_openat2
    if not joined:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dirfd)
    flags |= os.O_CLOEXEC
    if not _no_openat2:
        creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
        how = _how(flags, mode if creates else 0)
        fd: int = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(joined), how, len(how))
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.ENOSYS:
            raise OSError(code, os.strerror(code), path)
        _no_openat2 = True
    return _open_walking(dirfd, components(joined), flags, mode, path)


@functools.cache
def _how(flags: int, mode: int) -> bytes:
    """The `struct open_how` of an open (a few distinct ones: the flags this package uses)."""
    return _OPEN_HOW.pack(
        flags, mode, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    )


def _open_walking(dirfd: int, names: list[str], flags: int, mode: int, path: str) -> int:
    """`open_beneath` without openat2: one component at a time, each with O_NOFOLLOW."""
    current = dirfd
    try:
        for name in names[:-1]:
            try:
                step = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            except NotADirectoryError:
                # O_PATH | O_NOFOLLOW opens a symlink itself, which then is no directory
                _symlink_is_eloop(current, name, path)
                raise
            if current != dirfd:
                os.close(current)
            current = step
        try:
            return os.open(names[-1], flags | os.O_NOFOLLOW, mode, dir_fd=current)
        except NotADirectoryError:  # O_DIRECTORY of a symlink: ELOOP, as openat2 tells it
            _symlink_is_eloop(current, names[-1], path)
            raise
    finally:
        if current != dirfd:
            os.close(current)


def _symlink_is_eloop(dirfd: int, name: str, path: str) -> None:
    """ELOOP if `name` in `dirfd` is a symlink (which an open that was to find a
    directory there reports as ENOTDIR)."""
    if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None


class Tree:
    """A directory (a local source's root) in which every name is resolved beneath it.

    The root is opened by its real path with no symlink followed; so an identity
    with fewer rights (see `shardfs.storage.writers`) needs no access to the
    directories above it. It is opened again when the directory at that path is
    another one (a source removed and made anew under a mount, as a writer that
    overwrites a whole hierarchy does), so that writes go where reads find things.
    `path` is only for messages.

    Reads (`open_now`, `stat_now`) resolve the root's whole path from `/` instead, with
    no symlink on it either (the root is its real path): the root at its path now,
    without the stat `fd` takes (a read is made on every lookup), for an identity that
    reached the root (the daemon's).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        #: the root's path below `/` (and with a `/` after it, unless empty), and `/`
        #: itself: where `open_now` resolves from
        self._below_slash = root.strip("/")
        self._prefix = f"{self._below_slash}/" if self._below_slash else ""
        self._slash = os.open("/", _DIR_FLAGS)
        self._fd = -1
        self._id = (-1, -1)
        #: descriptors of roots that were replaced, which another thread may still use:
        #: closed with the tree (a root is made anew rarely)
        self._replaced: list[int] = []
        self._lock = threading.Lock()
        self._open_root()

    def _open_root(self) -> None:
        fd = open_beneath(self._slash, self._below_slash, _DIR_FLAGS)
        st = os.fstat(fd)
        if self._fd >= 0:
            self._replaced.append(self._fd)
        self._fd, self._id = fd, (st.st_dev, st.st_ino)

    @property
    def fd(self) -> int:
        """The root's descriptor: of the directory at the root's path now (one stat)."""
        try:
            st = os.stat(self.root)
        except OSError:
            return self._fd  # gone: what is done below it fails as it would
        if (st.st_dev, st.st_ino) != self._id:
            with self._lock:
                if (st.st_dev, st.st_ino) != self._id:
                    self._open_root()
        return self._fd

    def close(self) -> None:
        for fd in (self._fd, self._slash, *self._replaced):
            if fd >= 0:
                os.close(fd)
        self._fd, self._slash, self._replaced = -1, -1, []

    __del__ = close

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def open(self, rel: str, flags: int, mode: int = 0o666) -> int:
        return open_beneath(self.fd, rel, flags, mode)

    def open_now(self, rel: str, flags: int) -> int:
        """`open` of `rel` below the root at its path now (see the class docstring)."""
        # (checked as `components` does, without making a list: a read is made on every lookup)
        if rel.startswith("/") or "/../" in f"/{rel}/":
            raise OSError(errno.EXDEV, "leads out of the source", rel)
        joined = self._prefix + rel if rel else self._below_slash
        return _open_checked(self._slash, joined, flags, 0, rel)

    def stat_now(self, rel: str) -> os.stat_result:
        """What `rel` is, itself (a symlink as a symlink), below the root at its path now."""
        fd = self.open_now(rel, _STAT_FLAGS)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _parent(self, rel: str) -> tuple[int, str]:
        """A descriptor of the directory holding `rel` (to close) and its last name."""
        names = components(rel)
        if not names:
            raise OSError(errno.EINVAL, "names the root itself", self.root)
        return open_beneath(self.fd, "/".join(names[:-1]), _DIR_FLAGS), names[-1]

    def lstat(self, rel: str) -> os.stat_result:
        """What `rel` is, itself (a symlink as a symlink)."""
        if not components(rel):
            return os.fstat(self.fd)
        parent, name = self._parent(rel)
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)

    def mkdir(self, rel: str, mode: int = 0o777) -> None:
        parent, name = self._parent(rel)
        try:
            os.mkdir(name, mode, dir_fd=parent)
        finally:
            os.close(parent)

    def rmdir(self, rel: str) -> None:
        parent, name = self._parent(rel)
        try:
            os.rmdir(name, dir_fd=parent)
        finally:
            os.close(parent)

    def unlink(self, rel: str) -> None:
        """Remove the name `rel` (a symlink itself, never what it points to)."""
        parent, name = self._parent(rel)
        try:
            os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)

    def rename(self, src: str, dst: str) -> None:
        src_parent, src_name = self._parent(src)
        try:
            dst_parent, dst_name = self._parent(dst)
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_parent, dst_dir_fd=dst_parent)
            finally:
                os.close(dst_parent)
        finally:
            os.close(src_parent)

    def listdir(self, rel: str) -> list[str]:
        fd = self.open(rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def fsync_dir(self, rel: str) -> None:
        """Make the entries of directory `rel` (creations, renames, removals) durable."""
        fd = self.open(rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
