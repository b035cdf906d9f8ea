"""Writing into `decant-mount s3://BUCKET/PREFIX MNT --spool DIR` against a real SeaweedFS:
`rsync -a` of corpus TIFFs and text files, read back through the mount and from the bucket, a
second host seeing the uploads, the store stopped while files are spooled, and a key another
host already wrote never overwritten."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
import tifffile
from obstore.store import S3Store

from tests.mount.conftest import HAVE_FUSE, Mount
from tests.s3.conftest import WEED, S3Bucket, revived, seaweed
from vfs.decant.packer import PackResult

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

MountFactory = Callable[..., Mount]
TIFFS = ("striped_i16.tif", "tiled_f32_narrow.tif", "zlib_u16.tif", "lzw_u8.tif")
TEXTS = {"notes.txt": b"plain notes\n", "run1/readme.md": b"# run 1\n" * 100,
         "run1/deep/params.json": b'{"gain": 2}\n'}  # fmt: skip


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def own_bucket(server: Any, name: str) -> tuple[str, S3Store]:
    """A new bucket of a test's own server, and a store on it."""
    bucket = server.create_bucket(name)
    store = S3Store(bucket, config={"endpoint": server.endpoint},
                    client_options={"allow_http": True})  # fmt: skip
    return bucket, store


def multipart_file(path: Path, seed: int) -> Path:
    """272 MiB at `path`, every MiB different: 17 parts of 16 MiB, past SINGLE_PUT_MAX."""
    block = np.random.default_rng(seed).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as fh:
        for i in range(272):
            fh.write(i.to_bytes(4, "little") + block[4:])
    return path


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        time.sleep(0.2)


def spooled(spool: Path) -> list[str]:
    files = spool / "files"
    return sorted(p.relative_to(files).as_posix() for p in files.rglob("*") if p.is_file())


def keys_of(store: S3Store, prefix: str) -> list[str]:
    out = []
    for batch in obstore.list(store, prefix=prefix + "/"):
        out += [m["path"][len(prefix) + 1 :] for m in batch]
    return sorted(out)


def make_tree(root: Path, corpus: dict[str, Path]) -> dict[str, bytes]:
    """A small tree to rsync: TIFFs at the top and in a subfolder, text files around them."""
    want: dict[str, bytes] = {}
    for i, name in enumerate(TIFFS):
        rel = name if i % 2 == 0 else f"run1/{name}"
        want[rel] = corpus[name].read_bytes()
    want.update(TEXTS)
    for rel, data in want.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return want


def expected_keys(want: dict[str, bytes]) -> list[str]:
    return sorted(f"{r}.zarr.zip" if r.endswith(".tif") else r for r in want)


