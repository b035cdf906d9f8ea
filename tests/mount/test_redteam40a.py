"""Red team, round 40a: the daemon's permission reads by path, raced by the owner of a folder
in SRC (rename, swap, symlink), against what SRC itself grants the same user.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from tests.conftest import load_tool
from tests.mount.conftest import Mount, User, open_tmp


def test_another_user_s_private_analyses_in_my_collection_are_not_listed_to_me(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """USER's collection holds a member folder of another user's (root here), its
    `analyses.json` 0600: SRC denies USER the document. The view's folders, owned by the
    collection's owner, kept the owner bits because the document's owner may read it, so
    USER, their owner, listed the other user's analysis ids."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt40a-owner")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    coll = src / "coll"
    load_tool("make_acqstore_corpus").make_collection(coll)
    for path in [coll, *coll.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
        os.chown(path, u.uid, u.gid)
    doc = json.loads((coll / "acqstore/collection.json").read_text())
    member = next(m for m in doc["members"] if m["resources"].get("analyses"))
    analyses = coll / member["resources"]["analyses"]
    ids = [a["id"] for a in json.loads(analyses.read_text())["analyses"]]
    for path in (analyses.parent, analyses):
        os.chown(path, 0, 0)
    analyses.chmod(0o600)
    assert u.errno_of("read(p)", p=analyses) == errno.EACCES  # SRC denies USER the ids
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        folder = m.mnt / "coll" / "members" / member["name"]
        assert set(ids) <= set(os.listdir(folder)), m.log_text()[-2000:]  # root sees them
        assert u.errno_of("os.listdir(p)", p=folder) == errno.EACCES
        for aid in ids:
            assert u.errno_of("os.listdir(p)", p=folder / aid) == errno.EACCES, aid
        others = [x for x in doc["members"] if x is not member]
        assert others  # positive control: USER's own member is listed to USER
        assert u.errno_of("os.listdir(p)", p=m.mnt / "coll" / "members" / others[0]["name"]) == 0
    finally:
        m.stop()
