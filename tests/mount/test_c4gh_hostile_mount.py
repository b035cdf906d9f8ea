"""Hostile GDI packages through a real mount: a 500-deep member path and members whose names are
cut at a NUL or too long, beside a good package, a plain folder and a plain file.

Once, the 500-deep package overflowed the stack while its description went into the index: the
root scan failed and every lookup in the whole mount answered EIO, thousands of log lines a
second. Expected values come from the bytes handed to the generator and from os/errno.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import load_tool
from tests.mount.conftest import Mount, settle

corpus: ModuleType = load_tool("make_c4gh_corpus")
Members = list[tuple[str, bytes]]
DEEP = "d/" * 500 + "deep.txt"


@dataclass
class Hostile:
    m: Mount
    src: Path
    members: Members  # the GDI members every package here carries
    keys: dict[str, Any]


def encrypt_to(path: Path, items: list[Any], keys: dict[str, Any]) -> None:
    plain = corpus.raw_tar(items)
    path.write_bytes(corpus.encrypt(plain, keys["writer"].secret, [keys["node"].public]))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    base = tmp_path_factory.mktemp("c4gh-hostile")
    src = base / "src"
    (src / "plain").mkdir(parents=True)
    (src / "plain" / "notes.txt").write_bytes(b"notes\n")
    (src / "readme.txt").write_bytes(b"readme\n")
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    members = corpus.gdi_members(parquet_rows=(3000, 400))
    corpus.write_package(src / "good.tar.c4gh", members, keys["writer"], [keys["node"]])
    (src / "good.tar.c4gh").chmod(0o644)  # readable by others on disk, whatever the umask
    encrypt_to(src / "deep.tar.c4gh", [*members, (DEEP, b"deep\n")], keys)
    bad = [*corpus.nul_name_members().values(), *corpus.overlong_members(500).values()]
    # Its manifest lists the edge names too: a member the payload leaves out is not served.
    edge = [(os.fsdecode(n), d) for n, d in corpus.edge_name_members().items()]
    listed = corpus.with_manifest([*members[1:], *edge])[: len(members)]
    encrypt_to(src / "names.tar.c4gh", [*listed, *bad, *corpus.edge_name_tar_items()], keys)
    settle(*src.glob("*.tar.c4gh"))  # their descriptions kept in the index (a remount's test)
    m = Mount(src, base / "mnt", base / "log", base / "index")
    try:  # a start that fails (the mount answering EIO) must still unmount and end the daemon
        m.start("--c4gh-key", str(keys["node"].secret_path))
        yield Hostile(m, src, members, keys)
    finally:
        m.stop()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_under(folder: Path) -> set[bytes]:
    """Every file below `folder` as raw relative bytes (names may not be UTF-8)."""
    out, top = set(), os.fsencode(folder)
    for root, _dirs, names in os.walk(top):
        out.update(os.path.relpath(os.path.join(root, n), top) for n in names)
    return out


def assert_members(folder: Path, members: Members) -> None:
    for name, data in members:
        assert sha256((folder / name).read_bytes()) == sha256(data), f"{folder.name}/{name}"


def errno_of(path: Path | bytes) -> int:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno or 0
    return 0


def test_the_mount_stays_up_and_packages_read_byte_exact(hostile: Hostile) -> None:
    mnt = hostile.m.mnt
    names = {p.name: p.is_dir() for p in mnt.iterdir() if not p.name.startswith(".")}
    assert names == {
        "good.tar.c4gh": True,
        "deep.tar.c4gh": True,
        "names.tar.c4gh": True,
        "plain": True,
        "readme.txt": False,
    }
    wanted = {n.encode() for n, _ in hostile.members}
    assert files_under(mnt / "good.tar.c4gh") == wanted
    assert_members(mnt / "good.tar.c4gh", hostile.members)
    assert files_under(mnt / "deep.tar.c4gh") == wanted  # the 500-deep member is dropped
    assert_members(mnt / "deep.tar.c4gh", hostile.members)
    edge = corpus.edge_name_members()
    assert files_under(mnt / "names.tar.c4gh") == wanted | set(edge)
    assert_members(mnt / "names.tar.c4gh", hostile.members[1:])  # its own manifest lists more
    folder = os.fsencode(mnt / "names.tar.c4gh")
    for raw, body in edge.items():  # 255 bytes, an undecodable byte, 64 levels: all served
        with open(os.path.join(folder, raw), "rb") as fh:
            assert fh.read() == body, raw
    assert (mnt / "readme.txt").read_bytes() == b"readme\n"
    assert (mnt / "plain" / "notes.txt").read_bytes() == b"notes\n"
    assert hostile.m.proc is not None and hostile.m.proc.poll() is None


def test_dropped_names_are_absent_not_shortened(hostile: Hostile) -> None:
    folder = hostile.m.mnt / "names.tar.c4gh"
    for cut in ("cut", "dir", "L" * 120, "pax-é"):  # what tarfile alone would have shown
        assert errno_of(folder / cut) == errno.ENOENT, cut
    # FUSE hands names of up to 1024 bytes to the daemon, so it is the daemon that says no.
    assert errno_of(folder / ("x" * 256)) == errno.ENOENT
    assert errno_of(folder / "long") == errno.ENOENT
    assert errno_of(hostile.m.mnt / "deep.tar.c4gh" / "d") == errno.ENOENT


def test_lookups_elsewhere_work_and_the_log_stays_small(hostile: Hostile) -> None:
    mnt = hostile.m.mnt
    for i in range(300):
        assert errno_of(mnt / f"missing-{i}") == errno.ENOENT
        assert errno_of(mnt / "deep.tar.c4gh" / f"missing-{i}") == errno.ENOENT
        assert errno_of(mnt / "names.tar.c4gh" / f"cut-{i}") == errno.ENOENT
        if i % 30 == 0:
            assert (mnt / "plain" / "notes.txt").read_bytes() == b"notes\n"
            assert os.stat(mnt / "deep.tar.c4gh" / "manifest.json").st_size > 0
            assert sorted(os.listdir(mnt / "plain")) == ["notes.txt"]
    text = hostile.m.log_text()
    lines = text.splitlines()
    assert len(lines) < 200, lines[-20:]
    assert "Traceback" not in text and "RecursionError" not in text
    (deep,) = [line for line in lines if "deep.tar.c4gh: not serving" in line]
    assert "not serving 1 member(s): 'd/d/d/" in deep and "501 levels deep (more than 64)" in deep
    (names,) = [line for line in lines if "names.tar.c4gh: not serving" in line]
    assert "not serving 8 member(s)" in names and "contains a NUL byte" in names
    assert len(names) < 3000  # megabyte names are shortened in the log
    assert hostile.m.proc is not None and hostile.m.proc.poll() is None


def test_decrypted_members_are_not_readable_by_others(hostile: Hostile) -> None:
    """--c4gh-mode defaults to 0440: owner and group of the package file read, others do not."""
    package = hostile.src / "good.tar.c4gh"
    assert package.stat().st_mode & 0o777 == 0o644  # readable by others on disk, as written
    folder = hostile.m.mnt / "good.tar.c4gh"
    assert folder.stat().st_mode & 0o7777 == 0o550
    for name, _data in hostile.members:
        assert (folder / name).stat().st_mode & 0o7777 == 0o440, name
    assert (folder / "headers").stat().st_mode & 0o7777 == 0o550


def test_a_remount_lists_the_packages_from_the_index(hostile: Hostile) -> None:
    """The descriptions went into the index (where the stack once overflowed)."""
    m = hostile.m
    m.stop()
    m.log.write_text("")
    m.start("--c4gh-key", str(hostile.keys["node"].secret_path))
    wanted = {n.encode() for n, _ in hostile.members}
    assert files_under(m.mnt / "deep.tar.c4gh") == wanted
    assert_members(m.mnt / "deep.tar.c4gh", hostile.members)
    assert "not serving" not in m.log_text()  # listed from the index, not walked again
