"""Mode D archives of small TIFFs written as zip members directly, without zarr-python.

zarr-python costs ~10 ms per archive whatever its size (a group and two arrays created through
its event-loop thread, a thread pool per plane write), and packing rsync'd small TIFFs paid it
thousands of times: 20-30 ms a file in all, most of "everything published" in
`tools/bench.py ingest --small`. A small file's archive is a handful of members: the same JSON
zarr writes (zarr v2, `json_indent` 2), the same blosc chunks (numcodecs, as zarr calls it) and
the same manifest, in a STORED zip as zarr's ZipStore makes one. `tests/unit/test_smallpack.py`
holds every member equal to the zarr path's for the layouts taken here, and reads the archive
back with the ordinary reader and with zarr-python. Large files keep the zarr path (packer.py).

The archive is verified from disk before it is returned (reconstructed by the ordinary reader
and compared with the original's bytes); it is not fsynced: the caller makes a batch durable
at once before any spooled original is deleted (vfs/ingest/publish.py `sync_placed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

import vfs
from vfs.decant.layout import deserialize_page, page_coordinate
from vfs.decant.manifest import Manifest
from vfs.decant.packer import ngff_attrs
from vfs.decant.regions import HUSK, RegionIndex
from vfs.decant.store import MANIFEST_KEY
from vfs.decant.tiffscan import TiffLayout
from vfs.decant.writer import HUSK_CHUNK, CodecChoice, husk_codec
from vfs.errors import IntegrityError, PackError

SMALL_MAX = 4 << 20  # files up to this size are read whole and packed here
JSON_INDENT = 2  # zarr-python's default `json_indent`
# dtypes whose .zarray this module writes exactly as zarr-python does (tested member by member)
KINDS = "uif"


def fits(size: int, layout: TiffLayout, pyramid: int) -> bool:
    """Whether this file's archive is made here (else by the zarr path)."""
    return size <= SMALL_MAX and pyramid == 0 and layout.dtype.kind in KINDS


def pack_small(
    name: str, data: bytes, layout: TiffLayout, out: Path, codec: CodecChoice, sha256: str = ""
) -> None:
    """Write the mode D archive of the TIFF `data` (named `name`, described by `layout`) to the
    new file `out`, and verify it from disk. Not fsynced (see the module docstring)."""
    size = len(data)
    sha = sha256 or hashlib.sha256(data).hexdigest()
    husk_size = size - layout.pixel_bytes
    leading = layout.canonical_leading
    members: list[tuple[str, bytes]] = []
    attrs = ngff_attrs(name, layout.canonical_axes, layout.page_shape, 0)
    attrs["decant"]["husk"] = "husk"
    members += [(".zgroup", _json({"zarr_format": 2})), (".zattrs", _json(attrs))]
    shape = (*leading, *layout.page_shape)
    chunks = (*([1] * len(leading)), *layout.page_shape)
    pixels = codec.codec()
    members += [("0/.zarray", _zarray(shape, chunks, layout.dtype, pixels.get_config())),
                ("0/.zattrs", b"{}")]  # fmt: skip
    tail = (0,) * len(layout.page_shape)
    for page in layout.pages:
        coord = page_coordinate(page.index, leading, layout.plane_order)
        buf = b"".join(_segment(data, o, c) for o, c in zip(page.dataoffsets, page.databytecounts,
                                                            strict=True))  # fmt: skip
        plane = np.ascontiguousarray(deserialize_page(buf, page, layout.dtype))
        members.append((_key("0", (*coord, *tail)), bytes(pixels.encode(plane))))
    members += _husk(data, layout, husk_size)
    manifest = Manifest(
        format=1,
        mode="byte-exact",
        original_name=name,
        original_size=size,
        original_sha256=sha,
        byteorder=layout.byteorder,
        decant_version=vfs.__version__,
        pixel_codec=codec.describe(),
        pages=layout.pages,
        plane_order=layout.plane_order,
        husk_raw_size=husk_size,
        all_chunks_stored=True,
    )
    members.append((MANIFEST_KEY, manifest.dumps()))
    _write_zip(out, members)
    verify_small(out, data)


def _husk(data: bytes, layout: TiffLayout, husk_size: int) -> list[tuple[str, bytes]]:
    """The husk array: every non-pixel byte in offset order, in full chunks (zarr pads the last
    one with the fill value, 0)."""
    regions = RegionIndex.build(layout.pages, len(data), husk_size, "small TIFF")
    husk = b"".join(data[r.start : r.start + r.length] for r in regions if r.page == HUSK)
    if len(husk) != husk_size:
        raise PackError(f"husk of {husk_size} bytes expected, {len(husk)} found")
    codec = husk_codec()
    out = [("husk/.zarray", _zarray((husk_size,), (HUSK_CHUNK,), np.dtype("uint8"),
                                    codec.get_config())), ("husk/.zattrs", b"{}")]  # fmt: skip
    for i, start in enumerate(range(0, husk_size, HUSK_CHUNK)):
        block = np.zeros(HUSK_CHUNK, dtype=np.uint8)
        piece = husk[start : start + HUSK_CHUNK]
        block[: len(piece)] = np.frombuffer(piece, dtype=np.uint8)
        out.append((f"husk/{i}", bytes(codec.encode(block))))
    return out


def _segment(data: bytes, offset: int, count: int) -> bytes:
    if offset < 0 or offset + count > len(data):
        raise PackError(f"pixel segment at {offset}+{count} beyond the file's {len(data)} bytes")
    return data[offset : offset + count]


def _key(array: str, coords: tuple[int, ...]) -> str:
    return f"{array}/{'.'.join(str(c) for c in coords)}"


def _json(doc: Any) -> bytes:
    return json.dumps(doc, indent=JSON_INDENT, allow_nan=True).encode()


def _zarray(
    shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype[Any], codec: dict[str, Any]
) -> bytes:
    """A zarr v2 .zarray as zarr-python 3 writes it (key order included)."""
    doc = {
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": dtype.str,
        "fill_value": 0.0 if dtype.kind == "f" else 0,
        "order": "C",
        "filters": None,
        "dimension_separator": ".",
        "compressor": codec,
        "zarr_format": 2,
    }
    return _json(doc)


def _write_zip(out: Path, members: list[tuple[str, bytes]]) -> None:
    """Stored entries with the attributes zarr's ZipStore gives them; the file is made 0600
    (its final mode is set once it verified, as in the zarr path)."""
    fd = os.open(out, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    stamp = time.localtime(time.time())[:6]
    with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, True) as zf:
        for key, value in members:
            info = zipfile.ZipInfo(filename=key, date_time=stamp)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            zf.writestr(info, value)


def verify_small(archive: Path, original: bytes) -> None:
    """Reconstruct the original from `archive` as read back from disk with the ordinary reader,
    whole (it is small), and compare every byte."""
    from vfs.decant.reader import DecantArchive
    from vfs.decant.verify import private_cache

    with DecantArchive.open(archive) as a:
        (info,) = a.originals()
        reader = a.open_original(info.relpath, private_cache(a))
        got = bytearray()
        while len(got) < info.size:
            block = reader.read(len(got), info.size - len(got))
            if not block:
                break
            got += block
    if info.size != len(original) or got != original:
        raise IntegrityError(f"{archive}: does not reconstruct to the original's bytes")
