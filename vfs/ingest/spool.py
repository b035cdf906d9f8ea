"""The spool: files written into the mount, kept on SRC's filesystem until they are published.

A spooled file lives at `SPOOL/files/<relpath>` — its presented path — so the spool tree is its
own journal: a rename in the mount is one rename here, metadata (mode, owner, mtime) sits on the
file itself, and after a crash every file still in the tree is simply work not yet published.
Synchronous and FUSE-free; the pack queue calls `attempt`/`publish` (vfs/ingest/publish.py) in
worker threads.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from vfs.acl import acl_stat, inherit_default
from vfs.beneath import not_listed, not_shown, open_beneath, parent_fd, rename_noreplace
from vfs.decant import TEMP_PREFIX, temp_name
from vfs.ingest.publish import Outcome, Published, archive_name, attempt, placing_lock, publish
from vfs.ingest.publish import signature as file_signature
from vfs.walk import MAX_WALK_DEPTH, walk

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions
    from vfs.ingest.publish import Placer

log = logging.getLogger(__name__)
T = TypeVar("T")

# rsync writes `.name.XXXXXX` and renames it into place when the transfer is done.
_TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9]{6}$")
STAGING = Path(".decant-spool") / "staging"
__all__ = ["Outcome", "Published", "Spool", "archive_name", "is_temp_name", "remove_orphans"]


def is_temp_name(name: str) -> bool:
    """rsync's `.NAME.XXXXXX`: never published as data (see the pack queue)."""
    return bool(_TEMP_NAME.match(name))


