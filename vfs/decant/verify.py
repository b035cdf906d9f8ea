"""Reconstruct-and-hash: the pack-side gate, `decant verify` and `decant restore`."""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from vfs.cache import PageCache
from vfs.decant.reader import DecantArchive, OriginalInfo, OriginalReader
from vfs.decant.restore import DECODERS, damaged_chunks, decoded, write_original
from vfs.decant.store import archive_stem
from vfs.errors import IntegrityError, UnsafeMemberError
from vfs.names import name_problem

AHEAD = 2  # planes in flight beyond the one being consumed, for the private cache's size


def private_cache(archive: DecantArchive) -> PageCache:
    """Enough for streaming with AHEAD planes in flight: the page being read, the pages being
    decoded ahead, and husk blocks. Pages evicted while still queued stay alive through their
    views (restore.decoded), so this bounds reuse, not correctness."""
    pages = [p for p in archive.manifest.pages] + [
        p for m in archive.manifest.members for p in m.pages
    ]
    largest = max((p.nbytes for p in pages), default=0)
    return PageCache((AHEAD + 1) * largest + 8 * 1024 * 1024)


@dataclass(frozen=True)
class Verdict:
    relpath: str
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


def verify_archive(path: Path, progress: Callable[[int], None] | None = None) -> list[Verdict]:
    """Reconstruct every original in `path` and compare sha256 with the manifest."""
    with DecantArchive.open(path) as archive:
        return verify_opened(archive, progress)


def verify_opened(
    archive: DecantArchive, progress: Callable[[int], None] | None = None
) -> list[Verdict]:
    """`verify_archive` of an archive already open, wherever its bytes live."""
    verdicts = []
    cache = private_cache(archive)
    for info in archive.originals():
        reader = archive.open_original(info.relpath, cache)
        digest = hashlib.sha256()
        with ThreadPoolExecutor(DECODERS, thread_name_prefix="decant-verify") as decoders:
            for views in decoded(reader, decoders):
                for view in views:
                    digest.update(view)
                if progress:
                    progress(sum(len(v) for v in views))
        verdicts.append(Verdict(info.relpath, info.sha256, digest.hexdigest()))
    return verdicts


def require_verified(path: Path, expected: dict[str, str] | None = None) -> None:
    """Raise IntegrityError unless every original reconstructs to its recorded (or given) digest."""
    for v in verify_archive(path):
        want = expected.get(v.relpath, v.expected) if expected else v.expected
        if v.actual != want or not v.ok:
            raise IntegrityError(
                f"{path}: {v.relpath} reconstructs to sha256 {v.actual}, expected {want}"
            )


def restore_archive(
    path: Path, out: Path | None, workdir: Path, progress: Callable[[int], None] | None = None
) -> list[Path]:
    """Write the original(s) through temp files + rename; nothing is left on a digest mismatch.

    `out` names the file (modes D/V) or the folder that receives series members; default: the
    original's name in `workdir`.
    """
    with DecantArchive.open(path) as archive:
        return restore_opened(archive, path.name, out, workdir, progress)


def restore_opened(
    archive: DecantArchive,
    name: str,
    out: Path | None,
    workdir: Path,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """`restore_archive` of an archive already open (`name`: the archive's file name).

    Folders are reached (and made) one component at a time from descriptors: a symlink on the
    way is followed only if it is the caller's or root's (`output_folder`), so a link another
    user planted in a shared folder (`cd /tmp && decant restore run.zarr`, `run` planted
    there) cannot send what root restores into a folder of the link's choosing."""
    written: list[Path] = []
    cache = private_cache(archive)
    series = archive.manifest.mode == "series"
    if series and out is None and name_problem(archive_stem(name)):
        raise UnsafeMemberError(f"{name}: its name gives no folder to restore the series into")
    for info in archive.originals():
        if series:
            target = (out or workdir / archive_stem(name)) / info.relpath
        else:
            target = out or workdir / info.relpath
        dfd = output_folder(target.parent)
        try:
            why = swappable(os.fstat(dfd))
            if why is not None:
                raise OSError(errno.EPERM, f"{target.parent} {why}: not written there")
            if out is None and not series:
                _refuse_existing(dfd, target)
            tmp = restore_temp_name(target.name)
            made: list[str] = []  # the temp file, once this restore made it
            try:
                reader = archive.open_original(info.relpath, cache)
                _restore_one(reader, dfd, tmp, target, info, progress, made)
                try:
                    os.replace(tmp, target.name, src_dir_fd=dfd, dst_dir_fd=dfd)
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror, str(target)) from None
                written.append(target)
            finally:
                if made:  # one of that name we did not make (planted in /tmp) is not ours
                    with suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=dfd)
        finally:
            os.close(dfd)
    return written


def _refuse_existing(dfd: int, target: Path) -> None:
    """Without -o the manifest names the output, a name the command line does not show
    (`cd ~ && decant restore scan.tif.zarr.zip`, whose original_name is `.bashrc`): what is
    there already is not replaced. (A series goes into the folder the archive's own name
    gives, which the command shows.) Checked before writing; one that appears meanwhile is
    replaced, as with -o."""
    try:
        os.stat(target.name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    raise OSError(errno.EEXIST, "already exists (not replaced: -o names the output)", str(target))


# Bytes of the original's name its temp file keeps: with the dot and the suffix, well under
# NAME_MAX even for a name of 255 bytes, which the whole name would push past it.
TEMP_KEEP = 128


def restore_temp_name(name: str) -> str:
    """`.NAME.decant-restore-PID-RANDOM`, NAME cut to TEMP_KEEP bytes (mid-character is fine:
    the cut bytes go back to the kernel as they were). Random too: with the PID alone, anyone
    could plant the name in a shared folder (`-o /tmp/scan.tif`) and fail root's restore with
    EEXIST at will. Not vfs.decant.temp_name: what the mount and the spool take for their own
    temp files is not a restore's."""
    stem = os.fsdecode(os.fsencode(name)[:TEMP_KEEP])
    return f".{stem}.decant-restore-{os.getpid()}-{_token()}"


def _token() -> str:
    return secrets.token_hex(4)


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_AT = os.O_PATH | os.O_DIRECTORY | _CLOEXEC


def output_folder(path: Path) -> int:
    """An O_PATH descriptor of the folder `path` (made, with its parents, where missing),
    walked to from `/` (or the working folder) one component at a time. A symlink met on the
    way is followed only if the caller or root owns it: one of another user's is refused
    (ELOOP), wherever it stands. A folder made is 0777 less the umask, as `mkdir -p` makes it."""
    fd = os.open("/" if path.is_absolute() else ".", _AT)
    for part in path.parts[1:] if path.is_absolute() else path.parts:
        try:
            fd = _step(fd, part, path)
        except OSError as exc:
            if exc.filename != part:
                raise
            raise OSError(exc.errno, exc.strerror, str(path)) from None  # the path, not `part`
    return fd


def _step(fd: int, part: str, path: Path, make: bool = True, flags: int = _AT) -> int:
    """The entry `part` of the folder `fd` (which this closes, raising or not) opened with
    `flags`, as `output_folder` walks: a link is followed only if the caller or root owns
    it; a missing folder is made where `make`."""
    try:
        try:
            nfd = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            if not make:
                raise
            with suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            nfd = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                raise
            if st.st_uid not in (0, os.geteuid()):
                raise OSError(
                    errno.ELOOP,
                    f"{part!r} on the way is a symlink of uid {st.st_uid}'s (not followed)",
                    str(path),
                ) from None
            nfd = os.open(part, flags, dir_fd=fd)
    finally:
        os.close(fd)
    return nfd


def reach(path: Path, flags: int) -> int:
    """`os.open(path, flags)`, walked from `/` (or the working folder) one component at a time,
    the last one too: a symlink met is followed only if the caller or root owns it. An input
    given as another user's link (`/tmp/scan.tif` to a 0644 file inside root's 0700 folder)
    was packed, or restored, into a file that user could read (red team 64, F1)."""
    parts = path.parts[1:] if path.is_absolute() else path.parts
    if not parts or parts[-1] in (".", ".."):
        return os.open(path, flags)
    fd = os.open("/" if path.is_absolute() else ".", _AT)
    for part in parts[:-1]:
        try:
            fd = _step(fd, part, path, make=False)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        return _step(fd, parts[-1], path, make=False, flags=flags)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def swappable(st: os.stat_result) -> str | None:
    """Why another user could rename entries of the folder `st` describes (its owner, or any
    user who may write it without the sticky bit), or None. Written there by name, a temp
    file was swapped for a link between two opens, and root's pack overwrote and chmodded a
    file of root's choosing (red team 62, F1); a restore's temp file was renamed over with
    the user's bytes, which root then published as the original (red team 64, F2)."""
    if st.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & stat.S_ISVTX:
        return None
    # The group of one's own folder under a user-private-group umask (002) is one's own.
    group = st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid()
    if st.st_mode & stat.S_IWOTH or group:
        return f"is writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def restored_bits(store: object) -> int:
    """The mode an original is restored with (less the umask, as `cp` makes a copy): the
    archive's read and write bits, which a pack took from the original (a folder archive's
    files' bits). Restored 0666 less the umask, root's 0600 original came back 0644, readable
    by every user (red team 63, F3). An archive with no local file (a bucket's): 0666."""
    st = getattr(store, "stat", None)
    return stat.S_IMODE(st.st_mode) & 0o666 if st is not None else 0o666


def _restore_one(
    reader: OriginalReader,
    dfd: int,
    tmp: str,
    target: Path,
    info: OriginalInfo,
    progress: Callable[[int], None] | None,
    made: list[str] | None = None,
) -> None:
    """Write one original to `tmp` (a new file of the folder `dfd`, noted in `made` once
    made) and fsync it; raise IntegrityError unless its sha256 is the manifest's. The store's
    per-chunk CRC check is off meanwhile (the sha256 covers every byte); on a mismatch the
    chunks are checked again to name the damaged ones."""
    store = reader.archive.store
    crc = getattr(store, "verify_crc", None)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, restored_bits(store), dir_fd=dfd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(target.parent / tmp)) from None
    if made is not None:
        made.append(tmp)
    try:
        if crc is not None:
            store.verify_crc = False  # type: ignore[attr-defined]
        actual = write_original(reader, fd, progress)
        os.fsync(fd)
    finally:
        os.close(fd)
        if crc is not None:
            store.verify_crc = crc  # type: ignore[attr-defined]
    if actual != info.sha256:
        damage = "".join(f"; {line}" for line in damaged_chunks(store))
        raise IntegrityError(
            f"{reader.archive.path}: {info.relpath} reconstructs to sha256 "
            f"{actual}, expected {info.sha256}{damage}; nothing written"
        )
