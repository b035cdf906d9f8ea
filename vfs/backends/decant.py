"""Decant archives as the originals they hold: one file (modes D/V) or a folder (series)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfs.backends.base import Description, Entry
from vfs.cache import PageCache
from vfs.decant import MANIFEST_KEY, archive_stem
from vfs.stores.base import Folder

if TYPE_CHECKING:  # numpy, numcodecs: imported when the first archive is read, not at start-up
    from vfs.decant.reader import DecantArchive, OriginalReader


# The adapter's lookup of an archive's recorded chunk digests (None: not recorded yet).
DigestSource = Callable[[Path], Mapping[str, int] | None]


class DecantBackend:
    name = "decant"
    # Raised whenever describe() refuses more than before: a persistent index that keys its
    # descriptions by it re-describes archives an older, laxer describe() listed.
    describe_version = 2

    def __init__(self, cache: PageCache, digests: DigestSource | None = None) -> None:
        self.cache = cache
        self.digests = digests
        self.shared = _SharedArchives()

    def chunk_digests(self, path: Path) -> dict[str, int] | None:
        """xxh3 of every stored chunk, for the adapter to record (reads the whole archive);
        None for an archive of more chunks than a map holds (vfs.decant.digestmap)."""
        from vfs.decant.digests import archive_digests

        return archive_digests(path)

    def claims(self, path: Path, is_dir: bool) -> bool:
        if is_dir:
            return path.name.endswith(".zarr") and (path / MANIFEST_KEY).is_file()
        return path.name.endswith(".zarr.zip")

    def describe(self, path: Path) -> Description:
        from vfs.decant.reader import DecantArchive

        with DecantArchive.open(path) as archive:
            return _describe(archive, path.name)

    def describe_at(self, folder: Folder, key: str) -> Description:
        """As `describe`, for the archive at `key` of any folder (a bucket prefix)."""
        from vfs.decant.reader import DecantArchive

        with DecantArchive.open_at(folder, key) as archive:
            return _describe(archive, key.rstrip("/").rpartition("/")[2])

    def open(self, path: Path, member: str, entry: Entry) -> DecantFile:
        digests = self.digests(path) if self.digests else None
        return self.shared.open(path, digests, member, self.cache)

    def open_at(
        self,
        folder: Folder,
        key: str,
        member: str,
        entry: Entry,
        digests: Mapping[str, int] | None = None,
    ) -> DecantFile:
        """As `open`, for the archive at `key` of any folder. Where the folder says which version
        of the object its listing gave (`listed`: a bucket's), handles of that version share one
        opened archive, as local ones do: each used to GET the zip's tail and metadata and
        keep its own parsed directory and manifest (~0.9 KiB a zip entry, per handle; eight
        more handles of a 48-chunk archive: 32 GETs, none now)."""
        from vfs.decant.reader import DecantArchive

        def opened() -> DecantArchive:
            return DecantArchive.open_at(folder, key, digests)

        listed = getattr(folder, "listed", None)
        if listed is None:
            return _open_original(opened(), member, self.cache)
        url = getattr(folder, "url_of", str)(key)
        version = (url, listed.size, listed.etag, listed.mtime, digests is not None)
        # A handle joining one open already checks the object is still that version (the HEAD
        # an open of its own would make), so a replaced object gives ESTALE at open, as before.
        still = folder.still  # type: ignore[attr-defined]  # a _Listed (vfs.backends.objects)
        return self.shared.join(version, opened, member, self.cache, joining=still)

    def chunk_digests_at(self, folder: Folder, key: str) -> dict[str, int] | None:
        """As `chunk_digests`, for the archive at `key` of any folder (GETs every chunk once)."""
        from vfs.decant.digests import opened_digests
        from vfs.decant.reader import DecantArchive

        with DecantArchive.open_at(folder, key) as archive:
            return opened_digests(archive)


def _describe(archive: DecantArchive, name: str) -> Description:
    m = archive.manifest
    originals = archive.originals()
    # Every size and chunk an original needs is checked here, without decoding: an archive
    # that claims more than it holds is shown raw, not listed at a false size.
    archive.check()
    if m.mode != "series":
        (info,) = originals
        return Description(info.relpath, _file_entry(info.size, info.sha256, m.mode))
    root = Entry(is_dir=True)
    for info in originals:
        *folders, leaf = info.relpath.split("/")
        node = root
        for folder in folders:
            node = node.children.setdefault(folder, Entry(is_dir=True))
        node.children[leaf] = _file_entry(info.size, info.sha256, info.mode)
    return Description(archive_stem(name), root)


def _open_original(archive: DecantArchive, member: str, cache: PageCache) -> DecantFile:
    try:
        return DecantFile(archive, archive.open_original(member, cache))
    except BaseException:
        archive.close()
        raise


# An opened archive's version, as the handles sharing it see it: a local one's path and stat
# identity, an object's URL and listed identity; and whether it is read with digests.
_Key = tuple[object, ...]


class _Shared:
    def __init__(self, archive: DecantArchive) -> None:
        self.archive = archive
        self.users = 0


class _SharedArchives:
    """Opened archives, one per archive version, shared by every handle open on it.

    Opening parses the zip's central directory and the manifest: ~0.9 KiB of objects per zip
    entry, 175 MiB for an archive of 200 000 chunks. Each handle used to open its own, so one
    user holding 8 handles of such an archive drove the daemon to 1.6 GiB, whatever the cache
    size. A handle now joins the archive another handle of the same version opened; the last
    to close closes it. The version is the path's lstat (device, inode, size, mtime, ctime):
    a file rewritten or replaced, or a link put in its place, is a new version, opened anew
    under the store's own rules."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[_Key, _Shared] = {}

    def open(
        self, path: Path, digests: Mapping[str, int] | None, member: str, cache: PageCache
    ) -> DecantFile:
        from vfs.decant.reader import DecantArchive

        key = _version(path, digests is not None)
        if key is None:
            return _open_original(DecantArchive.open(path, digests), member, cache)
        return self.join(key, lambda: DecantArchive.open(path, digests), member, cache,
                         same=lambda archive: _opened(archive) == key[1:6])  # fmt: skip

    def join(
        self,
        key: _Key,
        opener: Callable[[], DecantArchive],
        member: str,
        cache: PageCache,
        same: Callable[[DecantArchive], bool] | None = None,
        joining: Callable[[], None] | None = None,
    ) -> DecantFile:
        """A handle on `member` of the archive version `key`: the one open already (after
        `joining()`, which may refuse), else one `opener` opens, shared if `same` says it is
        that version (a file changed meanwhile is opened for this handle alone)."""
        with self._lock:
            shared = self._open.get(key)
            if shared is not None:
                shared.users += 1
        if shared is not None and joining is not None:
            try:
                joining()
            except BaseException:
                self._release(key, shared)
                raise
        if shared is None:
            archive = opener()
            if same is not None and not same(archive):
                return _open_original(archive, member, cache)  # changed meanwhile: not shared
            with self._lock:
                shared = self._open.get(key)
                if shared is None:
                    shared = self._open[key] = _Shared(archive)
                    archive = None
                shared.users += 1
            if archive is not None:  # another handle opened it first: use that one
                archive.close()
        try:
            # The archive builds each original's plan once, under its own lock (the page table,
            # region index and checks: O(pages)); the reader made here is this handle's own.
            reader = shared.archive.open_original(member, cache)
        except BaseException:
            self._release(key, shared)
            raise
        return DecantFile(shared.archive, reader, lambda: self._release(key, shared))

    def _release(self, key: _Key, shared: _Shared) -> None:
        with self._lock:
            shared.users -= 1
            if shared.users > 0:
                return
            if self._open.get(key) is shared:
                del self._open[key]
        shared.archive.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def _version(path: Path, digests: bool) -> _Key | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (str(path), *_identity(st), digests)


def _opened(archive: DecantArchive) -> tuple[int, int, int, int, int] | None:
    st = archive.store.stat
    return None if st is None else _identity(st)


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """The file version a shared archive is for: the lstat at open against the opened fstat."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _file_entry(size: int, sha256: str, mode: str) -> Entry:
    xattrs = {"user.decant.sha256": sha256, "user.decant.mode": mode}
    return Entry(size=size, sha256=sha256, xattrs=xattrs)


class DecantFile:
    """An opened original; owns its archive handle so closing the file releases the descriptor."""

    def __init__(
        self,
        archive: DecantArchive,
        reader: OriginalReader,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.archive = archive
        self.reader = reader
        self._release = release  # a shared archive: hand it back instead of closing it
        self._shared = release is not None
        self.size = reader.size
        self.listed_etag: str | None = None  # a bucket archive's, as its listing gave it

    @property
    def opened(self) -> tuple[int, int, int, int] | None:
        """(inode, size, mtime_ns, ctime_ns) of the local zip this handle really opened (from
        its descriptor), for the mount to check against the archive it listed; else None."""
        st = self.archive.store.stat
        return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        return self.reader.read(offset, size)

    def seen_digests(self) -> dict[str, int] | None:
        """The archive's chunk digest map as this handle's reads made it, when they read every
        chunk of the archive and the file at its path (the object at its key) is still the one
        opened; else None."""
        tap, st = self.reader.tap, self.archive.store.stat
        if tap is None or self.reader.archive is not self.archive:
            return None
        if st is None:
            return tap.complete() if self._listed_object() else None
        assert isinstance(self.archive.path, Path)
        try:
            now = os.stat(self.archive.path, follow_symlinks=False)
        except OSError:
            return None
        if _identity(now) != _identity(st):
            return None
        return tap.complete()

    def _listed_object(self) -> bool:
        """A zip object of a bucket: every ranged GET of this handle was pinned (If-Match) to
        the ETag it was opened with, so the digests it noted are the listed version's when that
        ETag is the one its listing gave (`listed_etag`, set by the bucket's BoundBackend).
        Without this, every first read of a bucket archive was followed by a GET of each of
        its chunks again to record the map (270 MiB more for a 512 MiB stack)."""
        try:
            opened = getattr(self.archive.store.source, "info", None)  # a ZipArchiveStore's
        except (AttributeError, ValueError):
            return False
        etag = getattr(opened, "etag", None)
        return bool(etag) and etag == self.listed_etag

    def read_cached(self, offset: int, size: int) -> bytes | memoryview | None:
        return self.reader.read_cached(offset, size)

    def loading(self, offset: int, size: int) -> Future[Any] | None:
        return self.reader.loading(offset, size)

    def readahead(self, offset: int) -> None:
        self.reader.readahead(offset)

    def readahead_needed(self, offset: int) -> bool:
        return self.reader.readahead_needed(offset)

    def close(self) -> None:
        self.reader.close()  # its queued read-ahead decodes use the archive's descriptor
        if self._shared:
            release, self._release = self._release, None
            if release is not None:  # once, however often close is called
                release()
        else:
            self.archive.close()
