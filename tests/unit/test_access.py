"""The mount's own permission checks (vfs.mount.access), against what the kernel says: each case
is asked of `os.access` too, as a real unprivileged process (a child with its uid and groups)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vfs.mount.access import MAX_TREE_DEPTH, may_change_entries, readable_beneath

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners and uids are changed as root")

UID, GID = 4242, 4243  # the caller: no account needed
OTHER = 4244


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder every user may reach (pytest's own is root's 0700): the kernel's answers then
    depend only on the folders each test makes."""
    base = Path(tempfile.mkdtemp(prefix="decant-access-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def kernel_says(uid: int, gid: int, check: str, path: Path) -> bool:
    """What the kernel answers a process of `uid`/`gid` (no supplementary groups)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            if check == "read":
                ok = os.access(path, os.R_OK, follow_symlinks=False)
                if ok and path.is_dir():
                    ok = os.access(path, os.X_OK)
                os._exit(0 if ok else 1)
            os._exit(0 if os.access(path, os.W_OK | os.X_OK) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) in (0, 1)
    return os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("folder_mode", [0o700, 0o750, 0o711, 0o705, 0o1777])
@pytest.mark.parametrize("owner", [UID, OTHER])
@pytest.mark.parametrize("group", [GID, OTHER])
@pytest.mark.parametrize("file_mode", [0o600, 0o640, 0o604])
def test_read_beneath_agrees_with_the_kernel(
    tmp_path: Path, folder_mode: int, owner: int, group: int, file_mode: int
) -> None:
    root = tmp_path / "coll"
    inner = root / "inner"
    inner.mkdir(parents=True)
    target = inner / "table.csv"
    target.write_text("x\n")
    tmp_path.chmod(0o755)
    root.chmod(0o755)
    for path, mode in ((inner, folder_mode), (target, file_mode)):
        os.chown(path, owner, group)
        path.chmod(mode)
    expected = kernel_says(UID, GID, "read", target)
    found = readable_beneath(root, target, UID, GID, 0)
    assert (found is not None) == expected
    if found is not None:
        assert found == (target.stat().st_dev, target.stat().st_ino)
    expected = kernel_says(UID, GID, "change", inner)
    assert may_change_entries(inner, UID, GID, 0) == expected


def test_read_beneath_refuses_links_and_paths_outside(tmp_path: Path) -> None:
    root = tmp_path / "coll"
    root.mkdir()
    (tmp_path / "elsewhere.csv").write_text("x\n")
    (tmp_path / "elsewhere.csv").chmod(0o644)
    (root / "link.csv").symlink_to(tmp_path / "elsewhere.csv")
    assert readable_beneath(root, root / "link.csv", UID, GID, 0) is None
    assert readable_beneath(root, root / "link.csv", 0, 0, 0) is None  # not even for root
    assert readable_beneath(root, tmp_path / "elsewhere.csv", UID, GID, 0) is None
    assert readable_beneath(root, root / "missing.csv", UID, GID, 0) is None
    assert stat.S_ISLNK((root / "link.csv").lstat().st_mode)
    (root / "sub").mkdir()
    (root / "sub" / "t.csv").write_text("x\n")
    (root / "sub" / "t.csv").chmod(0o644)
    assert readable_beneath(root, root / "sub" / "t.csv", UID, GID, 0) is not None
    (root / "sub").rename(root / "real")
    (root / "sub").symlink_to(root / "real")  # a folder on the way swapped for a link
    assert readable_beneath(root, root / "sub" / "t.csv", UID, GID, 0) is None


def test_a_folder_nested_past_the_walks_depth_bound_is_refused_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The access walk of a folder read whole stops at MAX_TREE_DEPTH levels and refuses the
    read; the refusal was silent (a debug line at most), so the archive's own readers got
    EACCES with nothing in the log to say why."""

    def nest(top: Path, levels: int) -> None:
        deep = top.joinpath(*["d"] * levels)
        deep.mkdir(parents=True)
        (deep / "f").write_bytes(b"x")
        for dirpath, _dirs, files in os.walk(top):
            os.chmod(dirpath, 0o755)
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o644)

    nest(tmp_path / "shallow.zarr", MAX_TREE_DEPTH)
    nest(tmp_path / "deep.zarr", MAX_TREE_DEPTH + 2)
    with caplog.at_level(logging.WARNING, logger="vfs.mount.access"):
        shallow = readable_beneath(tmp_path, tmp_path / "shallow.zarr", 54321, 54321, os.getpid())
        deep = readable_beneath(tmp_path, tmp_path / "deep.zarr", 54321, 54321, os.getpid())
    st = (tmp_path / "shallow.zarr").stat()
    assert shallow == (st.st_dev, st.st_ino)
    assert deep is None
    assert f"deep.zarr: nested more than {MAX_TREE_DEPTH} folders deep" in caplog.text
    assert "shallow.zarr" not in caplog.text
