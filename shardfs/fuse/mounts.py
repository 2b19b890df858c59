"""The system's mount table, and unmounting through fusermount3."""

from __future__ import annotations

import os
import re
import subprocess


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_type(path: str) -> str | None:
    """The file system type mounted exactly at `path` (e.g. "fuse.shardfs"), or None."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return None
    found = None
    for line in lines:
        fields = line.split()
        if _unescape(fields[4]) == real:
            dash = fields.index("-")
            found = fields[dash + 1]  # the last mount on top wins
    return found


def unmount(path: str, lazy: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `fusermount3 -u` (with `-z` if `lazy`); the caller checks the result."""
    args = ["fusermount3", "-u", *(["-z"] if lazy else []), path]
    return subprocess.run(args, capture_output=True, text=True, check=False)
