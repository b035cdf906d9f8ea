"""A hostile local user against a mount run by root with `-o allow_other` (README, "Security
model"): every attack is a real syscall made by an unprivileged user, and must be denied with the
errno a local filesystem would give. Positive controls (what the same user may do) keep each
denial from passing merely because the user can reach nothing at all.

Expected bytes come from the files written here (sha256), never from vfs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import Mount, User, open_tmp
from tests.toolbox import load_tool
from vfs.decant.packer import pack_file

corpus: ModuleType = load_tool("make_c4gh_corpus")

MEMBER = "manifest.json"
ID = Path("/usr/bin/id")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not {what} after {timeout:.0f} s"
        time.sleep(0.1)


def start(base: Path, src: Path, *extra: str, name: str = "mnt") -> Mount:
    m = Mount(src, base / name, base / f"{name}.log", base / f"{name}-index")
    return m.start("-o", "allow_other", *extra)


def owner(st: os.stat_result) -> tuple[int, int, int]:
    return (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)


# -- reading: modes and owners of SRC decide, through allow_other ----------------------------


@dataclass
class ReadSide:
    m: Mount
    tif: bytes  # the original behind both archives
    members: list[tuple[str, bytes]]


def tiff_bytes(path: Path) -> bytes:
    data = np.arange(3 * 40 * 30, dtype=np.uint16).reshape(3, 40, 30)
    tifffile.imwrite(path, data, photometric="minisblack")
    return path.read_bytes()


@pytest.fixture(scope="module", params=["ro", "rw"])
def read_side(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> Iterator[ReadSide]:
    """The README's fstab line (`ro,allow_other`) and its systemd env (`allow_other`, writable)."""
    base = open_tmp(tmp_path_factory, f"reads-{request.param}")
    src, work = base / "src", base / "work"
    src.mkdir(mode=0o755)
    work.mkdir()
    (src / "open.txt").write_bytes(b"anyone may read this\n")
    (src / "secret.txt").write_bytes(b"root only\n")
    (src / "secret.txt").chmod(0o600)
    (src / "private").mkdir(mode=0o700)
    (src / "private" / "inside.txt").write_bytes(b"0644, but in a 0700 folder\n")
    (src / "private" / "inside.txt").chmod(0o644)
    tif = tiff_bytes(work / "scan.tif")
    for name, mode in (("open", 0o644), ("secret", 0o600)):
        shutil.copy(work / "scan.tif", work / f"{name}.tif")
        pack_file(work / f"{name}.tif", src / f"{name}.tif.zarr.zip")
        (src / f"{name}.tif.zarr.zip").chmod(mode)
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    members = corpus.gdi_members(parquet_rows=(40, 20), long_name=False)
    for name, mode, gid in (("pkg-0600", 0o600, 0), ("pkg-0644", 0o644, 0),
                            ("pkg-group", 0o640, unprivileged.gid)):  # fmt: skip
        package = src / f"{name}.tar.c4gh"
        corpus.write_package(package, members, keys["writer"], [keys["node"]])
        os.chown(package, 0, gid)
        package.chmod(mode)
    extra = ["-o", "ro"] if request.param == "ro" else []
    m = start(base, src, *extra, "--c4gh-key", str(keys["node"].secret_path))
    try:
        yield ReadSide(m, tif, members)
    finally:
        m.stop()


