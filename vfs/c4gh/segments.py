"""Segment maths of a crypt4gh body and per-segment ChaCha20-Poly1305 decryption through the cache.

Plaintext offset p lives in segment p // SEGMENT_SIZE, whose cipher text starts at
header_len + (p // SEGMENT_SIZE) * CIPHER_SEGMENT_SIZE: every segment but the last is full, so a
read never needs anything but arithmetic to find its bytes, and decrypts only what it touches.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from vfs.cache import PageCache
from vfs.errors import CorruptArchiveError

SEGMENT_SIZE = 65536
NONCE_SIZE = 12
TAG_SIZE = 16
CIPHER_SEGMENT_SIZE = SEGMENT_SIZE + NONCE_SIZE + TAG_SIZE  # 65564, a public crypt4gh constant
CACHE_PREFIX = "c4gh"

log = logging.getLogger(__name__)


def cipher_offset(header_len: int, segment_no: int) -> int:
    """File offset of the cipher text of segment `segment_no`."""
    return header_len + segment_no * CIPHER_SEGMENT_SIZE


def segment_count(header_len: int, file_size: int) -> int:
    """How many (possibly partial) cipher segments the body holds."""
    body = max(file_size - header_len, 0)
    return -(-body // CIPHER_SEGMENT_SIZE)


def plaintext_capacity(header_len: int, file_size: int) -> int:
    """Plaintext bytes the body would carry if every segment authenticates.

    A trailing fragment of at most nonce + tag bytes carries no plaintext (it is a truncation).
    """
    body = max(file_size - header_len, 0)
    full, rest = divmod(body, CIPHER_SEGMENT_SIZE)
    return full * SEGMENT_SIZE + max(rest - NONCE_SIZE - TAG_SIZE, 0)


def touched_segments(offset: int, size: int) -> range:
    """Segments a plaintext read of `size` bytes at `offset` touches (empty for size <= 0)."""
    if size <= 0:
        return range(0)
    return range(offset // SEGMENT_SIZE, (offset + size - 1) // SEGMENT_SIZE + 1)


@functools.lru_cache(maxsize=64)
def _aead(session_key: bytes) -> Any:
    # cryptography's OpenSSL ChaCha20-Poly1305 is ~3x faster per segment than crypt4gh's
    # libsodium binding here, and it is a crypt4gh dependency; imported lazily for start-up time.
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(session_key)


def decrypt_segment(cipher: bytes, session_key: bytes, *, name: str, segment_no: int) -> bytes:
    """Authenticate and decrypt one cipher segment (nonce ‖ cipher text ‖ tag).

    A failed tag raises CorruptArchiveError (EIO at the mount): tampered or cut bytes never
    reach a reader, as garbage or otherwise.
    """
    from cryptography.exceptions import InvalidTag

    if len(cipher) <= NONCE_SIZE + TAG_SIZE:
        raise CorruptArchiveError(
            f"{name}: segment {segment_no} is truncated ({len(cipher)} bytes of cipher text)"
        )
    view = memoryview(cipher)
    try:
        return bytes(_aead(session_key).decrypt(view[:NONCE_SIZE], view[NONCE_SIZE:], None))
    except InvalidTag:
        raise CorruptArchiveError(
            f"{name}: segment {segment_no} fails authentication (tampered or truncated package)"
        ) from None


class SegmentStats:
    """Counts segments actually decrypted (cache misses), shared by every reader of a backend.

    Each count is also a DEBUG line naming the package, the segment and both running totals: a
    daemon runs in its own process, and its log is how a test or an operator sees this counter
    (cheap: one level check per 64 KiB decrypted when DEBUG is off).
    """

    def __init__(self) -> None:
        self.decrypted = 0
        self.per_package: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, package: Path | str, segment_no: int) -> None:
        key = str(package)
        with self._lock:
            self.decrypted += 1
            mine = self.per_package[key] = self.per_package.get(key, 0) + 1
            total = self.decrypted
        log.debug(
            "%s: decrypted segment %d (%d for this package, %d in all)",
            key,
            segment_no,
            mine,
            total,
        )


class SegmentReader:
    """Plaintext of one package body, read by range, decrypting only the segments a read touches.

    Decrypted segments go through the shared PageCache under ("c4gh", package_path, segment_no),
    so a member read, a read-ahead and a TAR walk never decrypt the same segment twice. Reads use
    `os.pread` on one lazily opened descriptor, so worker threads can share a reader.
    """

    def __init__(
        self,
        path: Path | str,
        header_len: int,
        session_key: bytes,
        cache: PageCache,
        *,
        file_size: int | None = None,
        stats: SegmentStats | None = None,
    ) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.header_len = header_len
        self.file_size = os.stat(self.path).st_size if file_size is None else file_size
        self.size = plaintext_capacity(header_len, self.file_size)
        self.segments = segment_count(header_len, self.file_size)
        self.stats = stats if stats is not None else SegmentStats()
        self._key = session_key
        self._cache = cache
        self._fd: int | None = None
        self._lock = threading.Lock()

    def cache_key(self, segment_no: int) -> Hashable:
        return (CACHE_PREFIX, str(self.path), segment_no)

    def seed(self, segment_no: int, plaintext: bytes) -> None:
        """Keep a segment decrypted elsewhere (the header check decrypts segment 0)."""
        self._cache.put(self.cache_key(segment_no), plaintext)

    def segment(self, segment_no: int) -> bytes:
        """Plaintext of one segment, from the cache or decrypted now."""
        plain: bytes = self._cache.get_or_load(
            self.cache_key(segment_no), lambda: self._load(segment_no)
        )
        return plain

    def read(self, offset: int, size: int) -> bytes:
        """Plaintext bytes [offset, offset + size), short only at the end of the body."""
        end = min(offset + size, self.size)
        if offset < 0 or offset >= end:
            return b""
        parts: list[memoryview] = []
        for n in touched_segments(offset, end - offset):
            base = n * SEGMENT_SIZE
            lo, hi = max(offset - base, 0), min(end - base, SEGMENT_SIZE)
            plain = self.segment(n)
            if len(plain) < hi:
                raise CorruptArchiveError(f"{self.name}: segment {n} decrypts short")
            parts.append(memoryview(plain)[lo:hi])
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)

    def prefetch(self, first: int, count: int) -> None:
        """Decrypt up to `count` segments from `first` into the cache (sequential read-ahead)."""
        for n in range(max(first, 0), min(first + count, self.segments)):
            if self.cache_key(n) in self._cache:
                continue
            try:
                self.segment(n)
            except CorruptArchiveError:
                return  # the read that needs it reports the failure

    def verified_end(self) -> int:
        """Plaintext length up to which every segment can authenticate, judged by the last one.

        Only called when a TAR walk ended early, to tell a truncated tail from a complete one.
        """
        if self.segments == 0:
            return 0
        try:
            self.segment(self.segments - 1)
        except CorruptArchiveError:
            return (self.segments - 1) * SEGMENT_SIZE
        return self.size

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _descriptor(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return self._fd

    def _load(self, segment_no: int) -> bytes:
        if not 0 <= segment_no < self.segments:
            raise CorruptArchiveError(f"{self.name}: segment {segment_no} is past the end")
        start = cipher_offset(self.header_len, segment_no)
        want = min(CIPHER_SEGMENT_SIZE, self.file_size - start)
        cipher = os.pread(self._descriptor(), want, start)
        if len(cipher) != want:
            raise CorruptArchiveError(f"{self.name}: segment {segment_no} is cut short on disk")
        plain = decrypt_segment(cipher, self._key, name=self.name, segment_no=segment_no)
        self.stats.count(self.path, segment_no)
        return plain
