"""`--verify-first`: an original not verified yet is verified whole before its open returns.

Without it a small read of an unverified original is served before any check: a damaged
archive's wrong bytes reach that read unflagged, and only a read completing the file, or the
next open after the verification the handle queued, gets EIO (red team 49, F1; the README's
trade-off). With it the open itself fails with EIO, and a good original's open returns verified.
Expected bytes come from the TIFF written here."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyfuse3
import pytest

from tests.unit.damaged import good_and_bad
from tests.unit.inprocess import InProcessMount, fake_session


@pytest.fixture
def shown(tmp_path: Path) -> tuple[Path, bytes, int]:
    """SRC with good.tif's and bad.tif's archives; the original's bytes; the offset changed."""
    src = tmp_path / "src"
    src.mkdir()
    original, at = good_and_bad(src, tmp_path)
    return src, original, at


async def _pread(mount: InProcessMount, name: str, at: int) -> bytes | int:
    """4 KiB at `at` of `name` in a fresh open, or the errno the open or the read gave."""
    try:
        info = await mount.ops.open(await mount.resolve(name), os.O_RDONLY, mount.ctx)
    except pyfuse3.FUSEError as exc:
        return exc.errno
    try:
        return bytes(await mount.ops.read(info.fh, at - at % 4096, 4096))
    except pyfuse3.FUSEError as exc:
        return exc.errno
    finally:
        await mount.ops.release(info.fh)


def test_by_default_a_small_read_of_a_damaged_unverified_original_is_served_unflagged(
    shown: tuple[Path, bytes, int], tmp_path: Path
) -> None:
    """What --verify-first is for (kept as the default for its speed: the README says so)."""
    src, original, at = shown
    with fake_session():
        mount = InProcessMount(src, tmp_path, read_only=True)
        got = mount.run(_pread, mount, "bad.tif", at)
    start = at - at % 4096
    assert isinstance(got, bytes) and got != original[start : start + 4096]


def test_with_verify_first_a_damaged_original_fails_its_open_and_a_good_one_opens_verified(
    shown: tuple[Path, bytes, int], tmp_path: Path
) -> None:
    src, original, at = shown
    with fake_session():
        mount = InProcessMount(src, tmp_path, read_only=True)
        mount.config.verify_first = True

        async def scenario() -> tuple[bytes | int, bytes | int, str]:
            bad = await _pread(mount, "bad.tif", at)
            good = await _pread(mount, "good.tif", at)
            node = mount.ops.inodes.get(await mount.resolve("good.tif"))
            assert node is not None
            return bad, good, mount.ops.integrity.state(node)

        bad, good, state = mount.run(scenario)
    start = at - at % 4096
    assert bad == errno.EIO
    assert good == original[start : start + 4096]
    assert state == "yes"
