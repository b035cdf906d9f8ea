"""What `decant pack` writes is no more open than what it packs (red team 61, F1): a folder
archive (`-o NAME.zarr`) of a 0600 TIFF was written with the umask's modes (files 0644,
folders 0755), so every user read its pixels and manifest, and its original through a mount.
Modes are checked on disk, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

Cli = Callable[..., Any]


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def tiff(path: Path, mode: int, seed: int = 1, compression: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(seed).integers(0, 4000, (3, 40, 32), dtype=np.uint16)
    tifffile.imwrite(path, data, compression=compression)
    os.chmod(path, mode)
    return path


def modes(root: Path) -> set[tuple[str, int]]:
    """("d" or "f", permission bits) of `root` and everything below it."""
    found = {("d", stat.S_IMODE(root.lstat().st_mode))}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found.add(("d", stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode)))
        for name in filenames:
            found.add(("f", stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode)))
    return found


@pytest.mark.parametrize(("bits", "want"), [(0o600, {("d", 0o700), ("f", 0o600)}),
                                             (0o640, {("d", 0o750), ("f", 0o640)}),
                                             (0o644, {("d", 0o755), ("f", 0o644)})])  # fmt: skip
def test_a_folder_archive_takes_the_original_s_bits(
    tmp_path: Path, decant_cli: Cli, bits: int, want: set[tuple[str, int]]
) -> None:
    src = tiff(tmp_path / "priv.tif", bits)
    out = tmp_path / "priv.tif.zarr"
    status, _out, err = decant_cli("pack", src, "-o", out)
    assert (status, err) == (0, "")
    assert modes(out) == want
    assert decant_cli("verify", out)[0] == 0


def test_a_nested_series_is_no_more_open_than_its_most_private_member(
    tmp_path: Path, decant_cli: Cli
) -> None:
    folder = tmp_path / "run"
    tiff(folder / "a.tif", 0o644)
    tiff(folder / "b.tif", 0o600, seed=2, compression="zlib")  # another layout: nested
    os.chmod(folder, 0o755)
    out = tmp_path / "run.zarr"
    status, _out, err = decant_cli("pack", folder, "--series", "-o", out)
    assert (status, err) == (0, "")
    assert modes(out) == {("d", 0o700), ("f", 0o600)}


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a link owned by another user (root only)")
@pytest.mark.parametrize("name", ["v.tif.zarr.zip", "v.zarr"])
def test_pack_follows_no_link_of_another_user_s_on_the_way(
    tmp_path: Path, decant_cli: Cli, name: str
) -> None:
    """`decant pack v.tif -o shared/out/v.zarr`, where another user made `out` a link to a
    folder of theirs: refused, exit 3, naming it (red team 61, F2), as `decant restore` is."""
    src = tiff(tmp_path / "v.tif", 0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.symlink(theirs, shared / "out")
    os.lchown(shared / "out", 1001, 1001)
    status, out, err = decant_cli("pack", src, "-o", shared / "out" / name)
    assert (status, out) == (3, "")
    assert "'out' on the way is a symlink of uid 1001's (not followed)" in err
    assert list(theirs.iterdir()) == []
    os.lchown(shared / "out", 0, 0)  # root's own link is followed, as restore follows it
    assert decant_cli("pack", src, "-o", shared / "out" / name, "-q")[0] == 0
    assert (theirs / name).exists()


def test_one_input_and_an_output_ending_in_a_slash_packs_into_that_folder(
    tmp_path: Path, decant_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o out/` of one input made a folder archive named `out` (red team 61)."""
    tiff(tmp_path / "a.tif", 0o644)
    monkeypatch.chdir(tmp_path)
    status, out, err = decant_cli("pack", "a.tif", "-o", "out/")
    assert (status, err) == (0, "")
    assert out.startswith("a.tif -> out/a.tif.zarr.zip: byte-exact")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.tif.zarr.zip"]
    assert Path.cwd() == tmp_path  # the working folder given back