class Spool:
    def __init__(
        self, src: Path, files: Path, staging: Path | None = None, *, trusted: bool = False
    ) -> None:
        """`files` holds spooled files at their presented relpaths (SPOOL/files, or an inbox).
        `staging` (default SRC/.decant-spool/staging, on SRC's filesystem) is where archives
        and plain copies are built before one rename puts them into their folder. `trusted`:
        an inbox, whose files only the daemon's user can put there (vfs.mount.daemon checks):
        they are published over what they find."""
        self.src = src
        self.trusted = trusted
        self.files = files
        # Pages larger than this are archived verbatim (the daemon sets half its cache: a
        # plane is decoded whole, to pack it and to read it).
        self.max_plane: int | None = None
        self.max_segments: int | None = None  # strips/tiles: more go verbatim (the same)
        self.staging = staging or src / STAGING
        self.files.mkdir(mode=0o700, parents=True, exist_ok=True)  # see daemon._check_private
        # (st_dev, st_ino) of what publishing each relpath put into SRC, until its spooled
        # name goes: that entry is the file's own copy, not an older version it replaces.
        # Written and read under the placing lock.
        self._placed: dict[str, tuple[int, int]] = {}
        # What publishing each relpath written through the mount may replace or set aside at
        # its name and its archive name: the entries (st_dev, st_ino) the mount showed under
        # its name when it was created, renamed or reopened (WriteSide._check_free). Anything
        # there since was never checked against the writer. No entry: not written through
        # the mount (an inbox), or spooled before a restart.
        self._may_replace: dict[str, frozenset[tuple[int, int]]] = {}
        # The inode number of the SRC folder each relpath was written into through the mount
        # (the folder the kernel checked the writer against): publishing into another folder
        # at that path (one renamed over it since) needs the writer's own right to add
        # entries there (publish._refuse_unchecked; red team 67, F1). Same life as above.
        self._folders: dict[str, int] = {}
        self.placer: Placer | None = None  # None: published into SRC on local disk

    def path(self, relpath: str) -> Path:
        return self.files / relpath

    def relpath(self, path: Path) -> str:
        return path.relative_to(self.files).as_posix()

    def listdir(self, reldir: str) -> list[tuple[str, os.stat_result]]:
        """Spooled regular files directly in the presented folder `reldir`. A file that goes
        while the folder is read (published meanwhile) is left out, and only it: ending the
        listing there dropped every name read after it from the mount's listing, rsync's
        temp names too, whose renames then failed with ENOENT."""
        folder = self.files / reldir if reldir else self.files
        out = []
        try:
            with os.scandir(folder) as it:
                for de in it:
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        out.append((de.name, st))
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def create(self, relpath: str, mode: int, uid: int, gid: int) -> int:
        """Create (or truncate) a spooled file; returns an fd open for reading and writing."""
        return self.create_stat(relpath, mode, uid, gid)[0]

    def create_stat(
        self, relpath: str, mode: int, uid: int, gid: int
    ) -> tuple[int, os.stat_result]:
        """`create`, returning the fd and the file's stat. Mode and owner are set only where
        the open did not give them already (rsync creates every file 0600 as the caller: two
        syscalls fewer per file)."""
        path = self.path(relpath)
        perm = stat.S_IMODE(mode) | 0o600
        made: list[bool] = []
        fd: int = _into_folder(path, lambda: self._create_or_truncate(path, perm, made))
        try:
            st = os.fstat(fd)
            changed = False
            if stat.S_IMODE(st.st_mode) != stat.S_IMODE(mode):
                os.fchmod(fd, stat.S_IMODE(mode))
                changed = True
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
                changed = True
            if made and self._inherit(relpath, fd, stat.S_IMODE(mode)):
                changed = True
            st = os.fstat(fd) if changed else st
            return fd, acl_stat(fd, st)
        except BaseException:
            os.close(fd)
            raise

    def _inherit(self, relpath: str, fd: int, mode: int) -> bool:
        """The new spooled file takes the access ACL that the default ACL of its SRC folder
        gives a file made there (vfs.acl.inherit_default): it is published by linking this
        very inode, and went into SRC with no ACL, readable by a user the folder's default
        ACL denies. Whether the folder has one. A bucket's folders have none (an ObjectPath
        SRC: no local folder to look at)."""
        if not isinstance(self.src, Path):
            return False
        try:
            dfd = parent_fd(self.src, self.src / relpath)  # no link followed on the way
        except OSError:
            return False
        try:
            return inherit_default(f"/proc/self/fd/{dfd}", fd, mode)
        finally:
            os.close(dfd)

    def _create_or_truncate(self, path: Path, perm: int, made: list[bool] | None = None) -> int:
        """A new file (noted in `made`), or the daemon's own spooled file there truncated,
        reached with no link followed (vfs/beneath.py). With a plain O_TRUNC, a link there (a
        user's folder of links in the spool) was followed, its target truncated, then chmod-ed
        and chown-ed to the caller; another name of a file truncated that file too: EEXIST for
        those."""
        try:
            fd = open_beneath(self.files, path, os.O_RDWR | os.O_CREAT | os.O_EXCL, perm)
        except FileExistsError:
            pass
        else:
            if made is not None:
                made.append(True)
            return fd
        fd = open_beneath(self.files, path, os.O_RDWR | os.O_NONBLOCK)  # a link: ELOOP
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                why = f"holds another entry ({stat.filemode(st.st_mode)}, {st.st_nlink} names)"
                raise FileExistsError(errno.EEXIST, why, str(path))
            os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def rename(
        self, old: str, new: str, may_replace: frozenset[tuple[int, int]] | None = None
    ) -> None:
        """Move a spooled file or folder; what its files may replace moves along, or for a
        file is `may_replace` (what the mount showed under the new name)."""
        source, target = self.path(old), self.path(new)
        _into_folder(target, lambda: os.replace(source, target), source)
        inside = old + "/"
        for rel in [r for r in list(self._may_replace) if r == old or r.startswith(inside)]:
            self._may_replace[new + rel[len(old) :]] = self._may_replace.pop(rel)
        for rel in [r for r in list(self._folders) if r.startswith(inside)]:
            self._folders[new + rel[len(old) :]] = self._folders.pop(rel)
        self._folders.pop(old, None)  # a file: the caller notes the folder it goes into
        # A folder's files just published took their archives along (SRC's folder was renamed
        # too): each is still its file's own copy. Left under the old paths, the files were
        # refused their own archives ("put there after ... written"), failed for good.
        for rel in [r for r in list(self._placed) if r.startswith(inside)]:
            self._placed[new + rel[len(old) :]] = self._placed.pop(rel)
        if may_replace is not None:
            self._may_replace[new] = may_replace

    def allow_replacing(self, relpath: str, entries: frozenset[tuple[int, int]]) -> None:
        self._may_replace[relpath] = entries

    def written_into(self, relpath: str, folder_ino: int) -> None:
        """`relpath` was written (created, moved, reopened) into the SRC folder of this inode."""
        if folder_ino:
            self._folders[relpath] = folder_ino

    def folder_written_into(self, relpath: str) -> int | None:
        return self._folders.get(relpath)

    def may_replace(self, relpath: str) -> frozenset[tuple[int, int]] | None:
        """What publishing `relpath` may replace (see __init__); None: not recorded."""
        allowed = self._may_replace.get(relpath)
        placed = self._placed.get(relpath)  # its own earlier copy, published again
        return allowed if allowed is None or placed is None else allowed | {placed}

    def adopt(
        self, real: Path, relpath: str, root: Path | None = None, ino: int = 0, uid: int = -1
    ) -> None:
        """Move a real file of SRC into the spool (a real file renamed or reopened for writing).
        With `root` (SRC), its folder is reached without following links, and anything but a
        regular file (a link or FIFO swapped in by the folder's owner) is put back, refused;
        with `ino` (and `uid`), so is another file than the one listed (ESTALE: see Node.ino)."""
        target = self.path(relpath)
        dfd = parent_fd(root or real.parent, real)
        try:
            if _same_file(target, real.name, dfd):
                # Just published by a hard link, its spooled name not yet gone: rename()
                # between two links of one file does nothing, so the file stayed in SRC while
                # the mount took it for spooled, and the spooled name went (ENOENT at every
                # open and stat of an existing file). The SRC name goes instead; the queue
                # keeps the spooled one (`remove`: its ctime moved) and publishes it anew.
                os.unlink(real.name, dir_fd=dfd)
                return
            _into_folder(target, lambda: os.replace(real.name, target, src_dir_fd=dfd), real)
            st = target.lstat()
            if not stat.S_ISREG(st.st_mode):
                self._put_back(target, real.name, dfd)
                raise not_shown(real, st)
            if not_listed(st, ino, uid):
                self._put_back(target, real.name, dfd)
                raise OSError(errno.ESTALE, "not the file listed (replaced since)", str(real))
            self.written_into(relpath, os.fstat(dfd).st_ino)
        finally:
            os.close(dfd)

    def _put_back(self, taken: Path, name: str, dfd: int) -> None:
        """Return what `adopt` took that is not a regular file (a link, FIFO or folder its
        folder's owner swapped in) to that folder: under its name, or, taken since, under a
        fresh temp name beside it. Never left among spooled files: a folder of theirs there was
        walked as spooled files (and published), and a descriptor they kept of it let them put
        links (to /etc) in root's spool, where the daemon works by path (the unlink meant to
        drop it failed: EISDIR). Never over an entry made at that name since (another user's,
        in a sticky folder): renameat2(RENAME_NOREPLACE); a fresh temp name where the
        filesystem lacks it. Failing both (their folder removed meanwhile), it is kept
        in the spool's own folder, which nothing walks, and logged; never deleted as root."""
        try:
            rename_noreplace(taken, name, dfd)
            return
        except OSError:
            pass
        with suppress(OSError):
            os.rename(taken, temp_name(name), dst_dir_fd=dfd)  # a name nobody could have made
            return
        kept = self.files.parent / temp_name("taken")
        os.rename(taken, kept)
        log.warning("%s: swapped in by its folder's owner, could not be put back; kept", kept)

    def walk(self) -> dict[str, os.stat_result]:
        """Every spooled file, by relpath (as deep as a path can reach: SPOOL_DEPTH)."""
        out: dict[str, os.stat_result] = {}
        for folder, _dirs, names in walk(self.files, SPOOL_DEPTH, _too_deep):
            for name in names:
                path = Path(folder) / name
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[self.relpath(path)] = st
        return out

    def prune_dirs(self, reldir: str) -> None:
        """Remove empty spool folders from `reldir` up (never the spool root). Not over a
        bucket: there a folder made through the mount is its spool folder for good (a bucket
        keeps no mode or owner of a prefix; its mode and owner are the spool folder's)."""
        if self.placer is not None:
            return
        folder = self.files / reldir
        while folder != self.files and self.files in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        relpath: str,
        pack_all: bool,
        options: PackOptions | None,
        cancel: threading.Event | None = None,
        durable: bool = True,
    ) -> Published:
        """Put the spooled file into SRC (see `vfs.ingest.publish`); the spooled name is left for
        the caller to remove, so the mount can switch to the published file first."""
        return publish(self, relpath, pack_all, options, cancel, durable)

    def attempt(
        self,
        relpath: str,
        pack_all: bool,
        options: PackOptions | None,
        settle: float,
        cancel: threading.Event | None = None,
    ) -> Outcome:
        """`publish` if the file has settled on disk; never raises (see `publish.attempt`)."""
        return attempt(self, relpath, pack_all, options, settle, cancel)

    def set_aside(self, relpath: str) -> Path | None:
        """Move the spooled file `relpath` to a staging name, for the caller to delete once the
        rename of a real file over its name is made (or to put back if that fails): a crash
        in between loses only what the rename replaces (`clear_staging` deletes it at the next
        start). Dropped after the rename instead, a crash between the two left the spooled
        file in place, and the next start published it over the renamed file: its bytes were
        gone (red team 59, F3). None if there is none, or it cannot be moved there."""
        path = self.path(relpath)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
            self.staging.mkdir(mode=0o700, parents=True, exist_ok=True)
            aside = self.staging / temp_name("replaced")
            os.rename(path, aside)
        except OSError:
            return None  # dropped after the rename, as `discard` does
        return aside

    def clear_staging(self) -> list[Path]:
        """What a crash left in the staging folder: never published, safe to delete."""
        removed = []
        if self.staging.is_dir():
            for path in self.staging.iterdir():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed.append(path)
        return removed

    def mark_placed(self, relpath: str, st: os.stat_result) -> None:
        self._placed[relpath] = (st.st_dev, st.st_ino)

    def placed_ident(self, relpath: str) -> tuple[int, int] | None:
        """(st_dev, st_ino) of what publishing `relpath` placed, until its spooled name goes."""
        return self._placed.get(relpath)

    def placed_copy(self, relpath: str, path: Path) -> bool:
        """Is the entry at `path` what publishing `relpath` put there (a hard link of it, or
        the archive or copy made of it), rather than an older version it replaces?"""
        try:
            st = path.lstat()
        except FileNotFoundError:
            return True
        ident = (st.st_dev, st.st_ino)
        if ident == self._placed.get(relpath):
            return True
        try:
            mine = self.path(relpath).lstat()
        except FileNotFoundError:
            return False
        return ident == (mine.st_dev, mine.st_ino)

    def discard(self, relpath: str) -> bool:
        """Delete the spooled file `relpath` if there is one (a file renamed or deleted over
        its name through the mount); True if there was."""
        self._placed.pop(relpath, None)
        self._may_replace.pop(relpath, None)
        self._folders.pop(relpath, None)
        try:
            os.unlink(self.path(relpath))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return False
        self.prune_dirs(str(Path(relpath).parent))
        return True

    def remove_many(self, done: list[tuple[str, tuple[int, ...]]]) -> list[bool]:
        """`remove` for a batch of (relpath, signature): one worker-thread call, not one each."""
        return [self.remove(relpath, sig) for relpath, sig in done]

    def remove(
        self,
        relpath: str,
        signature: tuple[int, ...] = (),
        prune: bool = True,
        placed: tuple[Path, tuple[int, int]] | None = None,
    ) -> bool:
        """Delete a spooled file; with `signature`, only if it is still the file that was
        published (not one renamed over it since). False if it was kept. Without `prune`
        the caller removes emptied folders (`prune_dirs`), once per folder for a batch.
        `placed`: where publishing put the file and what it placed there; a spooled file that
        is what was placed (a hard link) is kept unless that name still holds it."""
        path = self.path(relpath)
        if signature:
            # Checked and unlinked under the placing lock: `adopt` (a write to the published
            # link of this very file) unlinks the SRC name under it, leaving the spooled name
            # the file's only one. Its ctime moved, but maybe not in the same clock tick:
            # the SRC name is looked at too.
            with placing_lock():
                try:
                    st = path.stat()
                except FileNotFoundError:
                    return True
                if file_signature(st) != signature or _taken_back(st, placed):
                    return False
                path.unlink(missing_ok=True)
        else:
            path.unlink(missing_ok=True)
        self._placed.pop(relpath, None)
        self._may_replace.pop(relpath, None)
        self._folders.pop(relpath, None)
        if prune:
            self.prune_dirs(str(Path(relpath).parent))
        return True


