"""An ordinary ACL-using site through a real mount (`allow_other`): what SRC grants a user by
its ACL or bits, the mount grants no more.

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
def lab_src(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, Mount]]:
    """Root's SRC with `lab/notes.txt` (0755 / 0644), mounted read-only, watched or not."""
    base = open_tmp(tmp_path_factory, "aclsite")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    (src / "lab").mkdir(mode=0o755)
    (src / "lab").chmod(0o755)
    (src / "lab" / "notes.txt").write_bytes(b"notes\n")
    (src / "lab" / "notes.txt").chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other",
                *(["--no-watch"] if request.param == "unwatched" else []))  # fmt: skip
        yield src, m
    finally:
        m.stop()


@pytest.mark.parametrize("how", ["chmod", "acl"])
def test_a_file_closed_in_src_after_listing_is_closed_through_the_mount(
    lab_src: tuple[Path, Mount], unprivileged: User, how: str
) -> None:
    """`setfacl -m u:USER:- lab/notes.txt` (or `chmod 600`) in SRC after the mount listed it:
    SRC refuses USER, and USER still read it through the mount (exit 0, for as long as the
    folder kept its mtime) once the kernel's entry expired: a lookup was answered from the
    folder's listing, which nothing updated for a plain file whose bits or ACL changed (a
    folder's were, fe23da6), so it gave the kernel the listed 0644 afresh. Within the
    entry's 2 s a getattr (the watcher drops the kernel's attributes) showed 0600. Now the
    watcher's name takes the file's bits anew into the listing (lookups, `ls -l`); unwatched,
    lookup and readdir restat the file as getattr does (`ls -l` gave the listed 0644 again)."""
    src, m = lab_src
    u = unprivileged
    real, shown = src / "lab" / "notes.txt", m.mnt / "lab" / "notes.txt"
    assert u.errno_of("read(p)", p=shown) == 0
    assert u.run("ls", "-l", str(shown.parent)).returncode == 0  # listed with attributes
    if how == "chmod":
        real.chmod(0o600)
    else:
        os.setxattr(real, "system.posix_acl_access",
                    acl((0x01, 6, ANY), (0x02, 0, u.uid), (0x04, 4, ANY), (0x10, 4, ANY),
                        (0x20, 4, ANY)))  # fmt: skip
    assert u.errno_of("read(p)", p=real) == errno.EACCES
    time.sleep(2.5)  # past the kernel's entry timeout: the next open looks the name up
    assert u.errno_of("read(p)", p=shown) == errno.EACCES
    assert u.run("ls", "-l", str(shown.parent)).returncode == 0  # its attributes again
    assert u.errno_of("read(p)", p=shown) == errno.EACCES
    assert shown.read_bytes() == b"notes\n"  # root's


def test_a_named_group_entry_takes_no_write_from_the_owning_group(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A project folder (0775, its group USER's) that another group may read and search
    (`setfacl -m g:nogroup:rX`): USER, in the owning group, makes files there in SRC (the
    owning group's entry grants rwx, whatever a named group's does), but through a writable
    mount the folder was shown 0755 (group bits cut to the named group's r-x) and USER's
    create failed with EACCES. A named group never narrows what the owning group's members
    get (the kernel grants what any of a user's matching group entries grants); a named user
    still does (one may be in the owning group)."""
    u, outsider = unprivileged, User("nobody", 65534, 65534)
    base = open_tmp(tmp_path_factory, "aclsite-w")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    proj = src / "proj"
    proj.mkdir()
    os.chown(proj, 0, u.gid)
    proj.chmod(0o775)
    os.setxattr(proj, "system.posix_acl_access",
                acl((0x01, 7, ANY), (0x04, 7, ANY), (0x08, 5, 65534), (0x10, 7, ANY),
                    (0x20, 5, ANY)))  # fmt: skip
    assert u.errno_of("write(p)", p=proj / "direct.txt") == 0  # SRC lets USER in
    assert outsider.errno_of("write(p)", p=proj / "other.txt") == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other")
        assert u.errno_of("write(p)", p=m.mnt / "proj" / "through.txt") == 0
        assert outsider.errno_of("write(p)", p=m.mnt / "proj" / "other.txt") == errno.EACCES
        assert outsider.errno_of("os.listdir(p)", p=m.mnt / "proj") == 0
    finally:
        m.stop()
