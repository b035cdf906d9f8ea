"""Decant archives (spec v1): pure, synchronous format logic — no FUSE, no trio."""

import hashlib
import os
import secrets
import stat
import struct

SUPPORTED_FORMATS = frozenset({1})
TEMP_PREFIX = ".decant-tmp-"  # archives being written carry it until renamed into place
MANIFEST_KEY = ".decant/manifest.json"
_NAME_MAX = 255


def temp_name(name: str) -> str:
    """A fresh temp name for building `name` beside it: TEMP_PREFIX, the pid, a random tag and
    as much of the end of `name` as fits in NAME_MAX bytes (its suffix, `.zarr.zip`, says
    what is built). `name` itself may be up to NAME_MAX long; when it is a temp name already
    (an archive staged at one is built beside it), its own head is dropped."""
    if name.startswith(TEMP_PREFIX):
        name = name[len(TEMP_PREFIX) :].split("-", 2)[-1]
    head = f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
    room = _NAME_MAX - len(head)
    while len(os.fsencode(name)) > room:
        name = name[1:]
    return head + name


def archive_stem(name: str) -> str:
    for suffix in (".zarr.zip", ".zarr"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def folded_stat(folder: os.stat_result, manifest: os.stat_result) -> os.stat_result:
    """A folder archive's stat as its version is taken from: the folder's own, its ctime
    standing for the folder's and its manifest's (inode, size, mtime, ctime) together. Its
    files are rewritten in place (`cp -r B.zarr/. x.zarr/`) with no change to the folder's own
    stat, and the manifest is what it is described from: a new manifest is a new version of
    the archive (its nodes, index rows, open archives and cached pages are keyed by it)."""
    packed = struct.pack("<qQqqq", folder.st_ctime_ns, manifest.st_ino, manifest.st_size,
                         manifest.st_mtime_ns, manifest.st_ctime_ns)  # fmt: skip
    # 63 bits: the index keeps it in a signed 64-bit column, as a real ctime.
    ctime_ns = int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "big") >> 1
    fields = {name: getattr(folder, name) for name in dir(folder) if name.startswith("st_")}
    fields.update(st_ctime_ns=ctime_ns, st_ctime=ctime_ns / 1e9)
    seq = list(folder)[: os.stat_result.n_sequence_fields]
    seq[stat.ST_CTIME] = ctime_ns // 1_000_000_000
    return os.stat_result(seq, fields)


def archive_stat(path: os.PathLike[str] | str, st: os.stat_result) -> os.stat_result:
    """The stat a local archive's version is taken from, given its own (`st`): a zip's is
    itself; a folder archive's has its manifest's folded in (`folded_stat`). One whose manifest
    is not a regular file now (`manifest_stat`) keeps `st` as it is, a version no listing of
    the archive had."""
    if not stat.S_ISDIR(st.st_mode):
        return st
    manifest = manifest_stat(path)
    return st if manifest is None else folded_stat(st, manifest)


def manifest_stat(path: os.PathLike[str] | str) -> os.stat_result | None:
    """The stat of the folder `path`'s manifest (MANIFEST_KEY) if it is a regular file, else
    None. Reached without following links: the folder's owner may point `.decant` anywhere,
    into the mountpoint even, or into a folder of another user's to learn, from how the mount
    shows their folder, whether a name exists there (red team 68, F2)."""
    folder, _sep, name = MANIFEST_KEY.partition("/")
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # search, not read
    try:
        top = os.open(path, flags)
    except OSError:
        return None
    try:
        sub = os.open(folder, flags, dir_fd=top)
        try:
            manifest = os.stat(name, dir_fd=sub, follow_symlinks=False)
        finally:
            os.close(sub)
    except OSError:
        return None
    finally:
        os.close(top)
    return manifest if stat.S_ISREG(manifest.st_mode) else None
