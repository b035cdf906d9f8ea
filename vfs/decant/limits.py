"""What an archive may claim before it is read: every size and count is checked against these.

An archive is attacker input: a 14 KB zip can declare a 2 GiB chunk, a 1 MiB one can hold a chunk
that inflates to 1 GiB. Each claim is compared with these bounds (and with what the manifest
needs) before anything is allocated or decoded; a claim beyond them is a CorruptArchiveError.
The packer keeps to the same bounds (a page too large for them is packed verbatim), so nothing
decant writes is ever refused by its own reader.
"""

from __future__ import annotations

import json
import re
from typing import Any

MiB = 1 << 20
GiB = 1 << 30

# One decoded pixel plane (spec §3: one plane per chunk). Blosc itself stops just below 2 GiB.
MAX_CHUNK_BYTES = 1 * GiB
# One decoded chunk of a 1-D byte array (husk, original/). decant writes 256 KiB and 1 MiB.
MAX_BLOCK_BYTES = 64 * MiB
# Chunks one original may need, and the size an original may claim.
MAX_CHUNKS = 1 << 24
MAX_ORIGINAL_SIZE = 1 << 50  # 1 PiB
# Manifest: bytes, pages and pixel segments (mode D's bounds: archives written within them stay
# readable), and what a manifest at those bounds holds, counted before parsing: JSON values,
# objects (a page or member record each) and lists (three a page, a few a member).
MAX_MANIFEST_BYTES = 128 * MiB
MAX_PAGES = 1 << 18
MAX_SEGMENTS = 1 << 21
# A series' members: each costs ~2 KiB while its manifest is parsed (its record, names and
# digest, and their JSON on the way), whatever its pages; 400,000 members in a 3.6 MB archive
# took 1.3 GiB and 30 s (red team 87). The packer packs no more into one series.
MAX_MEMBERS = 1 << 16
# What packing a page in mode D costs in memory beyond its pixels (its zarr chunk, manifest
# record, page table entry and checks: ~4.7 KiB measured, 30,000 one-pixel pages), and what
# that may come to before the pixels must outweigh it: a TIFF of more, tinier pages is packed
# verbatim (mode D made the 3.4 MB file of 30,000 one-pixel pages a 12 MB archive).
PAGE_OVERHEAD = 4 << 10
PAGES_OVERHEAD_FREE = 64 * MiB
# The same for a strip or tile (its offsets, plan entry and checks: ~1.3 KiB measured while
# packing 2 million one-byte strips, a 16 MB file that took the daemon to 2.3-2.8 GiB whatever
# its cache; red team 84): past the first 65,536, segments must average at least this.
SEGMENT_OVERHEAD = 1 << 10
SEGMENTS_OVERHEAD_FREE = 64 * MiB
MAX_MANIFEST_ITEMS = 2 * MAX_SEGMENTS + 26 * MAX_PAGES + 64  # commas and colons
MAX_MANIFEST_OBJECTS = 2 * MAX_PAGES + 64
MAX_MANIFEST_LISTS = 8 * MAX_PAGES + 64
# Any other metadata document (.zarray, .zattrs, .zgroup).
MAX_METADATA_BYTES = 1 * MiB
# Metadata documents (the manifest, `.zarray`s: a consolidated series has one husk array per
# member) whose digests a digest map holds; an archive with more gets no map (CRC-32 checks).
MAX_METADATA_KEYS = 1 << 12
# What parsing one JSON document may cost in memory (json_cost): an AcqStore document, a
# package's manifest.json; metadata documents less. A parsed document is ~50-100 bytes of
# Python objects a value: counting values alone let a 10 M-value document cost 600-750 MiB.
# A decant manifest is bounded by its shape instead (manifest_shape): one at mode D's bounds
# is ~90-125 MiB of text that json.loads made ~480 MiB of objects: it is read as bytes instead,
# its pages into columns (manifest_text.py, ~72 MiB), and parsed one at a time (manifest.py).
MAX_JSON_COST = 48 * MiB
MAX_METADATA_COST = 16 * MiB

