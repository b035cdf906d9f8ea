"""Red team, round 33: the write side (ingest) through a real mount.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.mount.conftest import RUNUSER, SYSTEM_PYTHON, Mount, User, open_tmp

MakeMount = Callable[..., Mount]
SLOW = ("--settle", "600")  # files stay spooled while the test acts on them
SPOOL = Path(".decant-spool") / "files"


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout:.0f} s")
        time.sleep(0.1)


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and SPOOL.parts[0] not in p.relative_to(folder).parts
    }


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    return folder


# -- a folder renamed over a folder whose files are all still spooled -----------------------


@pytest.mark.parametrize("first", ["spooled", "published"])
def test_a_folder_is_not_renamed_over_one_holding_spooled_files(
    src: Path, make_mount: MakeMount, first: str
) -> None:
    """`mv -T a b` where the mount shows `b/` holding a file (spooled, not yet published, so
    SRC's `b/` is empty) must fail with ENOTEMPTY and change nothing, as on any filesystem.
    The rename used to be made in SRC first: with `a/`'s files spooled too, the caller got
    ENOTEMPTY but SRC's `b/` (its mode) was gone and `a/` reappeared at the next publish as a
    root 0755 folder; with `a/`'s files published, the rename succeeded and merged the two
    folders (`b/`'s pending file went into `a/`'s folder, whoever owned it)."""
    if first == "published":  # a's file is in SRC itself
        (src / "a").mkdir(mode=0o700)
        (src / "a" / "x").write_bytes(b"a's file\n")
    mnt = make_mount(src, *SLOW).mnt
    if first == "spooled":
        (mnt / "a").mkdir(mode=0o700)
        (mnt / "a" / "x").write_bytes(b"a's file\n")
    (mnt / "b").mkdir(mode=0o750)
    (mnt / "b" / "y").write_bytes(b"b's file\n")
    before = files_of(mnt)
    with pytest.raises(OSError) as caught:
        os.rename(mnt / "a", mnt / "b")
    assert caught.value.errno in (errno.ENOTEMPTY, errno.EEXIST), caught.value
    assert files_of(mnt) == before
    assert sorted(os.listdir(src)) == [".decant-spool", "a", "b"], "SRC changed by a failed rename"
    assert (src / "a").stat().st_mode & 0o777 == 0o700
    assert (src / "b").stat().st_mode & 0o777 == 0o750


# -- a file spooled deeper than the spool's walks go ----------------------------------------


def test_a_file_written_deeper_than_the_walks_go_is_still_published(
    src: Path, make_mount: MakeMount
) -> None:
    """Walks of the spool stop 256 folders deep (vfs/walk.py). A file written through the mount
    below that was taken by the next walk (every 5 s) for one deleted behind the queue's back
    and dropped from it: it stayed spooled for good, never published, and `.decant-status`
    no longer counted it. Here it settles after that walk has run."""
    mnt = make_mount(src, "--settle", "7").mnt
    deep = Path(*(["d"] * 260))
    (mnt / deep).mkdir(parents=True)
    (mnt / deep / "f").write_bytes(b"deep data\n")
    published = src / deep / "f"
    wait_for(f"published at {published}", published.exists, timeout=25)
    assert published.read_bytes() == b"deep data\n"
    wait_for("unspooled", lambda: not (src / SPOOL / deep / "f").exists())
    assert (mnt / deep / "f").read_bytes() == b"deep data\n"


# -- an archive built beside its target, in a folder of the writer's on another filesystem ----

# Run as the user: on the first inotify event MASK for a `.decant-tmp-` name in FOLDER (argv 1),
# move that file away and run SWAP (argv 2: the link's target, if any) in its place.
_RACER = """
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
folder, victim = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
assert libc.inotify_add_watch(fd, folder.encode(), MASK) >= 0
os.chdir(folder)
print("ready", flush=True)
while True:
    buf = os.read(fd, 65536)
    i = 0
    while i < len(buf):
        _wd, _mask, _cookie, n = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16 : i + 16 + n].rstrip(b"\\0").decode()
        i += 16 + n
        if name.startswith(".decant-tmp-"):
            os.rename(name, "moved-away")
            SWAP
            print("swapped " + name, flush=True)
            sys.exit(0)
