"""A zip archive's central directory, held as compact tables: an archive's entry count is attacker
input, and what each entry costs in memory is what that input can make the daemon allocate.

zipfile makes a `ZipInfo` per entry (its name, a date tuple, a dozen ints: ~600 bytes), and reads
the whole directory first: a zip of 2,097,152 one-byte entries (the most an archive may hold,
197 MB) cost 1,192 MiB and 15 s to open that way, 152 MiB and 5 s here. An entry costs its name
in one bytes blob plus ~55 bytes of columns (`array`s, whose items are Python ints at once); a
name is found from the xxh3 of its UTF-8 bytes in a column sorted with numpy. The directory is
parsed from windows of at most `WINDOW` bytes, so its size never lands in memory at once either.

The end record is found by zipfile's own reader (`_EndRecData`, what `ZipFile` calls), and the
directory is read the way `ZipFile` reads it (names in cp437 unless flagged UTF-8, ZIP64 sizes
from the extra field, offsets moved by anything prepended to the archive), so this reads the
same entries at the same offsets; tests/unit/test_zipdir.py compares the two.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import threading
import zipfile
from array import array
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import BinaryIO, NamedTuple

import numpy as np
import xxhash

from vfs.decant.limits import MAX_CENTRAL_DIRECTORY_BYTES, MAX_ZIP_ENTRIES, human
from vfs.errors import CorruptArchiveError

_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # zipfile.structCentralDir, 46 bytes
_CENTRAL_SIG = b"PK\x01\x02"
_ZIP64_TAIL = 56 + 20  # the ZIP64 end record and its locator, between directory and end record
_MAX_VERSION = 63  # the newest "version needed to extract" zipfile reads
_U32 = 0xFFFF_FFFF
WINDOW = 4 << 20  # bytes of the directory parsed at a time (a longer record: read whole)
MAX_GROUPS = 1024  # first path parts kept as groups for `listed` (a decant archive has a few)
# A directory of more than LARGE_DIRECTORY bytes (~150,000 entries) is parsed by one thread at a
# time: each costs up to ~150 MiB while it is parsed, and a user who linked one zip of 2,000,000
# entries into six folders of theirs and listed them at once had the daemon open all six
# together (peak RSS +748 MiB with a 64 MiB cache). One at a time, one archive's tables are
# what parsing adds; an archive's tables still live as long as it is open.
LARGE_DIRECTORY = 8 << 20
_LARGE = threading.Lock()
# Told what a directory's tables will cost, from its end record, before they are built; may refuse
# by raising. Set by whoever budgets open archives (vfs.backends.decant), for the opens it makes
# in the thread that makes them: a budget checked only once an archive was open let concurrent
# first opens of large archives each build their tables, to be refused afterwards (red team 50s).
ADMIT_TABLES: ContextVar[Callable[[object, int], None] | None] = ContextVar(
    "admit_tables", default=None
)


class ZipEntry(NamedTuple):
    """One central directory record: what reading the entry needs, nothing else."""

    row: int  # position in the directory
    name: str
    header_offset: int  # of its local header, prepended bytes counted
    compress_size: int
    file_size: int
    crc: int
    method: int  # 0 stored, 8 deflated
    flags: int
    extra_len: int  # of the central record's extra field; the local one is usually the same

    @property
    def raw_name(self) -> bytes:
        """The name as the local header spells it."""
        return self.name.encode("utf-8" if self.flags & 0x800 else "cp437")


class ZipDirectory:
    """Every entry of one zip, looked up by name, listed by prefix, walked in stored order."""

    def __init__(self, path: object, fh: BinaryIO) -> None:
        """Parse the directory of the zip `fh` (seekable). CorruptArchiveError names `path`."""
        self.path = path
        start, size, self._concat, entries = _directory_span(fh, path)
        admit = ADMIT_TABLES.get()
        if admit is not None:
            admit(path, _estimate(size, entries))
        with _LARGE if size > LARGE_DIRECTORY else contextlib.nullcontext():
            self._build(fh, start, size)

    def _build(self, fh: BinaryIO, start: int, size: int) -> None:
        """Parse the directory's `size` bytes at `start` into the tables."""
        self._names = bytearray()  # every name's UTF-8, one after another
        ends, hashes = array("I"), array("Q")
        offsets, csizes, sizes = array("Q"), array("Q"), array("Q")
        crcs, methods, flags, extras = array("I"), array("H"), array("H"), array("H")
        groups: dict[str, array[int]] | None = {}
        names = self._names
        for row, (raw, name, fields) in enumerate(self._records(fh, start, size)):
            names += raw
            ends.append(len(names))
            hashes.append(xxhash.xxh3_64_intdigest(raw))
            offsets.append(fields[0])
            csizes.append(fields[1])
            sizes.append(fields[2])
            crcs.append(fields[3])
            methods.append(fields[4])
            flags.append(fields[5])
            extras.append(fields[6])
            head, sep, _ = name.partition("/")
            if groups is not None and sep:
                if head not in groups and len(groups) >= MAX_GROUPS:
                    groups = None  # not a decant layout: `listed` scans the names instead
                else:
                    groups.setdefault(head, array("I")).append(row)
        self._groups = groups
        # Columns stay arrays (an item is a Python int at once); the names' hashes are sorted
        # with numpy, and found with its searchsorted.
        self._ends, self._offsets, self._csizes, self._sizes = ends, offsets, csizes, sizes
        self._crcs, self._methods, self._flags, self._extras = crcs, methods, flags, extras
        keyed = np.frombuffer(hashes, dtype=np.uint64)
        self._order = np.argsort(keyed, kind="stable").astype(np.uint32)
        self._hashes = keyed[self._order]
        del keyed, hashes
        self._stored_rank: np.ndarray | None = None  # rows by header offset, made on first use
        self._stored_at = np.zeros(0, np.uint32)
        self._heads: tuple[np.ndarray, np.ndarray] | None = None  # `_rows_under`'s, on first use
        self._refuse_duplicates()

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        """Bytes its tables hold (the rank `following` makes on first use counted already):
        what holding this archive open costs, for a caller that budgets open archives."""
        columns = (self._names, self._ends, self._offsets, self._csizes, self._sizes,
                   self._crcs, self._methods, self._flags, self._extras)  # fmt: skip
        groups = self._groups.values() if self._groups is not None else ()
        held = sum(sys.getsizeof(c) for c in (*columns, *groups))  # with what growth left spare
        heads = 12 * len(self) if self._groups is None else 0  # `_rows_under`'s, when made
        return held + self._order.nbytes + self._hashes.nbytes + 8 * len(self) + heads

    def get(self, name: str) -> ZipEntry | None:
        """The entry named `name`, or None."""
        try:
            raw = name.encode("utf-8")
        except UnicodeEncodeError:
            return None
        want = xxhash.xxh3_64_intdigest(raw)
        hashes = self._hashes
        at = int(hashes.searchsorted(np.uint64(want)))  # a Python int would make it 250 µs
        while at < len(hashes) and hashes.item(at) == want:
            row = self._order.item(at)
            if self._raw(row) == raw:
                return self._entry(row, name)
            at += 1
        return None

    def names(self) -> Iterator[str]:
        """Every name, in directory order."""
        for row in range(len(self)):
            yield self._name(row)

    def listed(self, prefix: str) -> list[str]:
        """Names starting with `prefix`; a first path part and its "/" is a kept group, or
        found by `_rows_under` where there are too many to keep."""
        head, sep, rest = prefix.partition("/")
        if sep and not rest:
            if self._groups is not None:
                return [self._name(row) for row in self._groups.get(head, ())]
            return [self._name(row) for row in self._rows_under(head)]
        return [n for n in self.names() if n.startswith(prefix)]

    def _rows_under(self, head: str) -> list[int]:
        """The rows of the names whose first path part is `head`, found from the xxh3 of each
        name's first part, sorted once (12 bytes an entry, made on the first call). A series
        of 3,000 members keeps no groups (`husk_0/` … `husk_2999/`: more than MAX_GROUPS), and
        its describe listed each member's husk by a scan of every name: 36 million names
        decoded, 18-65 s of CPU for a 4.6 MB archive (red team 102 F2)."""
        try:
            want = head.encode("utf-8") + b"/"
        except UnicodeEncodeError:
            return []
        if self._heads is None:
            keys = np.empty(len(self), np.uint64)
            for row in range(len(self)):
                raw = self._raw(row)
                cut = raw.find(b"/")
                keys[row] = xxhash.xxh3_64_intdigest(raw[: cut + 1]) if cut >= 0 else 0
            order = np.argsort(keys, kind="stable").astype(np.uint32)
            self._heads = (keys[order], order)
        keys, order = self._heads
        key = np.uint64(xxhash.xxh3_64_intdigest(want))
        lo, hi = (int(keys.searchsorted(key, side)) for side in ("left", "right"))
        rows = sorted(order[lo:hi].tolist())  # in directory order, as a scan gives them
        return [row for row in rows if self._raw(row).startswith(want)]

    def following(self, entry: ZipEntry, count: int) -> list[ZipEntry]:
        """Up to `count` entries stored after `entry` in the archive, in stored order."""
        if self._stored_rank is None:
            offsets = np.frombuffer(self._offsets, dtype=np.uint64)
            rank = np.argsort(offsets, kind="stable").astype(np.uint32)
            where = np.empty_like(rank)
            where[rank] = np.arange(len(rank), dtype=np.uint32)
            self._stored_rank, self._stored_at = rank, where
        at = self._stored_at.item(entry.row) + 1
        return [self._entry(r) for r in self._stored_rank[at : at + count].tolist()]

    def _raw(self, row: int) -> bytes:
        return bytes(self._names[self._ends[row - 1] if row else 0 : self._ends[row]])

    def _name(self, row: int) -> str:
        return self._raw(row).decode("utf-8")

    def _entry(self, row: int, name: str | None = None) -> ZipEntry:
        return ZipEntry(
            row,
            self._name(row) if name is None else name,
            self._offsets[row],
            self._csizes[row],
            self._sizes[row],
            self._crcs[row],
            self._methods[row],
            self._flags[row],
            self._extras[row],
        )

    def _refuse_duplicates(self) -> None:
        """Two entries of one name would be read differently by different tools (zipfile takes
        the last, others the first): such an archive is refused, not read either way."""
        same = np.flatnonzero(self._hashes[1:] == self._hashes[:-1])
        for at in same.tolist():
            first, second = self._order.item(at), self._order.item(at + 1)
            if self._raw(first) == self._raw(second):
                raise CorruptArchiveError(
                    f"{self.path}: zip holds two entries named {self._name(first)[:80]!r}"
                )

    def _records(
        self, fh: BinaryIO, start: int, size: int
    ) -> Iterator[tuple[bytes, str, tuple[int, ...]]]:
        """Each record's name as UTF-8 and as text, and (offset, compress_size, size, crc,
        method, flags, extra length); read a window of at most WINDOW bytes at a time, counted
        before anything is kept."""
        fixed, unpack = _CENTRAL.size, _CENTRAL.unpack_from
        done, count = 0, 0  # bytes of the directory parsed, records seen
        window, at = b"", 0
        while done < size:
            end = at + fixed
            if end <= len(window):
                record = unpack(window, at)
                end += record[12] + record[13] + record[14]
            if end > len(window):  # the next record is not whole in this window: read on
                fh.seek(start + done)
                window, at = fh.read(min(WINDOW, size - done)), 0
                if len(window) < fixed:
                    raise CorruptArchiveError(f"{self.path}: zip central directory is truncated")
                record = unpack(window, 0)
                end = fixed + record[12] + record[13] + record[14]
                if len(window) < end <= size - done:  # one record longer than a window
                    fh.seek(start + done)
                    window = fh.read(end)
                if end > len(window):
                    raise CorruptArchiveError(f"{self.path}: zip central directory is truncated")
            if record[0] != _CENTRAL_SIG:
                raise CorruptArchiveError(f"{self.path}: zip central directory is damaged")
            count += 1
            if count > MAX_ZIP_ENTRIES:
                raise CorruptArchiveError(
                    f"{self.path}: zip central directory holds more than {MAX_ZIP_ENTRIES} entries"
                )
            yield self._record(window, at, record)
            done += end - at
            at = end

    def _record(
        self, window: bytes, at: int, record: tuple[int, ...]
    ) -> tuple[bytes, str, tuple[int, ...]]:
        version, flags, method = record[3], record[5], record[6]
        crc, csize, size, name_len, extra_len = record[9:14]
        offset = record[18]
        raw = window[at + _CENTRAL.size : at + _CENTRAL.size + name_len]
        if raw.isascii():  # the same in cp437 and UTF-8, and decoded fastest as ASCII
            name = raw.decode("ascii")
        else:
            try:
                name = raw.decode("utf-8" if flags & 0x800 else "cp437")
            except UnicodeDecodeError:
                raise CorruptArchiveError(
                    f"{self.path}: zip entry name {raw[:80]!r} is not valid UTF-8"
                ) from None
            raw = name.encode("utf-8")
        if "\0" in name:
            raise CorruptArchiveError(f"{self.path}: zip entry name {raw[:80]!r} holds a NUL")
        if version > _MAX_VERSION:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {name[:80]!r} needs zip version {version / 10:.1f}"
            )
        if _U32 in (csize, size, offset):
            extra_at = at + _CENTRAL.size + name_len
            size, csize, offset = _zip64(
                window[extra_at : extra_at + extra_len], size, csize, offset, self.path, name
            )
        if offset + self._concat < 0:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {name[:80]!r} starts before the start of the file"
            )
        return raw, name, (offset + self._concat, csize, size, crc, method, flags, extra_len)


