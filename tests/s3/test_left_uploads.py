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
