"""The daemon's life: detaching when ready, signals, external unmount, busy and stale mounts."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import is_mounted, settle
from vfs.decant.packer import pack_file

DAEMON = [sys.executable, "-m", "vfs.cli"]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir()
    src.mkdir()
    data = np.arange(3 * 64 * 48, dtype=np.uint16).reshape(3, 64, 48)
    tifffile.imwrite(work / "stack.tif", data, photometric="minisblack")
    pack_file(work / "stack.tif", src / "stack.tif.zarr.zip")
    return src


def _exit_code(proc: subprocess.Popen[bytes], timeout: float = 15) -> int:
    code = proc.wait(timeout=timeout)
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()
    return code


def test_sigterm_unmounts_and_exits_zero(src: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    m = make_mount(src)
    assert os.listdir(m.mnt) == ["stack.tif"]
    m.proc.send_signal(signal.SIGTERM)
    assert _exit_code(m.proc) == 0
    assert not is_mounted(m.mnt)


def test_fusermount_unmount_ends_daemon(src: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    m = make_mount(src)
    subprocess.run(["fusermount3", "-u", str(m.mnt)], check=True)
    assert _exit_code(m.proc) == 0
    assert "unmounted" in m.log_text()


def test_lazy_unmount_detaches_a_busy_mount(src: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    """`decant-mount -u MNT --lazy` (the systemd unit's ExecStartPre) detaches a mount a
    reader still holds open: the reader keeps its file, the mountpoint is free at once."""
    m = make_mount(src)
    with open(m.mnt / "stack.tif", "rb") as held:
        assert subprocess.run([*DAEMON, "-u", str(m.mnt)], capture_output=True).returncode == 1
        done = subprocess.run([*DAEMON, "-u", str(m.mnt), "-z"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert not is_mounted(m.mnt)
        assert held.read(2) in (b"II", b"MM")
    assert _exit_code(m.proc) == 0


def test_busy_mountpoint_is_refused(src: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    m = make_mount(src)
    second = subprocess.run([*DAEMON, str(src), str(m.mnt), "-f"], capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert second.returncode != 0
    assert "already a mount point" in second.stderr
    assert "Traceback" not in second.stderr
    assert os.listdir(m.mnt) == ["stack.tif"]  # the first mount is untouched


def test_stale_mount_is_detected(src: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    m = make_mount(src)
    m.proc.send_signal(signal.SIGKILL)
    _exit_code(m.proc)
    with pytest.raises(OSError):
        os.listdir(m.mnt)
    again = subprocess.run([*DAEMON, str(src), str(m.mnt), "-f"], capture_output=True,
                           text=True, timeout=30)  # fmt: skip
    assert again.returncode != 0
    assert "stale FUSE mount" in again.stderr and "-u" in again.stderr
    subprocess.run([*DAEMON, "-u", str(m.mnt)], check=True)
    assert not is_mounted(m.mnt)


def test_detaches_only_once_mounted(src: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    started = subprocess.run([*DAEMON, str(src), str(mnt), "--index-dir", str(tmp_path / "ix"),
                              "--log-file", str(tmp_path / "log")], timeout=60)  # fmt: skip
    try:
        assert started.returncode == 0
        assert os.listdir(mnt) == ["stack.tif"]  # usable the moment the command returns
    finally:
        subprocess.run([*DAEMON, "-u", str(mnt)], check=False)
    deadline = time.monotonic() + 10
    while is_mounted(mnt) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_mounted(mnt)


@pytest.mark.parametrize("how", ["folder-writable", "database-not-ours"])
def test_an_index_another_user_may_write_is_refused_at_start(
    src: Path, tmp_path: Path, how: str
) -> None:
    """The index says which archives verified and holds the digests reads are checked
    against: one another user may write (a shared folder, a database they made first) could
    have a damaged archive served as verified. Refused at start, naming it and why."""
    if how == "database-not-ours" and os.geteuid() != 0:
        pytest.skip("needs root to give the database to another user")
    index = tmp_path / "ix"
    index.mkdir()
    if how == "folder-writable":
        index.chmod(0o777)
    else:
        sqlite3.connect(index / "index.sqlite").close()
        os.chown(index / "index.sqlite", 65534, 65534)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        run = subprocess.run([*DAEMON, str(src), str(mnt), "-f", "--index-dir", str(index)],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        if is_mounted(mnt):  # it served from that index instead of refusing it
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
    assert run.returncode == 1, run.stderr
    assert f"--index-dir {index}: " in run.stderr
    why = "writable by others" if how == "folder-writable" else "owned by uid 65534"
    assert why in run.stderr
    assert not is_mounted(mnt)


@pytest.mark.parametrize("how", ["symlink", "not-ours", "hardlink"])
def test_a_log_file_put_in_the_way_is_refused_at_start(src: Path, tmp_path: Path, how: str) -> None:
    """--log-file in a folder another user may write: a link they put at its name would have
    the daemon (root) append its log to whatever it names; a file of theirs would hold a log
    that names every user's files. Refused, the target untouched."""
    if how == "not-ours" and os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    log = logs / "decant.log"
    if how == "symlink":
        log.symlink_to(victim)
    elif how == "hardlink":  # another name of root's file (protected_hardlinks off, or root's)
        victim.chmod(0o600)
        os.link(victim, log)
    else:
        log.write_bytes(b"")
        os.chown(log, 65534, 65534)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        run = subprocess.run([*DAEMON, str(src), str(mnt), "-f", "--log-file", str(log),
                              "--index-dir", str(tmp_path / "ix")],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
    assert run.returncode == 1, run.stderr
    why = {"symlink": "a symlink", "not-ours": "owned by uid 65534",
           "hardlink": "a hard link (2 names)"}[how]  # fmt: skip
    assert f"--log-file {log}: {why}" in run.stderr
    assert victim.read_bytes() == b"root's file\n"
    assert log.is_symlink() or log.read_bytes() in (b"", b"root's file\n")


def test_metrics_pass_a_link_at_a_temp_name(src: Path, tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    """The metrics file is replaced whole every few seconds through a temp file beside it: a
    link put at the temp name it used (`.NAME.tmp`) had the daemon truncate and write its
    target. The temp name is now its own (O_EXCL), the link left alone."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    folder.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    (folder / ".decant.prom.tmp").symlink_to(victim)
    metrics = folder / "decant.prom"
    make_mount(src, "--read-only", "--metrics-file", str(metrics))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not metrics.exists():
        time.sleep(0.1)
    assert "decant_reads_total" in metrics.read_text()
    assert victim.read_bytes() == b"root's file\n"
    assert oct(metrics.stat().st_mode & 0o777) == oct(0o644)
    assert sorted(p.name for p in folder.iterdir()) == [".decant.prom.tmp", "decant.prom"]


def test_a_write_side_whose_spool_others_could_swap_is_refused(src: Path, tmp_path: Path) -> None:
    """SRC writable by others without the sticky bit (a group-writable share): a user renamed
    SRC/.decant-spool away and put a link to a folder of theirs in its place; a file written
    through the mount then truncated, chmod-ed and chown-ed to them whatever their link named
    (red team, stop 26). The write side refuses such a SRC, naming the way out; read-only and
    a sticky SRC (as /tmp) start."""
    src.chmod(0o777)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    base = [*DAEMON, str(src), str(mnt), "--index-dir", str(tmp_path / "ix")]
    try:
        run = subprocess.run([*base, "-f"], capture_output=True, text=True, timeout=30)
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
    assert run.returncode == 1, run.stderr
    assert f"{src} is writable by others (mode 0777)" in run.stderr
    assert "chmod +t" in run.stderr and not is_mounted(mnt)
    for mode, extra in ((0o777, ["--read-only"]), (0o1777, [])):
        src.chmod(mode)
        assert subprocess.run([*base, *extra], timeout=60).returncode == 0
        try:
            assert os.listdir(mnt) == ["stack.tif"]
        finally:
            subprocess.run([*DAEMON, "-u", str(mnt)], check=False)
            deadline = time.monotonic() + 10
            while is_mounted(mnt) and time.monotonic() < deadline:
                time.sleep(0.1)


def test_a_diagnosis_folder_another_user_may_write_is_refused(src: Path, tmp_path: Path) -> None:
    """DECANT_DIAGNOSE=DIR: its files are made by name on SIGUSR2; in a folder another user
    may write, links they put at those names were written through as root."""
    diag = tmp_path / "diag"
    diag.mkdir()
    diag.chmod(0o777)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "DECANT_DIAGNOSE": str(diag)}
    try:
        run = subprocess.run([*DAEMON, str(src), str(mnt), "-f", "--read-only", "--index-dir",
                              str(tmp_path / "ix")], capture_output=True, text=True, timeout=30,
                             env=env)  # fmt: skip
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
    assert run.returncode == 1, run.stderr
    assert f"DECANT_DIAGNOSE {diag}: writable by others" in run.stderr


def test_persistent_index_remembers_descriptions_and_verification(src: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    settle(*src.iterdir())  # written just now, its description would not be kept
    m = make_mount(src)
    original = tifffile.imread(m.mnt / "stack.tif")
    data = (m.mnt / "stack.tif").read_bytes()  # a full read: hashed and verified as served
    m.stop()
    db = sqlite3.connect(m.index / "index.sqlite")
    try:
        assert db.execute("SELECT count(*) FROM descriptions").fetchone()[0] == 1
        assert db.execute("SELECT count(*) FROM verified").fetchone()[0] == 1
    finally:
        db.close()
    m.start()
    assert (m.mnt / "stack.tif").read_bytes() == data
    np.testing.assert_array_equal(tifffile.imread(m.mnt / "stack.tif"), original)


@pytest.mark.skipif(shutil.which("mount.fuse3") is None, reason="mount.fuse3 not installed")
def test_fstab_style_mount_through_mount_fuse3(src: Path, tmp_path: Path) -> None:
    # mount(8) resets PATH to the system default before mount.fuse3 looks the program up.
    if shutil.which("decant-mount", path="/usr/local/bin:/usr/bin:/bin") is None:
        pytest.skip("decant-mount is not in /usr/local/bin or /usr/bin (see README, fstab)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "HOME": str(tmp_path)}
    result = subprocess.run(["mount", "-t", "fuse.decant-mount", str(src), str(mnt), "-o",
                             "ro,allow_other,default_permissions"], capture_output=True,
                            text=True, timeout=60, env=env)  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr
        assert os.listdir(mnt) == ["stack.tif"]
        assert "allow_other" in Path("/proc/self/mounts").read_text()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
