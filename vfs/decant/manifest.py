"""The manifest model of spec §4b, parsed and validated strictly."""

from __future__ import annotations

import itertools
import json
import math
import re
import threading
from array import array
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Any

from vfs.decant import SUPPORTED_FORMATS
from vfs.decant.geometry import ITEMSIZE, check_geometry
from vfs.decant.limits import (
    MAX_MEMBERS,
    MAX_ORIGINAL_SIZE,
    MAX_PAGES,
    MAX_SEGMENTS,
    MiB,
    json_cost,
    manifest_shape,
)
from vfs.decant.manifest_text import ManifestText
from vfs.decant.pagetable import PageTable
from vfs.errors import ManifestError, UnsupportedFormatError

MODES = ("byte-exact", "verbatim", "series")


@dataclass(frozen=True)
class PageRecord:
    index: int
    shape: tuple[int, ...]
    dtype: str
    dataoffsets: tuple[int, ...]
    databytecounts: tuple[int, ...]
    samplesperpixel: int
    planarconfig: int
    predictor: int
    rowsperstrip: int
    tilewidth: int
    tilelength: int

    @property
    def nbytes(self) -> int:
        return sum(self.databytecounts)

    @property
    def plane_nbytes(self) -> int:
        """Bytes of the decoded plane its shape and dtype make (== nbytes once validated)."""
        return math.prod(self.shape) * ITEMSIZE.get(self.dtype, 1)

    def to_json(self) -> dict[str, Any]:
        # Not asdict: its deep copy of every field was most of writing an 8,192-page manifest.
        out = _shallow(self)
        for key in ("shape", "dataoffsets", "databytecounts"):
            out[key] = list(out[key])
        return out


@dataclass(frozen=True)
class MemberRecord:
    relpath: str
    original_size: int
    original_sha256: str
    byteorder: str
    husk_array: str = ""
    husk_raw_size: int = 0
    pages: Sequence[PageRecord] = ()  # a PageTable when parsed
    subarchive: str = ""

    def to_json(self) -> dict[str, Any]:
        out = _shallow(self)
        out["pages"] = [p.to_json() for p in self.pages]
        return out


@dataclass(frozen=True)
class Manifest:
    format: int
    mode: str
    original_name: str
    original_size: int
    original_sha256: str
    byteorder: str = "<"
    decant_version: str = ""
    pixel_codec: str = ""
    pages: Sequence[PageRecord] = ()  # a PageTable when parsed
    plane_order: tuple[str, ...] = ()
    husk_raw_size: int = 0
    notes: str = ""
    members: tuple[MemberRecord, ...] = ()
    series_consolidated: bool = False
    # Additive (spec §6): the writer stored every chunk, even all-fill ones, so a missing chunk
    # is damage. Archives without it may omit all-fill chunks (zarr's write_empty_chunks=False).
    all_chunks_stored: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = _shallow(self)  # asdict would convert every page twice: here and below
        out.pop("extra")
        out["pages"] = [p.to_json() for p in self.pages]
        out["members"] = [m.to_json() for m in self.members]
        out["plane_order"] = list(self.plane_order)
        out.update(self.extra)
        return out

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()


