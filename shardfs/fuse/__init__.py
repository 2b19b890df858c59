"""The FUSE front end: the pyfuse3 adapter and the mount daemon."""

from shardfs.fuse.adapter import MountConfig, Operations, errno_for

__all__ = ["MountConfig", "Operations", "errno_for"]
