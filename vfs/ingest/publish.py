"""Publishing one spooled file into SRC: a hard link for plain files, a verified archive for TIFFs.

A plain file on the spool's filesystem is published by linking its inode at the final name (no
copy, no extra space, O(1) whatever its size); the spool name is unlinked later, once the mount
has switched, so both names are the same bytes meanwhile. Across filesystems (`--spool` elsewhere)
it is copied with `copy_file_range`, data extents only (holes stay holes), compared, and fsynced.
Every long loop checks `cancel` between blocks, so unmount and SIGTERM stop a publish promptly.
Synchronous and FUSE-free: the pack queue calls it in worker threads.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from vfs.acl import ACCESS_XATTR, access_acl, acl_stat
from vfs.beneath import fsync_beneath, makedirs_beneath, open_beneath, parent_fd, stat_beneath
from vfs.decant import TEMP_PREFIX, temp_name
from vfs.errors import CorruptArchiveError, ManifestError, UnsupportedFormatError
from vfs.ingest.space import free_bytes
from vfs.ingest.writing import CUT_OFF, write_mark
from vfs.names import NAME_MAX, is_utf8
from vfs.perms import granted, user_groups

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions
    from vfs.decant.tiffscan import TiffLayout
    from vfs.decant.writer import CodecChoice
    from vfs.ingest.spool import Spool

log = logging.getLogger(__name__)

CHANGED_WAIT = 1.0  # a file that changed while being published is tried again this much later
CLOSING_WAIT = 0.2  # a file whose last write handle is closing is tried again this much later
BLOCK = 8 << 20  # copy and compare in blocks this big; cancellation is checked between them
SPACE_MARGIN = 1 << 20  # packing needs the archive's size plus this much free
_PLACING = threading.Lock()  # a folder's mtime is read, changed and put back under this lock
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_LINKS = (errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS)


class PublishCancelled(Exception):
    """The daemon is stopping: the file stays spooled and is published after the restart."""


class SourceChangedError(OSError):
    """The spooled file changed (or was replaced) while it was being published: nothing was
    put into SRC; it is tried again once it settles."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.EAGAIN, "changed while being published", str(path))


