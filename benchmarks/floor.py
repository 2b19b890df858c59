"""The floors: pyfuse3 + trio daemons whose handlers do nothing (see
benchmarks/harness/floors.py for what each serves and why).

    .venv/bin/python -m benchmarks.floor serve MOUNTPOINT N [--per-dir 100] [--noopen]
        [--size 64] [--counts FILE]
    .venv/bin/python -m benchmarks.floor serve MOUNTPOINT [N] --tree 100,100,100
        [--under data/c] [--noopen] [--size 64] [--counts FILE]
    .venv/bin/python -m benchmarks.floor serve-read SOURCE MOUNTPOINT
    .venv/bin/python -m benchmarks.floor serve-write MOUNTPOINT
"""

import sys

from benchmarks.harness.floors import main

if __name__ == "__main__":
    sys.exit(main())
