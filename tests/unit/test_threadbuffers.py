"""The read buffers threads keep are counted while they live, all told (vfs.threadbuffers), so
the daemon's cache can hold itself and them within its budget."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from vfs.c4gh.buffers import pread_reused
from vfs.decant.store import scratch
from vfs.stores.direct import open_direct, pread_direct
from vfs.threadbuffers import HELD


def in_thread(work: object) -> int:
    """HELD while a thread that ran `work` lives, minus before; the thread then ends."""
    before = HELD.idle_bytes
    seen: list[int] = []
    done = threading.Event()

    def run() -> None:
        work()  # type: ignore[operator]
        seen.append(HELD.idle_bytes - before)
        done.wait(5)

    thread = threading.Thread(target=run)
    thread.start()
    while not seen and thread.is_alive():
        thread.join(0.01)
    done.set()
    thread.join()
    return seen[0]


def test_each_kind_of_kept_buffer_is_counted_while_its_thread_lives(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 << 20))
    fd = os.open(path, os.O_RDONLY)
    direct = open_direct(fd)
    try:
        before = HELD.idle_bytes
        assert in_thread(lambda: pread_reused(fd, 1 << 20, 0, keep_up_to=4 << 20)) == 1 << 20
        assert in_thread(lambda: pread_reused(fd, 8 << 20, 0, keep_up_to=4 << 20)) == 0  # not kept
        assert in_thread(lambda: scratch(2 << 20)) >= 2 << 20
        if direct is not None:  # tmpfs has no O_DIRECT
            assert in_thread(lambda: pread_direct(direct, 1 << 20, 0, 4 << 20)) == 1 << 20
        assert HELD.idle_bytes == before  # every thread ended: nothing counted
    finally:
        os.close(fd)
        if direct is not None:
            os.close(direct)


def test_a_grown_buffer_replaces_the_count_of_the_one_it_replaced(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:

        def grow() -> None:
            for size in (1 << 20, 2 << 20, 3 << 20):
                pread_reused(fd, size, 0, keep_up_to=4 << 20)

        assert in_thread(grow) == 3 << 20
    finally:
        os.close(fd)


def test_past_the_limit_a_thread_keeps_no_buffer(tmp_path: Path) -> None:
    """Many threads reading at once each kept a buffer: 24 readers of an original held 38 MiB
    in 34 threads. Past HELD's limit a thread reads into a buffer of its own for that read."""
    path = tmp_path / "f"
    body = os.urandom(2 << 20)
    path.write_bytes(body)
    fd = os.open(path, os.O_RDONLY)
    limit, HELD.limit = HELD.limit, HELD.idle_bytes + (3 << 20)
    try:
        first = threading.Event()
        release = threading.Event()
        got: list[int] = []

        def holder() -> None:  # keeps 2 MiB while the other thread reads
            pread_reused(fd, 2 << 20, 0, keep_up_to=4 << 20)
            first.set()
            release.wait(5)

        t = threading.Thread(target=holder)
        t.start()
        first.wait(5)

        def second() -> None:
            assert bytes(pread_reused(fd, 2 << 20, 0, keep_up_to=4 << 20)) == body
            got.append(HELD.idle_bytes)

        grew = in_thread(second)
        assert grew == 0 and got  # read right, kept nothing: the holder's 2 MiB and its own 2
        release.set()
        t.join()
    finally:
        HELD.limit = limit
        os.close(fd)
