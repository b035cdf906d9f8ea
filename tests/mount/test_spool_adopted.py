"""A --spool that other users may write, or hold a folder in, is refused at start (red team 70,
F3): an operator's `mkdir -m 777` spool was made 0700 at start and used, and a user who had made
its `files` folder and kept a working directory in it listed every user's spooled files and put
a folder of their own bytes in place of another user's, published under that user's names."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.mount.conftest import RUNUSER, SYSTEM_PYTHON, Mount, User, open_tmp


@pytest.mark.parametrize("case", ["spool 0777", "files made by a user, spool made 0700 after"])
def test_a_spool_other_users_may_write_or_hold_a_folder_in_is_refused(
    case: str, tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    base = open_tmp(tmp_path_factory, "spool-adopted")
    src, spool = base / "src", base / "spool"
    src.mkdir()
    spool.mkdir()
    spool.chmod(0o777)  # as `mkdir -m 777` makes it (chmod: the umask left aside)
    made = unprivileged.run(str(SYSTEM_PYTHON), "-I", "-c",
                            "import os, sys; os.mkdir(sys.argv[1], 0o777)",
                            str(spool / "files"))  # fmt: skip
    assert made.returncode == 0, made.stderr
    if case != "spool 0777":
        spool.chmod(0o700)  # the operator tightens it; the user's folder stays inside
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--spool", str(spool), wait=False)
    assert m.proc is not None
    try:
        code = m.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        m.stop()
        pytest.fail(f"started on {case}")
    err = m.proc.communicate()[1].decode()
    assert code != 0, err
    want = "writable by others" if case == "spool 0777" else "owned by uid"
    assert want in err and str(spool) in err, err


def test_a_spool_is_one_daemon_s_and_no_user_s_lock_keeps_it_from_starting(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A user who may open an operator's 0755 spool took the daemon's flock on the folder
    before the start, and the daemon refused to start (red team 72, F4); a second daemon given
    the same spool must still be refused."""
    base = open_tmp(tmp_path_factory, "spool-locked")
    src, spool = base / "src", base / "spool"
    src.mkdir()
    spool.mkdir()
    spool.chmod(0o755)
    hold = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
    )
    as_user = [RUNUSER, "-u", unprivileged.name, "--", str(SYSTEM_PYTHON), "-I", "-c", hold]
    holder = subprocess.Popen([*as_user, str(spool)], stdout=subprocess.PIPE, cwd="/",
                              start_new_session=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        first = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
        first.start("--spool", str(spool))  # waits for the mount: fails if it exited
        try:
            second = Mount(src, base / "mnt2", base / "mnt2.log", base / "mnt2-index")
            second.start("--spool", str(spool), wait=False)
            assert second.proc is not None
            code = second.proc.wait(timeout=30)
            err = second.proc.communicate()[1].decode()
            assert code != 0 and "in use by another decant-mount" in err, err
        finally:
            first.stop()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # runuser and the python it runs
        holder.communicate()
