"""The object store killed during an upload: `decant pack -o s3://…` and `put_verified` fail with
a clear error, nothing (half or whole) appears under the key, the local source is untouched, and
the same command succeeds once the server is back.

These tests run their own SeaweedFS (the session's must not die) behind a small TCP proxy that
SIGKILLs the server, by its PID, once a set number of request bytes has passed through it:
the server dies in the middle of the upload's body, at a byte count, not at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import obstore
import pytest
from obstore.store import S3Store

from tests.toolbox import load_tool
from vfs.stores.s3 import S3Folder, S3Options
from vfs.stores.upload import UploadError, put_verified

Cli = Callable[..., tuple[int, str, str]]
seaweed: ModuleType = load_tool("seaweed")
MiB = 1 << 20
BUCKET = "faults"


class KillingProxy:
    """Forwards 127.0.0.1:port to the S3 port; once armed, kills the server after `after`
    more client bytes and drops every connection."""

    def __init__(self, server: object) -> None:
        self.server = server
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.after: int | None = None
        self.sent = 0
        self.tripped = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, after: int) -> None:
        with self._lock:
            self.after, self.sent = after, 0
            self.tripped.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.server.s3_port))  # type: ignore[attr-defined]
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counts: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if counts and self._count(len(data)):
                    return
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _count(self, n: int) -> bool:
        with self._lock:
            self.sent += n
            trip = self.after is not None and self.sent >= self.after
            if trip:
                self.after = None
        if trip:
            self.server.proc.kill()  # type: ignore[attr-defined]  # our own weed, by its PID
            self.server.proc.wait(timeout=10)  # type: ignore[attr-defined]
            with self._lock:
                for conn in self._conns:
                    with contextlib.suppress(OSError):
                        conn.close()
                self._conns.clear()
            self.tripped.set()
        return trip

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def doomed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, KillingProxy]]:
    """A SeaweedFS of this module's own, restartable on the same ports and data."""
    weed = seaweed.weed_binary()
    assert weed is not None
    server = seaweed.SeaweedServer(tmp_path_factory.mktemp("doomed"), weed)
    ports: list[int] = []
    real_free_ports = seaweed.free_ports

    def same_ports(count: int) -> list[int]:
        if not ports:
            ports.extend(real_free_ports(count))
        return list(ports)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(seaweed, "free_ports", same_ports)  # a restart keeps ports (and volumes)
        server.start()
        proxy = KillingProxy(server)
        try:
            for key, value in server.env().items():
                mp.setenv(key, value)
            mp.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
            server.create_bucket(BUCKET)
            yield server, proxy
        finally:
            proxy.close()
            server.stop()


def restart(server: object) -> None:
    """Start the killed server again. Without the AWS_* variables: `weed` given them makes them
    its only identity, and its unsigned readiness probe is then refused (403)."""
    if server.proc is not None and server.proc.poll() is None:  # type: ignore[attr-defined]
        return
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("AWS_")]:
            mp.delenv(name)
        server.start(timeout=60)  # type: ignore[attr-defined]


def visible(key: str) -> list[str]:
    """Every key the store lists under `key` (the object and anything starting with it)."""
    store = S3Store(BUCKET, client_options={"allow_http": True})
    return [m["path"] for batch in obstore.list(store, prefix=key) for m in batch]


def sha(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_pack_with_the_server_killed_mid_put(doomed, tmp_path: Path, decant_cli: Cli) -> None:
    server, proxy = doomed
    restart(server)
    src = tmp_path / "noise.bin"
    src.write_bytes(os.urandom(8 * MiB))  # packs verbatim: an 8 MiB archive, one PUT
    before = sha(src)
    url = f"s3://{BUCKET}/runs/noise.bin.zarr.zip"
    proxy.arm(after=3 * MiB)
    status, out, err = decant_cli("pack", src, "-o", url, "--s3-retries", "1")
    assert proxy.tripped.is_set(), "the server was not killed: the test proved nothing"
    assert (status, out) == (3, "")
    assert err.startswith(f"decant: {url}: upload: ") and err.count("\n") == 1, err
    assert sha(src) == before
    restart(server)
    assert visible("runs/") == []  # no half (or whole) object under the key
    status, out, err = decant_cli("pack", src, "-o", url)  # the retry, server back
    assert (status, err) == (0, "")
    assert f" -> {url}: verbatim" in out
    status, _, err = decant_cli("restore", url, "-o", tmp_path / "back.bin")
    assert (status, err) == (0, "")
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert sha(src) == before


def test_multipart_upload_with_the_server_killed(doomed, tmp_path: Path) -> None:
    server, proxy = doomed
    restart(server)
    blob = tmp_path / "big.bin"
    blob.write_bytes(os.urandom(16 * MiB + 3))
    before = sha(blob)
    folder = S3Folder(f"s3://{BUCKET}/mp", S3Options(retries=1, retry_timeout=5))
    proxy.arm(after=7 * MiB)  # past the first 5 MiB part, inside the second
    with pytest.raises(UploadError, match=r"s3://faults/mp/big\.bin: upload: "):
        put_verified(folder, "big.bin", blob, single_put_max=MiB, chunk_size=5 * MiB)
    assert proxy.tripped.is_set()
    assert sha(blob) == before
    restart(server)
    assert visible("mp/") == []
    done = put_verified(folder, "big.bin", blob, single_put_max=MiB, chunk_size=5 * MiB)
    assert done.etag.strip('"').endswith("-4")
    assert visible("mp/") == ["mp/big.bin"]
    assert sha(blob) == before
