"""Red team, round 38e: pure cores (vfs.acl) and the `decant` command, without a mount."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.toolbox import ACL_ANY as ANY
from tests.toolbox import acl
from vfs.acl import ACCESS_XATTR, inherited_access, narrowed_mode


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


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a file as another user")
def test_restore_removes_no_temp_name_planted_in_a_shared_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`decant restore x.zarr.zip -o /tmp/scan.tif` run by root: another user had made
    `/tmp/.scan.tif.decant-restore-PID` first (its PID is easy to guess). The O_EXCL open
    refused it, rightly, but the clean-up then unlinked that user's file (root may, in a
    sticky folder): what the restore did not make is not its to remove."""
    import tifffile
    from numpy import arange

    from vfs.decant.packer import pack_file
    from vfs.decant.verify import restore_archive, restore_temp_name

    tif = tmp_path / "scan.tif"
    tifffile.imwrite(tif, arange(2 * 16 * 16, dtype="uint16").reshape(2, 16, 16))
    archive = tmp_path / "scan.tif.zarr.zip"
    pack_file(tif, archive)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr("vfs.decant.verify._token", lambda: "guessed")  # as if it were guessed
    planted = shared / restore_temp_name("scan.tif")
    planted.write_bytes(b"theirs\n")
    os.chown(planted, 65534, 65534)
    with pytest.raises(FileExistsError):
        restore_archive(archive, shared / "scan.tif", tmp_path)
    assert planted.read_bytes() == b"theirs\n"
    assert not (shared / "scan.tif").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="sets a system.posix_acl_access xattr")
@pytest.mark.parametrize("how", ["scan", "entries"])
def test_a_name_swapped_between_its_lstat_and_its_getxattr_is_not_shown_wider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A listing lstats a name (scandir), then reads its ACL by the name again. The owner of
    the folder swaps the name meanwhile: `secret` (0644, another user's, its ACL denying uid
    4242) out, a file with no ACL in, and back. The listing showed `secret` 0644 with the bits
    alone, and uid 4242 opened it through the mount (plain files are checked by the kernel
    against the bits shown). Swapped under the getxattr here, deterministically; `entries`
    (the watcher's few names) read it by path, the same way."""
    import vfs.acl
    from vfs.mount.tree import SourceTree

    secret = tmp_path / "secret"
    secret.write_bytes(b"secret\n")
    secret.chmod(0o644)
    try:
        os.setxattr(secret, ACCESS_XATTR,
                    acl((0x01, 6, ANY), (0x02, 0, 4242), (0x04, 4, ANY), (0x10, 4, ANY),
                        (0x20, 4, ANY)))  # fmt: skip
    except OSError:
        pytest.skip("no POSIX ACLs here")
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "secret").write_bytes(b"plain\n")
    real_getxattr = os.getxattr

    def swapped(path: str, *args: object, **kwargs: object) -> bytes:
        if not str(path).endswith("/secret"):
            return real_getxattr(path, *args, **kwargs)  # type: ignore[arg-type]
        os.rename(secret, tmp_path / ".away")
        os.rename(decoy / "secret", secret)
        try:
            return real_getxattr(path, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            os.rename(secret, decoy / "secret")
            os.rename(tmp_path / ".away", secret)

    monkeypatch.setattr(vfs.acl.os, "getxattr", swapped)
    tree = SourceTree(tmp_path, [])
    found = tree.scan(tmp_path) if how == "scan" else tree.entries(tmp_path, ["secret"])
    assert found is not None
    shown = found["secret"]
    assert shown is not None
    assert shown.mode == 0o400, oct(shown.mode)  # the owner's bits only (read-only mount)


def test_restore_temp_names_are_not_predictable() -> None:
    """With the PID alone anyone could plant the temp name in a shared folder first and fail a
    restore there with EEXIST whenever they liked."""
    from vfs.decant.verify import restore_temp_name

    names = {restore_temp_name("scan.tif") for _ in range(8)}
    assert len(names) == 8
    assert all(n.startswith(f".scan.tif.decant-restore-{os.getpid()}-") for n in names)


def test_an_acl_src_cannot_keep_leaves_the_narrowed_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spooled file with an ACL published into a SRC whose file system keeps none (ENOTSUP):
    the archive keeps the ACL-narrowed bits (no wider than the ACL granted) and is published,
    not failed for good."""
    from vfs.ingest import publish

    target = tmp_path / "a.tif.zarr.zip"
    target.write_bytes(b"x")
    st = os.stat(target)
    extra = {n: getattr(st, n) for n in ("st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
    narrowed = os.stat_result((0o100600, *list(st)[1:]), extra)

    def no_acls(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(publish.os, "setxattr", no_acls)
    fd = os.open(target, os.O_RDONLY)
    try:
        publish._set_metadata(fd, narrowed, acl((0x01, 6, ANY), (0x04, 4, ANY), (0x20, 4, ANY)))
    finally:
        os.close(fd)
    assert os.stat(target).st_mode == 0o100600
