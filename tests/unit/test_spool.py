"""vfs/ingest/spool.py and publish.py without a mount: the spool tree, publishing (archive,
verbatim, plain by hard link or sparse copy, already), attempts (settle, space, cancel), the
restart shortcut, and the clean-up of what a crash leaves behind."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.toolbox import remove_chain, tiff_of_shape
from vfs.decant import MANIFEST_KEY, TEMP_PREFIX, temp_name
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive
from vfs.decant.verify import require_verified
from vfs.ingest import publish as publish_mod
from vfs.ingest.spool import Spool, archive_name, is_temp_name, remove_orphans

OPTIONS = PackOptions()
MTIME = 1_600_000_000_123_456_789
FOLDER_MTIME = 1_500_000_000_000_000_042


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def archived(archive: Path) -> tuple[str, int, str]:
    with DecantArchive.open(archive) as a:
        (info,) = a.originals()
    return info.sha256, info.size, a.manifest.mode


def leftovers(root: Path) -> list[Path]:
    return sorted(root.rglob(f"{TEMP_PREFIX}*"))


@pytest.fixture
def spool(src: Path) -> Spool:
    # The files `put` spools are uid 1234's: written through a mount, the kernel let them into
    # SRC, so SRC is a folder they may write (what a file of no record may replace depends on
    # it: vfs.ingest.publish._may_rename_over).
    src.chmod(0o777)
    return Spool(src, src / ".decant-spool" / "files")


def put(spool: Spool, relpath: str, source: Path | bytes, mode: int = 0o640) -> Path:
    """A file as the mount spools it, with the metadata `rsync -a` gave it."""
    path = spool.path(relpath)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        path.write_bytes(source)
    else:
        shutil.copyfile(source, path)
    os.chmod(path, mode)
    if os.geteuid() == 0:
        os.chown(path, 1234, 5678)
    os.utime(path, ns=(MTIME, MTIME))
    return path


def assert_metadata(path: Path, mode: int = 0o640) -> None:
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == mode and st.st_mtime_ns == MTIME
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 5678)


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "temp"),
    [
        (".zstack.tif.a1B2c3", True),  # rsync's .NAME.XXXXXX
        (".notes.csv.XyZ098", True),
        ("zstack.tif", False),
        (".hidden", False),
        (".zstack.tif.abc12", False),  # five characters: not rsync's
        (".zstack.tif.abc12-", False),
        ("zstack.tif.a1B2c3", False),  # no leading dot
    ],
)
def test_is_temp_name(name: str, temp: bool) -> None:
    assert is_temp_name(name) is temp


def test_archive_name() -> None:
    assert archive_name("a.ome.tif") == "a.ome.tif.zarr.zip"


def test_a_temp_name_of_a_temp_name_carries_the_prefix_once() -> None:
    """The packer builds a staged archive (itself at a temp name) beside it: red team 49 saw
    `.decant-tmp-28094-2340d3f9-.decant-tmp-28094-a89e8c29-packme.tif.zarr.zip`."""
    staged = temp_name("packme.tif.zarr.zip")
    again = temp_name(staged)
    assert again.count(TEMP_PREFIX) == 1 and again.endswith("-packme.tif.zarr.zip")
    assert again != staged and again.startswith(TEMP_PREFIX)


# -- the spool tree --------------------------------------------------------------------------


def test_create_rename_adopt_walk_listdir_remove(spool: Spool, src: Path) -> None:
    fd = spool.create("d/a.bin", 0o604, os.getuid(), os.getgid())
    os.write(fd, b"abc")
    os.close(fd)
    assert spool.path("d/a.bin").read_bytes() == b"abc"
    assert stat.S_IMODE(spool.path("d/a.bin").stat().st_mode) == 0o604
    os.close(spool.create("d/a.bin", 0o604, os.getuid(), os.getgid()))  # truncates
    assert spool.path("d/a.bin").read_bytes() == b""

    spool.rename("d/a.bin", "e/f/b.bin")
    (src / "real.csv").write_text("x")
    spool.adopt(src / "real.csv", "real.csv")
    assert not (src / "real.csv").exists()
    os.symlink("/etc/hostname", spool.path("link"))  # not a regular file: never spooled work
    assert sorted(spool.walk()) == ["e/f/b.bin", "real.csv"]
    assert [name for name, _st in spool.listdir("e/f")] == ["b.bin"]
    assert [name for name, _st in spool.listdir("")] == ["real.csv"]
    assert spool.listdir("missing") == []

    assert spool.remove("e/f/b.bin") is True
    assert not (spool.files / "e").exists()  # empty folders pruned up to the spool root
    assert spool.files.is_dir()


def test_listdir_leaves_out_only_a_file_published_while_it_reads(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish removes a spooled file while a rescan reads its folder: the folder's entries
    are already read, and that file's stat fails. The listing leaves out that file alone; it
    used to end there, and every name read after it (rsync temp names among them) went from
    the mount's listing, so their renames failed with ENOENT (issue 12, a 20,000-file run)."""
    names = [f".rec{i:03d}.csv.Ab12Cd" for i in range(20)]
    for name in names:
        put(spool, f"run/{name}", b"x")
    order = os.listdir(spool.path("run"))  # scandir's order too: the folder does not change
    gone = order[1]
    real_scandir = os.scandir

    class Racing:
        """scandir whose first entry comes once a publish removed the second one."""

        def __init__(self, path: Any) -> None:
            self.it = real_scandir(path)

        def __enter__(self) -> Racing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.it.close()

        def __iter__(self) -> Iterator[os.DirEntry[str]]:
            for n, entry in enumerate(self.it):
                if n == 0:
                    spool.path(f"run/{gone}").unlink()
                yield entry

    monkeypatch.setattr(os, "scandir", Racing)
    listed = sorted(name for name, _st in spool.listdir("run"))
    assert listed == sorted(n for n in names if n != gone)


