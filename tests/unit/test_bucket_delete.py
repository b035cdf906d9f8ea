"""BucketWriteSide's rm with --allow-delete, in process (no store): a member of an archive
shown as a folder is never deleted, since deleting it would delete the whole archive object."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import obstore
import pytest

from vfs.backends.base import Entry
from vfs.errors import StoreError
from vfs.ingest.bucket import BucketWriteSide
from vfs.ingest.spool import Spool
from vfs.nodes import Node, archive_node
from vfs.stores.base import ObjectInfo, etag_number


class _Folder:
    """Just what BucketWriteSide's rm reaches: one object listed under `key`."""

    def __init__(self, key: str, etag: str) -> None:
        self.info = ObjectInfo(key=key, size=100, etag=etag, mtime=0.0)
        self.client = object()

    def stat(self, key: str) -> ObjectInfo | None:
        return self.info if key == self.info.key else None

    def full_key(self, key: str) -> str:
        return key

    def url_of(self, key: str) -> str:
        return f"s3://b/{key}"


class _Backend:
    name = "decant"


def test_rm_of_a_member_of_a_series_archive_does_not_delete_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, etag = "run.zarr.zip", '"abc"'
    folder = _Folder(key, etag)
    deleted: list[Any] = []
    monkeypatch.setattr(obstore, "delete", lambda client, k: deleted.append(k))
    root = Path("/bucket-root")
    spool = Spool(tmp_path / "src", tmp_path / "spool", tmp_path / "staging")
    side = BucketWriteSide(root, spool, folder, None, True)  # type: ignore[arg-type]
    st = os.stat_result((stat.S_IFREG | 0o644, etag_number(f"{key}\0{etag}"), 0, 1, 0, 0,
                         100, 0, 0, 0))  # fmt: skip
    series = archive_node(_Backend(), root / key, st, "", Entry(is_dir=True), key)  # type: ignore[arg-type]
    member = archive_node(_Backend(), root / key, st, "a.tif", Entry(size=10), key)  # type: ignore[arg-type]
    member.version = series.version  # members share their archive's identity (tree.py)
    with pytest.raises(OSError) as err:
        side.unlink(series, "a.tif", member)
    assert err.value.errno == errno.EPERM, err.value
    assert deleted == []
    # The archive itself, shown as one file (no member), is still deleted as before.
    whole = archive_node(_Backend(), root / key, st, "", Entry(size=10), key)  # type: ignore[arg-type]
    side.unlink(series, key, whole)
    assert deleted == [key]


