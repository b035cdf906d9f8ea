"""SRC as the mount presents it: real entries mirrored, archives replaced by what they hold.

Pure and synchronous (the daemon runs scans in worker threads). Name clashes resolve here: a real
file of the archive's owner wins, and an archive that would shadow it keeps its archive name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfs.acl import acl_lstat, acl_stat, acl_stat_at
from vfs.backends.base import (
    Backend,
    Description,
    Entry,
    mode_mask_of,
    presented_mode,
    serves_owner,
)
from vfs.beneath import not_listed, open_beneath, parent_fd, stat_beneath
from vfs.decant import MANIFEST_KEY, TEMP_PREFIX, archive_stat, folded_stat
from vfs.errors import DecantError
from vfs.mount.described import DESCRIBED_ENTRIES, DescribedTrees
from vfs.mount.index import DescriptionIndex
from vfs.mount.racy import RacyArchives
from vfs.names import name_problem
from vfs.nodes import Node, archive_node, archive_version, mirror_node, spooled_node, unshared
from vfs.perms import user_groups

if TYPE_CHECKING:
    from vfs.ingest.spool import Spool

log = logging.getLogger(__name__)


_Found = tuple[str, os.stat_result]  # an entry of a folder and its lstat
_Archive = tuple[str, os.stat_result, Backend, Path]  # ... claimed by a backend, at its path


@dataclass
class Listing:
    """What one folder's listing carries from archive to archive as it describes them."""

    # Descriptions the index held, read before any archive is (None: ask the index for each).
    recalled: dict[Path, Description] | None = None
    kept: list[Any] = field(default_factory=list)  # new one-file ones, for the index together
    alone: set[Path] = field(default_factory=set)  # held too, but read one at a time (large)
    # The folder owner's uid: other users' archives to be described afresh are not, but
    # `deferred` (the listing then raises Deferred for its caller to describe them elsewhere),
    # or, `leave_out`, left out of the listing (new again each time they were described).
    defer: int | None = None
    deferred: list[Any] = field(default_factory=list)
    leave_out: bool = False
    # What the caller had described elsewhere (`describe_each`), by path: taken where the
    # archive's version is still the one described.
    handed: Mapping[Path, tuple[tuple[int, ...], Description | None]] = field(default_factory=dict)


# Archive files a listing will describe afresh are read ahead (WILLNEED) when at most this big:
# a cold `ls -l` of 1,000 small archives then waits for one batch of disk reads the kernel
# runs at once, not for 1,000 one after another (~0.5 s of its ~1.3 s here). A larger archive
# is read where its describe reads it (its zip directory, its manifest), not whole.
READ_AHEAD_MAX = 256 * 1024
TreeKey = tuple[str, str, tuple[int, ...]]  # an archive's path, backend and version

NEW_ARCHIVES_READ = 64  # an owner's new archives read with a lookup (new_archives_of)
MAX_FAILED = 100_000  # archives remembered as failed (then forgotten all at once)
LOGGED_ONCE = 100_000  # (path, message) hashes `_log_once` remembers (~60 bytes each)


class NotQuick(Exception):
    """`SourceTree.entries(quick=True)` would describe an archive: ask again in a thread."""


class Deferred(Exception):
    """`SourceTree.scan(defer=uid)` found other users' archives to describe afresh: describe
    them (`describe_each`) in their owners' threads and scan again."""

    def __init__(self, archives: list[_Archive]) -> None:
        super().__init__(f"{len(archives)} archives of other users to describe")
        self.archives = archives


