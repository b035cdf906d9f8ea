"""Red team, round 37a, without a mount: the scrub's task and the daemon's own files.

Each test failed before the fix its docstring names.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from vfs.mount import scrub


def test_a_scrub_pass_that_fails_is_logged_and_the_next_one_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """scrub_forever runs on the daemon's own nursery: an exception out of one pass (SRC
    unreadable, an archive's check failing in a way verify_now did not expect) ended the
    daemon. Fixed: a failed pass is one log line, no traceback, and the next pass runs; a
    node whose check raises is counted failed, named in one line."""
    passes: list[int] = []
    scope = trio.CancelScope()

    async def flaky(ops: Any) -> tuple[int, int]:
        passes.append(1)
        if len(passes) == 1:
            raise PermissionError(errno.EACCES, "Permission denied", "/src")
        if len(passes) == 2:
            return await real_once(ops)
        scope.cancel()  # the third pass: stop the test here
        await trio.sleep(0)
        return 0, 0

    class Integrity:
        def __init__(self) -> None:
            self.good: set[object] = set()

        async def verify_now(self, node: Any) -> bool:
            raise RuntimeError("an archive turned unreadable")

    real_once = scrub.scrub_once
    node = SimpleNamespace(key=1, real=Path("/src/a.tif.zarr.zip"))
    monkeypatch.setattr(scrub, "scrub_once", flaky)
    monkeypatch.setattr(scrub, "verifiable", lambda tree, skip: [node])
    ops = SimpleNamespace(
        tree=SimpleNamespace(root=Path("/src")),
        config=SimpleNamespace(mnt=Path("/mnt"), spool_root=Path("/src/.decant-spool")),
        integrity=Integrity(),
    )

    async def main() -> None:
        with scope, trio.fail_after(5):
            await scrub.scrub_forever(ops, 0.001)  # type: ignore[arg-type]

    with caplog.at_level(logging.INFO, logger=scrub.log.name):
        trio.run(main)
    assert len(passes) == 3
    lines = [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records]
    assert (logging.ERROR, "scrub of /src: pass stopped: Permission denied (errno 13)",
            None) in lines  # fmt: skip
    assert (logging.ERROR, "/src/a.tif.zarr.zip: not scrubbed: an archive turned unreadable",
            None) in lines  # fmt: skip
    assert any(m.startswith("scrub of /src: 0 files verified, 1 failed") for _, m, _ in lines)


@pytest.mark.parametrize("there", ["link", "file", "folder link"])
def test_a_spooled_create_never_opens_what_is_already_at_its_path(
    tmp_path: Path, there: str
) -> None:
    """Spool.create_stat opened its path with O_CREAT | O_TRUNC, following links, then
    chmod-ed and (as root) chown-ed what it opened to the creator: a link found at that spool
    path (a folder of links a user got into the spool) was followed, its target truncated and
    given to the user, and a link on the way made the file wherever it led; another name of a
    file (a hard link) truncated that file. Now only the daemon's own spooled file there (a
    regular file of one name) is truncated; the rest fail (EEXIST, ELOOP), no link followed."""
    from vfs.ingest.spool import Spool

    src = tmp_path / "src"
    spool = Spool(src, src / ".decant-spool" / "files")
    (spool.files / "drop").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "new.txt"
    victim.write_bytes(b"root's own\n")
    victim.chmod(0o600)
    at = spool.path("drop/new.txt")
    if there == "link":
        at.symlink_to(victim)
    elif there == "file":
        os.link(victim, at)  # another name of a file, there before the create
    else:
        at.parent.rmdir()
        at.parent.symlink_to(elsewhere)
        victim.unlink()
    with pytest.raises(OSError) as refused:
        spool.create_stat("drop/new.txt", 0o666, 12345, 12345)
    assert refused.value.errno in (errno.EEXIST, errno.ELOOP, errno.ENOTDIR)
    if there == "folder link":
        assert os.listdir(elsewhere) == []
    else:
        assert victim.read_bytes() == b"root's own\n"
        st = victim.stat()
        assert (st.st_mode & 0o777, st.st_uid) == (0o600, os.getuid())


def test_index_rows_of_archives_gone_are_forgotten_during_a_run_too(tmp_path: Path) -> None:
    """Each start pruned the index of archives gone from SRC, but within one run (weeks, as a
    service) a user cycling archive names grew it without bound. The prune now runs again
    every PRUNE_INTERVAL (an hour); here on a trio clock that runs 2 hours a second."""
    import itertools
    from types import SimpleNamespace

    import trio
    import trio.testing

    from vfs.mount import daemon

    pruned: list[float] = []

    class Index:
        def prune(self, src: Path) -> int:
            pruned.append(trio.from_thread.run_sync(trio.current_time))
            return 0

    ops = SimpleNamespace(tree=SimpleNamespace(index=Index(), backends=[]),
                          config=SimpleNamespace(mnt=tmp_path / "mnt"))  # fmt: skip

    async def main() -> None:
        with trio.move_on_after(3.5 * daemon.PRUNE_INTERVAL):
            await daemon._census(ops, tmp_path)  # type: ignore[arg-type]

    trio.run(main, clock=trio.testing.MockClock(rate=2 * daemon.PRUNE_INTERVAL))
    assert len(pruned) == 4  # at the start, then after 1, 2 and 3 intervals
    gaps = [b - a for a, b in itertools.pairwise(pruned)]
    assert all(daemon.PRUNE_INTERVAL <= gap < 1.4 * daemon.PRUNE_INTERVAL for gap in gaps), gaps
