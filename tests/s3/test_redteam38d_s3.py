"""Red team, round 38d: folder archives (`NAME.zarr/` prefixes) in a bucket, rewritten in place
or with a chunk swapped, through real mounts and real clients.

Expected bytes come from the arrays handed to tifffile, never from vfs. Each test failed before
the fix its docstring names, but for cases kept as checks that held: `damaged` (EIO before, for
the wrong reason; it fails with the open's ESTALE alone, without the version fold) and the
bundle swapped `before` the reconstructing pass.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import obstore
import pytest
import tifffile

from tests.mount.conftest import HAVE_FUSE
from tests.mount.helpers import read_through, verdict
from tests.s3.conftest import MountFactory, S3Bucket, client
from tests.s3.test_mount_bucket_write import wait_for

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

ROOT = Path(__file__).resolve().parents[2]


def tiff(seed: int, planes: int = 8, side: int = 128) -> bytes:
    buf = io.BytesIO()
    data = np.random.default_rng(seed).integers(0, 60000, (planes, side, side), dtype=np.uint16)
    tifffile.imwrite(buf, data, photometric="minisblack")
    return buf.getvalue()


def pack(tmp_path: Path, data: bytes, archive: str) -> Path:
    """`decant pack` of `data` (as x.tif) to the folder archive `archive` under `tmp_path`."""
    src = tmp_path / archive / "in" / "x.tif"
    src.parent.mkdir(parents=True)
    src.write_bytes(data)
    out = tmp_path / archive / "x.tif.zarr"
    done = subprocess.run([sys.executable, "-m", "vfs.commands", "pack", "-q", str(src),
                           "-o", str(out)], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def upload(bucket: S3Bucket, local: Path, key: str) -> None:
    """A folder as one object per file under `key/`, in key order (as `aws s3 sync` puts them:
    `.decant/manifest.json` sorts first), or a file as the one object `key`."""
    store = client(bucket)
    if local.is_file():
        obstore.put(store, bucket.key(key), local.read_bytes())
        return
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        obstore.put(store, bucket.key(f"{key}/{path.relative_to(local).as_posix()}"),
                    path.read_bytes())  # fmt: skip


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_chunk_swapped_after_a_partial_read_is_not_recorded_as_verified(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """A user reads 4 KiB of `x.tif` (its first plane is decoded into the daemon's cache) and
    closes it; the chunk object of that plane is then overwritten with another archive's (same
    shape). The background verification hashes the cached plane (right), then records the
    chunk digests by GETting every chunk object again, as it is now: the other archive's
    chunk. After a restart with the same index the other scan's plane is served, checked
    against its own digest, as verified (`sha256sum` printed the other TIFF's hash). Fixed: a
    `NAME.zarr/` prefix's digest map is made only from objects that reconstruct to the sha256
    that verified, each held to the version that did (FolderStore.pinned)."""
    data, other = tiff(5), tiff(6)
    upload(s3_bucket, pack(tmp_path, data, "mine"), "x.tif.zarr")
    theirs = pack(tmp_path, other, "theirs")
    m = bucket_mount(s3_bucket.url())
    shown = m.mnt / "x.tif"
    fd = os.open(shown, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 256) == data[256 : 256 + 4096]  # plane 0: chunk 0/0.0.0
        upload(s3_bucket, theirs / "0" / "0.0.0", "x.tif.zarr/0/0.0.0")
    finally:
        os.close(fd)  # closed early: a background verification is queued
    wait_for(lambda: "x.tif.zarr: verified sha256" in m.log_text(), 20, "verified")
    time.sleep(1.0)  # its digests recorded, or not
    m.stop()
    again = bucket_mount(s3_bucket.url())
    got = read_through(again.mnt / "x.tif", timeout=0, poll=0.2)
    assert got != data  # the chunk object is another scan's now
    assert not (isinstance(got, bytes) and got[256:33024] == other[256:33024]), (
        "the other archive's plane served as verified"
    )
    assert got == errno.EIO
    assert verdict(again.mnt / "x.tif") != "yes"


@pytest.mark.parametrize("variant", ["same-layout", "fewer-planes", "damaged"])
def test_a_folder_archive_rewritten_in_place_is_described_anew(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path, variant: str
) -> None:
    """`x.tif.zarr/` in the bucket, read and verified, is overwritten in place with another
    archive's objects (every key of B put over x's: manifest, metadata, chunks). Its prefix
    lists as a name, with no identity, so no relisting saw a change: the node kept the old
    manifest's identity, description and digests, and every open of `x.tif` failed with EIO
    (B's chunks against x's digests) until a restart. Fixed: an open whose manifest is not the
    one listed gives ESTALE (its folder is listed again), and a prefix's version folds in its
    manifest's identity: the rewrite is a new node, with a new inode (the kernel's cached
    pages of the old one are not served for it) and no verdict (`damaged`: B with one chunk
    of a third archive, which a verdict kept by the old node's key served unhashed)."""
    old, new = tiff(7), tiff(8, 3 if variant == "fewer-planes" else 8)
    upload(s3_bucket, pack(tmp_path, old, "mine"), "x.tif.zarr")
    theirs = pack(tmp_path, new, "theirs")
    if variant == "damaged":
        third = pack(tmp_path, tiff(11), "third")
        (theirs / "0" / "3.0.0").write_bytes((third / "0" / "3.0.0").read_bytes())
    m = bucket_mount(s3_bucket.url(), "--relist", "1")
    shown = m.mnt / "x.tif"
    assert _sha(shown.read_bytes()) == _sha(old)
    wait_for(lambda: verdict(shown) == "yes", 20, "verified")
    assert shown.read_bytes() == old  # verified: now in the kernel's page cache
    upload(s3_bucket, theirs, "x.tif.zarr")
    time.sleep(2.5)  # relisted, and the kernel's attributes expired
    got = read_through(shown, timeout=5.0, poll=0.2)
    assert got != old, "the old archive's bytes served for the rewritten one"
    if variant == "damaged":
        assert got == errno.EIO, "a damaged rewrite served as verified"
        return
    assert isinstance(got, bytes), f"errno {got} reading the rewritten archive"
    assert _sha(got) == _sha(new)
    assert os.stat(shown).st_size == len(new)


def test_a_handle_opened_before_an_in_place_rewrite_serves_no_mix(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """A handle opened (4 KiB read, not verified yet) before `x.tif.zarr/` was overwritten in
    place with another archive of the same layout goes on reading chunk objects by their
    keys: B's chunks decoded by x's manifest, bytes of neither TIFF, until its hash's verdict.
    Fixed: a prefix's store serves a value no recorded digest checks only while its manifest
    is still the version it read (EIO at once). Not covered: a chunk read while the upload
    runs, replaced before the manifest is (the hash's verdict still refuses it)."""
    old = tiff(9, 8, 256)
    upload(s3_bucket, pack(tmp_path, old, "mine"), "x.tif.zarr")
    theirs = pack(tmp_path, tiff(10, 8, 256), "theirs")
    m = bucket_mount(s3_bucket.url(), "--cache-size", "1M")
    fd = os.open(m.mnt / "x.tif", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == old[:4096]
        time.sleep(1.0)  # the read-ahead that read started is let finish first
        upload(s3_bucket, theirs, "x.tif.zarr")
        off = 4096
        while off < len(old):
            try:
                data = os.pread(fd, 65536, off)
            except OSError as exc:
                assert exc.errno in (errno.EIO, errno.ESTALE)
                break
            assert data == old[off : off + len(data)], f"mixed bytes served at {off}"
            off += len(data)
    finally:
        os.close(fd)


def test_a_rewrite_while_a_verified_handle_is_held_is_read_anew(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """As above, with a handle of the verified old version held open across the rewrite: a new
    open must not join the old open archive (it HEADs the manifest: ESTALE, relisted) and
    reads B's TIFF whole; the held handle reads the old bytes whole, or is refused. Before
    the fix of the test above, a new `cat` read bytes of neither TIFF, exit 0: the old
    node's verdict and inode kept (its key unchanged), the kernel's cached page of the held
    handle's read served with B's bytes after it, unhashed."""
    old, new = tiff(12), tiff(13)
    upload(s3_bucket, pack(tmp_path, old, "mine"), "x.tif.zarr")
    theirs = pack(tmp_path, new, "theirs")
    m = bucket_mount(s3_bucket.url(), "--relist", "1", "--cache-size", "1M")
    shown = m.mnt / "x.tif"
    assert shown.read_bytes() == old
    wait_for(lambda: verdict(shown) == "yes", 20, "verified")
    fd = os.open(shown, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == old[:4096]
        upload(s3_bucket, theirs, "x.tif.zarr")
        time.sleep(2.5)
        got = read_through(shown, timeout=5.0, poll=0.2)
        assert isinstance(got, bytes), f"errno {got} reading the rewritten archive"
        assert _sha(got) == _sha(new)
        try:
            stale = b"".join(os.pread(fd, 65536, off) for off in range(0, len(old), 65536))
        except OSError as exc:
            assert exc.errno in (errno.EIO, errno.ESTALE)
        else:
            assert stale == old, "mixed bytes served to the handle held"
    finally:
        os.close(fd)


def _series(base: Path, seed: int) -> Path:
    """A nested series (`plates.zarr/`: a bundle per member, the two of other page shapes)."""
    from vfs.decant.packer import PackOptions
    from vfs.decant.series import pack_series

    folder = base / f"plates-{seed}"
    folder.mkdir()
    (folder / "a.tif").write_bytes(tiff(seed, 2, 64))
    (folder / "b.tif").write_bytes(tiff(seed + 1, 2, 96))
    (base / f"{seed}").mkdir()
    return pack_series(folder, base / f"{seed}" / "plates.zarr", PackOptions()).archive


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_bundle_rewritten_while_the_digest_map_is_made_is_not_left_verified(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, when: str
) -> None:
    """A nested series' digest map is made in two passes over a folder archive: one checks
    every original reconstructs to its sha256, the other reads the digests, each opening a
    member's bundle anew. A bundle replaced between them (`after` the reconstructing pass) by
    a forged one (the bundle's own manifest, which the series checks, over another series'
    chunks of that shape) while the first pass held it open failed the second with the
    bundle's CRC-32 (a local bundle rewritten in place) or ObjectChangedError (its ETag),
    which the mount (ops._mark_verified) takes as "chunk digests not recorded" and keeps the
    verdict, with no map; the folder archive's identity (its manifest's) is unchanged, so the
    forged bundle is then read as verified, with only its own CRC-32s to check it (read from
    the code, not run through a mount here). Fixed: such a change is an IntegrityError (the
    verdict forgotten); a swap `before` the reconstructing pass fails it likewise."""
    from vfs.backends.decant import DecantBackend
    from vfs.cache import PageCache
    from vfs.decant import verify
    from vfs.decant.digests import archive_digests
    from vfs.decant.reader import DecantArchive
    from vfs.decant.store import is_chunk_key
    from vfs.errors import IntegrityError
    from vfs.stores.s3 import S3Folder

    mine, theirs = _series(tmp_path, 20), _series(tmp_path, 30)
    name = "m0.zarr.zip"  # a.tif's bundle
    forged = tmp_path / name
    with zipfile.ZipFile(mine / name) as ours, zipfile.ZipFile(theirs / name) as other:
        chunks = {i.filename: other.read(i.filename) for i in other.infolist()}
        with zipfile.ZipFile(forged, "w") as out:
            for info in ours.infolist():
                take = is_chunk_key(info.filename) and info.filename in chunks
                out.writestr(info, chunks[info.filename] if take else ours.read(info.filename))
    if where == "bucket":
        upload(s3_bucket, mine, "plates.zarr")

    def swap() -> None:
        if where == "bucket":
            upload(s3_bucket, forged, f"plates.zarr/{name}")
        else:
            (mine / name).write_bytes(forged.read_bytes())

    real = verify.verify_opened

    def reconstructing(*args: object, **kw: object) -> object:
        if when == "before":
            swap()
        found = real(*args, **kw)  # type: ignore[arg-type]
        if when == "after":
            swap()
        return found

    with DecantArchive.open(mine) as opened:
        expect = opened.originals()[0].sha256
    wrong = archive_digests(theirs)
    assert wrong is not None
    monkeypatch.setattr(verify, "verify_opened", reconstructing)
    try:
        if where == "bucket":
            folder = S3Folder(s3_bucket.url())
            got = DecantBackend(PageCache(8 << 20)).chunk_digests_at(folder, "plates.zarr", expect)
        else:
            got = archive_digests(mine, expect)
    except IntegrityError:
        return
    assert got is not None
    forged_keys = {f"{name}/{k}" for k in chunks if is_chunk_key(k)}
    assert all(got.get(k) != wrong.get(k) for k in forged_keys), "the forged chunks recorded"