def _estimate(size: int, entries: int) -> int:
    return int(size + 12 * entries)


def _directory_span(fh: BinaryIO, path: object) -> tuple[int, int, int, int]:
    """(start, size) of the central directory, from the end record, bounded; how many bytes
    precede the archive (zipfile's "concat": each entry's offset moves by them); its entries."""
    try:
        rec = zipfile._EndRecData(fh)  # type: ignore[attr-defined]
    except (OSError, struct.error, ValueError) as exc:
        raise CorruptArchiveError(f"{path}: not a readable zip archive ({exc})") from None
    if not rec:
        raise CorruptArchiveError(f"{path}: not a zip archive (no end record)")
    entries, size, offset, location = rec[4], rec[5], rec[6], rec[9]
    if entries > MAX_ZIP_ENTRIES:
        raise CorruptArchiveError(
            f"{path}: zip end record claims {entries} entries, more than {MAX_ZIP_ENTRIES}"
        )
    if size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise CorruptArchiveError(
            f"{path}: zip central directory claims {size} bytes, more than "
            f"{human(MAX_CENTRAL_DIRECTORY_BYTES)}"
        )
    concat = location - size - offset
    if rec[0] == zipfile.stringEndArchive64:  # type: ignore[attr-defined]
        concat -= _ZIP64_TAIL
    if offset + concat < 0:
        raise CorruptArchiveError(f"{path}: zip end record gives a bad directory offset")
    return offset + concat, size, concat, entries


def _zip64(
    extra: bytes, size: int, csize: int, offset: int, path: object, name: str
) -> tuple[int, int, int]:
    """Sizes and offset from the ZIP64 extra field, each where the record holds 0xFFFFFFFF."""
    while len(extra) >= 4:
        kind, length = struct.unpack_from("<HH", extra)
        if length + 4 > len(extra):
            break
        if kind == 0x0001:
            data = extra[4 : 4 + length]
            values = []
            for field in (size, csize, offset):
                if field == _U32:
                    if len(data) < 8:
                        break
                    field, data = struct.unpack_from("<Q", data)[0], data[8:]
                values.append(field)
            else:
                return values[0], values[1], values[2]
            break
        extra = extra[4 + length :]
    raise CorruptArchiveError(f"{path}: zip entry {name[:80]!r} has a damaged ZIP64 extra field")
