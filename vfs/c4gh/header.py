"""crypt4gh header: bounded framing, opening packets with secret keys, and binding the writer key.

The framing (magic ‖ version u32-le ‖ packet count u32-le ‖ length-prefixed packets) is parsed
here with hard bounds, because the header is attacker input read before anything authenticates
it. Opening a packet uses the crypt4gh library's header functions.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vfs.c4gh.segments import CIPHER_SEGMENT_SIZE, SegmentReader, SegmentStats, decrypt_segment
from vfs.cache import PageCache
from vfs.errors import CorruptArchiveError, DecryptError, NotAnArchiveError, UnsupportedFormatError
from vfs.stores.base import ByteSource

log = logging.getLogger(__name__)

MAGIC = b"crypt4gh"
VERSION = 1
PREAMBLE_LEN = 16  # magic(8) ‖ version(4) ‖ packet_count(4)
MIN_PACKET_LEN = 8  # its own u32 length ‖ u32 encryption method
MAX_PACKET_LEN = 8192
# One packet a recipient (a node's key; two while it is rotated): each packet tried costs an
# X25519 exchange, ~45 us. At 1024, a 120 KB package of junk packets took 52-80 ms to open and
# 300 links to one in a shared folder held its listing 21 s, a `touch` of it as long again (red
# team 91); at 64 a header opens in under 3 ms.
MAX_PACKETS = 64
MAX_HEADER_LEN = PREAMBLE_LEN + MAX_PACKETS * MAX_PACKET_LEN  # so a header read is capped

ReadAt = Callable[[int, int], bytes]


def _u32(buf: bytes, at: int) -> int:
    return int.from_bytes(buf[at : at + 4], "little")


def _frame(prefix: bytes, name: str) -> tuple[int | None, int, int]:
    """Walk the framing in `prefix`: (header length or None, bytes needed so far, packet index).

    Raises as soon as the bytes present are wrong, so a caller never fetches more of a file that
    cannot be a crypt4gh v1 package.
    """
    head = prefix[:8]
    if head != MAGIC[: len(head)]:
        raise NotAnArchiveError(f"{name}: not a crypt4gh file (bad magic)")
    if len(prefix) >= 12 and _u32(prefix, 8) != VERSION:
        raise UnsupportedFormatError(
            f"{name}: unsupported crypt4gh version {_u32(prefix, 8)} (only {VERSION} is read)"
        )
    if len(prefix) < PREAMBLE_LEN:
        return None, PREAMBLE_LEN, -1
    count = _u32(prefix, 12)
    if count > MAX_PACKETS:
        raise UnsupportedFormatError(
            f"{name}: header declares {count} packets, more than the {MAX_PACKETS} accepted"
        )
    pos = PREAMBLE_LEN
    for i in range(count):
        if len(prefix) < pos + 4:
            return None, pos + 4, i
        length = _u32(prefix, pos)
        if not MIN_PACKET_LEN <= length <= MAX_PACKET_LEN:
            raise CorruptArchiveError(
                f"{name}: header packet {i} declares length {length}, "
                f"outside {MIN_PACKET_LEN}..{MAX_PACKET_LEN}"
            )
        pos += length
    if len(prefix) < pos:
        return None, pos, count - 1
    return pos, pos, count - 1


def header_len(prefix: bytes, name: str = "crypt4gh prefix") -> int | None:
    """Length of the header (= offset of the body) framed by `prefix`, or None if it is too short.

    The header is 16 + Σ packet_len, each packet length counting its own 4-byte prefix. None means
    the prefix does not yet hold the whole header: fetch more and retry. Bad magic, another version
    or an out-of-bounds packet length raise a DecantError naming `name`.
    """
    return _frame(prefix, name)[0]


def read_header_bytes(read_at: ReadAt, file_size: int, name: str) -> bytes:
    """The whole header, read in as few steps as its framing allows, never past MAX_HEADER_LEN."""
    buf = read_at(0, min(4096, file_size))
    while True:
        length, needed, packet = _frame(buf, name)
        if length is not None:
            return buf[:length]
        if needed > file_size:
            where = f"header packet {packet}" if packet >= 0 else "header preamble"
            raise CorruptArchiveError(
                f"{name}: {where} runs past the end of the file "
                f"(header needs {needed} bytes, file has {file_size})"
            )
        # Ask for the packets we already know about in one read; the cap bounds a hostile header.
        want = min(max(needed, 2 * len(buf)), file_size, MAX_HEADER_LEN)
        more = read_at(len(buf), want - len(buf))
        if not more:
            raise CorruptArchiveError(f"{name}: file ended while reading the header")
        buf += more


def split_packets(header: bytes) -> list[bytes]:
    """The packets of a complete, already framed header, without their length prefixes."""
    packets, pos = [], PREAMBLE_LEN
    for _ in range(_u32(header, 12)):
        length = _u32(header, pos)
        packets.append(header[pos + 4 : pos + length])
        pos += length
    return packets


def fingerprint(public_key: bytes) -> str:
    """Writer identity as the node reports it: "sha256:" + hex SHA-256 of the raw X25519 key."""
    return "sha256:" + hashlib.sha256(public_key).hexdigest()


@dataclass(frozen=True)
class Candidate:
    """A header packet that opened with one of our keys: its session key and who wrapped it."""

    packet_no: int
    session_key: bytes = field(repr=False)
    writer_public_key: bytes


@dataclass(frozen=True)
class OpenedHeader:
    """What a package's header gives a reader. Holds a session key: memory only, never persist."""

    header_len: int
    packet_count: int
    session_key: bytes = field(repr=False)
    writer_public_key: bytes
    # Fingerprints of every opened packet that carries the session key the body decrypts with,
    # in header order; the first one is `writer_fingerprint`.
    writers: tuple[str, ...]

    @property
    def writer_fingerprint(self) -> str:
        return fingerprint(self.writer_public_key)


