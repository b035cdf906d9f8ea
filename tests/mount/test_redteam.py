"""A hostile local user who may write one folder of SRC, against a mount run by root with
`-o allow_other` (README, "Security model"). test_access_control.py and test_containment.py
cover what the user asks of the mount directly; here the user changes SRC *under* the mount:
an entry the kernel and the daemon already know is swapped for a symlink, a FIFO or another
folder between the daemon's look at it and its use. The daemon acts as root, so whatever it
does by path after such a swap it does to the swap's target.

Every attack runs as `decant-test-user` in one process (it must hold a descriptor across the
swap); its targets are root's files outside SRC, and each test checks them from root's side.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import SYSTEM_PYTHON, Mount, User, open_tmp
from tests.toolbox import load_tool
from vfs.decant.packer import PackOptions, pack_file

corpus = load_tool("make_c4gh_corpus")
acq = load_tool("make_acqstore_corpus")

SECRET = b"root's secret: never through the mount\n"

# Runs as the user. argv[1] is the attack's name, argv[2] a JSON object of paths. Prints one
# JSON object: what each step gave (bytes as text, or {"errno": N}).
ATTACK = r"""
import json, os, sys, time
what, p = sys.argv[1], json.loads(sys.argv[2])
out = {}
def step(name, fn):
    try:
        value = fn()
        out[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    except OSError as exc:
        out[name] = {"errno": exc.errno}
def swap(path, make):
    if os.path.isdir(path):
        os.rename(path, path + ".old")      # a folder cannot be renamed over: move it away
    tmp = path + ".swap"
    make(tmp)
    os.rename(tmp, path)
def mine(path, size=256):
    with open(path, "wb") as fh:
        fh.write(b"m" * size)
def shown(path):
    deadline = time.monotonic() + 15          # until the watcher or a re-check shows it
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
if what in ("read", "chmod", "write", "fifo", "stat"):
    mine(p["real"])
    shown(p["shown"])
    fd = os.open(p["shown"], os.O_RDONLY)   # the kernel and the daemon know the inode now
    os.fstat(fd)
    if what == "fifo":
        swap(p["real"], os.mkfifo)
    else:
        swap(p["real"], lambda t: os.symlink(p["target"], t))
    again = "/proc/self/fd/%d" % fd         # the same inode, without a fresh lookup
    if what == "stat":
        time.sleep(2.5)                      # past the attribute timeout: the kernel asks again
        step("stat", lambda: [os.fstat(fd).st_size, os.fstat(fd).st_uid])
    elif what == "read" or what == "fifo":
        step("read", lambda: os.read(os.open(again, os.O_RDONLY), 4096))
    elif what == "chmod":
        step("fchmod", lambda: os.fchmod(fd, 0o666))
        step("fchgrp", lambda: os.fchown(fd, -1, os.getgid()))
        step("futime", lambda: os.utime(fd, (0, 0)))
    elif what == "write":
        def write():
            w = os.open(again, os.O_WRONLY | os.O_TRUNC)
            try:
                return os.write(w, b"owned by the user\n")
            finally:
                os.close(w)
        step("write", write)
elif what == "archive":
    shown(p["shown"])
    fd = os.open(p["shown"], os.O_RDONLY)
    os.read(fd, 16)                          # the daemon has opened the user's own archive
    swap(p["real"], lambda t: os.symlink(p["target"], t))
    def reread():
        again = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY)
        os.posix_fadvise(again, 0, 0, os.POSIX_FADV_DONTNEED)  # drop what the kernel cached
        return os.pread(again, 4096, int(p["offset"]))
    step("read", reread)
elif what == "publish":
    os.mkdir(p["real"])
    shown(p["shown"])
    fd = os.open(p["shown"] + "/evil.sh", os.O_WRONLY | os.O_CREAT, 0o755)  # spooled
    os.write(fd, b"echo run by whoever sources this folder\n")
    swap(p["real"], lambda t: os.symlink(p["target"], t))
    os.close(fd)                             # published once settled (0.5 s)
    time.sleep(4)
    out["done"] = True
