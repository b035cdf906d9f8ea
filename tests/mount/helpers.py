"""Damaged and altered archives for mount tests (zip entries are STORED: rewrite freely)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path


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