class NoSpaceError(OSError):
    """Not enough free space to publish this file now; it waits until there is."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.ENOSPC, reason)
        self.reason = reason


@dataclass(frozen=True)
class Published:
    relpath: str
    target: Path  # the archive, or the plain file in SRC
    mode: str  # byte-exact | verbatim | plain | already (published before a restart)
    reason: str = ""
    signature: tuple[int, ...] = ()  # the spooled file as published: see `Spool.remove`
    synced: bool = True  # False: durable only after `sync_placed` (see `publish`)
    placed: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of `target` as placed: see `retract`


@dataclass(frozen=True)
class Outcome:
    """What one attempt did: published, unsettled (`wait` s more), vanished, space, failed or
    skipped (not tried: the batch ran out of time or the daemon is stopping)."""

    relpath: str
    kind: str
    published: Published | None = None
    reason: str = ""
    wait: float = 0.0
    error: Exception | None = None


def archive_name(name: str) -> str:
    return f"{name}.zarr.zip"


def folder_archive_name(name: str) -> str:
    return f"{name}.zarr"


# What SRC's tree takes a plain file for by its name (vfs/backends: `claims`): a decant archive,
# shown as its original (under the name without `.zarr.zip`), and a GDI package, shown as a
# folder of its members.
READ_AS_ARCHIVE = (".zarr.zip", ".tar.c4gh")


def read_as_archive(name: str) -> bool:
    """Whether a file of this name, published as it is, would be shown as something else: it
    is packed verbatim instead, so that it reads back under the name it was written with, its
    bytes unchanged (a decant archive copied in was shown as its original, under another name,
    and `rsync -a` sent it again at each run)."""
    return name.endswith(READ_AS_ARCHIVE)


# What an lstat of a name that holds nothing fails with: a name of 247 to 255 bytes, as rsync's
# temp names are, has an archive name (NAME.zarr.zip) longer than NAME_MAX, which none can have.
NOTHING_THERE = (errno.ENOENT, errno.ENAMETOOLONG)


class Placer(Protocol):
    """Where published files go when SRC is not a local folder (a spool's `placer`; None: the
    local placing below, by hard link or rename into SRC). See vfs/ingest/bucket.py."""

    def publish(
        self,
        spool: Spool,
        relpath: str,
        pack_all: bool,
        options: PackOptions | None,
        cancel: threading.Event | None = None,
    ) -> Published: ...

    def retract(self, target: Path, placed: tuple[int, int]) -> None: ...


def publish(
    spool: Spool,
    relpath: str,
    pack_all: bool,
    options: PackOptions | None,
    cancel: threading.Event | None = None,
    durable: bool = True,
) -> Published:
    """Put the spooled file into SRC: a verified archive (TIFFs, or all with `pack_all`) or the
    plain file itself. The spool name is left for the caller to remove once the mount switched.
    Without `durable`, an archive's metadata and name are not fsynced here: the caller does it
    for a batch at once (`sync_placed`) before any spool name goes."""
    if spool.placer is not None:
        return spool.placer.publish(spool, relpath, pack_all, options, cancel)
    source = spool.path(relpath)
    # Below the spool's (or inbox's) root without links: a folder on the way swapped for a
    # link to a folder of someone else fails here (ELOOP/ENOTDIR), never publishes its file.
    st = stat_beneath(spool.files, source)
    if not stat.S_ISREG(st.st_mode):
        raise FileNotFoundError(errno.ENOENT, "not a regular file", str(source))
    folder = spool.src / Path(relpath).parent
    if not folder.is_dir():  # e.g. a new subfolder of an inbox
        with _PLACING:  # not one just renamed away, with the spooled file (see WriteSide)
            stat_beneath(spool.files, source)
            # From SRC's descriptor: a folder on the way swapped for a link is not made through.
            # A folder of a file written through the mount is gone from SRC (removed there,
            # or a `mv` of it killed between SRC's rename and the spool's): made again, it is
            # its writer's and 0700, never wider than the one it stands for. Made root's and
            # 0755, a private folder's file was readable by every user (red team 60, F3).
            narrow = None if spool.trusted else (st.st_uid, st.st_gid)
            makedirs_beneath(spool.src, folder, 0o700 if narrow else 0o777, narrow)
    # Its bytes are read through a descriptor of the file found here, not by its path again
    # (pack_file alone still opens the path: it takes the name from it).
    rfd = open_beneath(spool.files, source, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not os.path.samestat(os.fstat(rfd), st):
            raise SourceChangedError(source)
        via = Path(_fd_path(rfd))
        tiff, layout = _scan(via, st.st_size, spool.max_plane, spool.max_segments)
        packed = pack_all or tiff or read_as_archive(source.name)
        if not packed or not nameable(source.name) or _mostly_holes(st):
            return _publish_plain(spool, relpath, source, st, folder, cancel, via)
        return _publish_archive(
            spool, relpath, source, st, folder, options, cancel, durable, layout, via
        )
    finally:
        os.close(rfd)


def attempt(
    spool: Spool,
    relpath: str,
    pack_all: bool,
    options: PackOptions | None,
    settle: float,
    cancel: threading.Event | None = None,
) -> Outcome:
    """One file, never raising: settled on disk (ctime, for files that did not come through the
    mount), then published; ENOSPC of any kind is a wait for space, not a failure."""
    try:
        st = stat_beneath(spool.files, spool.path(relpath))
    except (FileNotFoundError, NotADirectoryError):
        return Outcome(relpath, "vanished")
    except OSError as exc:
        return Outcome(relpath, "failed", reason=describe_error(exc), error=exc)
    if not stat.S_ISREG(st.st_mode):
        return Outcome(relpath, "vanished")
    left = settle - (time.time_ns() - st.st_ctime_ns) / 1e9  # ctime: rsync sets mtime back
    if 0 < left <= settle + 1:  # far in the future: the clock was set back; do not wait for it
        return Outcome(relpath, "unsettled", wait=left)
    mark = write_mark(spool.path(relpath))
    if mark == "closing":  # its last write handle's release clears the mark next
        return Outcome(relpath, "unsettled", wait=CLOSING_WAIT)
    if mark == "cut off":  # a write handle was open when the daemon last stopped
        return Outcome(relpath, "failed", reason=CUT_OFF)
    try:
        published = spool.publish(relpath, pack_all, options, cancel, durable=False)
        return Outcome(relpath, "published", published)
    except PublishCancelled:
        return Outcome(relpath, "skipped")
    except NoSpaceError as exc:
        return Outcome(relpath, "space", reason=exc.reason)
    except SourceChangedError:
        return Outcome(relpath, "unsettled", wait=CHANGED_WAIT)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            return Outcome(relpath, "space", reason=describe_error(exc))
        if isinstance(exc, FileNotFoundError) and not spool.path(relpath).exists():
            return Outcome(relpath, "vanished")
        return Outcome(relpath, "failed", reason=describe_error(exc), error=exc)
    except Exception as exc:
        return Outcome(relpath, "failed", reason=describe_error(exc), error=exc)


SPARSE_MIN = 64 << 20  # a file this large with under half its size on disk is not packed


def _mostly_holes(st: os.stat_result) -> bool:
    """A large file most of whose size is holes: packing reads, hashes and compresses every
    byte of the apparent size (a 16 GiB "TIFF" of 20 KB on disk held the pack worker, and every
    other user's publishing, for two minutes; 16 TiB could for days). Published as it is
    instead: a hard link, holes kept."""
    return st.st_size > SPARSE_MIN and st.st_blocks * 512 < st.st_size // 2


def nameable(name: str) -> bool:
    """Whether an archive's manifest can record the name (JSON text: UTF-8), and the archive
    can have one (NAME.zarr.zip within NAME_MAX). Another file is published as it is, never
    left failing in the spool for good."""
    return is_utf8(name) and len(os.fsencode(archive_name(name))) <= NAME_MAX


def describe_error(exc: BaseException) -> str:
    """The cause, without naming a staging temp file (the status already names the file)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename and TEMP_PREFIX not in str(exc.filename) else ""
        return f"{where}{exc.strerror} (errno {exc.errno})"
    return str(exc) or exc.__class__.__name__


# -- plain files ---------------------------------------------------------------------------


def _publish_plain(
    spool: Spool,
    relpath: str,
    source: Path,
    st: os.stat_result,
    folder: Path,
    cancel: threading.Event | None,
    via: Path,
) -> Published:
    name = source.name
    final, shadowed = folder / name, folder / archive_name(name)
    if _same_fs(source.parent, folder):
        try:
            mode, placed = _link_into_place(spool, relpath, source, final, shadowed)
        except OSError as exc:
            if exc.errno not in NO_LINKS:
                raise
            log.info("%s: cannot hard-link here (%s); copying it instead", relpath, exc.strerror)
            st = stat_beneath(spool.files, source)  # a link made and undone moved its ctime
        else:
            # The inode now at the final name is the one linked, whatever the spool name
            # points at since: only that inode's spool name may be removed later.
            sig, ident = signature(placed), _ident(placed)
            return Published(relpath, final, mode, signature=sig, placed=ident)
    need = st.st_blocks * 512 + SPACE_MARGIN
    require_space(folder, need, f"needs {size_text(need)} free to copy it into SRC")
    with _staged_copy(spool, folder, name) as (staged, sdir):
        copy_sparse(via, staged, cancel, sdir)
        apply_metadata(staged, st, sdir, access_acl(via))
        if not same_bytes(via, staged, cancel, sdir):
            raise OSError(errno.EIO, "the copy differs from the spooled file", str(final))
        check(cancel)
        placed = place(spool, staged, final, shadowed, source=(relpath, st), staged_dir=sdir)
    return Published(relpath, final, "plain", signature=signature(st), placed=placed)


def _link_into_place(
    spool: Spool, relpath: str, source: Path, final: Path, shadowed: Path
) -> tuple[str, os.stat_result]:
    """The spooled inode gets its final name too (the folder keeps its mtime). Under the
    placing lock, like every change the write side makes to SRC and to spooled names there:
    a file renamed or deleted through the mount is either gone here (nothing is linked) or
    finds its published copy in place (and replaces or removes it). The folder is reached
    from SRC without following links: its owner may have swapped it for one."""
    folder = final.parent
    mode = "plain"
    doomed: list[Path | None] = []
    # The spooled file too is reached without links and linked through that descriptor
    # (linkat of its /proc/self/fd link with AT_SYMLINK_FOLLOW): the inode linked is the one
    # found below the spool's root, even if a folder on its path is swapped for a link now.
    # Opened under the lock: a file renamed away through the mount is not linked.
    sfd = -1
    dfd = parent_fd(spool.src, final)
    try:
        with _PLACING:
            sfd = open_beneath(spool.files, source, os.O_PATH)
            sst = os.fstat(sfd)
            if not stat.S_ISREG(sst.st_mode):
                raise FileNotFoundError(errno.ENOENT, "not a regular file", str(source))
            via = _fd_path(sfd)
            _refuse_unchecked(spool, relpath, (final, shadowed), dfd, sst, sst.st_uid)
            before = os.stat(dfd)
            try:
                try:
                    os.link(via, final.name, dst_dir_fd=dfd, follow_symlinks=True)
                except FileExistsError:
                    there = os.stat(final.name, dir_fd=dfd, follow_symlinks=False)
                    if os.path.samestat(sst, there):
                        mode = "already"  # linked before a crash: only the spool name is left
                    else:
                        _refuse_hidden(final, dfd)
                        staged = _staged(spool, folder, final.name)
                        name, there = _beside(spool, staged, dfd)
                        try:
                            # dst_dir_fd (ignored if staged is absolute) makes it a linkat
                            os.link(via, name, dst_dir_fd=dfd, follow_symlinks=True)
                            doomed.append(_keep_older(spool, final, dfd))
                            # over an older one
                            os.replace(name, final.name, src_dir_fd=there, dst_dir_fd=dfd)
                        finally:
                            _unlink(staged, there)
                # An archive of the name goes, "already" too: linked before a crash that fell
                # before this, it was left, shown under its archive name with the older bytes,
                # and came back under the name when the file was deleted (red team 59, F2).
                doomed.append(set_aside(spool, shadowed, dfd))
                doomed.append(_set_aside_shown_folder(spool, relpath, final, dfd))
                placed = os.stat(final.name, dir_fd=dfd, follow_symlinks=False)
                spool.mark_placed(relpath, placed)
            finally:
                os.utime(_fd_path(dfd), ns=(before.st_atime_ns, before.st_mtime_ns))
    finally:
        if sfd >= 0:
            os.close(sfd)
        os.close(dfd)
    for path in doomed:
        remove_tree(path)
    return mode, placed


def _fd_path(fd: int) -> str:
    """The folder an O_PATH descriptor holds, for calls that take no descriptor."""
    return f"/proc/self/fd/{fd}"


def copy_sparse(
    source: Path, dest: Path, cancel: threading.Event | None, dest_dir: int | None = None
) -> None:
    """Copy data extents only (SEEK_DATA/SEEK_HOLE): a 1 TiB sparse file costs its data.
    `dest_dir`: the descriptor of `dest`'s folder, which it is made in (see `_staged_copy`)."""
    fd_in = os.open(source, os.O_RDONLY)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd_out = os.open(_at(dest, dest_dir), flags, 0o600, dir_fd=dest_dir)
        try:
            size = os.fstat(fd_in).st_size
            os.ftruncate(fd_out, size)
            for start, end in data_extents(fd_in, size):
                _copy_range(fd_in, fd_out, start, end, cancel)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of each data extent; the whole file where holes cannot be asked for."""
    out, pos = [], 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            return [(0, size)]  # SEEK_DATA not supported here
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        out.append((start, end))
        pos = end
    return out


def _copy_range(
    fd_in: int, fd_out: int, start: int, end: int, cancel: threading.Event | None
) -> None:
    pos = start
    while pos < end:
        check(cancel)
        count = min(BLOCK, end - pos)
        try:
            done = os.copy_file_range(fd_in, fd_out, count, pos, pos)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            data = os.pread(fd_in, count, pos)
            done = os.pwrite(fd_out, data, pos) if data else 0
        if done == 0:
            raise OSError(errno.EAGAIN, "the file shrank while being copied")
        pos += done


def same_bytes(a: Path, b: Path, cancel: threading.Event | None, b_dir: int | None = None) -> bool:
    """Equal sizes and equal bytes over `a`'s data extents (its holes read as zeros in both:
    `b` was written at those extents only). `b_dir`: the descriptor of `b`'s folder."""
    with open(a, "rb") as fa, os.fdopen(open_copy(b, b_dir), "rb") as fb:
        size = os.fstat(fa.fileno()).st_size
        if os.fstat(fb.fileno()).st_size != size:
            return False
        for start, end in data_extents(fa.fileno(), size):
            for off in range(start, end, BLOCK):
                check(cancel)
                count = min(BLOCK, end - off)
                if os.pread(fa.fileno(), count, off) != os.pread(fb.fileno(), count, off):
                    return False
    return True


