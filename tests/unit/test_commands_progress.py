"""`decant pack` progress: a tqdm bar with a rate on a terminal, not one byte of it elsewhere.

The command runs in its own process (`python -m vfs.commands`) with stderr on a pseudo-terminal
or a pipe, packing a 256 MiB uint16 stack so the bar has time to show a rate; checks that
need no rate pack a 16 MiB one.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

import vfs

CHECKOUT = Path(vfs.__file__).resolve().parents[1]  # this worktree's vfs, not an installed one
PLANES, HEIGHT, WIDTH = 64, 1024, 2048  # 64 × 4 MiB = 256 MiB of uint16
RATE = re.compile(rb"\d+(\.\d+)?[kMG]?B/s")  # a measured rate; the first draw says "?B/s"
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n
TIMEOUT = 120.0


def write_stack(path: Path, planes: int, height: int, width: int) -> Path:
    """A smooth field plus noise, so blosc works for its ratio as on real data."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    field = 2000 + 1000 * np.sin(x / 97) * np.cos(y / 53)
    data = np.empty((planes, height, width), np.uint16)
    for z in range(planes):
        data[z] = field + 30 * z + rng.normal(0, 20, field.shape)
    tifffile.imwrite(path, data, imagej=True, metadata={"axes": "ZYX"})
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_stack(tmp_path_factory.mktemp("stack") / "stack.tif", PLANES, HEIGHT, WIDTH)
    assert path.stat().st_size >= 256 << 20
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stack(tmp_path_factory.mktemp("small") / "small.tif", 16, 512, 1024)


def decant_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(CHECKOUT))
    env.pop("TQDM_DISABLE", None)
    return env


def run_on_tty(args: list[str], rows: int = 24, cols: int = 100) -> tuple[int, bytes, bytes]:
    """`decant ARGS` with stderr on a pseudo-terminal of rows×cols: (status, stdout, tty bytes)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    with subprocess.Popen(
        [sys.executable, "-m", "vfs.commands", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=decant_env(),
    ) as proc:
        os.close(slave)
        tty = read_until_closed(master)
        out = proc.stdout.read() if proc.stdout else b""
        status = proc.wait(timeout=TIMEOUT)
    return status, out, tty


def read_until_closed(master: int) -> bytes:
    """Drain the terminal while the command runs (a full pty would block it); EIO means closed."""
    chunks, deadline = [], time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # Linux: EIO once every slave descriptor is closed
                    break
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(master)
    return b"".join(chunks)


def run_piped(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "vfs.commands", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=decant_env(),
        timeout=TIMEOUT,
        check=False,
    )


def test_terminal_shows_a_bar_with_a_rate(stack: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.zarr.zip"
    started = time.monotonic()
    status, stdout, tty = run_on_tty(["pack", str(stack), "-o", str(out)])
    elapsed = time.monotonic() - started
    assert status == 0, tty.decode(errors="replace")
    assert b"packing stack.tif" in tty and b"%|" in tty and b"\r" in tty, tty[:400]
    assert RATE.search(tty), tty[-400:]
    assert b"268M" in tty  # the total, in SI bytes
    assert stdout.startswith(str(stack).encode()) and b"byte-exact" in stdout
    assert out.is_file() and elapsed < 60, elapsed


def test_a_terminal_without_a_size_still_shows_the_bar(small: Path, tmp_path: Path) -> None:
    """`script -c` from a non-terminal gives a 0×0 tty, where tqdm alone draws nothing."""
    status, _, tty = run_on_tty(["pack", str(small), "-o", str(tmp_path / "a.zarr.zip")], 0, 0)
    assert status == 0
    assert b"packing small.tif" in tty and b"%|" in tty, tty[:400]


def test_piped_stderr_gets_no_control_characters(stack: Path, tmp_path: Path) -> None:
    done = run_piped(["pack", str(stack), "-o", str(tmp_path / "a.zarr.zip")])
    assert done.returncode == 0, done.stderr
    assert not CONTROL.search(done.stderr) and b"\x1b" not in done.stderr
    assert done.stderr == b""
    assert b"byte-exact" in done.stdout and not CONTROL.search(done.stdout)


@pytest.mark.parametrize("where", ["after", "before"])
def test_quiet_prints_nothing(where: str, small: Path, tmp_path: Path) -> None:
    """-q after the subcommand or before it: no bar even on a terminal, no result line."""
    pack = ["pack", str(small), "-o", str(tmp_path / "a.zarr.zip")]
    args = [*pack, "-q"] if where == "after" else ["-q", *pack]
    status, stdout, tty = run_on_tty(args)
    assert (status, stdout, tty) == (0, b"", b"")


def test_verify_bar_and_quiet_verify(small: Path, tmp_path: Path) -> None:
    """verify draws its own bar on a terminal; quiet, a passing verify says nothing at all."""
    archive = tmp_path / "a.zarr.zip"
    assert run_piped(["-q", "pack", str(small), "-o", str(archive)]).returncode == 0
    status, stdout, tty = run_on_tty(["verify", str(archive)])
    assert status == 0 and stdout.startswith(b"OK")
    assert b"verifying a.zarr.zip" in tty, tty[:400]
    assert run_on_tty(["verify", "-q", str(archive)]) == (0, b"", b"")
