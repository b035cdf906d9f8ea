"""Containment (README, "Security model"): symlinks in SRC are never followed, and a mountpoint
near or inside SRC never makes the daemon call into itself. Each case is a real mount run by root
with `-o allow_other`; every look runs in a subprocess under a timeout, so a deadlock fails the
test instead of hanging it, and the daemon must still stop on SIGTERM within a few seconds.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.mount.conftest import Mount, User, abort_connection, is_mounted, open_tmp

LOOK_TIMEOUT = 5.0  # seconds any one look at the mount may take: far above a healthy answer
STOP_TIMEOUT = 5.0


@dataclass
class Contained:
    m: Mount
    src: Path


def look(*cmd: str) -> subprocess.CompletedProcess[str]:
    """`cmd` as root, failing the test if it does not finish in time (a daemon deadlocked)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=LOOK_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cmd} hung for {LOOK_TIMEOUT:.0f} s: the daemon no longer answers")


def stops_on_sigterm(m: Mount) -> None:
    assert m.proc is not None and m.proc.poll() is None, "the daemon died"
    m.proc.send_signal(signal.SIGTERM)
    try:
        code = m.proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"daemon still running {STOP_TIMEOUT:.0f} s after SIGTERM")
    assert code == 0, m.log_text()[-2000:]
    assert not is_mounted(m.mnt)


def start(src: Path, mnt: Path, base: Path, *extra: str) -> Mount:
    m = Mount(src, mnt, base / "mnt.log", base / "mnt-index")
    return m.start("-o", "allow_other", *extra)


