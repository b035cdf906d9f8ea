"""A stop ends within its grace, whatever a worker thread is blocked in (red team 56, F2)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.mount.conftest import Mount, is_mounted
from tests.mount.helpers import wait_for
from vfs.mount.stopping import STOP_GRACE

HANGFS = Path(__file__).with_name("hangfs.py")


def test_a_stop_ends_while_a_publish_hangs_reading_its_file(tmp_path: Path) -> None:
    """A file in an inbox on a hung server (here a filesystem whose reads never return) holds
    the pack worker inside one read. A SIGTERM stopped the daemon only once that read
    returned: never, here. Now it exits after the grace, the mount detached, the log saying
    what held it, and the file left where it was (published after the next start)."""
    src, inbox, release = tmp_path / "src", tmp_path / "inbox", tmp_path / "release"
    src.mkdir()
    inbox.mkdir(mode=0o755)
    hang = subprocess.Popen([sys.executable, str(HANGFS), str(inbox), str(release)])
    m = Mount(src, tmp_path / "mnt", tmp_path / "mnt.log", tmp_path / "mnt-index")
    try:
        wait_for("the hung filesystem", lambda: is_mounted(inbox))
        m.start("--inbox", str(inbox), "--settle", "0.2")
        assert m.proc is not None
        reading = release.with_suffix(".reading")
        wait_for("the publish to read the file", reading.exists, timeout=60)
        asked = time.monotonic()
        m.proc.send_signal(signal.SIGTERM)
        try:
            m.proc.wait(timeout=STOP_GRACE + 15)
        except subprocess.TimeoutExpired:
            raise AssertionError("the daemon did not stop while a publish hung") from None
        took = time.monotonic() - asked
        assert STOP_GRACE - 1 < took < STOP_GRACE + 15, took
        assert not is_mounted(m.mnt)
        log = m.log_text()
        assert "still stopping after" in log and "publishing stuck.tif" in log, log[-2000:]
        assert not release.exists()  # it never returned: the exit did not wait for it
    finally:
        release.touch()
        m.stop()
        hang.send_signal(signal.SIGTERM)
        try:
            hang.wait(timeout=15)
        except subprocess.TimeoutExpired:
            hang.kill()
        subprocess.run(["fusermount3", "-u", "-z", str(inbox)], check=False, capture_output=True)