def _taken_back(st: os.stat_result, placed: tuple[Path, tuple[int, int]] | None) -> bool:
    """Is the spooled file (`st`) what was placed at `placed`, and no longer there?"""
    if placed is None or (st.st_dev, st.st_ino) != placed[1]:
        return False
    try:
        there = placed[0].lstat()
    except OSError:
        return True
    return (there.st_dev, there.st_ino) != placed[1]


def _same_file(spooled: Path, name: str, dfd: int) -> bool:
    """Is the spooled file at `spooled` the very file `name` is in the folder `dfd`?"""
    try:
        mine = spooled.lstat()
        there = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(mine.st_mode) and os.path.samestat(mine, there)


def _into_folder(target: Path, make: Callable[[], T], source: Path | None = None) -> T:
    """make() something at `target` in the spool, making its folder when it is missing: a
    folder not spooled into yet, or one a publish just pruned as empty (so, a few times).
    FileNotFoundError when `source` is the missing one."""
    for _ in range(3):
        try:
            return make()
        except FileNotFoundError:
            if source is not None and not os.path.lexists(source):
                raise
            make_folders(target.parent)
    return make()


def make_folders(folder: Path) -> None:
    """`folder.mkdir(parents=True, exist_ok=True)` one level at a time: pathlib recurses once
    per missing level, and a file created thousands of folders deep needs that many. Each is
    made 0755 whatever the daemon's umask: over a bucket a spool folder's mode is the folder's
    shown mode (BucketTree._dir_stat), and one made 0777 under umask 0 let every local user
    add files to a folder of the bucket."""
    missing = []
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for level in reversed(missing):
        try:
            level.mkdir(0o755)
        except FileExistsError:
            continue
        os.chmod(level, 0o755)


