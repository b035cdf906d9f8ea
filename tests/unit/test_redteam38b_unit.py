"""Red team, round 38b (unit level): a folder archive (`NAME.zarr/`) overwritten in place, its
own stat unchanged. Each test failed before the fix its docstring names (or tests a piece of
it: `archive_stat`, `manifest_of`)."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.decant import MANIFEST_KEY, archive_stat
from vfs.decant.reader import DecantArchive
from vfs.mount.index import DescriptionIndex, stamp_of
from vfs.mount.scrub import verifiable
from vfs.mount.tree import SourceTree
from vfs.mount.watch import manifest_of


def _folder_archive(base: Path, seed: int, dest: Path) -> bytes:
    """`dest`: the archive of a random 2×64×64 stack `x.tif`, unzipped; its TIFF's bytes."""
    from vfs.decant.packer import pack_file

    work = base / f"w{seed}"
    work.mkdir()
    pixels = np.random.default_rng(seed).integers(0, 4000, (2, 64, 64)).astype(np.uint16)
    tifffile.imwrite(work / "x.tif", pixels)
    pack_file(work / "x.tif", work / "x.tif.zarr.zip")
    with zipfile.ZipFile(work / "x.tif.zarr.zip") as zf:
        zf.extractall(dest)
    return (work / "x.tif").read_bytes()


def _own(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _overwrite(src: Path, dest: Path) -> None:
    """`cp -r src/. dest/`: every file of the same layout rewritten in place (same inodes),
    no entry of `dest` itself made or removed; its own stat must not change."""
    before = _own(os.stat(dest))
    for dirpath, _dirs, files in os.walk(src):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            shutil.copyfile(src / rel, dest / rel)  # opened O_TRUNC: the same inode
    assert _own(os.stat(dest)) == before


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, bytes, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    a = _folder_archive(tmp_path, 1, src / "x.tif.zarr")
    b = _folder_archive(tmp_path, 2, tmp_path / "b.tif.zarr")
    return src / "x.tif.zarr", tmp_path / "b.tif.zarr", a, b


def test_archive_stat_folds_in_the_manifest(tmp_path: Path) -> None:
    archive = tmp_path / "a.zarr"
    (archive / ".decant").mkdir(parents=True)
    manifest = archive / MANIFEST_KEY
    manifest.write_text("one")
    st = os.lstat(archive)
    first = archive_stat(archive, st)
    assert (first.st_ino, first.st_size, first.st_mtime_ns, first.st_mode, first.st_uid) == (
        st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)  # fmt: skip
    assert first.st_ctime_ns != st.st_ctime_ns
    assert archive_stat(archive, st).st_ctime_ns == first.st_ctime_ns  # stable
    mst = os.stat(manifest)
    manifest.write_text("two")  # same size, mtime put back: its ctime still moves
    os.utime(manifest, ns=(mst.st_atime_ns, mst.st_mtime_ns))
    assert _own(os.lstat(archive)) == _own(st)
    assert archive_stat(archive, os.lstat(archive)).st_ctime_ns != first.st_ctime_ns
    # A zip, or a folder whose `.decant` is a link (not followed), keeps its own stat.
    (tmp_path / "z.zarr.zip").write_bytes(b"z")
    zst = os.lstat(tmp_path / "z.zarr.zip")
    assert archive_stat(tmp_path / "z.zarr.zip", zst) is zst
    linked = tmp_path / "l.zarr"
    linked.mkdir()
    (linked / ".decant").symlink_to(archive / ".decant")
    lst = os.lstat(linked)
    assert archive_stat(linked, lst) is lst


def test_a_folder_whose_decant_is_a_link_is_not_claimed_nor_its_target_looked_at(
    tmp_path: Path,
) -> None:
    """`claims` followed `.decant`: root looked for `manifest.json` in whatever folder a user
    pointed it at (another user's 0700 folder), and the log told whether it was there (red
    team 68, F2). A manifest that is a link, or not a file, does not make an archive either."""
    backend = DecantBackend(PageCache(8 << 20))
    real = tmp_path / "real.zarr"
    (real / ".decant").mkdir(parents=True)
    (real / MANIFEST_KEY).write_text("{}")
    assert backend.claims(real, True)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "manifest.json").write_text("{}")
    linked = tmp_path / "l.zarr"
    linked.mkdir()
    (linked / ".decant").symlink_to(private)
    assert not backend.claims(linked, True)
    as_link = tmp_path / "m.zarr"
    (as_link / ".decant").mkdir(parents=True)
    (as_link / MANIFEST_KEY).symlink_to(real / MANIFEST_KEY)
    assert not backend.claims(as_link, True)
    (tmp_path / "n.zarr" / MANIFEST_KEY).mkdir(parents=True)
    assert not backend.claims(tmp_path / "n.zarr", True)
    link_to_archive = tmp_path / "o.zarr"
    link_to_archive.symlink_to(real)
    assert not backend.claims(link_to_archive, True)


def test_manifest_of_names_the_folder_archive(tmp_path: Path) -> None:
    assert manifest_of(tmp_path / "x.tif.zarr" / ".decant" / "manifest.json") == (
        tmp_path / "x.tif.zarr")  # fmt: skip
    assert manifest_of(tmp_path / "x.tif.zarr" / "0" / "manifest.json") is None
    assert manifest_of(tmp_path / "x" / ".decant" / "manifest.json") is None
    assert manifest_of(tmp_path / "x.tif.zarr" / ".zattrs") is None


