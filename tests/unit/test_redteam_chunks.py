"""A hostile collection owner against the synthesized-TIFF fast path (vfs/acqstore/chunks.py):
the image folder passed `refuse_links` when the view was built, then a chunk file is swapped
for a symlink (or a FIFO). The daemon reads chunks as root, so the plane must not carry the
link target's bytes, and a read must not wait on a FIFO."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import zarr

from vfs.acqstore.chunks import PlaneReader, store_folder

SHAPE = (1, 1, 16, 16)


def _reader(path: Path) -> PlaneReader:
    array = zarr.create_array(str(path), shape=SHAPE, dtype="<u2", chunks=SHAPE,
                              compressors=None, zarr_format=2)  # fmt: skip
    array[:] = np.arange(256, dtype="<u2").reshape(SHAPE)
    opened = zarr.open_array(str(path), mode="r")
    return PlaneReader(opened, store_folder(opened))


def test_a_chunk_swapped_for_a_symlink_is_not_read(tmp_path: Path) -> None:
    reader = _reader(tmp_path / "a.zarr")
    assert reader.read_plane((0, 0)) is not None  # control: the fast path serves this layout
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret " * 100)  # longer than the chunk: a raw read takes it
    chunk = tmp_path / "a.zarr" / "0.0.0.0"
    chunk.unlink()
    chunk.symlink_to(secret)
    try:
        got = reader.read_plane((0, 0))
    except OSError:
        return
    assert got is None or b"root's secret" not in bytes(got)


def test_a_chunk_swapped_for_a_fifo_does_not_block(tmp_path: Path) -> None:
    reader = _reader(tmp_path / "a.zarr")
    chunk = tmp_path / "a.zarr" / "0.0.0.0"
    chunk.unlink()
    os.mkfifo(chunk)
    done = threading.Event()

    def read() -> None:
        with contextlib.suppress(Exception):  # refused, or garbage once let go
            reader.read_plane((0, 0))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    blocked = not done.wait(5)
    if blocked:  # let the reader go, or the thread outlives the test
        os.close(os.open(chunk, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked, "reading a plane waited on a FIFO"
