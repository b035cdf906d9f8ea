"""Red team, round 33b: bytes served wrong without an error, through a real mount.

Expected bytes come from what was handed to the writers (the TAR plaintext, the TIFF written),
never from vfs.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import ModuleType

from tests.conftest import load_tool
from tests.mount.conftest import Mount

corpus: ModuleType = load_tool("make_c4gh_corpus")

SEG = 65536
CIPHER_SEG = SEG + 28


def dd(path: Path, offset: int, size: int = 4096) -> subprocess.CompletedProcess[bytes]:
    """One small read at `offset` by dd (direct: no kernel read-ahead around it)."""
    return subprocess.run(
        ["dd", f"if={path}", "bs=4096", f"skip={offset // 4096}", f"count={size // 4096}",
         "iflag=direct", "status=none"],
        capture_output=True, timeout=20,
    )  # fmt: skip


def test_reordered_segments_of_a_gdi_package_are_refused_once_checked(tmp_path: Path) -> None:
    """crypt4gh authenticates each 64 KiB segment alone: two segments of one member's data
    swapped in the package both authenticate, and the member's plaintext is wrong. The member
    has a declared sha256 (manifest payload); a whole read fails on it, but small reads never
    lead to a check (no background verification for "authenticated" packages), so every small
    read of the swapped range kept serving another segment's bytes with exit 0."""
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(8 * SEG)
    name = "allele-freq.chr1.0.br10000000.00000000000000aa.parquet"
    members = [(name, data)]
    plain = corpus.write_package(
        src / "P.tar.c4gh", [("manifest.json", corpus.manifest(members)), *members],
        keys["writer"], [keys["node"]],
    )  # fmt: skip
    at = plain.index(data)
    package = bytearray((src / "P.tar.c4gh").read_bytes())
    head = corpus.header_len_of(bytes(package))
    a, b = at // SEG + 2, at // SEG + 4  # two segments wholly inside the member's data
    sa = slice(head + a * CIPHER_SEG, head + (a + 1) * CIPHER_SEG)
    sb = slice(head + b * CIPHER_SEG, head + (b + 1) * CIPHER_SEG)
    package[sa], package[sb] = package[sb], package[sa]
    (src / "P.tar.c4gh").write_bytes(bytes(package))

    m = Mount(src, tmp_path / "mnt", tmp_path / "log", tmp_path / "index")
    m.start("--c4gh-key", str(keys["node"].secret_path))
    try:
        member = m.mnt / "P.tar.c4gh" / name
        off = a * SEG - at + 4096  # inside swapped segment a, in the member's coordinates
        want = data[off : off + 4096]
        dd(member, off)  # the first small read may slip through: it starts the check
        deadline = time.monotonic() + 10
        while True:
            got = dd(member, off)
            if got.returncode != 0:
                assert b"Input/output error" in got.stderr, got.stderr
                break
            assert got.stdout == want or time.monotonic() < deadline, (
                "a small read of the reordered segment still served another segment's "
                f"plaintext with exit 0 after 10 s (matches offset {data.find(got.stdout)}, "
                f"asked {off})"
            )
            time.sleep(0.5)
        # A whole read of the member fails too.
        assert subprocess.run(["cat", str(member)], capture_output=True).returncode != 0
    finally:
        m.stop()
