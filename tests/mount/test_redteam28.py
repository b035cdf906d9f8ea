"""A hostile local user against a mount run by root, round 28: packages and archives read through
`vfs.stores.local.LocalFile` (O_DIRECT loads), and files swapped under the daemon.

Each test here failed on the code it was written against. No timing is asserted: a join with a
long timeout only tells a hang from an answer.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.mount.conftest import Mount
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
