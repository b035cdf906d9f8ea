"""Two hosts publishing clashing names into one bucket at once (red team 70, F1 and F2): a TIFF
on one host and a plain file of its name on another, or a file and a folder of one name. Each
host checked before its upload, packing took seconds, and the other's object came in between:
both reported success, and every host served only one of them. Now the upload is checked again
once it is in, and gives way (deleted, the file stays spooled, failed) if it clashes."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store

from tests.s3.conftest import S3Bucket
from vfs.stores.s3uploads import UPLOAD_TOKEN, UploadTokens

CASES = {
    # name: (spooled file, the other host's key that lands during the upload, the reason)
    "archive vs plain": ("d/x.tif", "d/x.tif", "one would hide the other"),
    "plain vs archive": ("d/n.txt", "d/n.txt.zarr.zip", "one would hide the other"),
    # SeaweedFS refuses a PUT of an object named like a folder it holds (412), not the
    # reverse: the other host's key lands after this one's PUT, before its check.
    "file vs folder": ("d/n.txt", "d/n.txt/f", "a folder of that name"),
    "folder vs file": ("d/e/n.txt", "d/e", "d/e is a file in the bucket"),
    "folder vs file above": ("d/e/g/n.txt", "d", "d is a file in the bucket"),
    # An archive presents its original's name: a folder of that name hides it, or is hidden.
    "archive vs folder": ("d/x.tif", "d/x.tif/f", "a folder of that name"),
    "folder vs archive above": ("d/e/n.txt", "d/e.zarr.zip", "d/e is a file in the bucket"),
}


def _keys(store: S3Store, bucket: S3Bucket) -> list[str]:
    prefix = bucket.key() + "/"
    return sorted(m["path"][len(prefix) :] for b in obstore.list(store, prefix=prefix) for m in b)


TOKENS = UploadTokens(b"this host's secret".ljust(32))


def _placer_spool(bucket: S3Bucket, tmp_path: Path) -> Any:
    """A spool publishing into the bucket, its uploads signed with TOKENS."""
    from vfs.ingest.bucket import BucketPlacer
    from vfs.ingest.spool import Spool
    from vfs.stores.base import ObjectPath
    from vfs.stores.s3 import S3Folder

    spool = Spool(ObjectPath.of_url(bucket.url()), tmp_path / "files", tmp_path / "staging")
    spool.placer = BucketPlacer(S3Folder(bucket.url()), tokens=TOKENS)
    return spool


def _put_as_this_host(store: S3Store, bucket: S3Bucket, key: str, data: bytes) -> None:
    """An upload of this host that a kill cut off before its check: it carries a token
    this host signed for its key."""
    obstore.put(store, bucket.key(key), data, attributes={UPLOAD_TOKEN: TOKENS.new(key)})


def _spool_file(tmp_path: Path, relpath: str, corpus: dict[str, Path]) -> bytes:
    path = tmp_path / "files" / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if relpath.endswith(".tif"):
        shutil.copyfile(corpus["lzw_u8.tif"], path)
    else:
        path.write_bytes(b"this host's notes\n")
    return path.read_bytes()


@pytest.mark.parametrize("case", list(CASES))
def test_an_upload_gives_way_to_a_clashing_entry_put_meanwhile(
    case: str,
    s3_bucket: S3Bucket,
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vfs.stores.upload as upload
    from vfs.ingest.bucket import KeyTakenError

    relpath, theirs, reason = CASES[case]
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    spool = _placer_spool(s3_bucket, tmp_path)
    data = _spool_file(tmp_path, relpath, corpus)
    real = upload.put_verified

    def racing(*args: Any, **kwargs: Any) -> Any:
        # The other host's PUT lands after this host's checks, before its own upload ends.
        if case != "file vs folder":
            obstore.put(store, s3_bucket.key(theirs), b"another host's file\n")
            return real(*args, **kwargs)
        done = real(*args, **kwargs)
        obstore.put(store, s3_bucket.key(theirs), b"another host's file\n")
        return done

    monkeypatch.setattr(upload, "put_verified", racing)
    with pytest.raises(KeyTakenError, match=reason):
        spool.publish(relpath, False, None)
    assert _keys(store, s3_bucket) == [theirs]  # its upload deleted, theirs kept
    assert (tmp_path / "files" / relpath).read_bytes() == data  # still spooled


def test_a_folder_others_objects_already_make_is_published_into(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object named like the folder, already hidden by another object in that folder put
    before this upload's race window (every host shows the folder): a file published into it
    hides nothing more."""
    from vfs.ingest import bucket

    monkeypatch.setattr(bucket, "RACE_WINDOW", 0.0)  # `other.txt` is older than the window
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key("d/e"), b"an object named like the folder\n")
    obstore.put(store, s3_bucket.key("d/e/other.txt"), b"another host's file\n")
    time.sleep(1.1)  # Last-Modified is in whole seconds: this upload comes after it
    spool = _placer_spool(s3_bucket, tmp_path)
    _spool_file(tmp_path, "d/e/n.txt", corpus)
    spool.publish("d/e/n.txt", False, None)
    assert _keys(store, s3_bucket) == ["d/e", "d/e/n.txt", "d/e/other.txt"]