@pytest.mark.parametrize(
    ("path", "expr", "code"),
    [
        ("secret.txt", "read(p)", errno.EACCES),
        ("private/inside.txt", "read(p)", errno.EACCES),
        ("private", "os.listdir(p)", errno.EACCES),
        ("secret.tif", "read(p)", errno.EACCES),  # the original of a 0600 archive
        (f"pkg-0600.tar.c4gh/{MEMBER}", "read(p)", errno.EACCES),
        ("pkg-0600.tar.c4gh", "os.listdir(p)", errno.EACCES),
        (f"pkg-0644.tar.c4gh/{MEMBER}", "read(p)", errno.EACCES),  # --c4gh-mode 0440
    ],
    ids=[
        "0600-file",
        "in-0700-folder",
        "list-0700-folder",
        "0600-archive",
        "0600-package",
        "list-0600-package",
        "0644-package",
    ],
)
def test_user_cannot_read_what_src_denies(
    read_side: ReadSide, unprivileged: User, path: str, expr: str, code: int
) -> None:
    """Each read a mode of SRC forbids the user is refused through the mount."""
    assert unprivileged.errno_of(expr, p=read_side.m.mnt / path) == code
    # SRC itself gives the same answer: the mount grants nothing SRC does not.
    if ".tar.c4gh" not in path:
        real = read_side.m.src / path.replace("secret.tif", "secret.tif.zarr.zip")
        assert unprivileged.errno_of(expr, p=real) == code


def test_user_reads_what_src_allows(read_side: ReadSide, unprivileged: User) -> None:
    mnt = read_side.m.mnt
    assert unprivileged.value_of("read(p)", p=mnt / "open.txt") == sha256(b"anyone may read this\n")
    assert unprivileged.value_of("read(p)", p=mnt / "open.tif") == sha256(read_side.tif)
    for name, data in read_side.members:  # the package's group is the user's: 0440 lets it in
        got = unprivileged.value_of("read(p)", p=mnt / "pkg-group.tar.c4gh" / name)
        assert got == sha256(data), name
    shown = set(unprivileged.value_of("os.listdir(p)", p=mnt))
    assert {"open.txt", "secret.txt", "private", "open.tif", "secret.tif"} <= shown


# -- writing: what chmod, chown, open and create may do as root on the user's behalf ----------


@dataclass
class WriteSide:
    m: Mount
    src: Path
    before: dict[str, tuple[int, int, int]]  # (mode, uid, gid) of SRC's entries at the start


SRC_ENTRIES = ("", "root.txt", "rootdir", "userdir")


def src_owners(src: Path) -> dict[str, tuple[int, int, int]]:
    return {name: owner((src / name).lstat()) for name in SRC_ENTRIES}


