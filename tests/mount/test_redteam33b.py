"""Red team, round 33b: bytes served wrong without an error, through a real mount.

Expected bytes come from what was handed to the writers (the TAR plaintext, the TIFF written),
never from vfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import tifffile

from tests.conftest import load_tool
from tests.mount.conftest import Mount, settle
from tests.mount.helpers import small_reads_fail_within
from tests.mount.test_bit_rot import _data_offset, _on_device
from tests.mount.test_ingest_space import ext4_src  # noqa: F401 (a fixture)
from tests.mount.test_write_side import wait_status
from vfs.decant import MANIFEST_KEY
from vfs.decant.packer import PackOptions, pack_file

corpus: ModuleType = load_tool("make_c4gh_corpus")

SEG = 65536
CIPHER_SEG = SEG + 28


def swapped_segments(
    tmp_path: Path, size: int, bad: int | None = None
) -> tuple[Path, Path, str, bytes, int]:
    """`src/P.tar.c4gh` holding one member of `size` random bytes (its sha256 declared), the
    member's segments 2 and 4 swapped in the package (and segment `bad` with one bit of its
    ciphertext flipped: its MAC fails). Returns src, the node's secret key, the member's name,
    its true bytes, and an offset inside the first swapped segment."""
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(size)
    name = "allele-freq.chr1.0.br10000000.00000000000000aa.parquet"
    members = [(name, data)]
    plain = corpus.write_package(
        src / "P.tar.c4gh", [("manifest.json", corpus.manifest(members)), *members],
        keys["writer"], [keys["node"]],
    )  # fmt: skip
    at = plain.index(data)
    package = bytearray((src / "P.tar.c4gh").read_bytes())
    head = corpus.header_len_of(bytes(package))
    a, b = at // SEG + 2, at // SEG + 4  # two segments wholly inside the member's data
    sa = slice(head + a * CIPHER_SEG, head + (a + 1) * CIPHER_SEG)
    sb = slice(head + b * CIPHER_SEG, head + (b + 1) * CIPHER_SEG)
    package[sa], package[sb] = package[sb], package[sa]
    if bad is not None:
        package[head + (at // SEG + bad) * CIPHER_SEG + 100] ^= 0x01
    (src / "P.tar.c4gh").write_bytes(bytes(package))
    return src, keys["node"].secret_path, name, data, a * SEG - at + 4096


def test_reordered_segments_of_a_gdi_package_are_refused_once_checked(tmp_path: Path) -> None:
    """crypt4gh authenticates each 64 KiB segment alone: two segments of one member's data
    swapped in the package both authenticate, and the member's plaintext is wrong. The member
    has a declared sha256 (manifest payload); a whole read fails on it, but small reads never
    lead to a check (no background verification for "authenticated" packages), so every small
    read of the swapped range kept serving another segment's bytes with exit 0."""
    src, secret, name, data, off = swapped_segments(tmp_path, 8 * SEG)

    m = Mount(src, tmp_path / "mnt", tmp_path / "log", tmp_path / "index")
    m.start("--c4gh-key", str(secret))
    try:
        member = m.mnt / "P.tar.c4gh" / name
        small_reads_fail_within(member, off, data[off : off + 4096], data, 10)
        # A whole read of the member fails too.
        assert subprocess.run(["cat", str(member)], capture_output=True).returncode != 0
    finally:
        m.stop()