def open_copy(path: Path, dir_fd: int | None = None) -> int:
    """A descriptor of the copy at `path` (in the folder `dir_fd` holds, if given), read-only,
    refusing anything but a regular file: a copy beside its target sits in the writer's folder,
    whose owner may swap it for a link or a FIFO (opening one would wait for a writer for ever,
    holding up every publish)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(_at(path, dir_fd), flags, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EPERM, "not a regular file (swapped?)", str(path))
    os.set_blocking(fd, True)
    return fd


# -- archives ------------------------------------------------------------------------------


def _publish_archive(
    spool: Spool,
    relpath: str,
    source: Path,
    st: os.stat_result,
    folder: Path,
    options: PackOptions | None,
    cancel: threading.Event | None,
    durable: bool,
    layout: TiffLayout | None,
    via: Path,
) -> Published:
    # Imported here: zarr and tifffile cost the daemon's start-up ~0.2 s it need not pay.
    from vfs.decant.packer import PackOptions, file_sha256, pack_file
    from vfs.decant.smallpack import fits

    def progress(_nbytes: int) -> None:
        check(cancel)

    options = with_plane_bound(options or PackOptions(), spool.max_plane, spool.max_segments)
    small = (
        layout is not None
        and options.mode != "verbatim"
        and fits(st.st_size, layout, options.pyramid)
    )
    data = _read_whole(via, st) if small else b""
    sha = hashlib.sha256(data).hexdigest() if small else ""
    name = source.name
    target = folder / archive_name(name)
    dfd = parent_fd(spool.src, target)
    try:  # before packing it (again, at each retry): `place` checks again under the lock
        # and before taking an archive there for this file's own: one put there since by
        # someone else is refused, whatever it holds (the file stays spooled)
        _refuse_unchecked(spool, relpath, (target, folder / name), dfd, None, st.st_uid)
    finally:
        os.close(dfd)
    # Hashing first only pays when an archive is there: a restart after publish, pre-cleanup.
    if target.is_file() and _archive_holds(target, st, sha or file_sha256(via, progress)):
        _take_over(spool, relpath, target, folder / name, st, durable, access_acl(via))
        return Published(relpath, target, "already", signature=signature(st), synced=durable)
    need = st.st_blocks * 512 + SPACE_MARGIN
    require_space(folder, need, f"needs about {size_text(need)} free to pack")
    with _staged_copy(spool, folder, archive_name(name)) as (staged, sdir):
        # Built where no other user reaches: the packer writes, verifies and chmods its files
        # by path. Beside the target (a folder on another filesystem than the staging folder)
        # the folder's owner could swap them for a link to any file, which root then overwrote.
        built = staged if sdir is None else _private(spool, archive_name(name))
        if built is not staged:
            require_space(spool.staging, need, f"needs about {size_text(need)} free to pack")
        try:
            packed = None
            if small and layout is not None:
                packed = _packed_small(relpath, name, data, layout, built, options.codec, sha)
            if packed is None:
                result = pack_file(source, built, options, progress)
                packed = result.mode, result.reason
            mode, reason = packed
            if built is not staged:  # copied into a new file (O_EXCL, in sdir), compared
                copy_sparse(built, staged, cancel, sdir)
                if not same_bytes(built, staged, cancel, sdir):
                    why = "the copy of the archive differs from it"
                    raise OSError(errno.EIO, why, str(target))
            check(cancel)  # stopping: do not publish what was finished meanwhile
            apply_metadata(staged, st, sdir, access_acl(via))
            # A real file of that name would shadow it: it goes.
            shadowed = folder / name
            placed = place(
                spool, staged, target, shadowed, durable, source=(relpath, st), staged_dir=sdir
            )
        finally:
            built.unlink(missing_ok=True)
    return Published(relpath, target, mode, reason, signature(st), durable, placed)


def _packed_small(
    relpath: str,
    name: str,
    data: bytes,
    layout: TiffLayout,
    built: Path,
    codec: CodecChoice,
    sha: str,
) -> tuple[str, str] | None:
    """A small TIFF's archive written directly (`smallpack`): ~2 ms instead of ~20 (zarr-python's
    fixed cost per archive), and no fsync (the queue makes a batch durable at once,
    `sync_placed`, before spooled files go). (mode, reason), or None when that archive failed
    its own check: the caller then packs the packer's way, which falls back to verbatim (without
    it such a file failed at every retry and stayed spooled)."""
    from vfs.decant import smallpack

    try:
        smallpack.pack_small(name, data, layout, built, codec, sha)
    except (ManifestError, UnsupportedFormatError, CorruptArchiveError) as exc:
        log.warning("%s: the direct archive failed its check (%s); packing it the packer's way",
                    relpath, exc)  # fmt: skip
        built.unlink(missing_ok=True)
        return None
    return "byte-exact", ""


def _take_over(
    spool: Spool,
    relpath: str,
    target: Path,
    shadowed: Path,
    st: os.stat_result,
    durable: bool,
    acl: bytes | None = None,
) -> None:
    """The archive found holding the file's bytes takes the file's mode, owner and mtime, as a
    newly packed one would (`apply_metadata`). The same bytes copied again (`rsync -a` of a
    file made 0600 since, or a chmod while it was being published) left the archive's older
    mode: other users kept reading a file its owner had made private, and its old mtime
    made every later `rsync -a` copy it again. Under the placing lock, only while the spooled
    file is unchanged (as `place`), and reached from SRC without links: it is the user's
    folder, and only a regular file of the file's owner (`_archive_holds`) is changed.

    Then what `place` sets aside just after its rename (`shadowed`, the plain file of the name
    the archive replaces) goes, as it would have then: a crash between the two (an archive
    found after a restart) left it, showing its older bytes under the name and the new
    original under the archive's name, and a second `rsync -a` failed with EEXIST (red team
    59, F1). Only what publishing the file may replace (`_refuse_unchecked`)."""
    doomed: list[Path | None] = []
    dfd = parent_fd(spool.src, target)
    try:
        with _PLACING:
            if signature(stat_beneath(spool.files, spool.path(relpath))) != signature(st):
                raise SourceChangedError(spool.path(relpath))
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(target.name, flags, dir_fd=dfd)
            try:
                held = os.fstat(fd)
                if not stat.S_ISREG(held.st_mode) or (
                    os.geteuid() == 0 and held.st_uid != st.st_uid
                ):
                    raise SourceChangedError(target)  # swapped since it was checked
                # Both as narrowed by their ACLs (`st` is: see _set_metadata).
                if _metadata(acl_stat(fd, held)) != _metadata(st) or acl != access_acl(
                    _fd_path(fd)
                ):
                    _set_metadata(fd, st, acl)  # else it stays as it is (its ctime too)
                    if durable:
                        os.fsync(fd)
                spool.mark_placed(relpath, os.fstat(fd))
            finally:
                os.close(fd)
            _refuse_unchecked(spool, relpath, (target, shadowed), dfd, None, st.st_uid)
            before = os.stat(dfd)
            try:
                doomed.append(set_aside(spool, shadowed, dfd))
                original = target.with_name(PurePosixPath(relpath).name)
                doomed.append(_set_aside_shown_folder(spool, relpath, original, dfd))
            finally:
                os.utime(_fd_path(dfd), ns=(before.st_atime_ns, before.st_mtime_ns))
    finally:
        os.close(dfd)
    for path in doomed:
        remove_tree(path)


def _read_whole(source: Path, st: os.stat_result) -> bytes:
    """A small spooled file's bytes, read once (hashed, packed and compared from memory)."""
    with open(source, "rb") as fh:
        data = fh.read(st.st_size + 1)
        # Changed since it was stat'ed (and scanned): tried again once it settles, not
        # packed from bytes its layout does not describe.
        if len(data) != st.st_size or signature(os.fstat(fh.fileno())) != signature(st):
            raise SourceChangedError(source)
    return data