def _shallow(record: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values as they are (the callers convert the nested)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


# Manifests parsed at once: any number up to this size (a 100,000-page one is ~50 MiB of text),
# one at a time beyond it, so several large ones never add up. Reentrant: a reader that knows a
# manifest is large before reading it holds it while it reads too (`large_manifest`).
BIG_MANIFEST_BYTES = 8 * MiB
_BIG_PARSE = threading.RLock()


def large_manifest(size: int | None) -> AbstractContextManager[object]:
    """Held while a manifest of `size` bytes (None: not known before it is read) is read and
    parsed: the lock large ones take in turn, or nothing. The bytes read are what costs: a
    deflated entry costs its maker a thousandth of them, and inflating several 120 MiB
    manifests of one 122 KB zip linked into four folders listed at once, each waiting for the
    parse with its bytes in hand, grew the daemon's peak RSS by 615 MiB."""
    return _BIG_PARSE if size is not None and size > BIG_MANIFEST_BYTES else nullcontext()


class _Fields:
    """Typed access to one JSON object, raising ManifestError that names the archive and field."""

    def __init__(self, doc: Any, where: str, source: str) -> None:
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: {where} is not a JSON object")
        self.doc, self.where, self.source = doc, where, source

    def _get(self, key: str, types: type | tuple[type, ...], default: Any) -> Any:
        if key not in self.doc:
            if default is _REQUIRED:
                raise ManifestError(f"{self.source}: {self.where} is missing field '{key}'")
            return default
        value = self.doc[key]
        # bool is an int subclass; a manifest saying `"format": true` is mistyped, not format 1.
        if isinstance(value, bool) and bool not in _as_tuple(types):
            value = None
        if not isinstance(value, types):
            raise ManifestError(
                f"{self.source}: {self.where} field '{key}' has type "
                f"{type(self.doc[key]).__name__}, expected {_names(types)}"
            )
        return value

    def int(self, key: str, default: Any = None) -> int:
        value = self._get(key, int, _REQUIRED if default is None else default)
        if value < 0:
            raise ManifestError(f"{self.source}: {self.where} field '{key}' is negative")
        return int(value)

    def size(self, key: str, default: Any = None) -> int:
        """A byte count: bounded, so a claim like 2**62 is refused here, not shown as 4.6 EB."""
        value = self.int(key, default)
        if value > MAX_ORIGINAL_SIZE:
            raise ManifestError(
                f"{self.source}: {self.where} field '{key}' claims {value} bytes, more than "
                f"the {MAX_ORIGINAL_SIZE} a decant original may hold"
            )
        return value

    def str(self, key: str, default: Any = None) -> str:
        return str(self._get(key, str, _REQUIRED if default is None else default))

    def bool(self, key: str, default: bool) -> bool:
        return bool(self._get(key, bool, default))

    def ints(self, key: str) -> tuple[int, ...]:
        """A list of non-negative integers: a tuple, or the array a large page's list was read
        into (manifest_text), kept as it is until it is copied into the PageTable."""
        if isinstance(self.doc.get(key), array):
            values = self.doc[key]
            valid = not values or min(values) >= 0
        else:
            values = self._get(key, list, _REQUIRED)
            valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
        if not valid:
            raise ManifestError(
                f"{self.source}: {self.where} field '{key}' must be non-negative integers"
            )
        return values if isinstance(values, array) else tuple(values)  # type: ignore[return-value]

    def list(self, key: str) -> list[Any]:
        return list(self._get(key, list, []))

    def pages(self) -> PageTable:
        """The page records ManifestText read into a table, or its first refusal raised here,
        where a document's list of page records is parsed."""
        table = self.doc.get("pages")
        if not isinstance(table, PageTable):
            where = "pages" if self.where == "manifest" else f"{self.where}.pages"
            records = self.list("pages")
            if not records:
                return _NO_PAGES  # shared: a view, read-only
            table = PageTable()
            for i, record in enumerate(records):
                try:
                    table.append(parse_page(record, f"{where}[{i}]", self.source))
                except OverflowError:  # as ManifestText words it: no field of the format is 2^63
                    raise ManifestError(
                        f"{self.source}: {where}[{i}] holds an integer of 2^63 or more"
                    ) from None
            return table
        if table.error is not None:
            raise table.error
        return table


_REQUIRED = object()


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))


def parse_page(doc: Any, where: str, source: str) -> PageRecord:
    f = _Fields(doc, where, source)
    page = PageRecord(
        index=f.int("index"),
        shape=f.ints("shape"),
        dtype=f.str("dtype"),
        dataoffsets=f.ints("dataoffsets"),
        databytecounts=f.ints("databytecounts"),
        samplesperpixel=f.int("samplesperpixel"),
        planarconfig=f.int("planarconfig"),
        predictor=f.int("predictor"),
        rowsperstrip=f.int("rowsperstrip"),
        tilewidth=f.int("tilewidth"),
        tilelength=f.int("tilelength"),
    )
    if len(page.dataoffsets) != len(page.databytecounts):
        raise ManifestError(f"{source}: {where} dataoffsets and databytecounts differ in length")
    if len(page.shape) not in (2, 3):
        raise ManifestError(
            f"{source}: {where} shape {list(page.shape)} is not [Y, X] or [Y, X, S]"
        )
    if page.planarconfig not in (1, 2):
        raise ManifestError(f"{source}: {where} planarconfig {page.planarconfig} is not 1 or 2")
    if page.predictor != 1:
        raise UnsupportedFormatError(f"{source}: {where} predictor {page.predictor} is not 1")
    if bool(page.tilewidth) != bool(page.tilelength) or (page.tilewidth and page.rowsperstrip):
        raise ManifestError(f"{source}: {where} is neither cleanly striped nor tiled")
    check_geometry(page, where, source)
    return page


