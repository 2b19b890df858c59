"""The one retry policy: how many times shardfs tries again, and how long it waits between.

A failure is temporary when trying again may succeed without anybody doing
anything: the source changed under a reader or a committer (`SourceChanged`:
another writer stored a new version between two reads), or a store's answer was
cut short (an S3 body that stopped arriving). Everything else is final and is
reported at once. botocore retries its own temporary failures (5xx,
throttling, timeouts) below this, with its standard mode.

Every loop that tries again is written the same way:

    for _ in attempts():
        try:
            return do_it()
        except SourceChanged:
            continue  # changed under us: look again
    raise StorageError(f"{what} keeps changing")
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from shardfs.primitives.blocking import WouldBlock, may_block

#: Tries of one operation, the first included.
ATTEMPTS = 8
#: Tries again at once before the first pause: a change seen once has usually been made
#: whole by the time it is looked at again (a commit is one append or one rename).
AT_ONCE = 2
#: The first pause and the longest: about a second in all, so that a writer appending a
#: big tail has time to finish.
FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.5


def attempts(
    tries: int = ATTEMPTS,
    at_once: int = AT_ONCE,
    first: float = FIRST_PAUSE,
    longest: float = LONGEST_PAUSE,
) -> Iterator[int]:
    """The numbers 0, 1, ... of `tries` tries: the first `at_once` tries again at once,
    then each after a pause twice as long as the last, from `first` up to `longest`, with
    jitter so that processes that collided do not collide again. A pause where waiting
    is not allowed (the event loop, see `shardfs.primitives.blocking`) raises WouldBlock:
    the caller's thread tries again."""
    for attempt in range(tries):
        if attempt > at_once:
            if not may_block():
                raise WouldBlock
            pause = min(longest, first * 2 ** (attempt - at_once - 1))
            time.sleep(pause * (0.5 + random.random()))
        yield attempt