@pytest.mark.skipif(os.geteuid() != 0, reason="plants folders owned by another user (root only)")
def test_pack_writes_into_no_folder_another_user_may_rename_entries_of(
    tmp_path: Path, decant_cli: Cli
) -> None:
    """The core writes its temp archive by name: a user who may rename entries of the folder
    swapped it for a link between two opens, and root's pack overwrote a file of root's
    (red team 62, F1). Such a folder is refused, exit 3; a sticky one is not."""
    src = tiff(tmp_path / "v.tif", 0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1001, 1001)
    status, _out, err = decant_cli("pack", src, "-o", theirs / "v.tif.zarr.zip")
    assert status == 3 and "belongs to uid 1001: not written there" in err
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    status, _out, err = decant_cli("pack", src, "-o", f"{shared}/")
    assert status == 3 and "writable by others without the sticky bit" in err
    assert list(theirs.iterdir()) == [] and list(shared.iterdir()) == []
    os.chmod(shared, 0o1777)
    assert decant_cli("pack", src, "-o", f"{shared}/", "-q")[0] == 0
    assert [p.name for p in shared.iterdir()] == ["v.tif.zarr.zip"]


def test_a_folder_found_at_the_archive_s_name_is_not_packed_into(
    tmp_path: Path, decant_cli: Cli
) -> None:
    """Another user's folder planted at root's `-o /tmp/scan.zarr.zip` took the archive
    (red team 62, F1): only an `-o` ending in / names a folder to pack into."""
    src = tiff(tmp_path / "v.tif", 0o600)
    planted = tmp_path / "scan.zarr.zip"
    planted.mkdir()
    status, _out, err = decant_cli("pack", src, "-o", planted)
    assert status == 2 and "already exists" in err
    assert list(planted.iterdir()) == []


def test_the_file_packed_is_the_one_opened_whatever_its_name_names_later(
    tmp_path: Path,
) -> None:
    """`pack_file` reads, hashes and takes the mode of one open file: a user's file swapped
    for a link to root's secret between the stat and the reads was packed with the secret's
    bytes and the 0644 file's mode (red team 62, F2)."""
    from vfs.decant.packer import held_open

    mine = tiff(tmp_path / "x.tif", 0o644)
    mine_bytes = mine.read_bytes()
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret")
    os.chmod(secret, 0o600)
    with held_open(mine) as (held, st):
        mine.unlink()
        os.symlink(secret, mine)
        assert held.read_bytes() == mine_bytes
        assert stat.S_IMODE(st.st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns folders to another group (root only)")
def test_a_folder_writable_by_one_s_own_group_only_is_written_to(
    tmp_path: Path, decant_cli: Cli
) -> None:
    """A user-private-group umask (002) makes one's folders 0775 of one's own group: fine; a
    group-writable folder of another group is not."""
    src = tiff(tmp_path / "v.tif", 0o644)
    own = tmp_path / "own"
    own.mkdir()
    os.chmod(own, 0o775)
    assert decant_cli("pack", src, "-o", f"{own}/", "-q")[0] == 0
    lab = tmp_path / "lab"
    lab.mkdir()
    os.chown(lab, 0, 1001)
    os.chmod(lab, 0o2775)
    status, _out, err = decant_cli("pack", src, "-o", f"{lab}/")
    assert status == 3 and "writable by others without the sticky bit" in err


def test_a_series_folder_swapped_for_a_link_mid_pack_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The series folder is opened once: a user swapping it for a link to root's folder
    between the steps had root's 0600 file packed with the user's folder's mode (red team
    63, F1). Swapped after the listing, the pack still reads the folder it listed."""
    import vfs.decant.series as series
    from vfs.decant.verify import restore_archive

    run = tmp_path / "run"
    tiff(run / "a.tif", 0o644, seed=1)
    os.chmod(run, 0o755)
    secret = tmp_path / "secret"
    tiff(secret / "a.tif", 0o600, seed=2)
    os.chmod(secret, 0o700)
    scan = series.scan_tiff
    swapped: list[bool] = []

    def swapping_scan(path: Path, *args: Any) -> Any:
        if not swapped:
            swapped.append(True)
            os.rename(run, tmp_path / "run-away")
            os.symlink(secret, run)
        return scan(path, *args)

    monkeypatch.setattr(series, "scan_tiff", swapping_scan)
    result = series.pack_series(run, tmp_path / "run.zarr.zip", series.PackOptions())
    assert swapped and result.archive.stat().st_mode & 0o777 == 0o644
    restore_archive(result.archive, tmp_path / "out", tmp_path)
    listed = (tmp_path / "run-away" / "a.tif").read_bytes()
    assert (tmp_path / "out" / "a.tif").read_bytes() == listed


def test_a_series_member_swapped_for_a_fifo_is_refused_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member renamed to a FIFO after the listing held root's pack for good (red team 63,
    F2): every step opens members non-blocking and takes regular files only."""
    import vfs.decant.series as series
    from vfs.errors import PackError

    run = tmp_path / "run"
    tiff(run / "a.tif", 0o644)
    tiff(run / "b.tif", 0o644, seed=2)
    listed = series.series_members

    def listing_then_fifo(folder: Path) -> list[Path]:
        members = listed(folder)
        os.unlink(run / "b.tif")
        os.mkfifo(run / "b.tif")
        return members

    monkeypatch.setattr(series, "series_members", listing_then_fifo)
    with pytest.raises(PackError, match=r"b\.tif: not a regular file"):
        series.pack_series(run, tmp_path / "run.zarr.zip", series.PackOptions())