# -- symlinks out of SRC ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["ro", "rw"])
def links(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> Iterator[Contained]:
    base = open_tmp(tmp_path_factory, f"links-{request.param}")
    src = base / "src"
    src.mkdir(mode=0o755)
    (src / "plain.txt").write_bytes(b"a plain file\n")
    (src / "etc-link").symlink_to("/etc")
    (src / "shadow-link").symlink_to("/etc/shadow")
    (src / "userdir").mkdir(mode=0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    extra = ["-o", "ro"] if request.param == "ro" else ["--settle", "0.5"]
    m = start(src, base / "mnt", base, *extra)
    try:
        yield Contained(m, src)
    finally:
        m.stop()


@pytest.mark.parametrize(
    ("path", "expr"),
    [
        ("etc-link", "os.stat(p)"),
        ("etc-link/shadow", "read(p)"),
        ("etc-link/passwd", "read(p)"),  # world-readable in /etc: still not through the mount
        ("shadow-link", "read(p)"),
    ],
)
def test_symlinks_out_of_src_are_hidden(
    links: Contained, unprivileged: User, path: str, expr: str
) -> None:
    assert unprivileged.errno_of(expr, p=links.m.mnt / path) == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        os.stat(links.m.mnt / path)  # root too: the link is not there at all
    assert unprivileged.value_of("sorted(os.listdir(p))", p=links.m.mnt) == ["plain.txt", "userdir"]
    assert unprivileged.value_of("read(p)", p=links.m.mnt / "plain.txt")  # control


def test_user_links_made_in_src_are_hidden(links: Contained, unprivileged: User) -> None:
    """A folder of SRC the user owns: links made there directly are not shown either."""
    u, userdir = unprivileged, links.src / "userdir"
    assert u.errno_of("os.symlink('/etc/shadow', p)", p=userdir / "shadow") == 0
    assert u.errno_of("os.symlink('/', p)", p=userdir / "root") == 0
    shown = links.m.mnt / "userdir"
    assert look("ls", "-la", str(shown)).returncode == 0
    for name, expr in (("shadow", "read(p)"), ("root", "os.listdir(p)")):
        assert u.errno_of(expr, p=shown / name) == errno.ENOENT
    assert links.m.proc is not None and links.m.proc.poll() is None


def test_no_links_can_be_made_through_the_mount(links: Contained, unprivileged: User) -> None:
    shown, ro = links.m.mnt / "userdir", "ro" in links.m.extra
    got = unprivileged.errno_of("os.symlink('/etc/shadow', p)", p=shown / "made-link")
    assert got in ((errno.EROFS,) if ro else (errno.ENOSYS, errno.EPERM))  # not implemented
    got = unprivileged.errno_of("os.link(a, p)", a=links.m.mnt / "plain.txt", p=shown / "hard")
    assert got == (errno.EROFS if ro else errno.EPERM)
    made = [links.src / "userdir" / n for n in ("made-link", "hard")]
    assert not any(os.path.lexists(p) for p in made)


def inotify_watches(pid: int) -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every inotify watch the process holds, from /proc/PID/fdinfo."""
    found = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            lines = info.read_text().splitlines()
        except OSError:
            continue  # an fd closed meanwhile
        for line in lines:
            if line.startswith("inotify wd:"):
                fields = dict(f.split(":", 1) for f in line.split()[1:] if ":" in f)
                dev, ino = int(fields["sdev"], 16), int(fields["ino"], 16)
                found.add((dev >> 20, dev & 0xFFFFF, ino))  # the kernel's own dev_t encoding
    return found


def real_folders(src: Path) -> set[tuple[int, int, int]]:
    """(major, minor, inode) of SRC and every folder below it, links not followed."""
    out = set()
    for folder, _dirs, _files in os.walk(src):
        st = os.lstat(folder)
        out.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    return out


def test_the_watcher_stays_inside_src(links: Contained) -> None:
    """The daemon never follows a link, its inotify watcher included: a link to `/` would have
    it walk and watch the whole machine (and the mount itself)."""
    assert links.m.proc is not None
    watched = inotify_watches(links.m.proc.pid)
    assert watched, "no inotify watches: is SRC watched at all?"
    outside = watched - real_folders(links.src)
    assert not outside, f"{len(outside)} watches outside SRC, of {len(watched)}"


# -- a mountpoint near SRC: the daemon never calls into itself -----------------------------------

WATCHING = [
    pytest.param([], id="watch"),
    pytest.param(["--no-watch"], id="no-watch"),
]


@contextmanager
def hung_daemon_killed(m: Mount) -> Iterator[Mount]:
    """Stop `m` in any case; a daemon that no longer answers is cut off and killed at once."""
    try:
        yield m
    finally:
        assert m.proc is not None
        if m.proc.poll() is None and is_mounted(m.mnt):
            try:
                subprocess.run(["stat", str(m.mnt)], capture_output=True, timeout=1)
            except subprocess.TimeoutExpired:
                abort_connection(m.mnt)
                m.proc.kill()
        m.stop()


def start_unwaited(src: Path, mnt: Path, base: Path, *extra: str) -> Mount:
    """Started, and in the mount table; whether it answers is for the test to find out."""
    m = Mount(src, mnt, base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--settle", "0.5", *extra, wait=False)
    deadline = time.monotonic() + 30
    while not is_mounted(mnt):
        assert m.proc is not None and m.proc.poll() is None, m.log_text()
        assert time.monotonic() < deadline, "never mounted"
        time.sleep(0.05)
    return m


@pytest.mark.parametrize("watching", WATCHING)
def test_link_to_the_folder_holding_the_mountpoint(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, watching: list[str]
) -> None:
    """SRC/up -> .. where SRC's parent holds MNT: following it would reach the mount itself."""
    base = open_tmp(tmp_path_factory, "up-link")
    src, mnt = base / "src", base / "mnt"
    src.mkdir(mode=0o755)
    (src / "plain.txt").write_bytes(b"a plain file\n")
    (src / "up").symlink_to("..")
    with hung_daemon_killed(start_unwaited(src, mnt, base, *watching)) as m:
        assert sorted(look("ls", str(mnt)).stdout.split()) == ["plain.txt"]
        assert look("stat", str(mnt / "up")).returncode != 0
        walked = look("find", str(mnt))
        assert sorted(walked.stdout.split()) == [str(mnt), str(mnt / "plain.txt")]
        assert unprivileged.errno_of("os.stat(p)", p=mnt / "up/mnt/up") == errno.ENOENT
        assert unprivileged.value_of("sorted(os.listdir(p))", p=mnt) == ["plain.txt"]
        stops_on_sigterm(m)


@pytest.mark.parametrize("watching", WATCHING)
def test_link_planted_by_the_user_at_the_next_start(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, watching: list[str]
) -> None:
    """A user who may write one folder of SRC links it to a folder above the mountpoint (`/`
    would do); the daemon restarts (reboot, remount) and must still serve everyone."""
    base = open_tmp(tmp_path_factory, "planted")
    src, mnt = base / "src", base / "mnt"
    (src / "userdir").mkdir(parents=True, mode=0o755)
    src.chmod(0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    assert unprivileged.errno_of("os.symlink(t, p)", t=base, p=src / "userdir/trap") == 0
    with hung_daemon_killed(start_unwaited(src, mnt, base, *watching)) as m:
        assert look("ls", str(mnt / "userdir")).stdout == ""
        assert unprivileged.errno_of("os.stat(p)", p=mnt / "userdir/trap") == errno.ENOENT
        stops_on_sigterm(m)


@pytest.mark.parametrize("watching", WATCHING)
def test_mountpoint_inside_src(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, watching: list[str]
) -> None:
    """MNT = SRC/mnt: the mount lists SRC without itself, and a walk of it ends."""
    base = open_tmp(tmp_path_factory, "mnt-inside")
    src = base / "src"
    (src / "sub").mkdir(parents=True, mode=0o755)
    src.chmod(0o755)
    (src / "plain.txt").write_bytes(b"a plain file\n")
    (src / "sub" / "deep.txt").write_bytes(b"deeper\n")
    with hung_daemon_killed(start_unwaited(src, src / "mnt", base, *watching)) as m:
        assert sorted(look("ls", str(m.mnt)).stdout.split()) == ["plain.txt", "sub"]
        assert look("stat", str(m.mnt / "mnt")).returncode != 0
        walked = look("find", str(m.mnt))
        assert sorted(walked.stdout.split()) == sorted(
            str(m.mnt / p) for p in ("", "plain.txt", "sub", "sub/deep.txt")
        )
        assert unprivileged.value_of("sorted(os.listdir(p))", p=m.mnt) == ["plain.txt", "sub"]
        assert unprivileged.errno_of("os.stat(p)", p=m.mnt / "mnt") == errno.ENOENT
        (src / "late.txt").write_bytes(b"added while mounted\n")  # a rescan must skip MNT too
        deadline = time.monotonic() + 5  # --no-watch: shown within about two seconds
        while "late.txt" not in look("ls", str(m.mnt)).stdout and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(look("ls", str(m.mnt)).stdout.split()) == ["late.txt", "plain.txt", "sub"]
        assert look("cat", str(m.mnt / "late.txt")).stdout == "added while mounted\n"
        stops_on_sigterm(m)
