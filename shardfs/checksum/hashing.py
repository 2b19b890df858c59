"""md5 of stored bytes, in a thread pool.

hashlib releases the GIL on buffers over 2 KiB and reads release it while
they wait, so threads hash on every core. Small objects are hashed in
batches (one pool task costs about as much as hashing a few KiB), big ones
are read in pieces, so memory stays bounded whatever the object sizes.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from collections.abc import Callable, Hashable, Iterable, Iterator
from functools import partial
from typing import TypeVar

from shardfs.storage.base import Stat, Storage
from shardfs.view.namespace import Reader

T = TypeVar("T")

#: Bytes read with one request when streaming an object or a shard.
PIECE = 16 << 20
#: Most files in one pool task.
BATCH_FILES = 512


def default_workers(storage: Storage) -> int:
    """Threads: one per core (more only contend for the GIL over small chunks), and more
    where each request waits for a round trip (S3)."""
    cores = os.cpu_count() or 1
    return max(cores, 16) if storage.request_cost else cores


def md5_range(storage: Storage, key: str, offset: int, nbytes: int, version: Hashable) -> str:
    """The md5 hex of `nbytes` bytes of `key` from `offset`, read in pieces of PIECE bytes."""
    md5 = hashlib.md5()
    for start in range(offset, offset + nbytes, PIECE):
        md5.update(storage.read(key, start, min(PIECE, offset + nbytes - start), version))
    return md5.hexdigest()


def md5_reader(reader: Reader) -> str:
    """The md5 hex of a whole file of the view, read in pieces of PIECE bytes."""
    md5 = hashlib.md5()
    for offset in range(0, reader.size, PIECE):
        md5.update(reader.read(offset, PIECE))
    return md5.hexdigest()


def batches(items: Iterable[T], size: Callable[[T], int]) -> Iterator[list[T]]:
    """`items` in lists of at most BATCH_FILES items and (unless one item is bigger) PIECE bytes."""
    batch: list[T] = []
    total = 0
    for item in items:
        nbytes = size(item)
        if batch and (total + nbytes > PIECE or len(batch) == BATCH_FILES):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += nbytes
    if batch:
        yield batch


def parallel(tasks: Iterable[Callable[[], T]], workers: int) -> Iterator[T]:
    """The results of `tasks`, run by `workers` threads, in the order they finish.

    At most two tasks per worker are queued at a time, so tasks that hold
    read data do not pile up. The first failure cancels the rest and is raised.
    """
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="md5") as pool:
        pending: set[concurrent.futures.Future[T]] = set()
        try:
            for task in tasks:
                if len(pending) >= 2 * workers:
                    done, pending = concurrent.futures.wait(
                        pending, return_when=concurrent.futures.FIRST_COMPLETED
                    )
                    yield from (future.result() for future in done)
                pending.add(pool.submit(task))
            for future in concurrent.futures.as_completed(pending):
                yield future.result()
        finally:
            for future in pending:
                future.cancel()


def hash_objects(
    storage: Storage, objects: list[tuple[str, Stat]], workers: int
) -> Iterator[list[tuple[str, str, int]]]:
    """(key, md5 hex, size) of every object, in lists as batches finish."""

    def task(batch: list[tuple[str, Stat]]) -> list[tuple[str, str, int]]:
        return [
            (key, md5_range(storage, key, 0, st.size, st.version), st.size) for key, st in batch
        ]

    jobs = batches(objects, lambda item: item[1].size)
    return parallel((partial(task, batch) for batch in jobs), workers)
