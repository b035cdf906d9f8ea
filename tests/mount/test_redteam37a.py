"""Red team, round 37a: a hardening backlog (folder archives on the write side, the scrub, the
daemon's own files and working folder).

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from tests.mount.helpers import settled, tiff, wait_for

FAST = ("-o", "allow_other", "--settle", "0.3", "--allow-delete")


@pytest.fixture
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    """A writable root mount (`allow_other`, short settle, `--allow-delete`) of a SRC whose
    folder `drop` holds `y.tif.zarr/`, a folder archive shown as `y.tif`, and `both` holds
    `z.tif.zarr.zip` (shown as `z.tif`) and `z.tif.zarr/` (shown under its own name)."""
    from vfs.decant.packer import PackOptions, pack_file

    base = open_tmp(tmp_path_factory, "rt37a")
    src = base / "src"
    (src / "drop").mkdir(parents=True)
    (base / "y.tif").write_bytes(tiff(7))
    pack_file(base / "y.tif", src / "drop" / "y.tif.zarr", PackOptions())
    (src / "both").mkdir()  # `z.tif` from the zip; the folder shown under its own name
    (base / "z.tif").write_bytes(tiff(8))
    pack_file(base / "z.tif", src / "both" / "z.tif.zarr", PackOptions())
    pack_file(base / "z.tif", src / "both" / "z.tif.zarr.zip", PackOptions())
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start(*FAST)
    try:
        yield m
    finally:
        m.stop()


# -- a file renamed over an original shown from a folder archive ------------------------------


@pytest.mark.parametrize(
    ("published", "data"),
    [(True, b"notes\n"), (False, b"notes\n"), (False, tiff(9))],
    ids=["published", "spooled", "spooled-tiff"],
)
def test_a_file_renamed_over_a_folder_archive_s_original_replaces_the_folder(
    mount: Mount, published: bool, data: bytes
) -> None:
    """`mv notes.txt y.tif` where `y.tif` is shown from `y.tif.zarr/`: the `.zarr.zip` case
    (704011b) set the archive aside, a folder archive stayed in SRC beside the new file (or
    its archive `y.tif.zarr.zip`). The mount then listed a `y.tif.zarr` nobody made and a
    later `rm y.tif` brought the old TIFF back under the name."""
    drop, src = mount.mnt / "drop", mount.src / "drop"
    assert (drop / "y.tif").read_bytes() == tiff(7)
    (drop / "notes.txt").write_bytes(data)
    if published:
        wait_for("published", lambda: (src / "notes.txt").exists() and settled(mount))
    os.rename(drop / "notes.txt", drop / "y.tif")
    assert (drop / "y.tif").read_bytes() == data
    wait_for("published", lambda: settled(mount))
    assert sorted(os.listdir(drop)) == ["y.tif"]
    assert (drop / "y.tif").read_bytes() == data
    assert sorted(os.listdir(src)) == ["y.tif" if data.startswith(b"notes") else "y.tif.zarr.zip"]
    os.unlink(drop / "y.tif")
    assert os.listdir(drop) == []


def test_a_folder_archive_shown_under_its_own_name_stays(mount: Mount) -> None:
    """Only the archive the mount showed under the name goes with the rename: `z.tif.zarr/`,
    which lost `z.tif` to `z.tif.zarr.zip`, is a folder of its own name and stays."""
    both, src = mount.mnt / "both", mount.src / "both"
    assert sorted(os.listdir(both)) == ["z.tif", "z.tif.zarr"]
    (both / "notes.txt").write_bytes(b"notes\n")
    os.rename(both / "notes.txt", both / "z.tif")
    wait_for("published", lambda: settled(mount))
    assert sorted(os.listdir(src)) == ["z.tif", "z.tif.zarr"]
    assert (both / "z.tif").read_bytes() == b"notes\n"


# -- the scrub, over whatever SRC holds -------------------------------------------------------


def test_a_scrub_over_a_deep_folder_does_not_stop_the_daemon(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """With --scrub-interval, any user who may write a folder of SRC makes a folder 1,200
    levels deep: the scrub's os.walk recursed once per level (Python 3.11) and its
    RecursionError left the scrub's task on the daemon's own nursery: the daemon exited, the
    mount gone for everyone. The scrub now walks as every other walk of SRC does (vfs/walk.py),
    and a pass that fails anyway is logged in one line and the next one runs."""
    from vfs.decant.packer import PackOptions, pack_file

    src = tmp_path / "src"
    deep = src / "deep"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(1200):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    (tmp_path / "y.tif").write_bytes(tiff(7))
    pack_file(tmp_path / "y.tif", src / "y.tif.zarr.zip", PackOptions())
    try:
        m = make_mount(src, "--read-only", "--scrub-interval", "1s")
        deadline = time.monotonic() + 20
        while m.log_text().count("scrub of") < 2 and m.proc.poll() is None:
            assert time.monotonic() < deadline, m.log_text()[-2000:]
            time.sleep(0.05)
        assert m.proc.poll() is None, m.log_text()[-2000:]
        assert "1 files verified, 0 failed" in m.log_text()
        assert "Traceback" not in m.log_text()
        assert (m.mnt / "y.tif").read_bytes() == tiff(7)
    finally:
        # pytest's clean-up of old temp folders (shutil.rmtree) recurses per level too
        subprocess.run(["rm", "-rf", "--one-file-system", str(deep)], check=True)


# -- the daemon's own files, named in shared places -------------------------------------------


@pytest.mark.parametrize("option", ["--log-file", "--metrics-file"])
def test_a_log_or_metrics_file_reached_through_a_user_s_link_is_refused(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, option: str
) -> None:
    """The operator names `--log-file /var/tmp/decant/mnt.log` (or a --metrics-file there);
    a user put a link at /var/tmp/decant to a folder of root's before the start. The log was
    opened with O_NOFOLLOW on its last part only, and the metrics' temp file and rename went
    by path: root created (and appended to, or replaced every few seconds) a file of that name
    in the folder of the user's choice. Fixed as for --spool (36b): resolved through no link
    another user could make (resolve_trusting_no_one), then opened from / with no link
    followed, so a folder swapped for a link later is not followed either."""
    from tests.mount.test_redteam36b import _refused, _shared_with_a_link

    base = open_tmp(tmp_path_factory, "link-" + option.strip("-"))
    src = base / "src"
    src.mkdir()
    victim = base / "victim"
    victim.mkdir(mode=0o755)
    link = _shared_with_a_link(base, unprivileged, victim, "decant")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    err = _refused(m, "--read-only", option, str(link / "decant.out"))
    assert f"{link} is a symlink of uid {unprivileged.uid}" in err, err
    assert os.listdir(victim) == []


# -- a detached daemon's working folder -------------------------------------------------------


def _daemon_of(mnt: Path) -> int:
    """The pid of the decant-mount process serving `mnt` (its command line names it)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vfs.cli" in argv and os.fsencode(mnt.name) in argv and b"-f" not in argv:
            return int(pid)
    raise AssertionError(f"no daemon serving {mnt}")


def test_a_detached_daemon_works_from_the_root_folder(tmp_path: Path) -> None:
    """`cd /media/usb && decant-mount src mnt` (no -f): the daemon kept the folder it was
    started in as its working folder for as long as it ran, so that filesystem stayed busy
    (`umount /media/usb`: "target is busy") though nothing of it was in use. It now works
    from /, as daemons do, with the relative paths it was given made absolute first."""
    from tests.mount.conftest import ROOT, is_mounted

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"a\n")
    (tmp_path / "mnt").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "vfs.cli", "src", "mnt", "--read-only", "--log-file", "mnt.log",
           "--index-dir", "index", "--metrics-file", "mnt.prom"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    pid = _daemon_of(tmp_path / "mnt")
    try:
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        assert (tmp_path / "mnt" / "a.txt").read_bytes() == b"a\n"
        wait_for("metrics written", (tmp_path / "mnt.prom").exists)
        assert (tmp_path / "index").is_dir() and "mounted" in (tmp_path / "mnt.log").read_text()
    finally:
        if is_mounted(tmp_path / "mnt"):
            subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "mnt")], check=False)
        wait_for("the daemon gone", lambda: not Path(f"/proc/{pid}").exists(), timeout=15)