"""
# A link to VICTIM for the first temp name made (IN_CREATE).
RACER = _RACER.replace("MASK", "0x100").replace("SWAP", "os.symlink(victim, name)")
# A FIFO for the first temp file read (IN_ACCESS: the daemon comparing its copy).
FIFO_RACER = _RACER.replace("MASK", "0x1").replace("SWAP", "os.mkfifo(name)")


def test_an_archive_built_in_a_writer_s_folder_writes_through_no_link_of_theirs(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A folder of SRC on another filesystem than SRC's staging folder (a disk mounted inside
    the archive; a btrfs subvolume, which a user may make) had its TIFFs' archives built beside
    the target: the packer made its temp file there, then wrote it, verified it and set its
    mode by path, as root. The folder's owner, watching it with inotify, swapped the temp name
    for a link the moment it appeared: root wrote the zip into the link's target, any file on
    the machine (here a 0600 file of root's, outside SRC). Now archives are built in the
    staging folder and copied beside the target through a new file (O_EXCL)."""
    import numpy as np
    import tifffile

    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt33-other-fs")
    src, proj = base / "src", base / "src" / "proj"
    proj.mkdir(parents=True)
    victim = base / "victim"
    victim.write_bytes(b"root's secret\n")
    victim.chmod(0o600)
    tiff = base / "scan.tif"  # compressed: packed by the zarr path (verbatim)
    data = np.random.default_rng(0).integers(0, 60000, (4, 128, 128), dtype=np.uint16)
    tifffile.imwrite(tiff, data, compression="zlib")
    tiff.chmod(0o644)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(proj)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    racer = None
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        os.chown(proj, u.uid, u.gid)
        proj.chmod(0o755)
        m.start("-o", "allow_other", "--settle", "0.3")
        racer = subprocess.Popen(
            [RUNUSER, "-u", u.name, "--", str(SYSTEM_PYTHON), "-I", "-c", RACER, str(proj),
             str(victim)], stdout=subprocess.PIPE, text=True, cwd="/")  # fmt: skip
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
        done = u.run("cp", str(tiff), str(m.mnt / "proj" / "scan.tif"))
        assert done.returncode == 0, done.stderr
        wait_for("tried", lambda: "proj/scan.tif: " in m.log_text())
        assert victim.read_bytes() == b"root's secret\n", "root wrote through the user's link"
        assert victim.stat().st_mode & 0o7777 == 0o600
        assert (m.mnt / "proj" / "scan.tif").read_bytes() == tiff.read_bytes()
    finally:
        if racer is not None:
            racer.kill()
            racer.communicate()
        m.stop()
        subprocess.run(["umount", str(proj)], check=False, capture_output=True)


def test_a_fifo_put_in_place_of_a_copy_being_published_holds_up_no_queue(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A plain file published into a folder on another filesystem is copied beside its target
    and the copy is compared, then fsynced by path before its rename. The folder's owner who
    swapped the copy for a FIFO while it was being compared (inotify tells when it is read)
    had the daemon open the FIFO, as root, and wait for a writer forever: every other user's
    publishing stopped (one pack worker), and so did unmounting. Now the copy is reopened
    without following a link or waiting, and a FIFO is refused."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt33-fifo")
    src, proj = base / "src", base / "src" / "proj"
    proj.mkdir(parents=True)
    (src / "other").mkdir()
    data = os.urandom(1 << 20) * 24  # compared for a while: the swap lands meanwhile
    blob = base / "blob.bin"
    blob.write_bytes(data)
    blob.chmod(0o644)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(proj)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    racer = None
    fifo = None
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        os.chown(proj, u.uid, u.gid)
        proj.chmod(0o755)
        m.start("-o", "allow_other", "--settle", "0.3")
        racer = subprocess.Popen(
            [RUNUSER, "-u", u.name, "--", str(SYSTEM_PYTHON), "-I", "-c", FIFO_RACER,
             str(proj)], stdout=subprocess.PIPE, text=True, cwd="/")  # fmt: skip
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
        done = u.run("cp", str(blob), str(m.mnt / "proj" / "blob.bin"))
        assert done.returncode == 0, done.stderr
        line = racer.stdout.readline()
        assert line.startswith("swapped "), line
        fifo = proj / line.split()[1]
        # Someone else's file, published after it: the queue must not be stuck.
        (m.mnt / "other" / "notes.txt").write_bytes(b"another user's notes\n")
        wait_for("published", (src / "other" / "notes.txt").exists)
        assert (m.mnt / "proj" / "blob.bin").read_bytes() == data
    finally:
        if fifo is not None:  # a daemon waiting on the FIFO: let it go, so it can stop
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        if racer is not None:
            racer.kill()
            racer.communicate()
        m.stop()
        subprocess.run(["umount", str(proj)], check=False, capture_output=True)


# -- hostile TIFFs written in ---------------------------------------------------------------


def looping_tiff(seed: int) -> bytes:
    """A 216-byte TIFF of one 4x4 uint8 page whose IFD names itself as the next one."""
    tags = [(256, 3, 1, 4), (257, 3, 1, 4), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 200), (277, 3, 1, 1), (278, 3, 1, 4), (279, 4, 1, 16)]  # fmt: skip
    ifd = struct.pack("<H", len(tags))
    for tag in tags:
        ifd += struct.pack("<HHII", *tag)
    head = b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 8)  # next IFD: itself
    return head + bytes(200 - len(head)) + bytes((seed + i) % 256 for i in range(16))


