"""What a small hostile image file of an AcqStore collection may make the daemon allocate (red
team, round 43): a zipped image's central directory, and an OME-XML description of the
channels a `.zarray` of a few hundred bytes claims."""

from __future__ import annotations

import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.toolbox import load_tool
from vfs.acqstore.ngff import (
    MAX_ZIP_DIRECTORY,
    Axis,
    inspect_image,
    open_full_resolution,
    open_zip,
)
from vfs.acqstore.synth_tiff import TiffLayout
from vfs.acqstore.tiff_meta import MAX_OME_CHANNELS
from vfs.errors import ManifestError

corpus = load_tool("make_acqstore_corpus")
CYX = [Axis("c", "channel"), Axis("y", "space"), Axis("x", "space")]


def test_a_zipped_image_of_too_many_entries_is_refused_saying_why(tmp_path: Path) -> None:
    """1,000,000 one-byte entries (95 MB) took the daemon to 637 MB when the collection was
    listed: zipfile makes a ZipInfo per entry. 30,000 are enough to pass the bound here."""
    data = np.zeros((1, 8, 8), np.uint16)
    junk = {f"junk/{i}": b"" for i in range(30_000)}
    path = corpus.write_ome_zarr_zip(tmp_path / "img.ozx", data, "cyx", [1, 1, 1], junk)
    with pytest.raises(ManifestError, match=f"more than the {MAX_ZIP_DIRECTORY} a zipped image"):
        inspect_image(path)
    small = corpus.write_ome_zarr_zip(tmp_path / "ok.ozx", data, "cyx", [1, 1, 1])
    assert inspect_image(small).shape == (1, 8, 8)  # an ordinary one still reads


def test_an_open_parses_the_zip_again_within_the_bound(tmp_path: Path) -> None:
    """The TIFF's open parses the zip again (zarr's ZipStore): one rewritten with many entries
    since it was inspected (its owner may) is refused there too; eight opens of the 1,000,000
    entry one held 4.3 GB."""
    data = np.arange(64, dtype=np.uint16).reshape(1, 8, 8)
    path = corpus.write_ome_zarr_zip(tmp_path / "img.ozx", data, "cyx", [1, 1, 1])
    image = inspect_image(path)
    array, release = open_full_resolution(image)
    try:
        assert np.array_equal(array[0], data[0])  # an ordinary one opens and reads
    finally:
        release()
    junk = {f"junk/{i}": b"" for i in range(30_000)}
    corpus.write_ome_zarr_zip(path, data, "cyx", [1, 1, 1], junk)
    with pytest.raises(ManifestError, match="a zipped image may have"):
        open_full_resolution(image)


def test_a_claimed_central_directory_is_not_read(tmp_path: Path) -> None:
    """A sparse .ozx (a few KiB on disk) whose end record claims 64 MiB of central directory:
    zipfile read it all (4 GiB claimed took the daemon to 4.25 GB)."""
    claimed = 64 << 20
    path = tmp_path / "sparse.ozx"
    with open(path, "wb") as f:
        f.truncate(claimed)  # zeros, no blocks
        f.seek(claimed)
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, claimed, 0, 0))
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match=f"{claimed} bytes, more than"):
            inspect_image(path)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated to refuse it"


def test_the_bound_holds_only_while_the_directory_is_parsed(tmp_path: Path) -> None:
    big = 4 * MAX_ZIP_DIRECTORY  # a member larger than the bound is read whole afterwards
    path = tmp_path / "member.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("0/0.0.0", b"\x01" * big)
    with open(path, "rb") as f, open_zip(f) as zf:
        assert zf.read("0/0.0.0") == b"\x01" * big


def test_ome_xml_of_very_many_channels_lists_none() -> None:
    """10,000,000 channels made a 450 MB description, 2 GB of the daemon when listed."""
    layout = TiffLayout(CYX, [MAX_OME_CHANNELS + 1, 1, 1], "<i4", [1.0, 1.0, 1.0])
    text = layout.description.decode()
    assert layout.flavor == "ome" and len(text) < 2048, len(text)
    assert f'SizeC="{MAX_OME_CHANNELS + 1}"' in text and "<Channel " not in text
    few = TiffLayout(CYX, [MAX_OME_CHANNELS, 1, 1], "<i4", [1.0, 1.0, 1.0]).description
    assert few.decode().count("<Channel ") == MAX_OME_CHANNELS  # up to the bound, each listed


def test_a_deflated_entry_is_not_inflated_past_its_bound(tmp_path: Path) -> None:
    """A 312 KB .ozx whose one chunk (15 KB of pixels) was a deflated run of 300 MB of zeros
    took the daemon to 1.3 GB for one read of its TIFF: zarr reads an entry whole."""
    data = np.arange(1, 65, dtype=np.uint16).reshape(1, 8, 8)  # not the fill value: written
    plain = corpus.write_ome_zarr_zip(tmp_path / "plain.ozx", data, "cyx", [1, 1, 1])
    bomb = tmp_path / "bomb.ozx"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(bomb, "w") as out:
        chunks = [n for n in src.namelist() if n.startswith("0/") and "/." not in f"/{n}"]
        assert chunks
        for name in src.namelist():
            if name in chunks:
                out.writestr(name, bytes(32 << 20), zipfile.ZIP_DEFLATED)
            else:
                out.writestr(name, src.read(name))
    image = inspect_image(bomb)
    array, release = open_full_resolution(image)
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match="inflated, more than the 16777216"):
            array[0]
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        release()
    assert peak < 8 << 20, f"{peak} bytes allocated to refuse it"
