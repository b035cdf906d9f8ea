"""AcqStore collections as an overlay: the folder stays mirrored, plus a virtual `members/` view."""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from vfs.acqstore import paths
from vfs.acqstore.paths import ENTRY_POINT
from vfs.backends.base import Backend, Description, Entry, RandomAccess
from vfs.beneath import not_shown, open_beneath
from vfs.cache import PageCache
from vfs.errors import DecantError, ManifestError, UnsupportedFormatError
from vfs.walk import walk

if TYPE_CHECKING:  # jsonschema, numpy, tifffile: imported when a collection is first seen
    from vfs.acqstore.synth_tiff import SynthesizedTiff

log = logging.getLogger(__name__)
_PRELOADING: Future[None] | None = None  # the import of the image readers, once per process


def _import_readers() -> None:
    try:
        import zarr.storage  # noqa: F401

        import vfs.acqstore.chunks
        import vfs.acqstore.synth_tiff  # noqa: F401
    except Exception as exc:  # an open imports them again and reports what fails
        log.debug("preloading the image readers failed: %s", exc)


class FileAccess:
    """A plain file of the collection (JSON, CSV), read with pread so threads can share it."""

    def __init__(self, path: Path, size: int, root: Path | None = None) -> None:
        self.size = size
        # From the collection folder without following a link, and without waiting on a FIFO:
        # the collection's owner may have swapped the file since the view was built.
        self._fd = open_beneath(root or path.parent, path, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self._fd)
            raise not_shown(path, st)
        if st.st_size != size:
            # Written anew since the view was built (seen at once with the watcher, which
            # rebuilds it; with --no-watch only here): served at the view's size, a grown table
            # was cut short with no error. ESTALE: the kernel looks the name up again.
            os.close(self._fd)
            raise OSError(errno.ESTALE, "changed since the collection's view was built", str(path))
        self.source_ident = (st.st_dev, st.st_ino)  # what was opened: see ops._same_sources

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + max(size, 0), self.size)
        return os.pread(self._fd, end - offset, offset) if end > offset else b""

    def readahead(self, offset: int) -> None:
        """The kernel's page cache already reads ahead on a real file."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def image_version(root: Path, path: Path) -> tuple[int, ...]:
    """What changes when any file of an image does: a zip's own (inode, size, mtime, ctime);
    a folder's, the count of its files and folders and the largest mtime and ctime among
    them (a stat each, as a caller's open checks them: ~3 ms per 1,000 files). Reached from
    the collection folder `root` with no link followed, and walked below that descriptor
    entering no link (vfs.walk): a folder swapped for a link to `/` since the open's checks is
    not walked, nor one deeper than a walk goes.
    Blocking."""
    from vfs.acqstore.ngff import too_deep_image

    fd = open_beneath(root, path, os.O_PATH)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        count, mtime, ctime = 0, st.st_mtime_ns, st.st_ctime_ns
        for folder, dirs, files in walk(Path(f"/proc/self/fd/{fd}"), too_deep=too_deep_image):
            for name in (*dirs, *files):  # a chunk folder renamed below changes only its own
                try:
                    fst = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                count += 1
                mtime, ctime = max(mtime, fst.st_mtime_ns), max(ctime, fst.st_ctime_ns)
        return (count, mtime, ctime)
    finally:
        os.close(fd)


GENERATIONS_KEPT = 65536  # collections whose planes' generation is kept (`forget`)


class AcqStoreBackend:
    """Backend for folders holding `acqstore/collection.json`.

    `overlay = True` tells the daemon to keep mirroring the folder and to inject the description
    (named `members` or `.members`) inside it, instead of replacing the folder.
    """

    name = "acqstore"
    overlay = True
    # The view's names (members, tables) are read from this document: the view is shown with
    # the read and search bits of each class that may read it (vfs.mount.tree._manifest_mask).
    document = ENTRY_POINT
    # The view's nodes are keyed by its description (paths, sizes), not by its files' bytes: a
    # chunk file or CSV written anew keeps the node, so the kernel keeps no page of it across
    # opens, and `forget` drops the collection's decoded planes when anything in it changes.
    kernel_cache = False
    # Synthesized TIFFs decode read-ahead planes here, two at a time: with the event loop serving
    # ready planes, a forward reader keeps both cores busy.
    READAHEAD_WORKERS = 2

    def __init__(self, cache: PageCache, decant_backend: Backend | None = None) -> None:
        self.cache = cache
        self.decant_backend = decant_backend
        # The watcher `forget`s a collection's decoded planes when a file in it changes. With
        # --no-watch nothing does: each open of a TIFF keys its planes by the image's version
        # then (`image_version`), or a chunk file written anew in place kept its old pixels.
        # Asked of an image folder and how many levels its files lie below it: the watcher may
        # stop (inotify failing) and watches only so deep (vfs.mount.watch.WATCH_DEPTH).
        self.watching: Callable[[Path, int], bool] = lambda _folder, _below: True
        # Threads start on the first submit: a mount without synthesized TIFFs never has them.
        self._decoders = ThreadPoolExecutor(self.READAHEAD_WORKERS, "acqstore-readahead")
        # Each `forget` of a collection starts a generation of its planes' keys: a decode under
        # way when it changed is kept under the old one, for the opens that began before (each
        # plane they read stays one plane), and no open after it ever meets it. Dropping the
        # cached planes alone left such a decode to be stored after the drop, and its old
        # pixels were served to every later open (red team 82 F1).
        self._forgets = 0
        self._generation: dict[Path, int] = {}
        self._floor = 0  # the generation of collections not in `_generation`

    def claims(self, path: Path, is_dir: bool) -> bool:
        return is_dir and (path / ENTRY_POINT).is_file()

    def forget(self, root: Path) -> None:
        """Something in the collection at `root` changed: its synthesized planes are decoded
        again (they were kept by collection, image and page, and served old pixels for good)."""
        self._forgets += 1
        if len(self._generation) >= GENERATIONS_KEPT:
            # Bounded: every collection then starts a generation no key had (a miss each).
            self._generation.clear()
            self._floor = self._forgets
        self._generation[root] = self._forgets
        self.cache.discard_prefix(root)

    def plane_key(self, root: Path, rel: str, dataset: str) -> tuple[object, ...]:
        """The cache key of an image's planes for an open now (`forget`'s generation in it)."""
        generation = self._generation.get(root, self._floor)
        return (root, "acqstore-tiff", generation, rel, dataset)

    def describe(self, path: Path) -> Description:
        """Validate, then build the view; an invalid collection raises with the validator lines."""
        from vfs.acqstore.validate import validate_collection
        from vfs.acqstore.view import build_view, view_name

        name = view_name(path)
        result = validate_collection(path)
        for issue in result.warnings:
            log.info("%s: %s", path, issue.line())
        if not result.ok:
            lines = "\n".join(issue.line() for issue in result.issues)
            raise ManifestError(
                f"{path}: not a valid AcqStore collection, no {name}/ view:\n{lines}"
            )
        root = build_view(result, self._decant_entry)
        if any(not image.decant for image in result.images.values()):
            self._preload_readers()
        return Description(name=name, root=root)

    def _preload_readers(self) -> None:
        """Import what opening a synthesized TIFF needs (zarr-python above all) on a worker
        thread, once, as soon as a view that holds one is built: the first open of an image
        imported it on the spot, ~0.1-0.15 s more than every later open (the bench acqstore
        collection on a fresh daemon: its first open 0.16-0.27 s, 0.05-0.15 s with this; zarr
        adds ~14 MiB of RSS)."""
        global _PRELOADING
        if _PRELOADING is None:
            _PRELOADING = self._decoders.submit(_import_readers)

    def open(self, path: Path, member: str, entry: Entry) -> RandomAccess:
        kind, rel = entry.locator.get("kind"), entry.locator.get("path")
        if not isinstance(rel, str) or paths.path_problems(rel):
            raise ManifestError(f"{path}: {member}: bad locator {entry.locator!r}")
        target = paths.resolve(path, rel)
        if kind == "file":
            return FileAccess(target, entry.size, path)
        if kind == "decant":
            if self.decant_backend is None:
                raise ManifestError(f"{target}: a decant archive, but no decant backend is loaded")
            raw = entry.locator.get("entry")
            original = Entry.from_json(raw) if isinstance(raw, dict) else None
            if original is None:
                original = self.decant_backend.describe(target).root
            return self.decant_backend.open(target, "", original)
        if kind == "tiff":
            return self._open_tiff(path, target, rel, str(entry.locator.get("name", "")), entry)
        raise ManifestError(f"{path}: {member}: unknown locator kind {kind!r}")

    def verifies_as(self, path: Path, entry: Entry) -> tuple[Path, tuple[int, ...]] | None:
        """A member that is a decant archive's original: (the archive, its version as the view
        was built from it: inode, size, mtime, ctime). Its verified state is that archive's,
        of that version: the collection folder's stamp and the view's description stay the
        same when an archive claiming the same original is put in its place."""
        stamp = entry.locator.get("stamp")
        rel = entry.locator.get("path")
        if entry.locator.get("kind") != "decant" or not isinstance(rel, str):
            return None
        if not isinstance(stamp, list) or len(stamp) != 4 or paths.path_problems(rel):
            return None
        return paths.resolve(path, rel), tuple(int(v) for v in stamp)

    def reads_for(self, path: Path, member: str, entry: Entry) -> list[Path]:
        """What opening `member` reads on the caller's behalf: a file or folder elsewhere in the
        collection, which the mount lets only a caller read who could read it there."""
        rel = entry.locator.get("path")
        if not isinstance(rel, str) or paths.path_problems(rel):
            return []  # open refuses it
        return [paths.resolve(path, rel)]

    def _open_tiff(
        self, root: Path, target: Path, rel: str, title: str, entry: Entry
    ) -> SynthesizedTiff:
        from vfs.acqstore.ngff import inspect_image, open_full_resolution
        from vfs.acqstore.synth_tiff import (
            MAX_DECODES_PER_READ,
            SynthesizedTiff,
            layout_for_image,
            require_plane_fits,
        )

        image = inspect_image(target, root)
        layout = layout_for_image(image, name=title)
        require_plane_fits(layout, self.cache, str(target))
        if layout.size != entry.size:
            raise ManifestError(
                f"{target}: image changed since the view was built ({layout.size} != {entry.size})"
            )
        array, release = open_full_resolution(image, root)
        # Keys start with the collection folder, so discard_prefix(collection) forgets its planes.
        key = self.plane_key(root, rel, image.dataset)
        # Its files: the dataset's folders, then zarr 3's "c" and one folder per dimension.
        if not self.watching(target, image.dataset.count("/") + 2 + len(image.shape)):
            key = (*key, image_version(root, target))
        tiff = SynthesizedTiff(
            layout, array, self.cache, key, release, self._decoders.submit, label=str(target)
        )
        if tiff.decodes_per_read() > MAX_DECODES_PER_READ:
            tiff.close()
            raise UnsupportedFormatError(
                f"{target}: planes of {layout.plane_bytes} bytes in chunks too small: one read "
                f"would decode up to {tiff.decodes_per_read()} chunks (at most "
                f"{MAX_DECODES_PER_READ}); larger chunks serve it"
            )
        return tiff

    def _decant_entry(self, archive: Path) -> Entry | None:
        if self.decant_backend is None:
            return None
        try:
            return self.decant_backend.describe(archive).root
        except DecantError as exc:
            log.warning("%s: decant backend cannot describe it: %s", archive, exc)
            return None
