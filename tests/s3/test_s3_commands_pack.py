"""`decant pack … -o s3://…` and `put_verified` against a real SeaweedFS: the archive lands under
the key only after it reads back right, an existing key is never overwritten silently (SeaweedFS
honours If-None-Match: *), and a bad upload of ours is deleted while another writer's is kept."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from tests.s3.conftest import S3Bucket
from vfs.errors import CorruptArchiveError
from vfs.stores import Folder
from vfs.stores.s3 import S3Folder
from vfs.stores.upload import (
    ObjectExistsError,
    UploadError,
    UploadVerifyError,
    put_verified,
    same_bytes,
)

Cli = Callable[..., tuple[int, str, str]]
TIFF = "striped_odd_u16_37x53.tif"
MiB = 1 << 20


def client(bucket: S3Bucket) -> S3Store:
    return S3Store(bucket.name, client_options={"allow_http": True})  # endpoint from AWS_*


def object_bytes(bucket: S3Bucket, key: str) -> bytes | None:
    try:
        return bytes(obstore.get(client(bucket), bucket.key(key)).bytes())
    except FileNotFoundError:
        return None


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pack_uploads_an_archive_that_restores_byte_exact(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path, decant_cli: Cli
) -> None:
    src = corpus[TIFF]
    before = (sha(src), src.stat().st_mtime_ns)
    url = s3_bucket.url(f"in/{TIFF}.zarr.zip")
    status, out, err = decant_cli("pack", src, "-o", url)
    assert (status, err) == (0, "")
    assert out == f"{src} -> {url}: byte-exact, ratio " + out.split("ratio ")[1]
    assert "(uploaded and checked)" in out  # one conditional PUT: no caveat
    status, out, err = decant_cli("restore", url, "-o", tmp_path / "back.tif")
    assert (status, err) == (0, "")
    assert (tmp_path / "back.tif").read_bytes() == src.read_bytes()
    assert (sha(src), src.stat().st_mtime_ns) == before


def test_pack_refuses_an_existing_key_and_force_replaces_it(
    s3_bucket: S3Bucket, corpus: dict[str, Path], decant_cli: Cli
) -> None:
    key = "x.tif.zarr.zip"
    obstore.put(client(s3_bucket), s3_bucket.key(key), b"someone else's archive")
    status, out, err = decant_cli("pack", corpus[TIFF], "-o", s3_bucket.url(key))
    assert (status, out) == (2, "")
    assert err == f"decant: {s3_bucket.url(key)}: already exists (--force replaces it)\n"
    assert object_bytes(s3_bucket, key) == b"someone else's archive"
    status, _, err = decant_cli("pack", "--force", corpus[TIFF], "-o", s3_bucket.url(key))
    assert (status, err) == (0, "")
    assert decant_cli("verify", s3_bucket.url(key))[0] == 0


def test_pack_several_inputs_under_a_prefix(
    s3_bucket: S3Bucket, corpus: dict[str, Path], decant_cli: Cli
) -> None:
    names = [TIFF, "zlib_u16.tif"]
    status, out, err = decant_cli("pack", *(corpus[n] for n in names), "-o", s3_bucket.url("d/"))
    assert (status, err) == (0, "")
    for name in names:
        url = s3_bucket.url(f"d/{name}.zarr.zip")
        assert f" -> {url}: " in out
        assert decant_cli("verify", url)[0] == 0
    status, out, err = decant_cli("pack", corpus[TIFF], "-o", s3_bucket.url("one/"))
    assert (status, err) == (0, "")  # one input, -o ending in '/': a prefix too
    assert f" -> {s3_bucket.url(f'one/{TIFF}.zarr.zip')}: " in out


def test_pack_to_a_bucket_refusals(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path, decant_cli: Cli
) -> None:
    status, _, err = decant_cli("pack", corpus[TIFF], "-o", s3_bucket.url("x.tif"))
    assert status == 2 and "named NAME.zarr.zip" in err
    status, _, err = decant_cli("pack", tmp_path / "none.tif", "-o", s3_bucket.url("n.zarr.zip"))
    assert status == 2 and "none.tif" in err
    status, _, err = decant_cli("pack", tmp_path, "--series", "-o", s3_bucket.url("s.zarr"))
    assert status == 2 and "--series" in err
    assert object_bytes(s3_bucket, "x.tif") is None
    assert object_bytes(s3_bucket, "n.zarr.zip") is None


# -- put_verified, the shared upload path -------------------------------------------------


@pytest.fixture
def blob(tmp_path: Path) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(12 * MiB + 7))
    return path


def test_seaweedfs_honours_if_none_match(s3_bucket: S3Bucket, blob: Path) -> None:
    """The conditional PUT itself refuses the key (no HEAD first on this path): the store's
    412 is what keeps two writers from overwriting each other."""
    folder = S3Folder(s3_bucket.url(""))
    obstore.put(client(s3_bucket), s3_bucket.key("k"), b"first writer")
    with pytest.raises(ObjectExistsError, match="already exists"):
        put_verified(folder, "k", blob)
    assert object_bytes(s3_bucket, "k") == b"first writer"


class Stopping(Exception):
    """What the daemon's check raises once it is stopping."""