def test_a_moved_object_is_noted_as_the_user_s_before_its_old_key_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 94 F6: `mv` of a published 0600 file whose old key's DELETE failed left the
    new key's note pending; a start found no token of this host's on the copy (a copy keeps
    none) and showed the file 0444 to every user. The new key is noted first."""
    key, etag = "a.txt", '"abc"'
    folder = _Folder(key, etag)
    copied = ObjectInfo(key="b.txt", size=100, etag='"abc"', mtime=5.0)
    noted: list[tuple[str, str, bool]] = []
    root = Path("/bucket-root")
    spool = Spool(tmp_path / "src", tmp_path / "spool", tmp_path / "staging")
    side = BucketWriteSide(root, spool, folder, None, True)  # type: ignore[arg-type]
    side._changed = lambda k, e, st: noted.append((k, e, st is not None))
    side._copy_checked = lambda old, new, node: copied  # type: ignore[method-assign]

    def refused(client: object, k: str) -> None:
        raise OSError(errno.EIO, "the store refused the DELETE")

    monkeypatch.setattr(obstore, "delete", refused)
    ns = {"st_atime_ns": 0, "st_mtime_ns": 0, "st_ctime_ns": 0}
    st = os.stat_result((stat.S_IFREG | 0o600, etag_number(f"{key}\0{etag}"), 0, 1, 1001, 1001,
                         100, 0, 0, 0), ns)  # fmt: skip

    class _Object:
        name = "object"

    node = archive_node(_Object(), root / key, st, "", Entry(size=100), key)  # type: ignore[arg-type]
    parent = Node(True, 0, 0, 0o755, 0, 0, root)
    with pytest.raises(StoreError) as err:
        side.rename(parent, key, node, parent, "b.txt")
    assert "refused the DELETE" in str(err.value), err.value
    assert noted == [("b.txt", "", True), ("b.txt", '"abc"', True)]


def _mv_side(tmp_path: Path, folder: _Folder) -> tuple[BucketWriteSide, Any, Any]:
    """A write side over `folder` (a.txt listed), its notes, and the node and parent of a.txt."""
    root = Path("/bucket-root")
    spool = Spool(tmp_path / "src", tmp_path / "spool", tmp_path / "staging")
    side = BucketWriteSide(root, spool, folder, None, True)  # type: ignore[arg-type]
    noted: list[tuple[str, str, bool]] = []
    side._changed = lambda k, e, st: noted.append((k, e, st is not None))
    ns = {"st_atime_ns": 0, "st_mtime_ns": 0, "st_ctime_ns": 0}
    info = folder.info
    st = os.stat_result((stat.S_IFREG | 0o600, etag_number(f"{info.key}\0{info.etag}"), 0, 1,
                         1001, 1001, 100, 0, 0, 0), ns)  # fmt: skip

    class _Object:
        name = "object"

    node = archive_node(_Object(), root / info.key, st, "", Entry(size=100), info.key)  # type: ignore[arg-type]
    return side, noted, (node, Node(True, 0, 0, 0o755, 0, 0, root))


def test_an_mv_whose_copy_is_left_keeps_its_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 96 N1: the HEAD after an `mv`'s copy failed; the note ended, the copy stayed
    in the bucket, and the user's 0600 file was shown 0444 to all. Now the note stays (what is
    at the key is shown root's and private: BucketTree); refused as taken (nothing copied), it
    ends."""
    folder = _Folder("a.txt", '"abc"')
    deleted: list[str] = []
    monkeypatch.setattr(obstore, "delete", lambda client, k: deleted.append(k))
    side, noted, (node, parent) = _mv_side(tmp_path, folder)

    def head_failed(old: str, new: str, node: object) -> ObjectInfo:
        raise StoreError("s3://b/b.txt: HEAD: object store failed after retries")

    side._copy_checked = head_failed  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        side.rename(parent, "a.txt", node, parent, "b.txt")
    assert noted == [("b.txt", "", True)] and deleted == []

    def taken(old: str, new: str, node: object) -> ObjectInfo:
        raise OSError(errno.EEXIST, "s3://b/c.txt: taken meanwhile; not replaced")

    side._copy_checked = taken  # type: ignore[method-assign]
    noted.clear()
    with pytest.raises(OSError):
        side.rename(parent, "a.txt", node, parent, "c.txt")
    assert noted == [("c.txt", "", True), ("c.txt", "", False)]


def test_an_mv_looks_at_the_old_key_again_before_deleting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 96 N6: the old key was deleted without another look, after the copy and its
    checks (~1 s for 300 MB): another host's object put there meanwhile was deleted."""
    folder = _Folder("a.txt", '"abc"')
    deleted: list[str] = []
    monkeypatch.setattr(obstore, "delete", lambda client, k: deleted.append(k))
    side, noted, (node, parent) = _mv_side(tmp_path, folder)

    def copied_then_replaced(old: str, new: str, node: object) -> ObjectInfo:
        folder.info = ObjectInfo(key="a.txt", size=100, etag='"theirs"', mtime=9.0)
        return ObjectInfo(key="b.txt", size=100, etag='"abc"', mtime=5.0)

    side._copy_checked = copied_then_replaced  # type: ignore[method-assign]
    with pytest.raises(OSError) as err:
        side.rename(parent, "a.txt", node, parent, "b.txt")
    assert err.value.errno == errno.ESTALE and deleted == []
    assert ("b.txt", '"abc"', True) in noted  # the copy is the user's file now


def test_an_mv_refused_by_its_copy_s_own_condition_keeps_its_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 98: the reply to the copy's last request was lost, its retry was refused by
    the copy the first attempt had made (If-None-Match), and the EEXIST ended the note: the
    user's 0600 copy was shown 0444 to all at once. A refusal by the store's condition no
    longer ends it (the copy may be there); only a clash whose copy was deleted does."""
    from obstore.exceptions import AlreadyExistsError

    folder = _Folder("a.txt", '"abc"')
    side, noted, (node, parent) = _mv_side(tmp_path, folder)

    def refused_on_retry(*args: object, **kwargs: object) -> None:
        raise AlreadyExistsError("412 Precondition Failed")

    monkeypatch.setattr(obstore, "copy", refused_on_retry)
    with pytest.raises(OSError) as err:
        side.rename(parent, "a.txt", node, parent, "b.txt")
    assert err.value.errno == errno.EEXIST
    assert noted == [("b.txt", "", True)]  # kept: shown root's and private until a start
