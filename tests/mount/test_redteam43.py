"""Red team, round 43: a package described at a name after its folder's owner swapped another
one in (the decant archive case of round 40a, for `.tar.c4gh` packages).

The test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import os
import struct
import time
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import Mount, User, open_tmp
from tests.mount.test_redteam38a import _collection, digests_hidden, scanned_archive
from tests.mount.test_redteam40a import users_shared_folder
from tests.toolbox import load_tool
from vfs.decant.packer import pack_file

c4gh_corpus: ModuleType = load_tool("make_c4gh_corpus")

SECRET = "patient-0042.vcf"
RACE_PACKAGE = """
import ctypes, os, random, sys, threading, time
real, decoy, shown, secret = sys.argv[1:5]
tries = int(sys.argv[5])
libc = ctypes.CDLL(None, use_errno=True)
done, got, seen = threading.Event(), [], {}
def swap():  # renameat2(RENAME_EXCHANGE), an even number of times: left as it was
    # Paced: a swap while the package is read fails its description (each read checks the
    # file's version), so the window is one swap between the listing's lstat and the open.
    n = 0
    while not done.is_set() or n % 2:
        libc.renameat2(-100, real.encode(), -100, decoy.encode(), 2)
        n += 1
        time.sleep(random.random() * 0.01)
t = threading.Thread(target=swap)
t.start()
try:
    for _ in range(tries):
        try:
            os.listdir(os.path.dirname(shown))  # its folder read again, as it is now
            names = os.listdir(shown)
        except OSError as exc:
            seen[exc.errno] = seen.get(exc.errno, 0) + 1
            continue
        seen[tuple(names)] = seen.get(tuple(names), 0) + 1
        if secret in names:
            got.append(secret)
            break
finally:
    done.set()
    t.join()
