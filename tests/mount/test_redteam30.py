"""Red team, round 30: through a real mount, as unprivileged users."""

from __future__ import annotations

import os
import threading
import time
import zipfile
from collections.abc import Iterator

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from tests.toolbox import proc_status, zip_of_many

CACHE_MIB = 64
ENTRIES = 1_000_000  # half the most a zip may hold (MAX_ZIP_ENTRIES, 2,097,152)
FOLDERS = 4


@pytest.fixture
def mount(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[Mount]:
    base = open_tmp(tmp_path_factory, "redteam30")
    src = base / "src"
    src.mkdir()
    src.chmod(0o755)
    (src / "notes.txt").write_bytes(b"still served\n")
    for i in range(FOLDERS):
        (src / f"u{i}").mkdir()
        os.chown(src / f"u{i}", unprivileged.uid, unprivileged.gid)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--read-only", "--cache-size", f"{CACHE_MIB}M")
    try:
        yield m
    finally:
        m.stop()


def test_zips_of_many_entries_listed_at_once_stay_within_the_memory_bound(
    mount: Mount, unprivileged: User
) -> None:
    """A user links one zip of 1,000,000 one-byte entries (their own file, 75 MB) into four
    folders of theirs in SRC and lists them all at once: each listing opens its archive, whose
    directory costs the daemon ~75 MiB while it is parsed, and all four were parsed together
    (peak RSS +300 MiB here; six of 2,000,000 entries: +748 MiB, and it grows with the number
    of folders). The daemon must stay within its cache budget + 150 MiB over its start."""
    first = zip_of_many(mount.src / "u0" / "many.tif.zarr.zip", ENTRIES)
    os.chown(first, unprivileged.uid, unprivileged.gid)
    for i in range(1, FOLDERS):
        made = unprivileged.run("ln", str(first), str(mount.src / f"u{i}" / "many.tif.zarr.zip"))
        assert made.returncode == 0, made.stderr
    assert mount.proc is not None
    before = proc_status(mount.proc.pid, "VmRSS")
    listed: dict[int, object] = {}

    def ls(i: int) -> None:
        listed[i] = unprivileged.run("ls", str(mount.mnt / f"u{i}"), timeout=120).stdout.split()

    threads = [threading.Thread(target=ls, args=(i,)) for i in range(FOLDERS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    grown = (proc_status(mount.proc.pid, "VmHWM") - before) >> 20
    print(f"{FOLDERS} listings at once: {took:.1f} s, peak RSS {grown} MiB over the start")
    assert all(v == ["many.tif.zarr.zip"] for v in listed.values()), listed  # shown raw
    assert (mount.mnt / "notes.txt").read_bytes() == b"still served\n"
    assert grown < CACHE_MIB + 150, f"peak RSS grew {grown} MiB"


def test_manifests_inflated_at_once_stay_within_the_memory_bound(
    mount: Mount, unprivileged: User
) -> None:
    """A manifest may be 128 MiB, and a deflated zip entry costs its maker a thousandth of
    that: one zip of 60 KB whose manifest inflates to 60 MiB, linked into four folders of the
    user's and listed at once. Large manifests were parsed one at a time, but each listing
    inflated its own first and waited with it in hand: peak RSS +344 MiB (four of 120 MiB:
    +615 MiB), growing with the number of folders."""
    first = mount.src / "u0" / "bomb.tif.zarr.zip"
    with zipfile.ZipFile(first, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(".decant/manifest.json", b" " * (60 << 20) + b"{}")
    os.chown(first, unprivileged.uid, unprivileged.gid)
    for i in range(1, FOLDERS):
        made = unprivileged.run("ln", str(first), str(mount.src / f"u{i}" / "bomb.tif.zarr.zip"))
        assert made.returncode == 0, made.stderr
    assert mount.proc is not None
    before = proc_status(mount.proc.pid, "VmRSS")
    listed: dict[int, object] = {}

    def ls(i: int) -> None:
        listed[i] = unprivileged.run("ls", str(mount.mnt / f"u{i}"), timeout=120).stdout.split()

    threads = [threading.Thread(target=ls, args=(i,)) for i in range(FOLDERS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    grown = (proc_status(mount.proc.pid, "VmHWM") - before) >> 20
    print(f"{FOLDERS} listings at once: {took:.1f} s, peak RSS {grown} MiB over the start, "
          f"zip {first.stat().st_size} bytes")  # fmt: skip
    assert all(v == ["bomb.tif.zarr.zip"] for v in listed.values()), listed  # shown raw
    assert (mount.mnt / "notes.txt").read_bytes() == b"still served\n"
    assert grown < CACHE_MIB + 150, f"peak RSS grew {grown} MiB"
