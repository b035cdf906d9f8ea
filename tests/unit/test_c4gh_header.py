"""crypt4gh header framing, packet opening and writer binding, against the crypt4gh library."""

from __future__ import annotations

import hashlib
import io
from types import SimpleNamespace

import pytest
from crypt4gh import header as c4gh_header

from tests.toolbox import load_tool
from vfs.c4gh.header import (
    MAX_HEADER_LEN,
    header_len,
    open_header,
    read_header_bytes,
)
from vfs.errors import (
    CorruptArchiveError,
    DecantError,
    DecryptError,
    NotAnArchiveError,
    UnsupportedFormatError,
)

corpus = load_tool("make_c4gh_corpus")


def u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def library_header_len(package: bytes) -> int:
    """Where the crypt4gh library's own parser leaves the stream: the start of the body."""
    stream = io.BytesIO(package)
    list(c4gh_header.parse(stream))
    return stream.tell()


def opened(package: bytes, keys: list[bytes], name: str = "pkg.tar.c4gh"):
    return open_header(lambda off, n: package[off : off + n], len(package), keys, name)


def sha256_fp(public: bytes) -> str:
    return "sha256:" + hashlib.sha256(public).hexdigest()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("keys")
    return SimpleNamespace(
        **{n: corpus.make_keypair(d, n) for n in ("node", "other", "writer", "attacker")}
    )


@pytest.fixture(scope="module")
def plaintext() -> bytes:
    return corpus.build_tar([("manifest.json", b"{}"), ("big.bin", bytes(range(256)) * 600)])


@pytest.mark.parametrize("recipients", [1, 2])
def test_header_len_on_every_prefix(keys, plaintext, recipients) -> None:
    targets = [keys.node, keys.other][:recipients]
    package = corpus.encrypt(plaintext, keys.writer.secret, [k.public for k in targets])
    expected = library_header_len(package)
    for length in range(expected + 64):
        want = None if length < expected else expected
        assert header_len(package[:length]) == want, length


def test_header_len_rejects_what_the_bytes_already_show() -> None:
    with pytest.raises(NotAnArchiveError, match="bad magic"):
        header_len(b"PK\x03")
    with pytest.raises(NotAnArchiveError, match="bad magic"):
        header_len(b"crypt4gX" + u32(1) + u32(1))
    with pytest.raises(UnsupportedFormatError, match="version 2"):
        header_len(b"crypt4gh" + u32(2))
    with pytest.raises(UnsupportedFormatError, match="1025 packets"):
        header_len(b"crypt4gh" + u32(1) + u32(1025))
    for bad in (0, 7, 8193, 2**32 - 1):
        with pytest.raises(CorruptArchiveError, match=f"length {bad}"):
            header_len(b"crypt4gh" + u32(1) + u32(1) + u32(bad))


@pytest.mark.parametrize("length", [8, 8192])
def test_header_len_packet_length_bounds_are_inclusive(length: int) -> None:
    prefix = b"crypt4gh" + u32(1) + u32(1) + u32(length) + bytes(length - 4)
    assert header_len(prefix) == 16 + length
    assert header_len(prefix[:-1]) is None


def test_header_read_is_capped() -> None:
    """64 packets of 8192 bytes is the largest header; reading it never asks for more."""
    big = b"crypt4gh" + u32(1) + u32(64) + (u32(8192) + bytes(8188)) * 64
    asked: list[tuple[int, int]] = []

    def read_at(off: int, n: int) -> bytes:
        asked.append((off, n))
        return big[off : off + n]

    assert len(read_header_bytes(read_at, 10**12, "huge")) == MAX_HEADER_LEN
    assert max(off + n for off, n in asked) <= MAX_HEADER_LEN


def test_at_most_64_packets_are_tried(keys, plaintext, tmp_path) -> None:
    """Each packet costs an X25519 exchange: 1024 junk packets made each open ~50 ms and a
    shared folder of links to one package slow to list (red team 91). 64 recipients, ours
    last, still open; 65 are refused before any packet is tried."""
    others = [corpus.make_keypair(tmp_path, f"r{i}").public for i in range(64)]
    fits = corpus.encrypt(plaintext, keys.writer.secret, [*others[:63], keys.node.public])
    header, first = opened(fits, [keys.node.secret])
    assert header.packet_count == 64 and first == plaintext[:65536]
    over = corpus.encrypt(plaintext, keys.writer.secret, [*others, keys.node.public])
    with pytest.raises(UnsupportedFormatError, match="declares 65 packets, more than the 64"):
        opened(over, [keys.node.secret])


