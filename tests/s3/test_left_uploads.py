"""Multipart uploads a killed daemon left in the bucket are aborted at its next start (red team
60, F6): the keys its journal noted as being uploaded, and only uploads begun before that start.
Against the session's real SeaweedFS; the uploads are begun with plain signed requests, as a
daemon killed after its first part leaves them."""

from __future__ import annotations

import json
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.mount.conftest import HAVE_FUSE, Mount
from tests.s3.conftest import S3Bucket
from vfs.stores.s3 import S3Folder
from vfs.stores.s3list import Plain, _fetch, _quote, _text
from vfs.stores.s3uploads import uploads_of

MountFactory = Callable[..., Mount]


def plain(bucket: S3Bucket) -> Plain:
    folder = S3Folder(bucket.url())
    try:
        from vfs.stores.s3 import _plain

        return _plain(folder.bucket, folder.conn.options)
    finally:
        folder.close()


def begin(p: Plain, key: str) -> str:
    """CreateMultipartUpload of `key` (a full key); its upload id."""
    url = urllib.parse.urlsplit(p.endpoint)
    path = "/" + _quote(p.bucket) + "/" + "/".join(_quote(part) for part in key.split("/"))
    body = _fetch(p, url, path, {"uploads": ""}, method="POST")
    return _text(ET.fromstring(body), "UploadId")


def test_the_uploads_of_the_keys_named_and_begun_before_are_aborted(s3_bucket: S3Bucket) -> None:
    p = plain(s3_bucket)
    left = begin(p, s3_bucket.key("big.bin"))
    begin(p, s3_bucket.key("big.bin.more"))  # another key under it: not named
    begin(p, s3_bucket.key("other.bin"))
    assert [u for u, _t in uploads_of(p, s3_bucket.key("big.bin"))] == [left]
    folder = S3Folder(s3_bucket.url())
    try:
        assert folder.abort_left_behind(["other.bin"], time.time() - 3600, 10) == 0  # begun later
        assert folder.abort_left_behind(["big.bin"], time.time() + 5, 10) == 1
    finally:
        folder.close()
    assert uploads_of(p, s3_bucket.key("big.bin")) == []
    assert len(uploads_of(p, s3_bucket.key("big.bin.more"))) == 1
    assert len(uploads_of(p, s3_bucket.key("other.bin"))) == 1


@pytest.mark.mount
@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")
def test_a_bucket_mount_aborts_at_start_what_its_journal_left_uploading(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """The journal's pending entry (noted before the upload began) is what a kill leaves: the
    next start aborts that key's upload and logs it; an upload of another key is left."""
    p = plain(s3_bucket)
    begin(p, s3_bucket.key("run/big.bin"))
    begin(p, s3_bucket.key("theirs.bin"))
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    (spool / "published.jsonl").write_text(json.dumps(["run/big.bin", "", 0o600, 0, 0, 1]) + "\n")
    time.sleep(1.1)  # S3 times are whole seconds: the uploads begun strictly before the start
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool))
    assert uploads_of(p, s3_bucket.key("run/big.bin")) == []
    assert len(uploads_of(p, s3_bucket.key("theirs.bin"))) == 1
    assert "aborted the multipart upload an earlier run left" in m.log.read_text()


@pytest.mark.mount
@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")
def test_a_pending_entry_does_not_make_another_host_s_object_this_host_s_user_s(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """Red team 86, F1: host A killed mid-upload of a user's file; host B's user published the
    same name meanwhile. A's journal still said an upload of its user's began there, and A
    showed B's object as its user's own file (their mode and owner), which they could `rm`.
    Now a start forgets a pending entry whose key holds an object A did not sign; one whose
    key holds A's own upload (or nothing yet) stays."""
    import obstore
    from obstore.store import S3Store

    from vfs.stores.s3uploads import UPLOAD_TOKEN, UploadTokens

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    ours = UploadTokens.kept_in(spool / "upload-secret")  # as the daemon will find it
    obstore.put(store, s3_bucket.key("u/theirs.bin"), b"B's user's file\n")
    obstore.put(store, s3_bucket.key("u/ours.bin"), b"A's upload\n",
                attributes={UPLOAD_TOKEN: ours.new("u/ours.bin")})  # fmt: skip
    lines = [
        json.dumps([key, "", 0o600, 1001, 1001, 10**18]) for key in ("u/theirs.bin", "u/ours.bin")
    ]
    (spool / "published.jsonl").write_text("\n".join(lines) + "\n")
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool))
    theirs, mine = (m.mnt / "u" / "theirs.bin").stat(), (m.mnt / "u" / "ours.bin").stat()
    assert (theirs.st_uid, theirs.st_mode & 0o777) == (0, 0o444)  # as any other host shows it
    assert (mine.st_uid, mine.st_mode & 0o777) == (1001, 0o600)  # A's own, shown as its user's


