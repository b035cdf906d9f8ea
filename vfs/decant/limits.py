"""What an archive may claim before it is read: every size and count is checked against these.

An archive is attacker input: a 14 KB zip can declare a 2 GiB chunk, a 1 MiB one can hold a chunk
that inflates to 1 GiB. Each claim is compared with these bounds (and with what the manifest
needs) before anything is allocated or decoded; a claim beyond them is a CorruptArchiveError.
The packer keeps to the same bounds (a page too large for them is packed verbatim), so nothing
decant writes is ever refused by its own reader.
"""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30

# One decoded pixel plane (spec §3: one plane per chunk). Blosc itself stops just below 2 GiB.
MAX_CHUNK_BYTES = 1 * GiB
# One decoded chunk of a 1-D byte array (husk, original/). decant writes 256 KiB and 1 MiB.
MAX_BLOCK_BYTES = 64 * MiB
# Chunks one original may need, and the size an original may claim.
MAX_CHUNKS = 1 << 24
MAX_ORIGINAL_SIZE = 1 << 50  # 1 PiB
# Manifest: bytes, JSON values (counted by commas before parsing), pages and pixel segments.
MAX_MANIFEST_BYTES = 128 * MiB
MAX_PAGES = 1 << 18
MAX_SEGMENTS = 1 << 21
MAX_MANIFEST_ITEMS = 2 * MAX_SEGMENTS + 24 * MAX_PAGES
# Any other metadata document (.zarray, .zattrs, .zgroup).
MAX_METADATA_BYTES = 1 * MiB


def json_values(raw: bytes) -> int:
    """About how many values JSON text parses into, counted before parsing it: separators and
    containers. Commas alone miss nesting: `[[[…]]]` 400 deep costs ~48 bytes of memory per
    byte of text with hardly a comma."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{")


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
