"""The spool: files written into the mount, kept on SRC's filesystem until their archive verifies.

A spooled file lives at `SPOOL/files/<relpath>` — its presented path — so the spool tree is its
own journal: a rename in the mount is one rename here, metadata (mode, owner, mtime) sits on the
file itself, and after a crash every file still in the tree is simply work not yet published.
Synchronous and FUSE-free; the watcher calls `publish` in a worker thread.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vfs.decant import TEMP_PREFIX

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions

log = logging.getLogger(__name__)

# rsync writes `.name.XXXXXX` and renames it into place when the transfer is done.
_TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9]{6}$")
STAGING = Path(".decant-spool") / "staging"
_PLACING = threading.Lock()


def is_temp_name(name: str) -> bool:
    return bool(_TEMP_NAME.match(name))


def archive_name(name: str) -> str:
    return f"{name}.zarr.zip"


@dataclass(frozen=True)
class Published:
    relpath: str
    target: Path  # the archive, or the plain file moved into SRC
    mode: str  # byte-exact | verbatim | plain | already (its archive had verified before)
    reason: str = ""
    signature: tuple[int, ...] = ()  # the spooled file packed: see `Spool.remove`


class Spool:
    def __init__(self, src: Path, files: Path, staging: Path | None = None) -> None:
        """`files` holds spooled files at their presented relpaths (SPOOL/files, or an inbox).
        `staging` (default SRC/.decant-spool/staging, on SRC's filesystem) is where archives
        and plain copies are built before one rename puts them into their folder."""
        self.src = src
        self.files = files
        self.staging = staging or src / STAGING
        self.files.mkdir(parents=True, exist_ok=True)

    def path(self, relpath: str) -> Path:
        return self.files / relpath

    def relpath(self, path: Path) -> str:
        return path.relative_to(self.files).as_posix()

    def listdir(self, reldir: str) -> list[tuple[str, os.stat_result]]:
        """Spooled regular files directly in the presented folder `reldir`."""
        folder = self.files / reldir if reldir else self.files
        out = []
        try:
            with os.scandir(folder) as it:
                for de in it:
                    st = de.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        out.append((de.name, st))
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def create(self, relpath: str, mode: int, uid: int, gid: int) -> int:
        """Create (or truncate) a spooled file; returns an fd open for reading and writing."""
        path = self.path(relpath)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, stat.S_IMODE(mode) | 0o600)
        try:
            os.fchmod(fd, stat.S_IMODE(mode))
            if os.geteuid() == 0:
                os.fchown(fd, uid, gid)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def rename(self, old: str, new: str) -> None:
        target = self.path(new)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path(old), target)

    def adopt(self, real: Path, relpath: str) -> None:
        """Move a real file of SRC into the spool (a real file renamed or reopened for writing)."""
        target = self.path(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(real, target)

    def walk(self) -> dict[str, os.stat_result]:
        """Every spooled file, by relpath."""
        out: dict[str, os.stat_result] = {}
        for folder, _dirs, names in os.walk(self.files):
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
        """Remove empty spool folders from `reldir` up (never the spool root)."""
        folder = self.files / reldir
        while folder != self.files and self.files in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    # -- publishing ------------------------------------------------------------------------

    def publish(self, relpath: str, pack_all: bool, options: PackOptions | None) -> Published:
        """Put the spooled file into SRC: a verified archive (TIFFs, or all with `pack_all`) or
        the plain file itself. The spooled copy is left for the caller to remove, so the mount
        can switch to the published file first."""
        # Imported here: zarr and tifffile cost the daemon's start-up ~0.2 s it need not pay.
        from vfs.decant.packer import PackOptions, file_sha256, pack_file

        options = options or PackOptions()

        source = self.path(relpath)
        st = source.stat()
        folder = self.src / Path(relpath).parent
        folder.mkdir(parents=True, exist_ok=True)  # e.g. a new subfolder of an inbox
        name = source.name
        is_tiff = _looks_like_tiff(source, st.st_size)
        if not is_tiff and not pack_all:
            staged = self._staged(folder, name)
            try:
                _copy_verified(source, staged, st)
                _place(staged, folder / name, folder / archive_name(name))
            finally:
                staged.unlink(missing_ok=True)
            return Published(relpath, folder / name, "plain", signature=_signature(st))
        target = folder / archive_name(name)
        # Hashing first only pays when an archive is there: a restart after publish, pre-cleanup.
        if target.is_file() and _archive_holds(target, st.st_size, file_sha256(source)):
            return Published(relpath, target, "already", signature=_signature(st))
        staged = self._staged(folder, archive_name(name))
        try:
            result = pack_file(source, staged, options)
            _apply_metadata(staged, st)
            _place(staged, target, folder / name)  # a real file of that name would shadow it
        finally:
            staged.unlink(missing_ok=True)
        return Published(relpath, target, result.mode, result.reason, _signature(st))

    def _staged(self, folder: Path, name: str) -> Path:
        """A temp name to build `name` under: in the staging folder, so the target folder sees
        one rename and keeps its mtime (what `rsync -a` set), else beside the target."""
        self.staging.mkdir(parents=True, exist_ok=True)
        where = self.staging if _same_fs(self.staging, folder) else folder
        return where / f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{name}"

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

    def remove(self, relpath: str, signature: tuple[int, ...] = ()) -> bool:
        """Delete a spooled file; with `signature`, only if it is still the file that was
        published (not one renamed over it since). False if it was kept."""
        path = self.path(relpath)
        if signature:
            try:
                if _signature(path.stat()) != signature:
                    return False
            except FileNotFoundError:
                return True
        path.unlink(missing_ok=True)
        self.prune_dirs(str(Path(relpath).parent))
        return True


def _looks_like_tiff(path: Path, size: int) -> bool:
    from vfs.decant.tiffscan import NotByteExact, scan_tiff

    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:2] not in (b"II", b"MM"):
        return False
    try:
        scan_tiff(path, size)
    except NotByteExact as exc:
        return "not a TIFF" not in str(exc)  # compressed TIFFs are still archived (mode V)
    return True


def _archive_holds(archive: Path, size: int, sha: str) -> bool:
    """True when `archive` already holds exactly these bytes (it verified before it was renamed
    into place), so a restart after a crash between publish and cleanup need not pack again."""
    from vfs.decant.reader import DecantArchive

    if not archive.is_file():
        return False
    try:
        with DecantArchive.open(archive) as a:
            (info,) = a.originals()
    except Exception:
        return False
    return info.size == size and info.sha256 == sha


def _apply_metadata(path: Path, st: os.stat_result) -> None:
    """What `rsync -a` gave the file: mode bits, owner, group and (last) mtime."""
    os.chmod(path, stat.S_IMODE(st.st_mode))
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _signature(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _same_fs(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def _copy_verified(source: Path, copy: Path, st: os.stat_result) -> None:
    """A copy, not a rename: the spooled copy must stay until the mount has switched over."""
    from vfs.decant.packer import file_sha256

    shutil.copyfile(source, copy)
    _apply_metadata(copy, st)
    if file_sha256(copy) != file_sha256(source):
        raise OSError(f"{copy}: the copy differs from the spooled file")


def _place(staged: Path, final: Path, shadowed: Path) -> None:
    """Rename a verified file to its final name and drop the entry it replaces in the mount
    (a plain file shadowing a new archive, or the archive a plain file replaces). The folder
    keeps its mtime: publishing changes nothing the mount shows, and a second `rsync -a`
    must find the folder as it left it."""
    from vfs.decant.writer import fsync_dir

    fd = os.open(staged, os.O_RDONLY)
    try:
        os.fsync(fd)  # its bytes and the metadata just given, before the name points at it
    finally:
        os.close(fd)
    folder = final.parent
    with _PLACING:  # two workers placing into one folder must not restore each other's mtime
        before = folder.stat()
        os.replace(staged, final)
        try:
            shadowed.unlink(missing_ok=True)
        finally:
            fsync_dir(folder)
            os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))


def remove_orphans(src: Path, skip: Path) -> list[Path]:
    """Temp archives left by a crash mid-pack: never published, safe to delete."""
    removed = []
    for folder, dirs, names in os.walk(src):
        here = Path(folder)
        found = [n for n in [*names, *dirs] if n.startswith(TEMP_PREFIX)]
        dirs[:] = [d for d in dirs if here / d != skip and not d.startswith(TEMP_PREFIX)]
        for name in found:
            path = here / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed
