"""What writing through the mount does to SRC and the spool: the rules, without FUSE.

Every call is synchronous (the FUSE layer runs it in a worker thread) and refuses with an
OSError carrying the errno the writer should see. New data (a create, a write or truncate that
grows a file, a mkdir) is refused with ENOSPC while the spool's filesystem is below its reserve
(`SpaceGuard`, `--min-free`). Changes to SRC's folders hold the publisher's placing lock, so a
publish putting a folder's mtime back never undoes a change made meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vfs.acl import acl_stat, acl_stat_at
from vfs.beneath import entry_path, not_listed, not_shown, parent_fd
from vfs.decant import archive_stat
from vfs.ingest.publish import (
    NOTHING_THERE,
    archive_name,
    folder_archive_name,
    placing_lock,
    remove_tree,
    set_aside,
)
from vfs.ingest.space import SpaceGuard
from vfs.ingest.spool import Spool
from vfs.ingest.writing import Writers
from vfs.nodes import Node, archive_version, mirror_node, spooled_node
from vfs.written import mark_written


def refuse(code: int, what: str) -> OSError:
    return OSError(code, os.strerror(code), what)


@dataclass(frozen=True)
class Attrs:
    """The fields of a setattr call that were set (None: leave as is)."""

    size: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None


log = logging.getLogger(__name__)

ADOPTED_PRUNE = 1024  # marks of published files being rewritten kept before a prune
# In the spool's own folder: the (st_dev, st_ino) of each published file moved into the spool
# to be written, one per line, so that the mark survives a restart (see WriteSide._adopted).
ADOPTED_JOURNAL = "adopted"


class WriteSide:
    def __init__(
        self,
        root: Path,
        spool: Spool,
        allow_delete: bool = False,
        guard: SpaceGuard | None = None,
    ) -> None:
        self.root = root
        self._root_text = str(root).rstrip("/") + "/"  # str: a bucket's root is no local path
        self.spool = spool
        self.allow_delete = allow_delete
        self.guard = guard
        # Published files moved back into the spool to be written (`open_for_write`), by
        # relpath, with the identity of the spooled file: without --allow-delete, deleting one
        # deletes a published file and is refused like any. Checked against the spool on use
        # (a published or replaced one no longer matches) and pruned as it grows. Kept in
        # memory only, a restart while one was spooled let its deletion through without
        # --allow-delete (red team 59, F4): each is noted in a journal in the spool's folder
        # too, and found again at start by its identity (`_load_adopted`).
        self._adopted: dict[str, tuple[int, int]] = {}
        self._adopted_prune_at = ADOPTED_PRUNE
        self._journal = spool.files.parent / ADOPTED_JOURNAL
        if not allow_delete:
            self._load_adopted()
        self.writers = Writers()  # marks spooled files while open for writing: see writing.py

    def _need_room(self, nbytes: int, what: str) -> None:
        if self.guard is not None and not self.guard.admit(nbytes):
            raise refuse(errno.ENOSPC, f"{what}: below the free-space reserve (--min-free)")

    def _relpath(self, path: Path) -> str:
        """Presented path of a real folder or file of SRC ("" for SRC itself)."""
        text, root = os.fspath(path), self._root_text
        if text.startswith(root):  # strings, not Path.relative_to: this runs per create
            return text[len(root) :]
        return "" if path == self.root else path.relative_to(self.root).as_posix()

    def _folder(self, parent: Node) -> str:
        """The presented path of a folder new entries may go into (a real folder of SRC)."""
        if not parent.is_dir or parent.backend is not None:
            raise refuse(errno.EPERM, f"{parent.real}: archive contents cannot be written")
        return self._relpath(parent.real)

    def _rel(self, parent: Node, name: str) -> str:
        folder = self._folder(parent)
        return f"{folder}/{name}" if folder else name

    def create(self, parent: Node, name: str, mode: int, uid: int, gid: int) -> tuple[Node, int]:
        rel = self._rel(parent, name)
        self._need_room(0, rel)
        self._check_free(parent, name, (), is_dir=False)
        if parent.mode & stat.S_ISGID:  # a setgid folder: its group, as any local filesystem
            gid = parent.gid
        fd, st = self.spool.create_stat(rel, mode, uid, gid)
        self.writers.opened(fd)
        self.spool.allow_replacing(rel, frozenset())  # nothing was there: nothing to replace
        self.spool.written_into(rel, parent.ino)
        return spooled_node(self.spool.path(rel), rel, st), fd

    def write(self, fd: int, data: bytes, offset: int, rel: str) -> int:
        """pwrite into a spooled file; near the reserve, only writes within its size and its
        data pass (a hole written into takes new blocks, as a write past the end does)."""
        room = self.guard is None or self.guard.admit(len(data))
        end = offset + len(data)
        if not room and (end > os.fstat(fd).st_size or _hole_within(fd, offset, end)):
            raise refuse(errno.ENOSPC, f"{rel}: below the free-space reserve (--min-free)")
        return os.pwrite(fd, data, offset)

    def open_for_write(self, node: Node, flags: int) -> tuple[Node, int]:
        """An fd on the spooled file behind `node`; a real plain file is moved into the spool
        first (it will be published again once settled)."""
        if node.backend is not None:
            raise refuse(errno.EPERM, f"{node.real}: archived originals are not written in place")
        if not node.spooled:
            rel = self._relpath(node.real)
            noted = None
            if not self.allow_delete:
                # In the journal before it moves (a rename keeps the inode): noted after, a
                # kill in between let its deletion through after the restart (red team 60, F4).
                with contextlib.suppress(OSError):
                    before = os.lstat(node.real)
                    noted = (before.st_dev, before.st_ino)
                    self._note_in_journal([noted])
            with placing_lock():
                self.spool.adopt(node.real, rel, self.root, node.ino, node.uid)
                # The file itself left SRC; an archive of its name was never shown as it.
                self.spool.allow_replacing(rel, frozenset())
            st = self.spool.path(rel).stat()
            node = spooled_node(self.spool.path(rel), rel, st)
            if not self.allow_delete:
                self._remember_adopted(rel, st, journaled=noted == (st.st_dev, st.st_ino))
        # No link followed, no FIFO waited on: see vfs/beneath.py (adopt refuses those too).
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | (flags & (os.O_TRUNC | os.O_APPEND))
        fd = os.open(node.real, flags)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise not_shown(node.real, st)
        os.set_blocking(fd, True)
        self.writers.opened(fd)
        return spooled_node(node.real, node.spooled, st), fd

    def setattr(self, node: Node, attrs: Attrs) -> Node:
        if node.backend is not None and (node.member or attrs.size is not None):
            raise refuse(errno.EPERM, f"{node.real}: archived originals are read-only")
        if attrs.size is not None and not node.spooled and not node.is_dir:
            node, fd = self.open_for_write(node, 0)
            self.writers.closed(fd)  # no handle: its write mark goes with it
            os.close(fd)
        path = node.real
        if attrs.size is not None:
            if attrs.size > os.stat(path).st_size:
                self._need_room(0, node.spooled or str(path))  # a hole, but new data to come
            os.truncate(path, attrs.size)
        if node.spooled:
            return self._set_spooled(node, path, attrs)
        if node.is_dir:
            with placing_lock():  # rsync setting a folder's mtime, while a publish restores it
                return self._set(node, path, attrs)
        return self._set(node, path, attrs)

    def _set_spooled(self, node: Node, path: Path, attrs: Attrs) -> Node:
        """`_set` on a spooled file by its path: the spool is the daemon's own private folder
        (0700, checked at start), where nobody else can swap in a link, so the walk from SRC
        without links (`entry_path`: 5-6 opens a call) is not needed. rsync sets mode and times
        on every file it copies: this ran twice per file."""
        if attrs.mode is not None:
            os.chmod(path, stat.S_IMODE(attrs.mode))
        if attrs.uid is not None or attrs.gid is not None:
            os.chown(path, -1 if attrs.uid is None else attrs.uid,
                     -1 if attrs.gid is None else attrs.gid, follow_symlinks=False)  # fmt: skip
        if attrs.atime_ns is not None or attrs.mtime_ns is not None:
            atime, mtime = attrs.atime_ns, attrs.mtime_ns
            if atime is None or mtime is None:
                st = os.stat(path, follow_symlinks=False)
                atime = st.st_atime_ns if atime is None else atime
                mtime = st.st_mtime_ns if mtime is None else mtime
            os.utime(path, ns=(atime, mtime), follow_symlinks=False)
        return spooled_node(
            path, node.spooled, acl_stat(path, os.stat(path, follow_symlinks=False))
        )

    def _set(self, node: Node, path: Path, attrs: Attrs) -> Node:
        # Never a link's target, nor another file than the one listed: vfs/beneath.py
        with entry_path(self.root, path, node.ino, node.uid) as target:
            # A folder archive's version has its manifest's stat folded in (archive_stat).
            before = archive_stat(target, os.stat(target)) if node.version else None
            if attrs.mode is not None:
                os.chmod(target, stat.S_IMODE(attrs.mode))
            if attrs.uid is not None or attrs.gid is not None:
                os.chown(target, -1 if attrs.uid is None else attrs.uid,
                         -1 if attrs.gid is None else attrs.gid)  # fmt: skip
            if attrs.atime_ns is not None or attrs.mtime_ns is not None:
                st = os.stat(target)
                atime = st.st_atime_ns if attrs.atime_ns is None else attrs.atime_ns
                mtime = st.st_mtime_ns if attrs.mtime_ns is None else attrs.mtime_ns
                os.utime(target, ns=(atime, mtime))
            if before is not None and archive_version(before) == node.version:
                _same_version(node, before, archive_stat(target, os.stat(target)))
        return self.refresh(node)

    def refresh(self, node: Node) -> Node:
        # Narrowed by its ACL (vfs.acl), as listings show it: a chmod through the mount of a
        # file whose ACL denies a user showed that user the bits alone until the next getattr.
        # One lstat for the attributes and the inode they belong to (Node.ino).
        st = acl_stat(node.real, os.stat(node.real, follow_symlinks=False))
        if node.spooled:
            return spooled_node(node.real, node.spooled, st)
        node.ino = st.st_ino
        if node.backend is not None:
            node.mode, node.uid, node.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
            return node  # mtime stays keyed to the version the kernel caches
        node.mode, node.uid, node.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        node.mtime_ns = st.st_mtime_ns
        node.size = 0 if node.is_dir else st.st_size
        return node

    def rename(
        self,
        old_parent: Node,
        old: str,
        node: Node,
        new_parent: Node,
        new: str,
        behind: Node | None = None,
        over: tuple[Node | None, ...] = (),
    ) -> Node:
        """`behind`: what SRC presents under the old name that the spooled `node` hides (the
        published version it replaced): it goes, or it would show again under that name.
        A real file renamed over a spooled one replaces it: the spooled file goes, or it
        would hide the real one and later be published over it. `over`: what the mount shows
        under the new name (and what that hides), as for `_check_free`."""
        shown = self._check_free(new_parent, new, over, is_dir=node.is_dir)
        may_replace = None if node.is_dir else shown
        old_rel, new_rel = self._rel(old_parent, old), self._rel(new_parent, new)
        self._check_shown(self.root / new_rel, spool_only=bool(node.spooled) and behind is None)
        if self._adopted:
            self._move_adopted(old_rel, new_rel)
        if node.spooled:
            if behind is None:
                self.spool.rename(old_rel, new_rel, may_replace)
            else:
                self._check_removable(behind)
                with placing_lock():
                    doomed = set_aside(self.spool, behind.real)
                    self.spool.rename(old_rel, new_rel, may_replace)
                remove_tree(doomed)
            if not node.is_dir:
                self.spool.written_into(new_rel, new_parent.ino)
            return spooled_node(self.spool.path(new_rel), new_rel, self.spool.path(new_rel).stat())
        if node.backend is not None:
            raise refuse(errno.EPERM, f"{node.real}: archived originals cannot be renamed")
        target = self.root / new_rel
        doomed: list[Path | None] = []
        # Both folders reached without links: vfs/beneath.py.
        with (
            _folder_of(self.root, node.real, old_parent) as sfd,
            _folder_of(self.root, target, new_parent) as dfd,
            placing_lock(),
        ):
            moved = os.stat(node.real.name, dir_fd=sfd, follow_symlinks=False)
            if not_listed(moved, node.ino, node.uid):
                raise OSError(errno.ESTALE, "not the entry listed (replaced since)", str(node.real))
            if node.is_dir and self._holds_spooled(new_rel):
                # SRC's folder may be empty while the mount shows files in it (all spooled):
                # renamed over in SRC, it would be replaced and those files published into
                # the folder moved there (or the spool's rename fail after SRC's was made).
                raise refuse(errno.ENOTEMPTY, f"{target}: holds files not yet published")
            # A spooled file at the new name goes first (Spool.set_aside): a crash between
            # the two steps must not leave it to be published over the renamed file.
            aside = None if node.is_dir else self.spool.set_aside(new_rel)
            try:
                os.rename(node.real.name, target.name, src_dir_fd=sfd, dst_dir_fd=dfd)
            except BaseException:
                if aside is not None:
                    os.replace(aside, self.spool.path(new_rel))
                raise
            doomed.append(aside)
            if node.is_dir:
                mark_written(dfd, target.name)
            if node.is_dir and self.spool.path(old_rel).is_dir():
                # Files still spooled inside move along (none, if a publish just took the
                # last of them and pruned the folder).
                with contextlib.suppress(FileNotFoundError):
                    self.spool.rename(old_rel, new_rel)
            else:
                if not self.spool.discard(new_rel) and aside is not None:
                    self.spool.prune_dirs(str(Path(new_rel).parent))
                self._discard_link(old_rel, target)
                doomed += _replaced_archives(self.spool, target, dfd, shown)
        for path in doomed:
            remove_tree(path)
        return self.refresh(_moved(node, target))

    def _holds_spooled(self, rel: str) -> bool:
        """Whether the spool has anything below the presented folder `rel` (emptied spool
        folders are pruned, so anything there is a spooled file or leads to one)."""
        try:
            with os.scandir(self.spool.path(rel)) as it:
                return any(True for _ in it)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _check_shown(self, target: Path, spool_only: bool = False) -> None:
        """Refuse a rename onto a name whose real entry the mount does not show (a symlink, a
        FIFO): the kernel checks a sticky folder only against entries it is shown, so it let
        the caller through, and the daemon would replace another user's entry with root's rights.

        `spool_only`: the rename moves a spooled file within the spool and leaves SRC alone
        (publishing checks the name again, `publish._refuse_hidden`): a name missing by its
        plain path (rsync's every rename) needs no walk from SRC (one lstat instead of five
        calls). Found, or reached otherwise, it is looked at without following links."""
        if spool_only:
            try:
                os.lstat(target)
            except FileNotFoundError:
                return
            except OSError:
                pass
        try:
            with _folder_of(self.root, target) as dfd:
                st = os.stat(target.name, dir_fd=dfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing there: the name is free
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            why = f"holds an entry the mount does not show (mode {stat.filemode(st.st_mode)})"
            raise refuse(errno.EEXIST, f"{target}: {why}")

    def _check_free(
        self, parent: Node, name: str, over: tuple[Node | None, ...], is_dir: bool
    ) -> frozenset[tuple[int, int]]:
        """Refuse (EEXIST) a new name whose entry, or once published whose archive name
        (`NAME.zarr.zip`: a TIFF's archive replaces it, a plain file sets it aside), is an
        entry of SRC other than those the mount shows under that name (`over`). The kernel
        checked the caller only against what it was shown there: an archive shown under
        another name (a series `run.zarr.zip` shown as `run/`, `data.zarr.zip` showing
        `scan.tif`) would be replaced or deleted with the daemon's rights, in a sticky
        folder another user's, and without --allow-delete. Returns (st_dev, st_ino) of the
        entries found (those shown): publishing may replace these and nothing else, however
        long the file stays spooled (publish._refuse_unchecked). A folder archive
        (`NAME.zarr/`) is among them only if shown under the name: no publish touches another."""
        folder = self.root / self._folder(parent)
        found: set[tuple[int, int]] = set()
        candidates = (name,) if is_dir else (name, archive_name(name), folder_archive_name(name))
        for candidate in candidates:
            path = folder / candidate
            try:
                os.lstat(path)  # most names are new: one lstat, no walk from SRC
            except FileNotFoundError:
                continue
            except OSError:
                pass
            try:
                with _folder_of(self.root, path) as dfd:
                    st = os.stat(candidate, dir_fd=dfd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if exc.errno not in NOTHING_THERE:
                    raise
                continue
            if not any(_is_entry(shown, path, st) for shown in over if shown is not None):
                if candidate == folder_archive_name(name):
                    continue  # a folder archive goes only if shown under the name
                why = f"holds an entry the mount does not show as {name!r}; not replaced"
                raise refuse(errno.EEXIST, f"{path}: {why}")
            found.add((st.st_dev, st.st_ino))
        return frozenset(found)

    def _remember_adopted(self, rel: str, st: os.stat_result, journaled: bool = False) -> None:
        self._adopted[rel] = (st.st_dev, st.st_ino)
        if len(self._adopted) >= self._adopted_prune_at:  # amortized: O(1) per adoption
            for known in list(self._adopted):
                self._is_adopted(known)
            self._adopted_prune_at = max(ADOPTED_PRUNE, 2 * len(self._adopted))
            self._write_journal()
        elif not journaled:
            self._note_in_journal([(st.st_dev, st.st_ino)])

    def _load_adopted(self) -> None:
        """The marks of the spooled files the journal names (by identity, wherever a rename
        took them), the journal rewritten with those alone. A spooled file published and
        removed since may leave its inode number to a new one: at worst that one's deletion
        is refused without --allow-delete, as a published file's is."""
        try:
            text = self._journal.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("%s: cannot read (%s); marks of files being rewritten lost", self._journal,
                        exc)  # fmt: skip
            return
        known = set()
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                known.add((int(parts[0]), int(parts[1])))
        if known:
            for rel, st in self.spool.walk().items():
                if (st.st_dev, st.st_ino) in known:
                    self._adopted[rel] = (st.st_dev, st.st_ino)
        self._write_journal()

    def _write_journal(self) -> None:
        """The journal rewritten with the marks held now, whole or not at all (a new file
        renamed over it: a kill while it was truncated and written lost the marks)."""
        fresh = self._journal.with_name(self._journal.name + ".new")
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()
        if self._note_in_journal(list(self._adopted.values()), fresh):
            try:
                os.replace(fresh, self._journal)
            except OSError as exc:
                log.warning("%s: cannot write (%s)", self._journal, exc)

    def _note_in_journal(self, idents: list[tuple[int, int]], path: Path | None = None) -> bool:
        """Append the marks to the journal (or to `path`, made afresh); whether it worked."""
        try:
            fd = os.open(path or self._journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # fmt: skip
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.writelines(f"{dev} {ino}\n" for dev, ino in idents)
        except OSError as exc:  # the marks are still kept in memory
            log.warning("%s: cannot write (%s)", path or self._journal, exc)
            return False
        return True

    def _is_adopted(self, rel: str) -> bool:
        """Is the spooled file `rel` a published file moved back to be written? (An entry
        whose spooled file went or changed identity is dropped.)"""
        ident = self._adopted.get(rel)
        if ident is None:
            return False
        try:
            st = self.spool.path(rel).lstat()
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != ident:
            del self._adopted[rel]
            return False
        return True

    def _move_adopted(self, old_rel: str, new_rel: str) -> None:
        """A rename (of the file, or of a folder above it) takes the mark along."""
        prefix = old_rel + "/"
        for rel in [r for r in self._adopted if r == old_rel or r.startswith(prefix)]:
            self._adopted[new_rel + rel[len(old_rel) :]] = self._adopted.pop(rel)

    def _discard_link(self, relpath: str, real: Path) -> None:
        """A published file's spooled name, not yet removed while the mount switches to it,
        goes once the file itself is renamed: it is the same inode (a hard link), so the
        rename changed its ctime and the queue would take it for a newer version and publish
        it again under the old name."""
        try:
            same = os.path.samestat(os.lstat(self.spool.path(relpath)), os.lstat(real))
        except OSError:
            return
        if same:
            self.spool.discard(relpath)

    def unlink(self, parent: Node, name: str, node: Node, behind: Node | None = None) -> None:
        """`behind`: as for `rename`. Deleting it, an older version in SRC, needs
        --allow-delete like any file of SRC (its own just-published copy does not)."""
        if node.is_dir:
            raise refuse(errno.EISDIR, str(node.real))
        if node.spooled:
            if behind is None:
                if not self.allow_delete and self._is_adopted(node.spooled):
                    why = (
                        "a published file (opened for writing since): deleting needs --allow-delete"
                    )
                    raise refuse(errno.EPERM, f"{self.root / node.spooled}: {why}")
                self.spool.remove(node.spooled)
                return
            self._check_removable(behind)
            with placing_lock():
                own = self.spool.placed_copy(node.spooled, behind.real)
                if not self.allow_delete and not own:
                    why = "deleting needs --allow-delete (a newer version is not yet published)"
                    raise refuse(errno.EPERM, f"{behind.real}: {why}")
                doomed = set_aside(self.spool, behind.real)
                self.spool.discard(node.spooled)
            remove_tree(doomed)
            return
        if not self.allow_delete:
            raise refuse(errno.EPERM, f"{node.real}: deleting needs decant-mount --allow-delete")
        self._check_removable(node)
        with placing_lock():
            if not node.real.exists():
                raise refuse(errno.ENOENT, str(node.real))
            doomed = set_aside(self.spool, node.real)  # deleted after the lock
            if not node.is_dir:
                self.spool.discard(self._rel(parent, name))  # one being switched to this file
        remove_tree(doomed)

    @staticmethod
    def _check_removable(node: Node) -> None:
        if node.member:
            raise refuse(errno.EPERM, f"{node.real}: members of an archive cannot be deleted")
        if node.is_dir and node.backend is None:
            raise refuse(errno.EISDIR, str(node.real))

    def mkdir(self, parent: Node, name: str, mode: int, uid: int, gid: int) -> Node:
        rel = self._rel(parent, name)
        self._need_room(0, rel)
        path = self.root / rel
        with _folder_of(self.root, path, parent) as dfd:
            with placing_lock():
                os.mkdir(name, stat.S_IMODE(mode), dir_fd=dfd)
                mark_written(dfd, name)
            folder = os.fstat(dfd)
            if folder.st_mode & stat.S_ISGID:
                # A setgid folder: the new one takes its group, and the kernel gave it the bit.
                gid = folder.st_gid
            if os.geteuid() == 0:
                os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            # Under a default ACL the new folder has an access ACL: shown narrowed by it, as
            # a listing would, or a user it denies lists the folder through the mount.
            st = acl_stat_at(dfd, name, st)
        return mirror_node(path, st, writable=True)

    def rmdir(self, parent: Node, name: str, node: Node) -> None:
        if node.backend is not None or not node.is_dir:
            raise refuse(errno.EPERM if node.backend is not None else errno.ENOTDIR, name)
        rel = self._rel(parent, name)
        if self.spool.listdir(rel):
            raise refuse(errno.ENOTEMPTY, name)
        with _folder_of(self.root, node.real, parent) as dfd, placing_lock():
            os.rmdir(node.real.name, dir_fd=dfd)
        self.spool.prune_dirs(rel)


def _hole_within(fd: int, start: int, end: int) -> bool:
    """Whether the file holds a hole between `start` and `end` (both within its size)."""
    if start >= end:
        return False
    try:
        return os.lseek(fd, start, os.SEEK_HOLE) < end
    except OSError:
        return True  # cannot tell: new data, then


@contextmanager
def _folder_of(root: Path, path: Path, listed: Node | None = None) -> Iterator[int]:
    """The folder holding `path`, reached from SRC without following a link: its owner may have
    swapped it (or a folder above it) for one since the mount looked (vfs/beneath.py). With
    `listed` (the folder's node), ESTALE unless it is the folder the mount listed there: one
    renamed over it since is another user's, whom the kernel did not check the caller
    against (red team 67, F1: a folder made in it, a file moved into it)."""
    fd = parent_fd(root, path)
    try:
        if listed is not None and not_listed(os.fstat(fd), listed.ino, listed.uid):
            raise OSError(errno.ESTALE, "not the folder listed (replaced since)", str(path.parent))
        yield fd
    finally:
        os.close(fd)


def _is_entry(shown: Node, path: Path, st: os.stat_result) -> bool:
    """Is the entry of SRC at `path` (`st`) the one `shown` presents: the same path, or the
    spooled file's own published copy (the same inode)?"""
    if shown.real == path:
        return True
    if not shown.spooled:
        return False
    try:
        return os.path.samestat(os.lstat(shown.real), st)
    except OSError:
        return False


def _replaced_archives(
    spool: Spool, target: Path, dfd: int, shown: frozenset[tuple[int, int]]
) -> list[Path | None]:
    """A real file renamed over a name the mount showed from an archive (`y.tif` of
    `y.tif.zarr.zip` or of the folder `y.tif.zarr/`): the rename replaced what was shown, so
    the archive goes too (set aside for `remove_tree`; the caller holds the placing lock).
    Left in SRC it showed under its own name, a deleted `y.tif` came back with the archive's
    older bytes, and the file, once written again, was never published (the archive was no
    entry it may replace). Only the entry the mount showed (`shown`, from `_check_free`),
    never one put there since."""
    doomed: list[Path | None] = []
    for archive in (archive_name(target.name), folder_archive_name(target.name)):
        try:
            st = os.stat(archive, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in shown:
            doomed.append(set_aside(spool, target.with_name(archive), dfd))
    return doomed


def _moved(node: Node, target: Path) -> Node:
    node.real = target
    return node


def _same_version(node: Node, before: os.stat_result, after: os.stat_result) -> None:
    """An archive whose mode, owner or times the daemon itself just changed (a chmod through the
    mount) is the version listed still: only its ctime (and mtime, if set) moved. Its node takes
    the new stamp, or the next open would refuse the file as replaced (ESTALE) and a relisting
    give the original a new inode number. Not when the inode or size differ: then another file
    is there now. The verified state, keyed by the old ctime, is not carried over: the next
    whole read verifies it again, as a remount would."""
    if (after.st_ino, after.st_size) == (before.st_ino, before.st_size):
        node.version = archive_version(after)
        if not node.member:
            # An original shows its archive's mtime (as a listing would): `touch -d` of it
            # set the archive's, while the mount kept showing the old one until a remount.
            node.mtime_ns = after.st_mtime_ns
