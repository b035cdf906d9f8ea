"""Red team, round 46: a writer who may only add keys to the bucket, against the names every
host shows, and the `decant` commands given keys no object can have. Each test fails on the
code before its fix; see the commit that added it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import obstore
import pytest
import tifffile

from tests.mount.conftest import HAVE_FUSE, Mount
from tests.s3.conftest import S3Bucket, client
from vfs.decant.packer import pack_file

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

MountFactory = Callable[..., Mount]
STAMP = 1.1  # seconds: S3 keeps an object's upload time to the second


def _archive(work: Path, name: str, seed: int) -> tuple[bytes, bytes]:
    """(TIFF bytes, its archive's bytes) of a small TIFF called `name` (what mounts show)."""
    folder = work / f"a{seed}"
    folder.mkdir()
    pixels = np.random.default_rng(seed).integers(0, 60000, (32, 48), dtype=np.uint16)
    tifffile.imwrite(folder / name, pixels)
    pack_file(folder / name, folder / "out.zarr.zip")
    return (folder / name).read_bytes(), (folder / "out.zarr.zip").read_bytes()


def _put(bucket: S3Bucket, key: str, data: bytes) -> None:
    obstore.put(client(bucket), bucket.key(key), data, mode="create")  # adds, never replaces


def test_a_folder_keeps_its_name_against_a_later_archive_on_a_host_started_after_both(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """An archive presenting `results` uploaded after the folder `results/`: a host started
    after both showed the archive's TIFF as `results` and hid the whole folder (a prefix's
    time was the daemon's start), while a host started between the two showed the folder."""
    tiff, archive = _archive(tmp_path, "results", 1)
    _put(s3_bucket, "results/summary.txt", b"the folder's file\n")
    time.sleep(STAMP)
    _put(s3_bucket, "upload-7.zarr.zip", archive)
    m = bucket_mount(s3_bucket.url())
    assert (m.mnt / "results" / "summary.txt").read_bytes() == b"the folder's file\n"
    assert (m.mnt / "upload-7.zarr.zip").read_bytes() == tiff  # under its own name


def test_an_archive_keeps_its_name_against_a_later_folder(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """The other direction, which held before: a folder made later cannot take the name."""
    tiff, archive = _archive(tmp_path, "results", 2)
    _put(s3_bucket, "upload-8.zarr.zip", archive)
    time.sleep(STAMP)
    _put(s3_bucket, "results/summary.txt", b"added later\n")
    m = bucket_mount(s3_bucket.url())
    assert (m.mnt / "results").read_bytes() == tiff


def test_a_later_archive_named_after_a_name_does_not_take_it_from_an_older_one(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """`run.zarr.zip` presents `scan.tif`; an archive of other pixels added later as
    `scan.tif.zarr.zip` (a conditional PUT: nothing replaced) took `scan.tif` on every host,
    being named after it. The older one keeps it; the newer shows under its own name."""
    good, older = _archive(tmp_path, "scan.tif", 3)
    evil, newer = _archive(tmp_path, "scan.tif", 4)
    _put(s3_bucket, "run.zarr.zip", older)
    time.sleep(STAMP)
    _put(s3_bucket, "scan.tif.zarr.zip", newer)
    m = bucket_mount(s3_bucket.url())
    assert sorted(p.name for p in m.mnt.iterdir()) == ["scan.tif", "scan.tif.zarr.zip"]
    assert (m.mnt / "scan.tif").read_bytes() == good
    assert (m.mnt / "scan.tif.zarr.zip").read_bytes() == evil  # under its own name


def _decant(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vfs.commands", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    "url",
    ["{base}/ctl\x01.zarr.zip", "{base}/../x.zarr.zip"],
    ids=["control character", "dot-dot segment"],
)
@pytest.mark.parametrize("command", ["verify", "info", "restore"])
def test_decant_on_a_key_no_object_can_have_says_so_in_one_line(
    s3_bucket: S3Bucket, url: str, command: str, tmp_path: Path
) -> None:
    """obstore refuses such a key with a ValueError, which was a traceback and exit 1."""
    target = url.format(base=s3_bucket.url())
    extra = ["-o", str(tmp_path / "out")] if command == "restore" else []
    done = _decant(command, target, *extra)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "not a key an object store takes" in done.stderr


@pytest.mark.parametrize("name", ["a\nb.tif", "c\\d.tif"], ids=["control character", "backslash"])
def test_decant_pack_to_a_bucket_refuses_a_name_no_key_can_hold(
    s3_bucket: S3Bucket, name: str, tmp_path: Path
) -> None:
    """A backslash was uploaded to another key than the one printed (SeaweedFS takes it for a
    '/'), a newline was a traceback; nothing is uploaded now, and the line says why."""
    src = tmp_path / name
    src.write_bytes(_archive(tmp_path, "x.tif", 5)[0])
    done = _decant("pack", str(src), "-o", s3_bucket.url() + "/")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert list(obstore.list(client(s3_bucket), prefix=s3_bucket.key()).collect()) == []
