"""Red team, round 38a: GDI packages and AcqStore collections in a local SRC, mounted with
`allow_other` and read by an unprivileged user.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import load_tool
from tests.mount.conftest import Mount, User, open_tmp
from tests.toolbox import acl

corpus: ModuleType = load_tool("make_c4gh_corpus")


@dataclass
class Gdi:
    m: Mount
    src: Path
    keys: dict[str, Any]
    members: list[tuple[str, bytes]]


@pytest.fixture
def gdi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gdi]:
    """Root's package `pkg.tar.c4gh` (0644) in SRC, members shown 0444 to everyone."""
    base = open_tmp(tmp_path_factory, "rt38a")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    members = corpus.gdi_members(parquet_rows=(300, 40))
    corpus.write_package(src / "pkg.tar.c4gh", members, keys["writer"], [keys["node"]])
    (src / "pkg.tar.c4gh").chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only", "--c4gh-key", str(keys["node"].secret_path),
                "--c4gh-mode", "0555")  # fmt: skip
        yield Gdi(m, src, keys, members)
    finally:
        m.stop()


def deny_user(path: Path, uid: int) -> None:
    """Mode 0644 as `ls` shows it, but an ACL entry giving `uid` no access at all."""
    any_id = 0xFFFFFFFF
    os.setxattr(path, "system.posix_acl_access",
                acl((0x01, 6, any_id), (0x02, 0, uid), (0x04, 4, any_id), (0x10, 4, any_id),
                    (0x20, 4, any_id)))  # fmt: skip


def test_a_package_whose_acl_denies_a_user_is_not_read_by_that_user(
    gdi: Gdi, unprivileged: User
) -> None:
    """`setfacl -m u:USER:- pkg.tar.c4gh` (mode bits still 0644): USER cannot read the package
    in SRC, but the mount showed its members 0444 from the mode bits alone and the kernel let
    USER read them decrypted (exit 0, the manifest's bytes); a plain file and a folder with
    such an ACL were shown to USER the same way. The ACL now narrows the bits shown."""
    u = unprivileged
    pkg, plain, folder = gdi.src / "pkg.tar.c4gh", gdi.src / "plain.txt", gdi.src / "private"
    plain.write_bytes(b"secret\n")
    plain.chmod(0o644)
    folder.mkdir(mode=0o755)
    (folder / "inner.txt").write_bytes(b"inner\n")
    (folder / "inner.txt").chmod(0o644)
    for path in (pkg, plain, folder):
        deny_user(path, u.uid)
    assert stat.S_IMODE(pkg.stat().st_mode) == 0o644  # what `ls -l` shows
    assert u.errno_of("read(p)", p=pkg) == errno.EACCES
    assert u.errno_of("read(p)", p=plain) == errno.EACCES
    assert u.errno_of("read(p)", p=folder / "inner.txt") == errno.EACCES
    mnt = gdi.m.mnt
    assert (mnt / "pkg.tar.c4gh" / "manifest.json").read_bytes() == gdi.members[0][1]  # root
    for name, _data in gdi.members:
        assert u.errno_of("read(p)", p=mnt / "pkg.tar.c4gh" / name) == errno.EACCES, name
    assert u.errno_of("read(p)", p=mnt / "plain.txt") == errno.EACCES
    assert u.errno_of("read(p)", p=mnt / "private" / "inner.txt") == errno.EACCES
    assert u.errno_of("os.getxattr(p, 'user.c4gh.writer_fingerprint')",
                      p=mnt / "pkg.tar.c4gh") == errno.EACCES  # fmt: skip