def rsync(src: Path, mnt: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rsync", "-a", "--stats", f"{src}/", f"{mnt}/"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def transferred(out: str) -> int:
    line = next(x for x in out.splitlines() if x.startswith("Number of regular files transferred"))
    return int(line.split(":")[1].replace(",", ""))


@pytest.fixture
def bucket_mount(tmp_path: Path) -> Iterator[MountFactory]:
    mounts: list[Mount] = []

    def factory(url: str, *extra: str, name: str = "mnt", wait: bool = True) -> Mount:
        m = Mount(url, tmp_path / name, tmp_path / f"{name}.log", tmp_path / f"{name}-index")  # type: ignore[arg-type]
        mounts.append(m)
        return m.start("--settle", "0.2", *extra, wait=wait)

    yield factory
    for m in mounts:
        m.stop()


def test_rsync_into_a_bucket_mount_publishes_verified_objects(
    s3_bucket: S3Bucket, corpus: dict[str, Path], bucket_mount: MountFactory, tmp_path: Path
) -> None:
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    obstore.put(store, s3_bucket.key("old.txt"), b"already there\n")
    src = tmp_path / "src"
    want = make_tree(src, corpus)
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool))
    run = rsync(src, m.mnt)
    assert run.returncode == 0, run.stderr
    assert transferred(run.stdout) == len(want)
    # Readable at once (spooled, or already published), and after the queue drained.
    for rel, data in want.items():
        assert (m.mnt / rel).read_bytes() == data, rel
    wait_for(lambda: not spooled(spool), 120, "the spool drained")
    doc = status(m.mnt)
    assert doc["failed"] == [] and doc["done"] == len(want), doc
    assert keys_of(store, s3_bucket.key()) == sorted([*expected_keys(want), "old.txt"])
    for rel, data in want.items():
        key = s3_bucket.key(f"{rel}.zarr.zip" if rel.endswith(".tif") else rel)
        if not rel.endswith(".tif"):
            assert bytes(obstore.get(store, key).bytes()) == data  # plain files as they are
        out = subprocess.run(["sha256sum", str(m.mnt / rel)], capture_output=True, text=True)
        assert out.stdout.split()[0] == digest(data), rel
    assert sorted(os.listdir(m.mnt)) == sorted(["old.txt", "run1", *[t for t in want
                                                                   if "/" not in t]])  # fmt: skip
    again = rsync(src, m.mnt)
    assert again.returncode == 0, again.stderr
    assert transferred(again.stdout) == 0, again.stdout
    assert not spooled(spool)
    # After a remount too: the mode, owner and mtime rsync gave them are kept in the spool.
    m.stop()
    m.start(*m.extra)
    third = rsync(src, m.mnt)
    assert third.returncode == 0, third.stderr
    assert transferred(third.stdout) == 0, third.stdout
    assert os.stat(m.mnt / "notes.txt").st_mtime_ns == os.stat(src / "notes.txt").st_mtime_ns
    # A second host (own index, read-only) sees them after its relist, byte-exact.
    other = bucket_mount(s3_bucket.url(), "--relist", "1", name="host2")
    for rel, data in want.items():
        assert (other.mnt / rel).read_bytes() == data, rel
    with pytest.raises(OSError) as err:
        (other.mnt / "x.txt").write_bytes(b"x")
    assert err.value.errno == errno.EROFS


