"""Red team, round 35a: decant archives (series, folder archives, hostile zips) through a real
mount, and the `decant` CLI on hostile input.

Expected bytes (or the expected failure) come from what was handed to the writers (the arrays
given to tifffile, the bytes written), never from vfs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import Mount, User, open_tmp


def _decant(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vfs.commands", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _nested_series(folder: Path, out: Path) -> dict[str, bytes]:
    """A folder of two TIFFs of different dtypes (so packed nested: `out` is a `.zarr/` of one
    bundle per member) packed with the real CLI; returns each member's bytes as written."""
    folder.mkdir()
    rng = np.random.default_rng(35)
    tifffile.imwrite(folder / "a.tif", rng.integers(0, 255, (3, 64, 64), dtype=np.uint8))
    tifffile.imwrite(folder / "b.tif", rng.integers(0, 65535, (2, 32, 48), dtype=np.uint16))
    done = _decant("pack", "--series", "-q", str(folder), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [".decant", "m0.zarr.zip", "m1.zarr.zip"]
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_series_member_whose_bundle_its_owner_keeps_private_is_not_read_by_others(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A nested series is a folder (`run.zarr/`) of one zip bundle per member. Its members were
    shown with the folder's mode (0755 → 0444) whatever each bundle's own: root chmods
    `run.zarr/m0.zarr.zip` 0600, which nobody else may read in SRC, and another user read the
    member it holds through the mount, exit 0. A member opens only for a caller who may read its
    bundle in SRC (group bits count as the kernel counts them)."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt35a-series-mode")
    src = base / "src"
    src.mkdir()
    src.chmod(0o755)
    members = _nested_series(base / "run", src / "run.zarr")
    (src / "run.zarr" / "m0.zarr.zip").chmod(0o600)  # a.tif's bundle: root's alone
    b_bundle = src / "run.zarr" / "m1.zarr.zip"
    os.chown(b_bundle, 0, u.gid)
    b_bundle.chmod(0o640)  # b.tif's: root's and the user's group's
    assert u.errno_of("read(p)", p=src / "run.zarr" / "m0.zarr.zip") == errno.EACCES
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other")
        shown = m.mnt / "run"
        # Shown as its bundle is: `ls -l` and access() tell what an open allows.
        probe = "[os.stat(p).st_mode & 0o7777, os.stat(p).st_gid, os.access(p, os.R_OK)]"
        seen = {n: u.value_of(probe, p=shown / n) for n in ("a.tif", "b.tif")}
        assert seen == {"a.tif": [0o400, 0, False], "b.tif": [0o440, u.gid, True]}, seen
        assert (shown / "a.tif").read_bytes() == members["a.tif"]  # root reads as before
        got = u.value_of("read(p)", p=shown / "b.tif")  # the group may read b's bundle
        assert got == _sha(members["b.tif"])
        assert u.errno_of("read(p)", p=shown / "a.tif") == errno.EACCES, (
            "another user read the member of a bundle its owner made 0600"
        )
        b_bundle.chmod(0o600)  # the group's right taken back after the listing
        assert u.errno_of("read(p)", p=shown / "b.tif") == errno.EACCES
    finally:
        m.stop()


def test_a_folder_archive_whose_chunk_file_its_owner_keeps_private_is_not_read_by_others(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """A `.zarr/` folder archive (a `.zarr.zip` unzipped) is shown as its TIFF with the
    folder's mode; its pixel chunk file chmod 0600 by its owner was served to anyone through
    the mount. A folder archive's original opens only for a caller who may read every file of
    it in SRC, as an AcqStore image's."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt35a-folder-mode")
    src = base / "src"
    src.mkdir()
    src.chmod(0o755)
    pixels = np.arange(4 * 50 * 60, dtype=np.uint16).reshape(4, 50, 60)
    tifffile.imwrite(base / "one.tif", pixels)
    written = (base / "one.tif").read_bytes()
    done = _decant("pack", "-q", str(base / "one.tif"), "-o", str(base / "one.tif.zarr.zip"))
    assert done.returncode == 0, done.stderr
    folder = src / "one.tif.zarr"
    with zipfile.ZipFile(base / "one.tif.zarr.zip") as zf:
        zf.extractall(folder)
    for dirpath, _dirs, filenames in os.walk(folder):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    chunk = next(p for p in (folder / "0").iterdir() if not p.name.startswith("."))
    chunk.chmod(0o600)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--read-only")
        shown = m.mnt / "one.tif"
        assert shown.read_bytes() == written
        assert u.errno_of("read(p)", p=shown) == errno.EACCES, (
            "another user read pixels of a chunk file its owner made 0600"
        )
        chunk.chmod(0o644)
        assert u.value_of("read(p)", p=shown) == _sha(written)
    finally:
        m.stop()


def _restore_as_root(archive: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    here = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(here)}
    return subprocess.run([sys.executable, "-m", "vfs.commands", "restore", "-q", str(archive),
                           *extra], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env, check=False)  # fmt: skip


def test_restore_into_a_shared_folder_follows_no_link_another_user_planted(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """`cd /shared && decant restore run.zarr` (a series) writes its members into `run/`,
    made with `mkdir -p`: a user who planted `run` as a symlink to a folder of root's in a
    shared (sticky, world-writable) folder had root restore into that folder, exit 0 (with
    `-o /shared/out/x.tif` likewise for one original). A link of another user's on the way is
    refused, with one line naming it; nothing is written through it. A link of root's own is
    still followed."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt35a-restore-link")
    members = _nested_series(base / "run", base / "run.zarr")
    single = base / "a.tif.zarr.zip"
    done = _decant("pack", "-q", str(base / "run" / "a.tif"), "-o", str(single))
    assert done.returncode == 0, done.stderr
    shared, victim = base / "shared", base / "victim"
    shared.mkdir()
    shared.chmod(0o1777)
    victim.mkdir()
    for name, to in (("run", victim), ("out", victim)):
        got = u.run("/usr/bin/ln", "-s", str(to), str(shared / name))
        assert got.returncode == 0, got.stderr
    series = _restore_as_root(base / "run.zarr", shared)
    one = _restore_as_root(single, shared, "-o", str(shared / "out" / "a.tif"))
    planted = sorted(p.name for p in victim.iterdir())
    assert planted == [], f"root restored {planted} through {u.name}'s symlink"
    for got in (series, one):
        assert got.returncode != 0
        line = got.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert "symlink" in line and f"uid {u.uid}" in line, line
    # Root's own link is followed, as before.
    (shared / "run").unlink()
    (shared / "run").symlink_to(victim)
    assert _restore_as_root(base / "run.zarr", shared).returncode == 0
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == members


def test_packing_a_user_s_folder_as_a_series_packs_no_file_a_link_of_theirs_points_to(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """`decant pack --series FOLDER` followed symlinks among the folder's files: root packing a
    user's folder packed the root-only TIFF the user's `b.tif` linked to, into an archive
    published with the folder's mode (0755), which the user then restored: root's pixels. A
    series packs the folder's own regular files; a symlink among them is refused (one line
    naming it), and nothing is published."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt35a-series-link")
    private = base / "private"
    private.mkdir(mode=0o700)
    secret = np.full((2, 16, 16), 7, np.uint8)
    tifffile.imwrite(private / "secret.tif", secret)
    (private / "secret.tif").chmod(0o600)
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    run = shared / "run"
    got = u.run("/usr/bin/mkdir", str(run))
    assert got.returncode == 0, got.stderr
    got = u.run("/usr/bin/ln", "-s", str(private / "secret.tif"), str(run / "b.tif"))
    assert got.returncode == 0, got.stderr
    tifffile.imwrite(run / "a.tif", np.full((2, 16, 16), 1, np.uint8))  # same shape: consolidated
    os.chown(run / "a.tif", u.uid, u.gid)
    out = shared / "run.zarr.zip"
    done = _decant("pack", "--series", "-q", str(run), "-o", str(out))
    if out.exists():
        with zipfile.ZipFile(out) as zf:
            held = zf.read(".decant/manifest.json").decode()
        pytest.fail(f"root packed {u.name}'s link to its private TIFF (exit {done.returncode}, "
                    f"archive mode {oct(out.stat().st_mode & 0o777)}): {held[:200]}")  # fmt: skip
    assert done.returncode != 0
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert "b.tif" in line and "symlink" in line, line


def _sparse_tiff_of_many_strips(path: Path, strips: int) -> None:
    """A classic TIFF of one 16-pixel-wide page of `strips` one-row strips, its StripOffsets
    and StripByteCounts arrays all zero: a sparse file, 4 KiB on disk."""
    arrays = 4096

    def tag(code: int, kind: int, count: int, value: bytes) -> bytes:
        return struct.pack("<HHI", code, kind, count) + value

    def short(v: int) -> bytes:
        return struct.pack("<HH", v, 0)

    def long(v: int) -> bytes:
        return struct.pack("<I", v)

    entries = [tag(256, 4, 1, long(16)), tag(257, 4, 1, long(strips)), tag(258, 3, 1, short(8)),
               tag(259, 3, 1, short(1)), tag(262, 3, 1, short(1)),
               tag(273, 4, strips, long(arrays)), tag(277, 3, 1, short(1)),
               tag(278, 4, 1, long(1)), tag(279, 4, strips, long(arrays + 4 * strips))]  # fmt: skip
    head = b"II*\x00" + long(8) + struct.pack("<H", len(entries)) + b"".join(entries) + long(0)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(arrays + 8 * strips + 16)


def test_packing_a_tiff_declaring_millions_of_strips_costs_no_memory_for_them(
    tmp_path: Path,
) -> None:
    """`decant pack` of a 512 MiB sparse TIFF (4 KiB on disk) whose one page declares 2^26
    strips peaked at 1.3 GiB: tifffile read every offset and byte count into Python ints
    before the scan could see there were more than mode D's 2^21 (2^28 strips: ~5 GiB). The
    declared counts are summed from the IFD entries' headers first; past the bound the file is
    packed verbatim, as before, without reading them."""
    src = tmp_path / "strips.tif"
    _sparse_tiff_of_many_strips(src, 1 << 26)
    assert os.stat(src).st_blocks * 512 <= 64 * 1024
    out, rss = tmp_path / "strips.tif.zarr.zip", tmp_path / "rss"
    here = Path(__file__).resolve().parents[2]
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(rss), sys.executable, "-m",
                           "vfs.commands", "pack", "-q", str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=here,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    peak_mib = int(rss.read_text().split()[-1]) / 1024
    assert peak_mib < 600, f"packing peaked at {peak_mib:.0f} MiB"
    info = _decant("info", str(out))
    assert "verbatim" in info.stdout, info.stdout


def test_a_series_member_named_as_another_member_s_folder_fails_the_archive_alone(
    tmp_path: Path, make_mount
) -> None:  # type: ignore[no-untyped-def]
    """A series manifest listing members `a` and `a/b.tif` (a file and a folder of one name)
    was taken: the mount showed `a` alone and hid `a/b.tif` without a word, `decant verify`
    said OK for both, and `decant restore` wrote `a`, then failed (exit 3, "cannot restore to
    a") with half the series on disk. Such a manifest is refused as any malformed one: shown
    raw with a log line naming it, verify fails, restore writes nothing."""
    series = _nested_series(tmp_path / "run", tmp_path / "run.zarr")
    assert series
    src = tmp_path / "src"
    src.mkdir()
    archive = src / "x.zarr"
    shutil.copytree(tmp_path / "run.zarr", archive)
    manifest = archive / ".decant" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["members"][0]["relpath"] = "a"
    doc["members"][1]["relpath"] = "a/b.tif"
    manifest.write_text(json.dumps(doc))
    verify = _decant("verify", str(archive))
    assert verify.returncode != 0, verify.stdout
    back = tmp_path / "back"
    restore = _decant("restore", "-q", str(archive), "-o", str(back))
    assert restore.returncode not in (0, 3), restore.stderr
    assert not back.exists() or not any(back.iterdir())
    m = make_mount(src)
    assert sorted(os.listdir(m.mnt)) == ["x.zarr"]  # raw, as a malformed archive is shown
    assert "x.zarr" in m.log_text()


def test_a_consolidated_series_is_no_more_open_than_its_most_private_member(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """`decant pack --series` gave a consolidated archive (one zip of every member's pixels)
    the folder's mode: a 0755 folder holding a 0600 TIFF became a 0755 zip, and any user could
    read that TIFF's pixels (from the zip, or through the mount as the series' member). The
    archive takes the folder's mode bits less any a member lacks."""
    u = unprivileged
    base = open_tmp(tmp_path_factory, "rt35a-series-modes")
    run = base / "run"
    run.mkdir()
    tifffile.imwrite(run / "a.tif", np.full((2, 16, 16), 1, np.uint8))
    tifffile.imwrite(run / "b.tif", np.full((2, 16, 16), 9, np.uint8))
    (run / "a.tif").chmod(0o644)
    (run / "b.tif").chmod(0o600)
    run.chmod(0o755)
    out = base / "run.zarr.zip"
    done = _decant("pack", "--series", "-q", str(run), "-o", str(out))
    assert done.returncode == 0, done.stderr
    mode = out.stat().st_mode & 0o7777
    assert u.errno_of("read(p)", p=run / "b.tif") == errno.EACCES
    assert mode & 0o077 == 0 and u.errno_of("read(p)", p=out) == errno.EACCES, (
        f"the series holding a 0600 member was published {oct(mode)}"
    )
