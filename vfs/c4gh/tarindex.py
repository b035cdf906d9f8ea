"""TAR index over a package's plaintext: member offsets and sizes from the headers alone.

Headers are parsed by `tarfile` (ustar, GNU long names, PAX), one header block at a time, and
member bodies are skipped by arithmetic, so indexing decrypts only the segments holding headers.
Member names are attacker input: anything that could escape the package folder, is not a name
`vfs.names` accepts (NUL, over 255 bytes, undecodable), lies more than MAX_DEPTH folders deep or
is not a regular file is dropped and reported, and the rest of the package is still indexed. A
package with more than MAX_MEMBERS members or MAX_NAME_CHARS of names is refused outright, so a
hostile one costs bounded memory and time before anything is allocated for it.
"""

from __future__ import annotations

import math
import re
import tarfile
from dataclasses import dataclass, field
from typing import Any, Protocol

from vfs.errors import CorruptArchiveError, UnsupportedFormatError
from vfs.names import MAX_DEPTH, path_problem

BLOCK = tarfile.BLOCKSIZE
MAX_META_READ = 1 << 20  # longest GNU long name / PAX record accepted, so a walk stays bounded
MAX_MEMBERS = 100_000  # TAR headers in one package (a GDI package holds a few hundred)
MAX_NAME_CHARS = 32 << 20  # summed length of the served member names
# Folders the member paths imply: each costs a node here and in the mount's tree. 99,000
# members 64 folders deep, each under a top folder of its own, made 6.3 million and took the
# daemon to 5-7 GB (red team 57), within every other bound.
MAX_FOLDERS = 100_000
MAX_EXTENSIONS = 8  # GNU long-name / PAX headers before one member (tarfile recurses per one)
MAX_PAX = 64 << 10  # a PAX header's records (a member path is at most 64 x 255 bytes)
MAX_PAX_DIGITS = 64  # the longest run of digits a PAX header may hold (see _pax_records)
# What the extension headers of a package may hold in all: tarfile parses PAX records at ~1 µs
# each, and a package of 1,500 members each after 64 KiB of 6-byte records (100 MB) took 18 s
# of the daemon's CPU to list, holding every `ls` of its folder, again after each `touch`
# (red team 74, F1). A package the spec makes has a few records a member, if any.
MAX_PAX_RECORDS = 1 << 16  # plus PAX_RECORDS_A_MEMBER for each member walked
PAX_RECORDS_A_MEMBER = 16
MAX_EXTENSION_BYTES = 16 << 20  # plus EXTENSION_BYTES_A_MEMBER for each member walked
EXTENSION_BYTES_A_MEMBER = 1 << 10
MAX_SPARSE_READ = 64 << 10  # what tarfile may read past a member's header (GNU sparse maps)
PAX = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
EXTENSIONS = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)
SHOWN_NAME = 160  # characters of a dropped name kept for the log
REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
KIND = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
    tarfile.DIRTYPE: "directory entry (folders are implied by member paths)",
    tarfile.GNUTYPE_SPARSE: "sparse file",
}


class PlaintextSource(Protocol):
    """Random access to a TAR's bytes: a SegmentReader, or plain bytes in tests."""

    size: int

    def read(self, offset: int, size: int) -> bytes: ...

    def verified_end(self) -> int:
        """Length up to which reads can succeed (judged after a walk that ended early)."""
        ...


class BytesSource:
    """A TAR held in memory, for tests and for plaintext TARs."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.size = len(data)

    def read(self, offset: int, size: int) -> bytes:
        return self._data[offset : offset + size]

    def verified_end(self) -> int:
        return self.size


@dataclass(frozen=True)
class Member:
    """One served member: where its bytes are in the plaintext, and its header fields."""

    name: str
    offset: int  # plaintext offset of the first data byte
    size: int
    header_offset: int
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    uname: str = ""
    gname: str = ""
    mtime: int = 0


@dataclass
class TarIndex:
    """Members in archive order, what was dropped and why, and what went wrong while walking."""

    members: list[Member] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    complete: bool = False  # the walk reached the end-of-archive marker
    first: str | None = None  # the first header's name, served or dropped (the GDI order rule)

    def get(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)


def unsafe_reason(name: str, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a member name must not be served, or None when it is a safe relative path."""
    if name and not name.startswith("/") and ".." in name.split("/", max_depth):
        return "'..' segment escapes the package"
    return path_problem(name, max_depth)