def _scan(
    path: Path, size: int, max_plane: int | None = None, max_segments: int | None = None
) -> tuple[bool, TiffLayout | None]:
    """(is it a TIFF to archive, its mode D layout if it has one): scanned once per publish."""
    from vfs.decant.limits import MAX_CHUNK_BYTES, MAX_SEGMENTS
    from vfs.decant.tiffscan import NotByteExact, scan_tiff

    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:2] not in (b"II", b"MM"):
        return False, None
    try:
        return True, scan_tiff(path, size, max_plane or MAX_CHUNK_BYTES,
                               max_segments or MAX_SEGMENTS)  # fmt: skip
    except NotByteExact as exc:
        return "not a TIFF" not in str(exc), None  # compressed TIFFs are still archived (mode V)


def with_plane_bound(
    options: PackOptions, max_plane: int | None, max_segments: int | None = None
) -> PackOptions:
    """`options` with the spool's bounds on a page's size and the strips/tiles of a file,
    where it has them."""
    if max_plane is not None and max_plane < options.max_plane:
        options = replace(options, max_plane=max_plane)
    if max_segments is not None and max_segments < options.max_segments:
        options = replace(options, max_segments=max_segments)
    return options


def looks_like_tiff(path: Path, size: int) -> bool:
    return _scan(path, size)[0]


