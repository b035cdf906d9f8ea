"""Reading a manifest's JSON text in bounded memory: the pages go into a PageTable as read.

`json.loads` of a manifest at mode D's bounds (2^18 pages, 2^21 segments) costs ~480 MiB: the
text decoded whole (~125 MiB), every page a dict of lists of distinct ints; and a hostile text
within the same counts more (distinct keys, which json memoizes for the whole parse; a string
made 4 bytes a character by one emoji). Here the text is walked as bytes: the manifest object,
its `members` and every `pages` list by this module, each other value by json's own scanner in
a window of text of its own. So nothing holds the whole text decoded, a page's dict lives only
while it is checked, json's key memo lasts one value, and each value's parse, and what the
manifest keeps besides its pages, is bounded by `json_cost`. A page's integers are 64-bit in
the table: one of 2^63 or more (no size, offset or count of the format) is refused.

A streaming parser made for this exists: ijson (yajl2_c backend, not a dependency) iterates the
2^18 pages of a manifest at the bounds in 1.5 s with 0.4 MiB traced, where this walk takes
6.6 s in all, page checks included (json.loads and the same checks: 5.7 s). Measured after
this module was written; replacing the walk by ijson's events is the simpler way on."""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from vfs.decant.limits import (
    MAX_JSON_COST,
    MAX_MEMBERS,
    MAX_PAGES,
    MAX_SEGMENTS,
    human,
    json_cost,
    json_kept,
)
from vfs.decant.pagetable import PAGE_FIELDS, PageTable
from vfs.errors import DecantError, ManifestError

# What one value other than a page may cost to parse, and what all of them kept may cost.
MAX_VALUE_COST = MAX_JSON_COST
MAX_KEPT_COST = MAX_JSON_COST
# A page record as the packer writes it costs ~10 KiB by json_cost; a larger one (thousands of
# segments) is walked with its integer lists read straight into arrays.
MAX_PAGE_COST = 1 << 20
# A member's names and digest are short: only what a field costs beyond this is counted.
MEMBER_FIELD_ALLOWANCE = 2048
MEMBER_FIELDS = frozenset(
    {
        "relpath",
        "original_size",
        "original_sha256",
        "byteorder",
        "husk_array",
        "husk_raw_size",
        "pages",
        "subarchive",
    }
)
_FIRST_WINDOW = 1024  # a page record as the packer writes it: ~500 bytes

_WS = re.compile(rb"[ \t\n\r]*")
_WS_BYTES = b" \t\n\r"
_INT_CHARS = re.compile(rb"[0-9, \t\n\r-]*")  # a list of integers and nothing else, unchecked
_LEADING_ZERO = re.compile(rb"(?<![0-9])-?0[0-9]")
_AFTER_VALUE = frozenset(" \t\n\r,]}:")  # what follows a value in valid JSON ("" does not)
_INT_LISTS = ("shape", "dataoffsets", "databytecounts")  # a page's lists of integers
# A short string without escapes, an integer, true, false or null: most of a manifest's values
# and every key, read without json's scanner and its window (a series of 400,000 members, each
# a dozen such values, took 25 s to walk: red team 87). What follows must end the value.
_SIMPLE = re.compile(rb'"[^"\\\x00-\x1f]{0,256}"|-?(?:0|[1-9][0-9]{0,17})(?=[ \t\n\r,\]}])'
                     rb"|true|false|null")  # fmt: skip
_SIMPLE_COST = 8192  # what json_cost counts for any of them, and more
_CONSTANTS = {b"true": True, b"false": False, b"null": None}


class _TooCostly(ValueError):
    """A value whose text could cost more than its budget to parse."""


# json's own scanner (C): its key memo lasts one call, so one value's keys at a time.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once


def _too_costly(start: int, budget: int) -> _TooCostly:
    return _TooCostly(f"a value at byte {start} that could take more than {human(budget)} to parse")


