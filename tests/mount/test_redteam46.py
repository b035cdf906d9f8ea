"""Red team, round 46: GDI packages in a local SRC, read through a real mount with real clients.
Each test fails on the daemon before its fix; see the commit that added it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tests.mount.test_write_side import MakeMount
from tests.toolbox import load_tool

corpus = load_tool("make_c4gh_corpus")
SEG = 65536


def test_a_package_cut_at_a_member_header_is_shown_raw_not_served_unchecked(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """No key needed: a package's first two segments dropped, so that it starts at `b.bin`'s
    TAR header, and two of `b.bin`'s segments swapped. `sha256sum` through the mount printed
    a wrong digest with exit 0 and the log said nothing: with manifest.json gone, nothing
    checked the members. The package is shown as its raw file now, and the log says why."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    data = os.urandom(4 * SEG)
    legit = corpus.write_package(src / "legit.tar.c4gh", corpus.member_at_segment(2, data),
                                 keys["writer"], [keys["node"]])  # fmt: skip
    assert data in legit
    evil = corpus.segments_dropped((src / "legit.tar.c4gh").read_bytes(), 2, swap=(1, 2))
    (src / "evil.tar.c4gh").write_bytes(evil)
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path))
    done = subprocess.run(["sha256sum", str(m.mnt / "legit.tar.c4gh" / "b.bin")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    done = subprocess.run(["sha256sum", str(m.mnt / "evil.tar.c4gh" / "b.bin")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "Not a directory" in done.stderr, done
    assert (m.mnt / "evil.tar.c4gh").read_bytes() == evil  # the raw file, as it is in SRC
    assert "evil.tar.c4gh: first member 'b.bin', not manifest.json" in m.log_text()


def test_a_package_whose_first_header_is_a_dropped_member_is_shown_raw(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """Stop 47: the manifest-first rule read the first member served, so a `..` member the
    mount drops, then manifest.json, passed; the first TAR header is what counts now."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    members = corpus.with_manifest([("b.bin", b"B" * 1000)])
    corpus.write_package(src / "evil.tar.c4gh", [("../escape.bin", b"x" * 10), *members],
                         keys["writer"], [keys["node"]])  # fmt: skip
    corpus.write_package(src / "legit.tar.c4gh", members, keys["writer"], [keys["node"]])
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path))
    assert (m.mnt / "legit.tar.c4gh" / "b.bin").read_bytes() == b"B" * 1000
    assert (m.mnt / "evil.tar.c4gh").is_file()  # the raw file, not a folder of members
    assert (m.mnt / "evil.tar.c4gh").read_bytes() == (src / "evil.tar.c4gh").read_bytes()
    assert "evil.tar.c4gh: first member '../escape.bin', not manifest.json" in m.log_text()