def test_a_key_another_host_wrote_is_not_overwritten(
    s3_bucket: S3Bucket,
    corpus: dict[str, Path],
    packed_corpus: dict[str, PackResult],
    bucket_mount: MountFactory,
    tmp_path: Path,
) -> None:
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool), "--relist", "600")
    assert os.listdir(m.mnt) == []  # listed before the other host writes
    theirs_tif = packed_corpus["lzw_u8.tif"].archive.read_bytes()
    obstore.put(store, s3_bucket.key("lzw_u8.tif.zarr.zip"), theirs_tif)
    obstore.put(store, s3_bucket.key("notes.txt"), b"their notes\n")
    mine_tif = corpus["zlib_u16.tif"].read_bytes()  # other bytes under the same name
    (m.mnt / "lzw_u8.tif").write_bytes(mine_tif)
    (m.mnt / "notes.txt").write_bytes(b"my notes\n")
    # The same original as the archive there, but another host's upload: left as it is, the
    # spooled copy kept (red team 83, F1: counted as published, the copy went).
    same = "tiled_f32_narrow.tif"
    obstore.put(store, s3_bucket.key(f"{same}.zarr.zip"), packed_corpus[same].archive.read_bytes())
    shutil.copyfile(corpus[same], m.mnt / same)

    def failed() -> dict[str, str]:
        return {f["path"]: f["reason"] for f in status(m.mnt)["failed"]}

    wait_for(lambda: set(failed()) == {"lzw_u8.tif", "notes.txt", same}, 60, "all refused")
    assert "already exists" in failed()["notes.txt"] and "not overwritten" in failed()["notes.txt"]
    assert "already exists" in failed()["lzw_u8.tif"]
    assert "not from an upload of this host" in failed()[same]
    assert bytes(obstore.get(store, s3_bucket.key("notes.txt")).bytes()) == b"their notes\n"
    assert bytes(obstore.get(store, s3_bucket.key("lzw_u8.tif.zarr.zip")).bytes()) == theirs_tif
    assert spooled(spool) == sorted(["lzw_u8.tif", "notes.txt", same])
    # Still readable through the mount: the spooled bytes win their names on this host.
    assert (m.mnt / "lzw_u8.tif").read_bytes() == mine_tif
    assert (m.mnt / "notes.txt").read_bytes() == b"my notes\n"
    assert (m.mnt / same).read_bytes() == corpus[same].read_bytes()
    assert "not published, stays spooled" in m.log_text()


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A SeaweedFS of this module's own, which its tests stop, kill and restart."""
    assert WEED is not None
    server = seaweed.SeaweedServer(tmp_path_factory.mktemp("weed-write-faults"), WEED)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_server(fault_server: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The module's server, running; AWS_* point at it."""
    return revived(fault_server, monkeypatch)


def test_the_store_down_during_ingest_keeps_files_spooled_until_it_returns(
    own_server: Any, corpus: dict[str, Path], bucket_mount: MountFactory, tmp_path: Path
) -> None:
    endpoint = own_server.endpoint
    bucket = own_server.create_bucket("ingest")
    store = S3Store(bucket, config={"endpoint": endpoint}, client_options={"allow_http": True})
    spool = tmp_path / "spool"
    m = bucket_mount(f"s3://{bucket}/p", "--spool", str(spool), "--s3-endpoint", endpoint,
                     "--s3-timeout", "2", "--s3-retries", "0", "--retry-after", "4")  # fmt: skip
    os.listdir(m.mnt)
    own_server.stop()
    src = tmp_path / "src"
    want = make_tree(src, corpus)
    for rel in [r for r in want if "/" in r]:  # the folders, made while the store is down
        (m.mnt / rel).parent.mkdir(parents=True, exist_ok=True)
    run = rsync(src, m.mnt)
    assert run.returncode == 0, run.stderr
    wait_for(lambda: len(status(m.mnt)["failed"]) == len(want), 60, "every upload failed")
    assert spooled(spool) == sorted(want)
    for rel, data in want.items():
        assert (m.mnt / rel).read_bytes() == data, rel
    assert m.proc is not None and m.proc.poll() is None
    own_server.start()
    # Retried unattended with back-off (4 s after the failure here, doubling; 30 s by default).
    wait_for(lambda: not spooled(spool), 150, "published once the store returned")
    assert status(m.mnt)["failed"] == []
    assert keys_of(store, "p") == expected_keys(want)
    for rel, data in want.items():
        assert (m.mnt / rel).read_bytes() == data, rel


def test_the_placer_publishes_checks_and_withdraws_only_its_own(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """BucketPlacer without a mount: the key it writes, what it reports, and `retract`
    deleting what it uploaded but never an object it did not."""
    from vfs.ingest.bucket import BucketPlacer, KeyTakenError
    from vfs.ingest.spool import Spool
    from vfs.stores.base import ObjectPath
    from vfs.stores.s3 import S3Folder

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    folder = S3Folder(s3_bucket.url())
    seen: list[tuple[str, bool]] = []
    placer = BucketPlacer(folder, lambda key, etag, st: etag and seen.append((key, st is not None)))
    # (notes with no ETag, made before an upload starts, left out: BucketTree.PENDING)
    spool = Spool(ObjectPath.of_url(s3_bucket.url()), tmp_path / "files", tmp_path / "staging")
    spool.placer = placer
    name = "tiled_f32_narrow.tif"
    (tmp_path / "files" / "d").mkdir(parents=True)
    shutil.copyfile(corpus[name], tmp_path / "files" / "d" / name)
    done = spool.publish(f"d/{name}", False, None)
    assert done.mode in ("byte-exact", "verbatim") and str(done.target) == s3_bucket.url(
        f"d/{name}.zarr.zip"
    )
    assert seen == [(f"d/{name}.zarr.zip", True)]
    assert list(tmp_path.joinpath("staging").iterdir()) == []  # the staged archive went
    assert spool.publish(f"d/{name}", False, None).mode == "already"
    placer.retract(done.target, done.placed)
    assert keys_of(store, s3_bucket.key()) == []
    assert seen[-1] == (f"d/{name}.zarr.zip", False)
    again = spool.publish(f"d/{name}", False, None)
    key = s3_bucket.key(f"d/{name}.zarr.zip")
    obstore.put(store, key, b"replaced by another writer")
    placer.retract(again.target, again.placed)  # not ours any more: it stays
    assert bytes(obstore.get(store, key).bytes()) == b"replaced by another writer"
    obstore.delete(store, key)
    obstore.put(store, s3_bucket.key(f"d/{name}"), b"theirs")  # the plain form of the name
    with pytest.raises(KeyTakenError, match="one would hide the other"):
        spool.publish(f"d/{name}", False, None)
    assert keys_of(store, s3_bucket.key()) == [f"d/{name}"]


def test_the_store_killed_mid_upload_leaves_nothing_half_visible_and_is_retried(
    own_server: Any, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """The issue's "store dying mid-upload": the archive's PUT is held half-sent by a proxy
    (tests/s3/stall.py) while the server is SIGKILLed by its PID; the spooled file stays and
    reads back, no object (whole or half) is under the key once the server is back on the same
    data and ports, and the queue's own retry publishes it byte-exact."""
    from tests.s3.stall import StallingProxy

    bucket = own_server.create_bucket("killed")
    store = S3Store(bucket, config={"endpoint": own_server.endpoint},
                    client_options={"allow_http": True})  # fmt: skip
    # 24 MiB of noise (incompressible): half the archive's body is past the filer's first
    # 8 MiB chunk when the server dies, so a chunk already stored could leak a partial entry.
    name = "noise.tif"
    tifffile.imwrite(
        tmp_path / name,
        np.random.default_rng(7).integers(0, 65535, (3, 2048, 2048), dtype=np.uint16),
    )
    data = (tmp_path / name).read_bytes()
    proxy = StallingProxy(own_server.s3_port, f"/{name}.zarr.zip".encode())
    try:
        spool = tmp_path / "spool"
        m = bucket_mount(f"s3://{bucket}/p", "--spool", str(spool), "--s3-endpoint",
                         proxy.endpoint, "--s3-timeout", "2", "--s3-retries", "0")  # fmt: skip
        (m.mnt / name).write_bytes(data)
        assert proxy.stalled.wait(60), "the archive's upload never started"
        assert proxy.held.startswith(f"PUT /{bucket}/p/{name}.zarr.zip".encode()), proxy.held
        own_server.proc.kill()  # SIGKILL, by its own PID: no graceful shutdown
        own_server.proc.wait(timeout=10)
        proxy.release.set()  # the held connection drops with half the body sent
        wait_for(lambda: [f["path"] for f in status(m.mnt)["failed"]] == [name], 60,
                 "the upload failed")  # fmt: skip
        assert spooled(spool) == [name]
        assert (m.mnt / name).read_bytes() == data  # served from the spool meanwhile
        assert m.proc is not None and m.proc.poll() is None
        own_server.start()  # same data folder, same ports
        before_retry = status(m.mnt)["failed"]
        seen = keys_of(store, "p")
        assert [f["path"] for f in before_retry] == [name] and seen == [], (before_retry, seen)
        # Retried at once by a touch through the mount, as an operator would once the store
        # is back (the unattended back-off, 30 s, is the test above's), through the proxy,
        # which no longer stalls.
        os.utime(m.mnt / name)
        wait_for(lambda: not spooled(spool), 120, "published after the restart")
        assert status(m.mnt)["failed"] == []
        assert keys_of(store, "p") == [f"{name}.zarr.zip"]
        assert (m.mnt / name).read_bytes() == data  # now read from the bucket, by ranged GETs
        assert f"{name}: not published, stays spooled" in m.log_text()
    finally:
        proxy.close()
    # A second host, straight to the server, restores the same bytes from the object.
    other = bucket_mount(f"s3://{bucket}/p", "--s3-endpoint", own_server.endpoint, name="host2")
    assert (other.mnt / name).read_bytes() == data


def test_objects_of_the_bucket_are_deleted_and_renamed_only_with_allow_delete(
    s3_bucket: S3Bucket,
    packed_corpus: dict[str, PackResult],
    corpus: dict[str, Path],
    bucket_mount: MountFactory,
    tmp_path: Path,
) -> None:
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    tif = "lzw_u8.tif"
    objects = {f"{tif}.zarr.zip": packed_corpus[tif].archive.read_bytes(),
               "notes.txt": b"their notes\n", "sub/other.txt": b"other\n",
               "taken.txt": b"taken\n"}  # fmt: skip
    for key, data in objects.items():
        obstore.put(store, s3_bucket.key(key), data)
    ro = bucket_mount(s3_bucket.url(), "--spool", str(tmp_path / "spool1"), name="plain")
    for act in (lambda: os.unlink(ro.mnt / "notes.txt"), lambda: os.unlink(ro.mnt / tif),
                lambda: os.rename(ro.mnt / "notes.txt", ro.mnt / "n2.txt")):  # fmt: skip
        with pytest.raises(PermissionError):
            act()
    ro.stop()
    assert keys_of(store, s3_bucket.key()) == sorted(objects)

    m = bucket_mount(s3_bucket.url(), "--spool", str(tmp_path / "spool2"), "--allow-delete",
                     "--relist", "600")  # fmt: skip
    assert sorted(os.listdir(m.mnt)) == ["lzw_u8.tif", "notes.txt", "sub", "taken.txt"]
    assert (m.mnt / tif).read_bytes() == corpus[tif].read_bytes()
    os.unlink(m.mnt / tif)
    os.rename(m.mnt / "notes.txt", m.mnt / "sub" / "moved.txt")
    assert (m.mnt / "sub" / "moved.txt").read_bytes() == b"their notes\n"
    # Moved by this host, the object is still the one it listed: moved on at once, not ESTALE.
    os.rename(m.mnt / "sub" / "moved.txt", m.mnt / "sub" / "moved.tmp")
    os.rename(m.mnt / "sub" / "moved.tmp", m.mnt / "sub" / "moved.txt")
    with pytest.raises(FileExistsError):  # the key holds another object: never replaced
        os.rename(m.mnt / "sub" / "moved.txt", m.mnt / "taken.txt")
    # An archive's original keeps its name (it is written inside the archive).
    (m.mnt / "new.tif").write_bytes(corpus[tif].read_bytes())
    wait_for(lambda: not spooled(tmp_path / "spool2"), 60, "new.tif published")
    with pytest.raises(PermissionError):
        os.rename(m.mnt / "new.tif", m.mnt / "renamed.tif")
    # Replaced by another host since this one listed it (listings kept 600 s): left alone.
    assert sorted(os.listdir(m.mnt / "sub")) == ["moved.txt", "other.txt"]
    obstore.put(store, s3_bucket.key("sub/other.txt"), b"replaced by another host\n")
    with pytest.raises(OSError) as err:
        os.unlink(m.mnt / "sub" / "other.txt")
    assert err.value.errno == errno.ESTALE
    time.sleep(1.1)  # the mount's listing is older than its 1 s recheck: the new one shows
    assert (m.mnt / "sub" / "other.txt").read_bytes() == b"replaced by another host\n"
    assert sorted(os.listdir(m.mnt)) == ["new.tif", "sub", "taken.txt"]
    assert sorted(os.listdir(m.mnt / "sub")) == ["moved.txt", "other.txt"]
    assert keys_of(store, s3_bucket.key()) == sorted(
        ["new.tif.zarr.zip", "sub/moved.txt", "sub/other.txt", "taken.txt"]
    )
    assert bytes(obstore.get(store, s3_bucket.key("sub/moved.txt")).bytes()) == b"their notes\n"
    assert bytes(obstore.get(store, s3_bucket.key("taken.txt")).bytes()) == b"taken\n"
    # A second host, listing afresh, sees the same.
    other = bucket_mount(s3_bucket.url(), name="host2")
    assert sorted(os.listdir(other.mnt)) == ["new.tif", "sub", "taken.txt"]
    assert (other.mnt / "sub" / "moved.txt").read_bytes() == b"their notes\n"


def _series_tiff(path: Path, seed: int, shape: tuple[int, ...] = (2, 20, 16)) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(seed).integers(0, 60000, shape, dtype=np.uint16)
    tifffile.imwrite(path, data, photometric="minisblack")
    return path.read_bytes()


def test_rm_of_a_series_member_never_deletes_the_archive_object(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """With --allow-delete, `rm` (and `mv`) of one member of a series shown as a folder is
    EPERM: the member lives inside one object (a consolidated `.zarr.zip`) or beside the
    others under one prefix (`.zarr/`), and deleting that would take the whole series."""
    from vfs.decant.series import PackOptions, pack_series

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    same, mixed = tmp_path / "run1", tmp_path / "run2"
    members = {"a.tif": _series_tiff(same / "a.tif", 1), "b.tif": _series_tiff(same / "b.tif", 2)}
    _series_tiff(mixed / "small.tif", 3, (1, 8, 6))
    (mixed / "notes.txt").write_bytes(b"not a tiff\n")
    pack_series(same, tmp_path / "run1.zarr.zip", PackOptions())
    pack_series(mixed, tmp_path / "run2.zarr", PackOptions())
    obstore.put(store, s3_bucket.key("run1.zarr.zip"), (tmp_path / "run1.zarr.zip").read_bytes())
    nested = tmp_path / "run2.zarr"
    for path in sorted(p for p in nested.rglob("*") if p.is_file()):
        obstore.put(store, s3_bucket.key(f"run2.zarr/{path.relative_to(nested).as_posix()}"),
                    path.read_bytes())  # fmt: skip
    before = keys_of(store, s3_bucket.key())
    m = bucket_mount(s3_bucket.url(), "--spool", str(tmp_path / "spool"), "--allow-delete")
    assert sorted(os.listdir(m.mnt)) == ["run1", "run2"]
    assert sorted(os.listdir(m.mnt / "run1")) == ["a.tif", "b.tif"]
    refused = []
    for act in (lambda: os.unlink(m.mnt / "run1" / "a.tif"),
                lambda: os.unlink(m.mnt / "run2" / "notes.txt"),
                lambda: os.unlink(m.mnt / "run2" / "small.tif"),
                lambda: os.rename(m.mnt / "run1" / "a.tif", m.mnt / "a.tif"),
                lambda: os.rmdir(m.mnt / "run1")):  # fmt: skip
        with pytest.raises(OSError) as err:
            act()
        refused.append(err.value.errno)
    assert refused[:4] == [errno.EPERM] * 4, refused
    assert refused[4] in (errno.EPERM, errno.ENOTEMPTY, errno.ENOTDIR), refused
    assert keys_of(store, s3_bucket.key()) == before
    assert sorted(os.listdir(m.mnt / "run1")) == ["a.tif", "b.tif"]
    for name, data in members.items():
        assert (m.mnt / "run1" / name).read_bytes() == data, name
    assert (m.mnt / "run2" / "notes.txt").read_bytes() == b"not a tiff\n"


@pytest.mark.skipif(
    not os.environ.get("DECANT_SLOW_TESTS"),
    reason="~300 MiB through a mount (25-30 s): DECANT_SLOW_TESTS=1 runs it",
)
def test_a_file_over_256_mib_goes_as_a_multipart_upload(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """Above SINGLE_PUT_MAX (256 MiB) the upload is multipart (16 MiB parts): copied in with
    cp, published, read back through the mount and from the bucket byte-exact. Run with
    `DECANT_SLOW_TESTS=1 pytest tests/s3/test_mount_bucket_write.py -k multipart`."""
    from vfs.stores.upload import SINGLE_PUT_MAX

    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    src = tmp_path / "big.bin"
    digest_in = hashlib.sha256()
    block = np.random.default_rng(3).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    with open(src, "wb") as fh:
        for i in range(300):
            chunk = i.to_bytes(4, "little") + block[4:]  # every MiB differs
            fh.write(chunk)
            digest_in.update(chunk)
    assert src.stat().st_size > SINGLE_PUT_MAX
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool))
    subprocess.run(["cp", str(src), str(m.mnt / "big.bin")], check=True, timeout=120)
    wait_for(lambda: not spooled(spool), 180, "the big file published")
    assert status(m.mnt)["failed"] == []
    assert f"big.bin: {300 << 20} bytes published" in m.log_text()
    meta = obstore.head(store, s3_bucket.key("big.bin"))
    assert meta["size"] == src.stat().st_size
    assert "-" in str(meta["e_tag"])  # a multipart object's ETag: MD5 of the parts, "-N"
    out = subprocess.run(["sha256sum", str(m.mnt / "big.bin")], capture_output=True, text=True)
    assert out.stdout.split()[0] == digest_in.hexdigest()
    got = hashlib.sha256()
    for piece in obstore.get(store, s3_bucket.key("big.bin")):
        got.update(piece)
    assert got.hexdigest() == digest_in.hexdigest()


@pytest.mark.skipif(
    not os.environ.get("DECANT_SLOW_TESTS"),
    reason="~300 MiB through a mount, a restart and a 30 s retry: DECANT_SLOW_TESTS=1 runs it",
)
def test_the_store_killed_during_a_multipart_upload(
    own_server: Any, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """The kill test above, for a multipart upload: a part's PUT is held half-sent while the
    server is SIGKILLed; no object under the key after the restart (the parts of an incomplete
    upload are never visible), then the retry publishes it whole."""
    from tests.s3.stall import StallingProxy

    bucket, store = own_bucket(own_server, "killed-multi")
    src = multipart_file(tmp_path / "big.bin", 5)
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    proxy = StallingProxy(own_server.s3_port, b"/p/big.bin?partNumber=")
    try:
        spool = tmp_path / "spool"
        m = bucket_mount(f"s3://{bucket}/p", "--spool", str(spool), "--s3-endpoint",
                         proxy.endpoint, "--s3-timeout", "5", "--s3-retries", "0")  # fmt: skip
        subprocess.run(["cp", str(src), str(m.mnt / "big.bin")], check=True, timeout=120)
        assert proxy.stalled.wait(60), "no part upload started"
        own_server.proc.kill()
        own_server.proc.wait(timeout=10)
        proxy.release.set()
        wait_for(lambda: [f["path"] for f in status(m.mnt)["failed"]] == ["big.bin"], 60,
                 "the upload failed")  # fmt: skip
        assert spooled(spool) == ["big.bin"]
        own_server.start()
        assert [f["path"] for f in status(m.mnt)["failed"]] == ["big.bin"]
        assert keys_of(store, "p") == []
        wait_for(lambda: not spooled(spool), 180, "published after the restart")
        assert keys_of(store, "p") == ["big.bin"]
        out = subprocess.run(["sha256sum", str(m.mnt / "big.bin")], capture_output=True,
                             text=True)  # fmt: skip
        assert out.stdout.split()[0] == want
    finally:
        proxy.close()


def test_a_name_with_a_backslash_is_refused_on_a_bucket_mount(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """SeaweedFS (like other object stores) takes a backslash in a key for "/": `a\\b.txt`
    written through the mount was published as `a/b.txt`, gone from where it was written (and
    the log named a key that does not exist). Such names are refused (EINVAL) on a bucket
    mount, when created or renamed to; other names still work (positive control)."""
    m = bucket_mount(s3_bucket.url(), "--spool", str(tmp_path / "spool"))
    with pytest.raises(OSError) as err:
        (m.mnt / "a\\b.txt").write_bytes(b"x")
    assert err.value.errno == errno.EINVAL
    (m.mnt / "ab.txt").write_bytes(b"x")
    with pytest.raises(OSError) as err:
        os.rename(m.mnt / "ab.txt", m.mnt / "a\\b.txt")
    assert err.value.errno == errno.EINVAL
    assert sorted(os.listdir(m.mnt)) == ["ab.txt"]


@pytest.mark.parametrize("change", ["removed", "written to"])
def test_a_multipart_upload_stops_when_its_spooled_file_changes(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Red team 50s: the spooled file removed (or written to) while its multipart upload ran
    left the upload running to its end. The placer's check before each part now sees the
    spooled file is not what it began to upload: the upload stops, nothing is published, and
    the spool reports the change (the ingest then sees it vanished, or waits for it to settle)."""
    import functools

    from vfs.ingest.bucket import BucketPlacer
    from vfs.ingest.publish import SourceChangedError
    from vfs.ingest.spool import Spool
    from vfs.stores import upload
    from vfs.stores.base import ObjectPath
    from vfs.stores.s3 import S3Folder

    folder = S3Folder(s3_bucket.url())
    spool = Spool(ObjectPath.of_url(s3_bucket.url()), tmp_path / "files", tmp_path / "staging")
    spool.placer = BucketPlacer(folder)
    spooled = tmp_path / "files" / "big.bin"
    spooled.write_bytes(np.random.default_rng(5).bytes(12 << 20))
    checks: list[int] = []
    put = upload.put_verified

    def small_parts(*args: Any, check: Callable[[], None], **kw: Any) -> Any:
        def then_change() -> None:
            checks.append(1)
            if len(checks) == 2:  # the first part was read
                if change == "removed":
                    spooled.unlink()
                else:
                    with spooled.open("r+b") as fh:
                        fh.write(b"later")
            check()

        return put(*args, single_put_max=1 << 20, chunk_size=5 << 20, check=then_change, **kw)

    monkeypatch.setattr(upload, "put_verified", functools.partial(small_parts))
    with pytest.raises(SourceChangedError):
        spool.publish("big.bin", False, None)
    assert len(checks) == 2  # stopped at the first check after the change
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    assert keys_of(store, s3_bucket.key()) == []  # nothing published, no half object


def test_rm_through_the_mount_during_a_multipart_upload_stops_it(
    own_server: Any, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """Red team 50s, F4, through a real mount: a part's PUT is held half-sent, the file is
    removed through the mount meanwhile, and the part let go. The upload stops at its next part
    (it ran to its end before): no object under the key, nothing left spooled or failed, and
    the mount still serves."""
    from tests.s3.stall import StallingProxy

    bucket, store = own_bucket(own_server, "rm-multi")
    src = multipart_file(tmp_path / "big.bin", 7)
    proxy = StallingProxy(own_server.s3_port, b"/p/big.bin?partNumber=")
    try:
        spool = tmp_path / "spool"
        m = bucket_mount(f"s3://{bucket}/p", "--spool", str(spool), "--s3-endpoint",
                         proxy.endpoint)  # fmt: skip
        subprocess.run(["cp", str(src), str(m.mnt / "big.bin")], check=True, timeout=120)
        assert proxy.stalled.wait(60), "no part upload started"
        (m.mnt / "big.bin").unlink()
        # Noted before the rm was answered: a kill from here on leaves the next start to
        # delete what this upload may still complete (red team 60, F1).
        notes = [json.loads(line) for line in (spool / "published.jsonl").read_text().splitlines()]
        assert [n[0] for n in notes if n[2] == -2 and n[6:]] == ["big.bin"]
        proxy.release.set()
        wait_for(lambda: not spooled(spool), 60, "the removed file gone from the spool")
        time.sleep(2)  # an upload left running would complete within this
        assert keys_of(store, "p") == []
        assert status(m.mnt)["failed"] == []
        log = m.log_text()
        assert f"big.bin: {272 << 20} bytes published" not in log
        # Before, every part went up, the object was published and read back against the
        # removed file, and only then deleted ("deleted the upload that failed its check").
        assert "deleted the upload" not in log
        (m.mnt / "small.txt").write_bytes(b"still served\n")
        wait_for(lambda: keys_of(store, "p") == ["small.txt"], 60, "a later file published")
    finally:
        proxy.close()


def test_a_file_under_an_archive_s_name_reads_back_under_it_from_the_bucket(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """As on a local SRC (tests/mount/test_redteam56.py): `x.zarr.zip` written in is uploaded
    wrapped in a verbatim archive, not as a plain object the bucket would show as `x`."""
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})
    data = os.urandom(50_000)
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool))
    (m.mnt / "x.zarr.zip").write_bytes(data)
    wait_for(lambda: not spooled(spool), 60, "the spool drained")
    assert keys_of(store, s3_bucket.key()) == ["x.zarr.zip.zarr.zip"]
    assert os.listdir(m.mnt) == ["x.zarr.zip"]
    assert (m.mnt / "x.zarr.zip").read_bytes() == data
