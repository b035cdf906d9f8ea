"""Red team, round 38e: what landed with ACL narrowing and folder archive versions, mounted
with `allow_other` and read by an unprivileged user.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mount.conftest import HAVE_FUSE, Mount, User, open_tmp
from tests.toolbox import ACL_ANY as ANY
from tests.toolbox import acl

pytestmark = pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")


@pytest.fixture(params=["watched", "unwatched"])
def plain_src(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, Mount]]:
    """Root's SRC with `private/secret.txt` (0755 / 0644), mounted read-only, watched or not
    (`--no-watch`)."""
    base = open_tmp(tmp_path_factory, "rt38e")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    folder = src / "private"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    (folder / "secret.txt").write_bytes(b"secret\n")
    (folder / "secret.txt").chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only",
                *(["--no-watch"] if request.param == "unwatched" else []))  # fmt: skip
        yield src, m
    finally:
        m.stop()


def _denied_within(u: User, path: Path, seconds: float) -> int:
    """The errno USER's read of `path` gets, once it fails or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        got = u.errno_of("read(p)", p=path)
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


@pytest.mark.parametrize("how", ["chmod", "acl"])
def test_a_folder_closed_after_listing_is_closed_through_the_mount(
    plain_src: tuple[Path, Mount], unprivileged: User, how: str
) -> None:
    """`chmod 700 private` (or an ACL entry denying USER) after the mount listed it: USER
    still read `private/secret.txt` through the mount (exit 0, for as long as SRC's folder
    kept its mtime), though SRC refuses USER the folder. A folder's attributes came from its
    parent's listing, which the watcher's IN_ATTRIB on the folder never updated (watched:
    fixed in 6e7561f); with `--no-watch`, nothing but a change of the parent did."""
    src, m = plain_src
    u = unprivileged
    shown = m.mnt / "private" / "secret.txt"
    assert u.errno_of("read(p)", p=shown) == 0  # listed, read: the kernel holds the folder
    folder = src / "private"
    if how == "chmod":
        folder.chmod(0o700)
    else:
        os.setxattr(folder, "system.posix_acl_access",
                    acl((0x01, 7, ANY), (0x02, 0, u.uid), (0x04, 5, ANY), (0x10, 5, ANY),
                        (0x20, 5, ANY)))  # fmt: skip
    assert u.errno_of("read(p)", p=folder / "secret.txt") == errno.EACCES
    assert _denied_within(u, shown, 5.0) == errno.EACCES


DEFAULT_XATTR = "system.posix_acl_default"


@pytest.fixture
def writable_src(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Mount]]:
    """Root's SRC with `private/` (0755), mounted writable, watched."""
    base = open_tmp(tmp_path_factory, "rt38e-w")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    (src / "private").mkdir(mode=0o755)
    (src / "private").chmod(0o755)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other")
        yield src, m
    finally:
        m.stop()


def _deny(uid: int) -> bytes:
    return acl((0x01, 7, ANY), (0x02, 0, uid), (0x04, 5, ANY), (0x10, 5, ANY), (0x20, 5, ANY))


def test_a_folder_made_through_the_mount_under_a_default_acl_is_shown_narrowed(
    writable_src: tuple[Path, Mount], unprivileged: User
) -> None:
    """`private/` carries a default ACL denying USER; root makes `private/new` through the
    mount, which the kernel gives an access ACL denying USER (SRC refuses USER the folder).
    The mount's mkdir reply showed it 0755 from the bits alone: USER listed it through the
    mount (exit 0) and read a 0644 file in it, as long as the kernel kept that reply."""
    src, m = writable_src
    u = unprivileged
    os.setxattr(src / "private", DEFAULT_XATTR, _deny(u.uid))
    os.mkdir(m.mnt / "private" / "new", 0o755)
    (src / "private" / "new" / "s.txt").write_bytes(b"secret\n")
    (src / "private" / "new" / "s.txt").chmod(0o644)
    os.removexattr(src / "private" / "new" / "s.txt", "system.posix_acl_access")
    assert u.errno_of("read(p)", p=src / "private" / "new" / "s.txt") == errno.EACCES
    assert u.errno_of("os.listdir(p)", p=m.mnt / "private" / "new") == errno.EACCES
    assert u.errno_of("read(p)", p=m.mnt / "private" / "new" / "s.txt") == errno.EACCES


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_chmod_through_the_mount_keeps_the_acl_narrowing(
    writable_src: tuple[Path, Mount], unprivileged: User, kind: str
) -> None:
    """A file whose ACL denies USER, chmod 644 by root through the mount (the ACL still denies
    USER in SRC): the setattr reply showed 0644 from the bits alone, and USER read the file
    through the mount (exit 0) until the kernel's attributes expired (2 s). A folder's, the
    same, and for good: on the code before round 38e USER read `sub/s.txt` (exit 0); the
    watcher's re-show of a folder whose bits changed (6e7561f) already closed that one."""
    src, m = writable_src
    u = unprivileged
    target = src / "private" / ("s.txt" if kind == "file" else "sub")
    if kind == "file":
        target.write_bytes(b"secret\n")
    else:
        target.mkdir()
        (target / "s.txt").write_bytes(b"secret\n")
        (target / "s.txt").chmod(0o644)
    target.chmod(0o600 if kind == "file" else 0o700)
    os.setxattr(target, "system.posix_acl_access", _deny(u.uid))
    shown = m.mnt / "private" / target.name
    os.chmod(shown, 0o644 if kind == "file" else 0o755)
    readable = shown if kind == "file" else shown / "s.txt"
    assert u.errno_of("read(p)", p=target if kind == "file" else target / "s.txt") == errno.EACCES
    assert u.errno_of("read(p)", p=readable) == errno.EACCES


