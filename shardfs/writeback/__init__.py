"""Write-back: what is written through a read-write mount, buffered and committed to shards."""

from shardfs.writeback.buffer import WriteBuffer
from shardfs.writeback.workspace import Handle, Workspace

__all__ = ["Handle", "Workspace", "WriteBuffer"]
