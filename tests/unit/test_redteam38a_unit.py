"""Red team, round 38a: pure checks (POSIX ACLs as mode bits, ...)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.toolbox import ACL_ANY as ANY
from tests.toolbox import acl
from vfs.acl import GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, acl_stat, narrowed_mode


def test_a_minimal_acl_changes_nothing() -> None:
    raw = acl((USER_OBJ, 6, ANY), (GROUP_OBJ, 4, ANY), (OTHER, 4, ANY))
    assert narrowed_mode(0o100644, raw) == 0o100644


@pytest.mark.parametrize("tag", [USER, GROUP])
def test_a_named_entry_denied_narrows_group_and_other(tag: int) -> None:
    """A named user may be in the owning group, and then only its own entry applies; a member
    of a named group and the owning group gets what either grants (round 38f: the group's
    r was cut too, and a project group lost its write through a writable mount)."""
    raw = acl((USER_OBJ, 6, ANY), (tag, 0, 999), (GROUP_OBJ, 4, ANY), (MASK, 4, ANY),
              (OTHER, 4, ANY))  # fmt: skip
    assert narrowed_mode(0o100644, raw) == (0o100600 if tag == USER else 0o100640)


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


# -- GNU sparse maps, which tarfile reads and parses past the walk's bounds -------------------


def _pax(records: dict[str, object]) -> bytes:
    import tarfile

    from tests.conftest import load_tool

    corpus = load_tool("make_c4gh_corpus")
    body = b""
    for key, value in records.items():
        rec = f" {key}={value}\n".encode()
        length = len(rec) + len(str(len(rec) + 2))
        body += str(length).encode() + rec
    head = corpus.raw_header(b"././@PaxHeader", len(body), tarfile.XHDTYPE)
    return bytes(head + corpus._padded(body))


def _old_sparse(extension_blocks: int) -> bytes:
    """A GNU sparse ('S') header saying an extension block follows, then that many of them,
    each saying another follows (the last one too: the chain runs into the end marker)."""
    import tarfile

    from tests.conftest import load_tool

    head = bytearray(load_tool("make_c4gh_corpus").raw_header(b"s", 0, tarfile.GNUTYPE_SPARSE))
    head[482] = 1  # isextended
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    ext = bytearray(512)
    for i in range(21):
        ext[i * 24 : i * 24 + 24] = b"%011o\0" % 1 + b"%011o\0" % 1
    ext[504] = 1
    return bytes(head) + bytes(ext) * extension_blocks


SPARSE_CASES = {  # the TAR, given the corpus tool
    "pax-1.0-map-not-a-number": lambda c: c.raw_tar([
        ("a.txt", b"a"),
        _pax({"GNU.sparse.major": 1, "GNU.sparse.minor": 0}) + c.raw_member(b"s", b"garbage\n"),
    ]),
    "pax-1.0-map-cut-short": lambda c: c.raw_tar([
        ("a.txt", b"a"),
        _pax({"GNU.sparse.major": 1, "GNU.sparse.minor": 0}) + c.raw_member(b"s", b"5\n1\n"),
    ]),
    "pax-0.1-map-of-words": lambda c: c.raw_tar([
        ("a.txt", b"a"),
        _pax({"GNU.sparse.map": "1,x"}) + c.raw_member(b"s", b"d"),
    ]),
    # the package ends where the extension block should be
    "old-sparse-extension-missing": lambda c: c.raw_tar([("a.txt", b"a")])[:1024] + _old_sparse(0),
}  # fmt: skip


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_a_malformed_sparse_map_stops_the_walk_with_a_reason(case: str) -> None:
    """tarfile raised ValueError or IndexError out of these (not a HeaderError): past
    build_index and the backend, and the daemon logged a traceback for the package."""
    from tests.conftest import load_tool
    from vfs.c4gh.tarindex import BytesSource, build_index

    corpus = load_tool("make_c4gh_corpus")
    index = build_index(BytesSource(SPARSE_CASES[case](corpus)), "x.tar.c4gh")
    assert [m.name for m in index.members] == ["a.txt"]
    problem = index.problems[0]
    assert problem.startswith("x.tar.c4gh: invalid TAR header at 1024 (")
    assert problem.endswith("members after it not listed")


@pytest.mark.parametrize("style", ["pax-1.0", "old"])
def test_a_huge_sparse_map_costs_the_walk_a_bounded_read(style: str) -> None:
    """A sparse map of 8 MiB (a number a line, or 16,000 extension blocks): tarfile read it all,
    a Python int (or tuple) kept per number, ~6 bytes of memory per byte of the package, until
    the package ended. Now it reads at most MAX_SPARSE_READ past the header."""
    import tracemalloc

    from tests.conftest import load_tool
    from vfs.c4gh.tarindex import BytesSource, build_index

    bound = 64 << 10  # MAX_SPARSE_READ

    corpus = load_tool("make_c4gh_corpus")
    if style == "old":
        hostile = _old_sparse(8 << 11)
    else:
        data = b"99999999\n" + b"1\n" * (4 << 20)
        hostile = _pax({"GNU.sparse.major": 1, "GNU.sparse.minor": 0}) + corpus.raw_member(
            b"s", data
        )
    tar = corpus.raw_tar([("a.txt", b"a"), hostile])
    tracemalloc.start()
    try:
        index = build_index(BytesSource(tar), "x.tar.c4gh")
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * bound + (1 << 20), f"the walk peaked at {peak >> 20} MiB"
    assert [m.name for m in index.members] == ["a.txt"]
    assert "reads more than 65536 bytes past its block" in index.problems[0]


@pytest.mark.parametrize("mtime", ["1e400", "-1e400", "nan"])
def test_a_member_whose_pax_mtime_is_no_finite_number_is_dropped_with_a_reason(mtime: str) -> None:
    """tarfile keeps a PAX mtime as a float: int() of it raised OverflowError (ValueError for
    nan) out of build_index, a traceback in the daemon's log and the package shown raw."""
    from tests.conftest import load_tool
    from vfs.c4gh.tarindex import BytesSource, build_index

    corpus = load_tool("make_c4gh_corpus")
    hostile = _pax({"mtime": mtime}) + corpus.raw_member(b"b.txt", b"b")
    tar = corpus.raw_tar([("a.txt", b"a"), hostile, ("c.txt", b"c")])
    index = build_index(BytesSource(tar), "x.tar.c4gh")
    assert [m.name for m in index.members] == ["a.txt", "c.txt"]
    assert index.dropped == [("b.txt", f"mtime {float(mtime)} is not a finite number")]


def test_the_owning_group_s_own_entry_under_the_mask_is_honoured() -> None:
    """group::--- with a named user's rwx (mask rwx): `ls -l` shows the group bits as the mask
    (rwx), yet the kernel denies the owning group; the first version of narrowed_mode kept the
    mask's bits for the group class (looser than SRC)."""
    raw = acl((USER_OBJ, 6, ANY), (USER, 6, 999), (GROUP_OBJ, 0, ANY), (MASK, 6, ANY),
              (OTHER, 4, ANY))  # fmt: skip
    assert narrowed_mode(0o100664, raw) == 0o100604


def test_a_mask_without_named_entries_still_leaves_the_group_its_own_entry() -> None:
    """`setfacl -m m::rwx,g::---`: no named entry, but the group bits shown are the mask's."""
    raw = acl((USER_OBJ, 6, ANY), (GROUP_OBJ, 0, ANY), (MASK, 6, ANY), (OTHER, 4, ANY))
    assert narrowed_mode(0o100664, raw) == 0o100604