print(repr(got), seen, file=sys.stderr)\nprint(repr(got))
"""


def test_a_private_package_swapped_in_lends_no_member_names(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """USER owns `shared/`, in which root (the owner whose packages the mount decrypts) keeps
    a readable package and a private one (0600). USER exchanged their names over and over
    while listing: the private package was described at the readable one's name, as listed
    (root's, 0644), and USER read the private package's member names through the mount."""
    u = unprivileged
    base, src, shared = users_shared_folder(tmp_path_factory, "rt43-package", u)
    node, writer = (c4gh_corpus.make_keypair(base / "keys", n) for n in ("node", "writer"))
    public, private = shared / "data.tar.c4gh", shared / "private.tar.c4gh"
    c4gh_corpus.write_package(public, c4gh_corpus.with_manifest([("readme.txt", b"shared\n")]),
                              writer, [node])  # fmt: skip
    c4gh_corpus.write_package(private,
                              c4gh_corpus.with_manifest([(SECRET, b"##fileformat=VCFv4.2\n")]),
                              writer, [node])  # fmt: skip
    public.chmod(0o644)
    private.chmod(0o600)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start(
            "-o",
            "allow_other",
            "--read-only",
            "--c4gh-key",
            str(node.secret_path),
            "--c4gh-mode",
            "0444",
        )  # decrypted data readable by all: as its file allows
        hidden = m.mnt / "shared" / "private.tar.c4gh"
        assert SECRET in os.listdir(hidden)  # root lists it
        assert u.errno_of("os.listdir(p)", p=hidden) == errno.EACCES  # USER may not
        shown = m.mnt / "shared" / "data.tar.c4gh"
        done = u.run("/usr/bin/python3", "-I", "-c", RACE_PACKAGE, str(public), str(private),
                     str(shown), SECRET, "3000", timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        # stderr: what the listings gave (member names, or errno), to tell a race that never
        # ran from one that found nothing.
        assert SECRET not in done.stdout, f"private member names listed to USER: {done.stderr}"
        deadline = time.monotonic() + 10  # each shown as it is once the last swap is rescanned
        while True:
            try:
                if sorted(os.listdir(shown)) == [
                    "manifest.json",
                    "readme.txt",
                ] and SECRET in os.listdir(hidden):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, m.log_text()[-2000:]
            time.sleep(0.1)
        assert u.errno_of("os.listdir(p)", p=hidden) == errno.EACCES
    finally:
        m.stop()


def test_a_private_archive_s_original_name_is_not_listed_to_others(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """Root keeps `pub/a1.zarr.zip` (0600), renamed from the archive of a TIFF whose name says
    whose scan it is, in a folder anyone may list: SRC shows USER `a1.zarr.zip` and refuses
    its bytes, and the mount listed it to USER as `patient_jane_doe.tif`."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt43-name")
    pub = base / "src" / "pub"
    pub.mkdir(parents=True)
    for folder in (base / "src", pub):
        folder.chmod(0o755)
    tif = base / "patient_jane_doe.tif"
    tifffile.imwrite(tif, np.arange(64, dtype=np.uint16).reshape(8, 8))
    pack_file(tif, pub / "a1.zarr.zip")
    (pub / "a1.zarr.zip").chmod(0o600)
    m = Mount(base / "src", base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        listing = "import os, sys; print(os.listdir(sys.argv[1]))"
        listed = u.run("/usr/bin/python3", "-I", "-c", listing, str(m.mnt / "pub"))
        assert listed.returncode == 0, listed.stderr
        assert "patient" not in listed.stdout and "a1.zarr.zip" in listed.stdout, listed.stdout
        shown = m.mnt / "pub" / "a1.zarr.zip"  # root reads the original under that name
        assert shown.read_bytes() == tif.read_bytes()
        assert u.errno_of("read(p)", p=shown) == errno.EACCES
    finally:
        m.stop()


def test_a_view_of_a_folder_archive_with_a_private_manifest_lends_no_digest(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A collection's image is a decant folder archive (`images/scan.tif.zarr/`, 0755) whose
    `.decant/manifest.json` its owner keeps 0600. In SRC itself the archive is shown without
    read bits for others (round 37c), but the members view took the image folder's bits and
    showed its original 0444: another user read its sha256 with `getfattr`."""
    u = unprivileged
    original, packed = scanned_archive(tmp_path_factory)
    folder_archive = packed.with_suffix("")  # scan.tif.zarr
    with zipfile.ZipFile(packed) as zf:
        zf.extractall(folder_archive)
    base, src = _collection(tmp_path_factory, "rt43-view", decant_archive=folder_archive)
    manifest = src / "coll" / "images" / "scan.tif.zarr" / ".decant" / "manifest.json"
    manifest.chmod(0o600)
    assert u.errno_of("read(p)", p=manifest) == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        digests_hidden(m, u, original, "manifest")
    finally:
        m.stop()


def test_a_synthesized_tiff_of_a_private_image_is_not_shown_readable(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """Every file of a collection's image folder `images/stack.zarr/` is 0600 (its folders
    0755): another user may not read its `.zarray` in SRC. The members view showed its TIFF
    0444, so `access()` said yes (the open was refused) to a user SRC denies the image."""
    u = unprivileged
    base, src = _collection(tmp_path_factory, "rt43-tiff")
    image = src / "coll" / "images" / "stack.zarr"
    for path in image.rglob("*"):
        if path.is_file():
            path.chmod(0o600)
    assert u.errno_of("read(p)", p=image / "0" / ".zarray") == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        members = m.mnt / "coll" / "members"
        (tif,) = [p for p in members.rglob("*.tif") if "stack.zarr" in _source(p)]
        assert tif.read_bytes()[:2] == b"II"  # root reads it
        assert not u.value_of("os.access(p, os.R_OK)", p=tif)
        assert u.errno_of("read(p)", p=tif) == errno.EACCES
        readable = [p for p in members.rglob("*.tif") if "stack.zarr" not in _source(p)]
        assert readable and all(u.value_of("os.access(p, os.R_OK)", p=p) for p in readable)
    finally:
        m.stop()


def _source(path: os.PathLike[str]) -> str:
    return os.getxattr(path, "user.acqstore.source").decode()


def test_a_table_written_anew_is_served_anew_without_the_watcher(tmp_path: Path) -> None:
    """--no-watch: a collection's table grown in place (no folder mtime tells it) was served
    at the size its view was built with, cut short with no error. An open now finds it
    changed (ESTALE), the collection's view is built again, and the kernel's retry reads the
    table whole. Shrunk and rewritten at the same size, likewise."""
    src = tmp_path / "src"
    src.mkdir()
    load_tool("make_acqstore_corpus").make_collection(src / "coll")
    m = Mount(src, tmp_path / "mnt", tmp_path / "mnt.log", tmp_path / "mnt-index")
    try:
        m.start("--read-only", "--no-watch")
        shown = sorted((m.mnt / "coll" / "members" / "tables").glob("*.csv"))[0]
        real = src / "coll" / _source(shown)
        assert shown.read_bytes() == real.read_bytes()
        grown = real.read_bytes() + b"9,9,9\n" * 20
        for body in (grown, grown[: len(grown) // 3], grown[: len(grown) // 3].replace(b"1", b"7")):
            real.write_bytes(body)
            assert shown.read_bytes() == body, m.log_text()[-2000:]
    finally:
        m.stop()


def test_an_image_written_anew_is_served_anew_without_the_watcher(tmp_path: Path) -> None:
    """--no-watch: a collection image's chunk files written anew in place (its shape kept, so
    its TIFF's size) kept serving the planes decoded before, until the daemon restarted."""
    import zarr

    src = tmp_path / "src"
    src.mkdir()
    load_tool("make_acqstore_corpus").make_collection(src / "coll")
    m = Mount(src, tmp_path / "mnt", tmp_path / "mnt.log", tmp_path / "mnt-index")
    try:
        m.start("--read-only", "--no-watch")
        members = m.mnt / "coll" / "members"
        (tif,) = [p for p in members.rglob("*.tif") if "stack.zarr" in _source(p)]
        array = zarr.open_array(str(src / "coll" / _source(tif) / "0"), mode="r+")
        czyx = array[...]  # the TIFF's pages run channel fastest: (z, c, y, x)
        assert np.array_equal(tifffile.imread(tif), czyx.transpose(1, 0, 2, 3))
        array[...] = czyx + 1
        after = tifffile.imread(tif)
        assert np.array_equal(after, (czyx + 1).transpose(1, 0, 2, 3)), "old planes served"
    finally:
        m.stop()


def test_a_sparse_zipped_image_claiming_a_huge_directory_is_refused_alone(
    tmp_path: Path,
) -> None:
    """A collection image `images/kymo.ozx`: 1 GiB apparent, a few KiB on disk, its zip64
    end record claiming nearly all of it as central directory. zipfile read the whole claim
    when the collection was listed (4 GiB claimed: the daemon at 4.25 GB). Now the collection
    gets no view, the log names the image and why, and the daemon stays small and serving."""
    src = tmp_path / "src"
    src.mkdir()
    load_tool("make_acqstore_corpus").make_collection(src / "coll")
    doc = src / "coll" / "acqstore" / "collection.json"
    doc.write_text(doc.read_text().replace("images/kymograph.zarr", "images/kymo.ozx"))
    size, tail = 1 << 30, 56 + 20 + 22
    with open(src / "coll" / "images" / "kymo.ozx", "wb") as f:
        f.truncate(size - tail)
        f.seek(size - tail)
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 1, 1, size - tail, 0))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, size - tail, 1))
        f.write(
            struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
        )
    (src / "plain.txt").write_bytes(b"still served\n")
    m = Mount(src, tmp_path / "mnt", tmp_path / "mnt.log", tmp_path / "mnt-index")
    try:
        m.start("--read-only")
        assert "members" not in os.listdir(m.mnt / "coll")
        assert "images/kymo.ozx" in m.log_text() and "more than the 1048576" in m.log_text()
        assert (m.mnt / "plain.txt").read_bytes() == b"still served\n"
        assert m.proc is not None
        status = Path(f"/proc/{m.proc.pid}/status").read_text()
        peak = int(
            next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]
        )
        assert peak < 300 << 10, f"daemon peak RSS {peak} KiB"
    finally:
        m.stop()