# The write side makes a spooled file's folders by path, so none is deeper than a path of
# PATH_MAX bytes reaches: a walk of the spool goes that deep (scandir fails past PATH_MAX, and
# the walk skips what it cannot list). Housekeeping walks of SRC stop at MAX_WALK_DEPTH; the
# spool's did too, and files spooled below it before a crash were neither published nor
# reported after the restart (red team 53).
SPOOL_DEPTH = 4096 // 2

_TOLD_DEEP: set[Path] = set()  # folders already reported: the inbox is walked every few seconds


def _too_deep(folder: Path) -> None:
    if folder in _TOLD_DEEP or len(_TOLD_DEEP) >= 100:
        return
    _TOLD_DEEP.add(folder)
    log.warning("%s: folders below it are more than %d levels deep; left alone",
                folder, MAX_WALK_DEPTH)  # fmt: skip


def remove_orphans(src: Path, skip: Path) -> list[Path]:
    """Temp archives left by a crash mid-pack: never published, safe to delete. Only regular
    files of the daemon's own user named as the packer names them go (reached without links):
    anyone who may write a folder can rename a folder there to a temp name, so folders (a
    folder archive's temp) are left in place, as are other users' files."""
    removed = []
    for here, dirs, names in walk(src, too_deep=_too_deep):
        found = [n for n in [*names, *dirs] if n.startswith(TEMP_PREFIX)]
        dirs[:] = [d for d in dirs if here / d != skip and not d.startswith(TEMP_PREFIX)]
        for name in found:
            path = here / name
            if _ORPHAN.match(name) is None:
                log.info("%s: not a temp name of the packer; left alone", path)
            elif _remove_own_file(src, path):
                removed.append(path)
            else:
                log.info("%s: not a regular file of the daemon's user; left alone", path)
    return removed


_ORPHAN = re.compile(re.escape(TEMP_PREFIX) + r"[0-9]+-[0-9a-f]{8}(-|$)")


def _remove_own_file(src: Path, path: Path) -> bool:
    """Unlink `path` (reached from `src` without links) if it is a regular file of our user."""
    try:
        dfd = parent_fd(src, path)
    except OSError:
        return False
    try:
        st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        os.unlink(path.name, dir_fd=dfd)
        return True
    except OSError:
        return False
    finally:
        os.close(dfd)
