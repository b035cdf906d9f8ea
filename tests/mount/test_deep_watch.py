"""A folder deeper than the watcher goes (red team 68, F1): one user's 3,000-level folder made
the watcher's walk raise RecursionError, and the whole mount fell back to mtime checks. Now the
walk stops at WATCH_DEPTH, the rest of SRC stays watched, and the folders below it are served
as unwatched ones are: a change there still shows within the unwatched timeout."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from tests.toolbox import make_chain, remove_chain


def _mode_becomes(path: Path, mode: int, timeout: float = 6.0) -> float:
    start = time.monotonic()
    while stat.S_IMODE(os.stat(path).st_mode) != mode:
        assert time.monotonic() - start < timeout, oct(os.stat(path).st_mode)
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_folder_too_deep_to_watch_leaves_the_rest_watched_and_itself_fresh(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    src = tmp_path / "src"
    (src / "top").mkdir(parents=True)
    (src / "top" / "f.txt").write_bytes(b"shallow")
    bottom = make_chain(src, "d", 1100)  # 2,200 bytes of path: servable, past os.walk's limit
    try:
        os.close(os.open(bottom / "f.txt", os.O_CREAT | os.O_WRONLY, 0o644))
        m = make_mount(src)
        shown = m.mnt.joinpath(*bottom.relative_to(src).parts, "f.txt")
        assert stat.S_IMODE(os.stat(shown).st_mode) == 0o644
        assert stat.S_IMODE(os.stat(m.mnt / "top" / "f.txt").st_mode) == 0o644
        os.chmod(bottom / "f.txt", 0o600)
        os.chmod(src / "top" / "f.txt", 0o600)
        # Below the depth watched: the kernel's entry expires (1 s) and lookup restats the
        # file. Taken as watched, its listed bits stayed until the folder changed.
        _mode_becomes(shown, 0o600)
        _mode_becomes(m.mnt / "top" / "f.txt", 0o600)  # reported by the watch
        log = m.log_text()
        assert f"watching {src} failed" not in log, log[-2000:]
        assert "levels below SRC are not watched" in log
        m.stop()
    finally:
        remove_chain(src, "d")