class SourceTree:
    def __init__(
        self,
        root: Path,
        backends: Sequence[Backend],
        overlays: Sequence[Any] = (),
        index: DescriptionIndex | None = None,
        hidden: Sequence[str] = (),
        spool: Spool | None = None,
        publishing: set[str] | None = None,
        described_entries: int = DESCRIBED_ENTRIES,
    ) -> None:
        self.root = root
        self.backends = list(backends)
        self.overlays = list(overlays)
        self.index = index
        self.hidden = set(hidden)
        self.spool = spool  # set when the mount is writable
        self.publishing = publishing if publishing is not None else set()
        self._logged: set[int] = set()
        self.archives_seen = 0
        self.excluded: set[Path] = set()  # never scanned into (the mountpoint, if inside SRC)
        self.overlay_roots: set[Path] = set()  # folders an overlay claimed: rebuilt on change
        self._irregular: set[Path] = set()  # folders `entries` cannot answer for: see there
        # Archives shown raw, by the hash of their path (a path of a few KiB kept whole for
        # each name a user made: red team 74, F2), with the stamp they failed at.
        self._failed: dict[int, tuple[object, ...]] = {}
        # ... and a file's by the hash of its device and inode number, with its size, mtime
        # and owner: not its ctime, which each new hard link moves. An archive that fails,
        # linked 150 times into a shared folder (links cost their maker nothing), was parsed
        # again at each listing after each `ln`: 80-110 s each (red team 103 F3). The owner:
        # a user's junk file of another's archive's size and mtime, deleted, left its inode
        # number to that user's `cp -p` of the archive, shown raw (red team 104 F2).
        self._failed_files: dict[int, tuple[object, ...]] = {}
        self.racy = RacyArchives()  # described while they may have been mid-write
        # The member trees of archives shown as folders, across all of them (their nodes keep
        # none: `children_of_archive_node` reads an evicted one again).
        self.trees = DescribedTrees(described_entries)
        self._reloading = threading.Lock()
        self.stopping = False  # unmounted: listings still being read end at their next archive
        # Archives being described, by path, backend and version: another thread that wants
        # the same description waits for it (see `_described_once`).
        self._in_flight: dict[tuple[str, str, tuple[int, ...]], _InFlight] = {}
        self._flights = threading.Lock()

    def _log_once(
        self, path: Path, message: str, level: int = logging.WARNING, detail: str = ""
    ) -> None:
        """`message` (then `detail`, which may differ each time) once per path and message,
        remembered as a hash among the last LOGGED_ONCE (each name a user made and listed was
        kept whole for the daemon's life: red team 74, F2); past those, said again."""
        said = hash((str(path), message))
        if said not in self._logged:
            if len(self._logged) >= LOGGED_ONCE:
                self._logged.clear()
            self._logged.add(said)
            log.log(level, "%s%s", message, detail)

    def root_node(self) -> Node:
        return mirror_node(self.root, acl_stat(self.root, os.stat(self.root)), self.writable)

    def scan(
        self, folder: Path, listed: tuple[int, int] = (0, -1), defer: int | None = None,
        handed: Mapping[Path, tuple[tuple[int, ...], Description | None]] | None = None,
        leave_out: bool = False,
    ) -> dict[str, Node]:  # fmt: skip
        """The presented children of a real folder of SRC. `listed`: the inode number and
        owner the mount listed the folder with; another folder there now is ESTALE (one
        renamed over it is another user's: the kernel let the caller list it by the
        attributes of the first; red team 67, F1). `defer`: raise Deferred with the archives
        of users other than this uid that would be described afresh (not in the index, nor
        `handed`: what `describe_each` made of them), having described none of them; or,
        `leave_out`, leave them out of the listing."""
        # The spool first, SRC after: a publish places a file in SRC before it hides the
        # spooled name (and unhides it only once that is gone), so read in this order a file
        # being published is seen in one or the other; read the other way round, a scan that
        # straddles the two steps saw it in neither (a rename then got ENOENT).
        spooled = self._spooled(folder) if self.spool is not None else {}
        # Reached without links: a folder swapped for one must not list its target (beneath.py).
        fd = open_beneath(self.root, folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not_listed(os.fstat(fd), *listed):
                raise OSError(errno.ESTALE, "not the folder listed (replaced since)", str(folder))
            with os.scandir(fd) as it:
                plain, archives = self._sorted(folder, self._stats(folder, it, fd))
            listing = Listing(*self._recall(fd, archives), defer=defer, leave_out=leave_out,
                              handed=handed or {})  # fmt: skip
        finally:
            os.close(fd)
        out, regular = self._resolved(folder, plain, archives, listing)
        out.update(spooled)
        for overlay in self.overlays:
            if overlay.claims(folder, True):
                self.overlay_roots.add(folder)
                self._add_overlay(overlay, folder, out)
                regular = False
        if regular:
            self._irregular.discard(folder)
        else:
            self._irregular.add(folder)
        return out

    def entries(
        self, folder: Path, names: Sequence[str], quick: bool = False
    ) -> dict[str, Node | None] | None:
        """What `scan(folder)` would present under each of `names` (None: nothing), from a few
        lstats instead of a scan of the whole folder. None when that cannot be told without a
        full scan: an overlay's folder, or one holding an archive that presents a name other
        than its own (less .zarr.zip / .zarr), seen at its last scan or now.

        `quick`: raise NotQuick, after the lstats, when an archive is among the entries found:
        describing one may take seconds (a big archive not in the index yet), which must not
        happen on the event loop that asked for a few lstats."""
        if folder in self._irregular or folder in self.overlay_roots:
            return None
        out, regular = self._named_entries(folder, names, quick)
        if not regular:
            self._irregular.add(folder)
            return None
        return out

    def entries_of_listed(
        self, folder: Path, names: Sequence[str], listed: tuple[int, int], quick: bool = False,
        also: Sequence[str] = (),
    ) -> tuple[dict[str, Node | None], bool] | None:  # fmt: skip
        """For a lookup that does not wait for a full scan: `entries` of the folder the mount
        listed (`listed`: its inode and owner, as `scan` takes them), ESTALE if another folder
        is at its name now, its names read through the descriptor checked. `also`: entries
        that may present one of the names under another name of their own (the archives the
        last listing gave them to), read with them. With whether the answer is sure: not
        where an archive presents a name other than its own (then a name not found may be
        shown by one elsewhere in the folder, and one found may lose it to one, unless that
        one is in `also`). None: an overlay's folder, told only by a scan."""
        if folder in self.overlay_roots:
            return None
        fd = open_beneath(self.root, folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not_listed(os.fstat(fd), *listed):
                raise OSError(errno.ESTALE, "not the folder listed (replaced since)", str(folder))
            out, regular = self._named_entries(folder, names, quick, fd, also)
        finally:
            os.close(fd)
        if not regular:
            self._irregular.add(folder)
        return out, regular and folder not in self._irregular

    def new_archives_of(
        self, folder: Path, listed: tuple[int, int], known: Iterable[Node], uid: int,
        complete: bool = False,
    ) -> list[str] | None:  # fmt: skip
        """The archive files of `uid` in `folder` (at most NEW_ARCHIVES_READ) that none of
        `known` (the listing's entries) is made from: those, new since the listing was read,
        may present a name under another of their own (`DecantOperations._named`). Read
        through the folder's descriptor, checked to be the one listed (ESTALE otherwise).
        `complete`: None where there are more (the caller waits for the listing instead)."""
        names = {node.real.name for node in known if node.backend is not None}
        fd = open_beneath(self.root, folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not_listed(os.fstat(fd), *listed):
                raise OSError(errno.ESTALE, "not the folder listed (replaced since)", str(folder))
            out: list[str] = []
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.name in names or not entry.name.endswith((".zarr.zip", ".zarr")):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_uid == uid and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                        if len(out) >= NEW_ARCHIVES_READ:
                            return None if complete else out
                        out.append(entry.name)
            return out
        finally:
            os.close(fd)

    def _named_entries(
        self, folder: Path, names: Sequence[str], quick: bool, fd: int | None = None,
        also: Sequence[str] = (),
    ) -> tuple[dict[str, Node | None], bool]:  # fmt: skip
        """`entries`' answer, and whether every archive found presents its own name; the
        entries read by name in `folder`, or relative to its descriptor `fd`; `also` read
        with them (see `entries_of_listed`)."""
        candidates = {c for n in names for m in _related(n) for c in _related(m)}
        candidates.update(also)
        # Most candidates do not exist: plain strings and one lstat each (this runs for every
        # rename of a spooled file). The mountpoint is never statted: it would call into us.
        skip = {p.name for p in self.excluded if p.parent == folder}
        if folder == self.root:
            skip |= self.hidden
        spooled: dict[str, Node] = {}
        if self.spool is not None:  # the spool first, SRC after: see `scan`
            reldir = self.relpath(folder)
            spool_files = os.fspath(self.spool.files)
            for name in names:
                rel = f"{reldir}/{name}" if reldir else name
                if rel in self.publishing:
                    continue
                try:
                    sst = os.lstat(f"{spool_files}/{rel}")
                except OSError:
                    continue
                if stat.S_ISREG(sst.st_mode):
                    spooled[name] = spooled_node(self.spool.path(rel), rel, sst)
        base = os.fspath(folder)
        found: list[tuple[str, os.stat_result]] = []
        for name in sorted(candidates):
            if name in skip or name.startswith(TEMP_PREFIX):
                continue
            try:
                if fd is None:
                    st = acl_lstat(f"{base}/{name}")  # as `_stats` takes it: vfs.acl
                else:
                    st = acl_stat_at(fd, name, os.stat(name, dir_fd=fd, follow_symlinks=False))
            except OSError:
                continue  # not there (or not reachable): nothing to present
            if name_problem(name) is None:
                found.append((name, st))
        if quick and any(self._claimed(folder / n, st) for n, st in found):
            raise NotQuick(folder)
        out, regular = self._present(folder, found) if found else ({}, True)
        out.update(spooled)
        return {name: out.get(name) for name in names}, regular

    def _claimed(self, path: Path, st: os.stat_result) -> bool:
        is_dir = stat.S_ISDIR(st.st_mode)
        return (is_dir or stat.S_ISREG(st.st_mode)) and any(
            b.claims(path, is_dir) for b in self.backends
        )

    @staticmethod
    def presented_names(names: set[str]) -> set[str]:
        """The names an entry of each of `names` can be presented under, or decide (an archive
        `x.tif.zarr.zip` shows `x.tif`): what a change of those real entries may change."""
        return {shown for name in names for shown in _related(name)}

    def _skipped(self, folder: Path, name: str) -> bool:
        return self._skips(folder)(name)

    def _skips(self, folder: Path) -> Callable[[str], bool]:
        """Whether a name of `folder` is never shown, as a test set up once per folder read.
        Set up per name, a `Path` made and hashed and a folder compared cost ~5 µs a name:
        5.3 ms of a listing of 1,000 names (now 0.2 ms), ~5 s of every rescan of a folder of a
        million names."""
        hidden = self.hidden if folder == self.root else set()
        # The mountpoint itself: statting it would call into this daemon.
        excluded = {p.name for p in self.excluded if p.parent == folder}

        def skipped(name: str) -> bool:
            if name in hidden:
                return True
            if name.startswith(TEMP_PREFIX):
                return True  # an archive being written: it appears once renamed into place
            return bool(excluded) and name in excluded

        return skipped

    def _stats(self, folder: Path, it: Iterator[os.DirEntry[str]], fd: int) -> Iterator[_Found]:
        """The entries of a folder being read (open at `fd`), each with its lstat, its mode
        narrowed by its ACL (vfs.acl), one at a time: a folder of a million names never holds
        a stat result for each at once (~640 B a name)."""
        skipped = self._skips(folder)
        for de in it:
            if skipped(de.name):
                continue
            try:
                yield de.name, acl_stat_at(fd, de.name, de.stat(follow_symlinks=False))
            except OSError:
                continue  # vanished

    def _present(self, folder: Path, found: list[_Found]) -> tuple[dict[str, Node], bool]:
        """Real entries of `folder` as presented, and whether every archive among them presents
        its own name (less .zarr.zip / .zarr): then a name depends only on its related names."""
        return self._resolved(folder, *self._sorted(folder, found))

    def _sorted(
        self, folder: Path, found: Iterable[_Found]
    ) -> tuple[dict[str, Node], list[_Archive]]:
        """Entries shown as they are (made into nodes), and the archives among them."""
        plain: dict[str, Node] = {}
        archives: list[_Archive] = []
        for name, st in found:
            path = self._child(folder, name)
            if stat.S_ISLNK(st.st_mode):
                self._log_once(path, f"{path}: a symlink; not shown (the mount never follows "
                                     "links out of SRC)", logging.INFO)  # fmt: skip
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or stat.S_ISREG(st.st_mode)):
                continue
            backend = next((b for b in self.backends if b.claims(path, is_dir)), None)
            if backend is not None and not serves_owner(backend, st.st_uid):
                self._log_once(path, f"{path}: owned by uid {st.st_uid}, whose {backend.name} "
                                     "archives are not opened here; shown as the raw file",
                               logging.INFO)  # fmt: skip
                backend = None
            if backend is not None:
                archives.append((name, self.version_stat(path, st), backend, path))
            else:
                plain[name] = self._raw_node(path, st).named(name)
        return plain, archives

    def _resolved(
        self,
        folder: Path,
        plain: dict[str, Node],
        archives: list[_Archive],
        listing: Listing | None = None,
    ) -> tuple[dict[str, Node], bool]:
        """`_present` once its entries are sorted: archives described, names given out."""
        out = dict(plain)
        listing = listing or Listing()
        described = []
        try:
            for n, st, b, p in archives:
                if self.stopping:  # unmounted: a listing read behind ends (not 10 s more)
                    raise OSError(errno.ECANCELED, "the mount is stopping", str(folder))
                handed = listing.handed.get(p)
                if handed is not None and handed[0] == _version_of(st):
                    described.append((n, st, b, handed[1], p))
                    continue
                if self._deferred(listing, b, p, st):
                    if listing.leave_out:
                        self._log_once(p, f"{p}: left out of the listing while it changes",
                                       logging.INFO)  # fmt: skip
                    else:
                        listing.deferred.append((n, st, b, p))
                    continue
                try:
                    described.append((n, st, b, self._described(b, p, st, listing), p))
                except DecantError as exc:
                    if not self._transient(exc):
                        raise
                    # One object the store will not serve (a key of its own, a volume down)
                    # failed the whole folder, on every host: left out, described next time.
                    why = f"{p}: left out of the listing until the store serves it"
                    self._log_once(p, why, detail=f" ({exc})")
        finally:
            self._keep(folder, listing.kept)
        if listing.deferred:
            raise Deferred(listing.deferred)
        contested = self._contested(folder, described)
        regular = all(d is None or d.name in _related(n) for n, _s, _b, d, _p in described)
        described.sort(key=lambda a: self._claim_order(a[0], a[1], a[3]))
        for name, st, backend, desc, path in described:
            if desc is None:
                out[name] = self._raw_node(path, st).named(name)
                continue
            shown = desc.name
            problem = name_problem(shown)
            if problem is not None:
                self._log_once(path, f"{path}: presents a name that cannot be shown ({problem}); "
                                     "shown under its archive name")  # fmt: skip
                shown = name
            elif shown not in _related(name) and not self._name_public(folder, path, st):
                self._log_once(path, f"{path}: presents a name read from inside it, which not "
                                     f"everyone who may list {folder} may read; shown under "
                                     "its archive name", logging.INFO)  # fmt: skip
                shown = name
            if (shown, st.st_uid) in contested:
                self._log_once(path, f"{path}: presents {shown!r}, as another user's archive "
                                     f"in {folder} does; shown under its archive name")  # fmt: skip
                shown = name
            if shown in plain and not self._may_stand_in(plain[shown], st, path):
                self._log_once(
                    path,
                    f"{path}: presents {shown!r}, which {self._intruder} holds in "
                    f"{folder}; that entry is not shown",
                )
                del out[shown], plain[shown]
            if shown in out:
                self._log_once(
                    path,
                    f"{path}: presents {shown!r}, which already exists in {folder}; "
                    f"shown under its archive name",
                )
                shown = name
                if shown in plain:
                    continue
            node = archive_node(backend, path, st, "", desc.root, self._relative(path))
            if self.writable and not node.is_dir:
                node.mode = stat.S_IMODE(st.st_mode)  # what rsync -a / cp -a gave the original
                if stat.S_ISDIR(st.st_mode):  # a folder archive: its x bits mean "search"
                    node.mode &= ~0o111
            if stat.S_ISDIR(st.st_mode) and backend.name == "decant" and isinstance(path, Path):
                # a bucket's objects have no modes of their own
                node.mode &= _manifest_mask(path, st, node.uid, node.gid)
            out[shown] = node
        return out, regular

    _intruder = "another user's entry"

    def _deferred(self, listing: Listing, backend: Backend, path: Path, st: os.stat_result) -> bool:
        """Whether the listing leaves this archive to be described elsewhere (`scan`'s
        `defer`): another user's, neither held by the index nor known to fail."""
        return (listing.defer is not None and st.st_uid != listing.defer
                and listing.recalled is not None and path not in listing.recalled
                and path not in listing.alone
                and not self._known_failed(backend, path, st))  # fmt: skip

    def describe_each(
        self, folder: Path, archives: list[_Archive], until: float = math.inf
    ) -> tuple[dict[Path, tuple[tuple[int, ...], Description | None]], int]:
        """The archives described (what `Deferred` handed over), as a listing describes them,
        into the index, and for `scan`'s `handed`, by path with the version described; from
        the first, until the monotonic clock passes `until` (at least one). With how many
        of `archives` were done (one the store failed for a moment is left to `scan`)."""
        listing = Listing()
        out: dict[Path, tuple[tuple[int, ...], Description | None]] = {}
        done = 0
        try:
            for _n, st, backend, path in archives:
                if self.stopping:
                    raise OSError(errno.ECANCELED, "the mount is stopping", str(folder))
                if done and time.monotonic() > until:
                    break
                done += 1
                with contextlib.suppress(DecantError):  # a store's transient failure: `scan`
                    out[path] = (_version_of(st), self._described(backend, path, st, listing))
        finally:
            self._keep(folder, listing.kept)
        return out, done

    def _claim_order(self, name: str, st: os.stat_result, desc: Any) -> tuple[Any, ...]:
        """Of two archives presenting one name, the one sorted first is given it: here the one
        named after it (NAME.zarr.zip, then NAME.zarr), then by name (owners are
        `_contested`'s): an archive of another name sorted by name took the name from a
        `NAME.zarr/` (an `aaa.zarr.zip` presenting it; red team 93)."""
        if desc is None:
            return (True, True, name)
        return (name != f"{desc.name}.zarr.zip", desc.name not in _related(name), name)

    def _name_public(self, folder: Path, path: Path, st: os.stat_result) -> bool:
        """Whether every user who may list `folder` may read what the archive at `path`
        (listed as `st`) presents its name from: the zip, or a folder archive's manifest. A
        name is the folder's to show, to all who list it: a 0600 `a1.zarr.zip` of another
        user's listed as `patient_jane_doe_hiv_positive.tif` to anyone who could list its
        folder. Judged by the same rules as a node's modes (`_readers_mask`), the folder's
        owner, group and others as its listers."""
        try:
            listed = self._stat(folder)
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode):
            held = _manifest_held(path, st)
            if held is None:
                return False
        else:
            held = [st]
        mask = _readers_mask(held, listed.st_uid, listed.st_gid)
        return listed.st_mode & 0o444 & ~mask == 0

    def _may_stand_in(self, real: Node, archive: os.stat_result, path: Path) -> bool:
        """Whether a real entry keeps a name the archive at `path` presents (else the archive
        takes it and the entry is not shown). In a shared, sticky folder anyone may make an
        entry of a name free in SRC and nobody may remove another's, so one user's entry must
        not take over a name another user's holds: an entry of the archive's owner keeps the
        name; another user's only where the archive's owner does not own the folder (red team
        2 G: a user's `data.bin` beside root's `data.bin.zarr.zip` in root's drop folder was
        served as root's original; red team 80 F1: a user's `notes.txt.zarr.zip` hid another
        user's `notes.txt`, and `data.zarr.zip` their folder `data/`, in a folder of root's).
        The archive is then shown under its own name, as of two users' archives."""
        if real.uid == archive.st_uid:
            return True
        return self._stat(path.parent).st_uid != archive.st_uid

    def _contested(self, folder: Path, described: list[Any]) -> set[tuple[str, int]]:
        """(name, owner) of archives that lose a name other users' archives present too. Only
        the folder owner's may hold it then, or none: in a shared (sticky) folder anyone may
        add an archive presenting a name, and must not take over one another user's holds."""
        # An archive named after the name it presents (NAME.zarr.zip) is not contested by one
        # of another name presenting it too, unless that one is the folder owner's: a copy of
        # a user's archive under another name, dropped into a root's shared folder, took
        # `victim.tif` from its owner, for every user (red team 93). That one loses alone.
        named_after = {
            d.name for n, _s, _b, d, _p in described if d is not None and d.name in _related(n)
        }
        keeper: int | None = None
        owners: dict[str, set[int]] = {}
        for n, st, _b, desc, _p in described:
            if desc is None:
                continue
            if desc.name in named_after and desc.name not in _related(n):
                keeper = self._stat(folder).st_uid if keeper is None else keeper
                if st.st_uid != keeper:
                    continue
            owners.setdefault(desc.name, set()).add(st.st_uid)
        clashes = {name: uids for name, uids in owners.items() if len(uids) > 1}
        if not clashes:
            return set()
        keeper = self._stat(folder).st_uid if keeper is None else keeper
        return {(name, uid) for name, uids in clashes.items() for uid in uids if uid != keeper}

    def _raw_node(self, path: Path, st: os.stat_result) -> Node:
        """A real entry shown as it is (no backend claims it, or its archive cannot be read)."""
        return mirror_node(path, st, self.writable)

    def _transient(self, exc: DecantError) -> bool:
        """An error that must fail the listing rather than show the archive raw: none locally
        (a bucket tree: the store unreachable, so the next listing tries again)."""
        return False

    def _child(self, folder: Path, name: str) -> Path:
        """The path an entry of `folder` is named by (a bucket tree attaches its identity)."""
        return folder / unshared(name)

    def stamp_folder(self, folder: Path) -> int:
        """What changes when `folder`'s entries do: a real folder's mtime."""
        return os.stat(folder).st_mtime_ns

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.root)

    def _stat(self, path: Path) -> os.stat_result:
        return acl_stat(path, os.stat(path))

    def version_stat(self, path: Path, st: os.stat_result) -> os.stat_result:
        """An archive's lstat as its version is taken (nodes, index rows, trees): a folder
        archive's with its manifest's folded in, as the store it is opened with reports it
        (vfs.decant.archive_stat): rewritten in place, its own stat may not change."""
        return archive_stat(path, st)

    def _archive_stat(self, path: Path) -> os.stat_result:
        """`_stat` of an archive, as `version_stat` takes it."""
        return self.version_stat(path, self._stat(path))

    @property
    def writable(self) -> bool:
        return self.spool is not None

    def relpath(self, path: Path) -> str:
        """Presented path of a real folder or file of SRC ("" for SRC itself)."""
        return "" if path == self.root else path.relative_to(self.root).as_posix()

    def _spooled(self, folder: Path) -> dict[str, Node]:
        """Files written into this folder and not yet published: they win their names."""
        assert self.spool is not None
        reldir = self.relpath(folder)
        out = {}
        for name, st in self.spool.listdir(reldir):
            rel = f"{reldir}/{name}" if reldir else name
            if rel not in self.publishing:
                out[name] = spooled_node(self.spool.path(rel), rel, st)
        return out

    def _add_overlay(self, overlay: Any, folder: Path, out: dict[str, Node]) -> None:
        try:
            desc = overlay.describe(folder)
        except DecantError as exc:
            self._log_once(folder, f"{folder}: no {overlay.name} view: {exc}")
            return
        except Exception:
            log.exception("%s: %s view failed", folder, overlay.name)
            return
        if desc.name in out:
            self._log_once(folder, f"{folder}: {desc.name!r} exists; no {overlay.name} view")
            return
        st = acl_stat(folder, os.stat(folder))
        node = archive_node(overlay, folder, st, "", desc.root, "")
        node.version = _view_version(st, desc)
        document = getattr(overlay, "document", None)
        if document is not None:  # the view lists names read from it (member names, ids)
            read_from = desc.root.locator.get("read_from")
            node.mode &= _document_mask(folder, document, node.uid, node.gid, read_from)
        if desc.root.is_dir:
            self.trees.put(_tree_key(node), desc.root)
        out[desc.name] = node

    def _described(
        self, backend: Backend, path: Path, st: os.stat_result, listing: Listing
    ) -> Description | None:
        """`describe`, the tree of an archive shown as a folder handed to `trees` at once: a
        folder of many archives never holds all their trees (~650 B a member) together."""
        desc = self.describe(backend, path, st, listing)
        if desc is None or not desc.root.is_dir:
            return desc
        self.trees.put((str(path), backend.name, archive_version(st)), desc.root)
        return Description(desc.name, Entry(is_dir=True, xattrs=desc.root.xattrs))

    def describe(
        self, backend: Backend, path: Path, st: os.stat_result, listing: Listing | None = None
    ) -> Description | None:
        """The archive's description (persistent index first), or None to show it raw. A new
        one goes to the index at once, or, if it presents one file (a few hundred bytes), onto
        the listing's `kept` for the caller to `_keep` with its neighbours'."""
        self.archives_seen += 1
        if listing is not None and listing.recalled is not None and path not in listing.alone:
            cached = listing.recalled.get(path)
        else:
            cached = self._indexed(backend, path, st)
        if cached is not None:
            return cached
        if self._known_failed(backend, path, st):
            return None
        linked = self._linked(backend, path, st)
        if linked is not None:
            self._keep(path, [(path, index_key(backend), st.st_size, st.st_mtime_ns, linked,
                               st.st_ino, st.st_ctime_ns)])  # fmt: skip
            return linked
        key = (str(path), index_key(backend), archive_version(st))
        with self._flights:
            flight = self._in_flight.get(key)
            if flight is None:
                flight = self._in_flight[key] = _InFlight()
                mine = True
            else:
                mine = False
        if not mine:
            return self._described_once(flight, backend, path, st)
        try:
            desc = self._describe_fresh(backend, path, st)
            flight.desc, flight.done = desc, True
        finally:
            with self._flights:
                del self._in_flight[key]
            flight.event.set()
        if self.racy.note(path, st, archive_version(st)):
            return desc  # neither kept nor remembered as failed: described again soon
        if desc is None:
            self._note_failed(backend, path, st)
            return None
        row = (path, index_key(backend), st.st_size, st.st_mtime_ns, desc, st.st_ino,
               st.st_ctime_ns)  # fmt: skip
        if listing is not None and not desc.root.is_dir:  # a tree is let go at once (_described)
            listing.kept.append(row)
        else:
            self._keep(path, [row])
        return desc

    def _known_failed(self, backend: Backend, path: Path, st: os.stat_result) -> bool:
        """Whether this version of the archive failed to describe (shown raw): by its path, or,
        a file, by its inode (another link of it failed)."""
        if self._failed.get(hash(str(path))) == self._stamp(backend, st) != ():
            return True
        return (
            st.st_nlink > 1
            and stat.S_ISREG(st.st_mode)  # (a bucket's objects: 1)
            and self._failed_files.get(hash((st.st_dev, st.st_ino))) == _failed_as(backend, st)
        )

    def _note_failed(self, backend: Backend, path: Path, st: os.stat_result) -> None:
        """`_known_failed` from now on (both memos bounded by MAX_FAILED: then forgotten)."""
        stamp = self._stamp(backend, st)
        if not stamp:  # a folder archive: its own stamp tells nothing of what is inside
            return
        for memo in (self._failed, self._failed_files):
            if len(memo) >= MAX_FAILED:
                memo.clear()
        self._failed[hash(str(path))] = stamp
        self._failed_files[hash((st.st_dev, st.st_ino))] = _failed_as(backend, st)

    def _linked(self, backend: Backend, path: Path, st: os.stat_result) -> Description | None:
        """The description of another hard link of the archive in its folder, from the index,
        as this name's (`described_as`): each link was described in full, 0.9 s for a package
        of 20,000 members, so 100 links held a listing of their folder 92 s (red team 95 F4)."""
        described_as = getattr(backend, "described_as", None)
        if (described_as is None or self.index is None or st.st_nlink < 2
                or not stat.S_ISREG(st.st_mode)):  # fmt: skip
            return None  # (the index keeps no racy description: one found is of old bytes)
        try:
            found = self.index.get_linked(path, index_key(backend), st.st_size, st.st_mtime_ns,
                                          st.st_ino, st.st_ctime_ns)  # fmt: skip
        except (sqlite3.Error, ValueError) as exc:
            self._log_once(path, f"{path}: not looked up in the index ({exc})")
            return None
        return None if found is None else described_as(found, path)  # type: ignore[no-any-return]

    def _described_once(
        self, flight: _InFlight, backend: Backend, path: Path, st: os.stat_result
    ) -> Description | None:
        """The description another thread is making of the same version of the archive:
        waited for, not made twice at once (a listing read before the folder's lock is taken
        and the watcher's word of the same new archives each described them: twice the work,
        and two packages' trees in memory at once). Made here if that one failed."""
        flight.event.wait()
        if flight.done:
            return flight.desc
        return self._describe_fresh(backend, path, st)

    def presents_other_names(self, folder: Path) -> bool:
        """Whether an archive of `folder` presented, at its last listing, a name other than
        its own less `.zarr.zip` / `.zarr` (see `entries`)."""
        return folder in self._irregular

    def take_racy_due(self) -> dict[Path, set[str]]:
        """The names of archives described while they may have been mid-write, whose moment
        has passed, by folder (vfs.mount.racy): listed again, a description made of a
        half-written file (or its raw file, shown for a parse that failed) does not stay
        until the folder changes."""
        return self.racy.take_due()

    def racy_due(self, node: Node) -> bool:
        """Whether `node` was described from its archive while that may have been mid-write,
        and may be described again now for a description to trust."""
        return self.racy.due(node.real, node.version, node.uid)

    def doubt(self, node: Node) -> None:
        """`node`'s bytes did not hash to its description (a verification failed): its archive
        is described from the file again, not from the index, at its next open or soon after
        (as a racy one whose moment has passed). A description made of other bytes than the
        file holds now (one `write()` that ran longer than RACY_NS, a write through a shared
        mmap) is replaced, and that open gets ESTALE; a damaged archive describes the same and
        stays refused. Blocking: a worker thread's (the index)."""
        if node.backend is None:
            return
        if self.index is not None:
            try:
                self.index.forget_description(node.real, index_key(node.backend))
                if node.version:  # its links' too: `_linked` would take theirs back
                    self.index.forget_links(node.real, index_key(node.backend), node.version[0])
            except sqlite3.Error as exc:
                self._log_once(node.real, f"{node.real}: not forgotten in the index ({exc})")
        self.racy.doubt(node.real, node.version, node.uid)

    def refusal_hold(self, node: Node) -> float:
        """How long a failed verification of `node` is held (vfs.mount.refusals): until its
        archive changes. Its bytes are this disk's."""
        return math.inf

    def refetch(self, node: Node) -> bool:
        """Drop what is kept of `node`'s bytes from a slower store; whether there was one."""
        return False

    def _indexed(self, backend: Backend, path: Path, st: os.stat_result) -> Description | None:
        if self.index is None:
            return None
        try:
            return self.index.get(path, index_key(backend), st.st_size, st.st_mtime_ns,
                                  st.st_ino, st.st_ctime_ns)  # fmt: skip
        except (sqlite3.Error, ValueError) as exc:  # the index fails one name, not a folder
            self._log_once(path, f"{path}: not looked up in the index ({exc})")
            return None

    @staticmethod
    def _stamp(backend: Backend, st: os.stat_result) -> tuple[Any, ...]:
        """What an archive that failed is remembered by: it is not parsed again until this
        changes (a folder of junk named like archives would otherwise be re-read at every
        rescan of its folder). Not a folder archive's: files added deep inside one leave its
        own stamp as it was."""
        if stat.S_ISDIR(st.st_mode):
            return ()
        return (index_key(backend), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)

    def _recall(
        self, fd: int, archives: list[_Archive]
    ) -> tuple[dict[Path, Description], list[Any], set[Path]]:
        """The descriptions the index holds for `archives` (a listing then asks it no more);
        the small archive files among the rest, about to be described afresh, read ahead.
        `fd` is their folder's, reached without links: the names are opened in it, links not
        followed. With an empty `kept` for the listing, and the archives whose descriptions
        the index holds but are read one at a time (`DescriptionIndex.get_many`)."""
        known = self._indexed_many(archives)
        found: dict[Path, Description] = {}
        alone: set[Path] = set()
        for name, st, backend, path in archives:
            key = (str(path), index_key(backend))
            desc = known.get(key)
            if desc is not None:
                found[path] = desc
            elif key in known:
                alone.add(path)
            elif (stat.S_ISREG(st.st_mode) and st.st_size <= READ_AHEAD_MAX
                  and not self._known_failed(backend, path, st)):  # fmt: skip
                read_ahead(fd, name)
        return found, [], alone

    def _indexed_many(self, archives: list[_Archive]) -> dict[tuple[str, str], Description | None]:
        if self.index is None or not archives:
            return {}
        wanted = [(path, index_key(backend), st.st_size, st.st_mtime_ns, st.st_ino,
                   st.st_ctime_ns) for _n, st, backend, path in archives]  # fmt: skip
        try:
            return self.index.get_many(wanted)
        except (sqlite3.Error, ValueError) as exc:  # each is then described afresh
            self._log_once(archives[0][3].parent, f"{archives[0][3].parent}: not looked up "
                           f"in the index ({exc})")  # fmt: skip
            return {}

    def _keep(self, where: Path, rows: list[Any]) -> None:
        """New descriptions into the index; failing costs only a re-describe."""
        if self.index is None or not rows:
            return
        try:
            refused = self.index.put_many(rows)
        except (sqlite3.Error, ValueError) as exc:
            self._log_once(where, f"{where}: not kept in the index ({exc})")
            return
        for path, exc in refused:
            self._log_once(path, f"{path}: not kept in the index ({exc})")

    def _describe_fresh(
        self, backend: Backend, path: Path, listed: os.stat_result | None = None
    ) -> Description | None:
        """The backend's description, or None (logged once) when it cannot be served; of the
        archive `listed` (its version stat) where the backend can tell (`describe_listed`)."""
        describe_listed = getattr(backend, "describe_listed", None)
        try:
            if listed is not None and describe_listed is not None:
                desc = describe_listed(path, listed)
            else:
                desc = backend.describe(path)
        except DecantError as exc:
            if self._transient(exc):
                raise
            self._log_once(path, f"{exc} — shown as the raw file")
            return None
        except OSError as exc:
            self._log_once(path, f"{path}: cannot read ({exc}) — shown as the raw file")
            return None
        except Exception as exc:
            log.exception("%s: unexpected error describing the archive", path)
            self._log_once(path, f"{path}: {exc.__class__.__name__} — shown as the raw file")
            return None
        return desc

    def children_of_archive_node(self, node: Node) -> dict[str, Node]:
        """The presented children of a folder of an archive (or of a view), from its archive's
        tree: kept by `trees`, or read again for the version `node` was made from."""
        assert node.backend is not None and node.is_dir
        at = self.tree_of(node).walk(node.member)
        if at is None or not at.is_dir:
            raise _stale(node.real, f"has no folder {node.member!r} now")
        st = self._stat(node.real)
        rel = self._relative(node.real)
        kids = {}
        for name, child in at.children.items():
            problem = name_problem(name)
            if problem is not None:
                self._log_once(node.real, f"{node.real}: member {name[:80]!r} not shown: {problem}")
                continue
            member = f"{node.member}/{name}".lstrip("/")
            kids[name] = kid = archive_node(node.backend, node.real, st, member, child, rel)
            kid.version = node.version  # members share their archive's (or view's) identity
            if not child.is_dir and child.locator.get("bundle"):
                self._as_its_bundle(kid, node.real, child.locator["bundle"])
            elif not child.is_dir and node.backend in self.overlays:
                self._as_its_source(kid, node.real, member, child)
            elif child.locator.get("kind") == "folder" and node.backend in self.overlays:
                doc, read_from = str(child.locator.get("path", "")), child.locator.get("read_from")
                kid.mode &= _document_mask(node.real, doc, kid.uid, kid.gid, read_from)
        return kids

    @staticmethod
    def _as_its_source(kid: Node, root: Path, member: str, entry: Entry) -> None:
        """A view's file shown with the owner, group and read bits of the file (or image
        folder) in the collection it is read from, as a nested series member takes its
        bundle's: shown with the collection folder's, a decant archive kept 0600 there had its
        original's sha256 and name read with `getfattr` by anyone who may enter the collection
        (the open itself was refused: ops._may_read_through). One stat a file, as its folder is
        listed; one that cannot be reached from the collection is shown to its owner only."""
        reads_for = getattr(kid.backend, "reads_for", None)
        targets = reads_for(root, member, entry) if reads_for is not None else []
        try:
            if len(targets) != 1:
                raise FileNotFoundError(member)
            sst = stat_beneath(root, targets[0])  # no link followed on the way; ACL-narrowed
        except OSError:
            kid.mode &= 0o500
            return
        if not (stat.S_ISREG(sst.st_mode) or stat.S_ISDIR(sst.st_mode)):
            kid.mode &= 0o500
            return
        kid.mode = presented_mode(sst.st_mode, mode_mask_of(kid.backend), False) & 0o444
        kid.uid, kid.gid = sst.st_uid, sst.st_gid
        rel = entry.locator.get("path")
        if isinstance(rel, str):  # and no class that may not search a folder on the way
            kid.mode &= _document_mask(root, rel, kid.uid, kid.gid)
            documents = entry.locator.get("documents")
            if stat.S_ISDIR(sst.st_mode) and entry.locator.get("kind") == "decant":
                # A folder archive's original: its size and sha256 come from its manifest,
                # which keeps a mode of its own (as `_manifest_mask` for one listed in SRC).
                documents = [MANIFEST_KEY]
            for doc in documents if isinstance(documents, list) else []:
                # A synthesized TIFF's size is its image's shape and dtype, from these.
                if isinstance(doc, str):
                    kid.mode &= _document_mask(root, f"{rel.rstrip('/')}/{doc}", kid.uid, kid.gid)

    @staticmethod
    def _as_its_bundle(kid: Node, folder: Path, bundle: object) -> None:
        """A nested series member shown with its bundle's owner, group and read bits (its folder
        shown with the series folder's own, as in SRC): the bundle is what reading it reads, so
        `ls -l` and access() tell what an open allows (which checks the bundle again, on
        descriptors: ops._may_read_through). One lstat a member, as its folder is listed."""
        if not isinstance(folder, Path) or not isinstance(bundle, str) or "/" in bundle:
            return
        try:
            bst = acl_stat(folder / bundle, os.lstat(folder / bundle))
        except OSError:
            return  # opening it says what is wrong
        if stat.S_ISREG(bst.st_mode):
            kid.mode = presented_mode(bst.st_mode, mode_mask_of(kid.backend), False) & 0o444
            kid.uid, kid.gid = bst.st_uid, bst.st_gid

    def tree_of(self, node: Node) -> Entry:
        """The whole tree of the archive `node` is presented from (ESTALE: not as it was)."""
        return self.trees.get_or_load(_tree_key(node), lambda: self._reload_alone(node))

    def _reload_alone(self, node: Node) -> Entry:
        # One archive read back at a time: each costs ~2× its tree while parsed (~100 MiB for
        # a package of 100,000 members), and listings run on many worker threads at once.
        with self._reloading:
            return self._reload(node)

    def _reload(self, node: Node) -> Entry:
        """The tree of `node`'s archive read again (the persistent index first), and only as
        the version `node` was made from: a changed archive never lends its members to the
        folders listed from the one it replaced (ESTALE; its folder's rescan shows it anew)."""
        assert node.backend is not None
        path, backend = node.real, node.backend
        log.debug("%s: reading its %s description again", path, backend.name)
        if backend in self.overlays:
            st = os.stat(path)
            desc = backend.describe(path)
            if _view_version(st, desc) != node.version:
                raise _stale(path, "its view changed")
            return desc.root
        st = self._archive_stat(path)
        if archive_version(st) != node.version:
            raise _stale(path, "changed since it was listed")
        found = self.describe(backend, path, st)
        if found is None:
            raise _stale(path, "cannot be described now")
        if archive_version(self._archive_stat(path)) != node.version:
            raise _stale(path, "changed while it was read")
        return found.root

    def _relative(self, path: Path) -> str:
        """`path` as text relative to SRC ("." for SRC itself), or whole if not below it. By
        string, as `relative_to` gives it for these normalized paths: that took 7.3 ms of a
        listing of 1,000 archives (this 0.7 ms)."""
        text, root = str(path), str(self.root)
        if text == root:
            return "."
        prefix = root if root.endswith("/") else root + "/"
        return text[len(prefix) :] if text.startswith(prefix) else text


