"""md5 of stored bytes, in a thread pool, results in the order of the walk that asked.

hashlib releases the GIL on buffers over 2 KiB and reads release it while
they wait, so threads hash on every core. Small objects are hashed in
batches (one pool task costs about as much as hashing a few KiB), big ones
are read in pieces, so memory stays bounded whatever the object sizes: at
most READ_BUDGET bytes are read at a time by all threads together, and only
a few batches' digests wait for their turn to be folded.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

from shardfs.checksum.tree import Digest, DirectoryChecksum, Fold, Item
from shardfs.maintenance.progress import quiet
from shardfs.maintenance.report import format_size
from shardfs.storage.base import Storage
from shardfs.view.base import Reader

T = TypeVar("T")

#: Files of one directory hashed by one task, in the walk's order: (directory, entries).
Block = tuple[str, list[Item]]

#: Bytes read with one request when streaming an object or a shard (at most).
PIECE = 16 << 20
#: Bytes all threads read at a time (at most, bar single chunks bigger than a piece).
READ_BUDGET = 64 << 20
#: Most files in one pool task.
BATCH_FILES = 512
#: Tasks per thread submitted ahead of the one whose result is due.
AHEAD = 4


def default_workers(storage: Storage) -> int:
    """Threads: one per core (more only contend for the GIL over small chunks), and more
    where each request waits for a round trip (S3)."""
    cores = os.cpu_count() or 1
    return max(cores, 16) if storage.request_cost else cores


def piece_size(workers: int) -> int:
    """The bytes one task reads at a time: PIECE, less where many threads would together
    read more than READ_BUDGET (on S3, 16 threads wait for round trips)."""
    return min(PIECE, max(1 << 20, READ_BUDGET // workers))


def md5_range(
    storage: Storage, key: str, offset: int, nbytes: int, version: Hashable, piece: int
) -> str:
    """The md5 hex of `nbytes` bytes of `key` from `offset`, read in pieces of `piece` bytes."""
    md5 = hashlib.md5()
    for start in range(offset, offset + nbytes, piece):
        md5.update(storage.read(key, start, min(piece, offset + nbytes - start), version))
    return md5.hexdigest()


def md5_reader(reader: Reader, piece: int | None = None) -> str:
    """The md5 hex of a whole file of the view, read in pieces of `piece` (PIECE) bytes."""
    piece = piece or PIECE
    md5 = hashlib.md5()
    for offset in range(0, reader.size, piece):
        md5.update(reader.read(offset, piece))
    return md5.hexdigest()


def batches(
    items: Iterable[T], weight: Callable[[T], tuple[int, int]], piece: int
) -> Iterator[list[T]]:
    """`items` in lists of at most BATCH_FILES files and (unless one item is bigger) `piece`
    bytes, an item's `weight` being its (files, bytes)."""
    batch: list[T] = []
    files = nbytes = 0
    for item in items:
        more, size = weight(item)
        if batch and (nbytes + size > piece or files + more > BATCH_FILES):
            yield batch
            batch, files, nbytes = [], 0, 0
        batch.append(item)
        files += more
        nbytes += size
    if batch:
        yield batch


def ordered(tasks: Iterable[Callable[[], T]], workers: int) -> Iterator[T]:
    """The results of `tasks`, run by `workers` threads, in the order of `tasks`.

    At most AHEAD tasks per thread are submitted ahead of the one whose result
    is due, so the threads keep busy while finished results wait their turn,
    and `tasks` is consumed only that far ahead. The first failure cancels the
    rest and is raised.
    """
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="md5") as pool:
        pending: deque[concurrent.futures.Future[T]] = deque()
        try:
            for task in tasks:
                pending.append(pool.submit(task))
                if len(pending) > AHEAD * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def fold(
    tasks: Iterable[Callable[[], list[Block]]],
    workers: int,
    progress: tqdm | None,
    on_directory: Callable[[DirectoryChecksum], None] | None,
) -> Digest:
    """Run `tasks` in `workers` threads and fold their files in the order of the tasks
    (see `Fold`): the checksum of them all. `progress` counts the files and bytes."""
    progress = quiet() if progress is None else progress
    tree = Fold(on_directory)
    nbytes = 0
    for blocks in ordered(tasks, workers):
        files = 0
        for directory, entries in blocks:
            tree.add_files(directory, entries)
            files += len(entries)
            nbytes += sum(size for _, _, size in entries)
        progress.set_postfix_str(format_size(nbytes), refresh=False)
        progress.update(files)
    return tree.finish()
