"""Red team, round 38e: pure cores (vfs.acl) and the `decant` command, without a mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vfs.acl import ACCESS_XATTR, inherited_access, narrowed_mode

ANY = 0xFFFFFFFF


def acl(*entries: tuple[int, int, int]) -> bytes:
    out = (2).to_bytes(4, "little")
    for tag, perm, ident in sorted(entries):
        out += tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + ident.to_bytes(4, "little")
    return out


def test_a_default_acl_is_inherited_cut_to_the_mode_as_the_kernel_cuts_it() -> None:
    """acl(5): the owner, the group class (the mask, else the owning group) and other take
    the new file's mode bits; named entries stay as they are."""
    with_mask = acl((0x01, 7, ANY), (0x02, 0, 1000), (0x04, 7, ANY), (0x10, 7, ANY), (0x20, 7, ANY))
    got = inherited_access(with_mask, 0o640)
    assert got == acl((0x01, 6, ANY), (0x02, 0, 1000), (0x04, 7, ANY), (0x10, 4, ANY),
                      (0x20, 0, ANY))  # fmt: skip
    assert narrowed_mode(0o100640, got or b"") == 0o100600  # the named entry denies
    minimal = acl((0x01, 7, ANY), (0x04, 5, ANY), (0x20, 5, ANY))
    assert inherited_access(minimal, 0o644) == acl((0x01, 6, ANY), (0x04, 4, ANY), (0x20, 4, ANY))
    assert inherited_access(b"\x02\x00\x00\x00\x01", 0o644) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="sets a system.posix_acl_* xattr")
def test_the_kernel_takes_the_inherited_value(tmp_path: Path) -> None:
    """What inherited_access gives is what the kernel itself gives a file made there."""
    folder = tmp_path / "f"
    folder.mkdir()
    default = acl((0x01, 7, ANY), (0x02, 0, 1000), (0x04, 5, ANY), (0x10, 7, ANY), (0x20, 5, ANY))
    try:
        os.setxattr(folder, "system.posix_acl_default", default)
    except OSError:
        pytest.skip("no POSIX ACLs here")
    fd = os.open(folder / "made", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    os.close(fd)
    assert os.getxattr(folder / "made", ACCESS_XATTR) == inherited_access(default, 0o640)
