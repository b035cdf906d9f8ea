"""Red team, round 34: bucket mounts and `decant … s3://` attacked through real mounts."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import obstore
import pytest

from tests.mount.conftest import HAVE_FUSE, User, unprivileged
from tests.s3.conftest import MountFactory, S3Bucket, client
from tests.s3.stall import PassingProxy, StallingProxy, _shut
from tests.s3.test_mount_bucket_write import digest, spooled, status, wait_for

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

__all__ = ["unprivileged"]  # the fixture, imported for the tests below
ROOT = Path(__file__).resolve().parents[2]


def test_the_daemon_runs_this_checkout(s3_bucket: S3Bucket, bucket_mount: MountFactory) -> None:
    obstore.put(client(s3_bucket), s3_bucket.key("a.txt"), b"a\n")
    m = bucket_mount(s3_bucket.url())
    assert m.proc is not None
    assert Path(f"/proc/{m.proc.pid}/cwd").resolve() == ROOT
    out = subprocess.run([sys.executable, "-c", "import vfs; print(vfs.__file__)"],
                         capture_output=True, text=True, cwd=ROOT, check=True)  # fmt: skip
    assert out.stdout.strip() == str(ROOT / "vfs" / "__init__.py")
    assert (m.mnt / "a.txt").read_bytes() == b"a\n"


def test_a_private_folder_made_through_a_bucket_mount_stays_private(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path, unprivileged: User
) -> None:
    """`mkdir -m 700` through the mount, a 0644 file in it (umask 022): another local user may
    not read it, while it is spooled nor once it is published (the folder then lives on as a
    prefix of the bucket)."""
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "-o", "allow_other", "--spool", str(spool),
                     "--settle", "4", "--relist", "1")  # fmt: skip
    private = m.mnt / "private"
    os.mkdir(private, 0o700)
    (private / "notes.txt").write_bytes(b"root's notes\n")
    os.chmod(private / "notes.txt", 0o644)
    notes = private / "notes.txt"

    def outsider_reads() -> list[int]:
        return [unprivileged.errno_of("os.listdir(p)", p=private),
                unprivileged.errno_of("read(p)", p=notes)]  # fmt: skip

    time.sleep(1.5)  # the kernel's attributes of the new folder expire
    assert outsider_reads() == [13, 13], "spooled"
    wait_for(lambda: not spooled(spool), 60, "notes.txt published")
    listed = [m["path"] for batch in obstore.list(client(s3_bucket), prefix=s3_bucket.key())
              for m in batch]  # fmt: skip
    assert listed == [s3_bucket.key("private/notes.txt")]
    time.sleep(2.5)  # relisted, and the kernel's attributes expired
    assert (notes).read_bytes() == b"root's notes\n"
    assert outsider_reads() == [13, 13], "published"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700


def bucket_keys(bucket: S3Bucket) -> list[str]:
    found = obstore.list(client(bucket), prefix=bucket.key() + "/")
    return sorted(m["path"][len(bucket.key()) + 1 :] for batch in found for m in batch)


def test_files_in_dot_folders_are_published_under_their_own_names(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """`.git/config`, `.snakemake/log.txt`, `run./data.txt`: uploaded to the keys of their own
    paths, and shown there once published."""
    want = {".git/config": b"[core]\n", ".snakemake/log/run.txt": b"log\n" * 50,
            "run./data.txt": b"data\n", "a/b../c.txt": b"c\n"}  # fmt: skip
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool), "--settle", "0.2")
    for rel, data in want.items():
        (m.mnt / rel).parent.mkdir(parents=True, exist_ok=True)
        (m.mnt / rel).write_bytes(data)
    wait_for(lambda: not spooled(spool), 60, "the spool drained")
    keys = bucket_keys(s3_bucket)
    assert keys == sorted(want), keys
    for rel, data in want.items():
        assert (m.mnt / rel).read_bytes() == data, rel


def cache_entries(folder: Path) -> dict[str, bytes]:
    """The disk cache's entries: name → the range's bytes (the trailer cut off)."""
    names = [p for p in folder.iterdir() if len(p.name) == 64]
    return {p.name: p.read_bytes()[:-8] for p in names}


def test_a_disk_cache_entry_under_another_entrys_name_is_not_served(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """Two entries of the same size swapped while the daemon is down (a restore from a backup,
    a copy): each still carries the xxh3 of its bytes, but they are another range's bytes.
    The objects are smaller than one read of the kernel's (128 KiB), so each is fetched and
    cached as one range, the same for both: objects of 300 KB were cached in ranges that
    depend on how the kernel's reads and read-ahead fell (one range for one, two for the
    other, on a new machine), and then no range of one was the other's to swap."""
    a, b = os.urandom(100_000), os.urandom(100_000)
    store = client(s3_bucket)
    obstore.put(store, s3_bucket.key("a.bin"), a)
    obstore.put(store, s3_bucket.key("b.bin"), b)
    cache = tmp_path / "disk-cache"
    m = bucket_mount(s3_bucket.url(), "--disk-cache", str(cache))
    assert (m.mnt / "a.bin").read_bytes() == a and (m.mnt / "b.bin").read_bytes() == b
    m.stop()
    entries = cache_entries(cache)
    of_a = {(a.find(data), len(data)): name for name, data in entries.items() if data in a}
    of_b = {(b.find(data), len(data)): name for name, data in entries.items() if data in b}
    same = sorted(set(of_a) & set(of_b))
    assert same, (of_a, of_b)
    for at in same:  # each range of a.bin swapped with the same range of b.bin
        ea, eb = cache / of_a[at], cache / of_b[at]
        os.rename(ea, cache / "swap")
        os.rename(eb, ea)
        os.rename(cache / "swap", eb)
    m2 = bucket_mount(s3_bucket.url(), "--disk-cache", str(cache), name="mnt2")
    got = (m2.mnt / "a.bin").read_bytes()
    wrong = sum(x != y for x, y in zip(got, a, strict=True))
    assert got == a, f"a.bin served {wrong} wrong bytes"
    assert (m2.mnt / "b.bin").read_bytes() == b