@dataclass
class _InFlight:
    """One description being made (`SourceTree.describe`): its waiters, and its result."""

    event: threading.Event = field(default_factory=threading.Event)
    desc: Description | None = None
    done: bool = False


def _failed_as(backend: Backend, st: os.stat_result) -> tuple[object, ...]:
    """What a file that failed to describe is known by with its inode (`_known_failed`)."""
    return (index_key(backend), st.st_size, st.st_mtime_ns, st.st_uid)


def _version_of(st: os.stat_result) -> tuple[int, ...]:
    """An archive's version as a listing stats it (`version_stat`): what a description made
    of it holds for."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_mode, st.st_uid)


def _tree_key(node: Node) -> TreeKey:
    """Where `trees` keeps the tree of `node`'s archive, as that version of it."""
    assert node.backend is not None
    return node.real_text, node.backend.name, node.version


def _manifest_mask(path: Path, listed: os.stat_result, uid: int, gid: int) -> int:
    """The mode bits a folder archive's presented entry (shown as `uid`:`gid`) may keep: its
    name, size and sha256 (xattrs) come from `.decant/manifest.json`, which keeps a mode of
    its own, so a class of users that may not read it there (or search the folder holding it)
    is shown no read or search bit. The kernel then refuses them `getxattr`, `access` and the
    open, as SRC would (an open checks every file of the folder again: ops._may_read_through).
    Walked by descriptors, no link followed, and judged only if the folder and manifest are
    the ones listed (`listed`, its version: vfs.decant.archive_stat): the owner of the folder
    holding it swapped in an archive of theirs, a readable manifest in it, between the
    description and this walk, and another user's manifest's sha256 was shown by its modes.
    Else nobody's bits (root's aside) until it is listed again. Two stats a listing."""
    held = _manifest_held(path, listed)
    return 0o7000 if held is None else _readers_mask(held[1:], uid, gid)