def test_an_opened_folder_archive_is_keyed_as_its_listing_keys_it(
    pair: tuple[Path, Path, bytes, bytes],
) -> None:
    """The store's stat (what a handle reports as `opened`, the page cache's key, the shared
    open archive's version) is the folder's with the manifest it read folded in: the one a
    listing takes (`archive_stat`) and the index's stamp (`stamp_of`). Before the fix it was
    the folder's own, the same after a rewrite in place."""
    path, other, _a, _b = pair
    with DecantArchive.open(path) as first:
        assert first.store.stat is not None
        assert _own(first.store.stat) == _own(archive_stat(path, os.lstat(path)))
        st = first.store.stat
        assert stamp_of(path) == (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        key = first.cache_key
    _overwrite(other, path)
    with DecantArchive.open(path) as second:
        assert second.cache_key != key
        assert second.store.stat is not None
        assert _own(second.store.stat) == _own(archive_stat(path, os.lstat(path)))


def test_a_handle_opened_after_a_rewrite_does_not_join_the_old_archive(
    pair: tuple[Path, Path, bytes, bytes],
) -> None:
    """A handle held open on `x.tif` kept its archive (old manifest) open; a new open after
    the folder was overwritten in place joined it (same folder lstat) and read the old TIFF
    whole. Fixed: the shared version has the manifest's stat folded in."""
    path, other, a, b = pair
    backend = DecantBackend(PageCache(8 << 20))
    entry = backend.describe(path).root
    old = backend.open(path, "", entry)
    try:
        assert old.read(0, len(a)) == a
        _overwrite(other, path)
        new = backend.open(path, "", backend.describe(path).root)
        try:
            assert new.archive is not old.archive
            assert new.opened != old.opened
            assert bytes(new.read(0, len(b))) == b
        finally:
            new.close()
    finally:
        old.close()


def test_a_rewritten_folder_archive_is_described_anew_and_the_index_does_not_mis_hit(
    pair: tuple[Path, Path, bytes, bytes], tmp_path: Path
) -> None:
    """Listed again after the rewrite (the folder's own stat unchanged), `x.tif` kept its old
    description (from the index, keyed by that stat), size and sha256. Fixed: its version
    and index rows have the manifest's stat folded in; a new tree on the same index (a
    remount) gets the new description too."""
    path, other, a, b = pair
    src = path.parent
    index = DescriptionIndex(tmp_path / "idx" / "index.db")
    try:
        backend = DecantBackend(PageCache(8 << 20))
        tree = SourceTree(src, [backend], index=index)
        before = tree.scan(src)["x.tif"]
        assert before.size == len(a)
        _overwrite(other, path)
        after = tree.scan(src)["x.tif"]
        assert after.version != before.version
        assert after.size == len(b)
        assert after.sha256 != before.sha256
        again = SourceTree(src, [DecantBackend(PageCache(8 << 20))], index=index)
        assert again.scan(src)["x.tif"].sha256 == after.sha256
    finally:
        index.close()


def test_the_scrub_takes_a_folder_archive_s_version_as_listings_do(
    pair: tuple[Path, Path, bytes, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scrub made its nodes from the folder's own lstat: with the manifest folded into
    listings' versions, its opens would be refused as of another version (ESTALE) and its
    index rows would replace the listings' (each then described again)."""
    path, _other, _a, _b = pair
    src = path.parent
    index = DescriptionIndex(tmp_path / "idx" / "index.db")
    try:
        tree = SourceTree(src, [DecantBackend(PageCache(8 << 20))], index=index)
        listed = tree.scan(src)["x.tif"]
        (scrubbed,) = verifiable(tree, set())
        assert scrubbed.version == listed.version
        described: list[Path] = []
        for name in ("describe", "describe_listed"):  # the latter: of the version listed
            real = getattr(DecantBackend, name)
            monkeypatch.setattr(DecantBackend, name,
                                lambda self, p, *more, real=real: described.append(p)
                                or real(self, p, *more))  # fmt: skip
        SourceTree(src, [DecantBackend(PageCache(8 << 20))], index=index).scan(src)
        assert described == []
    finally:
        index.close()


def test_a_folder_store_refuses_reads_once_its_manifest_changed(
    pair: tuple[Path, Path, bytes, bytes],
) -> None:
    """An archive opened before its folder was overwritten in place read B's chunks and decoded
    them by its own (old) manifest: an unverified handle served the mix until its hash's
    verdict. Fixed: each file read after the manifest checks the manifest is still the one
    read (CorruptArchiveError: EIO)."""
    from vfs.decant.store import DirectoryStore
    from vfs.errors import CorruptArchiveError

    path, other, _a, _b = pair
    chunk = next(f"0/{p.name}" for p in (path / "0").iterdir() if not p.name.startswith("."))
    store = DirectoryStore(path)
    try:
        assert store.get_metadata(MANIFEST_KEY, 1 << 20) is not None
        assert store.get(chunk, 1 << 24) is not None
        assert store.get("0/.zarray", 1 << 20) is not None
        _overwrite(other, path)
        with pytest.raises(CorruptArchiveError, match="rewritten since it was opened"):
            store.get(chunk, 1 << 24)
    finally:
        store.close()