class HoldingProxy(StallingProxy):
    """A loopback proxy (tests/s3/stall.py) that holds the first GET whose head holds `marker`
    (a Range header) until `release` is set, then passes it on; everything else passes."""

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(1 << 16)
                    if not data:
                        return _shut(client, server)
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for f in head.split(b"\r\n")[1:]:
                    name, _, value = f.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                with self._lock:
                    hold = self._armed and head.startswith(b"GET ") and self.marker in head
                    self._armed = self._armed and not hold
                if hold:
                    self.held = head
                    self.stalled.set()
                    self.release.wait()
                server.sendall(head + b"\r\n\r\n")
                while length:
                    if not buf:
                        buf = client.recv(1 << 16)
                        if not buf:
                            return _shut(client, server)
                    part, buf = buf[:length], buf[length:]
                    server.sendall(part)
                    length -= len(part)
        except OSError:
            _shut(client, server)


def test_a_file_written_to_while_it_is_published_ends_in_the_bucket_as_written(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """A file reopened and changed through the mount while its upload is read back (a program
    that rewrites its header after closing the file): its newer bytes end in the bucket and the
    spool drains, as on a local SRC; the older upload is not taken for another host's."""
    store = client(s3_bucket)
    spool = tmp_path / "spool"
    port = int(s3_bucket.endpoint.rsplit(":", 1)[1])
    proxy = HoldingProxy(port, b"bytes=8388608-")  # the read-back's second 8 MiB block
    try:
        m = bucket_mount(s3_bucket.url(), "--spool", str(spool), "--settle", "0.5",
                         "--retry-after", "2", "--s3-endpoint", proxy.endpoint)  # fmt: skip
        data = bytearray(os.urandom(24 << 20))
        (m.mnt / "big.bin").write_bytes(data)
        assert proxy.stalled.wait(60), "no read-back"
        # Its first block compared, the upload being read back: the file is written to.
        fd = os.open(m.mnt / "big.bin", os.O_WRONLY)
        try:
            os.pwrite(fd, b"NEW!", 0)
        finally:
            os.close(fd)
        data[:4] = b"NEW!"
    finally:
        proxy.release.set()
    deadline = time.monotonic() + 60
    while spooled(spool):
        assert time.monotonic() < deadline, f"still spooled: {status(m.mnt)['failed']}"
        time.sleep(0.2)
    got = bytes(obstore.get(store, s3_bucket.key("big.bin")).bytes())
    assert digest(got) == digest(bytes(data)), "the bucket holds the older bytes"
    assert digest((m.mnt / "big.bin").read_bytes()) == digest(bytes(data))
    proxy.close()


def test_a_bucket_folder_written_into_stays_the_daemons_and_closed_to_others(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path, unprivileged: User
) -> None:
    """A folder of the bucket (another host's upload) that root writes a file into gets a spool
    folder, made by the daemon whatever its umask: it still shows 0555 or 0755, the daemon's,
    so no other local user may add files there."""
    obstore.put(client(s3_bucket), s3_bucket.key("shared/other.txt"), b"theirs\n")
    spool = tmp_path / "spool"
    old = os.umask(0)  # a daemon started with umask 0 (the mount inherits this process's)
    try:
        m = bucket_mount(s3_bucket.url(), "-o", "allow_other", "--spool", str(spool),
                         "--settle", "30", "--relist", "1")  # fmt: skip
    finally:
        os.umask(old)
    shared = m.mnt / "shared"
    (shared / "mine.txt").write_bytes(b"root's\n")
    obstore.put(client(s3_bucket), s3_bucket.key("other.txt"), b"relisted\n")
    wait_for(lambda: "other.txt" in os.listdir(m.mnt), 10, "the top folder listed again")
    time.sleep(1.5)  # the kernel's attributes expire
    assert stat.S_IMODE(os.stat(shared).st_mode) & 0o022 == 0, oct(os.stat(shared).st_mode)
    assert unprivileged.errno_of("write(p)", p=shared / "evil.txt") == 13


def test_names_a_bucket_cannot_hold_are_refused_not_spooled_for_good(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """A name with a control character, or not UTF-8, can never be a key obstore uploads (nor
    one a listing shows): refused at once (EINVAL), as a backslash is, not spooled and failed
    at every retry for good while `cp` and `rsync` report success."""
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool), "--settle", "0.2")
    (m.mnt / "ok.txt").write_bytes(b"ok\n")
    got = {}
    for name in (b"a\nb.txt", b"c\x01.txt", b"d\x7f.txt", b"e\r.txt", b"\xff.txt"):
        try:
            with open(os.fsencode(m.mnt) + b"/" + name, "wb") as fh:
                fh.write(b"data\n")
            got[name] = 0
        except OSError as exc:
            got[name] = exc.errno or 0
    assert got == dict.fromkeys(got, errno.EINVAL), got
    wait_for(lambda: not spooled(spool), 30, f"the spool drained: {spooled(spool)}")
    assert bucket_keys(s3_bucket) == ["ok.txt"]


