"""A hostile local user against a mount run by root, round 28: packages and archives read through
`vfs.stores.local.LocalFile` (O_DIRECT loads), and files swapped under the daemon.

Each test here failed on the code it was written against. No timing is asserted: a join with a
long timeout only tells a hang from an answer.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.mount.conftest import RUNUSER, SYSTEM_PYTHON, Mount, User, open_tmp
from tests.toolbox import load_tool

c4gh_corpus: ModuleType = load_tool("make_c4gh_corpus")
HANG = 30.0  # seconds: an open still waiting after this waits for a FIFO's writer


def _c4gh_src(src: Path, keys: Path) -> tuple[list[str], Path, Path]:
    node, writer = (c4gh_corpus.make_keypair(keys, n) for n in ("node", "writer"))
    members = c4gh_corpus.gdi_members(parquet_rows=(300, 40))
    c4gh_corpus.write_package(src / "p.tar.c4gh", members, writer, [node])
    return (
        ["--c4gh-key", str(node.secret_path)],
        src / "p.tar.c4gh",
        Path("p.tar.c4gh", members[0][0]),
    )


def test_a_fifo_renamed_over_an_open_package_holds_no_thread(
    tmp_path: Path, make_mount: Any
) -> None:
    """The package's owner renames a FIFO over it while a member is open; opening the member
    again (through /proc/self/fd: no lookup that would notice the swap first) must answer, not
    leave a daemon thread waiting in open(2) for a writer (for good once the FIFO is unlinked:
    40 such opens stop every worker-thread call of the mount, the opener sits in D state, and
    SIGTERM no longer ends the daemon). A decant archive's open has the same gap, behind an
    is_file() check a moment before (a race, not reproduced here)."""
    src = tmp_path / "src"
    src.mkdir()
    args, package, member = _c4gh_src(src, tmp_path / "keys")
    m: Mount = make_mount(src, *args)
    fd = os.open(m.mnt / member, os.O_RDONLY)
    try:
        assert os.read(fd, 16)
        os.mkfifo(tmp_path / "fifo")
        os.rename(tmp_path / "fifo", package)
        got: list[int] = []

        def reopen() -> None:
            try:
                os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY))
                got.append(0)
            except OSError as exc:
                got.append(exc.errno or -1)

        opener = threading.Thread(target=reopen, daemon=True)
        opener.start()
        opener.join(HANG)
        assert not opener.is_alive(), "open of a member whose package is now a FIFO hangs"
        assert got in ([errno.ESTALE], [errno.ENOENT]), (got, m.log_text())
        assert "not a regular file" in m.log_text()
        assert sorted(os.listdir(m.mnt)) == []  # the FIFO is not listed; the mount answers
    finally:
        os.close(fd)


# As the user: open the member of each package given until the daemon says EMFILE, reading each
# whole; print how many, then hold them until stdin closes.
HOLD_READ = """
import os, sys
fds = []
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        break
    fds.append(fd)
    while os.read(fd, 1 << 20):
        pass
print(len(fds), flush=True)
sys.stdin.read()
"""
FD_LIMIT = 256  # the daemon's: a user may hold a quarter of it (64 descriptors)


class LimitedMount(Mount):
    """A mount whose daemon starts with an open-files limit of FD_LIMIT (soft and hard)."""

    def start(self, *extra: str, wait: bool = True) -> Mount:
        self.extra = list(extra)
        self.mnt.mkdir(parents=True, exist_ok=True)
        cmd = ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", sys.executable, "-m", "vfs.cli",
               str(self.src), str(self.mnt), "-f", "--log-file", str(self.log),
               "--index-dir", str(self.index), *extra]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if wait:
            self.wait_mounted()
        return self


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_one_users_c4gh_handles_hold_at_most_a_quarter_of_the_daemons_descriptors(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A member read past the page cache holds two descriptors of the daemon (the package's,
    and its O_DIRECT twin), but the per-user handle cap (a quarter of the fd limit) counted
    one a handle: a user's handles held half the daemon's descriptors, two users all of
    them (every other open, and publishing, EMFILE)."""
    base = open_tmp(tmp_path_factory, "rt28-fds")
    src = base / "src"
    src.mkdir()
    node, writer = (c4gh_corpus.make_keypair(base / "keys", n) for n in ("node", "writer"))
    first = src / "p000.tar.c4gh"
    c4gh_corpus.write_package(
        first, c4gh_corpus.with_manifest([("m.bin", os.urandom(600 << 10))]), writer, [node]
    )
    packages = [first] + [src / f"p{i:03d}.tar.c4gh" for i in range(1, FD_LIMIT // 2)]
    for package in packages:
        if package != first:
            package.write_bytes(first.read_bytes())
        package.chmod(0o644)
        fd = os.open(package, os.O_RDONLY)
        os.fsync(fd)  # clean pages can be dropped: reads then load from disk, past the cache
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    m = LimitedMount(src, base / "mnt", base / "log", base / "index")
    m.start("-o", "allow_other", "--c4gh-key", str(node.secret_path), "--c4gh-mode", "0444")
    holder = None
    try:
        assert m.proc is not None
        before = _fds(m.proc.pid)
        members = [str(m.mnt / p.name / "m.bin") for p in packages]
        holder = subprocess.Popen([RUNUSER, "-u", unprivileged.name, "--", str(SYSTEM_PYTHON),
                                   "-I", "-c", HOLD_READ, *members], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env={"PATH": "/usr/bin:/bin"}, cwd="/")  # fmt: skip
        assert holder.stdout is not None
        held = int(holder.stdout.readline())
        assert 0 < held < len(members), held  # the cap was reached
        grown = _fds(m.proc.pid) - before
        assert grown <= FD_LIMIT // 4, f"{held} handles of one user hold {grown} descriptors"
    finally:
        if holder is not None:
            holder.communicate(input="", timeout=60)
        m.stop()


def test_names_of_247_to_255_bytes_are_copied_in_and_published(
    tmp_path: Path, make_mount: Any
) -> None:
    """A name whose archive name (NAME.zarr.zip) is longer than NAME_MAX: creating it failed
    with ENAMETOOLONG (the check for an archive of the name lstat-ed that name), so `rsync -a`
    lost a 240-byte name (its temp name is longer) and a 255-byte one; and once created, such a
    file (a TIFF too) failed to publish for good, left spooled. Each is published under its
    name with its bytes: a TIFF whose archive cannot be named as it is."""
    from tests.mount.test_write_side import spooled, wait_drained

    src = tmp_path / "src"
    src.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    tif = tifffile_bytes()
    names = {"p" * 240: b"240\n", "q" * 255: b"255\n", "t" * 246 + ".tif": tif}
    for name, body in names.items():
        (data / name).write_bytes(body)
    m: Mount = make_mount(src, "--settle", "0.2")
    done = subprocess.run(["rsync", "-a", f"{data}/", f"{m.mnt}/"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_drained(m.mnt, src)
    for name, body in names.items():
        assert (src / name).read_bytes() == body, name[:8]
        assert (m.mnt / name).read_bytes() == body, name[:8]
    assert spooled(src) == []


def tifffile_bytes() -> bytes:
    import io

    import numpy as np
    import tifffile

    out = io.BytesIO()
    tifffile.imwrite(out, np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
    return out.getvalue()