def test_a_rotten_manifest_byte_of_a_verified_archive_is_an_error(
    ext4_src: Path,  # noqa: F811
    make_mount: Any,
    tmp_path: Path,
) -> None:
    """One bit rots in the manifest of a zip archive that verified (a page's data offset, 256
    → 246: the manifest still parses and checks, and the original rebuilds shifted). Once an
    archive verified, its digest map replaces the zip's CRC-32, but it held digests of chunks
    only: the manifest and the `.zarray`s were read with no check at all, and a fresh daemon on
    the same index served the shifted original as verified, with exit 0."""
    data = np.random.default_rng(1).integers(0, 65535, (4, 256, 256), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "s.tif", data, photometric="minisblack")
    original = (tmp_path / "s.tif").read_bytes()
    path = pack_file(tmp_path / "s.tif", ext4_src / "s.tif.zarr.zip", PackOptions()).archive
    settle(path)  # its description kept in the index: what the fresh daemon below serves

    m = make_mount(ext4_src)
    assert (m.mnt / "s.tif").read_bytes() == original
    wait_status(m.mnt, lambda doc: doc["daemon"]["verified"] == 1)
    m.stop()

    with zipfile.ZipFile(path) as zf:
        manifest = zf.read(MANIFEST_KEY)
    at = manifest.index(b'"dataoffsets": [') + len(b'"dataoffsets": [')
    at += len(manifest[at:]) - len(manifest[at:].lstrip())
    assert manifest[at : at + 4] == b"256\n", manifest[at : at + 8]
    before = os.stat(path)
    rot = _data_offset(path, MANIFEST_KEY) + at + 1  # the "5": a 4 after one bit flips
    device_byte = _on_device(path, rot)
    image = ext4_src.parent / "src.img"
    os.sync()
    with open(image, "r+b") as fh:
        fh.seek(device_byte)
        assert fh.read(1) == b"5"
        fh.seek(device_byte)
        fh.write(b"4")
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    with open(path, "rb") as fh:
        fh.seek(rot - 1)
        assert fh.read(3) == b"246", "the rot did not land"
    stamp = ("st_size", "st_mtime_ns", "st_ino", "st_ctime_ns")
    assert [getattr(os.stat(path), k) for k in stamp] == [getattr(before, k) for k in stamp]

    m = make_mount(ext4_src, "--index-dir", str(tmp_path / "mnt-index"), name="again")
    got = subprocess.run(["cat", str(m.mnt / "s.tif")], capture_output=True, timeout=20)
    assert got.returncode != 0 or got.stdout == original, (
        f"a verified archive with a rotten manifest served {len(got.stdout)} bytes with exit 0, "
        f"{sum(a != b for a, b in zip(got.stdout, original, strict=False))} of them wrong"
    )
    assert got.returncode != 0 and b"Input/output error" in got.stderr, got.stderr
    assert "manifest" in m.log_text()


def test_a_folder_archive_whose_manifest_is_replaced_after_it_verified_is_an_error(
    make_mount: Any, tmp_path: Path
) -> None:
    """A `.zarr/` archive's verified state is keyed by the folder's own stamp, which a file
    renamed into `.decant/` leaves as it was. A manifest with two pages' chunks swapped (every
    chunk still matches its digest) was served by a fresh daemon on the same index as the
    verified original, two planes swapped, with exit 0."""
    data = np.random.default_rng(1).integers(0, 65535, (4, 256, 256), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "s.tif", data, photometric="minisblack")
    original = (tmp_path / "s.tif").read_bytes()
    src = tmp_path / "src"
    src.mkdir()
    path = pack_file(tmp_path / "s.tif", src / "s.tif.zarr", PackOptions()).archive

    m = make_mount(src)
    assert (m.mnt / "s.tif").read_bytes() == original
    wait_status(m.mnt, lambda doc: doc["daemon"]["verified"] == 1)
    m.stop()

    top = os.stat(path)
    doc = json.loads((path / MANIFEST_KEY).read_text())
    doc["pages"][0]["index"], doc["pages"][1]["index"] = 1, 0
    (path / ".decant" / "new.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(path / ".decant" / "new.json", path / MANIFEST_KEY)
    stamp = ("st_size", "st_mtime_ns", "st_ino", "st_ctime_ns")
    assert [getattr(os.stat(path), k) for k in stamp] == [getattr(top, k) for k in stamp]

    m = make_mount(src, "--index-dir", str(tmp_path / "mnt-index"), name="again")
    got = subprocess.run(["cat", str(m.mnt / "s.tif")], capture_output=True, timeout=20)
    assert got.returncode != 0 or got.stdout == original, (
        f"a verified folder archive with a replaced manifest served {len(got.stdout)} bytes "
        f"with exit 0, {sum(a != b for a, b in zip(got.stdout, original, strict=False))} wrong"
    )
    assert b"Input/output error" in got.stderr, got.stderr
