"""vfs/spool.py without a mount: the spool tree, publishing (archive, verbatim, plain, already),
the restart shortcut, and the clean-up of what a crash leaves behind."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vfs.decant import TEMP_PREFIX
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive
from vfs.decant.verify import require_verified
from vfs.ingest import spool as spool_mod
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


def test_archive_holds_only_exactly_these_bytes(src: Path, corpus: dict[str, Path]) -> None:
    original = corpus["zstack_u16.tif"]
    archive = src / "z.tif.zarr.zip"
    size, sha = original.stat().st_size, sha256(original)
    assert not spool_mod._archive_holds(archive, size, sha)  # missing
    pack_file(original, archive)
    assert spool_mod._archive_holds(archive, size, sha)
    assert not spool_mod._archive_holds(archive, size, "0" * 64)
    assert not spool_mod._archive_holds(archive, size + 1, sha)
    archive.write_bytes(b"PK\x03\x04 not really a zip")
    assert not spool_mod._archive_holds(archive, size, sha)


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
    monkeypatch.setattr(spool_mod, "_same_fs", lambda a, b: False)
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
        src / f"{TEMP_PREFIX}1-ab-x.tif.zarr.zip",
        src / "a" / "b" / f"{TEMP_PREFIX}2-cd-y.tif.zarr.zip",
    ]
    for path in orphans:
        path.write_bytes(b"half an archive")
    folder_orphan = src / "a" / f"{TEMP_PREFIX}3-ef-z.zarr"
    (folder_orphan / "c").mkdir(parents=True)
    kept = [src / "a" / "b" / "keep.tif.zarr.zip", spool_root / "files" / f"{TEMP_PREFIX}9-in"]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"keep")

    removed = remove_orphans(src, spool_root)

    assert sorted(removed) == sorted([*orphans, folder_orphan])
    assert all(not p.exists() for p in removed) and all(p.exists() for p in kept)


def test_clear_staging(spool: Spool, src: Path) -> None:
    assert spool.clear_staging() == []
    spool.staging.mkdir(parents=True)
    (spool.staging / f"{TEMP_PREFIX}1-ab-x.tif.zarr.zip").write_bytes(b"half")
    (spool.staging / f"{TEMP_PREFIX}2-cd-y.zarr").mkdir()
    assert len(spool.clear_staging()) == 2
    assert list(spool.staging.iterdir()) == []
