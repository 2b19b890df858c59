"""Progress bars of the long commands (`checksum`, `info`, `fsck`, `compact`), made by tqdm.

On a terminal a bar redraws one line in place (tqdm: at most ten times a
second); anywhere else (a log, a pipe) it is off (tqdm's `disable=None`), so no
control characters end up in files. A bar starts with the listing walk, as a
count of what is found so far (`update`), and becomes a bar of the known total
once the walk is done (`walked`); library code takes an optional bar and works
with `quiet()` when given none.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm

#: The label shown after the count while the listing walk runs.
LISTING = "listing"


def progress_bar(
    label: str, unit: str, stream: TextIO | None = None, leave: bool = True, **options: Any
) -> tqdm:
    """A bar on `stream` (default stderr), shown only if it is a terminal. With `leave` its
    final line stays; without, the bar is erased when done (for commands whose report
    follows on the same terminal). `options` go to tqdm (tests: `mininterval=0`)."""
    return tqdm(
        desc=label,
        unit=f" {unit}",  # tqdm writes it right after the number
        file=sys.stderr if stream is None else stream,
        disable=None,
        leave=leave,
        dynamic_ncols=True,
        postfix=LISTING,
        **options,
    )


def quiet() -> tqdm:
    """A bar that shows nothing: for library calls given none."""
    return tqdm(disable=True)


def walked(bar: tqdm, total: int) -> None:
    """The walk is done: from now on the bar counts the work done, of `total`."""
    bar.set_postfix_str("", refresh=False)
    bar.reset(total=total)