def _check_byteorder(value: str, where: str, source: str) -> str:
    if value not in ("<", ">"):
        raise ManifestError(f"{source}: {where} byteorder {value!r} is not '<' or '>'")
    return value


def _parse_member(doc: Any, where: str, source: str) -> MemberRecord:
    f = _Fields(doc, where, source)
    pages = f.pages()
    return MemberRecord(
        relpath=f.str("relpath"),
        original_size=f.size("original_size"),
        original_sha256=f.str("original_sha256"),
        byteorder=_check_byteorder(f.str("byteorder", "<"), where, source),
        husk_array=_name(f.str("husk_array", ""), f"{where} husk_array", source),
        husk_raw_size=f.size("husk_raw_size", 0),
        pages=pages,
        subarchive=_name(f.str("subarchive", ""), f"{where} subarchive", source),
    )


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")


def _name(value: str, where: str, source: str) -> str:
    """An array or bundle name: one plain path component (it becomes a store key or a path)."""
    if value and not _SAFE_NAME.fullmatch(value):
        raise ManifestError(f"{source}: {where} {value[:80]!r} is not a plain name")
    return value


def parse_manifest(raw: bytes, source: str) -> Manifest:
    """Parse manifest bytes; `source` names the archive in every error message."""
    # Counted before parsing: the objects they would become are what costs memory.
    too_much = manifest_shape(raw)
    if too_much:
        raise ManifestError(f"{source}: manifest not parsed: it holds {too_much}")
    if len(raw) <= BIG_MANIFEST_BYTES:
        doc = _document(raw, source)
    else:  # a large one (~70 MiB of memory at the bounds) waits for any other
        with _BIG_PARSE:
            doc = _document(raw, source)
    return manifest_from_doc(doc, source)


# A manifest whose text bounds what `json.loads` allocates (`json_cost`) to this is parsed by it
# whole: the walker's windows guard nothing there, and json.loads is ~25 times faster on the
# ~1 KiB manifest of a small archive (0.006 ms against 0.16 ms here; a fifth of describing it,
# which `ls -l` of a folder of 1,000 such archives on a fresh mount does 1,000 times).
SMALL_PARSE_COST = 4 * MiB


def _document(raw: bytes, source: str) -> Any:
    """The manifest's JSON document: json.loads' where cheap (the walker's, tests check, is the
    same), else ManifestText's; errors are always the walker's words."""
    utf8 = json.detect_encoding(raw[:4]) in ("utf-8", "utf-8-sig")  # the walker refuses others
    if utf8 and json_cost(raw) <= SMALL_PARSE_COST:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            pass  # malformed: the walker says where and why
    return ManifestText(raw, source).document()


def manifest_from_doc(doc: Any, source: str) -> Manifest:
    """The Manifest a parsed document holds: ManifestText's, or `json.loads`' (tests compare)."""
    f = _Fields(doc, "manifest", source)
    fmt = f._get("format", int, _REQUIRED)
    if fmt not in SUPPORTED_FORMATS:
        supported = ", ".join(map(str, sorted(SUPPORTED_FORMATS)))
        raise UnsupportedFormatError(
            f"{source}: manifest format {fmt} is not supported (this reader implements {supported})"
        )
    mode = f.str("mode")
    if mode not in MODES:
        raise ManifestError(f"{source}: manifest mode {mode!r} is not one of {', '.join(MODES)}")
    known = {
        "format",
        "mode",
        "original_name",
        "original_size",
        "original_sha256",
        "byteorder",
        "decant_version",
        "pixel_codec",
        "pages",
        "plane_order",
        "husk_raw_size",
        "notes",
        "members",
        "series_consolidated",
        "all_chunks_stored",
    }
    plane_order = f.list("plane_order")
    if not all(isinstance(a, str) and a for a in plane_order):
        raise ManifestError(f"{source}: manifest plane_order must be a list of axis names")
    manifest = Manifest(
        format=fmt,
        mode=mode,
        original_name=f.str("original_name"),
        original_size=f.size("original_size"),
        original_sha256=f.str("original_sha256"),
        byteorder=_check_byteorder(f.str("byteorder", "<"), "manifest", source),
        decant_version=f.str("decant_version", ""),
        pixel_codec=f.str("pixel_codec", ""),
        pages=f.pages(),
        plane_order=tuple(plane_order),
        husk_raw_size=f.size("husk_raw_size", 0),
        notes=f.str("notes", ""),
        members=tuple(
            _parse_member(m, f"members[{i}]", source) for i, m in enumerate(_members(f, source))
        ),
        series_consolidated=f.bool("series_consolidated", False),
        all_chunks_stored=f.bool("all_chunks_stored", False),
        extra={k: v for k, v in doc.items() if k not in known},
    )
    _check_consistency(manifest, source)
    return manifest


