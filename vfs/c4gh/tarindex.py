"""TAR index over a package's plaintext: member offsets and sizes from the headers alone.

Headers are parsed by `tarfile` (ustar, GNU long names, PAX), one header block at a time, and
member bodies are skipped by arithmetic, so indexing decrypts only the segments holding headers.
Member names are attacker input: anything that could escape the package folder or is not a
regular file is dropped and reported, and the rest of the package is still indexed.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from typing import Protocol

from vfs.errors import CorruptArchiveError

BLOCK = tarfile.BLOCKSIZE
MAX_META_READ = 1 << 20  # longest GNU long name / PAX record accepted, so a walk stays bounded
MAX_MEMBERS = 1_000_000
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

    def get(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)


def unsafe_reason(name: str) -> str | None:
    """Why a member name must not be served, or None when it is a safe relative path."""
    if not name:
        return "empty name"
    if name.startswith("/"):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "'..' segment escapes the package"
    if any(p in ("", ".") for p in parts):
        return "empty or '.' path segment"
    if "\0" in name:
        return "NUL byte in name"
    if any(len(os.fsencode(p)) > 255 for p in parts):
        return "path segment longer than 255 bytes"
    return None


class _Cursor:
    """The file object `tarfile` reads headers through; refuses oversized metadata reads."""

    def __init__(self, source: PlaintextSource, name: str) -> None:
        self._source, self._name, self.pos = source, name, 0

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > MAX_META_READ:
            raise CorruptArchiveError(
                f"{self._name}: TAR metadata record at {self.pos} is larger than {MAX_META_READ}"
            )
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


def _next_header(walker: _Walker, offset: int, name: str) -> tarfile.TarInfo | str | None:
    """The TarInfo at `offset`, None at a clean end, or a string saying why the walk stops."""
    try:
        # Judge the block first (tarfile's own end/truncation exceptions are not public API);
        # the segment is cached, so fromtarfile reading it again costs no decryption.
        walker.fileobj.seek(offset)
        block = walker.fileobj.read(BLOCK)
        if len(block) < BLOCK:
            return f"{name}: TAR ends inside the header at {offset} (truncated package)"
        if block.count(0) == BLOCK:
            return None
        walker.fileobj.seek(offset)
        return tarfile.TarInfo.fromtarfile(walker)  # type: ignore[arg-type]
    except tarfile.HeaderError as exc:
        return f"{name}: invalid TAR header at {offset} ({exc}); members after it not listed"
    except CorruptArchiveError as exc:
        return f"{exc}; members after TAR offset {offset} not listed"


def _kind_reason(info: tarfile.TarInfo) -> str | None:
    if info.type in REGULAR and info.sparse is None:
        return None
    return KIND.get(info.type, f"unsupported TAR member type {info.type!r}")


class _Tree:
    """Names taken so far, to refuse duplicates and a file that is also a folder."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def conflict(self, name: str) -> str | None:
        if name in self.files:
            return "duplicate member name (the first one is served)"
        if name in self.dirs:
            return "name is also a folder of other members"
        parents = ["/".join(name.split("/")[:i]) for i in range(1, name.count("/") + 1)]
        if any(p in self.files for p in parents):
            return "a parent folder is also a member file"
        self.files.add(name)
        self.dirs.update(parents)
        return None


def build_index(source: PlaintextSource, name: str) -> TarIndex:
    """Walk the TAR headers in `source`, keeping the safe, regular, complete members."""
    index, tree = TarIndex(), _Tree()
    walker, offset = _Walker(_Cursor(source, name)), 0
    while True:
        if len(index.members) + len(index.dropped) >= MAX_MEMBERS:
            index.problems.append(f"{name}: more than {MAX_MEMBERS} TAR members; rest not listed")
            break
        if offset + BLOCK > source.size:
            index.problems.append(
                f"{name}: TAR ends at {source.size} with no end-of-archive marker"
            )
            break
        info = _next_header(walker, offset, name)
        if info is None:
            index.complete = True
            break
        if isinstance(info, str):
            index.problems.append(info)
            break
        if info.size < 0 or walker.offset <= offset:
            index.problems.append(f"{name}: corrupt TAR header at {offset} (size {info.size})")
            break
        offset = walker.offset
        reason = _kind_reason(info) or unsafe_reason(info.name) or tree.conflict(info.name)
        if reason:
            index.dropped.append((info.name, reason))
            continue
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