def shown_name(name: str) -> str:
    """A dropped name as logged: hostile names can be a megabyte long."""
    if len(name) <= SHOWN_NAME:
        return name
    return f"{name[: SHOWN_NAME // 2]}…[{len(name)} characters]…{name[-SHOWN_NAME // 4 :]}"


class _Cursor:
    """The file object `tarfile` reads headers through; refuses oversized metadata reads."""

    def __init__(self, source: PlaintextSource, name: str) -> None:
        self._source, self._name, self.pos = source, name, 0
        self.allowance: int | None = None  # bytes tarfile may still read for this member

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > MAX_META_READ:
            raise CorruptArchiveError(
                f"{self._name}: TAR metadata record at {self.pos} is larger than {MAX_META_READ}"
            )
        if self.allowance is not None:
            if size > self.allowance:
                raise CorruptArchiveError(
                    f"{self._name}: TAR header reads more than {MAX_SPARSE_READ} bytes past its "
                    f"block (a GNU sparse map?) at {self.pos}"
                )
            self.allowance -= size
        data = self._source.read(self.pos, size)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos
        return self.pos


class _Walker:
    """The attributes of a TarFile that TarInfo.fromtarfile uses, and nothing that reads bodies.

    TarFile.next() would read the byte before each header to detect truncation, decrypting a
    body segment per member; driving fromtarfile directly avoids that.
    """

    encoding = "utf-8"
    errors = "surrogateescape"

    def __init__(self, cursor: _Cursor) -> None:
        self.fileobj = cursor
        self.offset = 0
        self.pax_headers: dict[str, str] = {}


@dataclass(frozen=True)
class _Raw:
    """The header blocks tarfile combines into one member, as bytes (names before nts())."""

    header: bytes  # the member's own header block
    long_names: tuple[bytes, ...]  # GNU long-name records, padded (tarfile uses the first)
    end: int  # the offset after the member's own header block
    records: int = 0  # PAX records before it