elif what in ("rename", "rmdir"):
    os.mkdir(p["real"])
    inner = p["real"] + "/" + p["inner"]
    if what == "rename":
        mine(p["real"] + ".mine")
        shown(p["shown"] + ".mine")
    else:
        os.mkdir(inner)
        shown(p["shown"] + "/" + p["inner"])
    dfd = os.open(p["shown"], os.O_RDONLY | os.O_DIRECTORY)
    os.listdir(dfd)
    swap(p["real"], lambda t: os.symlink(p["target"], t))
    if what == "rename":                     # into the folder, by its descriptor
        step("rename", lambda: os.rename(p["shown"] + ".mine", "planted", dst_dir_fd=dfd))
    else:
        step("rmdir", lambda: os.rmdir(p["inner"], dir_fd=dfd))
elif what in ("list", "mkdir"):
    os.mkdir(p["real"])
    shown(p["shown"])
    dfd = os.open(p["shown"], os.O_RDONLY | os.O_DIRECTORY)
    os.listdir(dfd)
    swap(p["real"], lambda t: os.symlink(p["target"], t))
    if what == "list":
        time.sleep(1.2)                      # past the daemon's 1 s re-check of the folder
        step("list", lambda: sorted(os.listdir(dfd)))
        step("read", lambda: os.read(os.open("inside.txt", os.O_RDONLY, dir_fd=dfd), 4096))
    else:
        step("mkdir", lambda: os.mkdir("made-by-user", dir_fd=dfd))
print(json.dumps(out))
"""


@dataclass
class Swaps:
    m: Mount
    src: Path
    vault: Path  # root's 0700 folder outside SRC
    base: Path
    public: Path  # root's 0755 folder outside SRC, which nobody else may write
    keys: dict[str, Any]  # crypt4gh key pairs: the mount's ("node") and a package writer's

    def secret(self, name: str) -> Path:
        """A root's 0600 file outside SRC, one per attack (a successful one changes it)."""
        path = self.base / f"secret-{name}"
        path.write_bytes(SECRET)
        path.chmod(0o600)
        return path


