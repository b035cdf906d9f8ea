"""Real mounts: start `decant-mount` in a subprocess, wait for the mount, always unmount after."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.toolbox import load_tool

ROOT = Path(__file__).resolve().parents[2]
HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs /dev/fuse and fusermount3 (apt install fuse3)")
    for item in items:
        if "tests/mount/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.mount)
            if not HAVE_FUSE:
                item.add_marker(skip)


def is_mounted(mnt: Path) -> bool:
    target = str(mnt)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def abort_connection(mnt: Path) -> None:
    """Abort a FUSE connection through fusectl (unblocks a daemon stuck in the kernel)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mnt):
            minor = fields[2].split(":")[1]
            abort = Path(f"/sys/fs/fuse/connections/{minor}/abort")
            if abort.exists():
                abort.write_text("1")


@dataclass
class Mount:
    src: Path
    mnt: Path
    log: Path
    index: Path
    proc: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)

    def start(self, *extra: str, wait: bool = True) -> Mount:
        self.extra = list(extra)
        self.mnt.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "vfs.cli", str(self.src), str(self.mnt), "-f",
               "--log-file", str(self.log), "--index-dir", str(self.index), *extra]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if wait:
            self.wait_mounted()
        return self

    def wait_mounted(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if is_mounted(self.mnt):
                os.listdir(self.mnt)  # the session loop answers: the mount is live
                return
            assert self.proc is not None
            if self.proc.poll() is not None:
                _out, err = self.proc.communicate()
                raise AssertionError(f"decant-mount exited {self.proc.returncode}: {err.decode()}")
            time.sleep(0.05)
        raise AssertionError(f"{self.mnt} not mounted after {timeout} s")

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> int | None:
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], check=False,
                           capture_output=True)  # fmt: skip
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            abort_connection(self.mnt)  # a hung daemon may sit in D state: sever it first
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=15)
            return None
        finally:
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def make_mount(tmp_path: Path) -> Iterator[object]:
    mounts: list[Mount] = []

    def factory(src: Path, *extra: str, name: str = "mnt", wait: bool = True) -> Mount:
        m = Mount(src, tmp_path / name, tmp_path / f"{name}.log", tmp_path / f"{name}-index")
        mounts.append(m)
        return m.start(*extra, wait=wait)

    yield factory
    for m in mounts:
        m.stop()


@pytest.fixture(scope="session")
def mount_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(originals folder, SRC folder of their archives): the small corpus, each file packed."""
    from vfs.decant.packer import default_archive_name, pack_file

    base = tmp_path_factory.mktemp("mount-corpus")
    originals, src = base / "originals", base / "src"
    src.mkdir()
    for path in load_tool("make_corpus").generate(originals, "small"):
        pack_file(path, src / default_archive_name(path))
    return originals, src
