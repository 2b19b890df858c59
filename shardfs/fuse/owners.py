"""The owner and mode the kernel is shown of each file (docs/semantics.md "Permissions").

A file or directory shows the mode, owner and group of the stored object it is
shown from (`Attr.access`, from the stat the view makes anyway): a chunk file
its shard's, a rendered document its stored document's, a virtual directory
its nearest stored directory's. Only the permission bits are shown (a
directory's sticky bit too); files never show execute bits (the view serves
data), and a read-only mount shows no write bits. Where the store has no owners
(S3) and for what a read-write mount has not committed yet, files are the
mounting user's, 0444 and 0555 read-only, 0644 and 0755 read-write. The
options `uid=`, `gid=`, `file_mode=` and `dir_mode=` replace what they name for
every file. With `allow_other` the kernel checks these modes
(`default_permissions`): other users then read what the source's modes let
them read.

A document rendered from several stored ones (a consolidated `.zmetadata`, a
WKW magnification's documents) is shown from one of them, and every user shown
it reads the same bytes (a kernel-served mount shares an inode's pages among
users): so the view puts in it only what everyone that shown mode lets read may
read as it is shown, or shows it from another (`Owners.covers`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from shardfs.storage.base import Access, Need

#: Distinct answers kept of each kind (files, directories); all are dropped when full.
KEPT = 1024


class Owners:
    """What `stat` shows of files: (st_mode, st_uid, st_gid) by kind and `Attr.access`,
    each worked out once (a listing of a million chunk files asks for a few)."""

    def __init__(
        self,
        read_only: bool,
        uid: int | None = None,
        gid: int | None = None,
        file_mode: int | None = None,
        dir_mode: int | None = None,
    ) -> None:
        self._read_only = read_only
        self._uid = uid
        self._gid = gid
        self._file_mode = file_mode
        self._dir_mode = dir_mode
        self._mounter = (os.getuid(), os.getgid())
        self._files: dict[Access | None, tuple[int, int, int]] = {}
        self._dirs: dict[Access | None, tuple[int, int, int]] = {}
        #: the last answer, by identity: the chunks of a shard share one `access` object
        self._last: tuple[bool, object, tuple[int, int, int]] = (False, (), (0, 0, 0))

    def of(self, is_dir: bool, access: Access | None) -> tuple[int, int, int]:
        """(st_mode, st_uid, st_gid) of a directory or regular file shown from `access`."""
        last = self._last
        if access is last[1] and is_dir is last[0]:
            return last[2]
        shown = self._dirs if is_dir else self._files
        found = shown.get(access)
        if found is None:
            if len(shown) >= KEPT:
                shown.clear()
            found = shown[access] = self._make(is_dir, access)
        self._last = (is_dir, access, found)
        return found

    def _make(self, is_dir: bool, access: Access | None) -> tuple[int, int, int]:
        if access is None:
            mode = 0o755 if is_dir else 0o644
            uid, gid = self._mounter
        else:
            mode = stat.S_IMODE(access[0]) & (0o1777 if is_dir else 0o666)
            uid, gid = access[1], access[2]
        if self._read_only:
            mode &= ~0o222
        given = self._dir_mode if is_dir else self._file_mode
        if given is not None:
            mode = given
        uid = uid if self._uid is None else self._uid
        gid = gid if self._gid is None else self._gid
        return (stat.S_IFDIR if is_dir else stat.S_IFREG) | mode, uid, gid

    def covers(self, shown_from: Access | None, needs: Iterable[Need]) -> bool:
        """Whether every user who may read a file shown from `shown_from` may also do, as
        the mount shows them, what each need asks of a file or directory. Who is in which
        group is not looked up: a user who may be a member is taken to be one where that
        denies, and one who may not where that denies."""
        mode, uid, gid = self.of(False, shown_from)
        return all(
            _may(mode, uid, gid, self.of(is_dir, access), bits) for is_dir, access, bits in needs
        )


def _may(mode: int, uid: int, gid: int, other: tuple[int, int, int], bits: int) -> bool:
    """Whether each class of users that `mode` (owned by `uid`, group `gid`) lets read
    has `bits` on a file shown as `other`, whoever in that class asks."""
    other_mode, other_uid, other_gid = other
    as_owner = (other_mode >> 6) & bits == bits
    as_group = (other_mode >> 3) & bits == bits
    as_other = other_mode & bits == bits
    # the owner (root may do anything), who may or may not be in `other_gid`
    owner = uid == 0 or (as_owner if uid == other_uid else as_group and as_other)
    # a member of `gid` but `uid`: maybe `other_uid`; in `other_gid` surely if it is `gid`
    group = (as_owner or other_uid == uid) and as_group and (as_other or other_gid == gid)
    # anyone else: maybe `other_uid`; maybe in `other_gid`, unless that is `gid`
    rest = (as_owner or other_uid == uid) and (as_group or other_gid == gid) and as_other
    return (
        (owner or not mode & 0o400) and (group or not mode & 0o040) and (rest or not mode & 0o004)
    )
