"""Damaged and altered archives for mount tests (zip entries are STORED: rewrite freely), and
waiting on a writable mount's pack queue."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tifffile

if TYPE_CHECKING:
    from tests.mount.conftest import Mount


def rewrite_zip(src: Path, dst: Path, edits: dict[str, Callable[[bytes], bytes]]) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename in edits:
                data = edits[info.filename](data)
            zout.writestr(info.filename, data)


def edit_manifest(change: Callable[[dict], None]) -> dict[str, Callable[[bytes], bytes]]:  # type: ignore[type-arg]
    def apply(raw: bytes) -> bytes:
        doc = json.loads(raw)
        change(doc)
        return json.dumps(doc).encode()

    return {".decant/manifest.json": apply}


def flip_byte(at: int = -1) -> Callable[[bytes], bytes]:
    def apply(raw: bytes) -> bytes:
        buf = bytearray(raw)
        buf[at] ^= 0x5A
        return bytes(buf)

    return apply


def dd_direct(path: Path, offset: int, size: int = 4096) -> subprocess.CompletedProcess[bytes]:
    """One small read at `offset` by dd (direct: no kernel read-ahead around it)."""
    return subprocess.run(
        ["dd", f"if={path}", "bs=4096", f"skip={offset // 4096}", f"count={size // 4096}",
         "iflag=direct", "status=none"],
        capture_output=True, timeout=120,
    )  # fmt: skip


def small_reads_fail_within(
    path: Path, offset: int, want: bytes, whole: bytes, seconds: float
) -> None:
    """4 KiB reads at `offset` (of a range served wrong: `want` is what belongs there, `whole`
    the file's true bytes) until one fails with EIO; each that succeeds before must be `want`
    or come within `seconds`. The first read may slip through: it starts the check."""
    dd_direct(path, offset)
    deadline = time.monotonic() + seconds
    while True:
        got = dd_direct(path, offset)
        if got.returncode != 0:
            assert b"Input/output error" in got.stderr, got.stderr
            return
        assert got.stdout == want or time.monotonic() < deadline, (
            "a small read of the reordered segment still served another segment's plaintext "
            f"with exit 0 after {seconds:g} s (matches offset {whole.find(got.stdout)}, "
            f"asked {offset})"
        )
        time.sleep(0.5)


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout:.0f} s")
        time.sleep(0.05)


def settled(m: Mount) -> bool:
    """Nothing spooled (published or gone) and nothing queued."""
    doc = status(m.mnt)
    spool = m.src / ".decant-spool" / "files"
    try:
        left = [p for p in spool.rglob("*") if p.is_file()] if spool.exists() else []
    except FileNotFoundError:  # the daemon removed a spool folder while it was walked
        return False  # not settled yet: asked again
    return not left and doc["queued"] == 0 and doc["packing"] == 0


def tiff(seed: int) -> bytes:
    buf = io.BytesIO()
    data = np.random.default_rng(seed).integers(0, 60000, (2, 24, 16), dtype=np.uint16)
    tifffile.imwrite(buf, data, photometric="minisblack")
    return buf.getvalue()


def folder_archive(tif: Path, dest: Path) -> bytes:
    """`dest` (a `NAME.zarr/`): the archive of the TIFF `tif`, packed beside it and unzipped,
    every entry readable by all; returns the TIFF's bytes."""
    from vfs.decant.packer import pack_file

    packed = tif.with_name(f"{tif.name}.zarr.zip")
    pack_file(tif, packed)
    with zipfile.ZipFile(packed) as zf:
        zf.extractall(dest)
    for dirpath, _dirs, files in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return tif.read_bytes()


def verdict(path: Path) -> str:
    """The shown file's `user.decant.verified`."""
    return os.getxattr(path, "user.decant.verified").decode()


def read_through(path: Path, timeout: float, poll: float = 0.1) -> bytes | int:
    """The whole file read through a new handle, once it reads without error within `timeout`
    seconds; else the last errno."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return path.read_bytes()
        except OSError as exc:
            if time.monotonic() > deadline:
                return exc.errno or -1
            time.sleep(poll)