def test_a_folder_made_from_a_stale_listing_does_not_hide_another_host_s_file(
    s3_bucket: S3Bucket, bucket_mount: Any, tmp_path: Path
) -> None:
    """Red team 70 F2 through real mounts: host B publishes a file `d`; host A, which listed
    the folder before (its listing is kept --relist long), makes a folder `d` and a file in
    it. A's upload used to succeed, and every host then showed the folder and hid B's file.
    Now A's file stays spooled, failed, and B's `d` is served by a fresh host."""
    from tests.s3.test_mount_bucket_write import spooled, status, wait_for

    url = s3_bucket.url()
    a = bucket_mount(url, "--spool", str(tmp_path / "spool-a"), "--relist", "600",
                     "--settle", "0.2", name="a")  # fmt: skip
    b = bucket_mount(url, "--spool", str(tmp_path / "spool-b"), "--settle", "0.2", name="b")
    assert os.listdir(a.mnt) == []  # A's listing, kept
    (b.mnt / "d").write_bytes(b"host B's file\n")
    wait_for(lambda: not spooled(tmp_path / "spool-b"), 60, "B's file published")
    (a.mnt / "d").mkdir()
    (a.mnt / "d" / "f").write_bytes(b"host A's file\n")

    def failed() -> dict[str, str]:
        return {f["path"]: f["reason"] for f in status(a.mnt)["failed"]}

    wait_for(lambda: "d/f" in failed(), 60, "A's file refused")
    assert "d is a file in the bucket" in failed()["d/f"], failed()
    assert spooled(tmp_path / "spool-a") == ["d/f"]
    assert (a.mnt / "d" / "f").read_bytes() == b"host A's file\n"  # still A's, on A
    c = bucket_mount(url, name="c")
    assert (c.mnt / "d").read_bytes() == b"host B's file\n"
    assert status(b.mnt)["failed"] == []


def test_a_move_through_the_mount_gives_way_as_an_upload_does(
    s3_bucket: S3Bucket, bucket_mount: Any, tmp_path: Path
) -> None:
    """Red team 72 F2: `mv` of an object (--allow-delete) into a folder made from a stale
    listing, where another host has a file of that folder's name, or onto the name of an
    archive another host put: both returned 0 and the other host's file was hidden on every
    host. Now the copy gives way (EEXIST) and the object stays where it was."""
    import errno

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    for name in ("a", "b"):
        obstore.put(store, s3_bucket.key(name), f"object {name}\n".encode())
    m = bucket_mount(s3_bucket.url(), "--spool", str(tmp_path / "spool"), "--allow-delete",
                     "--relist", "600", "--settle", "0.2")  # fmt: skip
    assert sorted(os.listdir(m.mnt)) == ["a", "b"]  # listed before the other host writes
    obstore.put(store, s3_bucket.key("q"), b"another host's file q\n")
    obstore.put(store, s3_bucket.key("x.zarr.zip"), b"another host's archive x\n")
    (m.mnt / "q").mkdir()
    with pytest.raises(OSError) as into_folder:
        os.rename(m.mnt / "a", m.mnt / "q" / "a")
    with pytest.raises(OSError) as onto_archive:
        os.rename(m.mnt / "b", m.mnt / "x")
    assert into_folder.value.errno == onto_archive.value.errno == errno.EEXIST
    assert _keys(store, s3_bucket) == ["a", "b", "q", "x.zarr.zip"]