def test_restore_gives_the_original_the_archive_s_bits(tmp_path: Path, decant_cli: Cli) -> None:
    """A 0600 original restored 0644 (0666 less the umask): readable by every user (red team
    63, F3). Restored with the archive's read and write bits, less the umask, as `cp` does."""
    for bits in (0o600, 0o644):
        src = tiff(tmp_path / f"p{bits:o}.tif", bits)
        assert decant_cli("pack", src, "-q")[0] == 0
        out = tmp_path / f"r{bits:o}.tif"
        assert decant_cli("restore", tmp_path / f"{src.name}.zarr.zip", "-o", out, "-q")[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == bits
        assert out.read_bytes() == src.read_bytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a link owned by another user (root only)")
def test_an_input_that_is_another_user_s_link_is_refused(tmp_path: Path, decant_cli: Cli) -> None:
    """`/tmp/scan.tif`, another user's link to a 0644 file inside root's 0700 folder, was
    packed (and restored) into a file that user could read (red team 64, F1)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = tiff(private / "secret.tif", 0o644)
    assert decant_cli("pack", secret, "-q")[0] == 0
    shared = tmp_path / "shared"
    shared.mkdir()
    for name, target in (
        ("scan.tif", secret),
        ("scan.tif.zarr.zip", private / "secret.tif.zarr.zip"),
    ):
        os.symlink(target, shared / name)
        os.lchown(shared / name, 1001, 1001)
    out = tmp_path / "out"
    out.mkdir()
    status, _out, err = decant_cli("pack", shared / "scan.tif", "-o", f"{out}/")
    assert status == 2 and "symlink of uid 1001's (not followed)" in err
    for command in (("restore", shared / "scan.tif.zarr.zip", "-o", out / "r.tif"),
                    ("info", shared / "scan.tif.zarr.zip")):  # fmt: skip
        status, _out, err = decant_cli(*command)
        assert status == 2 and "symlink of uid 1001's (not followed)" in err
    assert list(out.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder of another user's (root only)")
def test_restore_writes_into_no_folder_another_user_may_rename_entries_of(
    tmp_path: Path, decant_cli: Cli
) -> None:
    """A user who made the folder a series restores into swapped their bytes in for root's
    temp file, which root then published as the original (red team 64, F2)."""
    src = tiff(tmp_path / "v.tif", 0o644)
    assert decant_cli("pack", src, "-q")[0] == 0
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1001, 1001)
    status, _out, err = decant_cli("restore", tmp_path / "v.tif.zarr.zip", "-o", theirs / "v.tif")
    assert status == 3 and "belongs to uid 1001: not written there" in err
    assert list(theirs.iterdir()) == []


def test_an_archive_that_is_a_fifo_is_refused_not_waited_on(
    tmp_path: Path, decant_cli: Cli
) -> None:
    """Checked, then opened again by name (blocking), an archive swapped for a FIFO in between
    held root's `decant info` for good (red team 64, F3): it is opened once, non-blocking."""
    fifo = tmp_path / "x.zarr.zip"
    os.mkfifo(fifo)
    for command in ("info", "verify", "restore"):
        status, _out, err = decant_cli(command, fifo)
        assert status == 2 and "not a decant archive (not a file or a folder)" in err
