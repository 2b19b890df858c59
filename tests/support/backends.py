"""One source, two backends: a mount test written once runs on a local directory and on S3.

A `Source` says what `shardfs mount` is given (a directory or an s3:// URL
with its options) and how the independent tools reach the same data directly,
bypassing shardfs: a zarr-python 3 store, a tensorstore kvstore, and the list
of stored keys.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3 import MotoServer, S3Env, S3Proxy

BACKENDS = ["local", "s3"]


@dataclass
class Source:
    """A source below `root` (a local path, or a prefix of `s3.bucket`)."""

    root: str
    s3: S3Env | None = None
    options: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The SOURCE argument of `shardfs mount`."""
        return self.root if self.s3 is None else self.s3.url(self.root)

    def zarr_store(self, sub: str = "") -> Any:
        """Where zarr-python 3 reads and writes `sub` of the source directly."""
        if self.s3 is None:
            return Path(self.root, sub)
        return self.s3.zarr_store(_join(self.root, sub))

    def kvstore(self, sub: str = "") -> Any:
        """A tensorstore kvstore spec of `sub` of the source."""
        if self.s3 is None:
            return {"driver": "file", "path": f"{Path(self.root, sub)}/"}
        return self.s3.tensorstore_kvstore(_join(self.root, sub))

    def files(self) -> list[str]:
        """Every stored object below the root, relative to it, outside the private area."""
        if self.s3 is not None:
            base = f"{self.root}/"
            return sorted(key[len(base) :] for key in self.s3.keys(base))
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            if Path(dirpath) == Path(self.root):
                dirnames[:] = [d for d in dirnames if d != ".shardfs"]
            found += [os.path.relpath(os.path.join(dirpath, f), self.root) for f in filenames]
        return sorted(found)

    def read(self, key: str) -> bytes:
        if self.s3 is None:
            return Path(self.root, key).read_bytes()
        return self.s3.get(_join(self.root, key))


def _join(prefix: str, sub: str) -> str:
    return f"{prefix}/{sub}" if sub else prefix


def make_source(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Source:
    """An empty source on `backend`; the S3 one in a bucket of the test's own."""
    if backend == "local":
        return Source(str(tmp_path / "src"))
    s3: S3Env = request.getfixturevalue("s3")
    return Source("src", s3, s3.mount_options())


@contextmanager
def bucket(server: MotoServer, name: str) -> Iterator[S3Env]:
    """A bucket behind a proxy of its own, for fixtures wider than one test."""
    env = S3Env(server, S3Proxy(server.endpoint), name)
    env.create_bucket()
    try:
        yield env
    finally:
        env.proxy.stop()
        env.remove_bucket()


@pytest.fixture(params=BACKENDS)
def src(request: pytest.FixtureRequest, tmp_path: Path) -> Source:
    """An empty source, once on each backend."""
    return make_source(request.param, tmp_path, request)
