"""The digest map an index keeps for a verified archive, and how it is made.

It holds the xxh3-64 of every stored chunk (what `Store.get` checks before decoding) and, for
blosc1 chunks, the xxh3-64 of the chunk's header and block table and of each block's stream.
With those a small read of a verified archive checks just the one block it decodes: before, it
read and hashed the whole compressed plane (~4 MiB at the default codec) to check the chunk's
digest, so a cold random 4 KiB read of a verified archive took 8-10 ms where the same read of an
unverified one took ~1 ms, and cached the compressed plane besides.

Block entries sit in the same key → int map under hidden keys (".b/<chunk>/t" for the header
and table, ".b/<chunk>/<j>" for block j): a key with a part starting with "." is never a chunk
key, so no entry of an archive can collide with one. They are bounded per archive
(MAX_BLOCK_ENTRIES, ~8 MiB of map): chunks past the bound keep the whole-chunk check.

A layout entry (".b/<chunk>/l") keeps the chunk's header and block table themselves, and where
its bytes start in the archive file: a cold small read then makes one read (the block), not two
(the entry's local header with the table, then the block). Its value packs both into one int,
which JSON keeps at any size (`pack_layout`); it is bounded (LAYOUT_TABLE_MAX) and checked
against the table's digest before use, so a damaged entry only costs the read it would save.
"""

from __future__ import annotations

from collections.abc import Mapping

import xxhash

from vfs.decant.blosc_blocks import BloscChunkError, block_spans, parse_header
from vfs.decant.limits import MAX_MANIFEST_BYTES, MAX_METADATA_BYTES, MAX_METADATA_KEYS
from vfs.decant.store import MANIFEST_KEY, Store, is_chunk_key, is_metadata_key

MAX_BLOCK_ENTRIES = 1 << 16  # 2048 chunks of 32 blocks: 8 GiB of planes at the default codec
# Chunk digests one map may hold: as many planes as a manifest may have pages. A map is parsed
# at each open of its archive (~100 bytes a digest once loaded): an archive of more chunks, junk
# keys a hostile zip holds by the million included, gets no map and keeps its CRC-32 checks.
MAX_MAP_CHUNKS = 1 << 18

_PREFIX = ".b/"
# Header and table bytes a layout entry may keep: 252 blocks (32 for a plane at the default
# codec). Its int stays far below the 4300 digits Python converts to and from text by default.
LAYOUT_TABLE_MAX = 1024
_OFFSET_BITS = 64


def table_key(chunk: str) -> str:
    return f"{_PREFIX}{chunk}/t"


def block_key(chunk: str, j: int) -> str:
    return f"{_PREFIX}{chunk}/{j}"


def layout_key(chunk: str) -> str:
    return f"{_PREFIX}{chunk}/l"


def pack_layout(table: bytes | memoryview, data_offset: int | None) -> int:
    """A chunk's header and block table and its data offset in the archive file (None:
    not a zip entry, or not known) as one int: 0x01 ‖ table, then the offset + 1 (0: none)."""
    offset = 0 if data_offset is None else data_offset + 1
    return int.from_bytes(b"\x01" + bytes(table), "big") << _OFFSET_BITS | offset


