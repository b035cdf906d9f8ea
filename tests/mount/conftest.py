"""Real mounts: start `decant-mount` in a subprocess, wait for the mount, always unmount after."""

from __future__ import annotations

import atexit
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.toolbox import load_tool
from vfs.mount.racy import RACY_NS

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
            time.sleep(0.01)  # hundreds of mounts a run: 50 ms steps cost ~10 s of the suite
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


# -- an unprivileged local user, for access-control tests --------------------------------------

TEST_USER = "decant-test-user"
RUNUSER = "/usr/sbin/runuser"
SYSTEM_PYTHON = Path("/usr/bin/python3")  # the venv's python may sit where the user cannot reach
# Runs one expression as the user; prints {"errno": N} if it raised OSError, else {"ok": value}.
PROBE = """
import errno, hashlib, json, os, stat, sys
def read(p):
    with open(p, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()
def write(p, data=b"x", flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o644):
    fd = os.open(p, flags, mode)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)
names = json.loads(sys.argv[2])
try:
    value = eval(sys.argv[1], {"os": os, "stat": stat, "read": read, "write": write, **names})
except OSError as exc:
    print(json.dumps({"errno": exc.errno}))
else:
    print(json.dumps({"ok": value}, default=repr))
"""


@dataclass(frozen=True)
class User:
    """A local user without privileges, acting on paths through real syscalls."""

    name: str
    uid: int
    gid: int

    def run(self, *cmd: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
        """`cmd` as this user: its ids and groups, no capabilities. runuser, not setpriv: setpriv
        resolves the program's path while it still holds root's capabilities, so it would run
        a program from a folder the user cannot enter."""
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        as_user = [RUNUSER, "-u", self.name, "--", *cmd]
        return subprocess.run(as_user, capture_output=True, text=True, timeout=timeout, cwd="/",
                              env=env, check=False)  # fmt: skip

    def _probe(self, expr: str, names: dict[str, Any]) -> dict[str, Any]:
        args = {k: str(v) if isinstance(v, Path) else v for k, v in names.items()}
        done = self.run(str(SYSTEM_PYTHON), "-I", "-c", PROBE, expr, json.dumps(args))
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def errno_of(self, expr: str, **names: Any) -> int:
        """The errno the user's expression (`os.…`, `read(p)`, `write(p)`) failed with; 0 if
        it succeeded."""
        return int(self._probe(expr, names).get("errno", 0))

    def value_of(self, expr: str, **names: Any) -> Any:
        """What the user's expression returned; fails the test if it raised."""
        result = self._probe(expr, names)
        assert "ok" in result, f"{expr} {names}: errno {result.get('errno')}"
        return result["ok"]


@pytest.fixture(scope="session")
def unprivileged() -> User:
    """`decant-test-user`, created (a system user, no home) if this machine lacks it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a user and runs commands as it")
    if not SYSTEM_PYTHON.exists() or not Path(RUNUSER).exists():
        pytest.skip(f"needs {SYSTEM_PYTHON} and {RUNUSER} (util-linux)")
    try:
        entry = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        TEST_USER], check=True, capture_output=True)  # fmt: skip
        entry = pwd.getpwnam(TEST_USER)
    return User(TEST_USER, entry.pw_uid, entry.pw_gid)


def settle(*paths: Path) -> None:
    """Wait until each of `paths` was last changed more than the racy window ago
    (vfs.mount.racy.RACY_NS): only then does a listing keep its description in the index, which
    a test of what a remount reads from the index needs."""
    newest = max(p.lstat().st_ctime_ns for p in paths) / 1e9
    time.sleep(max(0.0, newest + RACY_NS / 1e9 + 0.05 - time.time()))


def open_tmp(factory: pytest.TempPathFactory, name: str) -> Path:
    """A new temp folder that other users may traverse to (not list).

    Made under a folder of this session's own beside pytest's temp root, not in it: every
    pytest session that starts resets that root to 0700, which would lock the user out of a
    test running meanwhile in another session. `factory` is where its name is numbered."""
    global _OPEN_BASE
    if _OPEN_BASE is None:
        _OPEN_BASE = Path(tempfile.mkdtemp(prefix="decant-tests-"))
        _OPEN_BASE.chmod(0o711)
        atexit.register(_remove_open_base, _OPEN_BASE)
    folder = _OPEN_BASE / factory.mktemp(name).name
    folder.mkdir(mode=0o711)
    folder.chmod(0o711)
    return folder


_OPEN_BASE: Path | None = None


def _remove_open_base(base: Path) -> None:
    """Remove the session's open folders, unless a mount is left inside (never delete through
    one: a leftover mount of SRC would be emptied)."""
    with open("/proc/self/mountinfo") as fh:
        if any(line.split()[4].startswith(f"{base}/") for line in fh):
            return
    shutil.rmtree(base, ignore_errors=True)
