"""GDI `.tar.c4gh` packages through a real mount: member trees, xattrs, keys and hostile inputs.

Expected values come from what was handed to the crypt4gh library (the TAR plaintext and its
members), `tarfile`, hashlib, the public key files written and pyarrow of the table written;
never from vfs. The daemon's segment counter is read from its DEBUG log (one line a decryption).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tifffile

from tests.conftest import load_tool
from tests.mount.conftest import Mount, is_mounted, settle
from vfs.decant.packer import pack_file

corpus: ModuleType = load_tool("make_c4gh_corpus")

SEG = 65536
CIPHER_SEG = SEG + 28
PASSPHRASE = "mount tests: correct horse battery staple"
DAEMON = [sys.executable, "-m", "vfs.cli"]
PACKAGE_MTIME_NS = 1_700_000_000_123_456_789
MakeMount = Callable[..., Mount]
Members = list[tuple[str, bytes]]


# -- independent helpers -------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pem_key(path: Path) -> bytes:
    """The raw key in a PEM file (public key files hold the 32-byte X25519 key itself)."""
    lines = path.read_bytes().split(b"\n")
    return base64.b64decode(b"".join(line for line in lines if line and b"-----" not in line))


def writer_fingerprint(key: Any) -> str:
    """`sha256:` + hex SHA-256 of the raw public key, read back from the .pub file written."""
    return "sha256:" + sha256(pem_key(key.public_path))


def tar_layout(plaintext: bytes) -> dict[str, tarfile.TarInfo]:
    """Every regular member of a TAR by name, as `tarfile` reads it (offsets included)."""
    with tarfile.open(fileobj=io.BytesIO(plaintext)) as tar:
        return {m.name: m for m in tar.getmembers() if m.isreg()}


def files_under(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def log_lines(m: Mount, *needles: str) -> list[str]:
    return [line for line in m.log_text().splitlines() if all(n in line for n in needles)]


def decrypted(m: Mount, package: str) -> list[int]:
    """Segment numbers the daemon decrypted for `package` (log order), from its DEBUG lines."""
    pattern = re.compile(rf"/{re.escape(package)}: decrypted segment (\d+) \((\d+) for this")
    found = [pattern.search(line) for line in m.log_text().splitlines()]
    hits = [(int(x.group(1)), int(x.group(2))) for x in found if x]
    # Threads log in any order, but the counter reached each value exactly once.
    assert sorted(n for _seg, n in hits) == list(range(1, len(hits) + 1))
    return [seg for seg, _n in hits]


def pread_random(path: Path, size: int, offset: int) -> bytes:
    """One pread with kernel read-ahead off, so the daemon sees exactly the range asked for."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def eio(path: Path, size: int, offset: int) -> bool:
    try:
        pread_random(path, size, offset)
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
        return True
    return False


def exact_or_eio(path: Path, size: int, offset: int, want: bytes) -> bool:
    """A small read of a member with a damaged segment elsewhere serves its own bytes until the
    member's background check meets the damage, and EIO from then on: never other bytes."""
    try:
        return pread_random(path, size, offset) == want
    except OSError as exc:
        return exc.errno == errno.EIO