def unpack_layout(value: object) -> tuple[bytes, int | None] | None:
    """(table, data offset) of a layout entry's value, None when it is not one `pack_layout`
    could have made (a damaged index then costs the read the entry would have saved)."""
    if not isinstance(value, int) or value <= 0:
        return None
    rest, offset = value >> _OFFSET_BITS, value & ((1 << _OFFSET_BITS) - 1)
    raw = rest.to_bytes((rest.bit_length() + 7) // 8, "big")
    if not raw or raw[0] != 1 or len(raw) - 1 > LAYOUT_TABLE_MAX:
        return None
    return raw[1:], offset - 1 if offset else None


def _chunk_of(key: str) -> str | None:
    return key[len(_PREFIX) :].rpartition("/")[0] if key.startswith(_PREFIX) else None


def block_entries(
    chunk: str, data: bytes | memoryview, room: int, data_offset: int | None = None
) -> dict[str, int]:
    """The block entries of one stored blosc1 chunk, if they fit in `room` entries, else none
    (nor for other codecs or a damaged header: those keep the whole-chunk check). For a chunk
    stored without compression (memcpyed) the "table" entry covers just the header and each
    block entry its slice of the payload. `data_offset`: where the chunk's bytes start in the
    archive file, for its layout entry."""
    view = memoryview(data).cast("B")
    try:
        h = parse_header(view, len(view))
        if h is None or not 0 < h.nblocks <= room - 2:
            return {}
        spans = block_spans(h, view[: h.table_end])
    except BloscChunkError:
        return {}
    out = {table_key(chunk): xxhash.xxh3_64_intdigest(view[: h.table_end])}
    if h.table_end <= LAYOUT_TABLE_MAX:
        out[layout_key(chunk)] = pack_layout(view[: h.table_end], data_offset)
    for j, (start, end) in enumerate(spans):
        out[block_key(chunk, j)] = xxhash.xxh3_64_intdigest(view[start:end])
    return out


class DigestRecorder:
    """Chunk digests and block entries of the chunks it is shown, block entries up to
    MAX_BLOCK_ENTRIES (each chunk's all or none). Safe to call from reader threads."""

    def __init__(self) -> None:
        self.chunks: dict[str, int] = {}
        self._blocks: dict[str, int] = {}

    def note(self, key: str, data: bytes | memoryview, data_offset: int | None = None) -> None:
        self.chunks[key] = xxhash.xxh3_64_intdigest(data)
        room = MAX_BLOCK_ENTRIES - len(self._blocks)
        if table_key(key) not in self._blocks and room > 2:
            self._blocks.update(block_entries(key, data, room, data_offset))

    def digest_map(self, keys: list[str] | None = None) -> dict[str, int] | None:
        """The map of `keys` (default: every chunk noted) and their block entries; None past
        MAX_MAP_CHUNKS chunks."""
        if len(self.chunks if keys is None else keys) > MAX_MAP_CHUNKS:
            return None
        chunks = self.chunks if keys is None else {k: self.chunks[k] for k in keys}
        blocks = {k: v for k, v in list(self._blocks.items()) if _chunk_of(k) in chunks}
        return {**chunks, **blocks}


def metadata_digests(store: Store) -> dict[str, int] | None:
    """xxh3-64 of every metadata entry of `store` (see is_metadata_key), for the map: a store
    given a map checks every entry the map holds as it reads it, in place of the zip's CRC-32,
    so a map of chunks only left a verified archive's manifest read with no check at all (one
    rotten bit in a page's offset: the original served shifted, as verified). The digests of
    entries this store parsed already are of those very bytes (no second read of them, no GET
    from a bucket); others are read now. None past MAX_METADATA_KEYS entries."""
    keys = []
    for key in store.all_keys():
        if is_metadata_key(key):
            keys.append(key)
            if len(keys) > MAX_METADATA_KEYS:
                return None
    out = {}
    for key in keys:
        seen = store.metadata_seen.get(key)
        if seen is None:
            limit = MAX_MANIFEST_BYTES if key == MANIFEST_KEY else MAX_METADATA_BYTES
            data = store.get(key, limit)
            seen = None if data is None else xxhash.xxh3_64_intdigest(data)
        if seen is not None:
            out[key] = seen
    return out


def has_metadata_entries(digests: Mapping[str, int]) -> bool:
    """Whether the map holds its archive's manifest digest (maps recorded before metadata
    digests hold none: the next verification of their archive, a scrub's, records the map
    anew; until then a zip's metadata keeps its CRC-32 check, a `.zarr/` folder's none)."""
    return MANIFEST_KEY in digests


def has_block_entries(digests: Mapping[str, int]) -> bool:
    """Whether the map holds block entries (maps recorded before them, or of archives with no
    blosc1 chunk, hold one digest per chunk only). A nested archive's keys carry its prefix."""
    return any(k.startswith(_PREFIX) or f"/{_PREFIX}" in k for k in digests)


def has_layout_entries(digests: Mapping[str, int]) -> bool:
    """Whether the map holds layout entries (maps recorded before them hold none: the next
    verification of their archive, a scrub's, records the map anew, with them)."""
    return any(k.endswith("/l") and (k.startswith(_PREFIX) or f"/{_PREFIX}" in k) for k in digests)


def chunk_digests(digests: Mapping[str, int]) -> dict[str, int]:
    """The map without its block entries: one digest per stored chunk."""
    return {k: v for k, v in digests.items() if is_chunk_key(k)}
