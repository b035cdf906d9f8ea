"""Archive trees are bounded across archives: many GDI packages of many members, all listed,
do not keep every package's member tree in the daemon (red team F7: four packages of 99,000
members took it to 612 MiB with --cache-size 64M), and a package whose tree was let go is
listed and read as before, from the persistent index."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_tool
from tests.mount.conftest import Mount
from tests.toolbox import proc_status

corpus: ModuleType = load_tool("make_c4gh_corpus")

PACKAGES = 6
MEMBERS = 20_000  # a package: ~13 MiB of tree held, before
FOLDERS = 20
KEPT = 25_000  # --described-entries: one package's tree, not two


def member_name(i: int) -> str:
    return f"d{i % FOLDERS:02d}/{'x' * 80}{i:06d}"  # long names, as a hostile TAR has


def member_data(i: int) -> bytes:
    return b"member %d\n" % i


def many_members_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(corpus.normalized_info("manifest.json", 2), io.BytesIO(b"{}"))  # no digests
        for i in range(MEMBERS):
            data = member_data(i)
            tar.addfile(corpus.normalized_info(member_name(i), len(data)), io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def package(tmp_path: Path) -> tuple[Path, Path]:
    """(a package of MEMBERS members, the node's secret key)."""
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    sealed = corpus.encrypt(many_members_tar(), keys["writer"].secret, [keys["node"].public])
    (tmp_path / "p.tar.c4gh").write_bytes(sealed)
    return tmp_path / "p.tar.c4gh", keys["node"].secret_path


def test_many_listed_packages_keep_a_bounded_tree_and_list_again_from_the_index(
    package: tuple[Path, Path], tmp_path: Path
) -> None:
    """Six packages of 20,000 members dropped in SRC and listed: every package's tree was held
    by its folder nodes for as long as the root's listing lived. Now one LRU keeps 25,000
    entries across them; the first package, let go, lists the same names and reads its members
    byte-exact, its tree read back (from the index) for the version its nodes were made from."""
    sealed, secret = package
    src = tmp_path / "src"
    src.mkdir()
    m = Mount(src, tmp_path / "mnt", tmp_path / "log", tmp_path / "index")
    m.start("--c4gh-key", str(secret), "--cache-size", "8M", "--described-entries", str(KEPT),
            "--log-level", "DEBUG")  # fmt: skip
    try:
        assert m.proc is not None
        before = proc_status(m.proc.pid, "VmHWM")
        names = sorted(f"p{n}.tar.c4gh" for n in range(1, PACKAGES + 1))
        for name in names:  # dropped in SRC once the daemon runs: its growth is measured
            shutil.copyfile(sealed, tmp_path / name)
            os.rename(tmp_path / name, src / name)  # whole: never described half written
        deadline = time.monotonic() + 30  # the watcher's word of the new names
        while sorted(os.listdir(m.mnt)) != names:
            assert time.monotonic() < deadline, os.listdir(m.mnt)
            time.sleep(0.1)
        folders = sorted(["manifest.json", *(f"d{f:02d}" for f in range(FOLDERS))])
        for name in names:
            assert sorted(os.listdir(m.mnt / name)) == folders
        grown = proc_status(m.proc.pid, "VmHWM") - before
        # Before: 114-187 MiB (every tree kept); now ~63 MiB (a tree, and the one being described).
        assert grown < 88 << 20, f"peak RSS grew {grown >> 20} MiB listing {PACKAGES} packages"

        first = m.mnt / "p1.tar.c4gh" / "d07"
        expected = {member_name(i).rpartition("/")[2]: i for i in range(7, MEMBERS, FOLDERS)}
        with os.scandir(first) as it:
            assert sorted(e.name for e in it) == sorted(expected)
        last = max(expected, key=expected.__getitem__)
        assert (first / last).read_bytes() == member_data(expected[last])
        assert "p1.tar.c4gh: reading its c4gh description again" in m.log_text()
    finally:
        m.stop()
