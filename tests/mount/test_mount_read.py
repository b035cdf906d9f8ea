"""The corpus through a real mount, read by real clients: sha256sum, cmp, tifffile, os.pread."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def corpus_mount(mount_corpus, tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.mount.conftest import Mount

    originals, src = mount_corpus
    base = tmp_path_factory.mktemp("corpus-mount")
    m = Mount(src, base / "mnt", base / "log", base / "index").start("--read-only")
    yield originals, m
    m.stop()


def test_listing_shows_original_names_and_sizes(corpus_mount) -> None:  # type: ignore[no-untyped-def]
    originals, m = corpus_mount
    want = {p.name: p.stat().st_size for p in originals.iterdir()}
    got = {p.name: p.stat().st_size for p in m.mnt.iterdir()}
    assert got == want
    out = subprocess.run(["ls", "-l", str(m.mnt)], capture_output=True, text=True, check=True)
    for name in want:
        assert name in out.stdout
    assert all(not os.access(p, os.W_OK) or os.geteuid() == 0 for p in m.mnt.iterdir())
    assert {oct(p.stat().st_mode & 0o777) for p in m.mnt.iterdir()} == {"0o444"}


def test_sha256sum_through_mount_equals_originals(corpus_mount) -> None:  # type: ignore[no-untyped-def]
    originals, m = corpus_mount
    names = sorted(p.name for p in originals.iterdir())
    out = subprocess.run(["sha256sum", *names], cwd=m.mnt, capture_output=True, text=True,
                         check=True)  # fmt: skip
    got = dict(reversed(line.split(None, 1)) for line in out.stdout.splitlines())
    assert got == {name: sha256(originals / name) for name in names}


def test_tifffile_reads_same_pixels(corpus_mount) -> None:  # type: ignore[no-untyped-def]
    originals, m = corpus_mount
    checked = 0
    for path in sorted(originals.iterdir()):
        try:
            want = tifffile.imread(path)
        except Exception:
            continue  # not a TIFF, or one tifffile cannot decode here (no imagecodecs)
        np.testing.assert_array_equal(tifffile.imread(m.mnt / path.name), want)
        checked += 1
    assert checked >= 15


def test_xattrs_name_archive_digest_and_mode(corpus_mount) -> None:  # type: ignore[no-untyped-def]
    originals, m = corpus_mount
    for path in originals.iterdir():
        shown = m.mnt / path.name
        assert set(os.listxattr(shown)) >= {"user.decant.archive", "user.decant.sha256",
                                             "user.decant.mode"}  # fmt: skip
        assert os.getxattr(shown, "user.decant.sha256").decode() == sha256(path)
        assert os.getxattr(shown, "user.decant.archive").decode() == f"{path.name}.zarr.zip"
        assert os.getxattr(shown, "user.decant.mode") in (b"byte-exact", b"verbatim")
    for name in ("security.selinux", "system.posix_acl_access", "trusted.decant", "user.nope"):
        with pytest.raises(OSError) as absent:  # what `ls -l` probes: answered before any lookup
            os.getxattr(m.mnt / "zstack_u16.tif", name)
        assert absent.value.errno in (errno.ENODATA, errno.EOPNOTSUPP), (name, absent.value)
    out = subprocess.run(["getfattr", "-d", str(m.mnt / "zstack_u16.tif")],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode == 0:
        assert "user.decant.sha256" in out.stdout


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_windows_equal_original(corpus_mount, data) -> None:  # type: ignore[no-untyped-def]
    originals, m = corpus_mount
    names = sorted(p.name for p in originals.iterdir() if p.stat().st_size)
    name = data.draw(st.sampled_from(names))
    raw = (originals / name).read_bytes()
    offset = data.draw(st.integers(0, len(raw) + 10))
    size = data.draw(st.integers(1, 200_000))
    fd = os.open(m.mnt / name, os.O_RDONLY)
    try:
        assert os.pread(fd, size, offset) == raw[offset : offset + size]
    finally:
        os.close(fd)


def test_sixteen_threads_read_concurrently(corpus_mount) -> None:  # type: ignore[no-untyped-def]
    originals, m = corpus_mount
    files = {p.name: p.read_bytes() for p in originals.iterdir() if p.stat().st_size}
    names = sorted(files)
    errors: list[str] = []
    counts = [0] * 16
    stop = time.monotonic() + 8  # a soak (was 20 s; cut for CI time)

    def worker(k: int) -> None:
        rng = np.random.default_rng(k)
        while time.monotonic() < stop and not errors:
            name = names[int(rng.integers(len(names)))]
            raw = files[name]
            off = int(rng.integers(len(raw)))
            size = int(rng.integers(1, 300_000))
            try:
                fd = os.open(m.mnt / name, os.O_RDONLY)
                try:
                    got = os.pread(fd, size, off)
                finally:
                    os.close(fd)
            except OSError as exc:
                errors.append(f"{name}@{off}: {exc}")
                return
            if got != raw[off : off + size]:
                errors.append(f"{name}@{off}+{size}: wrong bytes")
            counts[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert min(counts) > 0


def test_writes_are_refused_and_df_works(corpus_mount) -> None:  # type: ignore[no-untyped-def]
    _originals, m = corpus_mount
    target = m.mnt / "zstack_u16.tif"
    with pytest.raises(OSError) as info:
        os.open(target, os.O_WRONLY)
    assert info.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    out = subprocess.run(["df", str(m.mnt)], capture_output=True, text=True, check=True)
    assert str(m.mnt) in out.stdout
    assert os.statvfs(m.mnt).f_blocks > 0
