"""Red team, round 40a: the daemon's permission reads by path, raced by the owner of a folder
in SRC (rename, swap, symlink), against what SRC itself grants the same user.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from tests.mount.test_redteam37c import _folder_archive
from tests.mount.test_redteam38a import _collection


def _analysed_member(coll: Path) -> tuple[dict[str, Any], dict[str, Any], Path, list[str]]:
    """(collection.json, its first member with analyses, that `analyses.json`, its ids)."""
    doc = json.loads((coll / "acqstore/collection.json").read_text())
    member = next(m for m in doc["members"] if m["resources"].get("analyses"))
    analyses = coll / member["resources"]["analyses"]
    return doc, member, analyses, [a["id"] for a in json.loads(analyses.read_text())["analyses"]]


def test_another_user_s_private_analyses_in_my_collection_are_not_listed_to_me(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """USER's collection holds a member folder of another user's (root here), its
    `analyses.json` 0600: SRC denies USER the document. The view's folders, owned by the
    collection's owner, kept the owner bits because the document's owner may read it, so
    USER, their owner, listed the other user's analysis ids. Since round 43 a collection's
    references count only where its author (USER) may read them: this one is as if missing,
    and the collection gets no view (the log says why); USER lists no id either way."""
    u = unprivileged
    base, src = _collection(tmp_path_factory, "rt40a-owner")
    coll = src / "coll"
    for path in [coll, *coll.rglob("*")]:
        os.chown(path, u.uid, u.gid)
    _doc, member, analyses, ids = _analysed_member(coll)
    for path in (analyses.parent, analyses):
        os.chown(path, 0, 0)
    analyses.chmod(0o600)
    assert u.errno_of("read(p)", p=analyses) == errno.EACCES  # SRC denies USER the ids
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        assert "members" not in os.listdir(m.mnt / "coll")
        assert "its collection's owner may not read it there" in m.log_text()
        listing = "import os, sys; print(sorted(os.listdir(sys.argv[1])))"
        for folder in (m.mnt / "coll", m.mnt / "coll" / member["name"]):
            shown = u.run("/usr/bin/python3", "-I", "-c", listing, str(folder)).stdout
            assert not any(aid in shown for aid in ids), shown
    finally:
        m.stop()


SWAP_AND_LIST = """
import ctypes, json, os, sys
real, decoy, folder = (os.fsencode(a) for a in sys.argv[1:4])
libc = ctypes.CDLL(None, use_errno=True)
def exchange():  # renameat2(RENAME_EXCHANGE): the name is never missing meanwhile
    if libc.renameat2(-100, real, -100, decoy, 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
exchange()
try:
    try:
        got = sorted(os.fsdecode(n) for n in os.listdir(folder))
    except OSError as exc:
        got = exc.errno
finally:
    exchange()
print(json.dumps(got))
"""


def test_a_private_analyses_document_swapped_away_does_not_lend_its_ids(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """USER owns the collection's `acqstore/members/` folder; another user's member folder in
    it keeps `analyses.json` 0600. The view read the ids from that document, then took the
    bits its folder is shown with from the document's path again: USER swapped in a folder of
    their own (a readable `analyses.json`) between the two and listed the other user's
    analysis ids."""
    u = unprivileged
    base, src = _collection(tmp_path_factory, "rt40a-swap")
    _doc, member, analyses, ids = _analysed_member(src / "coll")
    real = analyses.parent
    decoy = real.parent / "decoy"
    shutil.copytree(real, decoy)
    mine = json.loads((decoy / analyses.name).read_text())
    for analysis in mine["analyses"]:
        analysis["id"] = f"mine-{analysis['id']}"  # what USER's own document lists
    (decoy / analyses.name).write_text(json.dumps(mine))
    for path in [decoy, *decoy.rglob("*")]:
        os.chown(path, u.uid, u.gid)
    os.chown(real.parent, u.uid, u.gid)  # USER's folder; the member folder in it is root's
    analyses.chmod(0o600)
    assert u.errno_of("read(p)", p=analyses) == errno.EACCES  # SRC denies USER the ids
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        folder = m.mnt / "coll" / "members" / member["name"]
        for _try in range(20):
            deadline = time.monotonic() + 10  # the view built again after the last swap
            while "members" not in os.listdir(m.mnt / "coll"):
                assert time.monotonic() < deadline, m.log_text()[-2000:]
                time.sleep(0.1)
            done = u.run("/usr/bin/python3", "-I", "-c", SWAP_AND_LIST, str(real), str(decoy),
                         str(folder))  # fmt: skip
            assert done.returncode == 0, done.stderr
            got = json.loads(done.stdout)
            assert not (isinstance(got, list) and set(ids) & set(got)), (
                f"try {_try}: another user's private analysis ids listed: {got}"
            )
        deadline = time.monotonic() + 10  # the view built again after the last swap back
        while not set(ids) <= set(_listed(folder)):
            assert time.monotonic() < deadline, (_listed(folder), m.log_text()[-2000:])
            time.sleep(0.1)  # root sees them once the view settles
    finally:
        m.stop()


def _listed(folder: Path) -> list[str]:
    """The folder's names, or none while the view is being built again."""
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


SWAP_FOLDER = """
import ctypes, json, os, sys, time
private, mine, shown = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
st = os.stat(private)  # search permission on the folder holding it is enough
up = os.stat(os.path.dirname(private))
if libc.renameat2(-100, private.encode(), -100, mine.encode(), 2) != 0:  # RENAME_EXCHANGE
    raise OSError(ctypes.get_errno(), "renameat2")
os.utime(private, ns=(st.st_atime_ns, st.st_mtime_ns))  # mine, now at its name: its mtime
os.utime(os.path.dirname(private), ns=(up.st_atime_ns, up.st_mtime_ns))  # USER's folder's too
got = errno = None
for _try in range(40):  # until the kernel asks for the attributes again
    try:
        got = sorted(os.listdir(shown))
        break
    except OSError as exc:
        errno = exc.errno
        time.sleep(0.1)
print(json.dumps(got if got is not None else errno))
"""


def test_a_private_folder_swapped_for_mine_does_not_lend_me_its_listing(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """--no-watch: USER owns `shared/`, in which another user keeps `private/` 0700. Once its
    listing was read through the mount, USER swapped in a folder of their own at its name,
    with its mtime (and their folder's put back): the restat gave the listed folder's node the
    new folder's owner and bits, and the mtime check kept the listing, so USER listed the
    private folder's subfolders (its files are restated by name, and were left out)."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt40a-folder")
    src = base / "src"
    shared = src / "shared"
    private, mine = shared / "private", shared / "mine"
    for folder in (src, shared, private, mine):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    os.chown(shared, u.uid, u.gid)
    os.chown(mine, u.uid, u.gid)
    secrets = sorted(f"secret-{n}" for n in range(3))
    for name in secrets:
        (private / name).mkdir()
    private.chmod(0o700)
    assert u.errno_of("os.listdir(p)", p=private) == errno.EACCES  # SRC denies USER its names
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only", "--no-watch")
        shown = m.mnt / "shared" / "private"
        assert sorted(os.listdir(shown)) == secrets  # root lists it: its listing is kept
        done = u.run("/usr/bin/python3", "-I", "-c", SWAP_FOLDER, str(private), str(mine),
                     str(shown))  # fmt: skip
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert not (isinstance(got, list) and set(got) & set(secrets)), (
            f"another user's private folder listed to USER: {got}"
        )
        assert got == [], got  # what SRC gives USER at that name now: their own empty folder
    finally:
        m.stop()


def users_shared_folder(
    factory: pytest.TempPathFactory, name: str, u: User
) -> tuple[Path, Path, Path]:
    """(base, SRC, SRC/shared): `shared/` is USER's, where others may keep their files."""
    base = open_tmp(factory, name)
    src = base / "src"
    shared = src / "shared"
    for folder in (src, shared):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    os.chown(shared, u.uid, u.gid)
    return base, src, shared


RACE_ARCHIVE = """
import ctypes, os, sys, threading
real, decoy, shown, tries = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
done, got = threading.Event(), []
def swap():  # renameat2(RENAME_EXCHANGE), an even number of times: left as it was
    while not done.is_set():
        for _ in range(2):
            libc.renameat2(-100, real.encode(), -100, decoy.encode(), 2)
t = threading.Thread(target=swap)
t.start()
try:
    for _ in range(tries):
        try:
            os.listdir(os.path.dirname(shown))  # its folder read again, as it is now
            got.append(os.getxattr(shown, "user.decant.sha256").decode())
            break
        except OSError:
            pass
finally:
    done.set()
    t.join()
print(repr(got))
"""


def test_another_user_s_archive_swapped_in_does_not_lend_its_digest(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """USER owns `shared/`, in which another user keeps a folder archive whose manifest is
    0600. USER swapped it (renameat2 RENAME_EXCHANGE, over and over) with a folder of their
    own holding a readable `.decant/manifest.json`: the archive described was the other
    user's, the manifest its mask was taken from by path USER's, and USER read the private
    manifest's sha256 through the mount."""
    u = unprivileged
    base, src, shared = users_shared_folder(tmp_path_factory, "rt40a-archive", u)
    archive = shared / "a.tif.zarr"
    _folder_archive(base, "a.tif", 3, archive)
    decoy = shared / "decoy.zarr"
    (decoy / ".decant").mkdir(parents=True)
    (decoy / ".decant/manifest.json").write_text("{}")  # no archive: nothing of it is shown
    for path in [decoy, *decoy.rglob("*")]:
        os.chown(path, u.uid, u.gid)
    (archive / ".decant/manifest.json").chmod(0o600)
    assert u.errno_of("read(p)", p=archive / ".decant/manifest.json") == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        shown = m.mnt / "shared" / "a.tif"
        digest = os.getxattr(shown, "user.decant.sha256").decode()  # root reads it
        assert u.errno_of("os.getxattr(p, 'user.decant.sha256')", p=shown) == errno.EACCES
        done = u.run("/usr/bin/python3", "-I", "-c", RACE_ARCHIVE, str(archive), str(decoy),
                     str(shown), "3000", timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert digest not in done.stdout, "another user's private manifest's sha256 read"
        deadline = time.monotonic() + 10  # shown again once the last swap is rescanned
        while not shown.exists():
            assert time.monotonic() < deadline, m.log_text()[-2000:]
            time.sleep(0.1)
        assert os.getxattr(shown, "user.decant.sha256").decode() == digest  # as it was
        assert u.errno_of("os.getxattr(p, 'user.decant.sha256')", p=shown) == errno.EACCES
    finally:
        m.stop()