def _quiet_crypt4gh() -> None:
    # The library logs secret keys at DEBUG and an ERROR for every packet addressed to another
    # recipient; a daemon running with -v must print neither. Respect an explicit configuration.
    lib_log = logging.getLogger("crypt4gh")
    if lib_log.level == logging.NOTSET:
        lib_log.setLevel(logging.CRITICAL)


def open_packets(
    packets: Sequence[bytes], secret_keys: Sequence[bytes], name: str
) -> list[Candidate]:
    """Open every packet some key opens; refuse edit lists and unknown packet types or methods."""
    from crypt4gh import header as c4gh_header

    _quiet_crypt4gh()
    if not secret_keys:
        raise DecryptError(f"{name}: no crypt4gh secret key given")
    keys = [(0, bytes(sk), None) for sk in secret_keys]
    candidates: list[Candidate] = []
    for i, packet in enumerate(packets):
        plain = c4gh_header.decrypt_packet(packet, keys)
        if plain is None:
            continue  # addressed to someone else, or not X25519/ChaCha20-Poly1305
        try:
            data_packets, edit_list = c4gh_header.partition_packets([bytes(plain)])
            if edit_list is not None:
                raise UnsupportedFormatError(
                    f"{name}: header packet {i} is an edit list; edit lists are not supported "
                    "(refusing rather than serving shifted offsets)"
                )
            session_key = bytes(c4gh_header.parse_enc_packet(data_packets[0]))
        except ValueError as exc:
            raise UnsupportedFormatError(f"{name}: header packet {i}: {exc}") from None
        if len(session_key) != 32:
            raise CorruptArchiveError(f"{name}: header packet {i} holds a malformed session key")
        candidates.append(Candidate(i, session_key, bytes(packet[4:36])))
    if not candidates:
        raise DecryptError(
            f"{name}: none of the {len(packets)} header packet(s) opens with the given key(s) "
            "(wrong key?)"
        )
    return candidates