def _archive_holds(archive: Path, st: os.stat_result, sha: str) -> bool:
    """True when `archive` is this file's own and already holds exactly its bytes (it verified
    before it was renamed into place), so a restart after a crash between publish and cleanup
    need not pack again, and the spooled copy may go.

    Its own: published for the file's owner (`apply_metadata` gave it the owner). Its bytes:
    reconstructed and hashed, not taken from the manifest, which says whatever its writer
    wrote: an archive claiming the digest over other pixels must not cost the spooled copy."""
    from vfs.decant.verify import verify_archive

    try:
        held = os.lstat(archive)
        if not stat.S_ISREG(held.st_mode) or held.st_size == 0:
            return False
        if os.geteuid() == 0 and held.st_uid != st.st_uid:
            return False
        verdicts = verify_archive(archive)
    except Exception:  # unreadable or damaged: not this file's archive
        return False
    return len(verdicts) == 1 and verdicts[0].ok and verdicts[0].actual == sha


# -- shared steps --------------------------------------------------------------------------


def check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise PublishCancelled("the daemon is stopping")


def require_space(folder: Path, need: int, what: str) -> None:
    free = free_bytes(folder)
    if free < need:
        raise NoSpaceError(f"{what}; {size_text(free)} free on the filesystem of {folder}")


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _staged(spool: Spool, folder: Path, name: str) -> Path:
    """A temp name to build `name` under: in the staging folder, so the target folder sees
    one rename and keeps its mtime (what `rsync -a` set), else beside the target."""
    spool.staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    where = spool.staging if _same_fs(spool.staging, folder) else folder
    return where / temp_name(name)