def test_a_multipart_upload_stops_when_its_check_says_so(s3_bucket: S3Bucket, blob: Path) -> None:
    """Red team 50: obstore read a Path in Rust, so SIGTERM during the upload of a 20 GiB file
    left the daemon uploading, its mount answering nothing, for as long as the upload ran. The
    parts are now read through Python, and `check` (the daemon's stop flag) is asked first."""
    folder = S3Folder(s3_bucket.url(""))
    reads = []

    def check() -> None:
        reads.append(1)
        if len(reads) > 1:  # after the first part
            raise Stopping("the daemon is stopping")

    with pytest.raises(Stopping):
        put_verified(folder, "k", blob, single_put_max=MiB, chunk_size=5 * MiB, check=check)
    assert object_bytes(s3_bucket, "k") is None  # nothing published, no half object
    done = put_verified(
        folder, "k", blob, single_put_max=MiB, chunk_size=5 * MiB, check=lambda: None
    )
    assert object_bytes(s3_bucket, "k") == blob.read_bytes() and done.etag.strip('"').endswith("-3")


def test_a_multipart_upload_does_not_overwrite_an_object_put_there_while_it_ran(
    s3_bucket: S3Bucket, blob: Path
) -> None:
    """Red team 86, F2: a multipart upload cannot be conditional, and the key was looked at
    only as it began: a file another host moved there meanwhile was overwritten (its old name
    already deleted: lost). The key is looked at again as the last part is read."""
    folder = S3Folder(s3_bucket.url(""))
    reads = []

    def meanwhile() -> None:
        reads.append(1)
        if len(reads) == 2:  # after the first part: another writer's object lands (on a
            # thread of its own: this runs within obstore's runtime, where obstore cannot)
            with ThreadPoolExecutor(1) as pool:
                pool.submit(obstore.put, client(s3_bucket), s3_bucket.key("k"),
                            b"moved here meanwhile").result()  # fmt: skip

    with pytest.raises(ObjectExistsError, match="during the upload"):
        put_verified(folder, "k", blob, single_put_max=MiB, chunk_size=5 * MiB, check=meanwhile)
    assert object_bytes(s3_bucket, "k") == b"moved here meanwhile"
    # Without a check (decant pack -o s3://...) the key is looked at again too.
    obstore.delete(client(s3_bucket), s3_bucket.key("k"))
    done = put_verified(folder, "k", blob, single_put_max=MiB, chunk_size=5 * MiB)
    assert object_bytes(s3_bucket, "k") == blob.read_bytes() and done.etag.strip('"').endswith("-3")


def test_single_put_and_multipart_publish_the_same_bytes(s3_bucket: S3Bucket, blob: Path) -> None:
    folder = S3Folder(s3_bucket.url(""))
    one = put_verified(folder, "one", blob)
    assert one.conditional and "-" not in one.etag.strip('"')
    many = put_verified(folder, "many", blob, single_put_max=MiB, chunk_size=5 * MiB)
    assert not many.conditional and many.etag.strip('"').endswith("-3")  # three parts
    for key in ("one", "many"):
        assert object_bytes(s3_bucket, key) == blob.read_bytes()
    with pytest.raises(ObjectExistsError):  # the multipart path asks with a HEAD first
        put_verified(folder, "many", blob, single_put_max=MiB, chunk_size=5 * MiB)


def test_a_failed_check_deletes_our_upload_and_keeps_the_local_file(
    s3_bucket: S3Bucket, blob: Path
) -> None:
    folder = S3Folder(s3_bucket.url(""))
    before = sha(blob)

    def damaged(folder: Folder, key: str) -> None:
        raise CorruptArchiveError(f"{key}: chunk 3 does not decode")

    with pytest.raises(UploadVerifyError, match=r"chunk 3 does not decode.*deleted it"):
        put_verified(folder, "bad", blob, damaged)
    assert object_bytes(s3_bucket, "bad") is None
    assert sha(blob) == before


def test_same_bytes_catches_a_difference(s3_bucket: S3Bucket, blob: Path, tmp_path: Path) -> None:
    folder = S3Folder(s3_bucket.url(""))
    other = tmp_path / "other.bin"
    data = bytearray(blob.read_bytes())
    data[9 * MiB] ^= 1
    other.write_bytes(bytes(data))
    with pytest.raises(UploadVerifyError, match=f"bytes differ at {8 * MiB}"):
        put_verified(folder, "diff", blob, same_bytes(other))
    assert object_bytes(s3_bucket, "diff") is None


def test_an_object_replaced_during_the_check_is_not_deleted(
    s3_bucket: S3Bucket, blob: Path
) -> None:
    folder = S3Folder(s3_bucket.url(""))

    def racing_writer(folder: Folder, key: str) -> None:
        obstore.put(client(s3_bucket), s3_bucket.key(key), b"another host's archive")

    with pytest.raises(UploadError, match=r"replaced by another writer.*left it"):
        put_verified(folder, "race", blob, racing_writer)
    assert object_bytes(s3_bucket, "race") == b"another host's archive"