def test_a_tiff_whose_archive_name_is_too_long_stays_visible(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path, corpus: dict[str, Path]
) -> None:
    """TIFFs of long names: one of 250 bytes, whose NAME.zarr.zip (259 bytes) no mount would
    show, is published as it is (as on a local SRC); one of 240 bytes is packed, its archive
    staged under a temp name within NAME_MAX. Both read back through the mount."""
    tif = corpus["striped_i16.tif"].read_bytes()
    names = ["t" * 246 + ".tif", "u" * 236 + ".tif"]
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "--spool", str(spool), "--settle", "0.2")
    for name in names:
        (m.mnt / name).write_bytes(tif)
    deadline = time.monotonic() + 60
    while spooled(spool):
        assert time.monotonic() < deadline, f"still spooled: {status(m.mnt)['failed']}"
        time.sleep(0.2)
    assert bucket_keys(s3_bucket) == sorted([names[0], names[1] + ".zarr.zip"])
    time.sleep(1.5)  # the kernel's entries expire
    for name in names:
        assert digest((m.mnt / name).read_bytes()) == digest(tif)


def test_a_private_file_renamed_in_the_bucket_stays_private(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path, unprivileged: User
) -> None:
    """A 0600 file published through the mount, then renamed (`mv`, --allow-delete: a copy and
    a delete in the bucket): the new name keeps its mode and owner on this host."""
    spool = tmp_path / "spool"
    m = bucket_mount(s3_bucket.url(), "-o", "allow_other", "--spool", str(spool),
                     "--settle", "0.2", "--allow-delete")  # fmt: skip
    fd = os.open(m.mnt / "secret.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"root's secret\n")
    finally:
        os.close(fd)
    wait_for(lambda: not spooled(spool), 60, "published")
    time.sleep(1.5)
    assert unprivileged.errno_of("read(p)", p=m.mnt / "secret.txt") == errno.EACCES
    os.rename(m.mnt / "secret.txt", m.mnt / "moved.txt")
    assert bucket_keys(s3_bucket) == ["moved.txt"]
    time.sleep(1.5)  # the kernel's attributes expire
    assert (m.mnt / "moved.txt").read_bytes() == b"root's secret\n"
    assert unprivileged.errno_of("read(p)", p=m.mnt / "moved.txt") == errno.EACCES
    assert stat.S_IMODE(os.stat(m.mnt / "moved.txt").st_mode) == 0o600


class RewritingProxy(PassingProxy):
    """A loopback proxy that stands for another store (or one an attacker on the path of an
    http:// endpoint answers for): it passes requests on and replaces `old` by `new` (of the
    same length) in what the store answers, headers (ETag, Last-Modified) untouched."""

    def __init__(self, upstream: int, old: bytes, new: bytes) -> None:
        super().__init__(upstream)
        self.old, self.new = old, new

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 20):
                dst.sendall(data.replace(self.old, self.new))
        _shut(src, dst)