def _manifest_held(path: Path, listed: os.stat_result) -> list[os.stat_result] | None:
    """ACL-narrowed stats of a folder archive, its `.decant` folder and its manifest, walked
    by descriptors with no link followed; None if gone, or not the version listed."""
    folder_name, _sep, name = MANIFEST_KEY.partition("/")
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(path, flags | os.O_DIRECTORY))
        fds.append(os.open(folder_name, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(name, flags, dir_fd=fds[-1]))
        top, inner, manifest = (acl_stat(fd, os.fstat(fd)) for fd in fds)
    except OSError:
        return None  # gone since it was described
    finally:
        for fd in fds:
            os.close(fd)
    now = folded_stat(top, manifest)
    if (now.st_dev, now.st_ino, now.st_ctime_ns) != (
        listed.st_dev, listed.st_ino, listed.st_ctime_ns
    ):  # fmt: skip
        return None
    return [top, inner, manifest]


def _document_mask(root: Path, rel: str, uid: int, gid: int, read_from: object = None) -> int:
    """`_manifest_mask` for a document at any depth below `root` (an AcqStore member's
    analyses.json, whose analysis ids a view shows as folder names): no read or search bit
    for a class that may not read it there, or search a folder on the way. Walked from `root`
    by descriptors, no link followed, and judged only if it is the file the view read
    (`read_from`, its [st_dev, st_ino], where known): the owner of a folder on the way swapped
    in a folder of theirs, a readable document in it, between the view's read and this walk,
    and the view's names were shown by its modes. Else nobody's bits (root's aside) until the
    view is built anew. A stat a folder."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        return 0o7000
    held: list[os.stat_result] = []
    try:
        path = root.joinpath(*parts)
        dfd = parent_fd(root, path, lambda fd: held.append(acl_stat(fd, os.fstat(fd))))
        try:
            fd = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            held.append(acl_stat(fd, os.fstat(fd)))
        finally:
            os.close(fd)
    except OSError:
        return 0o7000  # gone since the view was built
    doc = held[-1]
    if not (stat.S_ISREG(doc.st_mode) or stat.S_ISDIR(doc.st_mode)):  # a TIFF's image folder
        return 0o7000
    if isinstance(read_from, list) and read_from != [doc.st_dev, doc.st_ino]:
        return 0o7000
    return _readers_mask(held[1:], uid, gid)  # `root` itself: the kernel checks its own node


def _readers_mask(held: list[os.stat_result], uid: int, gid: int) -> int:
    """The mask of a node shown as `uid`:`gid` whose content was read from the file `held[-1]`
    (ACL-narrowed stats, the folders on its way before it): each class of the node keeps its
    read and search bits only if every user in it may search those folders and read the file
    in SRC. Their owners and groups need not be the node's (a collection's owner lists another
    user's private `analyses.json` in it; judged by the same class of bits, that owner was
    shown its ids): the node's owner is judged as that user, its group and others by every
    class of the file that may hold one of them."""
    owner_groups: set[int] | None = None
    mask = 0o7777
    for n, st in enumerate(held):
        need = 4 if n == len(held) - 1 else 1
        if st.st_uid == uid:
            mine = 6
        elif (st.st_mode >> 3) & need == st.st_mode & need:
            mine = 0  # group and other grant alike: the user's groups need no lookup
        else:
            if owner_groups is None:  # a user-database lookup: only where the answer differs
                owner_groups = user_groups(uid)
            mine = 3 if st.st_gid in owner_groups else 0
        theirs = {6} if st.st_uid != uid else set()
        classes = {6: {mine}, 3: {3} | theirs, 0: {0} | theirs}
        if st.st_gid != gid:  # the node's group and others may be in the file's group or not
            classes[3] |= {0}
            classes[0] |= {3}
        for shift, of_file in classes.items():
            if not all((st.st_mode >> c) & need for c in of_file):
                mask &= ~(0o5 << shift)
    return mask


def _view_version(st: os.stat_result, desc: Description) -> tuple[int, int]:
    """A view changes when documents inside its folder do, not the folder itself: its nodes are
    keyed by its content, so a rebuilt view gets fresh inodes."""
    digest = hashlib.sha256(json.dumps(desc.to_json(), sort_keys=True).encode()).digest()
    return (st.st_ino, int.from_bytes(digest[:8], "big"))


def _stale(path: Path, why: str) -> OSError:
    return OSError(errno.ESTALE, f"{path}: {why}")


def index_key(backend: Backend) -> str:
    """A backend whose describe() grew stricter raises its version: old descriptions miss."""
    return f"{backend.name}@{getattr(backend, 'describe_version', 1)}"


def _related(name: str) -> set[str]:
    """The names whose real entries can decide what is presented under `name` in a folder
    whose archives present their own names: itself, its archives, the name an archive shows."""
    out = {name, f"{name}.zarr.zip", f"{name}.zarr"}
    for suffix in (".zarr.zip", ".zarr"):
        if name.endswith(suffix) and len(name) > len(suffix):
            out.add(name[: -len(suffix)])
    return out


def read_ahead(folder_fd: int, name: str) -> None:
    """Ask the kernel to start reading file `name` of the folder into its page cache, without
    waiting (POSIX_FADV_WILLNEED); a link, or anything that fails, is left alone. O_NONBLOCK:
    a FIFO swapped in for the file since it was listed does not hang the open."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=folder_fd)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.posix_fadvise(fd, 0, READ_AHEAD_MAX, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