class Killed(BaseException):
    """The daemon killed: nothing after it runs (no withdrawal, no journal line)."""


def test_an_upload_of_a_file_removed_meanwhile_is_deleted_at_the_next_start_if_it_is_its_own(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 60, F1: an `rm` through the mount while its file is uploaded, the daemon
    killed after the PUT and before the read-back, left the object in the bucket for good.
    The upload carries a token, the `rm` notes key and token, and the next start deletes the
    object at the key only if it carries that token: not another host's put there since."""
    import obstore
    from obstore.store import S3Store

    from vfs.ingest.bucket import BucketPlacer
    from vfs.ingest.spool import Spool
    from vfs.stores import upload
    from vfs.stores.base import ObjectPath

    folder = S3Folder(s3_bucket.url())
    noted: list[tuple[str, str]] = []
    placer = BucketPlacer(folder, None, lambda key, token: noted.append((key, token)))
    spool = Spool(ObjectPath.of_url(s3_bucket.url()), tmp_path / "files", tmp_path / "staging")
    spool.placer = placer
    spooled = tmp_path / "files" / "run" / "f.bin"
    spooled.parent.mkdir(parents=True)
    spooled.write_bytes(b"removed while uploaded")
    put = upload.put_verified

    def removed_then_killed(folder: S3Folder, key: str, local: Path, verify: Any, **kw: Any) -> Any:
        def read_back(f: Any, k: str) -> None:
            placer.withdrawing("run/f.bin")  # what the mount's unlink does first
            spooled.unlink()
            raise Killed

        return put(folder, key, local, read_back, **kw)

    monkeypatch.setattr(upload, "put_verified", removed_then_killed)
    with pytest.raises(Killed):
        spool.publish("run/f.bin", False, None)
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    assert [key for key, _t in noted] == ["run/f.bin"]
    left = obstore.get(store, s3_bucket.key("run/f.bin"))
    assert bytes(left.bytes()) == b"removed while uploaded"  # what the kill leaves
    theirs = s3_bucket.key("run/theirs.bin")
    obstore.put(store, theirs, b"another host's", attributes={"decant-upload": "other"})
    items = [*noted, ("run/theirs.bin", noted[0][1]), ("run/never.bin", "t")]
    try:
        settled = folder.withdraw_left_behind(items, 10)
    finally:
        folder.close()
    assert settled == ["run/f.bin", "run/theirs.bin", "run/never.bin"]
    with pytest.raises(FileNotFoundError):
        obstore.head(store, s3_bucket.key("run/f.bin"))
    assert bytes(obstore.get(store, theirs).bytes()) == b"another host's"


@pytest.mark.mount
@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")
def test_a_bucket_mount_deletes_at_start_what_an_upload_of_a_removed_file_left(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """The journal's note of a removal during an upload (key and token): the next start deletes
    the object carrying that token, leaves the key another host took since, logs it, and the
    note is settled (not looked at again)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key("run/gone.bin"), b"left", attributes={"decant-upload": "t1"})
    obstore.put(store, s3_bucket.key("run/taken.bin"), b"theirs")
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    journal = spool / "published.jsonl"
    journal.write_text(
        "".join(
            json.dumps(line) + "\n"
            for line in (
                ["run/gone.bin", "", 0o600, 0, 0, 1],
                ["run/gone.bin", "", -2, 0, 0, 0, "t1"],
                ["run/taken.bin", "", -2, 0, 0, 0, "t2"],
            )
        )
    )
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool))
    assert sorted(p.name for p in (m.mnt / "run").iterdir()) == ["taken.bin"]
    assert (m.mnt / "run" / "taken.bin").read_bytes() == b"theirs"
    assert "deleted the upload of a file removed while it was uploaded" in m.log.read_text()
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [line for line in lines if line[2] == -2 and line[6]] == [
        ["run/gone.bin", "", -2, 0, 0, 0, "t1"],
        ["run/taken.bin", "", -2, 0, 0, 0, "t2"],
    ]  # the compacted notes, each then settled by a line with no token
    assert sorted(line[0] for line in lines if line[2] == -2 and not line[6]) == [
        "run/gone.bin",
        "run/taken.bin",
    ]
