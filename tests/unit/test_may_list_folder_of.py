"""vfs/mount/access.may_list_folder_of: whether `.decant-status` may name a file to a user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vfs.mount.access import may_list_folder_of

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: folders of other modes for a uid")
def test_a_folder_the_user_may_not_enter_or_list_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "open" / "inner").mkdir(parents=True)
    (root / "private" / "renamed").mkdir(parents=True)
    (root / "nolist").mkdir()
    root.chmod(0o755)
    (root / "open").chmod(0o755)
    (root / "open" / "inner").chmod(0o755)
    (root / "private").chmod(0o700)
    (root / "private" / "renamed").chmod(0o777)
    (root / "nolist").chmod(0o711)
    assert may_list_folder_of(root, root / "open" / "inner" / "f", NOBODY)
    assert not may_list_folder_of(root, root / "private" / "renamed" / "f", NOBODY)
    assert not may_list_folder_of(root, root / "nolist" / "f", NOBODY)
    assert not may_list_folder_of(root, root / "missing" / "f", NOBODY)
    assert may_list_folder_of(root, root / "private" / "renamed" / "f", 0)
