"""`.decant-status` names a bounded number of files, per reader, and counts the rest.

A user's files that can never be published stay spooled and listed as failed. Each one used to
be named in the user's status (1,500 long names made a 1 MB document, rebuilt at every open on
the daemon's event loop and copied into every handle). Now each list names at most 100 files
and `failed_total` counts them all; the reader's size is still that of what it reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.mount.conftest import SYSTEM_PYTHON, Mount, User, open_tmp

LISTED = 100  # README: at most this many files named per list
USER_FILES = 150
ROOT_FILES = 2


def user_name(i: int) -> bytes:
    return b"u%03d\xff" % i + b"q" * 200  # undecodable and long, as a hostile user's would be


def root_name(i: int) -> bytes:
    return b"root%d.csv" % i


@pytest.fixture
def failing(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[Mount]:
    """A mount whose SRC/drop holds a folder at the name of each file written through it (by the
    user and by root) while it was stopped: none can be published, all stay failed."""
    base = open_tmp(tmp_path_factory, "status-bounds")
    src = base / "src"
    drop = src / "drop"
    drop.mkdir(parents=True)
    drop.chmod(0o1777)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--settle", "600")  # spooled until the restart
    try:
        mnt = os.fsencode(m.mnt / "drop")
        code = (
            "import sys\n"
            f"for i in range({USER_FILES}):\n"
            "    name = b'%s/u%03d\\xff' % (sys.argv[1].encode(), i) + b'q' * 200\n"
            "    open(name, 'wb').write(b'the user s file\\n')\n"
        )
        done = unprivileged.run(str(SYSTEM_PYTHON), "-I", "-c", code, os.fsdecode(mnt))
        assert done.returncode == 0, done.stderr
        for i in range(ROOT_FILES):
            with open(mnt + b"/" + root_name(i), "wb") as fh:
                fh.write(b"root's file\n")
        m.stop()
        for name in [*map(user_name, range(USER_FILES)), *map(root_name, range(ROOT_FILES))]:
            os.mkdir(os.fsencode(drop) + b"/" + name)  # a folder took the name
        m.start("-o", "allow_other", "--settle", "0.5")
        yield m
    finally:
        m.stop()


def failed_total(doc: dict[str, Any]) -> int:
    return int(doc.get("failed_total", len(doc.get("failed", []))))


def test_status_names_at_most_100_failed_files_and_counts_them_all(
    failing: Mount, unprivileged: User
) -> None:
    status = failing.mnt / ".decant-status"
    everyone = USER_FILES + ROOT_FILES
    deadline = time.monotonic() + 60
    while failed_total(doc := json.loads(status.read_bytes())) < everyone:
        assert time.monotonic() < deadline, f"not all failed yet: {failed_total(doc)}"
        time.sleep(0.2)

    # Root: every file counted, the first 100 named.
    assert doc["failed_total"] == everyone and len(doc["failed"]) == LISTED

    # The user: its own files only, counted all, 100 named; the size is that of what it reads.
    got = unprivileged.value_of("[os.stat(p).st_size, open(p, 'rb').read().decode()]", p=status)
    size, text = got
    mine = json.loads(text)
    assert (mine["failed_total"], len(mine["failed"])) == (USER_FILES, LISTED)
    assert all(e["path"].startswith("drop/u") for e in mine["failed"])
    assert size == len(text.encode())
    assert size < 100 * 1024  # 1,500 such names made 1 MB

    # The CLI says how many are not named, and names undecodable bytes as escapes.
    cli = subprocess.run([sys.executable, "-m", "vfs.cli", "--status", str(failing.mnt)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert cli.returncode == 0 and "Traceback" not in cli.stderr, cli.stderr
    assert f"failed {everyone}," in cli.stdout
    assert f"failed: {everyone - LISTED} more not listed" in cli.stdout
    assert re.search(r"^failed: drop/u\d{3}\\xffq{200}: ", cli.stdout, re.M), cli.stdout