def bind_writer(
    candidates: Sequence[Candidate], first_segment: bytes, name: str
) -> tuple[Candidate, tuple[str, ...], bytes]:
    """The packet whose session key decrypts the first body segment, all its co-signers, and the
    plaintext. A packet that merely opens proves nothing: anyone can add one with a key of theirs.
    """
    tried: set[bytes] = set()
    for cand in candidates:
        if cand.session_key in tried:
            continue
        tried.add(cand.session_key)
        try:
            plain = decrypt_segment(first_segment, cand.session_key, name=name, segment_no=0)
        except CorruptArchiveError:
            continue
        same = [
            fingerprint(c.writer_public_key)
            for c in candidates
            if c.session_key == cand.session_key
        ]
        return cand, tuple(dict.fromkeys(same)), plain
    raise DecryptError(
        f"{name}: {len(candidates)} header packet(s) open but no session key decrypts the first "
        "body segment (tampered body or injected header packet)"
    )


def open_header(
    read_at: ReadAt, file_size: int, secret_keys: Sequence[bytes], name: str
) -> tuple[OpenedHeader, bytes]:
    """Frame and open the header, then bind the writer by decrypting body segment 0.

    Returns the header and segment 0's plaintext (so a caller can cache it rather than decrypt
    it a second time).
    """
    header = read_header_bytes(read_at, file_size, name)
    packets = split_packets(header)
    candidates = open_packets(packets, secret_keys, name)
    first = read_at(len(header), min(CIPHER_SEGMENT_SIZE, file_size - len(header)))
    if not first:
        raise CorruptArchiveError(f"{name}: the package has a header but no body")
    chosen, writers, plain = bind_writer(candidates, first, name)
    opened = OpenedHeader(
        header_len=len(header),
        packet_count=len(packets),
        session_key=chosen.session_key,
        writer_public_key=chosen.writer_public_key,
        writers=writers,
    )
    return opened, plain


def source_read_at(source: ByteSource) -> ReadAt:
    """`read_at` over a byte source, short at its end as a pread is (the framing checks lengths)."""

    def read_at(offset: int, size: int) -> bytes:
        have = max(0, min(size, source.size - offset))
        return source.read(offset, have) if have else b""

    return read_at


def open_source(
    source: ByteSource,
    secret_keys: Sequence[bytes],
    cache: PageCache,
    stats: SegmentStats | None = None,
) -> tuple[OpenedHeader, SegmentReader]:
    """`open_package` for a package in a byte source (a LocalFile, an object in a bucket).

    The reader returned owns `source`; on failure `source` is closed before the error propagates.
    """
    name = source.name.rpartition("/")[2]
    try:
        header, first = open_header(source_read_at(source), source.size, secret_keys, name)
    except BaseException:
        source.close()
        raise
    reader = SegmentReader(
        source, header.header_len, header.session_key, cache, file_size=source.size, stats=stats
    )
    reader.stats.count(reader.label, 0)
    reader.seed(0, first)
    return header, reader


def open_package(
    path: Path | str | ByteSource,
    secret_keys: Sequence[bytes],
    cache: PageCache,
    stats: SegmentStats | None = None,
) -> tuple[OpenedHeader, SegmentReader]:
    """Open a package's header and return a reader of its plaintext, segment 0 cached.

    `path` is a local path or a byte source (see `open_source`, which owns the source).
    """
    if not isinstance(path, (str, Path)):
        return open_source(path, secret_keys, cache, stats)
    path = Path(path)
    # Non-blocking: a FIFO named like a package (`decant c4gh verify inbox/*`) would hold a
    # blocking open until a writer came, for good if none does.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before open(fd) refuses a folder naming only the fd
        os.close(fd)
        raise NotAnArchiveError(f"{path.name}: not a regular file")
    with open(fd, "rb") as f:
        size = st.st_size
        header, first = open_header(
            lambda off, n: os.pread(f.fileno(), n, off), size, secret_keys, path.name
        )
    reader = SegmentReader(
        path, header.header_len, header.session_key, cache, file_size=size, stats=stats
    )
    reader.stats.count(path, 0)
    reader.seed(0, first)
    return header, reader
