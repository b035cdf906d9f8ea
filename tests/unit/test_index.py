"""The persistent index: schema versions, and a verified state keyed by more than size and mtime."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from vfs.mount.index import SCHEMA_VERSION, DescriptionIndex, stamp_of


def test_verified_state_is_lost_when_the_file_is_rewritten_with_its_mtime_restored(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "a.zarr.zip"
    archive.write_bytes(b"x" * 100)
    index = DescriptionIndex(tmp_path / "index.sqlite")
    index.mark_verified(archive, "", stamp_of(archive), "ab" * 32)
    assert index.is_verified(archive, "", stamp_of(archive), "ab" * 32)
    assert not index.is_verified(archive, "", stamp_of(archive), "cd" * 32)
    st = archive.stat()
    with open(archive, "r+b") as fh:  # bit rot by hand: same size, mtime put back
        fh.write(b"y")
    os.utime(archive, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert stamp_of(archive)[:2] == (st.st_size, st.st_mtime_ns)
    assert not index.is_verified(archive, "", stamp_of(archive), "ab" * 32)  # ctime moved
    index.close()


def test_a_description_is_kept_for_the_inode_and_ctime_it_was_made_from(tmp_path: Path) -> None:
    """An archive rewritten in place with its mtime put back (`cp -p`, `touch -r`) keeps path,
    size and mtime: its predecessor's description (and sha256) must not stand in for it."""
    from vfs.backends.base import Description, Entry

    index = DescriptionIndex(tmp_path / "index.sqlite")
    archive = tmp_path / "a.zarr.zip"
    desc = Description(name="a", root=Entry(is_dir=True))
    index.put(archive, "decant", 10, 20, desc, 30, 40)
    assert index.get(archive, "decant", 10, 20, 30, 40) == desc
    assert index.get(archive, "decant", 10, 20, 30, 41) is None  # ctime moved
    assert index.get(archive, "decant", 10, 20, 31, 40) is None  # another inode
    index.close()


def test_an_index_of_another_schema_version_is_set_aside(tmp_path: Path) -> None:
    db_path = tmp_path / "index.sqlite"
    old = sqlite3.connect(db_path)
    old.execute("CREATE TABLE verified (path TEXT, member TEXT, size INT, mtime_ns INT, sha TEXT)")
    old.execute("INSERT INTO verified VALUES ('/a', '', 1, 1, 'x')")
    old.execute("PRAGMA user_version=1")
    old.commit()
    old.close()
    index = DescriptionIndex(db_path)
    assert (tmp_path / "index.old").exists()
    version = sqlite3.connect(db_path).execute("PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION
    assert not index.is_verified(Path("/a"), "", (1, 1, 0, 0), "x")
    index.close()


def test_a_damaged_index_file_is_set_aside(tmp_path: Path) -> None:
    db_path = tmp_path / "index.sqlite"
    db_path.write_bytes(b"not a database at all" * 100)
    DescriptionIndex(db_path).close()
    assert (tmp_path / "index.corrupt").exists()


def test_names_that_are_not_utf8_are_kept_apart_from_every_other_name(tmp_path: Path) -> None:
    """A file name is bytes of anyone's choice; sqlite keeps text as UTF-8. A name that is not
    UTF-8 (Python holds it with surrogates) is stored by its bytes, never confused with the
    name whose text spells those bytes out."""
    from vfs.backends.base import Description, Entry

    odd = tmp_path / os.fsdecode(b"w\xff.zarr.zip")
    spelled = tmp_path / "w\\xff.zarr.zip"
    index = DescriptionIndex(tmp_path / "index.sqlite")
    desc = Description(name="w.tif", root=Entry(is_dir=True))
    index.put(odd, "decant", 10, 20, desc, 30, 40)
    assert index.get(odd, "decant", 10, 20, 30, 40) == desc
    assert index.get(spelled, "decant", 10, 20, 30, 40) is None
    stamp = (10, 20, 30, 40)
    member = os.fsdecode(b"m\xfe.txt")
    index.mark_verified(odd, member, stamp, "ab" * 32)
    assert index.is_verified(odd, member, stamp, "ab" * 32)
    assert not index.is_verified(spelled, member, stamp, "ab" * 32)
    index.put_digests(odd, stamp, {"0/0.0": 7})
    assert index.digests(odd, stamp) == {"0/0.0": 7}
    index.forget_verified(odd, member)
    assert not index.is_verified(odd, member, stamp, "ab" * 32)
    assert index.digests(odd, stamp) is None
    index.close()