_WIDE_ESCAPE = re.compile(rb"\\u(?!00)")


def json_cost(raw: bytes) -> int:
    """An upper bound on the bytes `json.loads(raw)` allocates, from its text before parsing.

    Each `{` is a dict (~200 bytes with its first key), each `[` a list, each `,` and `:` one
    more value or key (~60 bytes, its slot and the slot's share of over-allocation). The text
    is decoded once, and a string is built from it (from pieces, then joined, when it holds an
    escape): three times its length, or up to 4 bytes a character each time when any character
    lies beyond Latin-1 (PEP 393). Brackets and commas inside strings count too: that
    over-counts, never under. Checked against tracemalloc for the shapes that cost most per
    byte (nested one-key dicts, `[[0]]`, distinct keys, escaped strings) and for generated
    documents in tests/unit/test_json_cost.py.
    """
    wide = not raw.isascii() or _WIDE_ESCAPE.search(raw) is not None
    return (
        4096  # the decoder's own objects
        + (12 if wide else 3) * len(raw)
        + 240 * raw.count(b"{")
        + 120 * raw.count(b"[")
        + 100 * (raw.count(b",") + raw.count(b":"))
    )


def json_kept(raw: bytes) -> int:
    """What json_cost counts that the parsed document keeps once the text and the decoder's
    own objects are gone: its containers, values and their characters (1 or 4 bytes each)."""
    wide = not raw.isascii() or _WIDE_ESCAPE.search(raw) is not None
    return json_cost(raw) - 4096 - (8 if wide else 2) * len(raw)


def manifest_shape(raw: bytes) -> str:
    """Why a decant manifest's text holds more than one at mode D's bounds can ("" if it does
    not), counted before parsing: values (commas and colons), objects, lists. Objects and
    lists are what nesting costs (`[[[…]]]` 400 deep: ~48 bytes of memory per byte of text
    with hardly a comma; nested one-key objects ~33)."""
    values = raw.count(b",") + raw.count(b":")
    objects, lists = raw.count(b"{"), raw.count(b"[")
    if values > MAX_MANIFEST_ITEMS:
        return f"about {values} JSON values, more than {MAX_MANIFEST_ITEMS}"
    if objects > MAX_MANIFEST_OBJECTS:
        return f"{objects} JSON objects, more than {MAX_MANIFEST_OBJECTS}"
    if lists > MAX_MANIFEST_LISTS:
        return f"{lists} JSON lists, more than {MAX_MANIFEST_LISTS}"
    return ""


class JSONCostError(ValueError):
    """A JSON document refused unparsed: its objects could cost more memory than allowed."""


def parse_json(raw: bytes, budget: int = MAX_JSON_COST, **kwargs: Any) -> Any:
    """`json.loads(raw)`, refused before parsing when it could cost more than `budget` bytes.
    Every refusal is a ValueError (as a malformed document is), too deep a nesting included."""
    cost = json_cost(raw)
    if cost > budget:
        raise JSONCostError(
            f"{len(raw)} bytes of JSON that could take {human(cost)} of memory to parse, "
            f"more than {human(budget)}"
        )
    try:
        return json.loads(raw, **kwargs)
    except RecursionError:  # json's C decoder recurses once per nesting level
        raise ValueError("JSON nested too deeply") from None


# Zip central directory: parsed into one object per entry, so bounded before zipfile reads it.
MAX_ZIP_ENTRIES = 1 << 21
MAX_CENTRAL_DIRECTORY_BYTES = 128 * MiB
# Array rank (numpy's own limit is 64; decant writes at most 3 leading + 3 page axes).
MAX_NDIM = 32


def compressed_bound(nbytes: int) -> int:
    """The largest stored chunk that can decode to `nbytes` (worst-case codec expansion)."""
    return nbytes + nbytes // 16 + 4096


def human(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"
