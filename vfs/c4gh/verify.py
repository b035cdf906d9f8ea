"""`decant c4gh verify`: a package checked against its own manifest and the spec's TAR layout.

Every check runs and every problem is collected, so one run tells a producer all that is wrong.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfs.c4gh.header import OpenedHeader, open_package
from vfs.c4gh.segments import SEGMENT_SIZE, SegmentReader
from vfs.c4gh.tarindex import Member, TarIndex, build_index
from vfs.cache import PageCache
from vfs.decant.limits import parse_json
from vfs.errors import DecantError
from vfs.stores.base import ByteSource

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
MAX_MANIFEST = 16 << 20  # the largest manifest read (the mount's too: vfs/backends/c4gh.py)
HEADER_RE = re.compile(r"headers/[^/]+\.vcf")
CHROMOSOMES = r"(?:[1-9]|1[0-9]|2[0-2]|X|Y|M)"
PARQUET_RE = re.compile(rf"allele-freq\.chr{CHROMOSOMES}\.[0-9]+\.br[0-9]+\.[^./]+\.parquet")
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
READ_CHUNK = 16 * SEGMENT_SIZE


def served_digests(doc: Any) -> dict[str, str]:
    """What a mount checks members against: payload.members' sha256 by member name; {} when
    the manifest records no payload (the spec allows it). ValueError when the manifest is not
    an object or its payload is not a map of digests: such a package is not served (a payload
    that checks nothing would let segments swapped inside a member through)."""
    if not isinstance(doc, dict):
        raise ValueError(f"{MANIFEST} is not a JSON object")
    if "payload" not in doc:
        return {}
    members = doc["payload"].get("members") if isinstance(doc["payload"], dict) else None
    if not isinstance(members, dict) or not all(
        isinstance(item, dict) and DIGEST_RE.fullmatch(str(item.get("sha256")))
        for item in members.values()
    ):
        raise ValueError(f"{MANIFEST}'s payload.members is not a map of sha256 digests")
    return {member: item["sha256"] for member, item in members.items()}


@dataclass
class VerifyReport:
    """The outcome: who wrote the package, what it holds, and every problem found."""

    package: str
    writer_fingerprint: str | None = None
    writers: tuple[str, ...] = ()
    packets: int | None = None
    members: list[Member] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _group(name: str) -> int | None:
    """Position of a name's group in the spec's member order, None when it fits no group."""
    if name == MANIFEST:
        return 0
    if HEADER_RE.fullmatch(name):
        return 1
    if PARQUET_RE.fullmatch(name):
        return 2
    return None


def check_layout(names: Sequence[str]) -> list[str]:
    """Names and order: manifest.json first, then sorted headers/*.vcf, then sorted parquet."""
    problems = []
    if not names or names[0] != MANIFEST:
        problems.append(f"first member is {names[0] if names else 'missing'!r}, not {MANIFEST}")
    if names.count(MANIFEST) > 1:
        problems.append(f"{MANIFEST} appears {names.count(MANIFEST)} times")
    keyed = []
    for name in names:
        group = _group(name)
        if group is None:
            problems.append(f"member {name!r} does not follow the package layout")
        else:
            keyed.append((group, name))
    for before, after in itertools.pairwise(keyed):
        if after < before:
            problems.append(f"member {after[1]!r} is out of order (after {before[1]!r})")
    return problems


def check_manifest(doc: Any) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """Declared member digests and sizes from payload.members, and what is wrong with them."""
    if not isinstance(doc, dict):
        return {}, [f"{MANIFEST} is not a JSON object"]
    problems = []
    config = doc.get("config")
    version = config.get("manifestVersion") if isinstance(config, dict) else None
    if version != MANIFEST_VERSION:
        problems.append(f"config.manifestVersion is {version!r}, expected {MANIFEST_VERSION}")
    payload = doc.get("payload")
    if payload is None:
        return {}, [*problems, "manifest has no payload section: member digests are unverifiable"]
    members = payload.get("members") if isinstance(payload, dict) else None
    if not isinstance(members, dict):
        return {}, [*problems, "payload.members is missing or not an object"]
    if payload.get("algorithm") != "sha256":
        problems.append(f"payload.algorithm is {payload.get('algorithm')!r}, expected 'sha256'")
    if list(members) != sorted(members):
        problems.append("payload.members keys are not sorted")
    declared = {}
    for name, item in members.items():
        digest = item.get("sha256") if isinstance(item, dict) else None
        size = item.get("size") if isinstance(item, dict) else None
        if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
            problems.append(f"payload.members[{name!r}].sha256 is not 64 lowercase hex digits")
        elif not isinstance(size, int) or isinstance(size, bool) or size < 0:
            problems.append(f"payload.members[{name!r}].size is not a non-negative integer")
        else:
            declared[name] = (digest, size)
    return declared, problems


def check_normalized(member: Member) -> str | None:
    """The spec's normalized TAR header: mode 0644, uid/gid 0, empty owner names, mtime 0."""
    fields = (
        member.mode & 0o7777,
        member.uid,
        member.gid,
        member.uname,
        member.gname,
        member.mtime,
    )
    if fields == (0o644, 0, 0, "", "", 0):
        return None
    return (
        f"member {member.name!r}: TAR header not normalized (mode {fields[0]:04o}, "
        f"uid {fields[1]}, gid {fields[2]}, uname {fields[3]!r}, gname {fields[4]!r}, "
        f"mtime {fields[5]})"
    )


def member_sha256(reader: SegmentReader, member: Member) -> str:
    """SHA-256 of a member's bytes, decrypting its segments in order."""
    digest = hashlib.sha256()
    for pos in range(0, member.size, READ_CHUNK):
        want = min(READ_CHUNK, member.size - pos)
        chunk = reader.read(member.offset + pos, want)
        if len(chunk) != want:
            raise DecantError(f"member {member.name!r} is cut short at {pos + len(chunk)}")
        digest.update(chunk)
    return digest.hexdigest()


def _check_members(
    reader: SegmentReader, index: TarIndex, declared: dict[str, tuple[str, int]]
) -> list[str]:
    problems = []
    present = {m.name for m in index.members}
    for m in index.members:
        if m.name == MANIFEST:
            continue
        if m.name not in declared:
            problems.append(f"member {m.name!r} is not declared in payload.members")
            continue
        digest, size = declared[m.name]
        if m.size != size:
            problems.append(f"member {m.name!r}: size {m.size}, manifest declares {size}")
            continue
        try:
            actual = member_sha256(reader, m)
        except DecantError as exc:
            problems.append(f"member {m.name!r}: {exc}")
            continue
        if actual != digest:
            problems.append(f"member {m.name!r}: sha256 {actual}, manifest declares {digest}")
    problems += [
        f"declared member {n!r} is not in the package" for n in declared if n not in present
    ]
    return problems


def read_manifest(reader: SegmentReader, index: TarIndex) -> tuple[Any, list[str]]:
    member = index.get(MANIFEST)
    if member is None:
        return None, [f"no {MANIFEST} member"]
    if member.size > MAX_MANIFEST:
        return None, [f"{MANIFEST} is {member.size} bytes, larger than {MAX_MANIFEST}"]
    try:
        return parse_json(reader.read(member.offset, member.size)), []
    except DecantError as exc:
        return None, [f"{MANIFEST}: {exc}"]
    except ValueError as exc:  # not JSON, nested too deeply, or too costly to parse
        return None, [f"{MANIFEST} is not valid JSON ({exc})"]


def verify_index(reader: SegmentReader, index: TarIndex) -> list[str]:
    """Every problem with an indexed package's members, manifest and layout."""
    problems = list(index.problems)
    problems += [f"member {name!r} not served: {reason}" for name, reason in index.dropped]
    problems += check_layout([m.name for m in index.members])
    problems += [p for p in map(check_normalized, index.members) if p]
    doc, manifest_problems = read_manifest(reader, index)
    problems += manifest_problems
    if doc is not None:
        declared, declared_problems = check_manifest(doc)
        problems += declared_problems
        problems += _check_members(reader, index, declared)
    return problems


def verify_package(
    path: Path | str | ByteSource, secret_keys: Sequence[bytes], cache: PageCache | None = None
) -> VerifyReport:
    """Open, index and check one package; a package that cannot be opened is one problem.

    `path` is a local path or a byte source (an object in a bucket), which this closes.
    """
    target: Path | ByteSource = Path(path) if isinstance(path, (str, Path)) else path
    report = VerifyReport(package=str(target) if isinstance(target, Path) else target.name)
    cache = cache or PageCache(8 * SEGMENT_SIZE)  # verification streams; nothing worth keeping
    try:
        header, reader = open_package(target, secret_keys, cache)
    except (DecantError, OSError) as exc:
        report.problems.append(str(exc))
        return report
    _fill_header(report, header)
    with reader as rd:
        try:
            index = build_index(rd, rd.name)
        except DecantError as exc:  # refused outright (too many members): one problem
            report.problems.append(str(exc))
            return report
        report.members = index.members
        report.problems += verify_index(rd, index)
    return report


def _fill_header(report: VerifyReport, header: OpenedHeader) -> None:
    report.writer_fingerprint = header.writer_fingerprint
    report.writers = header.writers
    report.packets = header.packet_count