def test_a_tiff_whose_pages_loop_holds_up_no_one_s_publishing(
    src: Path, make_mount: MakeMount
) -> None:
    """A TIFF whose IFD chain loops back was read by tifffile as the same page again and
    again, up to mode D's 2^18 pages: 216 bytes held the pack worker for ~30 s to be refused,
    then as long again for the verbatim archive (the packer scans once more), while every
    other user's files waited. Now a page seen before ends the scan: it is archived verbatim
    at once, its bytes intact, and a file written after it is published promptly."""
    m = make_mount(src, "--settle", "0.3")
    mnt = m.mnt
    loops = {f"loop{i}.tif": looping_tiff(i) for i in range(2)}
    for name, data in loops.items():
        (mnt / name).write_bytes(data)
    (mnt / "notes.txt").write_bytes(b"someone else's notes\n")
    wait_for("notes.txt published", (src / "notes.txt").exists)
    for name, data in loops.items():
        wait_for(f"{name} archived", (src / f"{name}.zarr.zip").exists)
        assert (mnt / name).read_bytes() == data
        # The log says why it is verbatim (red team 56 F7: it gave the mode alone).
        wait_for("its log line", lambda name=name: f"{name}: published as" in m.log_text())
        assert re.search(rf"{name}: published as .* \(verbatim: page \d+'s IFD", m.log_text())


# -- a folder renamed while a file in it is open ----------------------------------------------


def test_a_file_open_while_its_folder_is_renamed_is_published_once_closed(
    src: Path, make_mount: MakeMount
) -> None:
    """The pack queue moved a spooled file's open count to its new relpath when its folder was
    renamed, but the open handle kept the old one: its release closed a name nothing was open
    under, and the file stayed open to the queue for good (queued in the status, never
    published while the daemon ran)."""
    mnt = make_mount(src, "--settle", "0.3").mnt
    (mnt / "run1").mkdir()
    fd = os.open(mnt / "run1" / "data.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"first half, ")
        os.rename(mnt / "run1", mnt / "run2")
        os.write(fd, b"second half\n")
    finally:
        os.close(fd)
    wait_for("published", (src / "run2" / "data.bin").exists)
    assert (src / "run2" / "data.bin").read_bytes() == b"first half, second half\n"
    wait_for("the queue empty", lambda: status(mnt)["queued"] == 0)


# -- long names ---------------------------------------------------------------------------------


def test_long_names_publish_through_temp_names_that_fit(src: Path, make_mount: MakeMount) -> None:
    """Temp names are the name behind `.decant-tmp-PID-TAG-`: a TIFF of a 210- to 246-byte name
    (whose archive name fits in 255 bytes) failed to publish for good with ENAMETOOLONG (its
    archive's temp name did not fit, nor the packer's temp name for that), and so did a new
    version of a published plain file of a 229- to 255-byte name (the temp link it replaces the
    older one through). Temp names now keep as much of the name's end as fits."""
    import io

    import numpy as np
    import tifffile

    def tiff(seed: int) -> bytes:
        out = io.BytesIO()
        tifffile.imwrite(out, np.full((32, 32), seed, dtype=np.uint16))
        return out.getvalue()

    mnt = make_mount(src, "--settle", "0.3").mnt
    tiffs = {"t" * (n - 4) + ".tif": tiff(n) for n in (220, 246)}
    plain = "p" * 250
    for name, data in tiffs.items():
        (mnt / name).write_bytes(data)
    (mnt / plain).write_bytes(b"first version\n")
    wait_for("the plain file published", lambda: (src / plain).exists())
    new = mnt / f".{plain[:240]}.AbC123"  # rsync's way: a temp name, renamed over
    new.write_bytes(b"second version\n")
    os.rename(new, mnt / plain)
    wait_for("the new version published", lambda: (src / plain).read_bytes() == b"second version\n")
    for name, data in tiffs.items():
        wait_for(f"{len(name)}-byte TIFF archived", (src / f"{name}.zarr.zip").exists)
        assert (mnt / name).read_bytes() == data
    assert status(mnt)["failed"] == []


def bad_count_tiff(seed: int) -> bytes:
    """A 216-byte TIFF whose strip tags claim 2^28 values: tifffile logs six ERROR lines."""
    many = 1 << 28
    tags = [(256, 3, 1, 4), (257, 4, 1, many), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, many, 200), (277, 3, 1, 1), (278, 3, 1, 1), (279, 4, many, 200)]  # fmt: skip
    ifd = struct.pack("<H", len(tags))
    for tag in tags:
        ifd += struct.pack("<HHII", *tag)
    head = b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0)
    return head + bytes(200 - len(head)) + bytes((seed + i) % 256 for i in range(16))