@pytest.fixture(scope="module")
def write_side(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[WriteSide]:
    base = open_tmp(tmp_path_factory, "writes")
    src = base / "src"
    src.mkdir(mode=0o755)
    (src / "root.txt").write_bytes(b"root's file\n")
    (src / "root.txt").chmod(0o644)
    (src / "rootdir").mkdir(mode=0o755)
    (src / "userdir").mkdir(mode=0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    m = start(base, src, "--settle", "0.5")
    try:
        yield WriteSide(m, src, src_owners(src))
    finally:
        m.stop()


def in_src_unchanged(w: WriteSide) -> None:
    assert src_owners(w.src) == w.before
    assert (w.src / "root.txt").read_bytes() == b"root's file\n"
    assert sorted(os.listdir(w.src / "rootdir")) == []


@pytest.mark.parametrize(
    ("path", "expr", "code"),
    [
        ("root.txt", "os.chmod(p, 0o666)", errno.EPERM),
        ("root.txt", "os.chown(p, uid, -1)", errno.EPERM),
        ("root.txt", "os.chown(p, -1, gid)", errno.EPERM),
        ("rootdir", "os.chmod(p, 0o777)", errno.EPERM),
        ("", "os.chmod(p, 0o777)", errno.EPERM),  # the mount root: SRC itself
        ("root.txt", "write(p, flags=os.O_WRONLY | os.O_TRUNC)", errno.EACCES),
        ("root.txt", "write(p, flags=os.O_WRONLY | os.O_APPEND)", errno.EACCES),
        ("root.txt", "os.truncate(p, 0)", errno.EACCES),
        ("root.txt", "os.utime(p, (0, 0))", errno.EPERM),
        ("root.txt", "os.rename(p, p + '.moved')", errno.EACCES),
        ("rootdir/new.txt", "write(p)", errno.EACCES),
        ("rootdir/new", "os.mkdir(p)", errno.EACCES),
        ("new.txt", "write(p)", errno.EACCES),  # SRC's root is root's 0755 folder
        ("userdir", "os.chown(p, 0, -1)", errno.EPERM),  # giving away its own folder to root
        ("userdir", "os.chown(p, -1, 0)", errno.EPERM),  # or to a group it is not in
        (".decant-status", "os.chmod(p, 0o666)", errno.EPERM),
        (".decant-status", "os.chown(p, uid, gid)", errno.EPERM),
        (".decant-status", "write(p)", errno.EACCES),  # echo x > MNT/.decant-status
        (".decant-status", "os.truncate(p, 0)", errno.EACCES),
    ],
)
def test_user_cannot_change_roots_files(
    write_side: WriteSide, unprivileged: User, path: str, expr: str, code: int
) -> None:
    """chmod/chown of root's entries, writes into root's files and folders, the status file:
    refused by the kernel (default_permissions), and nothing changes in SRC."""
    w, u = write_side, unprivileged
    target = str(w.m.mnt / path) if path else str(w.m.mnt)
    assert u.errno_of(expr, p=target, uid=u.uid, gid=u.gid) == code
    in_src_unchanged(w)


def test_root_cannot_write_the_status_file_either(write_side: WriteSide) -> None:
    """Not even root: the daemon itself refuses, where the kernel's check lets root through."""
    status = write_side.m.mnt / ".decant-status"
    for flags in (os.O_WRONLY | os.O_TRUNC, os.O_RDWR, os.O_WRONLY | os.O_APPEND):
        with pytest.raises(OSError) as caught:
            os.open(status, flags)
        assert caught.value.errno == errno.EACCES
    with pytest.raises(OSError) as caught:
        os.chmod(status, 0o666)
    assert caught.value.errno == errno.EPERM
    in_src_unchanged(write_side)


@pytest.mark.parametrize("how", ["chmod-after-copy", "mode-at-create"])
def test_setuid_copy_never_runs_as_root(
    write_side: WriteSide, unprivileged: User, how: str
) -> None:
    """cp /usr/bin/id into a folder the user owns and make it setuid: wherever the file ends up
    (spooled, published, through the mount) it is the user's, without S_ISUID/S_ISGID."""
    w, u = write_side, unprivileged
    name = f"id-{how}"
    shown, spooled, published = (w.m.mnt / "userdir" / name,
                                 w.src / ".decant-spool/files/userdir" / name,
                                 w.src / "userdir" / name)  # fmt: skip
    if how == "chmod-after-copy":
        assert u.run("cp", str(ID), str(shown)).returncode == 0
        assert u.errno_of("os.chmod(p, 0o6755)", p=shown) == 0  # the owner may chmod
    else:
        copy = "write(p, open(src, 'rb').read(), mode=0o6755)"  # O_CREAT with the bits
        assert u.errno_of(copy, p=shown, src=ID) == 0
    st = shown.stat()
    assert (st.st_uid, st.st_gid) == (u.uid, u.gid)
    assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0, oct(st.st_mode)
    with contextlib.suppress(FileNotFoundError):  # unless published already (settle 0.5 s)
        assert owner(spooled.stat()) == (0o755, u.uid, u.gid)
    # Spooled or not, the user reaches nothing under SRC/.decant-spool (a 0700 folder).
    assert u.errno_of("os.stat(p)", p=spooled) == errno.EACCES
    assert u.run(str(spooled), "-u").returncode != 0
    wait_for(lambda: published.exists() and not spooled.exists(), "published")
    for path in (published, shown):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (u.uid, u.gid), path
        assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0, (path, oct(st.st_mode))
        ran = u.run(str(path), "-u")
        assert ran.returncode == 0, ran.stderr
        assert int(ran.stdout) == u.uid, path
    assert u.errno_of("os.listdir(p)", p=w.src / ".decant-spool") == errno.EACCES
    in_src_unchanged(w)


def test_setuid_check_can_fail(
    unprivileged: User, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Control: a root-owned setuid copy of id on SRC's filesystem does run as root, so the
    checks above would see an escalation."""
    probe = open_tmp(tmp_path_factory, "setuid-control") / "id"
    shutil.copy(ID, probe)
    probe.chmod(0o4755)
    ran = unprivileged.run(str(probe), "-u")
    assert ran.returncode == 0 and int(ran.stdout) == 0


def test_files_the_user_writes_are_the_users(write_side: WriteSide, unprivileged: User) -> None:
    """Created through the mount, spooled and published: always the creator's, never root's."""
    w, u = write_side, unprivileged
    shown, published = w.m.mnt / "userdir" / "notes.txt", w.src / "userdir" / "notes.txt"
    assert u.errno_of("write(p, b'mine\\n')", p=shown) == 0
    assert u.errno_of("os.mkdir(p)", p=w.m.mnt / "userdir" / "sub") == 0
    for path in (shown, w.m.mnt / "userdir" / "sub", w.src / "userdir" / "sub"):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (u.uid, u.gid), path
    assert u.value_of("os.stat(p).st_uid", p=shown) == u.uid
    wait_for(published.exists, "published")
    st = published.stat()
    assert (st.st_uid, st.st_gid) == (u.uid, u.gid)
    assert published.read_bytes() == b"mine\n"
    in_src_unchanged(w)


# -- a spool outside SRC ----------------------------------------------------------------------


@dataclass
class SpoolElsewhere:
    m: Mount
    src: Path
    spool: Path


def tree_of(src: Path) -> dict[str, tuple[int, int, int]]:
    return {p.relative_to(src).as_posix(): owner(p.lstat()) for p in (src, *src.rglob("*"))}


@pytest.fixture(scope="module")
def spool_elsewhere(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> Iterator[SpoolElsewhere]:
    base = open_tmp(tmp_path_factory, "spool-elsewhere")
    src, spool = base / "src", base / "spool"
    src.mkdir(mode=0o755)
    (src / "root.txt").write_bytes(b"root's file\n")
    (src / "userdir").mkdir(mode=0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    m = start(base, src, "--spool", str(spool), "--settle", "0.5")
    try:
        yield SpoolElsewhere(m, src, spool)
    finally:
        m.stop()


def test_status_file_with_spool_elsewhere(
    spool_elsewhere: SpoolElsewhere, unprivileged: User
) -> None:
    """`echo x > MNT/.decant-status` with `--spool DIR`, by the user and by root, leaves SRC
    where and as it is."""
    s, u = spool_elsewhere, unprivileged
    before = tree_of(s.src)
    status = s.m.mnt / ".decant-status"
    assert u.errno_of("write(p)", p=status) == errno.EACCES
    assert u.errno_of("os.truncate(p, 0)", p=status) == errno.EACCES
    echo = u.run("sh", "-c", f"echo x > {status}")
    assert echo.returncode != 0 and "Permission denied" in echo.stderr
    with pytest.raises(OSError) as caught:
        status.write_text("x\n")  # root passes the kernel's check: the daemon refuses
    assert caught.value.errno == errno.EACCES
    assert s.src.is_dir() and not s.src.is_symlink()
    assert tree_of(s.src) == before
    assert (s.src / "root.txt").read_bytes() == b"root's file\n"
    assert u.errno_of("os.listdir(p)", p=s.spool) == errno.EACCES


def test_staging_with_spool_elsewhere_is_closed(
    spool_elsewhere: SpoolElsewhere, unprivileged: User
) -> None:
    """Published files are built in SRC/.decant-spool/staging even with `--spool DIR`; what is
    built there has the umask's mode until it verified, so the folder must keep others out."""
    s, u = spool_elsewhere, unprivileged
    data = b"written 0600 by root\n"
    fd = os.open(s.m.mnt / "secret.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    wait_for((s.src / "secret.txt").exists, "published")
    assert u.errno_of("read(p)", p=s.m.mnt / "secret.txt") == errno.EACCES  # control
    private = s.src / ".decant-spool"  # its staging/ is where archives are built
    assert private.is_dir()
    assert u.errno_of("os.listdir(p)", p=private) == errno.EACCES
    assert u.errno_of("os.stat(p)", p=private / "staging" / "x") == errno.EACCES


def test_a_copy_of_a_package_the_user_may_not_read_decrypted_stays_ciphertext(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """Root's 0644 package: its ciphertext is readable to all in SRC, its members (0440,
    root's) not to the user. A copy the user makes, through the mount or in SRC itself, is
    the user's own file: decrypting it with the node's key for its owner would hand the user
    the plaintext. Only packages of a --c4gh-owner (default: the daemon's user) are opened."""
    base = open_tmp(tmp_path_factory, "package-copy")
    src = base / "src"
    (src / "userdir").mkdir(parents=True, mode=0o755)
    src.chmod(0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    members = corpus.gdi_members(parquet_rows=(40, 20), long_name=False)
    package = src / "root.tar.c4gh"
    corpus.write_package(package, members, keys["writer"], [keys["node"]])
    package.chmod(0o644)
    key = str(keys["node"].secret_path)
    m = start(base, src, "--settle", "0.3", "--c4gh-key", key)
    try:
        copies_stay_ciphertext(m, package, unprivileged)
    finally:
        m.stop()
    # The operator may name the user: then its packages are decrypted for it.
    trusted = start(base, src, "--c4gh-key", key, "--c4gh-owner", unprivileged.name,
                    "--c4gh-owner", "0", name="trusted")  # fmt: skip
    try:
        for name, data in members:
            got = unprivileged.value_of("read(p)", p=trusted.mnt / "userdir/drop.tar.c4gh" / name)
            assert got == sha256(data), name
        assert sorted(os.listdir(trusted.mnt / "root.tar.c4gh")) == sorted(
            {n.split("/")[0] for n, _ in members}
        )
    finally:
        trusted.stop()


def copies_stay_ciphertext(m: Mount, package: Path, unprivileged: User) -> None:
    src, mnt = m.src, m.mnt
    assert unprivileged.errno_of("read(p)", p=mnt / "root.tar.c4gh" / MEMBER) == errno.EACCES
    copied = unprivileged.run("cp", str(package), str(mnt / "userdir" / "copy.tar.c4gh"))
    assert copied.returncode == 0, copied.stderr
    dropped = unprivileged.run("cp", str(package), str(src / "userdir" / "drop.tar.c4gh"))
    assert dropped.returncode == 0, dropped.stderr
    # Written through the mount under a package's name, it is wrapped in a verbatim archive
    # (vfs/ingest/publish.py read_as_archive): never a package in SRC at all.
    wait_for(lambda: (src / "userdir" / "copy.tar.c4gh.zarr.zip").exists(), "published")
    cipher = sha256(package.read_bytes())
    for name in ("copy.tar.c4gh", "drop.tar.c4gh"):
        wait_for(lambda n=name: n in os.listdir(mnt / "userdir"), f"{name} shown")
        path = mnt / "userdir" / name
        assert unprivileged.errno_of("read(p)", p=path / MEMBER) == errno.ENOTDIR, name
        assert unprivileged.value_of("read(p)", p=path) == cipher, name
    assert "not opened here" in m.log_text()


def test_writing_a_writable_file_of_a_folder_the_user_cannot_write_is_refused(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A write moves a published file into the spool and publishes it anew (a new archive, a
    new name in its folder): a user with write permission on a 0666 file but none on its 0755
    folder merely opened the file for writing, and the daemon replaced `shared.tif` in SRC by
    `shared.tif.zarr.zip` (red team). Now EACCES, and SRC is untouched. The same files in a
    folder the user may write are written as before (the positive control)."""
    base = open_tmp(tmp_path_factory, "rewrite")
    src = base / "src"
    for folder, mode in (("ro", 0o755), ("rw", 0o777)):
        (src / folder).mkdir(parents=True, mode=mode)
        (src / folder).chmod(mode)
        tifffile.imwrite(src / folder / "shared.tif", np.zeros((2, 16, 16), np.uint16))
        (src / folder / "notes.txt").write_bytes(b"notes\n")
        for name in ("shared.tif", "notes.txt"):
            (src / folder / name).chmod(0o666)
    before = sorted(os.listdir(src / "ro"))
    m = start(base, src, "--settle", "0.3")
    try:
        ro, rw = m.mnt / "ro", m.mnt / "rw"
        u = unprivileged
        assert u.errno_of("os.close(os.open(p, os.O_WRONLY))", p=ro / "shared.tif") == errno.EACCES
        assert u.errno_of("write(p, b'y', os.O_WRONLY)", p=ro / "notes.txt") == errno.EACCES
        assert u.errno_of("os.truncate(p, 0)", p=ro / "notes.txt") == errno.EACCES
        assert u.errno_of("write(p, b'y', os.O_WRONLY)", p=rw / "notes.txt") == 0
        assert u.errno_of("os.close(os.open(p, os.O_WRONLY))", p=rw / "shared.tif") == 0
        wait_for(lambda: "shared.tif.zarr.zip" in os.listdir(src / "rw"), "rw/shared.tif packed")
        assert sorted(os.listdir(src / "ro")) == before
        assert (src / "ro" / "notes.txt").read_bytes() == b"notes\n"
        assert (m.mnt / "rw" / "notes.txt").read_bytes() == b"yotes\n"
    finally:
        m.stop()


# -- an AcqStore view reads files elsewhere in the collection: by the reader's rights --------


def test_an_acqstore_view_does_not_read_a_private_file_for_someone_else(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A collection in a shared folder names, as one of its tables, a file in a private (0700)
    folder of someone else there. The members view shows it with the collection's modes; the
    daemon (root) read it for anyone who asked. Then a member opened only for a caller who
    could read its file by its real path; since round 43 the reference counts only where the
    collection's author may read it (as if missing otherwise: its size, and whether it exists,
    showed in the view), so this collection gets no view. The same collection with a table of
    its own in place of the private one has one, readable (positive control)."""
    base = open_tmp(tmp_path_factory, "acq-private")
    src = base / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    src.chmod(0o755)
    shared.chmod(0o1777)
    load_tool("make_acqstore_corpus").make_collection(shared)
    doc_path = shared / "acqstore/collection.json"
    doc = json.loads(doc_path.read_text())
    tables = doc["resources"]["tables"]  # velocity-pool, sum-intensity-pool
    readable = shared / tables[0]["path"]
    tables[1]["path"] = "private/secret.csv"
    doc_path.write_text(json.dumps(doc, indent=1))
    private = shared / "private"
    private.mkdir(mode=0o700)  # root's own, as any other user's would be
    secret = b"patient,diagnosis\np1,TOP SECRET\n"
    (private / "secret.csv").write_bytes(secret)
    (private / "secret.csv").chmod(0o644)
    for path in [shared, *shared.rglob("*")]:
        if path.is_relative_to(private):
            continue
        os.chown(path, unprivileged.uid, unprivileged.gid, follow_symlinks=False)
    m = start(base, src)
    try:
        assert unprivileged.errno_of("open(p, 'rb').read()", p=private / "secret.csv") == (
            errno.EACCES
        )  # the real file is out of the user's reach
        assert "members" not in os.listdir(m.mnt / "shared"), m.log_text()[-2000:]
        assert "its collection's owner may not read it there" in m.log_text()
        own = shared / "acqstore" / "tables" / "own.csv"
        own.write_bytes(readable.read_bytes())
        os.chown(own, unprivileged.uid, unprivileged.gid)
        tables[1]["path"] = "acqstore/tables/own.csv"
        doc_path.write_text(json.dumps(doc, indent=1))  # the watcher builds the view again
        view = m.mnt / "shared" / "members" / "tables"
        deadline = time.monotonic() + 10
        while not view.is_dir():
            assert time.monotonic() < deadline, m.log_text()[-2000:]
            time.sleep(0.1)
        assert sorted(os.listdir(view)) == ["sum-intensity-pool.csv", "velocity-pool.csv"]
        got = unprivileged.value_of("open(p, 'rb').read().hex()", p=view / "velocity-pool.csv")
        assert bytes.fromhex(got) == readable.read_bytes()  # the collection's own table
        assert secret not in b"".join(p.read_bytes() for p in view.iterdir())
    finally:
        m.stop()


def test_a_status_file_dropped_in_src_does_not_stand_in_for_the_daemon_s(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """Whoever may write SRC's top folder (or a bucket's prefix) put a `.decant-status` there:
    it was shown in place of the daemon's own, to every user and to `decant-mount --status`
    (a queue with nothing failed, whatever failed). The daemon's wins; SRC's is not listed."""
    base = open_tmp(tmp_path_factory, "status-spoof")
    src = base / "src"
    src.mkdir()
    src.chmod(0o1777)
    fake = {"queued": 0, "failed": [], "failed_total": 0, "done": 57, "forged": True}
    done = unprivileged.run("sh", "-c", f"printf '%s' '{json.dumps(fake)}' > {src}/.decant-status")
    assert done.returncode == 0, done.stderr
    assert (src / ".decant-status").stat().st_uid == unprivileged.uid
    m = start(base, src)
    try:
        for reader in ("root", "user"):
            text = (
                (m.mnt / ".decant-status").read_text()
                if reader == "root"
                else unprivileged.value_of("open(p).read()", p=m.mnt / ".decant-status")
            )
            shown = json.loads(text)
            assert "forged" not in shown and "daemon" in shown, (reader, shown)
        assert ".decant-status" not in os.listdir(m.mnt)
        assert (src / ".decant-status").read_text() == json.dumps(fake)  # left as it was
    finally:
        m.stop()


# -- the file acted on is the file the kernel checked the caller against ----------------------

SWAP = "((fd := os.open(m, os.O_PATH)), os.rename(s_secret, s_mine), {act})"


def drop_box(base: Path, user: User) -> Path:
    """`base/src/box`: the user's own sticky folder, where they may rename anyone's entries."""
    box = base / "src" / "box"
    box.mkdir(parents=True)
    os.chown(box, user.uid, user.gid)
    box.chmod(0o1777)
    return box


@pytest.mark.parametrize(
    ("act", "codes"),
    [
        ("os.chmod(f'/proc/self/fd/{fd}', 0o644)", {errno.ESTALE, errno.EPERM}),
        ("os.utime(f'/proc/self/fd/{fd}', (0, 0))", {errno.ESTALE, errno.EPERM}),
        ("read(f'/proc/self/fd/{fd}')", {errno.ESTALE, errno.EACCES}),
        ("write(f'/proc/self/fd/{fd}', b'theirs', os.O_WRONLY)", {errno.ESTALE, errno.EACCES}),
        ("read(m)", {errno.ESTALE, errno.EACCES}),
        ("write(m, b'theirs', os.O_WRONLY | os.O_TRUNC)", {errno.ESTALE, errno.EACCES}),
    ],
)
def test_another_user_s_file_renamed_over_one_s_own_is_not_acted_on_as_one_s_own(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, act: str, codes: set[int]
) -> None:
    """Red team 66, F1, F2, F4: in a folder the user may rename entries of (their own drop box),
    they renamed root's 0600 file over their own file, which the mount had listed (or held
    open), and chmod, utime, a read or a write of that name through the mount acted on root's
    file: the kernel checked the user's rights against the attributes of their own file, the
    daemon (root) then acted on whatever was at the name. Now the daemon acts only on the file
    it listed there (its inode), and that name is another inode of the mount once it is another
    file; the user gets what SRC gives them, and root's file is untouched."""
    base = open_tmp(tmp_path_factory, "swap")
    box = drop_box(base, unprivileged)
    secret = box / "secret.txt"
    secret.write_bytes(b"root's secret\n")
    secret.chmod(0o600)
    mine = box / "mine.txt"
    mine.write_bytes(b"mine\n")
    mine.chmod(0o666)
    os.chown(mine, unprivileged.uid, unprivileged.gid)
    m = start(base, base / "src", "--settle", "0.5")
    try:
        u = unprivileged
        assert u.value_of("read(m)", m=m.mnt / "box" / "mine.txt") == sha256(b"mine\n")
        code = u.errno_of(SWAP.format(act=act), m=m.mnt / "box" / "mine.txt",
                          s_secret=secret, s_mine=mine)  # fmt: skip
        assert code in codes
        assert not secret.exists()  # renamed over theirs, on disk: as SRC allows
        st = mine.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0)
        assert st.st_mtime > 1e9
        assert mine.read_bytes() == b"root's secret\n"
        assert u.errno_of("read(p)", p=m.mnt / "box" / "mine.txt") == errno.EACCES
    finally:
        m.stop()


FOLDER_SWAP = "(os.listdir(m), os.rename(s_theirs, s_mine), {act})"


@pytest.mark.parametrize(
    ("act", "codes"),
    [
        ("os.listdir(m)", {errno.ESTALE, errno.EACCES}),
        ("os.mkdir(m + '/evil')", {errno.ESTALE, errno.EACCES}),
        ("write(m + '/evil.txt', b'planted')", {0, errno.ESTALE, errno.EACCES}),
    ],
)
def test_another_user_s_folder_renamed_over_one_s_own_is_not_listed_or_written_into(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, act: str, codes: set[int]
) -> None:
    """Red team 67 F1 (around the fix of red team 66): root's 0700 folder renamed over the
    user's own folder, which the mount had listed, was listed through the mount, and a folder
    or a file made in it, published there: the kernel checked the user against the attributes
    of their own folder. Now the daemon lists and writes only into the folder it listed at the
    name, and publishes a file only into a folder its writer may add entries to then. A file
    created meanwhile stays spooled, failed (a create only writes to the spool)."""
    base = open_tmp(tmp_path_factory, "fswap")
    box = drop_box(base, unprivileged)
    theirs = box / "theirs"
    theirs.mkdir(mode=0o700)
    (theirs / "secret-name.txt").write_bytes(b"root's\n")
    mine = box / "mine"
    mine.mkdir()
    os.chown(mine, unprivileged.uid, unprivileged.gid)
    mine.chmod(0o700)
    m = start(base, base / "src", "--settle", "0.3")
    try:
        u = unprivileged
        mnt = m.mnt / "box" / "mine"
        code = u.errno_of(FOLDER_SWAP.format(act=act), m=str(mnt), s_theirs=theirs, s_mine=mine)
        assert code in codes
        st = mine.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, 0)  # root's folder, now here
        time.sleep(2.0)  # a file created in it is settled and tried by now
        assert sorted(os.listdir(mine)) == ["secret-name.txt"]
        assert u.errno_of("os.listdir(m)", m=str(mnt)) in {errno.EACCES, errno.ESTALE}
    finally:
        m.stop()