def test_a_disk_cache_shared_by_mounts_of_two_stores_serves_each_its_own_bytes(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """Two mounts of one bucket name at two endpoints, one --disk-cache folder: what one store
    answered (here another store, or an attacker on the path of an http:// endpoint, which
    answers with the trusted object's ETag and Last-Modified) is never served as the other's."""
    data = b"TRUSTED-CONTENT " * 4096
    obstore.put(client(s3_bucket), s3_bucket.key("x.bin"), data)
    cache = tmp_path / "disk-cache"
    port = int(s3_bucket.endpoint.rsplit(":", 1)[1])
    proxy = RewritingProxy(port, b"TRUSTED-CONTENT ", b"EVIL!!!-CONTENT ")
    try:
        other = bucket_mount(s3_bucket.url(), "--disk-cache", str(cache),
                             "--s3-endpoint", proxy.endpoint, name="other")  # fmt: skip
        assert (other.mnt / "x.bin").read_bytes() != data  # that store's bytes
        other.stop()
    finally:
        proxy.close()
    m = bucket_mount(s3_bucket.url(), "--disk-cache", str(cache))
    got = (m.mnt / "x.bin").read_bytes()
    assert got == data, f"served {got[:16]!r}…"


def test_two_mounts_given_one_spool_never_publish_each_others_files(
    s3_bucket: S3Bucket, bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """Two bucket mounts of two prefixes started with the same `--spool` (the README's example
    path for both): a file written into one and still spooled when the other starts is never
    shown by the other nor uploaded under its prefix. The second is refused at start, or keeps
    to its own files."""
    spool = tmp_path / "spool"
    a = bucket_mount(s3_bucket.url("p1"), "--spool", str(spool), "--settle", "8", name="a")
    (a.mnt / "x.txt").write_bytes(b"for p1\n")
    try:
        b = bucket_mount(s3_bucket.url("p2"), "--spool", str(spool), "--settle", "0.2",
                         "--relist", "1", name="b")  # fmt: skip
    except AssertionError as refused:  # exited at start, saying why
        assert "spool" in str(refused), refused
        b = None
    if b is not None:
        time.sleep(3)
        assert "x.txt" not in os.listdir(b.mnt), f"mount b shows a's file: {bucket_keys(s3_bucket)}"
    wait_for(lambda: not spooled(spool), 30, "published")
    assert bucket_keys(s3_bucket) == ["p1/x.txt"]


def test_two_local_mounts_given_one_spool_never_publish_each_others_files(
    bucket_mount: MountFactory, tmp_path: Path
) -> None:
    """The same with two local SRC folders: a file written into the first mount and still
    spooled when the second starts was published into the second's SRC."""
    s1, s2, spool = tmp_path / "s1", tmp_path / "s2", tmp_path / "spool"
    s1.mkdir()
    s2.mkdir()
    a = bucket_mount(s1, "--spool", str(spool), "--settle", "8", name="a")
    (a.mnt / "x.txt").write_bytes(b"for s1\n")
    try:
        b = bucket_mount(s2, "--spool", str(spool), "--settle", "0.2", name="b")
    except AssertionError as refused:  # exited at start, saying why
        assert "spool" in str(refused), refused
        b = None
    if b is not None:
        time.sleep(3)
        assert "x.txt" not in os.listdir(b.mnt), f"published into s2: {os.listdir(s2)}"
    wait_for(lambda: (s1 / "x.txt").exists(), 30, "published into s1")
    assert not (s2 / "x.txt").exists()
