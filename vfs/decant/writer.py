"""Writes archive stores with zarr-python (Zarr v2 format): pixels, husk, metadata, manifest."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numcodecs
import numpy as np

from vfs.decant.manifest import Manifest
from vfs.decant.store import MANIFEST_KEY

if TYPE_CHECKING:  # zarr costs ~0.1 s to import: only a pack pays it
    import zarr

HUSK_CHUNK = 256 * 1024  # a random 4 KiB husk read decodes at most this much
VERBATIM_CHUNK = 1024 * 1024

Progress = Callable[[int], None]
# zarr skips chunks equal to the fill value by default; a reader then cannot tell an all-zero
# plane from a lost one. Every chunk is written, and the manifest says so (all_chunks_stored).
STORE_EVERY_CHUNK = {"write_empty_chunks": True}


@dataclass(frozen=True)
class CodecChoice:
    """Pixel codec: blosc with a compressor name, shuffle and level (recorded in each .zarray)."""

    cname: str = "zstd"
    clevel: int = 5
    shuffle: str = "byteshuffle"

    @classmethod
    def parse(cls, text: str) -> CodecChoice:
        """'zstd', 'lz4:5', 'zstd:bitshuffle:3' → a choice; spec strings like blosc:zstd:… too."""
        parts = [p for p in text.split(":") if p and p != "blosc"]
        choice = cls()
        for part in parts:
            if part.startswith("clevel="):
                part = part.removeprefix("clevel=")
            if part.isdigit():
                choice = cls(choice.cname, int(part), choice.shuffle)
            elif part in ("noshuffle", "byteshuffle", "bitshuffle"):
                choice = cls(choice.cname, choice.clevel, part)
            else:
                choice = cls(part, choice.clevel, choice.shuffle)
        if choice.cname not in numcodecs.blosc.list_compressors():  # type: ignore[attr-defined]
            raise ValueError(f"unknown blosc compressor {choice.cname!r}")
        return choice

    def codec(self) -> numcodecs.Blosc:
        shuffle = {"noshuffle": 0, "byteshuffle": 1, "bitshuffle": 2}[self.shuffle]
        return numcodecs.Blosc(cname=self.cname, clevel=self.clevel, shuffle=shuffle)

    def describe(self) -> str:
        return f"blosc:{self.cname}:{self.shuffle}:clevel={self.clevel}"


def husk_codec() -> numcodecs.Blosc:
    return numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)


class ArchiveWriter:
    """One archive being written. Group attributes are set once, at creation: rewriting a key in
    a zip store appends a duplicate entry."""

    def __init__(self, path: Path, attrs: dict[str, Any]) -> None:
        import zarr
        import zarr.storage

        self.path = path
        if path.name.endswith(".zip"):
            self.store: Any = zarr.storage.ZipStore(path, mode="w")
        else:
            self.store = zarr.storage.LocalStore(path)
        self.group = zarr.create_group(self.store, zarr_format=2, attributes=attrs)

    def pixel_array(
        self,
        name: str,
        shape: Sequence[int],
        page_ndim: int,
        dtype: np.dtype[Any],
        codec: CodecChoice,
    ) -> zarr.Array:
        chunks = (*([1] * (len(shape) - page_ndim)), *shape[len(shape) - page_ndim :])
        return self.group.create_array(
            name,
            shape=tuple(shape),
            chunks=chunks,
            dtype=dtype,
            compressors=codec.codec(),
            fill_value=0,
            overwrite=True,
            config=STORE_EVERY_CHUNK,
        )

    def byte_array(self, name: str, blocks: Iterable[bytes], size: int, chunk: int) -> None:
        """A 1-D uint8 array filled from a stream of blocks, written a chunk at a time."""
        arr = self.group.create_array(
            name,
            shape=(size,),
            chunks=(chunk,),
            dtype="uint8",
            compressors=husk_codec(),
            fill_value=0,
            overwrite=True,
            config=STORE_EVERY_CHUNK,
        )
        pos, pending = 0, bytearray()
        for block in blocks:
            pending += block
            while len(pending) >= chunk:
                arr[pos : pos + chunk] = np.frombuffer(bytes(pending[:chunk]), dtype=np.uint8)
                del pending[:chunk]
                pos += chunk
        if pending:
            arr[pos : pos + len(pending)] = np.frombuffer(bytes(pending), dtype=np.uint8)
            pos += len(pending)
        if pos != size:
            raise OSError(
                f"{name}: wrote {pos} bytes, expected {size} (file changed while packing?)"
            )

    def finish(self, manifest: Manifest) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        buf = default_buffer_prototype().buffer.from_bytes(manifest.dumps())
        sync(self.store.set(MANIFEST_KEY, buf))
        self.store.close()

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # best effort: the caller removes the temp path
            self.store.close()


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and folder of a directory archive."""
    if path.is_file():
        _fsync(path)
        return
    for root, _dirs, files in os.walk(path):
        for name in files:
            _fsync(Path(root) / name)
        _fsync_dir(Path(root))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = _fsync_dir
