"""Red team, round 30: hostile archives served from a bucket, read through a real mount."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import mmap
import os
import struct
import subprocess
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from tests.mount.conftest import HAVE_FUSE, Mount
from tests.s3.conftest import S3Bucket
from tests.toolbox import load_tool, proc_status
from vfs.decant.packer import PackResult

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

GOOD_D = "imagej_hyperstack_tzc_u16.tif"
GOOD_V = "zlib_u16.tif"
CACHE_MIB = 64
RSS_LIMIT_MIB = 600  # as the local hostile test: the daemon's own ~300 MiB, the cache, 150 MiB


def cat(path: Path) -> bytes:
    out = subprocess.run(["cat", str(path)], capture_output=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def client(bucket: S3Bucket) -> S3Store:
    return S3Store(bucket.name, client_options={"allow_http": True})


@pytest.fixture
def bucket_mount(tmp_path: Path) -> Iterator[Callable[..., Mount]]:
    mounts: list[Mount] = []

    def factory(url: str, *extra: str, name: str = "mnt") -> Mount:
        m = Mount(url, tmp_path / name, tmp_path / f"{name}.log", tmp_path / f"{name}-index")  # type: ignore[arg-type]
        mounts.append(m)
        return m.start(*extra)

    yield factory
    for m in mounts:
        m.stop()


def _eocd(data: bytes) -> int:
    at = data.rfind(b"PK\x05\x06")
    assert at >= 0
    return at


def _cd(data: bytes) -> int:
    return struct.unpack_from("<L", data, _eocd(data) + 16)[0]


def zip_lies(good: bytes) -> dict[str, bytes]:
    """Zips whose end record or central directory lie, each made from `good` by one edit."""
    out: dict[str, bytes] = {}
    e = _eocd(good)
    cd = _cd(good)

    def eocd(fmt: str, at: int, value: int) -> bytes:
        raw = bytearray(good)
        struct.pack_into(fmt, raw, e + at, value)
        return bytes(raw)

    out["cd-offset-past-end"] = eocd("<L", 16, len(good) + 1000)
    out["cd-size-past-end"] = eocd("<L", 12, 0x7FFF_FFFF)
    entries = bytearray(eocd("<H", 8, 0xFFFF))
    struct.pack_into("<H", entries, e + 10, 0xFFFF)
    out["entries-65535"] = bytes(entries)
    # the first central record's local header offset, and its sizes, past the object
    raw = bytearray(good)
    names = []
    at = cd
    while raw[at : at + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack_from("<3H", raw, at + 28)
        names.append((at, bytes(raw[at + 46 : at + 46 + nlen])))
        at += 46 + nlen + xlen + clen
    chunk_rec = next(a for a, n in names if n.startswith(b"0/") and b"/." not in n)
    off = bytearray(good)
    struct.pack_into("<L", off, chunk_rec + 42, len(good) + 10)
    out["entry-offset-past-end"] = bytes(off)
    size = bytearray(good)
    struct.pack_into("<L", size, chunk_rec + 20, 0x7FFF_0000)  # compressed size
    struct.pack_into("<L", size, chunk_rec + 24, 0x7FFF_0000)
    out["entry-size-past-end"] = bytes(size)
    # a comment of 65,535 bytes: valid, and must read as the good archive
    com = bytearray(good)
    struct.pack_into("<H", com, e + 20, 0xFFFF)
    out["comment-64k"] = bytes(com) + b"\0" * 0xFFFF
    out["truncated-half"] = good[: len(good) // 2]
    out["tail-only"] = good[cd:]
    return out


def test_hostile_archives_in_a_bucket_fail_alone(
    s3_bucket: S3Bucket,
    packed_corpus: dict[str, PackResult],
    corpus: dict[str, Path],
    tmp_path: Path,
    bucket_mount: Callable[..., Mount],
) -> None:
    store = client(s3_bucket)
    for name, result in packed_corpus.items():
        obstore.put(store, s3_bucket.key(f"good/{name}.zarr.zip"), result.archive.read_bytes())
    made = load_tool("fuzz").headline_cases(
        packed_corpus[GOOD_D].archive, packed_corpus[GOOD_V].archive, tmp_path / "hostile"
    )
    hostile = {case: path.read_bytes() for case, path in made.items()}
    hostile.update(zip_lies(packed_corpus[GOOD_D].archive.read_bytes()))
    for case, data in hostile.items():
        obstore.put(store, s3_bucket.key(f"hostile/{case}/{GOOD_D}.zarr.zip"), data)
    for case, path in made.items():  # the same edits as NAME.zarr/ key prefixes
        with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as zf:
            for info in zf.infolist():
                key = f"hostile/dir-{case}/{GOOD_D}.zarr/{info.filename}"
                obstore.put(store, s3_bucket.key(key), zf.read(info))
        hostile[f"dir-{case}"] = b""

    m = bucket_mount(s3_bucket.url(), "--cache-size", f"{CACHE_MIB}M", "--no-index")
    assert m.proc is not None
    results: dict[str, str] = {}

    def hammer(case: str) -> None:
        folder = m.mnt / "hostile" / case
        try:
            shown = os.listdir(folder)
            got = []
            for name in shown:
                try:
                    data = (folder / name).read_bytes()
                    ok = data == (corpus[GOOD_D].read_bytes() if name == GOOD_D else hostile[case])
                    got.append(f"{name}:{'same' if ok else 'DIFFERENT'}")
                except OSError as exc:
                    got.append(f"{name}:{errno.errorcode.get(exc.errno or 0)}")
            results[case] = " ".join(got)
        except BaseException as exc:
            results[case] = f"listing: {exc!r}"

    threads = [threading.Thread(target=hammer, args=(case,)) for case in hostile]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # Each one fails alone: shown raw (its own bytes) or as its original that gives EIO;
    # one holding no lie to the reader (a long comment, a wrong entry count) reads byte-exact.
    wrong = {c: r for c, r in results.items() if "DIFFERENT" in r or "listing" in r or not r}
    assert not wrong, wrong
    for case in ("comment-64k", "entries-65535"):
        assert results[case] == f"{GOOD_D}:same", results[case]
    for name, path in sorted(corpus.items()):
        got = hashlib.sha256((m.mnt / "good" / name).read_bytes()).hexdigest()
        assert got == hashlib.sha256(path.read_bytes()).hexdigest(), name
    assert m.proc.poll() is None, "the daemon exited"
    hwm = proc_status(m.proc.pid, "VmHWM") >> 20
    print(f"daemon VmHWM {hwm} MiB; {json.dumps(results, indent=1)}")
    log = m.log_text()
    assert "Traceback" not in log
    for case, result in results.items():
        if "EIO" in result:  # the log names the key
            assert f"hostile/{case}/{GOOD_D}.zarr" in log, case
    assert hwm < RSS_LIMIT_MIB


# Two 128-byte blocks with one MD5 (Wang et al. 2004, as printed in Wikipedia's "MD5"); followed
# by the same bytes, whole objects keep the one MD5: an S3 ETag (the MD5 of a single-PUT body).
MD5_A = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70"
)
MD5_B = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70"
)


def test_an_object_replaced_by_one_of_the_same_md5_is_not_served_from_the_disk_cache(
    s3_bucket: S3Bucket, tmp_path: Path, bucket_mount: Callable[..., Mount]
) -> None:
    """--disk-cache keyed ranges by URL, ETag and range. A single PUT's ETag is the MD5 of its
    body, and two bodies of one MD5 are easy to make: an object rewritten with such a twin
    (a later Last-Modified, the same ETag) was served after a remount as the bytes kept from
    the first one, without an error."""
    tail = os.urandom(200_000)
    first, second = MD5_A + tail, MD5_B + tail
    assert first != second and hashlib.md5(first).digest() == hashlib.md5(second).digest()
    store = client(s3_bucket)
    key = s3_bucket.key("blob.bin")
    obstore.put(store, key, first)
    etag = obstore.head(store, key)["e_tag"]
    cache = tmp_path / "ranges"
    m = bucket_mount(s3_bucket.url(), "--disk-cache", str(cache), "--no-index")
    assert cat(m.mnt / "blob.bin") == first
    m.stop()
    assert any(cache.iterdir()), "nothing was kept"
    time.sleep(1.1)  # Last-Modified has whole seconds
    obstore.put(store, key, second)
    assert obstore.head(store, key)["e_tag"] == etag  # the store cannot tell them apart by it
    again = bucket_mount(s3_bucket.url(), "--disk-cache", str(cache), "--no-index", name="again")
    assert cat(again.mnt / "blob.bin") == second, "the first body's kept ranges were served"


def test_an_object_replaced_under_an_open_file_by_one_of_the_same_md5_gives_estale(
    s3_bucket: S3Bucket, bucket_mount: Callable[..., Mount]
) -> None:
    """Ranged GETs are pinned to the ETag the open's HEAD gave (If-Match): an object replaced
    while open gives ESTALE, never mixed bytes. An object rewritten with a body of the same MD5
    keeps its ETag, so the pin held and the open went on with the new body's bytes (O_DIRECT
    reads, so each reaches the daemon): the first half of the first 128 bytes of one body, the
    second half of the other's, which neither holds. Its Last-Modified moved."""
    tail = os.urandom(100_000)
    first, second = MD5_A + tail, MD5_B + tail
    store = client(s3_bucket)
    key = s3_bucket.key("blob.bin")
    obstore.put(store, key, first)
    m = bucket_mount(s3_bucket.url(), "--no-index")
    fd = os.open(m.mnt / "blob.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 4096)  # aligned, as O_DIRECT may want
        assert os.preadv(fd, [memoryview(buf)[:64]], 0) == 64
        head = bytes(buf[:64])
        assert head == first[:64]
        time.sleep(1.1)  # Last-Modified has whole seconds
        obstore.put(store, key, second)
        try:
            got = os.preadv(fd, [memoryview(buf)[:64]], 64)
        except OSError as exc:
            assert exc.errno == errno.ESTALE, exc
        else:
            served = head + bytes(buf[:got])
            assert served == first[:128], (
                "one open served bytes of two bodies: "
                f"{'the second' if served == second[:128] else 'neither'}'s at 64"
            )
    finally:
        os.close(fd)
    assert cat(m.mnt / "blob.bin") == second  # a new open: the new body


def test_the_disk_cache_deletes_no_file_it_did_not_write(
    s3_bucket: S3Bucket, tmp_path: Path, bucket_mount: Callable[..., Mount]
) -> None:
    """--disk-cache DIR evicts least recently used entries, by file mtime, down to
    --disk-cache-size. It counted and evicted every file in DIR, its own or not: pointed at a
    folder that holds anything else (the operator's, or a cache folder shared with another
    tool), its start deleted the oldest of those files, and its `.tmp-*` files."""
    data = os.urandom(300_000)
    obstore.put(client(s3_bucket), s3_bucket.key("blob.bin"), data)
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)
    theirs = {"notes.txt": os.urandom(2 << 20), ".tmp-draft": b"draft\n"}
    for name, body in theirs.items():
        (folder / name).write_bytes(body)
        os.utime(folder / name, (1e9, 1e9))  # the oldest there: evicted first
    m = bucket_mount(s3_bucket.url(), "--disk-cache", str(folder), "--disk-cache-size", "1M",
                     "--no-index")  # fmt: skip
    assert cat(m.mnt / "blob.bin") == data
    m.stop()
    kept = {name: (folder / name).read_bytes() for name in theirs if (folder / name).exists()}
    assert kept == theirs, f"deleted: {sorted(set(theirs) - set(kept))}"