def _collection(factory: pytest.TempPathFactory, tag: str, **options: object) -> tuple[Path, Path]:
    """(base, src): `src/coll`, a corpus AcqStore collection every user may read, in a folder
    other users may traverse."""
    base = open_tmp(factory, tag)
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    load_tool("make_acqstore_corpus").make_collection(src / "coll", **options)
    for path in [src / "coll", *(src / "coll").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return base, src


def scanned_archive(factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the original TIFF, its decant archive `scan.tif.zarr.zip`): what a collection's view
    presents as a byte-exact original."""
    import numpy as np
    import tifffile

    from vfs.decant.packer import pack_file

    folder = factory.mktemp("scan")
    original = folder / "scan.tif"
    scan = np.random.default_rng(11).integers(0, 60000, (4, 96, 72), dtype=np.uint16)
    tifffile.imwrite(original, scan, photometric="minisblack")
    return original, pack_file(original, folder / "scan.tif.zarr.zip").archive


def digests_hidden(m: Mount, u: User, original: Path, what: str) -> Path:
    """Every view file that is `original` (it has a sha256 xattr) reads as it for root, and
    USER is told neither its sha256 nor that it may read it; the members folder."""
    member = m.mnt / "coll" / "members"
    tifs = [p for p in member.rglob("*.tif") if "user.decant.sha256" in os.listxattr(p)]
    assert tifs, m.log_text()[-2000:]
    for tif in tifs:
        assert tif.read_bytes() == original.read_bytes()  # its owner (root) reads it
        assert u.errno_of("read(p)", p=tif) == errno.EACCES
        got = u.errno_of("os.getxattr(p, 'user.decant.sha256')", p=tif)
        assert got == errno.EACCES, f"another user read the sha256 of a private {what}"
        assert not u.value_of("os.access(p, os.R_OK)", p=tif)
    return member


def _ids_hidden(
    base: Path, src: Path, u: User, doc: dict[str, Any], member: dict[str, Any], ids: list[str]
) -> None:
    """Mounted with allow_other: root lists `member`'s analysis ids, USER lists neither its
    folder nor an id's, and another member (its documents readable) is listed to USER."""
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        folder = m.mnt / "coll" / "members" / member["name"]
        assert set(ids) <= set(os.listdir(folder)), m.log_text()[-2000:]  # root sees them
        assert u.errno_of("os.listdir(p)", p=folder) == errno.EACCES
        for aid in ids:
            assert u.errno_of("os.listdir(p)", p=folder / aid) == errno.EACCES, aid
        others = [x for x in doc["members"] if x is not member]
        assert others  # positive control
        assert u.errno_of("os.listdir(p)", p=m.mnt / "coll" / "members" / others[0]["name"]) == 0
    finally:
        m.stop()


def test_an_acqstore_table_whose_acl_denies_a_user_is_not_read_through_the_view(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A collection's table CSV (0644) with an ACL entry denying USER: the members view's
    check of what an open reads on the caller's behalf looked at the mode bits only, so the
    root daemon read the table for USER through `members/tables/`."""
    u = unprivileged
    base, src = _collection(tmp_path_factory, "rt38a-acq")
    doc = json.loads((src / "coll/acqstore/collection.json").read_text())
    (denied_id, denied), (other_id, _other) = (
        (t["id"], src / "coll" / t["path"]) for t in doc["resources"]["tables"][:2]
    )
    denied.write_bytes(b"patient,diagnosis\np1,TOP SECRET\n")
    deny_user(denied, u.uid)
    assert u.errno_of("read(p)", p=denied) == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        view = m.mnt / "coll" / "members" / "tables"
        shown, kept = view / f"{denied_id}.csv", view / f"{other_id}.csv"
        assert shown.read_bytes() == denied.read_bytes()  # root reads it
        assert u.errno_of("read(p)", p=shown) == errno.EACCES
        assert u.errno_of("read(p)", p=kept) == 0  # positive control
    finally:
        m.stop()


def test_a_pax_header_of_digits_does_not_stop_the_daemon_for_everyone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A package whose TAR holds a 48 KiB PAX header of digits: tarfile's regular expressions
    (CVE-2024-6232, Python 3.11.7 here) took ~6 s over it holding the GIL, and every other
    request of the mount waited (a `cat` of a plain file: as long). The walk now stops at such
    a header: the members before it are served, the log names the package and the reason."""
    import tarfile
    import threading

    base = open_tmp(tmp_path_factory, "rt38a-pax")
    src = base / "src"
    (src / "hostile").mkdir(parents=True)
    (src / "readme.txt").write_bytes(b"readme\n")
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    record = b"1" * (48 << 10)
    pax = corpus.raw_header(b"././@PaxHeader", len(record), tarfile.XHDTYPE)
    items = [("manifest.json", b"{}"), ("before.txt", b"before\n"), pax + corpus._padded(record),
             ("after.txt", b"a\n")]  # fmt: skip
    plain = corpus.raw_tar(items)
    (src / "hostile" / "pax.tar.c4gh").write_bytes(
        corpus.encrypt(plain, keys["writer"].secret, [keys["node"].public])
    )
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("--c4gh-key", str(keys["node"].secret_path))
        listed: list[object] = []
        walker = threading.Thread(
            target=lambda: listed.append(sorted(os.listdir(m.mnt / "hostile" / "pax.tar.c4gh")))
        )
        walker.start()
        time.sleep(0.3)  # the walk is under way
        start = time.monotonic()
        assert (m.mnt / "readme.txt").read_bytes() == b"readme\n"
        took = time.monotonic() - start
        walker.join(30)
        assert took < 1.0, f"a read of a plain file waited {took:.1f} s for the walk"
        assert listed == [["before.txt", "manifest.json"]]
        assert (m.mnt / "hostile" / "pax.tar.c4gh" / "before.txt").read_bytes() == b"before\n"
        text = m.log_text()
        assert "pax.tar.c4gh: PAX header at 2048 holds a run of more than 64 digits" in text
        assert "Traceback" not in text
    finally:
        m.stop()


def test_a_package_with_a_malformed_sparse_map_logs_a_reason_not_a_traceback(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A member marked GNU sparse (PAX 1.0) whose map is not a number: tarfile's ValueError went
    past the TAR walk, the daemon logged "unexpected error describing the archive" with a
    traceback and showed the package as its raw file. Now the walk stops there with a reason
    naming the package, and the member before it is served."""
    import tarfile

    base = open_tmp(tmp_path_factory, "rt38a-sparse")
    src = base / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    body = b" GNU.sparse.major=1\n"
    major = str(len(body) + 2).encode() + body
    body = b" GNU.sparse.minor=0\n"
    pax_body = major + str(len(body) + 2).encode() + body
    pax = corpus.raw_header(b"././@PaxHeader", len(pax_body), tarfile.XHDTYPE)
    sparse = pax + corpus._padded(pax_body) + corpus.raw_member(b"s.bin", b"garbage\n")
    plain = corpus.raw_tar([("manifest.json", b"{}"), ("before.txt", b"before\n"), sparse,
                            ("after.txt", b"a\n")])  # fmt: skip
    (src / "sparse.tar.c4gh").write_bytes(
        corpus.encrypt(plain, keys["writer"].secret, [keys["node"].public])
    )
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("--c4gh-key", str(keys["node"].secret_path))
        folder = m.mnt / "sparse.tar.c4gh"
        assert folder.is_dir(), m.log_text()[-2000:]
        assert sorted(os.listdir(folder)) == ["before.txt", "manifest.json"]
        assert (folder / "before.txt").read_bytes() == b"before\n"
        text = m.log_text()
        assert "Traceback" not in text, text[-3000:]
        assert "sparse.tar.c4gh: invalid TAR header at 2048 (ValueError: " in text
    finally:
        m.stop()


def test_a_private_archive_s_digest_is_not_told_through_a_collection_view(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A collection whose decant archive `images/scan.tif.zarr.zip` its owner keeps 0600: its
    members view showed the archive's original (`Kymograph 1.tif`) 0444, with the collection
    folder's modes, so another user read its sha256 (`getfattr -d`) and `access(R_OK)` said
    yes; only the open was refused. A view's file now takes the owner, group and read bits of
    what it is read from, as a nested series member takes its bundle's."""
    u = unprivileged
    original, packed = scanned_archive(tmp_path_factory)
    base, src = _collection(tmp_path_factory, "rt38a-view", decant_archive=packed)
    archive = src / "coll" / "images" / "scan.tif.zarr.zip"
    archive.chmod(0o600)
    assert u.errno_of("read(p)", p=archive) == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        member = digests_hidden(m, u, original, "archive")
        stack = member / "Stack 2" / "Stack 2.tif"  # a synthesized TIFF of a readable image
        assert stat.S_IMODE(stack.stat().st_mode) == 0o444
        assert u.errno_of("read(p)", p=stack) == 0
        (table,) = (member / "tables").glob("velocity*.csv")
        assert u.errno_of("read(p)", p=table) == 0
    finally:
        m.stop()


def test_a_private_collection_document_s_names_are_not_listed_to_others(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A collection whose owner keeps `acqstore/collection.json` 0600: another user cannot read
    it in SRC, but the members view, shown with the collection folder's modes (0555), listed
    its member names and table ids (`ls members/`), read from that document by the root
    daemon. The view is now shown without the read and search bits of a class that may not
    read the document, as a folder archive is for its manifest."""
    u = unprivileged
    base, src = _collection(tmp_path_factory, "rt38a-names")
    doc = src / "coll" / "acqstore" / "collection.json"
    doc.chmod(0o600)
    assert u.errno_of("read(p)", p=doc) == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        view = m.mnt / "coll" / "members"
        names = sorted(os.listdir(view))
        assert "Stack 2" in names, m.log_text()[-2000:]
        got = u.errno_of("os.listdir(p)", p=view)
        assert got == errno.EACCES, "member names of a private collection.json listed"
        assert u.errno_of("os.stat(p)", p=view / "Stack 2") == errno.EACCES
        doc.chmod(0o644)  # positive control: readable again, listed again
        time.sleep(0.5)
        deadline = time.monotonic() + 5
        while u.errno_of("os.listdir(p)", p=view) != 0:
            assert time.monotonic() < deadline, "the view stayed closed"
            time.sleep(0.2)
        assert sorted(u.value_of("os.listdir(p)", p=view)) == names
    finally:
        m.stop()


def test_a_private_analyses_document_s_ids_are_not_listed_to_others(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A member's `analyses.json` kept 0600 by its owner: the view showed its analysis ids as
    folders of the member's folder (and their resource ids as CSV names) with the collection
    folder's modes, to anyone who may enter the collection. The member's folder and those
    folders now lose the bits of a class that may not read the document."""
    u = unprivileged
    base, src = _collection(tmp_path_factory, "rt38a-analyses")
    doc = json.loads((src / "coll/acqstore/collection.json").read_text())
    member = next(m for m in doc["members"] if m["resources"].get("analyses"))
    analyses = src / "coll" / member["resources"]["analyses"]
    ids = [a["id"] for a in json.loads(analyses.read_text())["analyses"]]
    analyses.chmod(0o600)
    assert u.errno_of("read(p)", p=analyses) == errno.EACCES
    _ids_hidden(base, src, u, doc, member, ids)