@contextmanager
def _staged_copy(spool: Spool, folder: Path, name: str) -> Iterator[tuple[Path, int | None]]:
    """A temp name to build `name` under (`_staged`) and, beside the target, a descriptor of
    its folder reached from SRC without links (else None), which every step on the copy goes
    through (`_at`): made, given its metadata, compared, placed and removed there. By path, the
    folder's owner swapping it for a link to another folder (and back before the placing) made
    root create their bytes there, theirs and 0644, and leave them, or chown and delete what
    they had put at that name. The copy, if still there, is removed on the way out."""
    staged = _staged(spool, folder, name)
    sdir = None if staged.parent == spool.staging else parent_fd(spool.src, staged)
    try:
        yield staged, sdir
    finally:
        try:
            _unlink(staged, sdir)
        finally:
            if sdir is not None:
                os.close(sdir)


def _at(path: Path, dir_fd: int | None) -> str | Path:
    """`path` as named in the folder `dir_fd` holds, or the whole path without one."""
    return path if dir_fd is None else path.name


def _unlink(path: Path, dir_fd: int | None) -> None:
    with suppress(FileNotFoundError):
        os.unlink(_at(path, dir_fd), dir_fd=dir_fd)


def _beside(spool: Spool, staged: Path, dfd: int) -> tuple[str | Path, int | None]:
    """(name, dst_dir_fd) for a rename or link of an entry of the folder `dfd` to `staged`: a
    temp name beside it is given in that very folder. By path, a folder on the way swapped for
    a link by its owner took the entry into the link's target, another user's folder."""
    return (staged, None) if staged.parent == spool.staging else (staged.name, dfd)


def _private(spool: Spool, name: str) -> Path:
    """A temp name in the staging folder (the daemon's own), whatever the target's filesystem."""
    spool.staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    return spool.staging / temp_name(name)


