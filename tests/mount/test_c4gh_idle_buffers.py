"""What streaming a GDI package member leaves resident in the daemon, through a real mount."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tests.mount.test_write_side import MakeMount
from tests.toolbox import load_tool

corpus = load_tool("make_c4gh_corpus")
MiB = 1 << 20


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_a_member_streamed_through_the_cache_leaves_no_idle_buffers_beside_it(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """A 384 MiB member read once with `sha256sum` through a 256 MiB cache. Every page buffer
    the stream made stayed in its ring once the pages behind the reader were emptied: the
    daemon grew by 158 MiB (a 1 GiB member: by ~195 MiB, near the cache's size), and a decant
    original read next kept its own planes beside them (466 MiB resident for a 256 MiB
    cache). Pages that leave the cache now give their buffers back, beyond a few kept for the
    next loads: the daemon keeps what the stream still holds (a quarter of the cache behind
    the reader, the read-ahead ahead), 90-92 MiB here."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    data = os.urandom(384 * MiB)
    digest = hashlib.sha256(data).hexdigest()
    corpus.write_package(src / "big.tar.c4gh", corpus.with_manifest([("big.bin", data)]),
                         keys["writer"], [keys["node"]])  # fmt: skip
    del data
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path), "--cache-size", "256M")
    member = m.mnt / "big.tar.c4gh" / "big.bin"
    assert member.stat().st_size == 384 * MiB
    before = _rss(m.proc.pid)
    done = subprocess.run(["sha256sum", str(member)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split()[0] == digest, done
    grew = (_rss(m.proc.pid) - before) / MiB
    # Held by the stream: up to 64 MiB behind the reader, 16 MiB read ahead, up to 24 MiB of
    # idle page buffers, and the sha256's backlog.
    assert grew < 125, f"the daemon grew by {grew:.0f} MiB streaming the member"
