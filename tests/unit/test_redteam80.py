"""Red team 80 without a mount: a FIFO at the log file's name. (F1, another user's archive
hiding an entry, is in test_redteam_tree.py.)"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from vfs import cli


def test_a_fifo_at_the_log_file_is_refused_at_once(tmp_path: Path) -> None:
    """Where others may write the log's folder, a FIFO made at its name (after logrotate moved
    the log away) blocked SIGHUP's reopen until someone read it, and SIGTERM with it; one
    there before the start held the daemon before it mounted. Now refused without waiting."""
    fifo = tmp_path / "decant.log"
    os.mkfifo(fifo, 0o666)
    outcome: list[BaseException | None] = []

    def open_it() -> None:
        try:
            cli._open_log(str(fifo)).close()
            outcome.append(None)
        except BaseException as exc:  # SystemExit is what is expected
            outcome.append(exc)

    worker = threading.Thread(target=open_it, daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock it, then fail: the open waited for a reader
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        with open(fifo, "rb"):
            pass
        pytest.fail("the open of the log waited for a reader of the FIFO")
    assert isinstance(outcome[0], SystemExit), outcome
    assert "not a regular file" in str(outcome[0])


def test_a_fifo_with_a_reader_is_refused_too(tmp_path: Path) -> None:
    fifo = tmp_path / "decant.log"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(SystemExit, match="not a regular file"):
            cli._open_log(str(fifo))
    finally:
        os.close(reader)
