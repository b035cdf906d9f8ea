"""Issue 5, the write side, through a real mount with real rsync and cp: what lands in SRC, what the
mount presents, what a writer is refused, and what survives a SIGKILL or a full disk.

Assertions compare against the originals' bytes (sha256) and os.stat; waits poll
`MNT/.decant-status` with a timeout and never assert on how long anything took.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tifffile

from tests.mount.conftest import Mount, load_tool
from vfs.decant.reader import DecantArchive

MakeMount = Callable[..., Mount]
FAST = ("--settle", "0.5")
SLOW = ("--settle", "600")  # files stay spooled while the test acts on them
SPOOL = Path(".decant-spool") / "files"
TEMP_GLOB = ".decant-tmp-*"
OWNER = (1234, 5678)  # ids with no names: rsync -a as root keeps them numerically


# -- helpers ----------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def wait_status(
    mnt: Path, done: Callable[[dict[str, Any]], bool], timeout: float = 60.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = status(mnt)
        if done(doc):
            return doc
        if time.monotonic() > deadline:
            raise AssertionError(f"pack queue still {doc} after {timeout:.0f} s")
        time.sleep(0.1)


def drained(doc: dict[str, Any]) -> bool:
    return doc["queued"] == 0 and doc["packing"] == 0


def wait_drained(mnt: Path, src: Path, timeout: float = 60.0) -> dict[str, Any]:
    """Nothing queued or packing and nothing left in the spool (a file dropped in directly is
    only queued at the watcher's next look, so an empty queue alone proves little)."""
    return wait_status(mnt, lambda d: drained(d) and not spooled(src), timeout)


def spooled(src: Path) -> list[str]:
    files = src / SPOOL
    for _try in range(100):
        try:
            return sorted(p.relative_to(files).as_posix() for p in files.rglob("*") if p.is_file())
        except FileNotFoundError:  # the daemon removed a spool folder while it was walked
            time.sleep(0.01)
    raise AssertionError(f"{files}: its folders kept vanishing while walked")


def temps(src: Path) -> list[Path]:
    return sorted(src.rglob(TEMP_GLOB))


def files_of(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def is_tiff(path: Path) -> bool:
    """Independent of vfs: whatever tifffile opens is a TIFF and must end up archived."""
    try:
        with tifffile.TiffFile(path):
            return True
    except Exception:
        return False


def archived_sha(archive: Path) -> str:
    with DecantArchive.open(archive) as a:
        (info,) = a.originals()
    return info.sha256


def rsync(src: Path, dst: Path, *extra: str) -> str:
    done = subprocess.run(["rsync", "-a", *extra, f"{src}/", f"{dst}/"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stdout


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def presented(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_size)


def expect_errno(codes: tuple[int, ...], fn: Callable[..., object], *args: object) -> None:
    with pytest.raises(OSError) as caught:
        fn(*args)
    assert caught.value.errno in codes, f"{fn.__name__}{args}: {caught.value}"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory, corpus: dict[str, Path]) -> Path:
    """The small corpus as an instrument might leave it: a subfolder tree, varied mode bits,
    foreign owners and distinct nanosecond mtimes (files and folders)."""
    root = tmp_path_factory.mktemp("write-originals") / "run"
    deeper = root / "sub" / "deeper"
    deeper.mkdir(parents=True)
    for i, (name, path) in enumerate(sorted(corpus.items())):
        where = root if i % 3 else deeper if i % 2 else root / "sub"
        dest = where / name
        shutil.copyfile(path, dest)
        os.chmod(dest, (0o644, 0o640, 0o600, 0o755)[i % 4])
        if i % 5 == 0:
            os.chown(dest, *OWNER)
        os.utime(dest, ns=(1_600_000_000_123_456_789 + i, 1_600_000_000_987_654_321 + i * 1_001))
    for i, folder in enumerate((deeper, root / "sub", root)):
        os.utime(folder, ns=(1_500_000_000_000_000_001, 1_500_000_000_000_000_001 + i))
    return root


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def big_tiff(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~200 MB uint16 stack: packing it takes long enough to be killed in the middle."""
    out = tmp_path_factory.mktemp("write-big") / "in" / "stack.tif"
    load_tool("make_corpus").write_stack(out, 0.2)
    return out


@pytest.fixture
def small_src(tmp_path: Path) -> Iterator[Path]:
    """SRC on a 4 MiB tmpfs. Request it before make_mount: fixtures tear down in reverse, so
    the FUSE mount on top is gone before this unmounts."""
    folder = tmp_path / "small-src"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=False)


# -- rsync, cp, and what lands in SRC ---------------------------------------------------------


def test_rsync_into_mount_archives_tiffs_keeps_metadata_and_second_rsync_is_a_noop(
    originals: Path, src: Path, make_mount: MakeMount
) -> None:
    m = make_mount(src, *FAST)
    rsync(originals, m.mnt)
    wait_drained(m.mnt, src)

    names = files_of(originals)
    for rel in names:
        orig, shown = originals / rel, m.mnt / rel
        assert sha256(shown) == sha256(orig), rel
        assert presented(os.stat(shown)) == presented(os.stat(orig)), rel
        if is_tiff(orig):
            assert archived_sha(src / f"{rel}.zarr.zip") == sha256(orig), rel
            assert not (src / rel).exists(), rel
        else:
            assert sha256(src / rel) == sha256(orig), rel
            assert not (src / f"{rel}.zarr.zip").exists(), rel
    assert sum(is_tiff(originals / r) for r in names) >= 25
    for folder in ("sub", "sub/deeper"):
        want, got = os.stat(originals / folder), os.stat(m.mnt / folder)
        assert (got.st_mode, got.st_mtime_ns) == (want.st_mode, want.st_mtime_ns), folder
    assert spooled(src) == [] and temps(src) == []
    assert status(m.mnt)["done"] == len(names)
    assert rsync(originals, m.mnt, "--itemize-changes") == ""


def test_cp_r_into_mount(originals: Path, src: Path, make_mount: MakeMount) -> None:
    m = make_mount(src, *FAST)
    subprocess.run(["cp", "-r", str(originals), str(m.mnt / "copied")], check=True)
    wait_drained(m.mnt, src)
    names = files_of(originals)
    assert files_of(m.mnt / "copied") == names
    for rel in names:
        assert sha256(m.mnt / "copied" / rel) == sha256(originals / rel), rel
        suffix = ".zarr.zip" if is_tiff(originals / rel) else ""
        assert (src / "copied" / f"{rel}{suffix}").is_file(), rel
    assert spooled(src) == [] and temps(src) == []


def test_rsync_over_an_archived_file_replaces_the_archive_only_once_verified(
    corpus: dict[str, Path], src: Path, tmp_path: Path, make_mount: MakeMount
) -> None:
    name = "zstack_u16.tif"
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, source in ((first, name), (second, "tiled_chunky_u16.tif")):
        folder.mkdir()
        shutil.copyfile(corpus[source], folder / name)
    os.utime(second / name, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    old, new = sha256(first / name), sha256(second / name)
    archive = src / f"{name}.zarr.zip"

    m = make_mount(src, *FAST)
    rsync(first, m.mnt)
    wait_drained(m.mnt, src)
    assert archived_sha(archive) == old
    m.stop()

    m.start(*SLOW)  # the new content stays spooled: the old archive must be untouched meanwhile
    rsync(second, m.mnt)
    assert sha256(m.mnt / name) == new
    assert os.stat(m.mnt / name).st_mtime_ns == os.stat(second / name).st_mtime_ns
    assert spooled(src) == [name]
    assert archived_sha(archive) == old
    m.stop()

    seen: set[str] = set()
    stop = threading.Event()

    def sample() -> None:  # the final name always holds one complete archive, old or new
        while not stop.is_set():
            fd = os.open(archive, os.O_RDONLY)  # one file throughout, whatever is renamed over
            try:
                seen.add(archived_sha(Path(f"/proc/self/fd/{fd}")))
            finally:
                os.close(fd)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        m.start(*FAST)
        wait_drained(m.mnt, src)
    finally:
        stop.set()
        sampler.join()
    assert seen <= {old, new}
    assert archived_sha(archive) == new
    assert sha256(m.mnt / name) == new
    assert temps(src) == []
    assert rsync(second, m.mnt, "--itemize-changes") == ""


# -- what a writer is refused -----------------------------------------------------------------


def test_unlink_of_an_archived_original_needs_allow_delete(
    corpus: dict[str, Path], src: Path, tmp_path: Path, make_mount: MakeMount
) -> None:
    incoming = tmp_path / "in"
    incoming.mkdir()
    for name in ("zstack_u16.tif", "not_a_tiff.csv"):
        shutil.copy2(corpus[name], incoming / name)
    m = make_mount(src, *FAST)
    rsync(incoming, m.mnt)
    wait_drained(m.mnt, src)

    for name in ("zstack_u16.tif", "not_a_tiff.csv"):
        expect_errno((errno.EPERM,), os.unlink, m.mnt / name)
        assert sha256(m.mnt / name) == sha256(incoming / name)
    assert (src / "zstack_u16.tif.zarr.zip").is_file() and (src / "not_a_tiff.csv").is_file()
    m.stop()

    m.start(*FAST, "--allow-delete")
    os.unlink(m.mnt / "zstack_u16.tif")
    os.unlink(m.mnt / "not_a_tiff.csv")
    assert not (src / "zstack_u16.tif.zarr.zip").exists() and not (src / "not_a_tiff.csv").exists()
    assert os.listdir(m.mnt) == []  # .decant-status is found by name only, never listed


def test_writing_into_an_archived_original_is_refused_and_harmless(
    corpus: dict[str, Path], src: Path, tmp_path: Path, make_mount: MakeMount
) -> None:
    name = "tiled_chunky_u16.tif"
    incoming = tmp_path / "in"
    incoming.mkdir()
    shutil.copy2(corpus[name], incoming / name)
    m = make_mount(src, *FAST)
    rsync(incoming, m.mnt)
    wait_drained(m.mnt, src)
    archive, shown = src / f"{name}.zarr.zip", m.mnt / name
    archive_bytes = sha256(archive)

    refused = (errno.EPERM, errno.EROFS)
    os.chmod(shown, 0o666)  # mode bits allow it: the write side still refuses
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND, os.O_WRONLY | os.O_TRUNC):
        expect_errno(refused, os.open, shown, flags)
    expect_errno(refused, os.truncate, shown, 0)
    expect_errno(refused, os.rename, shown, m.mnt / "elsewhere.tif")
    done = subprocess.run(["dd", "if=/dev/zero", f"of={shown}", "bs=1k", "count=1",
                           "conv=notrunc"], capture_output=True, check=False)  # fmt: skip
    assert done.returncode != 0

    assert sha256(archive) == archive_bytes
    assert sha256(shown) == sha256(incoming / name)
    assert spooled(src) == []


@pytest.mark.parametrize("flag", [("-o", "ro"), ("--read-only",)], ids=["o-ro", "read-only"])
def test_read_only_mount_refuses_every_write_with_erofs(
    flag: tuple[str, ...], corpus: dict[str, Path], src: Path, make_mount: MakeMount
) -> None:
    from vfs.decant.packer import pack_file

    name = "zstack_u16.tif"
    pack_file(corpus[name], src / f"{name}.zarr.zip")
    shutil.copy2(corpus["not_a_tiff.csv"], src / "plain.csv")
    (src / "folder").mkdir()
    m = make_mount(src, *flag)

    erofs = (errno.EROFS,)
    expect_errno(erofs, write_file, m.mnt / "new.csv", b"x")
    expect_errno(erofs, os.mkdir, m.mnt / "newdir")
    for target in (m.mnt / name, m.mnt / "plain.csv"):
        expect_errno(erofs, os.open, target, os.O_WRONLY)
        expect_errno(erofs, os.truncate, target, 0)
        expect_errno(erofs, os.chmod, target, 0o600)
        expect_errno(erofs, os.unlink, target)
    expect_errno(erofs, os.rename, m.mnt / "plain.csv", m.mnt / "moved.csv")
    expect_errno(erofs, os.rmdir, m.mnt / "folder")

    assert sha256(m.mnt / name) == sha256(corpus[name])
    # A read-only mount has no queue, but its status (the daemon's counters) reads all the same.
    shown = json.loads((m.mnt / ".decant-status").read_text())
    assert "queued" not in shown and shown["daemon"]["bytes_served"] > 0
    expect_errno((errno.EROFS, errno.EACCES), os.open, m.mnt / ".decant-status", os.O_WRONLY)
    assert sorted(os.listdir(src)) == ["folder", "plain.csv", f"{name}.zarr.zip"]


# -- spooled files: rename, truncate, attributes, folders -------------------------------------


def test_spooled_files_rename_truncate_chmod_and_folders(src: Path, make_mount: MakeMount) -> None:
    data = os.urandom(100_000)
    m = make_mount(src, *SLOW)
    mnt = m.mnt
    write_file(mnt / "a.bin", data)
    os.rename(mnt / "a.bin", mnt / "b.bin")
    assert not (mnt / "a.bin").exists() and sha256(mnt / "b.bin") == sha256_of(data)

    os.truncate(mnt / "b.bin", 1000)
    assert (mnt / "b.bin").read_bytes() == data[:1000]
    with open(mnt / "b.bin", "r+b") as fh:  # ftruncate through an open handle
        fh.truncate(500)
    os.truncate(mnt / "b.bin", 700)  # growing pads with zeros
    want = data[:500] + bytes(200)
    assert (mnt / "b.bin").read_bytes() == want
    os.chmod(mnt / "b.bin", 0o640)
    os.utime(mnt / "b.bin", ns=(1_650_000_000_000_000_007, 1_650_000_000_000_000_009))

    os.mkdir(mnt / "d")
    assert (src / "d").is_dir()
    os.rename(mnt / "b.bin", mnt / "d" / "b.bin")
    expect_errno((errno.ENOTEMPTY,), os.rmdir, mnt / "d")  # a spooled file lives in it
    write_file(mnt / "d" / "gone.bin", b"short-lived")
    os.unlink(mnt / "d" / "gone.bin")
    assert sorted(os.listdir(mnt / "d")) == ["b.bin"]
    st = os.stat(mnt / "d" / "b.bin")
    assert (st.st_mode & 0o7777, st.st_mtime_ns, st.st_size) == (0o640, 1_650_000_000_000_000_009,
                                                                  700)  # fmt: skip
    assert spooled(src) == ["d/b.bin"]
    assert files_of(src / "d") == []  # nothing published while it settles
    os.mkdir(mnt / "e")
    os.rmdir(mnt / "e")
    assert not (src / "e").exists()
    m.stop()

    m.start(*FAST)  # a restart picks the spool up and publishes with the short settle
    wait_drained(mnt, src)
    assert (src / "d" / "b.bin").read_bytes() == want
    st = os.stat(src / "d" / "b.bin")
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o640, 1_650_000_000_000_000_009)
    assert (mnt / "d" / "b.bin").read_bytes() == want
    expect_errno((errno.ENOTEMPTY,), os.rmdir, mnt / "d")


def test_file_renamed_while_open_is_packed_once_closed(src: Path, make_mount: MakeMount) -> None:
    """The close (FUSE release) of a handle arrives after a rename of its file: the pack queue
    must still see the renamed file closed, or it would wait for it forever."""
    m = make_mount(src, *FAST)
    fd = os.open(m.mnt / "w.csv", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"a,b\n")
        os.rename(m.mnt / "w.csv", m.mnt / "w2.csv")
        os.write(fd, b"1,2\n")
    finally:
        os.close(fd)
    wait_drained(m.mnt, src, timeout=30)
    assert (src / "w2.csv").read_bytes() == b"a,b\n1,2\n"
    assert not (src / "w.csv").exists()


# -- files arriving by other means ------------------------------------------------------------


def test_files_dropped_into_the_spool_or_an_inbox_are_packed(
    corpus: dict[str, Path], src: Path, tmp_path: Path, make_mount: MakeMount
) -> None:
    inbox = tmp_path / "inbox"
    (src / "sub").mkdir()
    m = make_mount(src, *FAST, "--inbox", str(inbox))
    drops = {
        src / SPOOL / "sub" / "zstack_u16.tif": corpus["zstack_u16.tif"],
        src / SPOOL / "sub" / "notes.csv": corpus["not_a_tiff.csv"],
        inbox / "run1" / "img.tif": corpus["tiled_chunky_u16.tif"],  # run1/ is not in SRC yet
        inbox / "run1" / "meta.csv": corpus["not_a_tiff.csv"],
    }
    for dest, source in drops.items():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
    wait_status(m.mnt, lambda d: drained(d) and d["done"] >= len(drops))

    shown = {"sub/zstack_u16.tif": "sub/zstack_u16.tif.zarr.zip", "sub/notes.csv": "sub/notes.csv",
             "run1/img.tif": "run1/img.tif.zarr.zip", "run1/meta.csv": "run1/meta.csv"}  # fmt: skip
    for (rel, real), source in zip(shown.items(), drops.values(), strict=True):
        assert (src / real).is_file(), real
        assert sha256(m.mnt / rel) == sha256(source), rel
        assert os.stat(m.mnt / rel).st_mtime_ns == os.stat(source).st_mtime_ns, rel
    assert spooled(src) == [] and files_of(inbox) == [] and temps(src) == []
    assert status(m.mnt)["failed"] == []


def test_a_file_that_fails_to_pack_stays_spooled_readable_and_reported(
    corpus: dict[str, Path], src: Path, make_mount: MakeMount
) -> None:
    data = corpus["not_a_tiff.csv"].read_bytes()
    m = make_mount(src, *SLOW)
    write_file(m.mnt / "clash.csv", data)
    m.stop()
    (src / "clash.csv").mkdir()  # a folder took the name it is to be published under

    m.start(*FAST)
    doc = wait_status(m.mnt, lambda d: bool(d["failed"]))
    (failure,) = doc["failed"]
    assert failure["path"] == "clash.csv"
    assert "Is a directory" in failure["reason"] or "errno 21" in failure["reason"]
    assert (m.mnt / "clash.csv").read_bytes() == data
    assert spooled(src) == ["clash.csv"] and temps(src) == []
    assert "clash.csv: not published, stays spooled" in m.log_text()
    cli = subprocess.run([sys.executable, "-m", "vfs.cli", "--status", str(m.mnt)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "failed 1" in cli.stdout and "failed: clash.csv: " in cli.stdout

    os.rmdir(src / "clash.csv")  # the operator clears the way; any attribute change retries
    st = os.stat(m.mnt / "clash.csv")
    os.utime(m.mnt / "clash.csv", ns=(st.st_atime_ns, st.st_mtime_ns))
    doc = wait_drained(m.mnt, src)
    assert doc["failed"] == [] and (src / "clash.csv").read_bytes() == data


# -- crashes and full disks -------------------------------------------------------------------


def test_sigkill_while_packing_loses_nothing(
    big_tiff: Path, src: Path, make_mount: MakeMount
) -> None:
    want = sha256(big_tiff)
    m = make_mount(src, *FAST)
    rsync(big_tiff.parent, m.mnt)
    deadline = time.monotonic() + 120
    while not temps(src):  # the packer is writing its temp archive: kill it there
        assert time.monotonic() < deadline and status(m.mnt)["done"] == 0, "missed the pack"
        time.sleep(0.02)
    assert m.proc is not None
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    assert temps(src), "the interrupted pack left its temp archive"
    assert spooled(src) == ["stack.tif"] and sha256(src / SPOOL / "stack.tif") == want
    archive = src / "stack.tif.zarr.zip"
    assert not archive.exists() or archived_sha(archive) == want  # never a half archive
    m.stop()

    m.start(*FAST)
    wait_drained(m.mnt, src, timeout=120)
    assert temps(src) == []
    assert archived_sha(archive) == want
    assert sha256(m.mnt / "stack.tif") == want
    assert "a temp archive left by an interrupted pack" in m.log_text()


def test_a_small_src_publishes_without_a_second_copy_and_refuses_writes_at_the_reserve(
    small_src: Path, corpus: dict[str, Path], make_mount: MakeMount
) -> None:
    """SRC on a 4 MiB tmpfs, --min-free 1M: a 2.5 MiB plain file is published by a hard link
    (it could never be copied), and new data is refused with ENOSPC while less than 1 MiB is
    free, so what is spooled can still be packed; nothing half is published, reads go on."""
    src = small_src
    m = make_mount(src, *FAST, "--min-free", "1M")
    small = corpus["zstack_u16.tif"].read_bytes()
    write_file(m.mnt / "small.tif", small)
    blob = os.urandom(5 << 19)  # 2.5 MiB: there is no room for a copy of it
    write_file(m.mnt / "blob.bin", blob)
    wait_drained(m.mnt, src)
    assert (src / "small.tif.zarr.zip").is_file() and (src / "blob.bin").read_bytes() == blob

    chunk = os.urandom(1 << 18)
    fd = os.open(m.mnt / "big.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        with pytest.raises(OSError) as caught:
            for _ in range(16):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    assert caught.value.errno == errno.ENOSPC
    st = os.statvfs(src)
    assert st.f_bavail * st.f_frsize >= 1 << 20  # the reserve is left for packing
    doc = status(m.mnt)
    assert doc["space"]["refusing_writes"] and doc["space"]["min_free"] == 1 << 20
    filler = src / "filler.bin"  # SRC filled by other means: below the reserve
    write_file(filler, bytes(st.f_bavail * st.f_frsize - (1 << 19)))
    expect_errno((errno.ENOSPC,), write_file, m.mnt / "more.bin", b"x")  # even a create
    filler.unlink()
    os.unlink(m.mnt / "big.bin")  # a partly written file is the writer's to clean up

    assert sorted(os.listdir(src)) == [".decant-spool", "blob.bin", "small.tif.zarr.zip"]
    assert temps(src) == [] and spooled(src) == []
    assert sha256(m.mnt / "small.tif") == sha256_of(small)
    assert (m.mnt / "blob.bin").read_bytes() == blob
    write_file(m.mnt / "after.csv", b"room again")  # space returned: accepted
    wait_drained(m.mnt, src)
    assert (src / "after.csv").read_bytes() == b"room again"
    assert "new data is refused" in m.log_text()


def test_a_tiff_of_mostly_holes_is_published_as_it_is(src: Path, make_mount: MakeMount) -> None:
    """A 1 GiB "TIFF" of a 4-byte header and a hole, written through the mount: packing read,
    hashed and compressed every byte of its size (at 16 GiB the pack worker, and everyone's
    publishing, waited two minutes; red team). Published as it is: a hard link, still sparse,
    its bytes those written; a file written after it publishes too."""
    m = make_mount(src, *FAST)
    with open(m.mnt / "huge.tif", "wb") as fh:
        fh.write(b"II*\0")
        fh.truncate(1 << 30)
    write_file(m.mnt / "small.txt", b"small\n")
    wait_drained(m.mnt, src)
    assert not (src / "huge.tif.zarr.zip").exists()
    st = (src / "huge.tif").stat()
    assert st.st_size == 1 << 30 and st.st_blocks * 512 < 1 << 20
    assert (src / "small.txt").read_bytes() == b"small\n"
    with open(m.mnt / "huge.tif", "rb") as fh:
        assert fh.read(8) == b"II*\0\0\0\0\0"
        fh.seek((1 << 30) - 4)
        assert fh.read() == b"\0\0\0\0"
