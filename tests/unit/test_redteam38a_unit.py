"""Red team, round 38a: pure checks (POSIX ACLs as mode bits, ...)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vfs.acl import GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, acl_stat, narrowed_mode

ANY = 0xFFFFFFFF


def acl(*entries: tuple[int, int, int]) -> bytes:
    out = (2).to_bytes(4, "little")
    for tag, perm, ident in sorted(entries):
        out += tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + ident.to_bytes(4, "little")
    return out


def test_a_minimal_acl_changes_nothing() -> None:
    raw = acl((USER_OBJ, 6, ANY), (GROUP_OBJ, 4, ANY), (OTHER, 4, ANY))
    assert narrowed_mode(0o100644, raw) == 0o100644


@pytest.mark.parametrize("tag", [USER, GROUP])
def test_a_named_entry_denied_narrows_group_and_other(tag: int) -> None:
    raw = acl((USER_OBJ, 6, ANY), (tag, 0, 999), (GROUP_OBJ, 4, ANY), (MASK, 4, ANY),
              (OTHER, 4, ANY))  # fmt: skip
    assert narrowed_mode(0o100644, raw) == 0o100600


def test_named_entries_granting_read_keep_it_and_the_mask_applies() -> None:
    raw = acl((USER_OBJ, 7, ANY), (USER, 5, 999), (GROUP_OBJ, 5, ANY), (MASK, 5, ANY),
              (OTHER, 5, ANY))  # fmt: skip
    assert narrowed_mode(0o40755, raw) == 0o40755
    masked = acl((USER_OBJ, 7, ANY), (USER, 7, 999), (GROUP_OBJ, 5, ANY), (MASK, 1, ANY),
                 (OTHER, 5, ANY))  # fmt: skip
    assert narrowed_mode(0o40715, masked) == 0o40711


@pytest.mark.parametrize("raw", [b"", b"\x01\x00\x00\x00", acl((USER_OBJ, 6, ANY))[:-1],
                                 acl((0x40, 4, ANY))])  # fmt: skip
def test_a_malformed_acl_leaves_the_owner_alone(raw: bytes) -> None:
    assert narrowed_mode(0o100644, raw) == 0o100600


def test_acl_stat_of_a_file_with_a_denying_acl(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    path.chmod(0o644)
    st = os.lstat(path)
    assert acl_stat(path, st) is st
    try:
        os.setxattr(path, "system.posix_acl_access",
                    acl((USER_OBJ, 6, ANY), (USER, 0, 12345), (GROUP_OBJ, 4, ANY), (MASK, 4, ANY),
                        (OTHER, 4, ANY)))  # fmt: skip
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs here ({exc})")
    st = os.lstat(path)
    got = acl_stat(path, st)
    assert got.st_mode == 0o100600
    assert (got.st_ino, got.st_size, got.st_mtime_ns, got.st_ctime_ns, got.st_uid) == (
        st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid)  # fmt: skip


# -- PAX headers that tarfile's regular expressions take quadratic time over ------------------

PAX_CHILD = """
import sys, tarfile, time
sys.path.insert(0, sys.argv[1])
from tests.conftest import load_tool
from vfs.c4gh.tarindex import BytesSource, build_index
corpus = load_tool("make_c4gh_corpus")
record = sys.argv[2].encode() * int(sys.argv[3])
pax = corpus.raw_header(b"././@PaxHeader", len(record), tarfile.XHDTYPE)
tar = corpus.raw_tar([pax + corpus._padded(record), ("a.txt", b"a\\n"), ("b.txt", b"b\\n")])
start = time.monotonic()
index = build_index(BytesSource(tar), "hostile.tar.c4gh")
print(round(time.monotonic() - start, 3), [m.name for m in index.members], index.problems)
"""


@pytest.mark.parametrize("record", ["1", "9 hdrcharset=x"], ids=["digits", "no-newline"])
def test_a_pax_header_of_digits_is_walked_in_linear_time(record: str) -> None:
    """A PAX header of 1 MiB of digits (or of `9 hdrcharset=x` repeated, with no newline):
    Python 3.11.7's tarfile searches it for `\\d+ hdrcharset=…\\n` by a regular expression that
    backtracks over every run (CVE-2024-6232), ~3 s for 32 KiB and, holding the GIL all along,
    about an hour for the 1 MiB a walk accepts: the daemon's event loop stood still for every
    user. Now such a header stops the walk at once (the members before it are kept)."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    count = (1 << 20) // len(record)
    try:
        done = subprocess.run([sys.executable, "-c", PAX_CHILD, root, record, str(count)],
                              capture_output=True, text=True, timeout=10)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("indexing a TAR with a 1 MiB PAX header of digits took over 10 s")
    assert done.returncode == 0, done.stderr
    took, rest = done.stdout.split(" ", 1)
    assert float(took) < 1.0
    assert "PAX" in rest, rest
