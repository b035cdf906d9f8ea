"""xxh3-64 digests of every stored chunk of an archive, for the adapter to keep in its index.

With the map given back to `DecantArchive.open(path, digests)`, each chunk read is checked
before it is decoded: a chunk damaged or swapped after indexing is an error naming it, on a
random read too, not only a wrong byte that the whole-file sha256 catches at the end. The map is
made from reads the zip's CRC-32 checks (the writer's own checksum), and on later reads it
replaces the CRC: xxh3 runs at ~22 GB/s, CRC-32 at ~5.5 GB/s (tools/fuzz.py's neighbour
measurements are in the hardening report). Blosc chunks add one digest per block, so a small
read checks only the block it decodes (vfs.decant.digestmap).
"""

from __future__ import annotations

from pathlib import Path

from vfs.decant.digestmap import MAX_MAP_CHUNKS, DigestRecorder, metadata_digests
from vfs.decant.limits import MAX_CHUNK_BYTES, compressed_bound
from vfs.decant.reader import DecantArchive
from vfs.decant.store import DirectoryStore, FolderStore, Store, is_chunk_key
from vfs.errors import DecantError, IntegrityError, ObjectChangedError, StoreError
from vfs.stores.base import Folder


def archive_digests(path: Path, expect: str | None = None) -> dict[str, int] | None:
    """Store key → xxh3-64 of the chunk's stored (compressed) bytes, for every chunk of the
    archive (None: more than MAX_MAP_CHUNKS). A nested series' bundles contribute their chunks
    as "<bundle>/<key>".

    A folder archive's files change with no change to the folder's stat, which keys the map: a
    map read from it after a verification may describe files swapped since. Its map is made
    only from files that reconstruct every original to the manifest's sha256 (and one of them
    to `expect`, the sha256 the caller verified), each held to the version that did
    (DirectoryStore.pinned); IntegrityError otherwise."""
    with DecantArchive.open(path) as archive:
        if not isinstance(archive.store, DirectoryStore):
            return opened_digests(archive)
        archive.store.pinned = {}
        return _held_digests(archive, expect)


def folder_digests(folder: Folder, key: str, expect: str | None = None) -> dict[str, int] | None:
    """`archive_digests` of the archive at `key` of any folder (a bucket prefix). A `NAME.zarr/`
    prefix's objects are replaced one by one with no change to its identity (its manifest's),
    which keys the map: as a local folder archive's, its map is made only from objects that
    reconstruct to `expect`, each held to the version that did (FolderStore.pinned). Read
    again without, a chunk replaced after its plane was served (from the cache) to the hash
    that verified was recorded as the archive's, and served as verified after a restart."""
    with DecantArchive.open_at(folder, key) as archive:
        if not isinstance(archive.store, FolderStore):
            return opened_digests(archive)
        archive.store.pinned = {}
        return _held_digests(archive, expect)


def _held_digests(archive: DecantArchive, expect: str | None) -> dict[str, int] | None:
    """The map of a folder archive whose values are pinned, once every original reconstructs.
    A change seen while it is read (a value not its pinned version, a bundle rewritten under
    its descriptor or ETag, one reopened as another) is an IntegrityError too: the caller
    keeps a verdict whose map was not recorded, and a folder archive's identity (its
    manifest's) does not change with its other files, so every later swap was served as
    verified, unchecked. The store unreachable is not: no map now, as for a zip."""
    try:
        _require_reconstructs(archive, expect)
        return opened_digests(archive)
    except IntegrityError:
        raise
    except DecantError as exc:
        if isinstance(exc, StoreError) and not isinstance(exc, ObjectChangedError):
            raise
        raise IntegrityError(f"{archive.path}: changed since it verified ({exc})") from None


def _require_reconstructs(archive: DecantArchive, expect: str | None) -> None:
    from vfs.decant.verify import verify_opened  # its decoders: only for folder archives

    verdicts = verify_opened(archive)
    for v in verdicts:
        if not v.ok:
            raise IntegrityError(
                f"{archive.path}: {v.relpath} reconstructs to sha256 {v.actual}, not the "
                f"manifest's {v.expected} (changed since it verified?)"
            )
    if expect is not None and expect not in {v.expected for v in verdicts}:
        raise IntegrityError(f"{archive.path}: its manifest no longer holds sha256 {expect}")


def opened_digests(archive: DecantArchive) -> dict[str, int] | None:
    """`archive_digests` of an archive opened already (from any folder, a bucket's too)."""
    m = archive.manifest
    if m.mode != "series" or m.series_consolidated:
        return store_digests(archive.store)
    out = metadata_digests(archive.store)  # the series' own manifest
    if out is None:
        return None
    chunks = 0
    for mem in m.members:
        with archive.bundle(mem.subarchive) as sub:
            digests = store_digests(sub.store, MAX_MAP_CHUNKS - chunks)
        if digests is None:
            return None
        chunks += sum(1 for k in digests if is_chunk_key(k))
        for key, digest in digests.items():
            out[f"{mem.subarchive}/{key}"] = digest
    return out


def store_digests(store: Store, room: int | None = None) -> dict[str, int] | None:
    """The digest map of one store: its chunks' digests and their block entries; None when it
    holds more than `room` chunks (default MAX_MAP_CHUNKS; counted before any is read)."""
    room = MAX_MAP_CHUNKS if room is None else room
    keys = []
    for key in store.all_keys():
        if is_chunk_key(key):
            keys.append(key)
            if len(keys) > room:
                return None
    limit = compressed_bound(MAX_CHUNK_BYTES)
    recorder = DigestRecorder()
    for key in keys:
        data = store.get(key, limit)
        if data is not None:
            recorder.note(key, data, store.data_offset(key))
    found, meta = recorder.digest_map(), metadata_digests(store)
    return None if found is None or meta is None else {**found, **meta}