def test_remove_keeps_a_file_replaced_since_it_was_published(spool: Spool, src: Path) -> None:
    put(spool, "x.csv", b"old")
    published = spool.publish("x.csv", False, OPTIONS)
    put(spool, "x.tmp", b"newer")
    os.replace(spool.path("x.tmp"), spool.path("x.csv"))  # rsync's rename over it
    assert spool.remove("x.csv", published.signature) is False
    assert spool.path("x.csv").read_bytes() == b"newer"
    spool.path("x.csv").unlink()
    assert spool.remove("x.csv", published.signature) is True  # already gone


# -- publishing ------------------------------------------------------------------------------


def test_uncompressed_tiff_becomes_a_byte_exact_archive_with_its_metadata(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    original = corpus["zstack_u16.tif"]
    (src / "run").mkdir()
    os.utime(src / "run", ns=(FOLDER_MTIME, FOLDER_MTIME))
    spooled = put(spool, "run/zstack_u16.tif", original)

    published = spool.publish("run/zstack_u16.tif", False, OPTIONS)

    archive = src / "run" / "zstack_u16.tif.zarr.zip"
    assert published.target == archive and published.mode == "byte-exact"
    assert archived(archive) == (sha256(original), original.stat().st_size, "byte-exact")
    require_verified(archive)
    assert_metadata(archive)
    assert spooled.is_file()  # the caller removes it once the mount has switched
    assert (src / "run").stat().st_mtime_ns == FOLDER_MTIME  # publishing left it as rsync did
    assert os.listdir(src / "run") == [archive.name]
    assert leftovers(src) == []


def test_compressed_tiff_is_archived_verbatim(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    put(spool, "zlib_u16.tif", corpus["zlib_u16.tif"])
    published = spool.publish("zlib_u16.tif", False, OPTIONS)
    assert published.mode == "verbatim" and published.reason
    assert archived(published.target)[0] == sha256(corpus["zlib_u16.tif"])


@pytest.mark.parametrize("shape", [(0, 10, 1), (10, 10, 0)], ids=["width 0", "0 samples"])
def test_a_tiff_with_an_empty_axis_is_archived_verbatim(
    spool: Spool, src: Path, shape: tuple[int, int, int]
) -> None:
    """Its pages were taken as byte-exact, and the archive then failed its own check ("shape
    [10, 0] has an empty axis") at every retry: the small-file path has no fallback, so the
    file stayed spooled for good (red team 45). `decant pack` fell back to verbatim."""
    data = tiff_of_shape(*shape)
    put(spool, "w0.tif", data)
    outcome = spool.attempt("w0.tif", False, OPTIONS, 0.0)
    assert outcome.kind == "published" and outcome.published is not None, outcome.reason
    assert outcome.published.mode == "verbatim"
    assert archived(outcome.published.target)[0] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", ["not_a_tiff.csv", "empty.tif", "one_byte.tif"])
def test_other_files_are_moved_in_plain(
    spool: Spool, src: Path, corpus: dict[str, Path], name: str
) -> None:
    os.utime(src, ns=(FOLDER_MTIME, FOLDER_MTIME))
    put(spool, name, corpus[name])
    published = spool.publish(name, False, OPTIONS)
    assert (published.target, published.mode) == (src / name, "plain")
    assert sha256(src / name) == sha256(corpus[name])
    assert_metadata(src / name)
    assert src.stat().st_mtime_ns == FOLDER_MTIME
    assert leftovers(src) == []


def test_concurrent_publishes_into_one_folder_keep_its_mtime(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    names = [f"n{i}.csv" for i in range(8)] + ["z.tif"]
    for name in names[:-1]:
        put(spool, name, corpus["not_a_tiff.csv"])
    put(spool, "z.tif", corpus["zstack_u16.tif"])
    os.utime(src, ns=(FOLDER_MTIME, FOLDER_MTIME))
    with ThreadPoolExecutor(4) as pool:  # --pack-workers 4
        done = list(pool.map(lambda n: spool.publish(n, False, OPTIONS), names))
    assert [p.mode for p in done] == ["plain"] * 8 + ["byte-exact"]
    assert src.stat().st_mtime_ns == FOLDER_MTIME
    assert leftovers(src) == []


def test_pack_all_wraps_other_files_in_verbatim_archives(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    put(spool, "notes.csv", corpus["not_a_tiff.csv"])
    published = spool.publish("notes.csv", True, OPTIONS)
    assert published.target == src / "notes.csv.zarr.zip" and published.mode == "verbatim"
    assert archived(published.target)[0] == sha256(corpus["not_a_tiff.csv"])
    assert not (src / "notes.csv").exists()


def test_a_plain_file_replaces_an_archive_of_its_name(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    pack_file(corpus["zstack_u16.tif"], src / "x.tif.zarr.zip")
    put(spool, "x.tif", b"not a tiff any more")
    spool.publish("x.tif", False, OPTIONS)
    assert sorted(os.listdir(src)) == [".decant-spool", "x.tif"]
    assert (src / "x.tif").read_bytes() == b"not a tiff any more"


def test_a_tiff_replaces_an_older_archive_and_a_shadowing_plain_file(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    pack_file(corpus["zstack_u16.tif"], src / "x.tif.zarr.zip")
    (src / "x.tif").write_bytes(b"a plain file of that name")
    put(spool, "x.tif", corpus["tiled_chunky_u16.tif"])
    spool.publish("x.tif", False, OPTIONS)
    assert sorted(os.listdir(src)) == [".decant-spool", "x.tif.zarr.zip"]
    assert archived(src / "x.tif.zarr.zip")[0] == sha256(corpus["tiled_chunky_u16.tif"])


def test_an_archive_that_already_verified_is_not_packed_again(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    """A crash after publishing but before the spooled copy went: the restart only cleans up."""
    put(spool, "z.tif", corpus["zstack_u16.tif"])
    spool.publish("z.tif", False, OPTIONS)
    before = (src / "z.tif.zarr.zip").stat()
    again = spool.publish("z.tif", False, OPTIONS)
    assert again.mode == "already"
    after = (src / "z.tif.zarr.zip").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_archive_holds_only_exactly_these_bytes(
    src: Path, corpus: dict[str, Path], tmp_path: Path
) -> None:
    original = corpus["zstack_u16.tif"]
    archive = src / "z.tif.zarr.zip"
    st, sha = original.stat(), sha256(original)
    assert not publish_mod._archive_holds(archive, st, sha)  # missing
    pack_file(original, archive)
    assert publish_mod._archive_holds(archive, st, sha)
    assert not publish_mod._archive_holds(archive, st, "0" * 64)
    archive.write_bytes(b"PK\x03\x04 not really a zip")
    assert not publish_mod._archive_holds(archive, st, sha)


def test_archive_holds_not_a_manifest_claiming_the_digest(
    src: Path, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Other pixels under a manifest that names this file's size and sha256 (anyone may write
    a manifest): only reconstructing the archive tells, and it is not this file's."""
    original = corpus["zstack_u16.tif"]
    other = tmp_path / "z.tif"
    data = bytearray(original.read_bytes())
    data[-4096:] = bytes(4096)  # pixels only: the same layout, other bytes
    other.write_bytes(bytes(data))
    archive = src / "z.tif.zarr.zip"
    pack_file(other, archive)
    forged = tmp_path / "forged.zip"
    with zipfile.ZipFile(archive) as zin, zipfile.ZipFile(forged, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info.filename)
            if info.filename == MANIFEST_KEY:
                doc = json.loads(body)
                doc["original_sha256"] = sha256(original)
                body = json.dumps(doc).encode()
            zout.writestr(info, body)
    forged.replace(archive)
    assert claimed_sha(archive) == sha256(original)  # the claim is in place
    assert not publish_mod._archive_holds(archive, original.stat(), sha256(original))


@pytest.mark.skipif(os.geteuid() != 0, reason="owners are changed as root")
def test_archive_holds_not_another_users_archive(src: Path, corpus: dict[str, Path]) -> None:
    """The same bytes in an archive of someone else (dropped beside a spooled file in a
    sticky folder) are not the file's own: its spooled copy must not go on their word."""
    original = corpus["zstack_u16.tif"]
    archive = src / "z.tif.zarr.zip"
    pack_file(original, archive)
    st = original.stat()
    os.chown(archive, st.st_uid + 4242, st.st_gid)
    assert not publish_mod._archive_holds(archive, st, sha256(original))
    os.chown(archive, st.st_uid, st.st_gid)
    assert publish_mod._archive_holds(archive, st, sha256(original))


def claimed_sha(archive: Path) -> str:
    with DecantArchive.open(archive) as arc:
        (info,) = arc.originals()
        return info.sha256


def test_a_missing_folder_is_created(spool: Spool, src: Path, corpus: dict[str, Path]) -> None:
    """An inbox file at run7/a.tif: run7/ need not exist in SRC yet."""
    put(spool, "run7/deep/a.tif", corpus["zstack_u16.tif"])
    put(spool, "run7/deep/a.csv", corpus["not_a_tiff.csv"])
    spool.publish("run7/deep/a.tif", False, OPTIONS)
    spool.publish("run7/deep/a.csv", False, OPTIONS)
    assert sorted(os.listdir(src / "run7" / "deep")) == ["a.csv", "a.tif.zarr.zip"]


def test_a_target_taken_by_a_folder_fails_and_leaves_nothing(
    spool: Spool, src: Path, corpus: dict[str, Path]
) -> None:
    (src / "clash.csv").mkdir()
    put(spool, "clash.csv", corpus["not_a_tiff.csv"])
    with pytest.raises(OSError) as caught:
        spool.publish("clash.csv", False, OPTIONS)
    assert caught.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert spool.path("clash.csv").is_file() and (src / "clash.csv").is_dir()
    assert leftovers(src) == []


def test_a_vanished_spooled_file_fails_without_creating_folders(spool: Spool, src: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spool.publish("gone/x.tif", False, OPTIONS)
    assert not (src / "gone").exists()


def test_without_a_shared_filesystem_it_stages_beside_the_target(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish_mod, "_same_fs", lambda a, b: False)
    put(spool, "z.tif", corpus["zstack_u16.tif"])
    put(spool, "n.csv", corpus["not_a_tiff.csv"])
    assert spool.publish("z.tif", False, OPTIONS).mode == "byte-exact"
    assert spool.publish("n.csv", False, OPTIONS).mode == "plain"
    assert sorted(os.listdir(src)) == [".decant-spool", "n.csv", "z.tif.zarr.zip"]
    assert leftovers(src) == []


# -- what a crash leaves behind ---------------------------------------------------------------


def test_remove_orphans_deletes_temp_archives_but_not_the_spool(src: Path) -> None:
    spool_root = src / ".decant-spool"
    (src / "a" / "b").mkdir(parents=True)
    orphans = [
        src / f"{TEMP_PREFIX}1-0123abcd-x.tif.zarr.zip",
        src / "a" / "b" / f"{TEMP_PREFIX}2-cdef4567-y.tif.zarr.zip",
    ]
    for path in orphans:
        path.write_bytes(b"half an archive")
    # A folder with a temp name may be anyone's folder renamed: it stays, with what it holds.
    folder_orphan = src / "a" / f"{TEMP_PREFIX}3-89abcdef-z.zarr"
    (folder_orphan / "c").mkdir(parents=True)
    kept = [
        src / "a" / "b" / "keep.tif.zarr.zip",
        spool_root / "files" / f"{TEMP_PREFIX}9-in",
        src / f"{TEMP_PREFIX}x",  # not a name the packer makes
        folder_orphan / "c" / "data.txt",
    ]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"keep")
    if os.geteuid() == 0:  # someone else's file under a packer's name is not ours to delete
        theirs = src / f"{TEMP_PREFIX}4-00000000-w.tif.zarr.zip"
        theirs.write_bytes(b"theirs")
        os.chown(theirs, 65534, 65534)
        kept.append(theirs)

    removed = remove_orphans(src, spool_root)

    assert sorted(removed) == sorted(orphans)
    assert all(not p.exists() for p in removed) and all(p.exists() for p in kept)


def test_remove_orphans_and_spool_walk_survive_a_very_deep_folder(spool: Spool, src: Path) -> None:
    """os.walk recurses per level: thousands of levels raised RecursionError (daemon exit)."""
    deep = spool.files / "deep"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1500):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("f.txt", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    (spool.files / "top.txt").write_bytes(b"x")
    (src / f"{TEMP_PREFIX}1-0123abcd-x.tif.zarr.zip").write_bytes(b"half")
    found = "deep/" + "/".join(["d"] * 1500) + "/f.txt"
    assert sorted(spool.walk()) == [found, "top.txt"]  # a path within PATH_MAX: found
    assert len(remove_orphans(src, src / ".decant-spool" / "staging")) == 1
    # A file created that deep through the mount: its spool folders are made level by level.
    os.close(spool.create("deep/" + "/".join(["e"] * 1200) + "/g.txt", 0o644, os.getuid(), -1))
    assert (spool.files / "deep").is_dir()
    for name in ("d", "e"):
        remove_chain(deep, name)


def test_clear_staging(spool: Spool, src: Path) -> None:
    assert spool.clear_staging() == []
    spool.staging.mkdir(parents=True)
    (spool.staging / f"{TEMP_PREFIX}1-ab-x.tif.zarr.zip").write_bytes(b"half")
    (spool.staging / f"{TEMP_PREFIX}2-cd-y.zarr").mkdir()
    assert len(spool.clear_staging()) == 2
    assert list(spool.staging.iterdir()) == []


# -- plain files: a hard link, or a sparse copy across filesystems ----------------------------


def test_a_plain_file_is_published_as_a_hard_link_of_the_spooled_inode(
    spool: Spool, src: Path
) -> None:
    """No copy: the same inode gets its final name (no extra space, O(1) for any size); the
    spooled name is removed by the caller once the mount has switched."""
    spooled = put(spool, "d/big.bin", os.urandom(100_000))
    published = spool.publish("d/big.bin", False, OPTIONS)
    final = src / "d" / "big.bin"
    assert (published.target, published.mode) == (final, "plain")
    assert os.path.samefile(spooled, final) and final.stat().st_nlink == 2
    assert spool.remove("d/big.bin", published.signature) is True
    assert final.stat().st_nlink == 1 and sha256(final) == hashlib.sha256(
        (src / "d" / "big.bin").read_bytes()).hexdigest()  # fmt: skip
    assert leftovers(src) == []


def test_a_plain_file_linked_before_a_crash_is_already_published(spool: Spool, src: Path) -> None:
    put(spool, "x.csv", b"a,b\n")
    spool.publish("x.csv", False, OPTIONS)  # crash here: both names left
    again = spool.publish("x.csv", False, OPTIONS)
    assert again.mode == "already" and spool.remove("x.csv", again.signature)
    assert (src / "x.csv").read_bytes() == b"a,b\n" and leftovers(src) == []


def test_the_signature_is_that_of_the_inode_linked(spool: Spool, src: Path) -> None:
    """A spooled name replaced after the link must never be removed as if published."""
    put(spool, "x.csv", b"old")
    published = spool.publish("x.csv", False, OPTIONS)
    put(spool, "x.new", b"newer")
    os.replace(spool.path("x.new"), spool.path("x.csv"))
    assert spool.remove("x.csv", published.signature) is False
    assert spool.path("x.csv").read_bytes() == b"newer" and (src / "x.csv").read_bytes() == b"old"


def make_sparse(path: Path, size: int, chunks: dict[int, bytes]) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset, data in chunks.items():
            fh.seek(offset)
            fh.write(data)


def test_a_sparse_file_is_copied_by_its_data_extents(
    spool: Spool, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--spool on another filesystem: 8 GiB apparent, a few MiB of data: the copy costs its
    data, keeps its holes, and is compared byte for byte."""
    monkeypatch.setattr(publish_mod, "_same_fs", lambda a, b: False)
    chunks = {0: b"head" * 1000, 3 << 30: os.urandom(1 << 20), (8 << 30) - 5: b"tail!"}
    path = spool.path("sparse.bin")
    make_sparse(path, 8 << 30, chunks)
    os.utime(path, ns=(MTIME, MTIME))
    published = spool.publish("sparse.bin", False, OPTIONS)
    copy = src / "sparse.bin"
    assert published.mode == "plain" and not os.path.samefile(copy, path)
    st = copy.stat()
    assert st.st_size == 8 << 30 and st.st_blocks * 512 < 64 << 20 and st.st_mtime_ns == MTIME
    with open(copy, "rb") as fh:
        for offset, data in chunks.items():
            fh.seek(offset)
            assert fh.read(len(data)) == data
        fh.seek(1 << 30)
        assert fh.read(4096) == bytes(4096)
    assert leftovers(src) == []


def test_data_extents_and_same_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_sparse(a, 10 << 20, {0: b"x" * 10, 5 << 20: b"y" * 10})
    fd = os.open(a, os.O_RDONLY)
    try:
        extents = publish_mod.data_extents(fd, 10 << 20)
    finally:
        os.close(fd)
    assert extents[0][0] == 0 and any(s <= 5 << 20 < e for s, e in extents)
    assert sum(e - s for s, e in extents) < 10 << 20  # holes were seen
    publish_mod.copy_sparse(a, b, None)
    assert publish_mod.same_bytes(a, b, None)
    with open(b, "r+b") as fh:
        fh.seek((5 << 20) + 3)
        fh.write(b"!")
    assert not publish_mod.same_bytes(a, b, None)


def test_a_copy_stops_between_blocks_when_cancelled(
    spool: Spool, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unmount or SIGTERM during a long publish: it stops at the next block, leaves nothing
    behind, and the file stays spooled."""
    import threading

    monkeypatch.setattr(publish_mod, "_same_fs", lambda a, b: False)
    monkeypatch.setattr(publish_mod, "BLOCK", 1 << 20)
    path = spool.path("big.bin")
    make_sparse(path, 64 << 20, {i << 20: b"z" * 4096 for i in range(64)})
    cancel = threading.Event()
    calls = 0
    real = os.copy_file_range

    def counting(*args: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            cancel.set()  # the daemon is told to stop while the copy runs
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", counting)
    outcome = spool.attempt("big.bin", False, OPTIONS, 0.0, cancel)
    assert outcome.kind == "skipped" and calls == 3
    assert path.is_file() and not (src / "big.bin").exists() and leftovers(src) == []


# -- attempts: settle, vanished, space ------------------------------------------------------


def test_an_attempt_waits_for_a_file_changed_less_than_settle_ago(spool: Spool, src: Path) -> None:
    put(spool, "x.csv", b"fresh")  # ctime: now (mtime set back, as rsync does)
    outcome = spool.attempt("x.csv", False, OPTIONS, 30.0)
    assert outcome.kind == "unsettled" and 25 < outcome.wait <= 30
    assert not (src / "x.csv").exists()
    assert spool.attempt("x.csv", False, OPTIONS, 0.0).kind == "published"
    assert spool.attempt("gone.csv", False, OPTIONS, 0.0).kind == "vanished"


def test_an_archive_waits_for_space_naming_the_file_and_the_need(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    put(spool, "z.tif", corpus["zstack_u16.tif"])
    put(spool, "n.csv", b"plain: needs no room")
    monkeypatch.setattr(publish_mod, "free_bytes", lambda path: 4096)
    outcome = spool.attempt("z.tif", False, OPTIONS, 0.0)
    assert outcome.kind == "space" and "needs about" in outcome.reason
    assert "4.0 KiB free" in outcome.reason and leftovers(src) == []
    assert spool.attempt("n.csv", False, OPTIONS, 0.0).kind == "published"  # a hard link


@pytest.mark.parametrize("writer", ["packer.pack_file", "smallpack.pack_small"])
def test_enospc_while_packing_is_a_wait_for_space_not_a_failure(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    """Either archive writer: zarr-python's, or the direct one small TIFFs take."""
    import importlib

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(spool.staging / "tmp"))

    module, name = writer.split(".")
    monkeypatch.setattr(importlib.import_module(f"vfs.decant.{module}"), name, full)
    put(spool, "z.tif", corpus["zstack_u16.tif"])
    options = PackOptions(pyramid=1) if module == "packer" else OPTIONS  # a pyramid: zarr's
    outcome = spool.attempt("z.tif", False, options, 0.0)
    assert outcome.kind == "space" and "No space left on device" in outcome.reason


def test_without_hard_links_a_plain_file_is_copied(
    spool: Spool, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that refuses links (EPERM from protected_hardlinks, vfat's EPERM, EMLINK)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", refuse)
    put(spool, "x.csv", b"copied, not linked")
    published = spool.publish("x.csv", False, OPTIONS)
    assert published.mode == "plain" and not os.path.samefile(spool.path("x.csv"), src / "x.csv")
    assert (src / "x.csv").read_bytes() == b"copied, not linked"
    assert_metadata(src / "x.csv")
    assert leftovers(src) == []


def test_a_small_tiff_is_packed_directly_and_made_durable_with_its_batch(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct writer: no fsync per file (the queue's `sync_placed` makes the batch durable
    before any spooled copy goes), zarr's writer never called, the spooled copy kept, and the
    archive in place reconstructs to the original's bytes."""
    from vfs.decant import packer
    from vfs.ingest.publish import sync_placed

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the zarr path packed a small TIFF")

    monkeypatch.setattr(packer, "pack_file", never)
    original = corpus["zstack_u16.tif"].read_bytes()
    put(spool, "run/z.tif", corpus["zstack_u16.tif"])
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    outcome = spool.attempt("run/z.tif", False, OPTIONS, 0.0)
    assert outcome.kind == "published" and outcome.published is not None
    published = outcome.published
    assert (published.mode, published.synced, synced) == ("byte-exact", False, [])
    assert spool.path("run/z.tif").read_bytes() == original  # until the batch is durable
    sync_placed(src, [published.target])
    assert len(synced) == 2  # the archive, then its folder
    require_verified(published.target)
    with DecantArchive.open(published.target) as archive:
        (info,) = archive.originals()
        assert info.size == len(original)
        assert info.sha256 == hashlib.sha256(original).hexdigest()
    assert leftovers(src) == []


def test_a_small_tiff_whose_direct_archive_fails_its_check_takes_the_packer_s_path(
    spool: Spool, src: Path, corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct writer has no verbatim fallback of its own: a TIFF whose archive failed its
    check there stayed spooled and failed at every retry (red team 45: an empty axis). Such a
    file now goes the packer's way, which falls back to verbatim where it must."""
    from vfs.decant import smallpack
    from vfs.errors import ManifestError

    def refused(name: str, *args: object) -> None:
        raise ManifestError(f"{name}: pages[0] shape [10, 0] has an empty axis")

    monkeypatch.setattr(smallpack, "pack_small", refused)
    put(spool, "z.tif", corpus["zstack_u16.tif"])
    outcome = spool.attempt("z.tif", False, OPTIONS, 0.0)
    assert outcome.kind == "published" and outcome.published is not None, outcome.reason
    assert outcome.published.mode == "byte-exact"  # zarr-python's path wrote it
    assert archived(outcome.published.target)[0] == sha256(corpus["zstack_u16.tif"])
    assert leftovers(src) == []


def test_a_file_whose_writer_is_closing_is_tried_again_and_one_cut_off_fails(
    spool: Spool, src: Path
) -> None:
    """A release tells the queue the file closed, then clears its write mark, which may wait
    on a worker thread: a publish in between found the mark, reported the file failed ("its
    writer was cut off") and retried it 30 s later. This run's mark is a close under way; an
    earlier run's is a cut-off writer."""
    from vfs.ingest.writing import WRITING, Writers

    path = put(spool, "x.csv", b"whole")
    writers = Writers()
    fd = os.open(path, os.O_RDWR)
    try:
        writers.opened(fd)  # marked by this run
        outcome = spool.attempt("x.csv", False, OPTIONS, 0.0)
        assert (outcome.kind, outcome.reason) == ("unsettled", "") and outcome.wait < 1
        os.setxattr(fd, WRITING, b"1")  # as an earlier run (or version) left it
        outcome = spool.attempt("x.csv", False, OPTIONS, 0.0)
        assert outcome.kind == "failed" and "cut off" in outcome.reason
        writers.closed(fd)
    finally:
        os.close(fd)
    assert spool.attempt("x.csv", False, OPTIONS, 0.0).kind == "published"
    assert (src / "x.csv").read_bytes() == b"whole"


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")
@pytest.mark.parametrize("trusted", [False, True])
def test_a_file_of_no_record_replaces_in_a_sticky_folder_only_what_its_writer_could(
    src: Path, trusted: bool
) -> None:
    """A file spooled before a restart (no record of what the mount showed under its name)
    replaces, in a sticky folder, its writer's own entry, never another user's; an inbox's
    file (the operator's) is published over what it finds."""
    spool = Spool(src, src / ".decant-spool" / "files", trusted=trusted)
    shared = src / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "theirs.txt").write_bytes(b"another user's")
    os.chown(shared / "theirs.txt", 4321, 4321)
    (shared / "mine.txt").write_bytes(b"the writer's older copy")
    os.chown(shared / "mine.txt", 1234, 5678)
    put(spool, "shared/mine.txt", b"new")  # put(): the writer is uid 1234
    put(spool, "shared/theirs.txt", b"new")
    spool.publish("shared/mine.txt", False, OPTIONS)
    assert (shared / "mine.txt").read_bytes() == b"new"
    if trusted:
        spool.publish("shared/theirs.txt", False, OPTIONS)
        assert (shared / "theirs.txt").read_bytes() == b"new"
        return
    with pytest.raises(FileExistsError, match=r"uid 4321.*may not replace"):
        spool.publish("shared/theirs.txt", False, OPTIONS)
    assert (shared / "theirs.txt").read_bytes() == b"another user's"
    assert spool.path("shared/theirs.txt").read_bytes() == b"new"


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")
def test_a_file_of_no_record_replaces_nothing_in_a_folder_its_writer_may_no_longer_write(
    spool: Spool, src: Path
) -> None:
    """Another user's folder, open to all when the file was written through the mount, made
    0755 since, with their own file put at its name: a restart published over it (red team 44
    recheck). Its writer could not rename over it now: it stays spooled."""
    theirs = src / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 4321, 4321)
    (theirs / "x.txt").write_bytes(b"the folder owner's")
    os.chown(theirs / "x.txt", 4321, 4321)
    put(spool, "theirs/x.txt", b"new")
    with pytest.raises(FileExistsError, match=r"uid 4321.*may not replace"):
        spool.publish("theirs/x.txt", False, OPTIONS)
    assert (theirs / "x.txt").read_bytes() == b"the folder owner's"
    theirs.chmod(0o777)  # open again: the writer may replace it by a rename, so may this
    spool.publish("theirs/x.txt", False, OPTIONS)
    assert (theirs / "x.txt").read_bytes() == b"new"


def test_a_file_spooled_below_the_housekeeping_depth_is_found_after_a_restart(
    spool: Spool, src: Path
) -> None:
    """Red team 53: files spooled 258 and 300 folders deep before a `kill -9` were neither
    published nor reported after the restart (the walk stopped at 256 levels); the write side
    makes folders as deep as a path reaches, so the walk that finds them after a crash does."""
    from vfs.walk import MAX_WALK_DEPTH

    for depth in (MAX_WALK_DEPTH - 6, MAX_WALK_DEPTH + 2, 300):
        rel = "/".join([f"k{depth}", *["y"] * depth, "leaf.txt"])
        os.close(spool.create(rel, 0o644, os.getuid(), -1))
    found = sorted(spool.walk())
    assert [r.split("/")[0] for r in found] == ["k250", "k258", "k300"]
    assert all(r.endswith("/leaf.txt") for r in found)


def test_a_file_of_no_record_named_like_an_archive_leaves_the_archive_it_names(
    spool: Spool, src: Path, tmp_path: Path
) -> None:
    """`rsync -a` of `x.tif` and a file `x.tif.zarr.zip` (another user's, or the same run's):
    `x.tif` is published as the archive `x.tif.zarr.zip`, shown as `x.tif`; the file written
    as `x.tif.zarr.zip` stays spooled, failed. After a restart (no record of what the mount
    showed under its name) it was published as `x.tif.zarr.zip.zarr.zip` and deleted the
    archive of `x.tif`, which the mount had never shown under that name (red team 76, F1)."""
    (tmp_path / "x.tif").write_bytes(tiff_of_shape(8, 8, 1))
    pack_file(tmp_path / "x.tif", src / "x.tif.zarr.zip")
    archive = (src / "x.tif.zarr.zip").read_bytes()
    put(spool, "x.tif.zarr.zip", b"a file written under an archive's name")
    with pytest.raises(FileExistsError, match="shown under another name"):
        spool.publish("x.tif.zarr.zip", False, OPTIONS)
    assert (src / "x.tif.zarr.zip").read_bytes() == archive
    assert not (src / "x.tif.zarr.zip.zarr.zip").exists()
    assert spool.path("x.tif.zarr.zip").read_bytes() == b"a file written under an archive's name"


def test_a_file_of_no_record_replaces_a_plain_file_named_like_a_folder_archive(
    spool: Spool, src: Path
) -> None:
    """Red team 77, F3: a plain file `notes.zarr` (shown as it is: only a folder `NAME.zarr`
    is a folder archive), rewritten and spooled over a restart, failed for good as "shown
    under another name"."""
    (src / "notes.zarr").write_bytes(b"the older notes")
    os.chown(src / "notes.zarr", 1234, 5678)
    put(spool, "notes.zarr", b"the newer notes")
    spool.publish("notes.zarr", False, OPTIONS)
    assert (src / "notes.zarr").read_bytes() == b"the newer notes"


def test_a_tiff_of_more_strips_than_the_daemon_s_bound_is_archived_verbatim(
    spool: Spool, src: Path, tmp_path: Path
) -> None:
    """Red team 85: a 2.1 GB TIFF of 2 million 1 KiB strips (zeros, a 28 MB archive) passed
    the strips-must-carry-their-cost rule and took a daemon with a 64 MiB cache to 1.2 GB as
    it packed. The daemon's spool bounds the strips of mode D by its cache
    (vfs.mount.daemon.segment_bound); more go verbatim, byte for byte."""
    import numpy as np
    import tifffile

    from vfs.mount.daemon import segment_bound

    assert segment_bound(64 << 20) == 65_536 and segment_bound(512 << 20) == 262_144
    original = tmp_path / "strips.tif"
    tifffile.imwrite(original, np.zeros((300, 16), np.uint16), rowsperstrip=1)
    put(spool, "strips.tif", original)
    spool.max_segments = 299
    published = spool.publish("strips.tif", False, OPTIONS)
    archive = src / "strips.tif.zarr.zip"
    assert published.mode == "verbatim" and "this daemon packs" in published.reason
    assert archived(archive) == (sha256(original), original.stat().st_size, "verbatim")
    spool.max_segments = 300  # within it: mode D as before
    put(spool, "strips2.tif", original)
    assert spool.publish("strips2.tif", False, OPTIONS).mode == "byte-exact"
