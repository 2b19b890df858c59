"""shardfs: show sharded Zarr arrays as plain, unsharded chunk files."""

__version__ = "0.1.0"