@pytest.fixture(scope="module")
def swaps(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[Swaps]:
    base = open_tmp(tmp_path_factory, "swaps")
    src, vault, public = base / "src", base / "vault", base / "public"
    src.mkdir(mode=0o755)
    (src / "userdir").mkdir(mode=0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    (src / "plain.txt").write_bytes(b"a plain file\n")
    vault.mkdir(mode=0o700)
    (vault / "inside.txt").write_bytes(b"0644, but in root's 0700 folder\n")
    (vault / "inside.txt").chmod(0o644)
    public.mkdir(mode=0o755)
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    # The user's own packages are decrypted for it (--c4gh-owner): what a swap may then reach.
    m.start("-o", "allow_other", "--settle", "0.5", "--c4gh-key", str(keys["node"].secret_path),
            "--c4gh-owner", unprivileged.name, "--c4gh-owner", "0")  # fmt: skip
    try:
        yield Swaps(m, src, vault, base, public, keys)
    finally:
        unblock_fifos(src)
        m.stop()


def unblock_fifos(src: Path) -> None:
    """A daemon thread stuck opening a FIFO for reading is let go by a writer."""
    for path in (src / "userdir").iterdir():
        if stat.S_ISFIFO(path.lstat().st_mode):
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def attack(
    u: User,
    s: Swaps,
    what: str,
    name: str,
    target: Path,
    timeout: float = 20.0,
    shown: str = "",
    offset: int = 0,
) -> dict[str, Any]:
    paths = {"real": s.src / "userdir" / name, "shown": s.m.mnt / "userdir" / (shown or name),
             "target": target, "inner": "keep", "offset": offset}  # fmt: skip
    args = json.dumps({k: str(v) for k, v in paths.items()})
    done = u.run(str(SYSTEM_PYTHON), "-I", "-c", ATTACK, what, args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def still_serves(s: Swaps) -> None:
    got = subprocess.run(["cat", str(s.m.mnt / "plain.txt")], capture_output=True, timeout=10)
    assert got.stdout == b"a plain file\n"
    assert s.m.proc is not None and s.m.proc.poll() is None, "the daemon died"


def test_read_through_a_file_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """The user's own file, known to the kernel, becomes a link to root's 0600 file: reopening
    the same inode must not make the daemon open the link's target as root."""
    got = attack(unprivileged, swaps, "read", "r.txt", swaps.secret("read"))
    assert "root's secret" not in str(got["read"]), got
    still_serves(swaps)


def test_stat_through_a_file_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """fstat of the user's own file after it became a link to root's file in a 0700 folder:
    the daemon must not report the target's size and owner (it stats by path)."""
    hidden = swaps.vault / "sized.txt"
    hidden.write_bytes(b"x" * 12345)
    got = attack(unprivileged, swaps, "stat", "s.txt", hidden)
    assert got["stat"] != [12345, 0], got
    still_serves(swaps)


def test_chmod_through_a_file_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """fchmod/fchown/futimes on the user's own file after it became a link: the daemon must
    not chmod, chgrp or touch the link's target (root's file) on the user's behalf."""
    secret = swaps.secret("chmod")
    before = secret.stat()
    got = attack(unprivileged, swaps, "chmod", "c.txt", secret)
    after = secret.stat()
    assert stat.S_IMODE(after.st_mode) == 0o600, (got, oct(after.st_mode))
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid), got
    assert after.st_mtime_ns == before.st_mtime_ns, got
    still_serves(swaps)


def test_write_through_a_file_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """Opening the user's own file for writing after it became a link: the daemon adopts it
    into the spool and opens it there; it must never open the link's target for writing."""
    secret = swaps.secret("write")
    got = attack(unprivileged, swaps, "write", "w.txt", secret)
    assert secret.read_bytes() == SECRET, got
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    still_serves(swaps)


def test_open_of_a_file_swapped_for_a_fifo_does_not_hang(swaps: Swaps, unprivileged: User) -> None:
    """A FIFO opened for reading blocks until a writer comes: the daemon must not wait for one
    (40 such opens would take every worker thread, and the whole mount with them)."""
    started = time.monotonic()
    try:
        got = attack(unprivileged, swaps, "fifo", "f.txt", swaps.base, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("open of a FIFO through the mount hung for 10 s")
    finally:
        unblock_fifos(swaps.src)
    assert isinstance(got["read"], dict), got  # an error, not bytes
    assert time.monotonic() - started < 10
    still_serves(swaps)


def test_list_a_folder_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """The user's own folder, held open, becomes a link to root's 0700 folder: listing the
    descriptor again must not list (or open) what is inside root's folder."""
    got = attack(unprivileged, swaps, "list", "d", swaps.vault)
    assert got["list"] == [] or isinstance(got["list"], dict), got
    assert "0644, but in root's" not in str(got["read"]), got
    still_serves(swaps)


def test_mkdir_in_a_folder_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """mkdir in the user's own folder after it became a link to a folder of root's: the daemon
    must not create (and chown to the user) a folder there."""
    got = attack(unprivileged, swaps, "mkdir", "k", swaps.public)
    assert os.listdir(swaps.public) == [], got
    still_serves(swaps)


def test_publish_into_a_folder_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """A file written into the user's folder, and the folder swapped for a link to root's
    folder before the file settles: publishing must not place the user's file there (think
    /etc/profile.d)."""
    got = attack(unprivileged, swaps, "publish", "q", swaps.public)
    assert os.listdir(swaps.public) == [], got
    still_serves(swaps)


def test_read_through_an_archive_swapped_for_a_symlink(
    swaps: Swaps, unprivileged: User, tmp_path: Path
) -> None:
    """The user's own archive, open through the mount, becomes a link to root's 0600 archive:
    a fresh open of the same presented file must not decode root's archive (a partial read is
    served before any hash could object)."""
    secret_text = SECRET * 8000  # ~300 KiB: 4 KiB of it is a partial read
    mine_text = b"m" * len(secret_text)
    for name, data, where in (("victim", secret_text, swaps.base), ("mine", mine_text, None)):
        (tmp_path / f"{name}.bin").write_bytes(data)
        out = (where or swaps.src / "userdir") / f"{name}.bin.zarr.zip"
        pack_file(tmp_path / f"{name}.bin", out, PackOptions(mode="verbatim"))
        if where is None:
            os.chown(out, unprivileged.uid, unprivileged.gid)
        else:
            out.chmod(0o600)
    got = attack(unprivileged, swaps, "archive", "mine.bin.zarr.zip",
                 swaps.base / "victim.bin.zarr.zip", shown="mine.bin")  # fmt: skip
    assert "root's secret" not in str(got["read"]), str(got)[:200]
    still_serves(swaps)


def test_read_through_a_package_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """The same with GDI packages: the user's own package (encrypted to the node's public key,
    which anyone may do), swapped for a link to root's 0600 package while a member is open,
    must not make the daemon decrypt root's package for the user."""
    secret_text = SECRET * ((4 << 20) // len(SECRET))  # 4 MiB: far past the kernel's read-ahead
    vault = swaps.base / "vault3"
    vault.mkdir(mode=0o700)
    node, writer = swaps.keys["node"], swaps.keys["writer"]
    victim, mine = vault / "victim.tar.c4gh", swaps.src / "userdir" / "mine.tar.c4gh"
    corpus.write_package(victim, corpus.with_manifest([("data.txt", secret_text)]), writer,
                         [node])  # fmt: skip
    victim.chmod(0o600)
    corpus.write_package(mine, corpus.with_manifest([("data.txt", b"m" * len(secret_text))]),
                         writer, [node])  # fmt: skip
    os.chown(mine, unprivileged.uid, unprivileged.gid)
    got = attack(unprivileged, swaps, "archive", "mine.tar.c4gh", victim,
                 shown="mine.tar.c4gh/data.txt", offset=3 << 20)  # fmt: skip
    assert "root's secret" not in str(got["read"]), str(got)[:200]
    still_serves(swaps)


def test_read_through_a_collection_document_swapped_for_a_symlink(
    swaps: Swaps, unprivileged: User, tmp_path: Path
) -> None:
    """An AcqStore collection the user owns: a table its members/ view shows, swapped for a
    link to root's 0600 file while open, must not be read as root for the user."""
    tif = tmp_path / "scan.tif"
    tifffile.imwrite(tif, np.arange(2 * 16 * 16, dtype=np.uint16).reshape(2, 16, 16))
    packed = pack_file(tif, tmp_path / "scan.tif.zarr.zip")
    coll = swaps.src / "userdir" / "coll"
    acq.make_collection(coll, decant_archive=packed.archive)
    for path in (coll, *coll.rglob("*")):
        os.chown(path, unprivileged.uid, unprivileged.gid, follow_symlinks=False)
    doc = json.loads((coll / "acqstore/collection.json").read_text())
    table = doc["resources"]["tables"][0]
    secret = swaps.secret("table")
    got = attack(unprivileged, swaps, "archive", f"coll/{table['path']}", secret,
                 shown=f"coll/members/tables/{table['id']}.csv")  # fmt: skip
    assert "root's secret" not in str(got["read"]), str(got)[:200]
    still_serves(swaps)


def test_read_through_a_folder_archive_swapped_for_a_symlink(
    swaps: Swaps, unprivileged: User, tmp_path: Path
) -> None:
    """The same with `.zarr/` folder archives: the user's own, swapped for a link to root's
    (in a 0700 folder) while its original is open."""
    secret_text = SECRET * 8000
    vault = swaps.base / "vault2"
    vault.mkdir(mode=0o700)
    mine = b"m" * len(secret_text)
    for name, data, where in (("victim2", secret_text, vault),
                              ("mine2", mine, swaps.src / "userdir")):  # fmt: skip
        (tmp_path / f"{name}.bin").write_bytes(data)
        packed = tmp_path / f"{name}.bin.zarr.zip"
        pack_file(tmp_path / f"{name}.bin", packed, PackOptions(mode="verbatim"))
        folder = where / f"{name}.bin.zarr"
        with zipfile.ZipFile(packed) as zf:
            zf.extractall(folder)  # the same keys as files: a directory archive
        if where != vault:
            for path in (folder, *folder.rglob("*")):
                os.chown(path, unprivileged.uid, unprivileged.gid)
    got = attack(unprivileged, swaps, "archive", "mine2.bin.zarr",
                 vault / "victim2.bin.zarr", shown="mine2.bin")  # fmt: skip
    assert "root's secret" not in str(got["read"]), str(got)[:200]
    still_serves(swaps)


def test_rename_into_a_folder_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """rename(2) of the user's own file into their folder (by its descriptor) after the
    folder became a link to root's folder: the file must not land in root's folder."""
    got = attack(unprivileged, swaps, "rename", "n", swaps.public)
    assert os.listdir(swaps.public) == [], got
    still_serves(swaps)


def test_rmdir_in_a_folder_swapped_for_a_symlink(swaps: Swaps, unprivileged: User) -> None:
    """rmdir of an (empty) folder the user made, after its parent became a link to root's
    folder holding an empty folder of that name: root's folder must stay."""
    roots = swaps.base / "roots-folder"
    (roots / "keep").mkdir(parents=True)
    got = attack(unprivileged, swaps, "rmdir", "o", roots)
    assert (roots / "keep").is_dir(), got
    still_serves(swaps)


def test_the_status_file_names_no_file_of_root_s_private_folder(
    swaps: Swaps, unprivileged: User
) -> None:
    """`.decant-status` is readable by everyone: the files it names as failed (with reasons)
    must not include what the reader could not even list, like a file in root's 0700 folder."""
    private = swaps.m.mnt / "private"
    private.mkdir(mode=0o700)
    (private / "offer-for-carol.csv").write_bytes(b"root's private file\n")  # spooled
    (swaps.src / "private" / "offer-for-carol.csv").mkdir()  # its name taken: publish fails
    deadline = time.monotonic() + 20
    while "offer-for-carol" not in (swaps.m.mnt / ".decant-status").read_text():
        assert time.monotonic() < deadline, "never reported as failed"
        time.sleep(0.2)
    assert unprivileged.errno_of("os.listdir(p)", p=private) == errno.EACCES  # control
    seen = unprivileged.run("cat", str(swaps.m.mnt / ".decant-status"))
    assert seen.returncode == 0, seen.stderr
    assert "offer-for-carol" not in seen.stdout, seen.stdout


def test_the_log_file_is_not_readable_by_others(swaps: Swaps, unprivileged: User) -> None:
    """The log names files of every user (failures, links refused, archives shown raw): a
    --log-file the daemon creates must not be readable by other users (as the journal is
    not), wherever the operator puts it."""
    swaps.m.log.parent.chmod(0o755)  # a folder anyone may list, like /var/log
    (swaps.src / "userdir" / "broken.tif.zarr.zip").write_bytes(b"not a zip")  # logged
    deadline = time.monotonic() + 20
    while "broken.tif.zarr.zip" not in swaps.m.log_text():
        os.listdir(swaps.m.mnt / "userdir")
        assert time.monotonic() < deadline, "never logged"
        time.sleep(0.2)
    assert unprivileged.errno_of("read(p)", p=swaps.m.log) == errno.EACCES


def test_a_spool_planted_by_a_user_is_refused(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """SRC is a shared drop folder (1777) and a user made `.decant-spool` there before the
    first writable start, with a link where the daemon will create a spooled file. A daemon
    using that spool would create (truncate) the link's target as root: it must refuse to
    start instead, saying why."""
    base = open_tmp(tmp_path_factory, "planted-spool")
    src = base / "src"
    src.mkdir()
    src.chmod(0o1777)
    victim = base / "victim.txt"
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    plant = "import os, sys; os.makedirs(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[3])"
    files = src / ".decant-spool" / "files"
    done = unprivileged.run(str(SYSTEM_PYTHON), "-I", "-c", plant, str(files), str(victim),
                            str(files / "x.txt"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", wait=False)
    assert m.proc is not None
    try:
        code = m.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        (m.mnt / "x.txt").write_bytes(b"")  # it did start: root creates x.txt through it
        m.stop()
        pytest.fail(f"started on a spool the user owns; victim now {victim.read_bytes()!r}")
    _out, err = m.proc.communicate()
    assert code != 0 and ".decant-spool" in err.decode(), err.decode()
    assert victim.read_bytes() == SECRET


def test_the_targets_are_out_of_the_users_reach(swaps: Swaps, unprivileged: User) -> None:
    """Control: the user is really denied root's file and folder when asking SRC directly."""
    assert unprivileged.errno_of("read(p)", p=swaps.secret("control")) == errno.EACCES
    assert unprivileged.errno_of("os.listdir(p)", p=swaps.vault) == errno.EACCES
    assert unprivileged.errno_of("os.mkdir(p)", p=swaps.public / "x") == errno.EACCES
