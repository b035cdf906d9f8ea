"""Each way an earlier version served damaged bytes with exit status 0, reproduced: now an error.

Archives here are packed with blosc clevel 0 (chunks stored as they are), so a flipped pixel
byte always decodes, to wrong bytes: only the sha256 check can catch it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.helpers import flip_byte, rewrite_zip
from vfs.decant.digestmap import chunk_digests, has_block_entries, unpack_layout
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.writer import CodecChoice

STORED = PackOptions(codec=CodecChoice("zstd", 0, "noshuffle"))


def _stack(path: Path, seed: int = 1, shape: tuple[int, int, int] = (4, 64, 64)) -> Path:
    rng = np.random.default_rng(seed)
    tifffile.imwrite(path, rng.integers(0, 4000, shape, dtype=np.uint16))
    return path


def _folder_archive(original: Path, src: Path) -> tuple[Path, Path]:
    """(`.zarr/` folder archive of `original` in `src`, the file of its first pixel chunk)."""
    packed = original.with_name(original.name + ".zarr.zip")
    pack_file(original, packed, STORED)
    folder = src / (original.name + ".zarr")
    with zipfile.ZipFile(packed) as z:
        z.extractall(folder)
        return folder, folder / _first_chunk(packed)


def _first_chunk(archive: Path) -> str:
    with zipfile.ZipFile(archive) as z:
        return next(n for n in z.namelist() if n.startswith("0/") and "/." not in n)


def _damaged(work: Path, src: Path, name: str = "stack.tif") -> tuple[Path, Path]:
    """(original, archive in SRC whose first pixel chunk has one flipped byte)."""
    original = _stack(work / name)
    clean = work / f"{name}.zarr.zip"
    pack_file(original, clean, STORED)
    rewrite_zip(clean, src / clean.name, {_first_chunk(clean): flip_byte(-1)})
    return original, src / clean.name


def _sha256sum(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sha256sum", str(path)], capture_output=True, text=True)


def test_partial_read_first_does_not_let_a_full_read_skip_the_check(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    _damaged(work, src)
    m = make_mount(src)
    head = subprocess.run(f"head -c 4096 {m.mnt / 'stack.tif'} > /dev/null", shell=True)
    assert head.returncode == 0  # the header is intact
    out = _sha256sum(m.mnt / "stack.tif")
    assert out.returncode != 0, out.stdout
    assert _sha256sum(m.mnt / "stack.tif").returncode != 0  # and every later full read too


def test_bit_rot_after_verification_is_caught_after_a_remount(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    original = _stack(work / "stack.tif")
    archive = src / "stack.tif.zarr.zip"
    pack_file(original, archive, STORED)
    m = make_mount(src)
    good = _sha256sum(m.mnt / "stack.tif")
    assert good.returncode == 0
    assert good.stdout.split()[0] == hashlib.sha256(original.read_bytes()).hexdigest()
    m.stop()
    st = archive.stat()
    rewrite_zip(archive, work / "rotten.zip", {_first_chunk(archive): flip_byte(-1)})
    shutil.copyfile(work / "rotten.zip", archive)  # in place: same inode, same size
    os.utime(archive, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert archive.stat().st_size == st.st_size and archive.stat().st_ino == st.st_ino
    m.start()  # same index, which remembers the archive as verified
    assert _sha256sum(m.mnt / "stack.tif").returncode != 0


def test_whole_file_read_in_random_order_fails_on_damage(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    original, _ = _damaged(work, src)
    m = make_mount(src)
    size = original.stat().st_size
    blocks = list(range(0, size, 4096))
    random.Random(7).shuffle(blocks)
    errors = 0
    fd = os.open(m.mnt / "stack.tif", os.O_RDONLY)
    try:
        for off in blocks:
            try:
                os.pread(fd, 4096, off)
            except OSError:
                errors += 1
    finally:
        os.close(fd)
    assert errors >= 1  # the read that completed the file waited for a full check, and failed


def test_a_clean_archive_still_reads_in_any_order(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """The control: the checks above fail only on damage."""
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    original = _stack(work / "stack.tif")
    pack_file(original, src / "stack.tif.zarr.zip", STORED)
    m = make_mount(src)
    data = original.read_bytes()
    blocks = list(range(0, len(data), 4096))
    random.Random(7).shuffle(blocks)
    fd = os.open(m.mnt / "stack.tif", os.O_RDONLY)
    try:
        for off in blocks:
            assert os.pread(fd, 4096, off) == data[off : off + 4096]
    finally:
        os.close(fd)
    assert _sha256sum(m.mnt / "stack.tif").stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_random_reads_of_a_verified_archive_are_checked_chunk_by_chunk(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """Bit rot inside a folder archive leaves the folder's own stamp as it was: the chunk digests
    recorded when it verified catch it on a partial read."""
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    original = _stack(work / "stack.tif")
    folder, chunk = _folder_archive(original, src)
    m = make_mount(src)
    assert _sha256sum(m.mnt / "stack.tif").returncode == 0
    assert os.getxattr(m.mnt / "stack.tif", "user.decant.verified") == b"yes"
    m.stop()
    st = folder.stat()
    with open(chunk, "r+b") as fh:  # one byte of the first plane, in place
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0x5A]))
    assert folder.stat().st_mtime_ns == st.st_mtime_ns
    m.start()
    assert os.getxattr(m.mnt / "stack.tif", "user.decant.verified") == b"yes"  # not known yet
    data = original.read_bytes()
    fd = os.open(m.mnt / "stack.tif", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as caught:
            for off in range(0, len(data), 4096):  # a chunk read from disk is checked first
                assert os.pread(fd, 4096, off) == data[off : off + 4096], off
        assert caught.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert os.getxattr(m.mnt / "stack.tif", "user.decant.verified") == b"no"
    assert "damaged since it verified" in m.log_text()


def _read_through(path: Path) -> bytes:
    """The whole file as the daemon serves it now: what the kernel cached of it dropped first
    (a verified original is opened with the page cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks = []
        while block := os.read(fd, 1 << 20):
            chunks.append(block)
        return b"".join(chunks)
    finally:
        os.close(fd)


def test_a_folder_archive_refused_for_a_damaged_chunk_is_served_again_once_it_is_repaired(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """A chunk file replaced inside a `.zarr/` folder leaves the folder's and the manifest's stat,
    the archive's version, as they were: once refused, it stayed refused after the chunk was put
    back, until a restart (red team 55, F2). The watcher sees the file change: checked again."""
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    # 6 MiB of 512 KiB planes: more than the daemon's cache, so a read reaches the chunks
    original = _stack(work / "stack.tif", seed=3, shape=(12, 512, 512))
    folder, chunk = _folder_archive(original, src)
    good = chunk.read_bytes()
    m = make_mount(src, "--cache-size", "2M")
    shown = m.mnt / "stack.tif"
    assert _read_through(shown) == original.read_bytes()
    assert os.getxattr(shown, "user.decant.verified") == b"yes"

    def put(data: bytes) -> None:  # replaced by a rename, as a copy from elsewhere is
        staged = chunk.with_name(".staged")
        staged.write_bytes(data)
        os.replace(staged, chunk)

    put(flip_byte(-1)(good))
    with pytest.raises(OSError) as caught:
        _read_through(shown)
    assert caught.value.errno == errno.EIO
    assert os.getxattr(shown, "user.decant.verified") == b"no"
    put(good)
    deadline = time.monotonic() + 10
    while "a file inside it changed" not in m.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _read_through(shown) == original.read_bytes()
    deadline = time.monotonic() + 10
    while os.getxattr(shown, "user.decant.verified") != b"yes" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.getxattr(shown, "user.decant.verified") == b"yes"
    assert (folder / ".decant").is_dir()  # nothing in the archive was touched but the chunk


def test_scrub_finds_damage_nobody_read(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    good = _stack(work / "good.tif", seed=2)
    pack_file(good, src / "good.tif.zarr.zip", STORED)
    _damaged(work, src, "bad.tif")
    m = make_mount(src, "--scrub-interval", "1s")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "scrub of" not in m.log_text():
        time.sleep(0.2)
    assert re.search(r"scrub of .*: 1 files verified, 1 failed", m.log_text())
    assert os.getxattr(m.mnt / "good.tif", "user.decant.verified") == b"yes"
    assert os.getxattr(m.mnt / "bad.tif", "user.decant.verified") == b"no"
    with pytest.raises(OSError) as caught:
        (m.mnt / "bad.tif").read_bytes()
    assert caught.value.errno == errno.EIO
    assert (m.mnt / "good.tif").read_bytes() == good.read_bytes()


@pytest.mark.parametrize("older", ["chunks only", "no layouts"])
def test_a_scrub_gives_a_chunk_only_digest_map_its_block_entries(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
    older: str,
) -> None:
    """An index recorded before block entries holds one digest per chunk, so each small read of
    a verified archive read and checked its whole chunk. A scrub reads every chunk anyway: the
    map it notes, block entries and all, replaces the coarser one (its chunk digests equal).
    So too for a map recorded before layout entries (its cold small reads read each table)."""
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    rng = np.random.default_rng(3)
    smooth = np.add.outer(np.arange(512), np.arange(512)) % 4096
    planes = np.stack([smooth + rng.integers(0, 16, (512, 512)) for _ in range(3)])
    tifffile.imwrite(work / "s.tif", planes.astype(np.uint16))  # 512 KiB planes: 2 blocks each
    pack_file(work / "s.tif", src / "s.tif.zarr.zip")
    index = tmp_path / "mnt-index" / "index.sqlite"

    def recorded() -> dict[str, int] | None:
        with contextlib.closing(sqlite3.connect(index)) as db:
            row = db.execute("SELECT doc FROM chunk_digests").fetchone()
        return None if row is None else dict(json.loads(row[0]))

    m = make_mount(src)
    assert (m.mnt / "s.tif").read_bytes() == (work / "s.tif").read_bytes()  # verifies it
    deadline = time.monotonic() + 30
    while (full := recorded()) is None:
        assert time.monotonic() < deadline, m.log_text()[-2000:]
        time.sleep(0.1)
    m.stop()
    assert has_block_entries(full)
    # Each chunk's layout entry: its header and table as the archive holds them, at the offset
    # where the archive file holds the chunk's bytes (a cold small read then reads once).
    archive = (src / "s.tif.zarr.zip").read_bytes()
    with zipfile.ZipFile(src / "s.tif.zarr.zip") as zf:
        stored = {n: zf.read(n) for n in chunk_digests(full)}
    for key, raw in stored.items():
        layout = unpack_layout(full[f".b/{key}/l"])
        assert layout is not None and layout[1] is not None, key
        table, offset = layout
        assert raw.startswith(table) and archive[offset : offset + len(raw)] == raw, key
    if older == "chunks only":
        earlier = chunk_digests(full)
    else:
        earlier = {k: v for k, v in full.items() if not k.endswith("/l")}
        assert has_block_entries(earlier) and len(earlier) < len(full)
    with contextlib.closing(sqlite3.connect(index)) as db, db:  # as an earlier version kept it
        db.execute("UPDATE chunk_digests SET doc=?", (json.dumps(earlier),))
    assert recorded() == earlier

    m.start("--scrub-interval", "1s")
    while not re.search(r"scrub of .*: 1 files verified, 0 failed", m.log_text()):
        assert time.monotonic() < deadline + 30, m.log_text()[-2000:]
        time.sleep(0.2)
    m.stop()
    assert recorded() == full