def _check_consistency(m: Manifest, source: str) -> None:
    if m.mode != "series":
        if "/" in m.original_name or not _file_name(m.original_name):
            raise ManifestError(
                f"{source}: original_name {m.original_name[:80]!r} is not a file name"
            )
        if len(m.original_sha256) != 64:
            raise ManifestError(f"{source}: original_sha256 is not a 64-digit hex digest")
    pixels = _table(m.pages).nbytes()
    if m.mode == "byte-exact" and m.husk_raw_size + pixels != m.original_size:
        raise ManifestError(
            f"{source}: husk_raw_size + pixel bytes != original_size "
            f"({m.husk_raw_size} + {pixels} != {m.original_size})"
        )
    _check_counts(m, source)
    if m.mode == "series":
        if not m.members:
            raise ManifestError(f"{source}: series manifest lists no members")
        seen: set[str] = set()
        for i, mem in enumerate(m.members):
            parts = mem.relpath.split("/")
            if len(parts) > MAX_DEPTH or not all(_file_name(p) for p in parts):
                raise ManifestError(
                    f"{source}: members[{i}] relpath {mem.relpath[:80]!r} is unsafe"
                )
            if mem.relpath in seen:
                raise ManifestError(f"{source}: members[{i}] relpath {mem.relpath!r} repeats")
            seen.add(mem.relpath)
            if m.series_consolidated and not mem.husk_array:
                raise ManifestError(f"{source}: members[{i}] has no husk_array")
            if not m.series_consolidated and not mem.subarchive:
                raise ManifestError(f"{source}: members[{i}] has no subarchive")
        _no_member_is_a_folder(seen, source)
        if m.series_consolidated:
            _unique([mem.husk_array for mem in m.members], "members[].husk_array", source)
        else:
            _unique([mem.subarchive for mem in m.members], "members[].subarchive", source)


def _no_member_is_a_folder(relpaths: set[str], source: str) -> None:
    """Raise unless no relpath is a folder of another (`a` and `a/b.tif`: the mount would
    show one, restore write one and fail on the other). With `/` as NUL (which no name holds)
    the sorted relpaths put a folder's members right after it: one string a member, not one
    per folder of each (64 deep × 500,000 members)."""
    keys = sorted(r.replace("/", "\0") for r in relpaths)
    for before, after in itertools.pairwise(keys):
        if after.startswith(f"{before}\0"):
            raise ManifestError(
                f"{source}: member {before.replace(chr(0), '/')[:80]!r} is also a folder of "
                "other members"
            )


MAX_DEPTH = 64  # folders of a series member's relpath: the mount builds its tree from them


def _file_name(name: str) -> bool:
    """One path component a kernel accepts: not empty, . or .., no NUL, at most 255 bytes."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:  # JSON allows lone surrogates; no file name holds one
        return False
    return name not in ("", ".", "..") and "\0" not in name and size <= 255


def _check_counts(m: Manifest, source: str) -> None:
    """Pages and segments within bounds; a page index (a plane of `0`) used once per archive."""
    tables = [_table(m.pages), *(_table(mem.pages) for mem in m.members)]
    pages = sum(map(len, tables))
    if pages > MAX_PAGES:
        raise ManifestError(f"{source}: manifest lists {pages} pages, more than {MAX_PAGES}")
    segments = sum(t.segments() for t in tables)
    if segments > MAX_SEGMENTS:
        raise ManifestError(
            f"{source}: manifest lists {segments} pixel segments, more than {MAX_SEGMENTS}"
        )
    _unique((i for t in tables for i in t.indexes()), "page index", source)


_NO_PAGES = PageTable().view(0, 0)


def _members(f: _Fields, source: str) -> list[Any]:
    members = f.list("members")
    if len(members) > MAX_MEMBERS:  # json.loads' document (ManifestText stops at the bound)
        raise ManifestError(f"{source}: manifest lists more than {MAX_MEMBERS} members")
    return members


def _table(pages: Sequence[PageRecord]) -> PageTable:
    """Pages as a table: parsed ones already are; a writer's tuple of records is made one."""
    return pages if isinstance(pages, PageTable) else PageTable(pages)


def _unique(values: Iterable[Any], what: str, source: str) -> None:
    seen: set[Any] = set()
    for value in values:
        if value in seen:
            raise ManifestError(f"{source}: {what} {value!r} repeats")
        seen.add(value)
