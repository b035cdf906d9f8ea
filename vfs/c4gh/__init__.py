"""crypt4gh-encrypted TAR packages (GDI `.tar.c4gh`): header framing, segment decryption, TAR index.

Pure and synchronous: nothing here imports pyfuse3 or trio, and the crypt4gh library and
`cryptography` are imported only when a header is opened or a segment decrypted, so the daemon
starts without paying for them.
"""

from __future__ import annotations

from vfs.c4gh.header import OpenedHeader, fingerprint, header_len, open_header, open_package
from vfs.c4gh.segments import (
    CIPHER_SEGMENT_SIZE,
    SEGMENT_SIZE,
    SegmentReader,
    SegmentStats,
    cipher_offset,
    plaintext_capacity,
)
from vfs.c4gh.tarindex import Member, TarIndex, build_index

__all__ = [
    "CIPHER_SEGMENT_SIZE",
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
