"""A bucket prefix as the mount presents it: the SourceTree rules over listings instead of scandir.

Folders are key prefixes. Each folder's listing (one LIST with a delimiter) is kept for
`relist` seconds; `stamp_folder` stands in for a real folder's mtime: a counter that moves when
a fresh listing differs from the last, so the mount's ordinary rescan logic (merge, invalidate
changed names) shows objects added or removed by other hosts. A listing that fails while an
older one is known keeps the older one (the mount stays browsable while the store is down;
reads fail with EIO). Pure and synchronous: the daemon calls it from worker threads.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import sqlite3
import stat
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfs.backends.base import Backend, Description, Entry
from vfs.backends.objects import ObjectBackend
from vfs.decant import MANIFEST_KEY, TEMP_PREFIX, folded_stat
from vfs.errors import DecantError, ObjectChangedError, ObjectMissingError, StoreError
from vfs.mount.index import DescriptionIndex, object_description
from vfs.mount.tree import SourceTree, index_key
from vfs.names import name_problem
from vfs.nodes import Node, archive_node, mirror_node
from vfs.stores.base import (
    MAX_LISTED,
    Folder,
    ObjectInfo,
    ObjectPath,
    etag_number,
    join_key,
    replaced,
)

if TYPE_CHECKING:
    from vfs.stores.s3uploads import UploadTokens

log = logging.getLogger(__name__)

DEFAULT_RELIST = 30.0  # seconds; see README "Many hosts, one bucket"
MAX_REMEMBERED = 1_000_000  # published objects whose metadata is kept (the latest)
BATCH_FROM = 32  # a folder listing more objects reads their index rows in one query
AGE_SCAN_MAX = 100_000  # objects of a folder looked through for one older than an archive
TIE_SECONDS = 1.0  # a plain object must be older than a folder of its name by this to keep it
MAX_AGES = 10_000  # folders whose oldest object is kept (for `relist` seconds)
# The ETag of a journal entry noted before an upload or a copy to its key, whose ETag is not
# known yet: it stands for whatever object is at the key, until the real entry comes. A kill
# between the copy or upload and the real entry showed a private file 0444 to every user, as
# any object of unknown origin is (red team 60, F1, F2). A mode of -1 clears it.
PENDING = ""
# A journal line of this mode notes a file removed (or renamed away) through the mount during
# its upload, with the upload's token: the next start deletes the object at the key if it
# carries that token (vfs.stores.s3uploads). Such a line with no token clears it.
WITHDRAWN = -2
MAX_RAW = 100_000  # archives remembered as shown raw (then forgotten all at once)
RAW_HOLD_MAX = 3600.0  # one failing again and again is described once an hour


@dataclass
class _Listing:
    at: float  # time.monotonic() of the last attempt
    dirs: list[str] = field(default_factory=list)
    files: list[ObjectInfo] = field(default_factory=list)
    generation: int = 1
    failed: bool = False
    pruned: bool = False  # the index's rows of objects it does not hold forgotten (scan)
    # When an archive of it left out or shown raw is to be tried again: the first listing
    # made from then on is presented afresh (a new generation) even if the LIST is the same.
    retry_at: float = math.inf
    listed: float = float("-inf")  # time.monotonic() of the LIST it holds (`at` is reset)


class BucketTree(SourceTree):
    def __init__(
        self,
        folder: Folder,
        root: ObjectPath,
        backends: Sequence[Backend],
        index: DescriptionIndex | None = None,
        relist: float = DEFAULT_RELIST,
    ) -> None:
        super().__init__(root, backends, (), index)  # type: ignore[arg-type]
        self.folder = folder
        self.relist = relist
        self.objects = ObjectBackend(folder, self.key_of)
        self._listings: dict[str, _Listing] = {}
        self._lock = threading.Lock()
        self._uid, self._gid = os.getuid(), os.getgid()
        self._started_ns = time.time_ns()
        self._root_url = str(root)
        self._scanning = threading.local()  # the listing a worker thread's scan presents
        # URL → (identity, until when, for how long) of archives shown raw: see `_shown_raw`.
        self._raw: dict[str, tuple[tuple[object, ...], float, float]] = {}
        # folder key → (when listed, oldest upload time seen, how the LIST ended): _oldest
        self._ages: dict[str, tuple[float, float, str]] = {}
        # (key, ETag) → (mode, uid, gid, mtime_ns) of the spooled file this host published
        # there: shown instead of the object's, so a second `rsync -a` finds what it wrote.
        # Kept in `_journal` (the spool's) across restarts; other hosts show the upload time
        # and mode 0444 (see README, "Writing into a bucket").
        # A fifth value, where known: the object's upload time (whole seconds), told apart from
        # the same bytes put at the key again later (see `_object_stat`).
        self._published: dict[tuple[str, str], tuple[int, ...]] = {}
        self._withdrawn: dict[str, str] = {}  # key → upload token: see WITHDRAWN
        # folder prefix → (key, ETag) of entries noted without an upload time → when noted
        # (time.monotonic()): `_forget_timeless`
        self._timeless: dict[str, dict[tuple[str, str], float]] = {}
        self._journal: Path | None = None

    def key_of(self, path: Path) -> str:
        return "" if path == self.root else path.relative_to(self.root).as_posix()

    def doubt(self, node: Node) -> None:
        """Nothing to describe again: an object's description is kept by its ETag, and the
        bytes under one ETag do not change (a GET of other bytes fails its If-Match)."""

    def refusal_hold(self, node: Node) -> float:
        """One relist interval: the bytes may have been damaged on the way, not in the store,
        and the object keeps its ETag then (red team 58, F4)."""
        return self.relist

    def refetch(self, node: Node) -> bool:
        """The ranges of `node`'s archive kept in --disk-cache go: one damaged on the way was
        kept with a checksum of its damaged bytes, and served again after every restart."""
        self.forget_fetched(node.real)
        return True

    def forget_fetched(self, path: Path) -> None:
        forget = getattr(self.folder, "forget_fetched", None)
        if forget is not None:
            forget(str(path))

    def root_node(self) -> Node:
        return mirror_node(self.root, self._dir_stat(""), False)

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.index.path.parent if self.index is not None else "/")

    # -- listings --------------------------------------------------------------------------

    def expire(self) -> None:
        """Every listing is re-read at its next use (the periodic relist)."""
        with self._lock:
            for listing in self._listings.values():
                listing.at = float("-inf")

    def forget_listing(self, folder: Path) -> None:
        """`folder` is listed afresh at its next use: an object of it opened as another
        version than listed (replaced by another host since; ESTALE)."""
        with self._lock:
            listing = self._listings.get(self.key_of(folder))
            if listing is not None:
                listing.at = float("-inf")

    def note_published(self, key: str, etag: str, st: os.stat_result | None) -> None:
        """The write side placed an object at `key` (`st`: the spooled file's stat, which it
        shows) or withdrew it (None): its folder (and the folders above, one of which may be
        new) are listed afresh at their next use. Called from the pack queue's threads."""
        at = self._upload_time(key, etag) if st is not None and etag != PENDING else None
        with self._lock:
            if st is None:
                if self._published.pop((key, etag), None) is not None and etag == PENDING:
                    self._remember(key, PENDING, (-1, -1, -1, -1))
            else:
                meta: tuple[int, ...] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                                         st.st_mtime_ns)  # fmt: skip
                if at is not None:
                    meta += (at,)
                elif etag != PENDING:
                    noted = self._timeless.setdefault(key.rpartition("/")[0], {})
                    noted[(key, etag)] = time.monotonic()
                self._published[(key, etag)] = meta
                self._remember(key, etag, meta)
                if etag != PENDING and self._published.pop((key, PENDING), None) is not None:
                    self._remember(key, PENDING, (-1, -1, -1, -1))
            prefix = key
            while prefix:
                prefix = prefix.rpartition("/")[0]
                listing = self._listings.get(prefix)
                if listing is not None:
                    listing.at = float("-inf")

    def drop_pending_not_ours(self, tokens: UploadTokens, within: float) -> None:
        """Forget the pending entries (uploads begun, never ended: a kill) whose key holds an
        object this host did not upload: another host's object there was shown as this host's
        user's file, which they could then `rm` (red team 86, F1). Looked at for at most
        `within` seconds (a HEAD each); those left are looked at again when their file's
        upload is tried."""
        deadline = time.monotonic() + within
        for key in self.pending()[:MAX_REMEMBERED]:
            if time.monotonic() > deadline:
                break
            try:
                token = self.folder.upload_token(key)  # type: ignore[attr-defined]
                if token is not None and tokens.signed(key, token):
                    found = self.folder.stat(key)
                    if found is not None and found.etag:
                        self._confirm_pending(key, found.etag, found.mtime)
                    continue
                if token is None and self.folder.stat(key) is None:
                    continue  # nothing there yet: the upload's retry puts it
            except StoreError:
                continue  # not answered now: the upload's retry decides (and ends the note)
            self.note_published(key, PENDING, None)

    def _upload_time(self, key: str, etag: str) -> int | None:
        """The upload time of the object at `key` if it holds `etag` (a HEAD), else None."""
        try:
            info = self.folder.stat(key)
        except StoreError:
            return None
        return int(info.mtime) if info is not None and info.etag == etag else None

    def _timed(self, key: str, etag: str, meta: tuple[int, ...], at: int) -> tuple[int, ...]:
        """`meta` of the entry (key, etag), given the upload time `at` if it has none yet."""
        with self._lock:
            if self._published.get((key, etag)) is not meta:
                return self._published.get((key, etag)) or meta
            meta = (*meta, at)
            self._published[(key, etag)] = meta
            self._remember(key, etag, meta)
            self._timeless.get(key.rpartition("/")[0], {}).pop((key, etag), None)
        return meta

    def _confirm_pending(self, key: str, etag: str, at: float) -> None:
        """The object at `key` is this host's upload of the file noted pending there: shown as
        that file from now on (by its ETag), no longer as root's (`_object_stat`)."""
        with self._lock:
            meta = self._published.pop((key, PENDING), None)
            if meta is None:
                return
            meta = (*meta[:4], int(at))
            self._published[(key, etag)] = meta
            self._remember(key, etag, meta)
            self._remember(key, PENDING, (-1, -1, -1, -1))

    def pending(self) -> list[str]:
        """Keys whose upload began and never ended in the journal (the daemon killed, or the
        key taken by another): their multipart uploads may be left in the bucket."""
        with self._lock:  # the latest first: a start looks at a bounded number of them
            return [key for key, etag in reversed(self._published) if etag == PENDING]

    def note_withdrawn(self, key: str, token: str) -> None:
        """A file was removed or renamed away through the mount while its upload (carrying
        `token`) ran: noted before the removal is answered, for the next start to delete what
        that upload left at `key` if the daemon stops before it withdraws it (red team 60, F1).
        Called from the mount's worker threads."""
        with self._lock:
            self._withdrawn[key] = token
            self._remember(key, PENDING, (WITHDRAWN, 0, 0, 0), token)

    def withdrawn(self) -> list[tuple[str, str]]:
        """(key, upload token) of files removed during their uploads, the latest first."""
        with self._lock:
            return list(reversed(self._withdrawn.items()))

    def settle_withdrawn(self, keys: list[str]) -> None:
        """These keys' removals are done with: what their uploads left is gone (or was never
        there, or is not theirs). Their pending entries go too: the keys show what is there."""
        with self._lock:
            for key in keys:
                if self._withdrawn.pop(key, None) is not None:
                    self._remember(key, PENDING, (WITHDRAWN, 0, 0, 0), "")
                if self._published.pop((key, PENDING), None) is not None:
                    self._remember(key, PENDING, (-1, -1, -1, -1))

    def keep_published(self, journal: Path) -> None:
        """Load what this host published before (the last MAX_REMEMBERED entries; a line that
        does not parse is skipped), rewrite the journal compacted, and append to it from now
        on. The journal sits in the daemon's private spool folder."""
        found: dict[tuple[str, str], tuple[int, ...]] = {}
        withdrawn: dict[str, str] = {}
        try:
            with open(journal, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        key, etag, mode, uid, gid, mtime, *token = json.loads(line)
                        if int(mode) == WITHDRAWN and len(token) == 1:
                            withdrawn.pop(str(key), None)  # kept in the order last noted
                            if token[0]:
                                withdrawn[str(key)] = str(token[0])
                            continue
                        found.pop((str(key), str(etag)), None)
                        if int(mode) < 0:  # a pending entry cleared
                            continue
                        meta = (int(mode) & 0o7777, int(uid), int(gid), int(mtime))
                        if token:  # the upload time, where noted (a line of before lacks it)
                            meta += (int(token[0]),)
                        found[(str(key), str(etag))] = meta
                    except (ValueError, TypeError):
                        continue
        except FileNotFoundError:
            pass
        kept = list(found.items())[-MAX_REMEMBERED:]
        gone = list(withdrawn.items())[-MAX_REMEMBERED:]
        tmp = journal.with_name(journal.name + ".new")
        with open(tmp, "w", encoding="utf-8") as fh:
            for (key, etag), meta in kept:
                fh.write(json.dumps([key, etag, *meta]) + "\n")
            for key, token in gone:
                fh.write(json.dumps([key, PENDING, WITHDRAWN, 0, 0, 0, token]) + "\n")
        os.replace(tmp, journal)
        with self._lock:
            self._published.update(kept)
            self._withdrawn.update(gone)
            now = time.monotonic()
            for (key, etag), meta in kept:
                if etag != PENDING and len(meta) == 4:
                    self._timeless.setdefault(key.rpartition("/")[0], {})[(key, etag)] = now
            self._journal = journal

    def _remember(self, key: str, etag: str, meta: tuple[int, ...], *token: str) -> None:
        if self._journal is None:
            return
        try:
            with open(self._journal, "a", encoding="utf-8") as fh:
                fh.write(json.dumps([key, etag, *meta, *token]) + "\n")
        except OSError as exc:
            self._log_once(self._journal, f"{self._journal}: cannot record what was published "
                           f"({exc}); a remount shows those objects' upload times")  # fmt: skip

    def _object_stat(self, info: ObjectInfo) -> os.stat_result:
        st = _file_stat(info, self._uid, self._gid)
        mine = None
        if self._published:
            mine = self._published.get((info.key, info.etag or ""))
            if mine is not None and len(mine) > 4 and abs(mine[4] - int(info.mtime)) > 1:
                # The same bytes (an ETag is their MD5) put at the key again since this host
                # published there: deleted through another host, then another user's empty
                # or common file uploaded, was shown as this host's user's, who could `rm` it
                # (red team 92, F3). A second apart: a HEAD's time and a LIST's may round so.
                mine = None
            elif mine is not None and len(mine) == 4:
                # Noted without its upload time (the HEAD after the upload failed, or a
                # journal written before times were kept): the first listing that shows it
                # gives it one (red team 94, F7b, F8).
                mine = self._timed(info.key, info.etag or "", mine, int(info.mtime))
            pending = None if mine is not None else self._published.get((info.key, PENDING))
            if pending is not None:
                # An upload of this host's file to the key began and has not ended (under way,
                # or a kill): the object there may be it, or another host's put meanwhile.
                # Shown as neither user's: the owner's bits only, and root's (as the user's,
                # an `rm` by them deleted another host's user's only copy: red team 92; as
                # any object's, 0444, a private file was shown to all: red team 60). The
                # start-up check gives it back to the user once it finds this host's token.
                mode, _uid, _gid, mtime_ns = pending[:4]
                mine = (mode & 0o700, 0, 0, mtime_ns)
        if mine is None:
            return st
        mode, uid, gid, mtime_ns = mine[:4]
        seconds = mtime_ns / 1e9
        fields = (stat.S_IFREG | mode, st.st_ino, 0, 1, uid, gid, st.st_size, seconds, seconds,
                  seconds)  # fmt: skip
        ns = {"st_atime_ns": mtime_ns, "st_mtime_ns": mtime_ns, "st_ctime_ns": mtime_ns}
        return os.stat_result(fields, ns)

    def stamp_folder(self, folder: Path) -> int:
        return self._listed(self.key_of(folder)).generation

    def _listed(self, prefix: str) -> _Listing:
        """The listing of `prefix`; an empty one for a folder made through the mount that the
        bucket cannot be asked about now (its spooled files still show)."""
        try:
            return self._listing(prefix)
        except StoreError:
            if self.spool is None or not prefix or not self.spool.path(prefix).is_dir():
                raise
            return _Listing(float("-inf"), failed=True)

    def _listing(self, prefix: str) -> _Listing:
        with self._lock:
            listing = self._listings.get(prefix)
        now = time.monotonic()
        if listing is not None and now - listing.at < self.relist:
            return listing
        try:
            dirs, files = self._first_listing(prefix, now) or self.folder.list_dir(prefix)
        except StoreError as exc:
            if listing is None:
                raise
            if not listing.failed:
                log.warning("%s: cannot list (%s); showing the listing of %.0f s ago",
                            self.folder.name, exc, now - listing.listed)  # fmt: skip
            listing.failed, listing.at = True, now  # tried again after `relist` seconds
            return listing
        if len(dirs) + len(files) > MAX_LISTED:
            self._log_once(Path(prefix), f"{self.folder.name}/{prefix}: more than {MAX_LISTED} "
                           "entries; the rest are not shown")  # fmt: skip
            dirs, files = dirs[:MAX_LISTED], files[: max(0, MAX_LISTED - len(dirs))]
        with self._lock:
            old = self._listings.get(prefix)
            fresh = _Listing(now, dirs, files, old.generation if old else 1, listed=now)
            if old is not None and (old.retry_at <= now or old.dirs != dirs
                                    or _ids(old.files) != _ids(files)):  # fmt: skip
                fresh.generation = old.generation + 1
            elif old is not None:
                fresh.retry_at = old.retry_at  # not presented afresh: still to come
            if old is not None and old.failed:
                log.info("%s: listing again", self.folder.name)
            self._listings[prefix] = fresh
        return fresh

    def _first_listing(self, prefix: str, now: float) -> tuple[list[str], list[ObjectInfo]] | None:
        """The top level as the daemon's start-up check listed it (S3Folder.take_listing),
        while it is fresh: the first `ls` of a mount costs no second LIST."""
        take = getattr(self.folder, "take_listing", None)
        first = take() if take is not None and not prefix else None
        if first is None or now - first[0] >= self.relist:
            return None
        return first[1], first[2]

    def scan(self, folder: Path, listed: tuple[int, int] = (0, -1)) -> dict[str, Node]:
        prefix = self.key_of(folder)
        listing = self._listed(prefix)
        dirs: dict[str, os.stat_result] = {}
        infos: dict[str, ObjectInfo] = {}
        for name in listing.dirs:
            if self._shown(folder, name):
                dirs[name] = self._dir_stat(join_key(prefix, name))
        found: list[tuple[str, os.stat_result]] = []
        folders = set(listing.dirs)
        for info in listing.files:
            name = info.key.rpartition("/")[2]
            if name in folders:  # `a` beside `a/…`: the one uploaded first keeps the name
                if self._object_first(folder / name, info, dirs.get(name)):
                    dirs.pop(name, None)
                else:
                    self._log_once(folder / name, f"{self.folder.url_of(info.key)}: an object "
                                   "named like a folder of the same prefix; not shown")  # fmt: skip
                    continue
            if self._shown(folder, name):
                infos[name] = info
                found.append((name, self._object_stat(info)))
        found[:0] = list(dirs.items())
        if self.spool is not None:  # folders made through the mount, not yet in the bucket
            listed = set(listing.dirs)
            for name in self._spool_dirs(prefix):
                if name not in listed and self._shown(folder, name):
                    found.append((name, self._dir_stat(join_key(prefix, name))))
        self._scanning.infos = infos
        # Many archives: their index rows are read together (one query per backend).
        self._scanning.batch = {"": str(folder)} if len(infos) > BATCH_FROM else None
        self._scanning.retry_at = math.inf
        try:
            out, _regular = self._present(folder, found)
        finally:
            self._scanning.infos = {}
            self._scanning.batch = None
            listing.retry_at = self._scanning.retry_at
        if self.spool is not None:
            out.update(self._spooled(folder))
        self._prune(folder, listing)
        self._forget_timeless(prefix, listing)
        return out

    def _forget_timeless(self, prefix: str, listing: _Listing) -> None:
        """Entries noted without an upload time whose object a listing of their folder does
        not hold are forgotten: gone before any listing gave them a time (deleted through
        another host), they took the time of the next object of the same bytes put at the
        key, and showed it as this host's user's file (red team 96, N3). Only entries noted
        before the LIST began: one begun earlier may not hold an upload noted since."""
        if listing.failed or not self._timeless.get(prefix):
            return
        held = {(info.key, info.etag or "") for info in listing.files}
        with self._lock:
            waiting = self._timeless.pop(prefix, {})
            left: dict[tuple[str, str], float] = {}
            for entry, noted in waiting.items():
                meta = self._published.get(entry)
                if meta is None or len(meta) > 4:
                    continue  # gone through the mount, or given its time meanwhile
                if entry in held or noted >= listing.listed:
                    left[entry] = noted
                else:
                    del self._published[entry]
                    self._remember(*entry, (-1, -1, -1, -1))
            if left:
                self._timeless[prefix] = left

    def _prune(self, folder: Path, listing: _Listing) -> None:
        """Once per fresh listing, the index forgets the descriptions of objects of `folder`
        that it no longer holds (DescriptionIndex.prune_objects); failing costs only rows."""
        if self.index is None or listing.failed or listing.pruned:
            return
        listing.pruned = True
        at = ObjectPath(folder)  # URLs as `describe` keeps them: str() of each child's path
        names = [*listing.dirs, *(info.key.rpartition("/")[2] for info in listing.files)]
        try:
            gone = self.index.prune_objects(str(at), {str(at / name) for name in names})
        except sqlite3.Error as exc:
            self._log_once(folder, f"{folder}: index rows of objects gone not pruned ({exc})")
            return
        if gone:
            log.info("index: forgot %d archives no longer listed in %s", gone, folder)

    def _spool_dirs(self, prefix: str) -> list[str]:
        assert self.spool is not None
        try:
            with os.scandir(self.spool.path(prefix) if prefix else self.spool.files) as it:
                return [de.name for de in it if de.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _shown(self, folder: Path, name: str) -> bool:
        problem = name_problem(name) if name not in (".", "..") else "a dot name"
        if problem is not None:
            self._log_once(folder / "?", f"{folder}/{name[:80]!r}: not shown ({problem})")
            return False
        return not self._skipped(folder, name)

    _intruder = "a newer object"

    def _name_public(self, folder: Path, path: Path, st: os.stat_result) -> bool:
        """An object keeps no mode of its own to read it by: a name read from one is shown to
        all who may list its folder, as its key is."""
        return True

    def _may_stand_in(self, real: Node, archive: os.stat_result, path: Path) -> bool:
        """In a bucket every object has one owner, the mount's: of a plain object or a folder
        and an archive presenting its name, the one uploaded first keeps the name (a folder's
        upload time: its oldest object's). A writer who may only add keys (conditional PUTs:
        nothing overwritten) then cannot put other bytes under a name every host serves, in
        either direction; a tie goes to the archive. Upload times, not the times shown (a file
        published here shows its original's mtime; a folder, the daemon's start: which of the
        two a host showed depended on when it started)."""
        infos: dict[str, ObjectInfo] = getattr(self._scanning, "infos", {})
        theirs = infos.get(path.name)
        uploaded = theirs.mtime if theirs is not None else archive.st_mtime_ns / 1e9
        if real.is_dir:
            return self._folder_before(real, uploaded)
        mine = infos.get(real.real.name)
        if mine is None or theirs is None:  # not from this scan's listing: as shown
            return real.mtime_ns < archive.st_mtime_ns
        return mine.mtime < theirs.mtime

    def _object_first(self, path: Path, info: ObjectInfo, st: os.stat_result | None) -> bool:
        """Whether the object `info` was uploaded before every object under the folder of its
        name (`st`: that folder's stat): it keeps the name then, and the folder is not shown.
        Always the folder, as before, let anyone who may add keys put `a/x` and hide a file
        `a` published long before on every host (red team 83, F2)."""
        if st is None:
            return True  # the folder is not shown anyway
        # Within a second of each other (a store's Last-Modified may have no finer grain) the
        # folder keeps it, as it always did.
        if self._key_before(self.key_of(path), st.st_mtime_ns, info.mtime + TIE_SECONDS):
            return False
        self._log_once(path, f"{self.folder.url_of(self.key_of(path))}/: a folder of objects "
                       "all uploaded after the object of its name; not shown")  # fmt: skip
        return True

    def _folder_before(self, folder: Node, uploaded: float) -> bool:
        return self._key_before(self.key_of(folder.real), folder.mtime_ns, uploaded)

    def _key_before(self, key: str, mtime_ns: int, uploaded: float) -> bool:
        """Whether the folder holds an object uploaded before `uploaded` (POSIX seconds): one
        LIST page in the usual case (the first object older stops it). What a LIST found is
        kept `relist` seconds, so however many archives clash with one folder, it is listed at
        most twice a relist (once stopped early, once whole). Among AGE_SCAN_MAX objects none
        older: the folder keeps its name (the archive is shown under its own), as it does while
        the store cannot say (kept as long). A folder with no object yet (made through this
        mount, its files still spooled) has its spool folder's time (`mtime_ns`)."""
        now = time.monotonic()
        with self._lock:
            known = self._ages.get(key)
        if (
            known is None
            or now - known[0] >= self.relist
            or (known[1] >= uploaded and known[2] == "partial")
        ):
            try:
                known = (now, *self._oldest(key, uploaded))
            except StoreError:  # kept too: a scan of the folder does not wait on the store again
                known = (now, float("inf"), "unknown")
            with self._lock:
                if len(self._ages) >= MAX_AGES:
                    self._ages.clear()
                self._ages[key] = known
        _at, oldest, how = known
        if oldest < uploaded or how in ("bounded", "unknown"):
            return True
        return how == "empty" and mtime_ns < uploaded * 1e9

    def _oldest(self, key: str, uploaded: float) -> tuple[float, str]:
        """(the oldest upload time seen under `key`, how the LIST ended: "partial" at an object
        older than `uploaded`, "bounded" at AGE_SCAN_MAX objects, "complete", or "empty")."""
        oldest, seen = float("inf"), 0
        for info in self.folder.list(key):
            oldest, seen = min(oldest, info.mtime), seen + 1
            if oldest < uploaded:
                return oldest, "partial"
            if seen >= AGE_SCAN_MAX:
                self._log_once(Path(key), f"{self.folder.url_of(key)}: a folder of more than "
                               f"{AGE_SCAN_MAX} objects none of which predates an archive "
                               "presenting its name; the folder keeps it")  # fmt: skip
                return oldest, "bounded"
        return oldest, "complete" if seen else "empty"

    def _claim_order(self, name: str, st: os.stat_result, desc: Any) -> tuple[Any, ...]:
        """Of two archives presenting one name, the one uploaded first keeps it, as against a
        plain object (`_may_stand_in`): being named after it (NAME.zarr.zip) decides only a
        tie. Before, a later archive named after it took over the name on every host."""
        info = getattr(self._scanning, "infos", {}).get(name)
        uploaded = info.mtime if info is not None else st.st_mtime_ns / 1e9
        return (desc is None, uploaded, *super()._claim_order(name, st, desc))

    def _skipped(self, folder: Path, name: str) -> bool:
        return name.startswith(TEMP_PREFIX)  # no mountpoint, spool or hidden names in a bucket

    def _relative(self, path: Path) -> str:
        return str(path)[len(self._root_url) + 1 :]

    def entries(self, folder: Path, names: Sequence[str], quick: bool = False) -> None:
        return None  # only the write side asks, and a bucket mount has none

    def entries_of_listed(
        self, folder: Path, names: Sequence[str], listed: tuple[int, int], quick: bool = False,
        also: Sequence[str] = (),
    ) -> None:  # fmt: skip
        return None  # a bucket's folder is listed whole (one LIST), never name by name

    # -- the SourceTree hooks --------------------------------------------------------------

    def _child(self, folder: Path, name: str) -> Path:
        path = ObjectPath(folder) / name
        path.info = getattr(self._scanning, "infos", {}).get(name)
        return path

    def _dir_stat(self, key: str) -> os.stat_result:
        ino = zlib.crc32(key.encode()) | 1 << 40
        mode = 0o755 if self.spool is not None else 0o555  # writable with --spool
        if self.spool is not None and key:
            # A folder made through the mount keeps its spool folder (a bucket keeps no mode
            # or owner), and shows its mode and owner: shown 0555 and the daemon's, a `mkdir
            # -m 700` let every local user list it and read the 0644 files in it.
            try:
                st = os.lstat(self.spool.path(key))
            except OSError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                return _make_stat(stat.S_IFDIR | stat.S_IMODE(st.st_mode), ino, 0,
                                  st.st_mtime_ns, st.st_uid, st.st_gid)  # fmt: skip
        return _make_stat(stat.S_IFDIR | mode, ino, 0, self._started_ns, self._uid, self._gid)

    def _raw_node(self, path: Path, st: os.stat_result) -> Node:
        if stat.S_ISDIR(st.st_mode):
            return mirror_node(path, st, self.writable)
        entry = Entry(size=st.st_size)
        node = archive_node(self.objects, path, st, "", entry, self._relative(path))  # type: ignore[arg-type]
        if self.writable:
            node.mode = stat.S_IMODE(st.st_mode)  # what `rsync -a` gave what this mount published
        return node

    def version_stat(self, path: Path, st: os.stat_result) -> os.stat_result:
        """An object's as listed; a `NAME.zarr/` prefix's with its manifest object's identity
        (one HEAD, which `describe` then takes) folded in (vfs.decant.folded_stat). A prefix
        lists as a name only, so its objects overwritten in place by another archive's kept
        its node, inode and verdict: once relisted (an open finds the manifest is not the one
        listed: ESTALE), the new manifest is a new version, described anew."""
        if not stat.S_ISDIR(st.st_mode) or not isinstance(path, ObjectPath):
            return st
        manifest = self.folder.stat(join_key(self.key_of(path), MANIFEST_KEY))
        if manifest is None:
            return st
        if path.info is None:
            path.info = _DirInfo(manifest.key, manifest.size, manifest.mtime, manifest.etag)
        return folded_stat(st, _file_stat(manifest, self._uid, self._gid))

    def _stat(self, path: Path) -> os.stat_result:
        info = getattr(path, "info", None)
        if info is None or isinstance(info, _DirInfo):
            return self._dir_stat(self.key_of(path))
        return self._object_stat(info)

    def _transient(self, exc: DecantError) -> bool:
        return isinstance(exc, StoreError) and not isinstance(
            exc, (ObjectMissingError, ObjectChangedError)
        )

    def _describe_fresh(
        self, backend: Backend, path: Path, listed: os.stat_result | None = None
    ) -> Description | None:
        log.debug("%s: describing (not in the index)", path)
        return super()._describe_fresh(backend, path)

    def _indexed(self, url: str, key: str, info: ObjectInfo) -> Description | None:
        """The index's description of `url`: during the scan of a large folder from rows
        read for the whole folder at once (per backend), else from a query of its own."""
        assert self.index is not None
        batch: dict[str, Any] | None = getattr(self._scanning, "batch", None)
        folder = url.rpartition("/")[0]
        if batch is None or batch.get("") != folder:
            return self.index.get_object(url, key, info)
        rows = batch.get(key)
        if rows is None:
            rows = batch[key] = self.index.objects_in(folder, key)
        return object_description(rows.get(url), info)

    def _reload(self, node: Node) -> Entry:
        """As SourceTree's, for the object identity the node's path carries: the index is asked
        for that identity; a fresh describe reads whatever the key holds now, so the object is
        checked to be still the node's before and after it (else ESTALE)."""
        info = getattr(node.real, "info", None)
        if info is None or node.backend is None:
            return super()._reload(node)
        if self.index is not None:
            found = self.index.get_object(str(node.real), index_key(node.backend), info)
            if found is not None:
                return found.root
        self._still(node.real, info)
        root = super()._reload(node)
        self._still(node.real, info)
        return root

    def _still(self, path: Path, info: ObjectInfo) -> None:
        now = self.folder.stat(info.key)
        if now is None or replaced(info, now):
            raise OSError(errno.ESTALE, f"{path}: replaced in the bucket since it was listed")

    def describe(
        self, backend: Backend, path: Path, st: os.stat_result, listing: Any = None
    ) -> Description | None:
        """An object's description (the index first); `listing` is not used: a new one is
        written to the index at once (a listing of a bucket reads its index rows together)."""
        self.archives_seen += 1
        assert isinstance(path, ObjectPath)
        if path.info is None:  # a NAME.zarr/ prefix: its manifest (written last) is its identity
            manifest = self.folder.stat(join_key(self.key_of(path), MANIFEST_KEY))
            if manifest is None:
                return None
            path.info = _DirInfo(manifest.key, manifest.size, manifest.mtime, manifest.etag)
        url, key, info = str(path), index_key(backend), path.info
        if self.index is not None:
            cached = self._indexed(url, key, info)
            if cached is not None:
                return cached
        held = self._raw.get(url)
        if held is not None and held[0] == info.identity and held[1] > time.monotonic():
            # The folder is presented afresh once the hold has lapsed, not at each relist
            # before: one of 100,000 objects, not every interval for one archive held an hour.
            self._retry_at(held[1])
            return None
        try:
            desc = self._describe_fresh(backend, path)
        except DecantError:
            self._retry_at(0.0)  # left out: tried again at the next listing
            raise
        if desc is None:
            self._shown_raw(path, info.identity, held)
        elif self.index is not None:
            try:
                self.index.put_object(url, key, info, desc)
            except Exception as exc:  # sqlite3.Error, ValueError, RecursionError: re-described
                self._log_once(path, f"{path}: not kept in the index ({exc})")
        return desc

    def _shown_raw(
        self,
        path: ObjectPath,
        identity: tuple[object, ...],
        held: tuple[tuple[object, ...], float, float] | None,
    ) -> None:
        """The archive at `path` could not be described: shown raw for one relist interval,
        twice as long at each failure of the same version after that, up to RAW_HOLD_MAX.
        Its bytes may have been damaged on the way, under its ETag (a proxy, plain http); it
        was shown raw until the folder's LIST changed, and its damaged ranges kept in
        --disk-cache (with a checksum of the damage) failed it again after every restart.
        They go, so that it is described again from the store."""
        hold = self.relist
        if held is not None and held[0] == identity:
            hold = min(2 * held[2], max(self.relist, RAW_HOLD_MAX))
        if len(self._raw) >= MAX_RAW:
            self._raw.clear()
        until = time.monotonic() + hold
        self._raw[str(path)] = (identity, until, hold)
        self._retry_at(until)
        self.forget_fetched(path)

    def _retry_at(self, when: float) -> None:
        """The folder being presented has an archive to try again at `when` (monotonic)."""
        self._scanning.retry_at = min(getattr(self._scanning, "retry_at", math.inf), when)


@dataclass(frozen=True)
class _DirInfo(ObjectInfo):
    """The identity of a NAME.zarr/ archive: its manifest object's."""


def _ids(files: list[ObjectInfo]) -> list[tuple[object, ...]]:
    return [f.identity for f in files]


def _file_stat(info: ObjectInfo, uid: int, gid: int) -> os.stat_result:
    ino = etag_number(f"{info.key}\0{info.etag}") or 1
    return _make_stat(stat.S_IFREG | 0o444, ino, info.size, int(info.mtime * 1e9), uid, gid)


def _make_stat(mode: int, ino: int, size: int, mtime_ns: int, uid: int, gid: int) -> Any:
    seconds = mtime_ns / 1e9
    fields = (mode, ino, 0, 1, uid, gid, size, seconds, seconds, seconds)
    ns = {"st_atime_ns": mtime_ns, "st_mtime_ns": mtime_ns, "st_ctime_ns": mtime_ns}
    return os.stat_result(fields, ns)
