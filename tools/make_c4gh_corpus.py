"""Build GDI `.tar.c4gh` packages, good and hostile, with the crypt4gh library (tests, benches).

TARs are written by `tarfile` with the spec's normalized headers (mode 0644, uid/gid 0, empty
owner names, mtime 0), manifest.json first with payload.members digests, then headers/*.vcf, then
pyarrow parquet members. The functions are imported by the tests; the CLI writes a corpus folder:

    python tools/make_c4gh_corpus.py OUTDIR [--parquet-rows N] [--large-mib N]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import random
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"crypt4gh"
CIPHER_SEGMENT_SIZE = 65536 + 28
Member = tuple[str, bytes]


@dataclass(frozen=True)
class KeyPair:
    """A crypt4gh key pair on disk and in memory (tests compare fingerprints against `public`)."""

    secret_path: Path
    public_path: Path
    secret: bytes
    public: bytes
    passphrase: str | None = None


def _pem(kind: str, blob: bytes) -> bytes:
    return b"-----BEGIN %s-----\n%s\n-----END %s-----\n" % (
        kind.encode(),
        base64.b64encode(blob),
        kind.encode(),
    )


def make_keypair(directory: Path, name: str, passphrase: str | None = None) -> KeyPair:
    """Write NAME.sec (mode 0600, c4gh-v1, encrypted when a passphrase is given) and NAME.pub."""
    from crypt4gh import sodium
    from crypt4gh.keys.c4gh import encode_private_key

    directory.mkdir(parents=True, exist_ok=True)
    secret = os.urandom(32)
    public = bytes(sodium.derive_pk(secret))
    with contextlib.redirect_stderr(io.StringIO()):  # "WARNING: not encrypted" is expected here
        blob = encode_private_key(secret, passphrase.encode() if passphrase else None, None)
    secret_path, public_path = directory / f"{name}.sec", directory / f"{name}.pub"
    secret_path.write_bytes(_pem("CRYPT4GH PRIVATE KEY", blob))
    secret_path.chmod(0o600)
    public_path.write_bytes(_pem("CRYPT4GH PUBLIC KEY", public))
    return KeyPair(secret_path, public_path, secret, public, passphrase)


def normalized_info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    """A TAR header as the spec normalizes it: 0644, uid/gid 0, empty owner names, mtime 0."""
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    info.uid = info.gid = info.mtime = 0
    info.uname = info.gname = ""
    return info


def build_tar(members: Sequence[Member | tarfile.TarInfo], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """An uncompressed TAR of `members` in order; a TarInfo entry is written as-is (no body)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for item in members:
            if isinstance(item, tarfile.TarInfo):
                tar.addfile(item)
            else:
                name, data = item
                tar.addfile(normalized_info(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


def encrypt(plaintext: bytes, writer_secret: bytes, recipient_publics: Sequence[bytes]) -> bytes:
    """crypt4gh-encrypt `plaintext` from one writer key to every recipient (one packet each)."""
    from crypt4gh import lib

    out = io.BytesIO()
    keys = [(0, writer_secret, pk) for pk in recipient_publics]
    lib.encrypt(keys, io.BytesIO(plaintext), out)
    return out.getvalue()


def parquet_member(rows: int, seed: int = 0) -> bytes:
    """An allele-frequency-like parquet file; random values and no compression keep it large."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    table = pa.table(
        {
            "POS": pa.array(sorted(rng.randrange(1, 10**8) for _ in range(rows)), pa.int64()),
            "REF": pa.array([rng.choice("ACGT") for _ in range(rows)]),
            "ALT": pa.array([rng.choice("ACGT") for _ in range(rows)]),
            "POPULATION": pa.array([rng.choice(["EE", "FI", "Total"]) for _ in range(rows)]),
            "AF": pa.array([rng.random() for _ in range(rows)], pa.float64()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="none", use_dictionary=False, row_group_size=4096)
    return buf.getvalue()


def manifest(members: Sequence[Member], **config_overrides: object) -> bytes:
    """A manifest.json for `members` (manifest excluded), with sorted payload.members digests."""
    digests = {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in sorted(members)
    }
    config: dict[str, object] = {
        "mode": "aggregated",
        "blockRange": 10_000_000,
        "assembly": {"reference": "GRCh38"},
        "manifestVersion": 1,
        "generatedBy": "make_c4gh_corpus",
    }
    config.update(config_overrides)
    doc = {
        "metadata": {
            "datasetId": "GDI-TEST-0001",
            "catalog": "test",
            "title": "Synthetic allele frequencies",
            "description": "Generated by tools/make_c4gh_corpus.py",
            "accessRights": "http://publications.europa.eu/resource/authority/access-right/PUBLIC",
            "applicableLegislation": ["http://data.europa.eu/eli/reg/2025/327/oj"],
            "license": "http://creativecommons.org/licenses/by/4.0/",
            "creator": [{"name": "decant-mount tests"}],
            "healthCategory": ["http://data.gdi.eu/core/p1/GENOMICS"],
            "contactPoint": {"fn": "Tests", "hasEmail": "mailto:tests@example.org"},
        },
        "payload": {"algorithm": "sha256", "members": digests},
        "config": config,
    }
    return json.dumps(doc, indent=2).encode()


def gdi_members(
    parquet_rows: Sequence[int] = (20000, 1500), seed: int = 0, long_name: bool = True
) -> list[Member]:
    """Members in the spec's order: manifest.json, sorted headers/*.vcf, sorted parquet.

    With `long_name`, one parquet member's name is over 100 characters (GNU long name / PAX).
    """
    rng = random.Random(seed)
    vcf_ids = [f"{rng.getrandbits(64):016x}" for _ in parquet_rows]
    if long_name:
        vcf_ids[-1] = vcf_ids[-1] * 5  # 80 hex digits: the member name is 119 characters
    headers = [
        (f"headers/{v}.vcf", f"##fileformat=VCFv4.3\n##source={v}\n".encode()) for v in vcf_ids
    ]
    parquet = [
        (f"allele-freq.chr{i + 1}.0.br10000000.{v}.parquet", parquet_member(rows, seed + i))
        for i, (v, rows) in enumerate(zip(vcf_ids, parquet_rows, strict=True))
    ]
    payload = sorted(headers) + sorted(parquet)
    return [("manifest.json", manifest(payload)), *payload]


def with_manifest(members: Sequence[Member]) -> list[Member]:
    """`members` after a manifest.json declaring them: a package the mount serves (a GDI
    package starts with its manifest; one that does not is shown as its raw file)."""
    return [("manifest.json", manifest(members)), *members]


def write_package(
    path: Path,
    members: Sequence[Member | tarfile.TarInfo],
    writer: KeyPair,
    recipients: Sequence[KeyPair],
    fmt: int = tarfile.GNU_FORMAT,
) -> bytes:
    """Write an encrypted package and return its TAR plaintext (what tests compare against)."""
    plaintext = build_tar(members, fmt)
    path.write_bytes(encrypt(plaintext, writer.secret, [r.public for r in recipients]))
    return plaintext


# ----------------------------------------------------------------- hostile variants


def hostile_entries() -> list[tarfile.TarInfo | Member]:
    """Members a mount must never expose, each next to a good one that must still be served."""
    link = normalized_info("link-to-manifest", kind=tarfile.SYMTYPE)
    link.linkname = "manifest.json"
    hard = normalized_info("hard-link", kind=tarfile.LNKTYPE)
    hard.linkname = "manifest.json"
    device = normalized_info("null-device", kind=tarfile.CHRTYPE)
    folder = normalized_info("headers", kind=tarfile.DIRTYPE)
    return [
        ("../escape", b"escaped\n"),
        ("/etc/absolute", b"absolute\n"),
        ("ok/../../twice", b"escaped\n"),
        link,
        hard,
        device,
        folder,
    ]


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def raw_header(name: bytes, size: int, kind: bytes = tarfile.REGTYPE, prefix: bytes = b"") -> bytes:
    """A normalized ustar header whose name and prefix fields hold `name` and `prefix` byte for
    byte (NULs and undecodable bytes included), with its checksum recomputed."""
    buf = bytearray(normalized_info("placeholder", size, kind).tobuf(tarfile.USTAR_FORMAT))
    buf[0:100] = name[:100].ljust(100, b"\0")
    buf[345:500] = prefix[:155].ljust(155, b"\0")
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % sum(buf)
    return bytes(buf)


def raw_member(name: bytes, data: bytes, prefix: bytes = b"") -> bytes:
    """One member with a raw ustar name field (see raw_header), body padded to whole blocks."""
    return raw_header(name, len(data), prefix=prefix) + _padded(data)


def gnu_long_member(name: bytes, data: bytes) -> bytes:
    """One member whose name is a GNU long-name record holding `name` byte for byte."""
    record = name + b"\0"
    long_link = raw_header(b"././@LongLink", len(record), tarfile.GNUTYPE_LONGNAME)
    return long_link + _padded(record) + raw_member(b"long-name-placeholder", data)


def member_bytes(name: str, data: bytes, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """One member as `tarfile` writes it (extension headers included), no end marker."""
    info = normalized_info(name, len(data))
    return info.tobuf(fmt, "utf-8", "surrogateescape") + _padded(data)


def raw_tar(items: Sequence[bytes | Member], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A TAR of raw member bytes and (name, data) members in order, with its end marker."""
    parts = [i if isinstance(i, bytes) else member_bytes(*i, fmt=fmt) for i in items]
    return b"".join(parts) + bytes(2 * tarfile.BLOCKSIZE)


def nul_name_members() -> dict[str, bytes]:
    """Members whose written names hold a NUL, by the name written: `tarfile` presents only the
    part before the NUL (a different, innocent-looking name), so a mount must drop them."""
    return {
        "cut\0evil": raw_member(b"cut\0evil", b"ustar name\n"),
        "dir\0evil/in-prefix": raw_member(b"in-prefix", b"ustar prefix\n", prefix=b"dir\0evil"),
        "L" * 120 + "\0evil": gnu_long_member(b"L" * 120 + b"\0evil", b"GNU long name\n"),
        "pax-é\0evil": member_bytes("pax-é\0evil", b"PAX path\n", tarfile.PAX_FORMAT),
    }


def overlong_members(depth: int = 500) -> dict[str, bytes]:
    """Members whose names no Linux file system could hold, or nested `depth` folders deep."""
    deep = "d/" * depth + "deep.txt"
    return {
        "x" * 256: member_bytes("x" * 256, b"256 bytes\n"),
        "é" * 128: member_bytes("é" * 128, b"256 bytes in UTF-8\n", tarfile.PAX_FORMAT),
        f"long/{'y' * 300}/leaf": member_bytes(f"long/{'y' * 300}/leaf", b"long folder\n"),
        deep: member_bytes(deep, b"deep\n"),
    }


def edge_name_members() -> dict[bytes, bytes]:
    """Members at the edge of what may be presented, by the name the kernel must show, and
    their bodies: a mount serves every one of them."""
    return {
        b"x" * 255: b"255 bytes\n",
        b"caf\xe9-latin1": b"undecodable byte, shown as written\n",
        b"d/" * 63 + b"ok.txt": b"64 levels\n",
    }


def edge_name_tar_items() -> list[bytes]:
    """edge_name_members as raw TAR members (the latin-1 one in a ustar name field)."""
    items = []
    for name, data in edge_name_members().items():
        if len(name) <= 99:
            items.append(raw_member(name, data))
        else:
            items.append(gnu_long_member(name, data))
    return items


def header_len_of(package: bytes) -> int:
    """The header length by the spec's framing (kept independent of vfs.c4gh on purpose)."""
    count, pos = int.from_bytes(package[12:16], "little"), 16
    for _ in range(count):
        pos += int.from_bytes(package[pos : pos + 4], "little")
    return pos


def tamper(package: bytes, segment_no: int, at: int = 100) -> bytes:
    """Flip one cipher byte inside segment `segment_no`: its tag must then fail."""
    pos = header_len_of(package) + segment_no * CIPHER_SEGMENT_SIZE + at
    if pos >= len(package):
        raise ValueError(f"the package has no segment {segment_no}")
    return package[:pos] + bytes([package[pos] ^ 0x01]) + package[pos + 1 :]


def segments_dropped(package: bytes, count: int, swap: tuple[int, int] | None = None) -> bytes:
    """The package without its first `count` cipher segments (then, with `swap`, two of the
    rest exchanged): no key needed, and every segment left still authenticates, as segments do
    one by one, not their place."""
    start = header_len_of(package)
    segs = [package[p : p + CIPHER_SEGMENT_SIZE]
            for p in range(start, len(package), CIPHER_SEGMENT_SIZE)]  # fmt: skip
    rest = segs[count:]
    if swap is not None:
        a, b = swap
        rest[a], rest[b] = rest[b], rest[a]
    return package[:start] + b"".join(rest)


def member_at_segment(segment_no: int, data: bytes) -> list[Member]:
    """A GDI package's members (manifest first) in which member `b.bin`, holding `data`, has
    its TAR header exactly at the start of plaintext segment `segment_no`."""

    def members(pad: int) -> list[Member]:
        return with_manifest([("a.bin", b"A" * pad), ("b.bin", data), ("c.txt", b"c\n" * 50)])

    def offset_of_b(items: list[Member]) -> int:
        with tarfile.open(fileobj=io.BytesIO(build_tar(items))) as tar:
            return next(m.offset for m in tar.getmembers() if m.name == "b.bin")

    out = members(1000 + segment_no * 65536 - offset_of_b(members(1000)))
    assert offset_of_b(out) == segment_no * 65536
    return out


def header_past_eof() -> bytes:
    """A header whose only packet declares 8000 bytes in a file far shorter than that."""
    return MAGIC + (1).to_bytes(4, "little") * 2 + (8000).to_bytes(4, "little") + bytes(100)


def not_crypt4gh(size: int = 4096, seed: int = 0) -> bytes:
    return b"PAR1" + random.Random(seed).randbytes(size - 4)


def with_packets(package: bytes, extra: Sequence[bytes], first: bool = True) -> bytes:
    """Re-frame `package` with `extra` encrypted packets added before (or after) its own."""
    from crypt4gh import header

    end = header_len_of(package)
    own = list(header.parse(io.BytesIO(package[:end])))
    packets = [*extra, *own] if first else [*own, *extra]
    return header.serialize(packets) + package[end:]


def injected_packet(package: bytes, attacker: KeyPair, recipient: KeyPair) -> bytes:
    """Prepend a packet the recipient can open, from the attacker, with a foreign session key."""
    from crypt4gh import header

    plain = header.make_packet_data_enc(0, os.urandom(32))
    packet = next(header.encrypt(plain, [(0, attacker.secret, recipient.public)]))
    return with_packets(package, [packet])


def edit_list_package(plaintext: bytes, writer: KeyPair, recipient: KeyPair) -> bytes:
    """A package whose header also carries an edit-list packet (skip 10, keep 100)."""
    from crypt4gh import header

    body = encrypt(plaintext, writer.secret, [recipient.public])
    edit = header.make_packet_data_edit_list([10, 100])
    packet = next(header.encrypt(edit, [(0, writer.secret, recipient.public)]))
    return with_packets(body, [packet], first=False)


# ----------------------------------------------------------------- CLI


def build_corpus(out: Path, parquet_rows: int, large_mib: int) -> list[Path]:
    """Keys, good packages and hostile variants under `out`; returns the package paths."""
    keys = out / "keys"
    node = make_keypair(keys, "node")
    other = make_keypair(keys, "other-node")
    writer = make_keypair(keys, "writer")
    make_keypair(keys, "protected-node", passphrase="correct horse battery staple")
    members = gdi_members((parquet_rows, max(parquet_rows // 10, 10)))
    good = out / "packages"
    good.mkdir(parents=True, exist_ok=True)
    plain = write_package(good / "one-recipient.tar.c4gh", members, writer, [node])
    write_package(good / "two-recipients.tar.c4gh", members, writer, [node, other])
    write_package(good / "pax.tar.c4gh", members, writer, [node], fmt=tarfile.PAX_FORMAT)
    if large_mib:
        big = os.urandom(large_mib << 20)
        name = "allele-freq.chr1.0.br10000000.00000000000000ff.parquet"
        write_package(
            good / "large.tar.c4gh",
            [("manifest.json", manifest([(name, big)])), (name, big)],
            writer,
            [node],
        )
    bad = out / "hostile"
    bad.mkdir(parents=True, exist_ok=True)
    package = (good / "one-recipient.tar.c4gh").read_bytes()
    write_package(bad / "unsafe-members.tar.c4gh", [*members, *hostile_entries()], writer, [node])
    last = (len(package) - header_len_of(package) - 1) // CIPHER_SEGMENT_SIZE
    (bad / "tampered-segment.tar.c4gh").write_bytes(tamper(package, min(2, last)))
    (bad / "truncated.tar.c4gh").write_bytes(package[: len(package) * 2 // 3])
    (bad / "header-past-eof.tar.c4gh").write_bytes(header_past_eof())
    (bad / "not-crypt4gh.tar.c4gh").write_bytes(not_crypt4gh())
    (bad / "injected-packet.tar.c4gh").write_bytes(injected_packet(package, other, node))
    (bad / "edit-list.tar.c4gh").write_bytes(edit_list_package(plain, writer, node))
    return sorted([*good.iterdir(), *bad.iterdir()])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write keys/, packages/, hostile/ into")
    parser.add_argument("--parquet-rows", type=int, default=20000)
    parser.add_argument("--large-mib", type=int, default=0, help="add a package with a big member")
    args = parser.parse_args(argv)
    for path in build_corpus(args.out, args.parquet_rows, args.large_mib):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
