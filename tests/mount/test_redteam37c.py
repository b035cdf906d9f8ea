"""Red team, round 37c: folder archives (`NAME.zarr/`) in a local SRC, through a real
`allow_other` mount, as another local user.

Expected bytes come from the arrays handed to tifffile, never from vfs. Each test failed before
the fix its docstring names.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import HAVE_FUSE, Mount, User, open_tmp
from tests.mount.helpers import folder_archive, verdict

pytestmark = pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _folder_archive(base: Path, name: str, seed: int, dest: Path) -> bytes:
    """`dest` (a `NAME.zarr/`): the archive of a random 4×256×256 uint16 stack, packed and
    unzipped, every entry readable by all; returns the TIFF's bytes as written."""
    pixels = np.random.default_rng(seed).integers(0, 4000, (4, 256, 256)).astype(np.uint16)
    tif = base / name
    tifffile.imwrite(tif, pixels)
    return folder_archive(tif, dest)


def _wait_log(m: Mount, text: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while text not in m.log_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_chunk_swapped_after_a_partial_read_is_not_recorded_as_verified(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A user reads 4 KiB of a folder archive's original (its plane is decoded into the
    daemon's cache) and closes it; the archive's owner then swaps the chunk file in `0/` for
    another archive's. The background verification hashed the cached plane (right), then
    recorded the chunk digests from what was on disk now (the other chunk): the folder's own
    stat, which keys the index, does not change when a file in a subfolder does. After a
    remount `sha256sum` printed the other TIFF's hash, exit 0, with `user.decant.verified`
    "yes". Fixed: a folder archive's digest map is recorded only from chunks whose
    reconstruction hashes right (the same files, pinned by inode and ctime), never filled in
    from a later read of the folder."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt37c-swap")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    good = _folder_archive(base, "a.tif", 1, src / "a.tif.zarr")
    other = _folder_archive(base, "b.tif", 2, base / "b.tif.zarr")
    chunk = next(p for p in (src / "a.tif.zarr" / "0").iterdir() if not p.name.startswith("."))
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        shown = m.mnt / "a.tif"
        fd = os.open(shown, os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 65536) == good[65536 : 65536 + 4096]
            swap = chunk.with_name(".swap")
            shutil.copyfile(base / "b.tif.zarr" / "0" / chunk.name, swap)
            os.rename(swap, chunk)
        finally:
            os.close(fd)  # closed early: a background verification is queued
        assert _wait_log(m, "a.tif.zarr: verified sha256")
        _wait_log(m, "not recorded as verified", timeout=1.0)  # its digests recorded, or not
        m.stop()
        m.start("-o", "allow_other", "--read-only")
        got = u._probe("read(p)", {"p": str(m.mnt / "a.tif")})
        assert got.get("ok") != _sha(other), "the other archive's bytes served as verified"
        assert got == {"errno": errno.EIO}
        assert verdict(m.mnt / "a.tif") != "yes"
    finally:
        m.stop()


@pytest.mark.parametrize("private", [".decant/manifest.json", ".decant"])
def test_a_folder_archive_s_private_manifest_is_not_told_to_others(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, private: str
) -> None:
    """A folder archive (0755) whose owner keeps `.decant/manifest.json` 0600 (or `.decant/`
    0700): another user cannot read the manifest in SRC, but the root daemon read it and showed
    its original 0444, so that user read the original's sha256, mode and archive path with
    `getfattr -d` (and `access(R_OK)` said yes; only the open was refused). Fixed: a folder
    archive's original is shown with the read (and search) bits of each class only where that
    class may read its manifest, as a nested series member takes its bundle's."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt37c-manifest")
    src = base / "src"
    src.mkdir(mode=0o755)
    src.chmod(0o755)
    written = _folder_archive(base, "a.tif", 3, src / "a.tif.zarr")
    (src / "a.tif.zarr" / private).chmod(0o700 if private == ".decant" else 0o600)
    assert u.errno_of("read(p)", p=src / "a.tif.zarr" / ".decant/manifest.json") == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        shown = m.mnt / "a.tif"
        assert shown.read_bytes() == written  # its owner (root) reads it
        got = u.errno_of("os.getxattr(p, 'user.decant.sha256')", p=shown)
        assert got == errno.EACCES, "another user read the sha256 of a manifest kept private"
        assert not u.value_of("os.access(p, os.R_OK)", p=shown)
        assert stat.S_IMODE(shown.stat().st_mode) == 0o400
    finally:
        m.stop()


HAMMER = """
import os, sys, threading, time
end = time.monotonic() + float(sys.argv[2])
def loop():
    while time.monotonic() < end:
        try:
            os.close(os.open(sys.argv[1], os.O_RDONLY))
        except OSError:
            pass
threads = [threading.Thread(target=loop) for _ in range(44)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_opens_of_a_folder_archive_of_many_files_do_not_stall_other_users(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """Each open by a user other than root walks the whole folder archive (may the caller read
    every file?): ~3 ms per 1,000 files, on the daemon's shared worker threads. One user
    opening a folder archive of 100,000 files from 64 threads (its own, or any they may read)
    held every thread: another user's `cat` of a plain file elsewhere in the mount took 23 s.
    Fixed: these walks take at most 4 threads per calling user, as listings do per owner."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt37c-walks")
    src = base / "src"
    (src / "big").mkdir(parents=True)
    (src / "other").mkdir()
    for d in (src, src / "big", src / "other"):
        d.chmod(0o755)
    folder = src / "big" / "a.tif.zarr"
    _folder_archive(base, "a.tif", 4, folder)
    junk = folder / "0" / "junk"
    junk.mkdir(mode=0o755)
    for i in range(12_000):
        (junk / str(i)).touch(mode=0o644)
    plain = src / "other" / "plain.txt"
    plain.write_bytes(b"hello\n")
    plain.chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        shown = m.mnt / "big" / "a.tif"
        assert u.value_of("os.path.getsize(p)", p=shown) > 0
        from tests.mount.conftest import RUNUSER, SYSTEM_PYTHON

        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        hammer = subprocess.Popen([RUNUSER, "-u", u.name, "--", str(SYSTEM_PYTHON), "-I", "-c",
                                   HAMMER, str(shown), "30"], env=env, cwd="/",
                                  start_new_session=True)  # fmt: skip
        try:
            time.sleep(1.0)
            t0 = time.monotonic()
            assert (m.mnt / "other" / "plain.txt").read_bytes() == b"hello\n"
            waited = time.monotonic() - t0
        finally:
            os.killpg(hammer.pid, signal.SIGKILL)
            shutil.rmtree(junk)  # the walks the daemon still has queued end fast
            hammer.wait(timeout=60)
        assert waited < 0.5, f"a plain file took {waited:.1f} s to open and read"
    finally:
        m.stop()


STEAL = """
import os, sys
shown, chunk, secret = sys.argv[1:4]
fd = os.open(shown, os.O_RDONLY)  # every file of the archive is the caller's: the check passes
os.rename(secret, chunk)  # the other user's private file, renamed into the archive
try:
    data = os.pread(fd, os.fstat(fd).st_size - 1, 0)  # all but the last byte: no verdict yet
    print(data.hex())
except OSError as exc:
    print("errno", exc.errno)
"""


def test_another_user_s_private_file_renamed_into_a_folder_archive_is_not_served(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A user may write a shared folder without the sticky bit (a 0777 or 2775 lab share)
    where another user keeps a private (0600) file. The user makes a folder archive there of a
    verbatim file of the same size whose one chunk is stored raw (`"compressor": null`), opens
    its original through the mount (every file in it is theirs: the access walk passes), then
    renames the other user's file over the chunk. The root daemon read it as the chunk and
    served all but the last byte of the private file (the last read alone fails the sha256).
    Fixed: in the daemon, a folder archive's file is read only if it is the folder owner's
    or readable by all."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt37c-steal")
    src = base / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    src.chmod(0o755)
    shared.chmod(0o777)
    from vfs.decant.packer import pack_file

    size = 20_000
    mine = base / "mine.bin"
    mine.write_bytes(b"B" * size)
    pack_file(mine, base / "mine.bin.zarr.zip")
    folder = shared / "mine.bin.zarr"
    with zipfile.ZipFile(base / "mine.bin.zarr.zip") as zf:
        zf.extractall(folder)
    zarray = folder / "original" / ".zarray"
    doc = json.loads(zarray.read_text())
    doc.update(compressor=None, chunks=[size])
    zarray.write_text(json.dumps(doc))
    (folder / "original" / "0").write_bytes(b"B" * size)
    for dirpath, _dirs, files in os.walk(folder):
        os.chown(dirpath, u.uid, u.gid)
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chown(os.path.join(dirpath, f), u.uid, u.gid)
            os.chmod(os.path.join(dirpath, f), 0o644)
    secret = shared / "secret"
    private = os.urandom(size)
    secret.write_bytes(private)
    secret.chmod(0o600)  # root's: the user may not read it, but may rename it (0777 folder)
    assert u.errno_of("read(p)", p=secret) == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        shown = m.mnt / "shared" / "mine.bin"
        from tests.mount.conftest import SYSTEM_PYTHON

        done = u.run(str(SYSTEM_PYTHON), "-I", "-c", STEAL, str(shown),
                     str(folder / "original" / "0"), str(secret))  # fmt: skip
        assert done.returncode == 0, done.stderr
        out = done.stdout.strip()
        assert out != private[:-1].hex(), "another user's 0600 file served through the mount"
        assert out == f"errno {errno.EIO}"
        assert "original/0" in m.log_text()
    finally:
        m.stop()
