"""An archive described while it was being written in place is described again.

One `write()` stamps a file's mtime and ctime as it starts: a listing during it sees the new
version's stat and parses the old bytes. That description, with the old sha256, was kept in the
index under the new stat, and its verification failed: every read gave EIO until the file
changed again, across remounts too (red team, round 47, F1). A description made within
`RACY_NS` of the file's mtime is now neither kept nor trusted: an open after that describes the
archive again, and gets ESTALE (the kernel looks the name up again) if it presents another file.

The parse of the old bytes is made deterministic by having the backend describe a copy of the
old archive for the listed one, once: what a parse racing the write would have read."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyfuse3
import pytest
import tifffile
import trio

from tests.unit.inprocess import InProcessMount, fake_session
from vfs.backends.base import Description
from vfs.backends.decant import DecantBackend
from vfs.decant.packer import pack_file
from vfs.decant.reader import OriginalReader
from vfs.errors import CorruptArchiveError
from vfs.mount import racy as racy_module
from vfs.mount.index import DescriptionIndex
from vfs.mount.tree import index_key

RACY_S = 0.3


def _tiff(path: Path, seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 4000, (96, 96), dtype=np.uint16)
    tifffile.imwrite(path, pixels)
    return path


@pytest.fixture
def racy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InProcessMount, Path]]:
    monkeypatch.setattr(racy_module, "RACY_NS", int(RACY_S * 1e9))
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for version, seed in (("old", 1), ("new", 2)):
        (tmp_path / version).mkdir()
        pack_file(_tiff(tmp_path / version / "x.tif", seed), tmp_path / version / "x.tif.zarr.zip")
    shutil.copyfile(tmp_path / "new" / "x.tif.zarr.zip", src / "d" / "x.tif.zarr.zip")  # now
    with fake_session():
        mount = InProcessMount(src, tmp_path, read_only=True)
        mount.tree.index = DescriptionIndex(tmp_path / "index.sqlite")
        yield mount, tmp_path
        mount.tree.index.close()


def _parse_old_bytes_once(monkeypatch: pytest.MonkeyPatch, old: Path) -> None:
    real = DecantBackend.describe_listed
    calls: list[Path] = []

    def racing(self: DecantBackend, path: Path, listed: os.stat_result) -> object:
        calls.append(path)
        if len(calls) == 1:  # the first parse read the bytes the write had not reached yet
            return real(self, old, os.stat(old))
        return real(self, path, listed)

    monkeypatch.setattr(DecantBackend, "describe_listed", racing)


def _racing(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> tuple[InProcessMount, Path, Path]:
    """The racy mount whose first parse of d/x.tif.zarr.zip reads the old version's bytes; the
    mount, the folder of both versions, and the archive in SRC."""
    mount, tmp = racy
    _parse_old_bytes_once(monkeypatch, tmp / "old" / "x.tif.zarr.zip")
    return mount, tmp, mount.config.src / "d" / "x.tif.zarr.zip"


def _indexed(mount: InProcessMount, archive: Path) -> Description | None:
    """The description the index keeps for the archive's current version."""
    st = archive.stat()
    assert mount.tree.index is not None
    backend = next(b for b in mount.tree.backends if b.name == "decant")
    return mount.tree.index.get(archive, index_key(backend), st.st_size, st.st_mtime_ns,
                                st.st_ino, st.st_ctime_ns)  # fmt: skip


async def _read_all(mount: InProcessMount, ino: int) -> bytes | int:
    try:
        return await mount.read_inode(ino)
    except pyfuse3.FUSEError as exc:
        return exc.errno


async def _read_open_later_read_again(
    mount: InProcessMount, path: str
) -> tuple[bytes | int, int, bytes | int]:
    """Read `path` whole at once (its description made mid-write), open it again once the
    moment has passed (the errno, 0 if it opened), then look it up and read it again, as the
    kernel's retry after ESTALE does."""
    first = await mount.resolve(path)
    during = await _read_all(mount, first)
    await trio.sleep(RACY_S + 0.05)
    try:
        await mount.ops.open(first, os.O_RDONLY, mount.ctx)
    except pyfuse3.FUSEError as exc:
        stale = exc.errno
    else:
        stale = 0
    return during, stale, await _read_all(mount, await mount.resolve(path))


