"""Backends bound to a bucket: the mount's `Backend` interface over (Folder, key) instead of paths.

A mount of s3://BUCKET/PREFIX names each entry by an `ObjectPath` (see vfs.stores.base); these
adapters turn it back into a key of the mounted folder and call the format backend's `*_at`
methods, so the tree, the inode table and the read path stay the ones a local SRC uses. Plain
objects (no format claims them) are served as they are by `ObjectBackend`.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

from vfs.backends.base import Description, Entry
from vfs.decant import MANIFEST_KEY
from vfs.stores.base import ByteSource, Folder, ObjectInfo, ObjectPath, join_key, replaced

KeyOf = Callable[[PurePosixPath], str]


class BoundBackend:
    """One format backend reading archives of one bucket folder: `claims` by name only (a
    listing gives names, and a HEAD per `.zarr/` prefix would cost a request per folder)."""

    def __init__(self, inner: Any, folder: Folder, key_of: KeyOf, suffixes: tuple[str, ...],
                 dir_suffixes: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.inner = inner
        self.folder = folder
        self.key_of = key_of
        self.name: str = inner.name
        self.describe_version = getattr(inner, "describe_version", 1)
        self._suffixes = suffixes
        self._dir_suffixes = dir_suffixes

    def __getattr__(self, name: str) -> Any:  # mode_mask, authenticated, …: the format's own
        if name == "chunk_digests":  # only for formats that record them (decant)
            record = getattr(self.inner, "chunk_digests_at", None)
            if record is None:
                raise AttributeError(name)
            # `expect`: the sha256 that verified. A zip object's GETs are pinned to the version
            # listed (`_listed`); a `NAME.zarr/` prefix's objects change under an unchanged
            # manifest, so its map is only made of objects that reconstruct to it.
            return lambda path, expect=None: record(self._listed(path), self.key_of(path), expect)
        return getattr(self.inner, name)

    def _listed(self, path: PurePosixPath) -> Any:
        """The folder, for reading the object `path` names: pinned to the version its listing
        gave, where it gave one (a verdict's digests must be of the version that verified)."""
        info = getattr(path, "info", None)
        return self.folder if info is None else _Listed(self.folder, self.key_of(path), info)

    def claims(self, path: PurePosixPath, is_dir: bool) -> bool:
        ends = self._dir_suffixes if is_dir else self._suffixes
        return any(path.name.endswith(s) and len(path.name) > len(s) for s in ends)

    def describe(self, path: PurePosixPath) -> Description:
        return self.inner.describe_at(self.folder, self.key_of(path))  # type: ignore[no-any-return]

    def open(self, path: PurePosixPath, member: str, entry: Entry) -> Any:
        digests: Mapping[str, int] | None = None
        lookup = getattr(self.inner, "digests", None)
        if lookup is not None:
            digests = lookup(path)
        info = getattr(path, "info", None)
        opened = self.inner.open_at(self._listed(path), self.key_of(path), member, entry, digests)
        if info is not None and hasattr(opened, "listed_etag"):
            opened.listed_etag = info.etag  # what the handle's noted digests must belong to
        return opened


class ObjectBackend:
    """Objects no format claims, shown as they are: one presented file, read by ranged GETs."""

    name = "object"
    mode_mask = 0o444

    def __init__(self, folder: Folder, key_of: KeyOf) -> None:
        self.folder = folder
        self.key_of = key_of

    def claims(self, path: PurePosixPath, is_dir: bool) -> bool:
        return not is_dir

    def describe_info(self, path: ObjectPath) -> Description:
        """No request: the listing gave the size."""
        info = path.info
        assert info is not None
        return Description(path.name, Entry(size=info.size))

    def describe(self, path: PurePosixPath) -> Description:
        assert isinstance(path, ObjectPath)
        return self.describe_info(path)

    def open(self, path: PurePosixPath, member: str, entry: Entry) -> ObjectFile:
        key, info = self.key_of(path), getattr(path, "info", None)
        folder = self.folder if info is None else _Listed(self.folder, key, info)
        return ObjectFile(folder.open(key))


class _Listed:
    """The bucket folder for one open of the object at `key`: what opens there must be the
    version listed (`info`), else ESTALE, as for a local archive replaced since its listing.
    The mount then lists the folder again and the kernel's retry opens what is there now.
    Opened as it was instead (a HEAD gives the object's current ETag, to which every ranged
    GET is then pinned), another host's replacement was read under the old listing's size
    and digests: every read failed with EIO, logged as damage, until the next relisting.
    Compared by size and ETag (vfs.stores.base.replaced)."""

    def __init__(self, folder: Folder, key: str, info: ObjectInfo) -> None:
        self._folder = folder
        self._key = key
        self._info = info

    @property
    def listed(self) -> ObjectInfo:
        """The object's identity as the listing gave it."""
        return self._info

    def still(self) -> None:
        """ESTALE unless the object at the key is still the version listed (one HEAD): what an
        open checks, for a handle that joins an archive opened already (vfs.backends.decant).
        The object the listing's identity is of: a `NAME.zarr/` prefix's is its manifest's (no
        object has the prefix's own key: a HEAD of it made every second open ESTALE)."""
        now = self._folder.stat(self._info.key)
        if now is None or replaced(self._info, now):
            raise self._stale()

    def sub(self, prefix: str) -> Any:
        """The folder `prefix` names; the archive's own (a `NAME.zarr/`, whose identity is its
        manifest's) held to the version listed: a manifest read there that is not it gives
        ESTALE. Overwritten in place by another archive's objects, the prefix was opened as
        the new archive under the old one's description and digests: EIO at every open."""
        sub = self._folder.sub(prefix)
        if prefix != self._key or self._info.key != join_key(prefix, MANIFEST_KEY):
            return sub
        return _Listed(sub, MANIFEST_KEY, replace(self._info, key=MANIFEST_KEY))

    def _stale(self) -> OSError:
        url = getattr(self._folder, "url_of", str)(self._key)
        return OSError(errno.ESTALE, "replaced in the bucket since it was listed", url)

    def open(self, key: str) -> Any:
        source = self._folder.open(key)
        now = getattr(source, "info", None)
        if key == self._key and now is not None and replaced(self._info, now):
            source.close()
            raise self._stale()
        return source

    def __getattr__(self, name: str) -> Any:
        return getattr(self._folder, name)


class ObjectFile:
    """A plain object read by ranged GETs; a read past the end is short, as a file's is."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.size = source.size

    def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.size - offset))
        return self.source.read(offset, size) if size else b""

    def readahead(self, offset: int) -> None:
        pass

    def close(self) -> None:
        self.source.close()
