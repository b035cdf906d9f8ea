"""The S3 byte source against a real SeaweedFS: the conformance suite, ETag pinning, clear errors
(missing key, unreachable store) that never carry a credential."""

from __future__ import annotations

import errno
import os
import socket
import time

import obstore
import pytest

from tests.s3.conftest import S3Bucket
from tests.unit.stores_conformance import FolderTests
from vfs.errors import ObjectChangedError, ObjectMissingError, StoreError
from vfs.stores import Folder
from vfs.stores.locate import open_folder
from vfs.stores.s3 import S3Folder, S3Options, split_url


class TestS3Folder(FolderTests):
    @pytest.fixture(autouse=True)
    def _bucket(self, s3_bucket: S3Bucket) -> None:
        self.bucket = s3_bucket

    def make_folder(self, files: dict[str, bytes]) -> Folder:
        folder = open_folder(self.bucket.url("pre/fix"))
        assert isinstance(folder, S3Folder)
        for key, data in files.items():
            obstore.put(folder.client, folder.full_key(key), data)
        return folder

    def replace(self, folder: Folder, key: str, data: bytes) -> None:
        assert isinstance(folder, S3Folder)
        time.sleep(1.01)  # S3 mtimes have whole seconds; the ETag changes regardless
        obstore.put(folder.client, folder.full_key(key), data)


def test_split_url() -> None:
    assert split_url("s3://b/a/b/") == ("b", "a/b")
    assert split_url("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        split_url("s3:///x")


def test_a_replaced_object_is_not_mixed_with_its_successor(s3_bucket: S3Bucket) -> None:
    folder = S3Folder(s3_bucket.url())
    obstore.put(folder.client, s3_bucket.key("obj"), b"a" * 1000)
    src = folder.open("obj")
    assert src.read(0, 10) == b"a" * 10
    obstore.put(folder.client, s3_bucket.key("obj"), b"b" * 1000)
    with pytest.raises(ObjectChangedError, match=f"{s3_bucket.url('obj')}: .*replaced"):
        src.read(0, 10)
    assert folder.open("obj").read(0, 10) == b"b" * 10


def test_an_object_deleted_while_open_gives_a_stale_handle_not_no_such_file(
    s3_bucket: S3Bucket,
) -> None:
    """Red team 50s: a read of an object deleted after its open said ENOENT ("no such file") to a
    reader holding it open; it is ESTALE now, as a replaced object's, naming the object."""
    folder = S3Folder(s3_bucket.url())
    obstore.put(folder.client, s3_bucket.key("gone"), b"a" * 1000)
    src = folder.open("gone")
    assert src.read(0, 10) == b"a" * 10
    obstore.delete(folder.client, s3_bucket.key("gone"))
    with pytest.raises(ObjectChangedError, match=f"^{s3_bucket.url('gone')}: .*deleted") as info:
        src.read(500, 10)
    assert info.value.errno == errno.ESTALE
    with pytest.raises(ObjectMissingError):  # a fresh open: no such key
        folder.open("gone")


def test_a_missing_key_names_the_url(s3_bucket: S3Bucket) -> None:
    folder = S3Folder(s3_bucket.url("dir"))
    with pytest.raises(ObjectMissingError, match=f"^{s3_bucket.url('dir/none.zarr.zip')}: no such"):
        folder.open("none.zarr.zip")


def test_an_unreachable_store_fails_after_bounded_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Credentials of its own: the test must not lean on the session server's environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unreachable-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unreachable-test-secret-0123456789")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = S3Options(endpoint=f"http://127.0.0.1:{port}", timeout=1, retries=2, retry_timeout=3)
    folder = S3Folder("s3://bucket/p", options)
    start = time.monotonic()
    with pytest.raises(StoreError, match=r"^s3://bucket/p: listing: object store failed") as info:
        folder.check()
    assert time.monotonic() - start < 30  # bounded, not the default 180 s retry window
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert secret not in str(info.value)
    assert os.environ["AWS_ACCESS_KEY_ID"] not in str(info.value)