def test_malformed_tiffs_written_in_do_not_flood_the_log(src: Path, make_mount: MakeMount) -> None:
    """Failure lines in the log are bounded (100 a minute), but tifffile logged each flaw of a
    malformed TIFF at ERROR itself, at each scan (the publish's and the packer's): 20 files of
    216 bytes written by any user gave 240 lines. Each is archived verbatim and logged once."""
    m = make_mount(src, "--settle", "0.3")
    names = [f"bad{i}.tif" for i in range(20)]
    for i, name in enumerate(names):
        (m.mnt / name).write_bytes(bad_count_tiff(i))
    for name in names:
        wait_for(f"{name} archived", (src / f"{name}.zarr.zip").exists)

    def published() -> int:
        return sum(1 for line in m.log_text().splitlines() if " published as " in line)

    wait_for("each publish logged", lambda: published() == len(names))
    lines = m.log_text().splitlines()
    assert [line for line in lines if " tifffile: " in line][:3] == []
    assert sum(1 for line in lines if "bad" in line) == len(names)  # one line each


# -- the free-space reserve --------------------------------------------------------------------


def test_filling_the_holes_of_a_sparse_file_stops_at_the_reserve(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """Below the reserve (--min-free) only writes within a file's size pass, so that a file
    rewritten in place is not refused. A file made large first (truncate up, while there was
    room: it costs nothing) was then written within its size, into its holes, and every write
    passed: the disk filled past the reserve to the last block (the daemon writes as root), and
    what was spooled could no longer be packed. A write into a hole is new data now."""
    src = tmp_path / "small-src"
    src.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(src)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    m = None
    try:
        m = make_mount(src, "--settle", "600", "--min-free", "2M")
        chunk = os.urandom(1 << 18)
        fd = os.open(m.mnt / "sparse.bin", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.ftruncate(fd, 64 << 20)  # all holes: allowed, there is room
            with pytest.raises(OSError) as caught:
                for i in range(32):  # 8 MiB into the holes
                    os.pwrite(fd, chunk, i * len(chunk))
        finally:
            os.close(fd)
        assert caught.value.errno == errno.ENOSPC
        st = os.statvfs(src)
        assert st.f_bavail * st.f_frsize >= 1 << 20, "the reserve was written into"
        assert status(m.mnt)["space"]["refusing_writes"]
    finally:
        if m is not None:
            m.stop()
        if subprocess.run(["umount", str(src)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(src)], check=False)


# -- a TIFF of many tiny pages -----------------------------------------------------------------


def tiny_pages_tiff(n: int) -> bytes:
    """A valid TIFF of `n` one-pixel uint8 pages (mode D takes it: disjoint strips)."""
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    ifd_size = 2 + 9 * 12 + 4
    pixels = 8 + n * ifd_size
    for i in range(n):
        at = pixels + i
        tags = [(256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
                (273, 4, 1, at), (277, 3, 1, 1), (278, 3, 1, 1), (279, 4, 1, 1)]  # fmt: skip
        out += struct.pack("<H", len(tags))
        for tag in tags:
            out += struct.pack("<HHII", *tag)
        out += struct.pack("<I", 8 + (i + 1) * ifd_size if i < n - 1 else 0)
    return bytes(out) + bytes(i % 251 for i in range(n))


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def test_packing_a_tiff_of_many_tiny_pages_costs_memory_near_its_size(
    src: Path, make_mount: MakeMount
) -> None:
    """The scan of a TIFF of many tiny pages is bounded (tests/unit/test_redteam_tiffscan.py),
    its packing is not: 30,000 one-pixel pages (3.4 MB) took ~7 s and ~120 MB in the daemon,
    200,000 (23 MB) 115 s and ~1 GB (mode D allows 2^18 pages: ~30 MB, ~1.3 GB per pack worker).
    Any user may write such files in; the daemon is shared. Pages this many and this tiny now
    go verbatim (vfs.decant.limits.PAGE_OVERHEAD)."""
    m = make_mount(src, "--settle", "0.3")
    assert m.proc is not None
    data = tiny_pages_tiff(30_000)
    before = peak_rss(m.proc.pid)
    (m.mnt / "tiny.tif").write_bytes(data)
    wait_for("archived", (src / "tiny.tif.zarr.zip").exists, timeout=60)
    grew = peak_rss(m.proc.pid) - before
    assert grew < 20 * len(data), f"peak RSS +{grew >> 20} MiB for a {len(data) >> 20} MiB file"