@pytest.mark.parametrize(
    ("theirs", "reason"),
    [("d/n.txt.zarr.zip", "one would hide the other"), ("d/n.txt/f", "a folder of that name")],
)
def test_an_upload_found_in_place_is_checked_before_it_counts_as_published(
    theirs: str, reason: str, s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """This host's upload went in, and the daemon was killed before its check: at the next
    start the spooled file's bytes are found at its key ("already"). Taken as published, the
    other host's clashing object stayed hidden on every host and both users were told done."""
    from vfs.ingest.bucket import KeyTakenError

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    spool = _placer_spool(s3_bucket, tmp_path)
    data = _spool_file(tmp_path, "d/n.txt", corpus)
    _put_as_this_host(store, s3_bucket, "d/n.txt", data)  # before the kill
    obstore.put(store, s3_bucket.key(theirs), b"another host's file\n")
    with pytest.raises(KeyTakenError, match=reason):
        spool.publish("d/n.txt", False, None)
    assert _keys(store, s3_bucket) == sorted(["d/n.txt", theirs])  # nothing deleted
    assert (tmp_path / "files" / "d/n.txt").read_bytes() == data  # still spooled


@pytest.mark.parametrize(
    ("theirs", "relpath", "reason"),
    [
        ("d/notes", "d/notes.zarr/f.txt", "d/notes is a file in the bucket"),
        ("d/notes.zarr/f", "d/notes", r"notes\.zarr \(a folder archive presenting notes\)"),
    ],
)
def test_a_folder_archive_and_a_file_of_the_name_it_presents_clash(
    theirs: str,
    relpath: str,
    reason: str,
    s3_bucket: S3Bucket,
    corpus: dict[str, Path],
    tmp_path: Path,
) -> None:
    """Red team 73, F1: a folder archive `notes.zarr/` (its files put one by one) presents
    `notes`: copied in beside a published file `notes`, or a file `notes` beside it, each
    upload passed, and hosts started before served the archive's TIFF under the file's name."""
    from vfs.ingest.bucket import KeyTakenError

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key(theirs), b"another host's file\n")
    spool = _placer_spool(s3_bucket, tmp_path)
    data = _spool_file(tmp_path, relpath, corpus)
    with pytest.raises(KeyTakenError, match=reason):
        spool.publish(relpath, False, None)
    assert _keys(store, s3_bucket) == [theirs]
    assert (tmp_path / "files" / relpath).read_bytes() == data


def test_two_uploads_under_a_published_file_at_once_both_give_way(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 73, F4: a file `d` published; two hosts, listing from before it, each put a
    file under `d/` at once: each found the other's object there, took the folder for one
    that hid `d` already, and both published: `d` vanished from every host."""
    import vfs.stores.upload as upload
    from vfs.ingest.bucket import KeyTakenError

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key("d"), b"the published file d\n")
    spool = _placer_spool(s3_bucket, tmp_path)
    _spool_file(tmp_path, "d/n.txt", corpus)
    real = upload.put_verified

    def racing(*args: Any, **kwargs: Any) -> Any:
        obstore.put(store, s3_bucket.key("d/other.txt"), b"the other host's upload\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(upload, "put_verified", racing)
    with pytest.raises(KeyTakenError, match="d is a file in the bucket"):
        spool.publish("d/n.txt", False, None)
    assert _keys(store, s3_bucket) == ["d", "d/other.txt"]


def test_a_failed_upload_ends_its_note(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 73, F3: an upload stopped by an `rm` of its file (or by a store error) left
    its note, and the host showed the next object another host put at the key as the `rm`-er's
    own (their owner and mode), which they could then delete."""
    import vfs.stores.upload as upload
    from vfs.errors import StoreError

    notes: list[tuple[str, str, bool]] = []
    spool = _placer_spool(s3_bucket, tmp_path)
    spool.placer.on_placed = lambda key, etag, st: notes.append((key, etag, st is not None))
    _spool_file(tmp_path, "d/n.txt", corpus)

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("the store went away")

    monkeypatch.setattr(upload, "put_verified", failing)
    with pytest.raises(StoreError):
        spool.publish("d/n.txt", False, None)
    assert notes == [("d/n.txt", "", True), ("d/n.txt", "", False)]


def test_a_copy_onto_a_taken_key_is_refused_by_the_store(s3_bucket: S3Bucket) -> None:
    """Red team 73, F2: `mv` (--allow-delete) checked the new key, then copied onto it with no
    condition: an object another host published there in between was overwritten, its bytes
    lost. The mount's client completes a copy only where the key is free."""
    from obstore.exceptions import AlreadyExistsError

    from vfs.stores.s3 import S3Folder

    folder = S3Folder(s3_bucket.url())
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key("src"), b"the moved object\n")
    obstore.put(store, s3_bucket.key("dst"), b"another host's object\n")
    with pytest.raises(AlreadyExistsError):
        obstore.copy(folder.client, folder.full_key("src"), folder.full_key("dst"), overwrite=False)
    assert bytes(obstore.get(store, s3_bucket.key("dst")).bytes()) == b"another host's object\n"
    obstore.copy(folder.client, folder.full_key("src"), folder.full_key("free"), overwrite=False)
    assert bytes(obstore.get(store, s3_bucket.key("free")).bytes()) == b"the moved object\n"