def apply_metadata(
    path: Path, st: os.stat_result, dir_fd: int | None = None, acl: bytes | None = None
) -> None:
    """What `rsync -a` gave the file: mode bits, owner, group, its access ACL (`acl`, the
    spooled file's: vfs.acl.access_acl) and (last) mtime. Set through a
    descriptor of the file itself (in the folder `dir_fd` holds, if given): a temp name beside
    the target sits in the writer's folder, where it could be swapped for a link, or for a hard
    link of another file (the daemon must not chmod/chown either's target): the file made here
    is the daemon's own and has one name."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(_at(path, dir_fd), flags, dir_fd=dir_fd)
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            raise OSError(errno.EPERM, "not a regular file (swapped?)", str(path))
        if held.st_nlink != 1 or held.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "not the file made here (swapped?)", str(path))
        _set_metadata(fd, st, acl)
    finally:
        os.close(fd)


def _metadata(st: os.stat_result) -> tuple[int, int, int, int]:
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns


def _set_metadata(fd: int, st: os.stat_result, acl: bytes | None = None) -> None:
    """`st` is taken below the spool as listings take it, ACL-narrowed (vfs.beneath): its
    mode alone gave a file whose ACL denies one user group and other bits of none, every
    other user shut out of its archive. With the file's ACL set last, the bits are its own."""
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    if os.geteuid() == 0:
        os.fchown(fd, st.st_uid, st.st_gid)
    if acl is not None:
        try:
            os.setxattr(fd, ACCESS_XATTR, acl)
        except OSError as exc:  # SRC keeps no ACLs (the spool's file system does): the
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):  # narrowed bits stand,
                raise  # no wider than the ACL granted
    else:  # an archive found holding the bytes keeps no ACL the file no longer has
        with suppress(OSError):
            os.removexattr(fd, ACCESS_XATTR)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def signature(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def retract(spool: Spool, target: Path, placed: tuple[int, int]) -> None:
    """Withdraw what a publish placed at `target` (its source was deleted or renamed through
    the mount meanwhile), if it is still there: not a file renamed over it since."""
    if spool.placer is not None:
        spool.placer.retract(target, placed)
        return
    try:
        dfd = parent_fd(spool.src, target)
    except OSError:
        return  # its folder is gone (or is a link now): nothing of ours to withdraw there
    try:
        with _PLACING:
            try:
                if _ident(os.lstat(target.name, dir_fd=dfd)) != placed:
                    return
            except FileNotFoundError:
                return
            doomed = set_aside(spool, target, dfd)
    finally:
        os.close(dfd)
    remove_tree(doomed)


def set_aside(spool: Spool, path: Path, dfd: int | None = None) -> Path | None:
    """Take `path` off its name at once (the caller holds the placing lock): renamed into the
    staging folder (never shown; cleared at start if a crash leaves it there), for
    `remove_tree` to delete outside the lock. Freeing a large file's blocks or a folder
    archive's files takes long, and handlers on the event loop wait for this lock. None if
    there was nothing. Its folder is reached from SRC without links (`dfd`, or opened here):
    a folder swapped for a link must not make the daemon delete the link's target."""
    own = dfd is None
    fd = parent_fd(spool.src, path) if dfd is None else dfd
    try:
        try:
            os.lstat(path.name, dir_fd=fd)
        except OSError as exc:
            if exc.errno in NOTHING_THERE:
                return None
            raise
        doomed = _staged(spool, path.parent, "gone")
        name, there = _beside(spool, doomed, fd)
        os.rename(path.name, name, src_dir_fd=fd, dst_dir_fd=there)
        return doomed
    finally:
        if own:
            os.close(fd)


def _set_aside_shown_folder(spool: Spool, relpath: str, final: Path, dfd: int) -> Path | None:
    """A folder archive (`NAME.zarr/`) the mount showed as `NAME` when the file took that name
    (a file renamed over `y.tif` of `y.tif.zarr/`) is replaced by it, as `NAME.zarr.zip` is:
    set aside (the caller holds the placing lock) for `remove_tree`. Left in SRC it showed as a
    `y.tif.zarr` folder nobody made, and a deleted `y.tif` came back with its older bytes. Only
    the entry the mount showed (`Spool.may_replace`), never one put there since, nor for a
    file of no record (an inbox's: of two archives of one name, the mount shows one)."""
    allowed = spool.may_replace(relpath)
    if not allowed:
        return None
    archive = final.with_name(folder_archive_name(final.name))
    try:
        st = os.lstat(archive.name, dir_fd=dfd)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or _ident(st) not in allowed:
        return None
    return set_aside(spool, archive, dfd)


def _refuse_hidden(final: Path, dfd: int) -> None:
    """A name in SRC that holds what the mount does not show (a symlink, FIFO, socket,
    device) is not published over: the kernel checked the writer's rights (a sticky folder)
    only against what it was shown, and the daemon would replace another user's entry as root."""
    try:
        st = os.lstat(final.name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise FileExistsError(
            errno.EEXIST, f"holds an entry the mount does not show ({stat.filemode(st.st_mode)})",
            str(final))  # fmt: skip


def _refuse_unchecked(
    spool: Spool,
    relpath: str,
    names: tuple[Path, ...],
    dfd: int,
    own: os.stat_result | None,
    writer: int,
) -> None:
    """Publishing a file written through the mount replaces (or sets aside) at its name and its
    archive name only what the mount showed under its name when it was created or renamed
    (WriteSide._check_free, which refuses the rest): not an entry put there since, directly
    in SRC, by someone the kernel never checked the writer against (another user's file in a
    sticky folder, an archive presenting another name). `own`: the spooled inode (a hard link
    of it is its own copy); `writer`: its owner's uid. The file stays spooled; the failure
    names the entry."""
    allowed = spool.may_replace(relpath)
    if allowed is None and spool.trusted:
        return  # an inbox's file: the operator's, published over what it finds
    folder: os.stat_result | None = None
    listed = spool.folder_written_into(relpath)
    if listed is not None and os.fstat(dfd).st_ino != listed and writer != 0:
        # Another folder at its path than the one it was written into through the mount
        # (the kernel checked the writer against that one's attributes): another user's
        # folder renamed over it took a file published into it (red team 67, F1). Published
        # there only if its writer may add entries to that folder themselves.
        folder = acl_stat(dfd, os.fstat(dfd))
        if not granted(folder, writer, user_groups(writer), write=True, search=True):
            raise PermissionError(
                errno.EACCES,
                f"its writer (uid {writer}) may not add entries to this folder now "
                f"({stat.filemode(folder.st_mode)}, uid {folder.st_uid}); not published",
                str(names[0].parent))  # fmt: skip
    for path in names:
        try:
            st = os.lstat(path.name, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in NOTHING_THERE:
                continue
            raise
        if own is not None and os.path.samestat(own, st):
            continue
        if allowed is not None:
            if (st.st_dev, st.st_ino) in allowed:
                continue
            why = f"put there after {relpath!r} was written through the mount"
        elif _shown_as(path.name, stat.S_ISDIR(st.st_mode)) != PurePosixPath(relpath).name:
            # An archive the mount shows under another name (`x.tif.zarr.zip` is `x.tif`): a
            # file written as `x.tif.zarr.zip` and spooled over a restart deleted the archive of
            # `x.tif` as it was published (red team 76, F1). Never shown under this name.
            why = "shown under another name (an archive); spooled before a restart"
        else:
            # Spooled before a restart: what the mount showed under its name was kept in
            # memory only. It replaces what its owner could replace by a rename of their own,
            # nothing more: published over whatever it found, another user's file put at its
            # name in a sticky folder (refused while the daemon ran) was replaced at the next
            # start, with no copy kept.
            folder = folder or acl_stat(dfd, os.fstat(dfd))
            if _may_rename_over(folder, st, writer):
                continue
            why = f"its writer (uid {writer}) may not replace (spooled before a restart)"
        raise FileExistsError(
            errno.EEXIST,
            f"holds an entry ({stat.filemode(st.st_mode)}, uid {st.st_uid}) {why}; not replaced",
            str(path))  # fmt: skip


def _shown_as(name: str, is_dir: bool) -> str:
    """The name the mount shows an entry of SRC named `name` under (a decant archive: its
    original's; the mount checks the manifest, this only the form): a file `NAME.zarr.zip`, a
    folder `NAME.zarr` (a file `notes.zarr` is shown as it is: red team 77, F3)."""
    suffix = ".zarr" if is_dir else ".zarr.zip"
    if name.endswith(suffix) and len(name) > len(suffix):
        return name[: -len(suffix)]
    return name


def _may_rename_over(folder: os.stat_result, entry: os.stat_result, uid: int) -> bool:
    """Whether the user `uid` may replace `entry` in `folder` by a rename now: write and search
    on the folder (its ACL narrows the bits), and in a sticky folder the entry or the folder
    theirs (root: always). The folder's owner may have taken write away since the file was
    written: published anyway, it replaced their file in a folder the writer no longer could."""
    if uid == 0:
        return True
    if not granted(folder, uid, user_groups(uid), write=True, search=True):
        return False
    sticky = bool(folder.st_mode & stat.S_ISVTX)
    return not sticky or uid in (entry.st_uid, folder.st_uid)


def _keep_older(spool: Spool, final: Path, dfd: int) -> Path | None:
    """An older file at `final` (in the folder `dfd` holds) gets a staging name too, so
    replacing it does not free its blocks under the placing lock (`remove_tree` does, after).
    None if there is none, or it cannot be linked (then the replace frees it)."""
    try:
        if stat.S_ISDIR(os.lstat(final.name, dir_fd=dfd).st_mode):
            return None
        older = _staged(spool, final.parent, "gone")
        name, there = _beside(spool, older, dfd)
        os.link(final.name, name, src_dir_fd=dfd, dst_dir_fd=there, follow_symlinks=False)
    except OSError:
        return None
    return older


def remove_tree(doomed: Path | None) -> None:
    import shutil

    if doomed is None:
        return
    if doomed.is_dir() and not doomed.is_symlink():
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        doomed.unlink(missing_ok=True)


def _same_fs(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def place(
    spool: Spool,
    staged: Path,
    final: Path,
    shadowed: Path,
    durable: bool = True,
    source: tuple[str, os.stat_result] | None = None,
    staged_dir: int | None = None,
) -> tuple[int, int]:
    """Rename a verified file to its final name and drop the entry it replaces in the mount
    (a plain file shadowing a new archive, or the archive a plain file replaces). The folder
    keeps its mtime: publishing changes nothing the mount shows, and a second `rsync -a`
    must find the folder as it left it. With `source` (the relpath and stat of the spooled
    file it was built from), nothing is placed unless that spooled file is still there unchanged,
    checked under the placing lock: one renamed away or deleted through the mount meanwhile
    is never published over a name that holds something else now. `staged_dir`: the folder
    `staged` is in, a copy beside its target (see `_staged_copy`). Returns (st_dev, st_ino)
    of what was placed."""
    from vfs.decant.writer import fsync_dir

    if durable:
        fd = open_copy(staged, staged_dir)
        try:
            os.fsync(fd)  # its bytes and the metadata just given, before the name points at it
        finally:
            os.close(fd)
    doomed: list[Path | None] = []
    dfd = parent_fd(spool.src, final)  # reached without links: see _link_into_place
    try:
        with _PLACING:  # two workers placing into one folder must not restore each other's mtime
            if source is not None:
                relpath, st = source
                if signature(stat_beneath(spool.files, spool.path(relpath))) != signature(st):
                    raise SourceChangedError(spool.path(relpath))
                _refuse_unchecked(spool, relpath, (final, shadowed), dfd, None, st.st_uid)
            _refuse_hidden(final, dfd)
            before = os.stat(dfd)
            try:
                doomed.append(_keep_older(spool, final, dfd))
                name = _at(staged, staged_dir)
                os.replace(name, final.name, src_dir_fd=staged_dir, dst_dir_fd=dfd)
                doomed.append(set_aside(spool, shadowed, dfd))
                placed = os.stat(final.name, dir_fd=dfd, follow_symlinks=False)
                if source is not None:
                    original = final.with_name(PurePosixPath(source[0]).name)
                    doomed.append(_set_aside_shown_folder(spool, source[0], original, dfd))
                    spool.mark_placed(source[0], placed)
            finally:
                os.utime(_fd_path(dfd), ns=(before.st_atime_ns, before.st_mtime_ns))
        for path in doomed:
            remove_tree(path)
        if durable:
            fsync_dir(Path(_fd_path(dfd)))  # not under the lock: handlers on the loop wait for it
    finally:
        os.close(dfd)
    return _ident(placed)


GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # a name (or a folder above it) went or is a link


def sync_placed(root: Path, targets: list[Path]) -> set[Path]:
    """fsync archives placed without it, then each of their folders once: a batch's metadata
    and names are durable before its spooled copies are deleted. On a journaling filesystem
    the first fsync commits them all, so the others cost little (not syncfs: on a shared disk
    that waits for everyone's dirty data). Each is reached from `root` (SRC) without following
    a link: a name swapped for one since it was placed is not opened as root.

    Returns the targets not synced because they left their names since (renamed or deleted
    through the mount, a folder above them renamed or swapped for a link): their spooled
    copies must stay. One such target used to fail the whole batch: every file in it was
    reported failed and retried 30 s later, doubling, and the folder's owner could do that to
    everyone's files at will."""
    gone: set[Path] = set()
    for target in targets:
        try:
            fsync_beneath(root, target)
        except OSError as exc:
            if exc.errno not in GONE:
                raise
            gone.add(target)
    for folder in {t.parent for t in targets if t not in gone}:
        try:
            fsync_beneath(root, folder)
        except OSError as exc:
            if exc.errno not in GONE:
                raise
            gone |= {t for t in targets if t.parent == folder}
    return gone


def placing_lock() -> threading.Lock:
    """Held by anything else that changes a folder of SRC, so a publish restoring that folder's
    mtime never puts back a value from before the change (rsync setting it, a mkdir)."""
    return _PLACING
