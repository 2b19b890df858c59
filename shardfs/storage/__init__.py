"""Where the source lives. One interface (`Storage`), one class per backend."""

from shardfs.storage.base import Entry, Stat, Storage
from shardfs.storage.local import LocalStorage

__all__ = ["Entry", "LocalStorage", "Stat", "Storage"]