def _field_size(field: bytes) -> int:
    """A TAR number field (octal, or base-256 when the top bit is set)."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big", signed=False)
    return int(field.replace(b"\0", b" ").strip() or b"0", 8)


def _raw_chain(cursor: _Cursor, offset: int, name: str) -> _Raw | str | None:
    """Read the extension headers before a member by arithmetic, before `tarfile` recurses
    through them: at most MAX_EXTENSIONS, so no chain can exhaust the stack. A string says why
    the walk stops; None leaves the judgement to tarfile (a short or malformed block)."""
    long_names: list[bytes] = []
    records = 0
    for _ in range(MAX_EXTENSIONS + 1):
        cursor.seek(offset)
        block = cursor.read(BLOCK)
        if len(block) < BLOCK:
            return None
        if block[156:157] not in EXTENSIONS:
            return _Raw(block, tuple(long_names), offset + BLOCK, records)
        try:
            size = _field_size(block[124:136])
        except ValueError:
            return None
        padded = -(-size // BLOCK) * BLOCK
        if block[156:157] == tarfile.XGLTYPE:
            # tarfile applies a global header's records to every later member, copying them
            # each time: 56,000 keys in 8 of them held every `ls` of the package's folder
            # 44 s (red team 77, F2). The spec's packages have none.
            return f"{name}: global PAX header at {offset}; members after it not listed"
        if block[156:157] == tarfile.GNUTYPE_LONGNAME:
            long_names.append(cursor.read(padded))  # refuses more than MAX_META_READ
        elif block[156:157] in PAX:
            found = _pax_records(cursor.read(padded)[:size] if size <= MAX_PAX else None)
            if isinstance(found, str):
                return f"{name}: PAX header at {offset} {found}; members after it not listed"
            records += found
        offset += BLOCK + padded
    return f"{name}: more than {MAX_EXTENSIONS} extension headers before one member at {offset}"


_DIGIT_RUN = re.compile(rb"[0-9]{%d}" % (MAX_PAX_DIGITS + 1))


def _pax_records(records: bytes | None) -> int | str:
    """Why tarfile must not be given a PAX header (`records`: its data, None when larger than
    MAX_PAX), or how many records it holds. tarfile (3.11 before 3.11.10: CVE-2024-6232) searches
    the whole header with regular expressions that backtrack over every run of digits and every
    record with no newline after it: quadratic, and holding the GIL, so a 1 MiB header of digits
    stopped the daemon's event loop for about an hour. Records well formed ("LEN KEY=VALUE\n", end
    to end) and digit runs short, each search is linear."""
    if records is None:
        return f"is larger than {MAX_PAX} bytes"
    if _DIGIT_RUN.search(records):
        return f"holds a run of more than {MAX_PAX_DIGITS} digits"
    pos = count = 0
    while pos < len(records):
        space = records.find(b" ", pos, pos + MAX_PAX_DIGITS + 1)
        digits = records[pos:space]
        if space < 0 or not digits.isdigit() or int(digits) <= space - pos + 1:
            return f"has a malformed record at {pos}"
        end = pos + int(digits)
        if end > len(records) or records[end - 1] != 0x0A or records.find(b"=", space + 2, end) < 0:
            return f"has a malformed record at {pos}"
        pos, count = end, count + 1
    return count


def _cut_at_nul(field: bytes) -> bool:
    """True when a NUL-terminated name field holds more after its terminator: tarfile would
    silently present the part before the NUL, a different name from the one written."""
    end = field.find(0)
    return end != -1 and field.count(0, end) != len(field) - end


def _nul_cut_name(raw: _Raw, info: tarfile.TarInfo) -> str | None:
    """The full name written, when tarfile cut it short at a NUL; None when it did not."""
    if raw.long_names:  # any one cut short is refused, even one tarfile would then ignore
        cut = next((n for n in raw.long_names if _cut_at_nul(n)), None)
        return None if cut is None else cut.rstrip(b"\0").decode("utf-8", "backslashreplace")
    if "path" in info.pax_headers:
        return None  # tarfile keeps NULs in PAX values: name_problem sees them
    name, prefix = raw.header[0:100], raw.header[345:500]
    uses_prefix = info.type not in tarfile.GNU_TYPES
    if _cut_at_nul(name) or (uses_prefix and _cut_at_nul(prefix)):
        parts = [prefix.rstrip(b"\0")] if uses_prefix and prefix.strip(b"\0") else []
        full = b"/".join([*parts, name.rstrip(b"\0")])
        return full.decode("utf-8", "backslashreplace")
    return None


@dataclass(frozen=True)
class _Header:
    info: tarfile.TarInfo
    cut: str | None  # the full name, when tarfile's name is cut short at a NUL
    records: int = 0  # PAX records before it


def _next_header(walker: _Walker, offset: int, name: str) -> _Header | str | None:
    """The member at `offset`, None at a clean end, or a string saying why the walk stops."""
    try:
        # Judge the block first (tarfile's own end/truncation exceptions are not public API);
        # the segment is cached, so fromtarfile reading it again costs no decryption.
        walker.fileobj.seek(offset)
        block = walker.fileobj.read(BLOCK)
        if len(block) < BLOCK:
            return f"{name}: TAR ends inside the header at {offset} (truncated package)"
        if block.count(0) == BLOCK:
            return None
        raw = _raw_chain(walker.fileobj, offset, name)
        if isinstance(raw, str):
            return raw
        walker.fileobj.seek(offset)
        # tarfile reads a GNU sparse map (old style, or PAX 1.0 in the member's data) a block
        # at a time, a Python int kept per number, until the map or the file ends: a package
        # of 32 MiB of "1\n" cost the walk 190 MiB. What it reads is bounded here instead.
        walker.fileobj.allowance = (raw.end if raw else offset + BLOCK) - offset + MAX_SPARSE_READ
        info = tarfile.TarInfo.fromtarfile(walker)  # type: ignore[arg-type]
        return _Header(info, _nul_cut_name(raw, info) if raw else None, raw.records if raw else 0)
    except tarfile.HeaderError as exc:
        return f"{name}: invalid TAR header at {offset} ({exc}); members after it not listed"
    except CorruptArchiveError as exc:
        return f"{exc}; members after TAR offset {offset} not listed"
    except (ValueError, IndexError, OverflowError) as exc:
        # tarfile's own parsing of what it does not check (a sparse map that is no number or
        # ends early, a PAX sparse map of words): it raised these past the walk, and the daemon
        # logged a traceback for the package.
        kind = exc.__class__.__name__
        return (
            f"{name}: invalid TAR header at {offset} ({kind}: {exc}); members after it not listed"
        )
    finally:
        walker.fileobj.allowance = None


def _mtime_reason(info: tarfile.TarInfo) -> str | None:
    """A PAX mtime of "1e400" or "nan" is a float tarfile keeps, which no int holds: its
    OverflowError went past the walk (a traceback in the daemon's log, the package raw)."""
    return None if math.isfinite(info.mtime) else f"mtime {info.mtime} is not a finite number"


def _kind_reason(info: tarfile.TarInfo) -> str | None:
    if info.type in REGULAR and info.sparse is None:
        return None
    return KIND.get(info.type, f"unsupported TAR member type {info.type!r}")


class _Tree:
    """Names taken so far, as a trie (O(depth) per member), to refuse duplicates and a file
    that is also a folder. A folder maps to a dict of its children, a file to None."""

    def __init__(self) -> None:
        self.root: dict[str, Any] = {}
        self.folders = 0

    def conflict(self, parts: list[str]) -> str | None:
        node = self.root
        for part in parts[:-1]:
            if part not in node:
                node[part] = {}  # new from here down: nothing below can clash
                self.folders += 1
            elif node[part] is None:
                return "a parent folder is also a member file"
            node = node[part]
        if parts[-1] in node:
            if node[parts[-1]] is None:
                return "duplicate member name (the first one is served)"
            return "name is also a folder of other members"
        node[parts[-1]] = None
        return None


def build_index(
    source: PlaintextSource,
    name: str,
    max_members: int = MAX_MEMBERS,
    max_depth: int = MAX_DEPTH,
    max_name_chars: int = MAX_NAME_CHARS,
    max_folders: int = MAX_FOLDERS,
) -> TarIndex:
    """Walk the TAR headers in `source`, keeping the safe, regular, complete members.

    UnsupportedFormatError (naming the package) when it has more than `max_members` members,
    more than `max_name_chars` of member names or more than `max_folders` folders: checked
    before each member is kept.
    """
    index, tree = TarIndex(), _Tree()
    walker, offset, walked, name_chars = _Walker(_Cursor(source, name)), 0, 0, 0
    records = extensions = 0
    while True:
        if offset + BLOCK > source.size:
            index.problems.append(
                f"{name}: TAR ends at {source.size} with no end-of-archive marker"
            )
            break
        header = _next_header(walker, offset, name)
        if header is None:
            index.complete = True
            break
        if isinstance(header, str):
            index.problems.append(header)
            break
        info = header.info
        if info.size < 0 or walker.offset <= offset:
            index.problems.append(f"{name}: corrupt TAR header at {offset} (size {info.size})")
            break
        records += header.records
        extensions += max(0, info.offset_data - BLOCK - offset)  # blocks before its own
        offset = walker.offset
        walked += 1
        if records > MAX_PAX_RECORDS + PAX_RECORDS_A_MEMBER * walked or (
            extensions > MAX_EXTENSION_BYTES + EXTENSION_BYTES_A_MEMBER * walked
        ):
            raise UnsupportedFormatError(
                f"{name}: the TAR headers of its first {walked} members hold {records} PAX "
                f"records in {extensions} bytes of extension headers, more than a package "
                "is read with; package not served"
            )
        if walked == 1:
            index.first = info.name if header.cut is None else header.cut
        if walked > max_members:
            raise UnsupportedFormatError(
                f"{name}: more than {max_members} TAR members; package not served"
            )
        if header.cut is not None:
            index.dropped.append((shown_name(header.cut), "contains a NUL byte"))
            continue
        reason = (
            _kind_reason(info)
            or _mtime_reason(info)
            or unsafe_reason(info.name, max_depth)
            or tree.conflict(info.name.split("/"))
        )
        if tree.folders > max_folders:
            raise UnsupportedFormatError(
                f"{name}: member paths imply more than {max_folders} folders; package not served"
            )
        if reason:
            index.dropped.append((shown_name(info.name), reason))
            continue
        name_chars += len(info.name)
        if name_chars > max_name_chars:
            raise UnsupportedFormatError(
                f"{name}: member names add up to more than {max_name_chars} characters; "
                "package not served"
            )
        index.members.append(_member(info))
    _drop_incomplete(index, source)
    return index


def _member(info: tarfile.TarInfo) -> Member:
    return Member(
        name=info.name,
        offset=info.offset_data,
        size=info.size,
        header_offset=info.offset,
        mode=info.mode,
        uid=info.uid,
        gid=info.gid,
        uname=info.uname,
        gname=info.gname,
        mtime=int(info.mtime),
    )


def _drop_incomplete(index: TarIndex, source: PlaintextSource) -> None:
    """After a walk that ended early, hide members whose bytes are not all there to read."""
    limit = source.size if index.complete else source.verified_end()
    kept = []
    for m in index.members:
        if m.offset + m.size > limit:
            index.dropped.append(
                (
                    m.name,
                    f"incomplete: data ends at {m.offset + m.size}, package readable to {limit}",
                )
            )
        else:
            kept.append(m)
    index.members = kept