def segment_inside(layout: tarfile.TarInfo, at: float) -> int:
    """A segment lying wholly inside a member's data, near fraction `at` of it."""
    first = -(-layout.offset_data // SEG)
    last = (layout.offset_data + layout.size) // SEG - 1
    assert first <= last, f"{layout.name} spans no whole segment"
    return min(max(first, (layout.offset_data + int(layout.size * at)) // SEG), last)


def parquet_table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "POS": np.sort(rng.integers(1, 10**8, rows)),
            "REF": pa.array(rng.choice(list("ACGT"), rows).tolist()),
            "ALT": pa.array(rng.choice(list("ACGT"), rows).tolist()),
            "POPULATION": pa.array(rng.choice(["EE", "FI", "Total"], rows).tolist()),
            "AF": rng.random(rows),
        }
    )


def parquet_bytes(table: pa.Table, row_group: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="none", use_dictionary=False, row_group_size=row_group)
    return buf.getvalue()


def with_manifest(payload: Members) -> Members:
    return [("manifest.json", corpus.manifest(payload)), *payload]


def decant_archive(work: Path, src: Path) -> bytes:
    """A decant archive beside the packages; returns the original's bytes."""
    data = np.arange(2 * 40 * 30, dtype=np.uint16).reshape(2, 40, 30)
    tifffile.imwrite(work / "scan.tif", data, photometric="minisblack")
    pack_file(work / "scan.tif", src / "scan.tif.zarr.zip")
    return (work / "scan.tif").read_bytes()


def start(src: Path, base: Path, *extra: str) -> Mount:
    return Mount(src, base / "mnt", base / "log", base / "index").start(*extra)


# -- the shared mount: good packages, hostile ones and a decant archive side by side -------


@dataclass
class Served:
    m: Mount
    src: Path
    keys: dict[str, Any]
    members: Members  # the GDI members of gdi/two/tampered/truncated/unsafe
    plain: bytes  # the TAR plaintext of gdi.tar.c4gh
    large: Members
    table: pa.Table
    row_group: int
    scan: bytes
    tampered_segment: int
    truncated_at: int  # plaintext bytes the truncated package still authenticates


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("c4gh-mount")
    keydir, src, work = base / "keys", base / "src", base / "work"
    src.mkdir()
    work.mkdir()
    keys = {n: corpus.make_keypair(keydir, n) for n in ("node", "other", "writer")}
    writer, node, other = keys["writer"], keys["node"], keys["other"]
    members = corpus.gdi_members(parquet_rows=(20000, 1500))
    plain = corpus.write_package(src / "gdi.tar.c4gh", members, writer, [node])
    corpus.write_package(src / "two.tar.c4gh", members, writer, [node, other], tarfile.PAX_FORMAT)
    corpus.write_package(src / "wrong-key.tar.c4gh", members, writer, [other])

    big = "allele-freq.chr1.0.br10000000.00000000000000ff.parquet"
    large = with_manifest([(big, os.urandom(6 << 20))])
    corpus.write_package(src / "large.tar.c4gh", large, writer, [node])
    table, row_group = parquet_table(300_000, seed=7), 10_000
    pq_name = "allele-freq.chr2.0.br10000000.0123456789abcdef.parquet"
    corpus.write_package(
        src / "parquet.tar.c4gh",
        with_manifest([(pq_name, parquet_bytes(table, row_group))]),
        writer,
        [node],
    )

    package = (src / "gdi.tar.c4gh").read_bytes()
    layout = tar_layout(plain)
    biggest = max(layout.values(), key=lambda i: i.size)
    tampered_segment = segment_inside(biggest, 0.5)
    (src / "tampered.tar.c4gh").write_bytes(corpus.tamper(package, tampered_segment))
    cut_segment = segment_inside(biggest, 0.6)
    cut = corpus.header_len_of(package) + cut_segment * CIPHER_SEG + 1000  # inside a segment
    (src / "truncated.tar.c4gh").write_bytes(package[:cut])
    hostile = [*members, *corpus.hostile_entries()]
    corpus.write_package(src / "unsafe.tar.c4gh", hostile, writer, [node])
    (src / "not-crypt4gh.tar.c4gh").write_bytes(corpus.not_crypt4gh())
    (src / "past-eof.tar.c4gh").write_bytes(corpus.header_past_eof())
    scan = decant_archive(work, src)
    for path in src.iterdir():
        os.utime(path, ns=(PACKAGE_MTIME_NS, PACKAGE_MTIME_NS))

    m = start(src, base, "--c4gh-key", str(node.secret_path), "--log-level", "DEBUG")
    try:
        yield Served(
            m=m,
            src=src,
            keys=keys,
            members=members,
            plain=plain,
            large=large,
            table=table,
            row_group=row_group,
            scan=scan,
            tampered_segment=tampered_segment,
            truncated_at=cut_segment * SEG,
        )
    finally:
        m.stop()


def assert_package_served(mnt: Path, src: Path, name: str, plain: bytes, members: Members) -> None:
    """The folder holds exactly the TAR's members, byte-exact, with the tar's sizes, 0444."""
    folder = mnt / name
    layout = tar_layout(plain)
    shown = files_under(folder)
    assert {k: p.stat().st_size for k, p in shown.items()} == {k: i.size for k, i in layout.items()}
    for member, data in members:
        assert sha256(shown[member].read_bytes()) == sha256(data), f"{name}/{member}"
        st = shown[member].stat()
        assert st.st_mode & 0o7777 == 0o440  # --c4gh-mode default: never readable by other
        assert st.st_mtime_ns == (src / name).stat().st_mtime_ns


def test_every_member_reads_back_byte_exact(served: Served) -> None:
    s = served
    shown = {p.name: p.is_dir() for p in s.m.mnt.iterdir() if not p.name.startswith(".")}
    folders = ["gdi", "two", "large", "parquet", "tampered", "truncated", "unsafe"]
    raw = ["wrong-key", "not-crypt4gh", "past-eof"]
    assert shown == {
        **{f"{n}.tar.c4gh": True for n in folders},
        **{f"{n}.tar.c4gh": False for n in raw},
        "scan.tif": False,
    }
    for name in ("gdi.tar.c4gh", "two.tar.c4gh"):
        assert (s.m.mnt / name).is_dir()
        assert (s.m.mnt / name).stat().st_mtime_ns == PACKAGE_MTIME_NS
        assert_package_served(s.m.mnt, s.src, name, s.plain, s.members)
    long_names = [n for n, _ in s.members if len(n) > 100]
    assert long_names and all((s.m.mnt / "gdi.tar.c4gh" / n).is_file() for n in long_names)
    out = subprocess.run(["sha256sum", *(n for n, _ in s.members)], cwd=s.m.mnt / "two.tar.c4gh",
                         capture_output=True, text=True, check=True)  # fmt: skip
    pairs = [line.split(None, 1) for line in out.stdout.splitlines()]
    got = {name: digest for digest, name in pairs}
    assert got == {n: sha256(d) for n, d in s.members}
    assert (s.m.mnt / "scan.tif").read_bytes() == s.scan


def test_folder_and_member_xattrs(served: Served) -> None:
    s = served
    writer = writer_fingerprint(s.keys["writer"]).encode()
    for name, packets in (("gdi.tar.c4gh", b"1"), ("two.tar.c4gh", b"2")):
        folder = s.m.mnt / name
        assert os.getxattr(folder, "user.c4gh.writer_fingerprint") == writer
        assert os.getxattr(folder, "user.c4gh.packets") == packets
        for member, data in s.members[1:]:
            assert os.getxattr(folder / member, "user.c4gh.sha256") == sha256(data).encode()
        with pytest.raises(OSError) as info:
            os.getxattr(folder / "manifest.json", "user.c4gh.sha256")  # not in payload.members
        assert info.value.errno == errno.ENODATA
    assert "user.c4gh.writer_fingerprint" in os.listxattr(s.m.mnt / "gdi.tar.c4gh")


def test_manifest_of_a_large_package_costs_one_or_two_segments(served: Served) -> None:
    s = served
    folder = s.m.mnt / "large.tar.c4gh"
    data = subprocess.run(["cat", str(folder / "manifest.json")], capture_output=True,
                          check=True).stdout  # fmt: skip
    assert data == s.large[0][1]
    segments = decrypted(s.m, "large.tar.c4gh")
    package = (s.src / "large.tar.c4gh").read_bytes()
    total = -(-(len(package) - corpus.header_len_of(package)) // CIPHER_SEG)
    assert 1 <= len(segments) <= 2 and 0 in segments, segments
    assert total >= 90  # ~96 segments in the package: the manifest took one or two of them


def test_pyarrow_reads_parquet_with_random_access(served: Served) -> None:
    s = served
    (member,) = [p for p in (s.m.mnt / "parquet.tar.c4gh").iterdir() if p.suffix == ".parquet"]
    with pq.ParquetFile(member) as pf:  # closed before the mount is: no busy unmount
        groups = pf.metadata.num_row_groups
        assert groups == s.table.num_rows // s.row_group
        for i in (groups // 2 + 3, 0, groups - 1):
            expected = s.table.slice(i * s.row_group, s.row_group)
            assert pf.read_row_group(i).equals(expected), f"row group {i}"
    member_segments = member.stat().st_size // SEG
    touched = decrypted(s.m, "parquet.tar.c4gh")
    assert len(touched) < member_segments // 2, (len(touched), member_segments)
    assert pq.read_table(member).equals(s.table)  # and the whole file, for good measure


def test_wrong_key_and_not_crypt4gh_are_shown_raw(served: Served) -> None:
    s = served
    for name, why in (
        ("wrong-key.tar.c4gh", "wrong key"),
        ("not-crypt4gh.tar.c4gh", "bad magic"),
        ("past-eof.tar.c4gh", "header packet 0 runs past the end of the file"),
    ):
        shown = s.m.mnt / name
        assert shown.is_file(), name
        assert shown.read_bytes() == (s.src / name).read_bytes()
        assert log_lines(s.m, name, why, "shown as the raw file"), name
    assert (s.m.mnt / "scan.tif").read_bytes() == s.scan  # the decant archive beside them


def test_tampered_segment_is_eio_and_the_rest_reads(served: Served) -> None:
    s = served
    layout = tar_layout(s.plain)
    big = max(layout.values(), key=lambda i: i.size)
    data = dict(s.members)[big.name]
    member = s.m.mnt / "tampered.tar.c4gh" / big.name
    bad = s.tampered_segment * SEG - big.offset_data  # member offset of the tampered segment
    for offset in (0, bad - 8192, bad + SEG + 4096, big.size - 100):
        assert exact_or_eio(member, 4096, offset, data[offset : offset + 4096]), offset
    assert eio(member, 4096, bad + 4096)
    assert eio(member, 100, bad + SEG - 50)  # straddling into the next, good, segment
    assert subprocess.run(["cat", str(member)], capture_output=True).returncode != 0
    # Its declared sha256 cannot be checked: the whole member is refused (swapped segments
    # would decrypt too; only the digest tells them).
    deadline = time.monotonic() + 10
    while not eio(member, 4096, 0):
        assert time.monotonic() < deadline, "the damaged member still reads after 10 s"
        time.sleep(0.2)
    for name, payload in s.members:
        if name != big.name:
            shown = s.m.mnt / "tampered.tar.c4gh" / name
            assert sha256(shown.read_bytes()) == sha256(payload), name
    assert log_lines(s.m, "tampered.tar.c4gh", f"segment {s.tampered_segment} fails authentication")
    assert (s.m.mnt / "gdi.tar.c4gh" / big.name).read_bytes() == data
    assert s.m.proc is not None and s.m.proc.poll() is None


def test_truncated_package_exposes_complete_members(served: Served) -> None:
    s = served
    layout = tar_layout(s.plain)
    readable = s.truncated_at
    complete = {n for n, i in layout.items() if i.offset_data + i.size <= readable}
    cut = {n for n, i in layout.items() if i.offset_data <= readable < i.offset_data + i.size}
    unseen = set(layout) - complete - cut  # their TAR headers are gone with the tail
    assert complete and cut and unseen
    shown = files_under(s.m.mnt / "truncated.tar.c4gh")
    assert set(shown) == complete
    for name, data in s.members:
        if name in complete:
            assert shown[name].read_bytes() == data, name
    (line,) = log_lines(s.m, "truncated.tar.c4gh", "not serving")
    assert all(f"{name!r}: incomplete" in line for name in cut)
    assert log_lines(s.m, "truncated.tar.c4gh", "no end-of-archive marker")


def test_unsafe_members_are_dropped_and_listed(served: Served) -> None:
    s = served
    folder = s.m.mnt / "unsafe.tar.c4gh"
    assert set(files_under(folder)) == {n for n, _ in s.members}
    assert not (s.m.mnt / "escape").exists() and not (s.m.mnt / "twice").exists()
    assert not (folder / "etc").exists() and not (folder / "link-to-manifest").exists()
    for name, data in s.members:
        assert (folder / name).read_bytes() == data
    (line,) = log_lines(s.m, "unsafe.tar.c4gh", "not serving")
    reasons = line.split(" member(s): ", 1)[1].split("; ")
    for name, why in (
        ("../escape", "escapes the package"),
        ("ok/../../twice", "escapes the package"),
        ("/etc/absolute", "absolute path"),
        ("link-to-manifest", "symbolic link"),
        ("hard-link", "hard link"),
        ("null-device", "character device"),
    ):
        assert any(r.startswith(f"{name!r}: ") and why in r for r in reasons), name


def test_persisted_index_remount_decrypts_only_segment_zero(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    large = with_manifest(
        [("allele-freq.chr1.0.br1.00000000000000ff.parquet", os.urandom(3 << 20))]
    )
    corpus.write_package(src / "large.tar.c4gh", large, keys["writer"], [keys["node"]])
    settle(src / "large.tar.c4gh")  # else described anew at the remount: written just now
    args = ("--c4gh-key", str(keys["node"].secret_path), "--log-level", "DEBUG")
    m = make_mount(src, *args)
    assert (m.mnt / "large.tar.c4gh" / "manifest.json").read_bytes() == large[0][1]
    assert len(decrypted(m, "large.tar.c4gh")) == 2  # segment 0, and the end-of-TAR walk
    m.stop()
    m.log.write_text("")
    m.start(*args)
    assert (m.mnt / "large.tar.c4gh" / "manifest.json").read_bytes() == large[0][1]
    assert decrypted(m, "large.tar.c4gh") == [0]  # the listing came from the index


def test_package_truncated_while_open_is_eio_past_the_end(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    members = corpus.gdi_members(parquet_rows=(20000, 1500))
    plain = corpus.write_package(src / "pkg.tar.c4gh", members, keys["writer"], [keys["node"]])
    big = max(tar_layout(plain).values(), key=lambda i: i.size)
    data = dict(members)[big.name]
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path))
    member = m.mnt / "pkg.tar.c4gh" / big.name
    fd = os.open(member, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        keep = segment_inside(big, 0.5)  # whole segments left on disk
        before = (keep - 1) * SEG - big.offset_data
        assert before > 4096
        # A first read away from offset 0 is a random one: it starts no read-ahead, which
        # could decrypt the segments past the cut before the cut and serve them (rightly).
        assert os.pread(fd, 4096, before) == data[before : before + 4096]
        package = src / "pkg.tar.c4gh"
        os.truncate(package, corpus.header_len_of(package.read_bytes()) + keep * CIPHER_SEG + 500)
        past = (keep + 1) * SEG - big.offset_data  # member offset one segment past the cut
        with pytest.raises(OSError) as info:
            os.pread(fd, 4096, past)
        assert info.value.errno == errno.EIO
        assert os.pread(fd, 4096, before) == data[before : before + 4096]
        assert os.pread(fd, 4096, 0) == data[:4096]
    finally:
        os.close(fd)
    assert m.proc is not None and m.proc.poll() is None


# -- keys: several, passphrase-protected, two recipients, a real crypt4gh client -----------


def test_passphrase_key_two_keys_and_two_recipients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_mount: MakeMount
) -> None:
    src, keydir = tmp_path / "src", tmp_path / "keys"
    src.mkdir()
    locked = corpus.make_keypair(keydir, "locked", passphrase=PASSPHRASE)
    other, node, writer = (corpus.make_keypair(keydir, n) for n in ("other", "node", "writer"))
    members = corpus.gdi_members(parquet_rows=(6000, 600), seed=3)
    plain = corpus.write_package(src / "locked.tar.c4gh", members, writer, [locked])
    corpus.write_package(src / "both.tar.c4gh", members, writer, [node, locked])
    cli = subprocess.run(
        ["crypt4gh", "encrypt", "--sk", str(writer.secret_path),
         "--recipient_pk", str(other.public_path)],
        input=plain, capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    (src / "cli.tar.c4gh").write_bytes(cli.stdout)
    monkeypatch.setenv("C4GH_PASSPHRASE", PASSPHRASE)
    m = make_mount(src, "--c4gh-key", str(locked.secret_path),
                   "--c4gh-key", str(other.secret_path), "--log-level", "DEBUG")  # fmt: skip
    for name, packets in (("locked.tar.c4gh", b"1"), ("both.tar.c4gh", b"2"),
                          ("cli.tar.c4gh", b"1")):  # fmt: skip
        assert_package_served(m.mnt, src, name, plain, members)
        folder = m.mnt / name
        assert os.getxattr(folder, "user.c4gh.packets") == packets
        fingerprint = os.getxattr(folder, "user.c4gh.writer_fingerprint").decode()
        assert fingerprint == writer_fingerprint(writer)
    log = m.log_text().lower()
    assert "2 secret key(s) loaded" in log
    for secret in (PASSPHRASE, locked.secret.hex(), other.secret.hex()):
        assert secret.lower() not in log


def test_writer_allow_list_enforced(tmp_path: Path, make_mount: MakeMount) -> None:
    src, keydir = tmp_path / "src", tmp_path / "keys"
    src.mkdir()
    node, listed, stranger = (corpus.make_keypair(keydir, n) for n in ("node", "listed", "x"))
    members = corpus.gdi_members(parquet_rows=(3000, 300), seed=5)
    plain = corpus.write_package(src / "listed.tar.c4gh", members, listed, [node])
    corpus.write_package(src / "unlisted.tar.c4gh", members, stranger, [node])
    allowed = tmp_path / "allowed-writers"
    allowed.write_text(f"# provider A\n{writer_fingerprint(listed)}\n")
    m = make_mount(src, "--c4gh-key", str(node.secret_path), "--c4gh-allowed-writers",
                   str(allowed), "--c4gh-writer-policy", "enforce")  # fmt: skip
    assert_package_served(m.mnt, src, "listed.tar.c4gh", plain, members)
    raw = m.mnt / "unlisted.tar.c4gh"
    assert raw.is_file() and raw.read_bytes() == (src / "unlisted.tar.c4gh").read_bytes()
    (line,) = log_lines(m, "unlisted.tar.c4gh", "not an allowed writer")
    assert writer_fingerprint(stranger) in line and "enforce" in line
    assert "shown as the raw file" in line


# -- refused at start ---------------------------------------------------------------------


def refused(tmp_path: Path, args: Sequence[str], env: dict[str, str]) -> str:
    """Run the daemon expecting it to refuse: stderr, after checking nothing got mounted."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir(exist_ok=True)
    mnt.mkdir(exist_ok=True)
    cmd = [*DAEMON, str(src), str(mnt), "--index-dir", str(tmp_path / "ix"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    if is_mounted(mnt):  # only reached if the test is about to fail
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr
    assert not is_mounted(mnt)
    return done.stderr


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "daemonized"])
def test_key_readable_by_others_is_refused(tmp_path: Path, foreground: bool) -> None:
    key = corpus.make_keypair(tmp_path / "keys", "node").secret_path
    key.chmod(0o644)
    args = ["--c4gh-key", str(key), *(["-f"] if foreground else [])]
    err = refused(tmp_path, args, dict(os.environ))
    assert "0644" in err and "too open" in err and f"chmod 600 '{key}'" in err


@pytest.mark.parametrize("option", ["--c4gh-key", "--c4gh-allowed-writers"])
def test_a_fifo_given_as_key_or_writers_file_is_refused_at_start(
    tmp_path: Path, option: str
) -> None:
    """Opening a FIFO waits for a writer: the daemon's start must not (the 60 s timeout of
    `refused` fails the test where it would)."""
    key = corpus.make_keypair(tmp_path / "keys", "node").secret_path
    fifo = tmp_path / "keys" / "fifo"
    os.mkfifo(fifo, 0o600)
    args = ["-f", "--c4gh-key", str(fifo if option == "--c4gh-key" else key)]
    if option != "--c4gh-key":
        args += [option, str(fifo), "--c4gh-writer-policy", "enforce"]
    err = refused(tmp_path, args, dict(os.environ))
    assert f"'{fifo}' is not a regular file" in err and err.count("\n") <= 2, err


@pytest.mark.parametrize("given", [None, "not the passphrase"], ids=["missing", "wrong"])
def test_protected_key_without_its_passphrase_is_refused(tmp_path: Path, given: str | None) -> None:
    key = corpus.make_keypair(tmp_path / "keys", "locked", passphrase=PASSPHRASE).secret_path
    env = {k: v for k, v in os.environ.items() if k != "C4GH_PASSPHRASE"}
    if given is not None:
        env["C4GH_PASSPHRASE"] = given
    err = refused(tmp_path, ["--c4gh-key", str(key), "-f"], env)
    assert str(key) in err
    assert ("wrong passphrase" if given else "C4GH_PASSPHRASE") in err
    assert PASSPHRASE not in err and "not the passphrase" not in err


# -- streaming a large member: read-ahead pages on two threads, O_DIRECT loads ---------------


def sh_sha256(command: str) -> str:
    """The sha256 `sha256sum` prints for what a shell pipeline writes (real clients: cat, dd)."""
    out = subprocess.run(["sh", "-c", f"{command} | sha256sum"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[0]


def test_large_member_streams_byte_exact_and_a_tampered_page_fails_alone(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """A 5 MiB member that starts mid-segment, between two others, read by `cat`, `dd` with a
    1 MiB and an odd block size, two readers at once, and preads at page and segment
    boundaries and in its last partial segment; and the same package with one byte of one
    segment flipped inside a cache page: reads of that span fail with EIO, reads of
    every other span (after the read-ahead went over the bad page) are exact."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    rng = np.random.default_rng(11)
    big = "allele-freq.chr3.0.br10000000.00000000000000ab.parquet"
    members = with_manifest(
        [
            ("head.vcf", rng.bytes(70_001)),
            (big, rng.bytes((5 << 20) + 12_345)),
            ("tail.vcf", rng.bytes(3_000)),
        ]
    )
    plain = corpus.write_package(src / "good.tar.c4gh", members, keys["writer"], [keys["node"]])
    data, info = dict(members)[big], tar_layout(plain)[big]
    assert info.offset_data % SEG  # starts inside a segment
    bad_segment = (info.offset_data + (2 << 20) + (1 << 19)) // SEG  # mid-page, mid-member
    package = (src / "good.tar.c4gh").read_bytes()
    (src / "bad.tar.c4gh").write_bytes(corpus.tamper(package, bad_segment))
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path))
    good, bad = m.mnt / "good.tar.c4gh" / big, m.mnt / "bad.tar.c4gh" / big
    want = sha256(data)
    assert sh_sha256(f"cat '{good}'") == want
    assert sh_sha256(f"dd if='{good}' bs=1M status=none") == want
    assert sh_sha256(f"dd if='{good}' bs=77777 status=none") == want
    two = subprocess.run(
        ["sh", "-c", f"cat '{good}' | sha256sum & cat '{good}' | sha256sum; wait"],
        capture_output=True,
        text=True,
    )
    assert [line.split()[0] for line in two.stdout.splitlines()] == [want, want]
    page = 16 * SEG  # 1 MiB: probes at every 1 and 2 MiB boundary
    for plain_at in (page, 2 * page, 3 * page - 1, 4 * page + SEG, info.offset_data + 70_000):
        offset = plain_at - info.offset_data
        assert pread_random(good, 5000, offset) == data[offset : offset + 5000], offset
    last = len(data) - 100  # the last bytes, in the member's last partial segment
    assert pread_random(good, 4096, last) == data[last:]
    for name, payload in members:
        if name != big:
            assert sha256((m.mnt / "good.tar.c4gh" / name).read_bytes()) == sha256(payload)

    lo = bad_segment * SEG - info.offset_data  # member offset of the tampered segment
    # A forward reader gets every byte up to the kernel page holding the bad segment's first
    # (first: once the member's background check has met the damage, it is refused whole).
    stop = lo - lo % 4096
    with open(bad, "rb", buffering=0) as f:
        got = b""
        while len(got) < stop:
            chunk = f.read(stop - len(got))
            assert chunk, len(got)
            got += chunk
        assert got == data[:stop]
        with pytest.raises(OSError) as info_eio:
            f.read(1 << 20)
        assert info_eio.value.errno == errno.EIO
    assert subprocess.run(["cat", str(bad)], capture_output=True).returncode != 0  # read-ahead
    assert eio(bad, 4096, lo + 1000)
    assert eio(bad, 2, lo + SEG - 1)  # one byte of it, one of the next (good) segment
    for offset in (0, lo - page, lo - 8192, lo + SEG + 4096, lo + page, last):
        assert exact_or_eio(bad, 4096, offset, data[offset : offset + 4096]), offset
    assert m.proc is not None and m.proc.poll() is None


def test_a_package_renamed_over_another_of_its_size_and_mtime_serves_its_own_plaintext(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """A package kept by (size, mtime) alone, its decrypted pages by path: another package of
    the same size and mtime renamed over it (new inode, new ctime) served the first one's
    plaintext under the second one's permissions (red team). Now it serves its own bytes."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    for name, fill in (("P", b"A"), ("B", b"B")):
        corpus.write_package(src / f"{name}.tar.c4gh",
                             corpus.with_manifest([("data.txt", fill * 200_000)]),
                             keys["writer"], [keys["node"]])  # fmt: skip
        os.utime(src / f"{name}.tar.c4gh", ns=(PACKAGE_MTIME_NS, PACKAGE_MTIME_NS))
    assert (src / "P.tar.c4gh").stat().st_size == (src / "B.tar.c4gh").stat().st_size
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path))
    shown = m.mnt / "P.tar.c4gh" / "data.txt"
    assert shown.read_bytes() == b"A" * 200_000
    shutil.copy2(src / "B.tar.c4gh", src / ".swap")
    os.replace(src / ".swap", src / "P.tar.c4gh")  # same size and mtime, a new inode
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(OSError):  # the entry may be gone for a moment, or stale
            data = shown.read_bytes()
            assert data in (b"A" * 200_000, b"B" * 200_000)  # never a mix
            if data == b"B" * 200_000:
                break
        assert time.monotonic() < deadline, "P still serves the package renamed away"
        time.sleep(0.2)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    assert shown.read_bytes() == b"B" * 200_000