def test_header_packet_past_end_of_file() -> None:
    bad = corpus.header_past_eof()
    with pytest.raises(CorruptArchiveError, match="packet 0 runs past the end of the file"):
        opened(bad, [bytes(32)], "past.tar.c4gh")


@pytest.mark.parametrize("recipients", [1, 2])
def test_each_recipient_opens_and_writer_is_bound(keys, plaintext, recipients) -> None:
    targets = [keys.node, keys.other][:recipients]
    package = corpus.encrypt(plaintext, keys.writer.secret, [k.public for k in targets])
    for key in targets:
        header, first = opened(package, [key.secret])
        assert header.header_len == library_header_len(package)
        assert header.packet_count == recipients
        assert header.writer_fingerprint == sha256_fp(keys.writer.public)
        assert header.writers == (sha256_fp(keys.writer.public),)
        assert first == plaintext[:65536]
    # Several keys, only one of which fits, still open it.
    header, _ = opened(package, [keys.attacker.secret, targets[-1].secret])
    assert header.writer_fingerprint == sha256_fp(keys.writer.public)


def test_wrong_key_and_no_key(keys, plaintext) -> None:
    package = corpus.encrypt(plaintext, keys.writer.secret, [keys.node.public])
    with pytest.raises(DecryptError, match=r"pkg\.tar\.c4gh: none of the 1 header packet"):
        opened(package, [keys.other.secret])
    with pytest.raises(DecryptError, match="no crypt4gh secret key"):
        opened(package, [])


def test_injected_packet_does_not_become_the_writer(keys, plaintext) -> None:
    """A packet that opens but whose session key does not decrypt the body proves nothing."""
    package = corpus.encrypt(plaintext, keys.writer.secret, [keys.node.public])
    hostile = corpus.injected_packet(package, keys.attacker, keys.node)
    header, first = opened(hostile, [keys.node.secret])
    assert header.packet_count == 2
    assert header.writer_fingerprint == sha256_fp(keys.writer.public)
    assert sha256_fp(keys.attacker.public) not in header.writers
    assert first == plaintext[:65536]
    # Addressed to someone else, with only the injected packet opening: refused.
    elsewhere = corpus.encrypt(plaintext, keys.writer.secret, [keys.other.public])
    lone = corpus.injected_packet(elsewhere, keys.attacker, keys.node)
    with pytest.raises(DecryptError, match="no session key decrypts the first body segment"):
        opened(lone, [keys.node.secret])


def test_rewrapped_session_key_lists_both_writers(keys, plaintext) -> None:
    package = corpus.encrypt(plaintext, keys.writer.secret, [keys.node.public])
    end = library_header_len(package)
    packets = list(c4gh_header.parse(io.BytesIO(package[:end])))
    rewrapped = c4gh_header.reencrypt(
        packets, [(0, keys.node.secret, None)], [(0, keys.attacker.secret, keys.node.public)]
    )
    rekeyed = corpus.with_packets(package, rewrapped[:1])
    header, _ = opened(rekeyed, [keys.node.secret])
    assert header.writers == (sha256_fp(keys.attacker.public), sha256_fp(keys.writer.public))


def test_edit_list_is_refused(keys, plaintext) -> None:
    package = corpus.edit_list_package(plaintext, keys.writer, keys.node)
    with pytest.raises(UnsupportedFormatError, match="edit list"):
        opened(package, [keys.node.secret])


def test_not_crypt4gh_and_tampered_first_segment(keys, plaintext) -> None:
    with pytest.raises(NotAnArchiveError, match=r"x\.tar\.c4gh: not a crypt4gh file"):
        opened(corpus.not_crypt4gh(), [keys.node.secret], "x.tar.c4gh")
    package = corpus.encrypt(plaintext, keys.writer.secret, [keys.node.public])
    with pytest.raises(DecryptError, match="no session key decrypts"):
        opened(corpus.tamper(package, 0), [keys.node.secret])
    with pytest.raises(DecantError):
        opened(package[: library_header_len(package)], [keys.node.secret])
