"""An AcqStore member opens only for a caller who could read its file where it is, and the file
checked is the file opened: a folder swapped between the check and the open (renameat2 in a
shared folder without the sticky bit) must not make the daemon read the other folder's file.

The swap is made deterministic here: the backend's open is wrapped to exchange the folders just
before it opens, after the mount's check (red team, stop 25, repro 4). Handlers run in-process
(tests/unit/inprocess.py) as an unprivileged caller."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest

from tests.toolbox import load_tool
from tests.unit.inprocess import FakeContext, InProcessMount, fake_session

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners are set as root")

CALLER = FakeContext(uid=4242, gid=4242)
SECRET = b"patient,diagnosis\np1,TOP SECRET\n"


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[InProcessMount]:
    src = tmp_path / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    load_tool("make_acqstore_corpus").make_collection(shared)
    doc_path = shared / "acqstore/collection.json"
    doc = json.loads(doc_path.read_text())
    doc["resources"]["tables"][0]["path"] = "x/secret.csv"  # the caller's own decoy, first
    doc_path.write_text(json.dumps(doc, indent=1))
    (shared / "x").mkdir()
    (shared / "x/secret.csv").write_bytes(b"decoy\n" + b"d" * (len(SECRET) - 6))
    private = shared / "private"
    private.mkdir(mode=0o700)  # someone else's (root's): the caller may not enter it
    (private / "secret.csv").write_bytes(SECRET)
    for path in [shared, *shared.rglob("*")]:
        if not path.is_relative_to(private):
            os.chown(path, CALLER.uid, CALLER.gid)
    with fake_session():
        yield InProcessMount(src, tmp_path, read_only=True, ctx=CALLER)


def swap(a: Path, b: Path) -> None:
    spare = a.with_name(a.name + ".swap")
    a.rename(spare)
    b.rename(a)
    spare.rename(b)


def test_a_folder_swapped_after_the_check_is_not_read(mount: InProcessMount) -> None:
    shared = mount.config.src / "shared"
    table = "shared/members/tables/velocity-pool.csv"
    assert mount.run(mount.read_file, table).startswith(b"decoy")  # the caller's own: readable
    backend = next(b for b in mount.tree.overlays if b.name == "acqstore")
    opened = backend.open

    def open_after_a_swap(*args: object) -> object:
        swap(shared / "x", shared / "private")  # now x/secret.csv is the private one
        try:
            return opened(*args)
        finally:
            swap(shared / "x", shared / "private")

    backend.open = open_after_a_swap  # type: ignore[method-assign]
    with pytest.raises(pyfuse3.FUSEError) as err:
        got = mount.run(mount.read_file, table)
        assert got != SECRET, "read another user's private file"
    assert err.value.errno == errno.EACCES
