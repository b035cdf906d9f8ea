"""`--verify-first` through a real `allow_other` mount, read by an unprivileged user: the open
of a damaged original not verified yet fails with EIO (without the option a 4 KiB read of it
is served, wrong, with no error: red team 49, F1), and a good one opens, verified, and reads
byte-exact. Expected bytes come from the TIFF the helper writes, never from vfs."""

from __future__ import annotations

import errno
import hashlib

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from tests.unit.damaged import good_and_bad

READ_4K = "os.pread(os.open(p, os.O_RDONLY), 4096, at).hex()"


def _mounted(factory: pytest.TempPathFactory, *extra: str) -> tuple[Mount, bytes, int]:
    """good.tif's and bad.tif's archives (tests.unit.damaged), readable by all, mounted with
    `-o allow_other` and `extra`; the original's bytes and the offset changed in bad."""
    base = open_tmp(factory, "verify-first")
    src = base / "src"
    src.mkdir(mode=0o755)
    original, at = good_and_bad(src, factory.mktemp("tifs"))
    for archive in src.iterdir():
        archive.chmod(0o644)
    mount = Mount(src, base / "mnt", base / "mnt.log", base / "index")
    return mount.start("-o", "allow_other", *extra), original, at


@pytest.mark.parametrize("first", [False, True], ids=["default", "verify-first"])
def test_a_damaged_unverified_original_fails_its_open_with_verify_first(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, first: bool
) -> None:
    mount, original, at = _mounted(tmp_path_factory, *(["--verify-first"] if first else []))
    try:
        bad, good = mount.mnt / "bad.tif", mount.mnt / "good.tif"
        start = at - at % 4096
        if first:
            assert unprivileged.errno_of(READ_4K, p=bad, at=start) == errno.EIO
            assert "bad.tif.zarr.zip" in mount.log_text()
        else:  # served, wrong, unflagged: what the option is for
            served = unprivileged.value_of(READ_4K, p=bad, at=start)
            assert bytes.fromhex(served) != original[start : start + 4096]
        want = hashlib.sha256(original).hexdigest()
        assert unprivileged.value_of("read(p)", p=good) == want
        assert (
            unprivileged.value_of(READ_4K, p=good, at=start) == original[start : start + 4096].hex()
        )
    finally:
        mount.stop()


def test_verify_first_opens_an_intact_archive_whose_ctime_moved_after_it_was_listed(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """Red team 49b, F1: a chmod to the same mode between the listing and the open (or a hard
    link made and removed) made the verification's open find another version; that was taken
    for damage, and the intact file was refused with EIO for every user for good. Now the open
    gets ESTALE, the kernel looks the name up again, and the retry verifies and reads it."""
    mount, original, _at = _mounted(tmp_path_factory, "--verify-first")
    try:
        good = mount.mnt / "good.tif"
        assert good.stat().st_size == len(original)  # listed, looked up
        (mount.src / "good.tif.zarr.zip").chmod(0o644)  # same mode: only its ctime moves
        want = hashlib.sha256(original).hexdigest()
        assert unprivileged.value_of("read(p)", p=good) == want, mount.log_text()
        assert hashlib.sha256(good.read_bytes()).hexdigest() == want
    finally:
        mount.stop()
