"""crypt4gh-encrypted TAR packages (GDI `.tar.c4gh`): header framing, segment decryption, TAR index.

Pure and synchronous: nothing here imports pyfuse3 or trio. The names below are loaded from their
submodules on first use, and the crypt4gh library and `cryptography` only when a header is opened
or a segment decrypted, so the daemon starts without paying for what a remount does not touch
(tarfile, for one, is needed only to walk a package not indexed yet).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "OpenedHeader": "header",
    "fingerprint": "header",
    "header_len": "header",
    "open_header": "header",
    "open_package": "header",
    "CIPHER_SEGMENT_SIZE": "segments",
    "PAGE_SIZE": "segments",
    "SEGMENT_SIZE": "segments",
    "SegmentReader": "segments",
    "SegmentStats": "segments",
    "cipher_offset": "segments",
    "plaintext_capacity": "segments",
    "Member": "tarindex",
    "TarIndex": "tarindex",
    "build_index": "tarindex",
}

if TYPE_CHECKING:
    from vfs.c4gh.header import OpenedHeader, fingerprint, header_len, open_header, open_package
    from vfs.c4gh.segments import (
        CIPHER_SEGMENT_SIZE,
        PAGE_SIZE,
        SEGMENT_SIZE,
        SegmentReader,
        SegmentStats,
        cipher_offset,
        plaintext_capacity,
    )
    from vfs.c4gh.tarindex import Member, TarIndex, build_index


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CIPHER_SEGMENT_SIZE",
    "PAGE_SIZE",
    "SEGMENT_SIZE",
    "Member",
    "OpenedHeader",
    "SegmentReader",
    "SegmentStats",
    "TarIndex",
    "build_index",
    "cipher_offset",
    "fingerprint",
    "header_len",
    "open_header",
    "open_package",
    "plaintext_capacity",
]
