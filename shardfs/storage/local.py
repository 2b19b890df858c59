"""A local directory as the source."""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from collections.abc import Hashable
from pathlib import Path

from shardfs.errors import CorruptData, NotADirectory, NotFound, SourceChanged, StorageError
from shardfs.storage.base import Entry, Stat, Storage
from shardfs.storage.blocking import WouldBlock, check_may_block, may_block


def _stat_of(st: os.stat_result) -> Stat:
    is_dir = stat_mod.S_ISDIR(st.st_mode)
    return Stat(
        is_dir=is_dir,
        size=0 if is_dir else st.st_size,
        mtime_ns=st.st_mtime_ns,
        version=(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns),
    )


class LocalStorage(Storage):
    """Objects are the regular files below `root`; other file types are ignored."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise NotFound(key)
        return os.path.join(self.root, key) if key else str(self.root)

    def stat(self, key: str) -> Stat | None:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"{self.describe(key)}: {e.strerror}") from None
        if not (stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode)):
            return None
        return _stat_of(st)

    def list(self, key: str) -> list[Entry]:
        check_may_block()  # a cold listing of a big directory can take long
        try:
            with os.scandir(self._path(key)) as it:
                entries = []
                for entry in it:
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue  # removed while listing
                    if stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode):
                        entries.append(Entry(entry.name, _stat_of(st)))
                return entries
        except FileNotFoundError:
            raise NotFound(key) from None
        except NotADirectoryError:
            raise NotADirectory(key) from None
        except OSError as e:
            raise StorageError(f"{self.describe(key)}: {e.strerror}") from None

    def read(self, key: str, offset: int, length: int, version: Hashable | None = None) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if version is not None:
                raise SourceChanged(f"{self.describe(key)} was removed") from None
            raise NotFound(key) from None
        except OSError as e:
            raise StorageError(f"{self.describe(key)}: {e.strerror}") from None
        try:
            if version is not None and _stat_of(os.fstat(fd)).version != version:
                raise SourceChanged(f"{self.describe(key)} changed")
            data = os.pread(fd, length, offset) if may_block() else _read_cached(fd, offset, length)
        except OSError as e:
            code = errno.errorcode.get(e.errno, "?")
            raise StorageError(f"{self.describe(key)}: read failed ({code})") from None
        finally:
            os.close(fd)
        if len(data) != length:
            raise CorruptData(
                f"{self.describe(key)}: wanted {length} bytes at {offset}, file has only {len(data)}"
            )
        return data

    def describe(self, key: str) -> str:
        return self._path(key)


def _read_cached(fd: int, offset: int, length: int) -> bytes:
    """Read only from the page cache (RWF_NOWAIT); WouldBlock if the disk is needed."""
    buf = bytearray(length)
    try:
        got = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except (BlockingIOError, InterruptedError):
        raise WouldBlock from None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without RWF_NOWAIT
            raise WouldBlock from None
        raise
    if got != length:  # partly cached, or a short file: the blocking read tells which
        raise WouldBlock
    return bytes(buf)
