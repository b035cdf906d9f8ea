"""The persistent index: schema versions, and a verified state keyed by more than size and mtime."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

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


def test_descriptions_kept_together_are_each_found_and_one_that_cannot_be_written_is_left_out(
    tmp_path: Path,
) -> None:
    """put_many: a folder's new descriptions in one transaction; a description whose JSON
    cannot be made is returned, not kept, and costs the others nothing."""
    from vfs.backends.base import Description, Entry

    class Unwritable(Description):
        def head_json_text(self) -> str:
            raise ValueError("not JSON")

    index = DescriptionIndex(tmp_path / "index.sqlite")
    rows = [(tmp_path / f"a{i}.zarr.zip", "decant", i, 20, Description(f"a{i}", Entry(size=i)),
             30 + i, 40) for i in range(300)]  # fmt: skip
    bad = Unwritable("bad", Entry(size=1))
    rows.insert(150, (tmp_path / "bad.zarr.zip", "decant", 1, 20, bad, 7, 40))
    refused = index.put_many(rows)
    assert [(p, str(e)) for p, e in refused] == [(tmp_path / "bad.zarr.zip", "not JSON")]
    for path, backend, size, mtime, desc, ino, ctime in rows:
        want = None if desc is bad else desc
        assert index.get(path, backend, size, mtime, ino, ctime) == want
    index.close()
    again = DescriptionIndex(tmp_path / "index.sqlite")  # committed, not only seen in-process
    assert again.get(tmp_path / "a299.zarr.zip", "decant", 299, 20, 329, 40) == rows[300][4]
    again.close()


def test_descriptions_asked_for_together_are_those_of_the_very_versions_asked_for(
    tmp_path: Path,
) -> None:
    """get_many: what get would give for each, over more names than one query takes."""
    from vfs.backends.base import Description, Entry

    index = DescriptionIndex(tmp_path / "index.sqlite")
    odd = Path(os.fsdecode(b"/src/caf\xe9.zarr.zip"))  # a name that is not UTF-8
    paths = [Path(f"/src/a{i}.zarr.zip") for i in range(1200)] + [odd]
    for i, path in enumerate(paths):
        index.put(path, "decant", i, 20, Description(f"a{i}", Entry(size=i)), 30, 40)
    wanted = [(p, "decant", i, 20, 30, 40) for i, p in enumerate(paths)]
    wanted[7] = (paths[7], "decant", 7, 20, 30, 41)  # another version: ctime moved
    wanted[8] = (paths[8], "c4gh", 8, 20, 30, 40)  # another backend's
    wanted.append((Path("/src/never.zarr.zip"), "decant", 1, 2, 3, 4))
    found = index.get_many(wanted)
    assert found == {(str(p), b): index.get(p, b, s, m, ino, c)
                     for p, b, s, m, ino, c in wanted if index.get(p, b, s, m, ino, c)}  # fmt: skip
    assert len(found) == len(paths) - 2 and found[(str(odd), "decant")].name == "a1200"
    index.close()


def test_large_descriptions_are_not_read_back_together(tmp_path: Path) -> None:
    """get_many leaves a description longer than RECALL_TOGETHER unread (None: read it alone
    where it is wanted): a listing that recalled every tree of a folder at once held them
    all (100 links to a package of 20,000 members: 2.25 GB, red team 95 F4)."""
    from vfs.backends.base import Description, Entry
    from vfs.mount.index import RECALL_TOGETHER

    index = DescriptionIndex(tmp_path / "index.sqlite")
    big_root = Entry(is_dir=True)
    for i in range(RECALL_TOGETHER // 40):
        big_root.children[f"member-{i:08d}.bin"] = Entry(size=i)
    big, small = Path("/src/big.tar.c4gh"), Path("/src/small.zarr.zip")
    index.put(big, "c4gh", 1, 2, Description("big", big_root), 3, 4)
    index.put(small, "decant", 5, 6, Description("small", Entry(size=5)), 7, 8)
    found = index.get_many([(big, "c4gh", 1, 2, 3, 4), (small, "decant", 5, 6, 7, 8)])
    assert found == {(str(big), "c4gh"): None,
                     (str(small), "decant"): index.get(small, "decant", 5, 6, 7, 8)}  # fmt: skip
    alone = index.get(big, "c4gh", 1, 2, 3, 4)
    assert alone is not None and len(alone.root.children) == len(big_root.children)
    index.close()


def _big_root(n: int, seed: str = "") -> Any:
    from vfs.backends.base import Entry

    root = Entry(is_dir=True)
    for i in range(n):
        root.children[f"member{seed}-{i:08d}.bin"] = Entry(size=i)
    return root


def _trees(index: DescriptionIndex) -> int:
    return int(index._db.execute("SELECT count(*) FROM trees").fetchone()[0])


def test_a_large_tree_is_kept_once_for_every_archive_that_presents_it(tmp_path: Path) -> None:
    """Red team 95 F4: 100 hard links to one package of 20,000 members kept 100 copies of its
    tree, 424 MB of index on root's disk (a link costs its maker nothing). A tree over
    RECALL_TOGETHER is kept once, by its SHA-256; each row keeps its own name."""
    from vfs.backends.base import Description
    from vfs.mount.index import RECALL_TOGETHER

    index = DescriptionIndex(tmp_path / "index.sqlite")
    root = _big_root(RECALL_TOGETHER // 20)
    for i in range(100):
        index.put(Path(f"/src/z{i:03d}.tar.c4gh"), "c4gh", 1, 2, Description(f"z{i:03d}", root),
                  100 + i, 4)  # fmt: skip
    assert _trees(index) == 1
    size = sum(len(doc) for (doc,) in index._db.execute("SELECT doc FROM descriptions"))
    assert size < 100 * 100, "each row keeps only its head"
    got = index.get(Path("/src/z042.tar.c4gh"), "c4gh", 1, 2, 142, 4)
    assert got is not None and got.name == "z042" and got.root == root
    wanted = [(Path(f"/src/z{i:03d}.tar.c4gh"), "c4gh", 1, 2, 100 + i, 4) for i in range(100)]
    assert set(index.get_many(wanted).values()) == {None}  # each read alone, where wanted
    index.close()
    again = DescriptionIndex(tmp_path / "index.sqlite")  # read from the file, not the last
    first, second = (again.get(Path(f"/src/z{i:03d}.tar.c4gh"), "c4gh", 1, 2, 100 + i, 4)
                     for i in (7, 8))  # fmt: skip
    assert first is not None and second is not None and first.root == root
    assert (first.name, second.name) == ("z007", "z008") and second.root is first.root
    again.close()


def test_a_tree_no_row_holds_is_dropped(tmp_path: Path) -> None:
    """A package rewritten again and again (another tree each time), or its links removed,
    leaves no tree behind: by replacing its row, forgetting it, or pruning its path."""
    from vfs.backends.base import Description
    from vfs.mount.index import RECALL_TOGETHER

    index = DescriptionIndex(tmp_path / "index.sqlite")
    n = RECALL_TOGETHER // 20
    src = tmp_path / "src"
    src.mkdir()
    a, b = src / "a.tar.c4gh", src / "b.tar.c4gh"
    a.write_bytes(b"a")
    shared = _big_root(n)
    index.put(a, "c4gh", 1, 2, Description("a", shared), 3, 4)
    index.put(b, "c4gh", 1, 2, Description("b", shared), 3, 4)
    for version in range(5):  # `a` rewritten: a new tree each time, the old one dropped
        index.put(a, "c4gh", 1, 10 + version, Description("a", _big_root(n, str(version))), 3, 4)
    assert _trees(index) == 2  # a's last and the one b holds
    index.forget_description(a, "c4gh")
    assert _trees(index) == 1
    assert index.get(b, "c4gh", 1, 2, 3, 4) is not None
    assert index.prune(src) == 1  # b.tar.c4gh is gone from SRC
    assert _trees(index) == 0
    index.close()


def test_a_doubted_description_is_forgotten_for_every_link_in_its_folder(tmp_path: Path) -> None:
    """Red team 101 F2: a package rewritten through a shared mmap (its stat unchanged) failed
    its check; its row was forgotten, but the next describe took its link's row back
    (`SourceTree._linked`), and it stayed refused. A doubt forgets the links' rows too (not
    another folder's: another file)."""
    from types import SimpleNamespace

    from vfs.backends.base import Description
    from vfs.mount.tree import SourceTree

    index = DescriptionIndex(tmp_path / "index.sqlite")
    root = _big_root(4000)
    for where in ("/src/a.tar.c4gh", "/src/b.tar.c4gh", "/elsewhere/a.tar.c4gh"):
        index.put(Path(where), "c4gh@1", 1, 2, Description(Path(where).name, root), 77, 4)
    tree = SourceTree(tmp_path, [], index=index)
    node = SimpleNamespace(backend=SimpleNamespace(name="c4gh"), real=Path("/src/a.tar.c4gh"),
                           version=(77, 1, 2, 4), uid=0)  # fmt: skip
    tree.doubt(node)  # type: ignore[arg-type]
    kept = {row[0] for row in index._db.execute("SELECT path FROM descriptions")}
    assert kept == {"/elsewhere/a.tar.c4gh"}
    assert _trees(index) == 1
    index.close()
