"""vfs.names: which names from untrusted data may be presented, and why the others may not.

Expectations come from what Linux accepts as a file name (one component of at most 255 bytes
without "/" or NUL, not "." or "..") and from os.fsencode/os.fsdecode, never from the code.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.names import MAX_DEPTH, NAME_MAX, name_problem, path_problem

# Every code point, lone surrogates included (hypothesis leaves category Cs out by default).
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
# What os.listdir or tarfile hands over for arbitrary bytes: surrogate-escaped where undecodable.
from_bytes = st.binary(max_size=300).map(os.fsdecode)


@settings(max_examples=500, deadline=None)
@given(name=st.one_of(any_text, from_bytes))
def test_a_name_that_passes_is_one_linux_file_name(name: str) -> None:
    if name_problem(name) is None:
        raw = os.fsencode(name)
        assert os.fsdecode(raw) == name  # lookup decodes the kernel's bytes to the same key
        assert 0 < len(raw) <= NAME_MAX
        assert b"/" not in raw and b"\0" not in raw
        assert raw not in (b".", b"..")


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(min_size=1, max_size=NAME_MAX))
def test_every_name_linux_accepts_passes(raw: bytes) -> None:
    """The check refuses nothing a real folder could hold (so nothing real is ever hidden)."""
    if b"/" in raw or b"\0" in raw or raw in (b".", b".."):
        assert name_problem(os.fsdecode(raw)) is not None
    else:
        assert name_problem(os.fsdecode(raw)) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "empty name"),
        (".", "'.' names the folder itself"),
        ("..", "'..' would escape to the parent folder"),
        ("a/b", "contains '/'"),
        ("cut\0evil", "contains a NUL byte"),
        ("x" * 256, "longer than 255 bytes (256)"),
        ("é" * 128, "longer than 255 bytes (256)"),  # 128 characters, 256 bytes
        ("\ud800", "not encodable"),  # a lone high surrogate: no bytes stand for it
        ("\udcc3\udca9", "decode to a different name"),  # b"\xc3\xa9" reads back as "é"
    ],
)
def test_refused_names(name: str, why: str) -> None:
    assert why in (name_problem(name) or "")


@pytest.mark.parametrize(
    "name",
    ["manifest.json", "x" * 255, "é" * 127, "...", "a..b", " ", "caf\udce9", "line\nbreak"],
)
def test_accepted_names(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "empty name"),
        ("/etc/passwd", "absolute path"),
        ("a//b", "component 2: empty name"),
        ("a/../b", "component 2: '..'"),
        ("a/" + "x" * 256, "component 2: longer than 255 bytes"),
        ("a/b\0c", "component 2: contains a NUL byte"),
        ("x" * 256, "longer than 255 bytes"),  # one component: no number
        ("d/" * MAX_DEPTH + "leaf", f"{MAX_DEPTH + 1} levels deep (more than {MAX_DEPTH})"),
        ("a/b/c", "3 levels deep (more than 2)"),
    ],
)
def test_refused_paths(path: str, why: str) -> None:
    limit = 2 if path == "a/b/c" else MAX_DEPTH
    assert why in (path_problem(path, limit) or "")


def test_accepted_paths() -> None:
    assert MAX_DEPTH == 64
    for path in ("manifest.json", "headers/a.vcf", "d/" * (MAX_DEPTH - 1) + "leaf"):
        assert path_problem(path) is None


def test_depth_is_judged_before_the_path_is_split() -> None:
    """A megabyte of slashes is refused by counting, and says how deep it was."""
    assert path_problem("d/" * 500_000 + "leaf") == "500001 levels deep (more than 64)"