@pytest.mark.parametrize("whose", ["this host", "another host", "no host", "signed elsewhere"])
def test_another_host_s_object_of_the_same_bytes_is_not_taken_for_this_upload(
    whose: str, s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Red team 83, F1: a victim's file spooled on host B; a user of host A, who could read
    the spooled bytes through B's mount, put them at the key through A. B's next try found its
    bytes there, counted it published ("already") and deleted its spooled copy; the user then
    deleted the object on A, as theirs there, and the only copy was gone. Red team 86, F1: so
    too when B's journal said it had begun an upload there (killed), or had uploaded those
    bytes there before. Only an object carrying a token this host signed for the key counts
    now; another's is left, the file stays spooled."""
    from vfs.ingest.bucket import KeyTakenError

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    spool = _placer_spool(s3_bucket, tmp_path)
    data = _spool_file(tmp_path, "d/d2.bin", corpus)
    if whose == "this host":  # its own upload, its check cut off by a kill: published
        _put_as_this_host(store, s3_bucket, "d/d2.bin", data)
        assert spool.publish("d/d2.bin", False, None).mode == "already"
        return
    other = UploadTokens(b"another host's secret".ljust(32))
    token = {
        "another host": {UPLOAD_TOKEN: other.new("d/d2.bin")},
        "no host": {},
        "signed elsewhere": {UPLOAD_TOKEN: TOKENS.new("d/other.bin")},  # this host's, not here
    }[whose]
    obstore.put(store, s3_bucket.key("d/d2.bin"), data, attributes=token)
    with pytest.raises(KeyTakenError, match="not from an upload of this host"):
        spool.publish("d/d2.bin", False, None)
    assert (tmp_path / "files" / "d/d2.bin").read_bytes() == data  # still spooled
    assert _keys(store, s3_bucket) == ["d/d2.bin"]  # and the object left as it is


def test_a_name_the_store_refuses_with_no_object_there_says_so(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Red team 83, F3: SeaweedFS keeps the entry of a folder emptied (its last object
    deleted), and refuses a conditional PUT of a file of that name; the file stayed spooled
    with "already exists (written by another host?)", though no host wrote anything there."""
    from vfs.ingest.bucket import KeyTakenError

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key("d/gone/f"), b"x")
    obstore.delete(store, s3_bucket.key("d/gone/f"))
    spool = _placer_spool(s3_bucket, tmp_path)
    _spool_file(tmp_path, "d/gone", corpus)
    try:
        spool.publish("d/gone", False, None)
    except KeyTakenError as exc:  # SeaweedFS: refused, and said why
        assert "no object is there" in str(exc)
    else:  # a store that forgets emptied folders: published
        assert _keys(store, s3_bucket) == ["d/gone"]


def test_a_key_holding_other_bytes_ends_this_host_s_pending_note(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Red team 90, F2: a kill left the journal's note that an upload began at the key; another
    host published other bytes there; the retry found them and failed, but the note stayed,
    and this host showed the other user's object as its own user's file, who could `rm` it."""
    from vfs.ingest.bucket import KeyTakenError

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    spool = _placer_spool(s3_bucket, tmp_path)
    placed: list[tuple[str, str, object]] = []
    spool.placer.on_placed = lambda key, etag, st: placed.append((key, etag, st))
    _spool_file(tmp_path, "d/f.bin", corpus)
    obstore.put(store, s3_bucket.key("d/f.bin"), b"another host's file\n")
    with pytest.raises(KeyTakenError, match="holds other bytes"):
        spool.publish("d/f.bin", False, None)
    assert ("d/f.bin", "", None) in placed  # the note ended (BucketTree.note_published)


def test_rm_of_a_spooled_file_deletes_the_object_it_hides_only_if_the_same_owner_s() -> None:
    """Red team 90, F1: a file spooled on host A (held open), another host's user published
    the name meanwhile; `rm` of the spooled file through A deleted that object too ("the
    version it hid"), past the sticky bit. Only an object shown as the same owner's goes."""
    from vfs.ingest.bucket import BucketWriteSide
    from vfs.nodes import Node

    removed: list[str] = []
    side = BucketWriteSide.__new__(BucketWriteSide)
    side.allow_delete = True
    side._remove_object = lambda node: removed.append(node.real.name)  # type: ignore[method-assign]
    side._withdrawing = lambda rel: None  # type: ignore[method-assign]
    side.spool = type("S", (), {"remove": staticmethod(lambda rel: None)})()  # type: ignore[assignment]

    def node(name: str, uid: int, spooled: str = "") -> Node:
        mode = 0o644 if uid else 0o444  # another host's object: shown 0444, the daemon's
        return Node(False, 1, 0, mode, uid, uid, Path("/b/d") / name, spooled=spooled)

    side.unlink(node("d", 0), "f", node("f", 1001, "d/f"), node("theirs", 0))
    side.unlink(node("d", 0), "g", node("g", 1001, "d/g"), node("mine", 1001))
    assert removed == ["mine"]
