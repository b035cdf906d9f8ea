"""A first (hashing) read through a real mount of a stack larger than the daemon's cache, so
planes drop behind the reader; chunks stored as they are (blosc clevel 0), so a flipped byte
decodes to wrong bytes and its zip CRC, rewritten, still passes. Only the sha256 can catch it:
the read that completes the file, and every later full read, must fail with EIO."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.helpers import flip_byte, rewrite_zip
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.writer import CodecChoice

STORED = PackOptions(codec=CodecChoice("zstd", 0, "noshuffle"))
PLANES = 24  # of 128 KiB: 3 MiB against a 1 MiB cache


def _pack(work: Path) -> tuple[Path, Path]:
    original = work / "stack.tif"
    rng = np.random.default_rng(9)
    tifffile.imwrite(original, rng.integers(0, 4000, (PLANES, 256, 256), dtype=np.uint16))
    archive = work / "stack.tif.zarr.zip"
    pack_file(original, archive, STORED)
    return original, archive


def _middle_chunk(archive: Path) -> str:
    with zipfile.ZipFile(archive) as z:
        chunks = sorted(n for n in z.namelist() if n.startswith("0/") and "/." not in n)
    assert len(chunks) == PLANES
    return chunks[PLANES // 2]


def _dd(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True)


def test_clean_stack_streams_and_verifies(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    original, archive = _pack(work)
    os.replace(archive, src / archive.name)
    m = make_mount(src, "--cache-size", "1M")
    shown = m.mnt / "stack.tif"
    assert os.getxattr(shown, "user.decant.verified") != b"yes"
    out = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == hashlib.sha256(original.read_bytes()).hexdigest()
    assert os.getxattr(shown, "user.decant.verified") == b"yes"
    assert "verified sha256" in m.log_text()


@pytest.mark.parametrize("where", ["pixel chunk", "husk"])
def test_damage_the_crc_misses_ends_in_eio(tmp_path: Path, make_mount, where: str) -> None:  # type: ignore[no-untyped-def]
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir(), src.mkdir()
    original, archive = _pack(work)
    entry = _middle_chunk(archive) if where == "pixel chunk" else "husk/0"
    rewrite_zip(archive, src / archive.name, {entry: flip_byte(-40)})  # CRC written anew
    with zipfile.ZipFile(src / archive.name) as z:
        assert z.testzip() is None  # every entry's CRC passes
    m = make_mount(src, "--cache-size", "1M")
    shown = m.mnt / "stack.tif"
    first = _dd(shown)
    assert first.returncode != 0, "dd read the damaged file whole"
    assert b"Input/output error" in first.stderr
    assert os.getxattr(shown, "user.decant.verified") == b"no"
    assert _dd(shown).returncode != 0  # and every later full read
    with pytest.raises(OSError) as caught:
        shown.read_bytes()
    assert caught.value.errno == errno.EIO
    assert "refusing to serve it" in m.log_text()
    assert original.stat().st_size == os.stat(shown).st_size
