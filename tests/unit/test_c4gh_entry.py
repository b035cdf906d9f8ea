"""The shared entry tree on hostile shapes: deep chains without recursion, the description
version, and the permission bits a member is presented with."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from vfs.backends.base import (
    DEFAULT_MODE_MASK,
    DESCRIPTION_VERSION,
    Description,
    Entry,
    mode_mask_of,
    presented_mode,
)
from vfs.mount.index import DescriptionIndex

DEPTH = 10_000  # ten times Python's default recursion limit


def chain(depth: int, leaf_size: int = 7) -> Entry:
    """A folder chain d/d/…/leaf, built bottom-up without recursion."""
    node = Entry(size=leaf_size, sha256="ab" * 32, xattrs={"user.x": "1"}, locator={"offset": 9})
    name = "leaf"
    for level in range(depth):
        node = Entry(is_dir=True, children={name: node}, locator={"level": level})
        name = "d"
    return node


def test_a_10000_deep_chain_round_trips_without_recursion() -> None:
    tree = chain(DEPTH)
    doc = tree.to_json()
    back = Entry.from_json(doc)
    assert back == tree
    assert back.walk("d/" * (DEPTH - 1) + "leaf") == Entry(
        size=7, sha256="ab" * 32, xattrs={"user.x": "1"}, locator={"offset": 9}
    )
    node, levels = doc, 0
    while "c" in node:  # the document is the nested shape the index has always stored
        (node,) = node["c"].values()
        levels += 1
    assert levels == DEPTH and node == {
        "d": False, "s": 7, "h": "ab" * 32, "x": {"user.x": "1"}, "l": {"offset": 9}
    }  # fmt: skip
    assert back != chain(DEPTH, leaf_size=8)  # a difference 10,000 levels down is seen
    assert "Entry(folder of 1" in repr(back) and len(repr(back)) < 100


def test_to_json_keeps_the_order_of_children() -> None:
    root = Entry(is_dir=True, children={n: Entry(size=i) for i, n in enumerate("zyxabc")})
    root.children["m"] = Entry(is_dir=True, children={"q": Entry(), "p": Entry()})
    doc = root.to_json()
    assert list(doc["c"]) == ["z", "y", "x", "a", "b", "c", "m"]
    assert list(doc["c"]["m"]["c"]) == ["q", "p"]
    assert list(Entry.from_json(json.loads(json.dumps(doc))).children["m"].children) == ["q", "p"]


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"d": True},
        {"d": True, "s": 0, "c": []},
        {"d": True, "s": 0, "c": {"a": "not an entry"}},
        {"d": True, "s": 0, "c": {"a": {"d": False, "s": "x"}}},
    ],
)
def test_malformed_documents_raise_what_the_index_catches(doc: object) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        Entry.from_json(doc)  # type: ignore[arg-type]


def test_descriptions_of_another_version_are_rebuilt(tmp_path: Path) -> None:
    """A description stored under older naming rules (a NUL-cut name, say) is a miss."""
    desc = Description("p.tar.c4gh", Entry(is_dir=True, children={"cut": Entry(size=1)}))
    assert desc.to_json()["v"] == DESCRIPTION_VERSION
    assert Description.from_json(json.loads(json.dumps(desc.to_json()))) == desc
    old = {k: v for k, v in desc.to_json().items() if k != "v"}
    with pytest.raises(ValueError, match="version"):
        Description.from_json(old)
    # Stop 46: a package not starting with manifest.json is no longer served, so what version 2
    # stored of one (its members, unchecked) must not be served from an index either.
    assert DESCRIPTION_VERSION >= 3
    with pytest.raises(ValueError, match="version 2"):
        Description.from_json({**desc.to_json(), "v": 2})
    index = DescriptionIndex(tmp_path / "index.sqlite")
    path = tmp_path / "p.tar.c4gh"
    index.put(path, "c4gh", 10, 20, desc, 30, 40)
    assert index.get(path, "c4gh", 10, 20, 30, 40) == desc
    with sqlite3.connect(index.path) as db:  # what an older daemon left behind
        db.execute("UPDATE descriptions SET doc=?", (json.dumps(old),))
    assert index.get(path, "c4gh", 10, 20, 30, 40) is None
    index.close()


FILE, DIR = stat.S_IFREG, stat.S_IFDIR


@pytest.mark.parametrize(
    ("archive", "mask", "is_dir", "expected"),
    [
        (FILE | 0o644, 0o440, False, 0o440),  # c4gh default: nothing for "other"
        (FILE | 0o644, 0o440, True, 0o550),
        (FILE | 0o600, 0o440, False, 0o400),  # never more than the package file itself
        (FILE | 0o600, 0o440, True, 0o500),
        (FILE | 0o644, 0o444, False, 0o444),  # --c4gh-mode 0444: the operator says so
        (FILE | 0o644, 0o555, False, 0o444),  # decant: the archive's mode minus write bits
        (FILE | 0o755, 0o555, False, 0o555),  # an archived script stays executable
        (FILE | 0o644, 0o555, True, 0o555),
        (FILE | 0o4777, 0o555, False, 0o555),  # setuid, write: never
        (FILE | 0o640, 0o777, True, 0o550),  # a folder gets x exactly where it has r
        (FILE | 0o711, 0o555, True, 0o500),
        (DIR | 0o755, 0o555, False, 0o444),  # a folder archive's x is search, not execute
        (DIR | 0o755, 0o555, True, 0o555),
        (DIR | 0o750, 0o440, False, 0o440),
    ],
)
def test_presented_mode(archive: int, mask: int, is_dir: bool, expected: int) -> None:
    assert oct(presented_mode(archive, mask, is_dir)) == oct(expected)


def test_mode_mask_is_optional() -> None:
    class Plain:
        name = "plain"

    class Masked:
        name = "masked"
        mode_mask = 0o440

    assert mode_mask_of(Plain()) == DEFAULT_MODE_MASK == 0o555
    assert mode_mask_of(Masked()) == 0o440
    assert presented_mode(os.stat(__file__).st_mode, mode_mask_of(Plain()), False) & 0o222 == 0