class ManifestText:
    """The manifest's bytes, read from `pos` on; `source` names the archive in every error."""

    def __init__(self, raw: bytes, source: str) -> None:
        self.raw, self.source = raw, source
        self.pos = 3 if raw.startswith(b"\xef\xbb\xbf") else 0  # json.loads allows a UTF-8 BOM
        self.kept = 0
        self.stored = [0, 0]  # pages and segments in the tables the document holds
        self.member_pages = PageTable()  # every member's pages: each member's table a view

    def document(self) -> Any:
        """The manifest: a dict whose `pages` (and each member's) is a PageTable, or whatever
        other JSON value the text holds (the caller refuses it)."""
        if json.detect_encoding(self.raw[:4]) not in ("utf-8", "utf-8-sig"):
            raise ManifestError(f"{self.source}: manifest is not UTF-8 JSON")
        try:
            doc = self._object("manifest") if self._peek() == b"{" else self._value(MAX_KEPT_COST)
            self._skip()
            if self.pos != len(self.raw):
                raise self._error("extra data")
        except RecursionError:  # json's scanner recurses once per nesting level
            raise ManifestError(f"{self.source}: manifest JSON is nested too deeply") from None
        except _TooCostly as exc:
            raise ManifestError(f"{self.source}: manifest not parsed: it holds {exc}") from None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ManifestError(f"{self.source}: manifest is not valid JSON ({exc})") from None
        return doc

    def _object(self, where: str) -> dict[str, Any]:
        """The manifest or a member record: `pages` and `members` walked, the rest scanned."""
        doc: dict[str, Any] = {}
        self.pos += 1  # "{"
        if self._take(b"}"):
            return doc
        while True:
            start = self.pos
            key = self._key()
            if key == "pages" and self._peek() == b"[":
                self._forget(doc.pop(key, None))  # a repeated key: the last one counts
                if where == "manifest":
                    doc[key] = self._pages("pages", PageTable())
                else:
                    doc[key] = self._pages(f"{where}.pages", self.member_pages)
            elif key == "members" and where == "manifest" and self._peek() == b"[":
                self._forget(doc.pop(key, None))
                doc[key] = self._members()
            elif where == "manifest" or key in MEMBER_FIELDS:
                doc[key] = self._value(MAX_VALUE_COST)
                self._keep(self.raw[start : self.pos], 0 if where == "manifest" else 1)
            else:  # the reader ignores a member's other fields: read, not kept
                self._value(MAX_VALUE_COST)
            if not self._take(b","):
                self._expect(b"}")
                return doc

    def _members(self) -> list[Any]:
        members: list[Any] = []
        self.pos += 1  # "["
        if self._take(b"]"):
            return members
        while True:
            if len(members) == MAX_MEMBERS:
                raise ManifestError(
                    f"{self.source}: manifest lists more than {MAX_MEMBERS} members"
                )
            where = f"members[{len(members)}]"
            is_object = self._peek() == b"{"
            start = self.pos
            members.append(self._object(where) if is_object else self._value(MAX_VALUE_COST))
            if not is_object:
                self._keep(self.raw[start : self.pos], 0)
            if not self._take(b","):
                self._expect(b"]")
                return members

    def _pages(self, where: str, into: PageTable) -> PageTable:
        """Each page parsed, checked and added to `into`; the pages read, a view of it. The
        first refusal kept on the view, not raised, so that errors the old parser raised first
        (an unsupported format) still come first."""
        lo = len(into)
        error = self._page_list(where, into)
        table = into.view(lo, len(into))
        table.error = error
        return table

    def _page_list(self, where: str, table: PageTable) -> DecantError | None:
        from vfs.decant.manifest import parse_page

        error: DecantError | None = None
        self.pos += 1  # "["
        if self._take(b"]"):
            return error
        i = 0
        while True:
            doc = self._page()
            if error is None:
                try:
                    page = parse_page(doc, f"{where}[{i}]", self.source)
                    table.append(page)
                except DecantError as exc:  # kept without its traceback, which holds the frames
                    error = exc.with_traceback(None)  # (each member's table keeps its own)
                except OverflowError:  # no size, offset or count of the format is 2^63
                    error = ManifestError(
                        f"{self.source}: {where}[{i}] holds an integer of 2^63 or more"
                    )
                else:
                    self._count(1, len(page.dataoffsets))
            i += 1
            if not self._take(b","):
                self._expect(b"]")
                return error

    def _page(self) -> Any:
        """One page record as a dict: scanned at once when small, else walked."""
        start = self.pos
        try:
            return self._value(MAX_PAGE_COST)
        except _TooCostly:
            self.pos = start
        if self._peek() != b"{":
            return self._value(MAX_VALUE_COST)
        doc: dict[str, Any] = {}
        self.pos += 1
        if self._take(b"}"):
            return doc
        spent = 0  # by the fields kept until the page is checked
        while True:
            key = self._key()
            ints = self._int_list() if key in _INT_LISTS and self._peek() == b"[" else None
            start = self.pos
            value = ints if ints is not None else self._value(MAX_VALUE_COST - spent)
            if key in PAGE_FIELDS:  # the reader ignores a page's other fields: read, not kept
                doc[key] = value
                spent += 0 if ints is not None else json_cost(self.raw[start : self.pos])
            if not self._take(b","):
                self._expect(b"}")
                return doc

    def _key(self) -> str:
        """A property name and its colon."""
        if self._peek() != b'"':
            raise self._error("expecting a property name enclosed in double quotes")
        key: str = self._value(MAX_VALUE_COST)
        self._expect(b":")
        return key

    def _int_list(self) -> array[int] | None:
        """A list of integers read straight into an array (8 bytes each, not ~40), or None
        (pos unmoved) when it holds anything else: then it is scanned as any value is."""
        end = self.raw.find(b"]", self.pos)
        body = self.raw[self.pos + 1 : end]
        if end < 0 or not _INT_CHARS.fullmatch(body) or _LEADING_ZERO.search(body):
            return None
        values = array("q")
        try:  # int() refuses what JSON does but for leading zeros: "", "1 2", "--1", "1-"
            for piece in _pieces(body, 1 << 16) if body.strip(_WS_BYTES) else ():
                values.extend(map(int, piece.split(b",")))
                self._count(0, len(values), counted=False)
        except (ValueError, OverflowError):  # the scanner says which (2^63 or more: the page)
            return None
        self.pos = end + 1
        return values

    def _value(self, budget: int) -> Any:
        """The JSON value at pos, scanned by json's scanner in a window of the text that grows
        until the value ends inside it, refused when it does not end inside the largest window
        whose text could cost at most `budget` to parse."""
        self._skip()
        if budget >= _SIMPLE_COST:
            m = _SIMPLE.match(self.raw, self.pos)
            if m is not None:
                simple = _simple(m.group())
                if simple is not _NOT_SIMPLE:
                    self.pos = m.end()
                    return simple
        start, size, largest = self.pos, _FIRST_WINDOW, False
        while True:
            window, final = self._window(start, size)
            if json_cost(window) > budget:
                size, largest = self._affordable(start, size // 2, size, budget), True
                window, final = self._window(start, size)
            parsed = self._scan(window, start, final)
            if parsed is not None:
                value, length = parsed
                self.pos = start + length
                return value
            if largest:
                raise _too_costly(start, budget)
            size *= 2

    def _window(self, start: int, size: int) -> tuple[bytes, bool]:
        """Text from `start`, about `size` bytes, not cut inside a character; and whether it
        runs to the end of the manifest."""
        end = min(start + size, len(self.raw))
        final = end == len(self.raw)
        for _ in range(3):  # a UTF-8 character is 4 bytes at most
            if not final and self.raw[end] & 0xC0 == 0x80:
                end -= 1
        return self.raw[start:end], final

    def _affordable(self, start: int, low: int, high: int, budget: int) -> int:
        """The largest window size in [low, high) whose text costs at most `budget`, to 4 KiB."""
        if json_cost(self._window(start, low)[0]) > budget:
            raise _too_costly(start, budget)
        while high - low > 4096:
            mid = (low + high) // 2
            low, high = (
                (mid, high) if json_cost(self._window(start, mid)[0]) <= budget else (low, mid)
            )
        return low

    def _scan(self, window: bytes, start: int, final: bool) -> tuple[Any, int] | None:
        """(value, its length in bytes) when the value ends inside `window`, None when more
        text is needed; a malformed value raises once no more text could mend it."""
        try:
            text = window.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            if exc.start == 0:
                raise
            text, final = (
                window[: exc.start].decode("utf-8", "surrogatepass"),
                True,
            )  # more text cannot mend it
        try:
            value, stop = _SCAN(text, 0)
        except StopIteration as exc:  # no value at exc.value: the text may end there
            if not final:
                return None
            raise self._error("expecting a value", start + exc.value) from None
        except json.JSONDecodeError as exc:
            if not final:
                return None
            raise self._error(exc.msg, start + exc.pos) from None
        if not final and text[stop : stop + 1] not in _AFTER_VALUE:  # "1.5e3" cut as "1." or "1.5e"
            return None
        return value, stop if text.isascii() else len(text[:stop].encode("utf-8", "surrogatepass"))

    def _count(self, pages: int, segments: int, counted: bool = True) -> None:
        """Refuse a document whose tables would hold more than mode D's bounds, before they do
        (the text's counts would allow ~1.7 times as many pages, ~2.6 times the segments)."""
        total = (self.stored[0] + pages, self.stored[1] + segments)
        if counted:
            self.stored[:] = total
        if total[0] > MAX_PAGES:
            raise ManifestError(f"{self.source}: manifest lists more than {MAX_PAGES} pages")
        if total[1] > MAX_SEGMENTS:
            raise ManifestError(
                f"{self.source}: manifest lists more than {MAX_SEGMENTS} pixel segments"
            )

    def _forget(self, value: Any) -> None:
        """Uncount the tables of a repeated `pages` or `members`, which the last one replaces."""
        tables = [value] if isinstance(value, PageTable) else []
        if isinstance(value, list):
            tables = [m["pages"] for m in value if isinstance(m, dict) and "pages" in m]
        for table in tables:
            if isinstance(table, PageTable):
                self.stored[0] -= len(table)
                self.stored[1] -= table.segments()

    def _keep(self, text: bytes, member: int) -> None:
        """Count what a kept value costs; a member's short fields are free (there are many)."""
        self.kept += max(0, json_kept(text) - member * MEMBER_FIELD_ALLOWANCE)
        if self.kept > MAX_KEPT_COST:
            raise _TooCostly(
                f"fields besides its pages that could take more than {human(MAX_KEPT_COST)}"
            )

    def _skip(self) -> None:
        m = _WS.match(self.raw, self.pos)
        self.pos = m.end() if m else self.pos

    def _peek(self) -> bytes:
        self._skip()
        return self.raw[self.pos : self.pos + 1]

    def _take(self, byte: bytes) -> bool:
        if self._peek() == byte:
            self.pos += 1
            return True
        return False

    def _expect(self, byte: bytes) -> None:
        if not self._take(byte):
            raise self._error(f"expecting {byte.decode()!r}")

    def _error(self, what: str, at: int | None = None) -> ValueError:
        return ValueError(f"{what} at byte {self.pos if at is None else at}")


_NOT_SIMPLE = object()


def _simple(text: bytes) -> Any:
    """The value of a _SIMPLE match, as json's scanner makes it (_NOT_SIMPLE: let it)."""
    if text[:1] == b'"':
        try:
            return text[1:-1].decode("utf-8")
        except UnicodeDecodeError:  # json's scanner decides (it allows lone surrogates)
            return _NOT_SIMPLE
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    return int(text)


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    """`body` in pieces of about `size` bytes, each cut after a comma."""
    start = 0
    while start < len(body):
        cut = body.find(b",", start + size)
        end = len(body) if cut < 0 else cut
        yield body[start:end]
        start = end + 1