def test_a_description_of_an_archive_mid_write_is_made_again_and_serves_the_new_bytes(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, tmp, archive = _racing(racy, monkeypatch)

    during, stale, after = mount.run(_read_open_later_read_again, mount, "d/x.tif")
    assert during == errno.EIO  # never the wrong bytes
    assert stale == errno.ESTALE
    assert after == (tmp / "new" / "x.tif").read_bytes()
    kept = _indexed(mount, archive)  # the trusted description, kept
    want = hashlib.sha256((tmp / "new" / "x.tif").read_bytes()).hexdigest()
    assert kept is not None and kept.root.sha256 == want


def test_a_description_made_mid_write_is_not_kept_in_the_index(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept, it was served again after a remount, and failed again."""
    mount, _tmp, archive = _racing(racy, monkeypatch)
    assert mount.run(mount.listdir, "d") == ["x.tif"]
    assert _indexed(mount, archive) is None


def test_a_description_made_long_after_the_write_is_kept_and_trusted(
    racy: tuple[InProcessMount, Path],
) -> None:
    mount, tmp = racy
    archive = mount.config.src / "d" / "x.tif.zarr.zip"
    time.sleep(RACY_S + 0.05)
    ino = mount.run(mount.resolve, "d/x.tif")
    node = mount.ops.inodes.get(ino)
    assert node is not None and not mount.tree.racy_due(node)
    assert _indexed(mount, archive) is not None
    assert mount.run(_read_all, mount, ino) == (tmp / "new" / "x.tif").read_bytes()


def test_an_archive_described_right_mid_write_keeps_its_inode(
    racy: tuple[InProcessMount, Path],
) -> None:
    """Described again after the window, the same file: no ESTALE, the same inode, and the
    archive is not described a third time."""
    mount, tmp = racy

    async def scenario() -> tuple[int, int, bytes | int, bool]:
        first = await mount.resolve("d/x.tif")
        await trio.sleep(RACY_S + 0.05)
        data = await _read_all(mount, first)
        node = mount.ops.inodes.get(first)
        assert node is not None
        return first, await mount.resolve("d/x.tif"), data, mount.tree.racy_due(node)

    first, again, data, due = mount.run(scenario)
    assert first == again and not due
    assert data == (tmp / "new" / "x.tif").read_bytes()


def test_a_package_member_described_mid_write_is_listed_again_from_the_new_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GDI package: its members are listed from its tree, one folder at a time, and those
    listings are let go when the tree read again is another."""
    from tests.toolbox import load_tool
    from tests.unit.c4gh_helpers import backend
    from vfs.backends.c4gh import C4ghBackend

    corpus = load_tool("make_c4gh_corpus")
    monkeypatch.setattr(racy_module, "RACY_NS", int(RACY_S * 1e9))
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    versions = {}
    for version, rows in (("old", 3000), ("new", 3500)):  # the same names, other bytes
        (tmp_path / version).mkdir()
        versions[version] = dict(corpus.gdi_members(parquet_rows=(rows, 400)))
        corpus.write_package(tmp_path / version / "p.tar.c4gh", list(versions[version].items()),
                             keys["writer"], [keys["node"]])  # fmt: skip
    shutil.copyfile(tmp_path / "new" / "p.tar.c4gh", src / "d" / "p.tar.c4gh")
    member = next(n for n in versions["new"] if n.endswith(".parquet"))
    assert versions["old"][member] != versions["new"][member]
    old = tmp_path / "old" / "p.tar.c4gh"
    real = C4ghBackend.describe_listed
    calls: list[Path] = []

    def racing(self: C4ghBackend, path: Path, listed: os.stat_result) -> object:
        calls.append(path)
        return real(self, old, os.stat(old)) if len(calls) == 1 else real(self, path, listed)

    monkeypatch.setattr(C4ghBackend, "describe_listed", racing)
    with fake_session():
        mount = InProcessMount(src, tmp_path, read_only=True)
        mount.tree.backends.append(backend(keys["node"]))

        during, stale, after = mount.run(
            _read_open_later_read_again, mount, f"d/p.tar.c4gh/{member}"
        )
    assert during != versions["new"][member]  # not the new member's bytes: refused, or the old
    assert stale == errno.ESTALE
    assert after == versions["new"][member]


def test_an_archive_shown_raw_for_a_parse_that_failed_mid_write_is_listed_again(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parse that failed mid-write showed the raw `.zarr.zip` and no `x.tif` until the folder
    changed (red team, round 48, F1): nothing opens `x.tif` to have it described again. The
    daemon lists the name again once the moment has passed."""
    mount, tmp = racy
    real = DecantBackend.describe_listed
    calls: list[Path] = []

    def half_written(self: DecantBackend, path: Path, listed: os.stat_result) -> object:
        calls.append(path)
        if len(calls) == 1:
            raise CorruptArchiveError(f"{path}: zip entry not served: written since opened")
        return real(self, path, listed)

    monkeypatch.setattr(DecantBackend, "describe_listed", half_written)

    async def scenario() -> tuple[list[str], list[str], list[str], bytes | int]:
        during = await mount.listdir("d")
        await mount.ops.describe_racy_again()  # too soon: nothing is due yet
        soon = await mount.listdir("d")
        await trio.sleep(RACY_S + 0.05)
        await mount.ops.describe_racy_again()
        after = await mount.listdir("d")
        return during, soon, after, await _read_all(mount, await mount.resolve("d/x.tif"))

    during, soon, after, data = mount.run(scenario)
    assert during == soon == ["x.tif.zarr.zip"]
    assert after == ["x.tif"]
    assert data == (tmp / "new" / "x.tif").read_bytes()
    assert mount.ops.inodes.folder_of(mount.config.src / "d") is not None
    assert mount.tree.take_racy_due() == {}  # described once more, then trusted


def test_an_archive_shown_raw_then_written_over_with_one_that_parses_is_described(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raw archive (it did not parse, long after its write) written over in place: the
    watcher reports the name, and it was let be, as only a plain entry's owner and bits were
    compared; it stayed raw until its folder changed."""
    mount, _tmp = racy
    monkeypatch.setattr(racy_module, "RACY_NS", 0)
    archive = mount.config.src / "d" / "x.tif.zarr.zip"
    good = archive.read_bytes()
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: not an archive
    folder_mtime = (mount.config.src / "d").stat().st_mtime_ns

    async def scenario() -> tuple[list[str], list[str]]:
        before = await mount.listdir("d")
        with open(archive, "r+b") as fh:  # in place: the folder's mtime stays
            fh.write(good)
        assert (mount.config.src / "d").stat().st_mtime_ns == folder_mtime
        await mount.ops.on_names_changed({archive.parent: {archive.name}})
        return before, await mount.listdir("d")

    before, after = mount.run(scenario)
    assert before == ["x.tif.zarr.zip"]
    assert after == ["x.tif"]


def test_a_renamed_archive_whose_mtime_is_old_is_trusted_at_once(
    racy: tuple[InProcessMount, Path],
) -> None:
    """The write side publishes by rename, the archive's mtime the original's: a rename moves
    only the ctime, and writes no bytes. Such an archive is kept in the index at its first
    listing, not described twice."""
    mount, _tmp = racy
    archive = mount.config.src / "d" / "x.tif.zarr.zip"
    ago = time.time() - 60
    os.utime(archive, (ago, ago))
    archive.rename(archive.with_name("tmp"))
    archive.with_name("tmp").rename(archive)  # ctime now
    assert archive.stat().st_ctime > time.time() - 1
    assert mount.run(mount.listdir, "d") == ["x.tif"]
    assert _indexed(mount, archive) is not None
    assert mount.tree.take_racy_due() == {}


def test_an_archive_presenting_a_name_of_another_stem_is_found_when_described_again(
    racy: tuple[InProcessMount, Path],
) -> None:
    """`scan.zarr.zip` presents `x.tif` (the name its manifest records): described again, it was
    looked for under its own name's relatives only, taken for gone, and its open got ESTALE."""
    mount, tmp = racy
    archive = mount.config.src / "d" / "x.tif.zarr.zip"
    archive.rename(archive.with_name("scan.zarr.zip"))
    os.utime(archive.with_name("scan.zarr.zip"))  # written a moment ago

    async def scenario() -> tuple[int, bytes | int, int]:
        assert await mount.listdir("d") == ["x.tif"]
        first = await mount.resolve("d/x.tif")
        await trio.sleep(RACY_S + 0.05)
        data = await _read_all(mount, first)  # opens: described again, the same file
        return first, data, await mount.resolve("d/x.tif")

    first, data, again = mount.run(scenario)
    assert data == (tmp / "new" / "x.tif").read_bytes()
    assert first == again


def _aged(archive: Path) -> None:
    """The archive's mtime a minute back: its description is trusted at once (not racy)."""
    then = time.time() - 60
    os.utime(archive, (then, then))


def test_a_trusted_description_whose_verification_fails_is_made_again_from_the_file(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `write()` that ran longer than the racy window (or a write through a shared mmap):
    the listing made after the window, while bytes were still being written, is trusted and
    kept. Its verification fails; the archive is then described from the file, not the index,
    the next open gets ESTALE, and the kernel's retry reads the new bytes. Before, every read
    gave EIO until the file changed again, across remounts too."""
    mount, tmp, archive = _racing(racy, monkeypatch)
    _aged(archive)
    old_sha = hashlib.sha256((tmp / "old" / "x.tif").read_bytes()).hexdigest()

    during, stale, after = mount.run(_read_open_later_read_again, mount, "d/x.tif")
    assert during == errno.EIO  # never the wrong bytes
    assert stale == errno.ESTALE
    assert after == (tmp / "new" / "x.tif").read_bytes()
    kept = _indexed(mount, archive)
    assert kept is not None and kept.root.sha256 != old_sha
    assert kept.root.sha256 == hashlib.sha256(after).hexdigest()


def test_a_damaged_archive_is_described_once_more_and_stays_refused(
    racy: tuple[InProcessMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its description is right and its bytes wrong: described again, the same, so its opens
    keep getting EIO (no ESTALE, no loop of descriptions)."""
    mount, _tmp = racy
    archive = mount.config.src / "d" / "x.tif.zarr.zip"
    _aged(archive)
    real = DecantBackend.describe_listed
    calls: list[Path] = []

    def counted(self: DecantBackend, path: Path, listed: os.stat_result) -> object:
        calls.append(path)
        return real(self, path, listed)

    monkeypatch.setattr(DecantBackend, "describe_listed", counted)

    def flipped(self: object, *args: object, **kwargs: object) -> object:
        data = bytearray(original_read(self, *args, **kwargs))
        if data:
            data[len(data) // 2] ^= 0xFF
        return bytes(data)

    original_read = OriginalReader.read
    monkeypatch.setattr(OriginalReader, "read", flipped)

    async def scenario() -> tuple[bytes | int, list[int]]:
        first = await mount.resolve("d/x.tif")
        during = await _read_all(mount, first)
        await trio.sleep(RACY_S + 0.05)
        codes = []
        for _ in range(3):
            try:
                await mount.ops.open(first, os.O_RDONLY, mount.ctx)
            except pyfuse3.FUSEError as exc:
                codes.append(exc.errno)
            else:
                codes.append(0)
        return during, codes

    during, codes = mount.run(scenario)
    assert during == errno.EIO
    assert codes == [errno.EIO] * 3
    assert len(calls) == 2  # the listing's, and one more after the failed verification