def test_a_file_written_through_the_mount_under_a_default_acl_takes_its_acl(
    writable_src: tuple[Path, Mount], unprivileged: User
) -> None:
    """`private/` carries a default ACL denying USER (a file made in it directly gets an
    access ACL denying USER). A file root wrote through the mount was spooled with none and
    linked into SRC as it was: published 0644 with no ACL, USER read it in SRC and through
    the mount (exit 0, both)."""
    from tests.mount.helpers import settled, wait_for

    src, m = writable_src
    u = unprivileged
    os.setxattr(src / "private", DEFAULT_XATTR, _deny(u.uid))
    shown = m.mnt / "private" / "f.txt"
    fd = os.open(shown, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"secret\n")
        assert u.errno_of("read(p)", p=shown) == errno.EACCES  # still spooled
    finally:
        os.close(fd)
    wait_for("published", lambda: settled(m), 15)
    assert (src / "private" / "f.txt").read_bytes() == b"secret\n"
    assert u.errno_of("read(p)", p=src / "private" / "f.txt") == errno.EACCES
    assert u.errno_of("read(p)", p=shown) == errno.EACCES
    assert shown.read_bytes() == b"secret\n"  # root's


def test_a_file_opened_for_writing_keeps_its_acl_narrowing_while_spooled(
    writable_src: tuple[Path, Mount], unprivileged: User
) -> None:
    """`private/f.txt` (0644, its ACL denying USER), opened for writing through the mount by
    root: the file moves into the spool while written, and the spooled node showed 0644 from
    the bits alone; USER read it through the mount meanwhile (exit 0). Fixed with the
    setattr reply (413cf82): a spooled file's getattr goes through the same refresh."""
    src, m = writable_src
    u = unprivileged
    real = src / "private" / "f.txt"
    real.write_bytes(b"secret\n")
    real.chmod(0o644)
    os.setxattr(real, "system.posix_acl_access", _deny(u.uid))
    shown = m.mnt / "private" / "f.txt"
    assert u.errno_of("read(p)", p=shown) == errno.EACCES
    fd = os.open(shown, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"more\n")
        assert u.errno_of("read(p)", p=shown) == errno.EACCES
        assert u.errno_of("os.listdir(p)", p=m.mnt / "private") == 0  # positive control
    finally:
        os.close(fd)


def test_a_tiff_rewritten_through_the_mount_keeps_its_acl_in_its_archive(
    writable_src: tuple[Path, Mount], unprivileged: User
) -> None:
    """`private/r.tif` (0644, its ACL denying USER; everyone else reads it), rewritten by root
    through the mount: packed from the spooled file, whose stat the publish took ACL-narrowed
    (0600) for the archive's mode, with no ACL. `r.tif.zarr.zip` came out 0600: every other
    user lost the read the ACL had left them. The archive now takes the file's ACL and bits."""
    from tests.mount.helpers import settled, tiff, wait_for

    src, m = writable_src
    u, other = unprivileged, User("nobody", 65534, 65534)
    real = src / "private" / "r.tif"
    real.write_bytes(tiff(1))
    real.chmod(0o644)
    os.setxattr(real, "system.posix_acl_access", _deny(u.uid))
    assert other.errno_of("read(p)", p=real) == 0
    data = tiff(2)
    (m.mnt / "private" / "r.tif").write_bytes(data)
    wait_for("published", lambda: settled(m), 20)
    archive = src / "private" / "r.tif.zarr.zip"
    assert archive.exists(), sorted(p.name for p in archive.parent.iterdir())
    assert u.errno_of("read(p)", p=archive) == errno.EACCES
    assert other.errno_of("read(p)", p=archive) == 0, oct(archive.stat().st_mode)
    assert u.errno_of("read(p)", p=m.mnt / "private" / "r.tif") == errno.EACCES
    assert (m.mnt / "private" / "r.tif").read_bytes() == data


def test_a_tiff_written_through_the_mount_under_a_default_acl_is_archived_with_it(
    writable_src: tuple[Path, Mount], unprivileged: User
) -> None:
    """As for a plain file, a TIFF: its archive `a.tif.zarr.zip` came out 0644 with no ACL
    under a default ACL denying USER, and USER read it in SRC and through the mount. Now
    the archive takes the spooled file's ACL: USER is refused, another user is not."""
    from tests.mount.helpers import settled, tiff, wait_for

    src, m = writable_src
    u, other = unprivileged, User("nobody", 65534, 65534)
    os.setxattr(src / "private", DEFAULT_XATTR, _deny(u.uid))
    data = tiff(3)
    fd = os.open(m.mnt / "private" / "a.tif", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    wait_for("published", lambda: settled(m), 20)
    archive = src / "private" / "a.tif.zarr.zip"
    assert archive.exists(), sorted(p.name for p in archive.parent.iterdir())
    assert u.errno_of("read(p)", p=archive) == errno.EACCES
    assert other.errno_of("read(p)", p=archive) == 0, oct(archive.stat().st_mode)
    assert u.errno_of("read(p)", p=m.mnt / "private" / "a.tif") == errno.EACCES
    assert (m.mnt / "private" / "a.tif").read_bytes() == data
