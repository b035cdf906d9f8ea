"""A collection's references are looked at only where its author (collection.json's owner) may
read them in SRC (red team, round 43): a user's collection pointing into root's 0700 folder
showed its files' sizes in the view, and whether a name exists there."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.unit.acqstore_fixtures import edit_json
from vfs.acqstore.validate import validate_collection

COLLECTION = "acqstore/collection.json"
NOBODY = 65534


def _point_table_at(root: Path, rel: str) -> None:
    edit_json(root, COLLECTION, lambda d: d["resources"]["tables"][0].update(path=rel))


@pytest.fixture()
def authored(root: Path) -> Path:
    """The corpus collection, its folders and files the user NOBODY's (readable by all), with
    root's `private/` (0700) holding a copy of its first table."""
    for path in [root, *root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o755 if path.is_dir() else 0o644)
    private = root / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    return root


def _table(root: Path) -> Path:
    doc = json.loads((root / COLLECTION).read_text())
    return root / doc["resources"]["tables"][0]["path"]


def test_a_reference_into_a_folder_the_author_may_not_search_is_missing(authored: Path) -> None:
    shutil.copy(_table(authored), authored / "private" / "secret.csv")
    _point_table_at(authored, "private/secret.csv")
    present = [i.message for i in validate_collection(authored).errors]
    _point_table_at(authored, "private/no_such_file.csv")
    absent = [i.message for i in validate_collection(authored).errors]
    assert len(present) == len(absent) == 1
    # One message either way: what the view shows (none) tells nothing of which it was.
    assert present[0].replace("secret", "X") == absent[0].replace("no_such_file", "X")
    assert "may not read it there" in present[0]


def test_the_same_reference_the_author_may_read_is_kept(authored: Path) -> None:
    shutil.copy(_table(authored), authored / "private" / "secret.csv")
    (authored / "private").chmod(0o755)
    _point_table_at(authored, "private/secret.csv")
    assert validate_collection(authored).ok
    (authored / "private" / "secret.csv").chmod(0o600)  # root's, and only root's to read
    assert not validate_collection(authored).ok


def test_root_s_collection_may_point_anywhere_below_it(authored: Path) -> None:
    shutil.copy(_table(authored), authored / "private" / "secret.csv")
    _point_table_at(authored, "private/secret.csv")
    os.chown(authored / COLLECTION, 0, 0)  # root wrote it: root may read what it points at
    assert validate_collection(authored).ok


def test_a_folder_swapped_after_the_check_is_not_looked_at(
    authored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The author swaps a folder of theirs (`mine/`, holding the table the collection names)
    with root's private one by rename, over and over, while listing: a swap landing between
    the check and the look showed root's file's size in the view (red team, round 43). What
    is looked at must be the file checked: here the swap is put into that window."""
    from vfs.acqstore import validate

    mine = authored / "mine"
    mine.mkdir()
    shutil.copy(_table(authored), mine / "secret.csv")
    for path in (mine, mine / "secret.csv"):
        os.chown(path, NOBODY, NOBODY)
    (authored / "private" / "secret.csv").write_bytes(b"patient,diagnosis\n" * 500)  # root's
    _point_table_at(authored, "mine/secret.csv")
    assert validate_collection(authored).ok  # the author's own file: counted

    name = "readable_below" if hasattr(validate, "readable_below") else "may_read_below"
    check = getattr(validate, name)

    def check_then_swap(root: Path, target: Path, *args: object) -> object:
        found = check(root, target, *args)
        if target.parent.name == "mine":
            os.rename(authored / "mine", authored / "swap")
            os.rename(authored / "private", authored / "mine")
            os.rename(authored / "swap", authored / "private")
        return found

    monkeypatch.setattr(validate, name, check_then_swap)
    result = validate_collection(authored)
    assert not result.ok and "may not read it there" in result.errors[0].message


@pytest.mark.parametrize("doc", [".zattrs", "0/.zarray"])
def test_an_image_whose_metadata_the_author_may_not_read_is_missing(
    authored: Path, doc: str
) -> None:
    """Root's image folder (0755) with a 0600 `.zarray` named by a user's collection: its
    TIFF's size (the image's shape and dtype) showed in the view."""
    assert validate_collection(authored).ok
    private = authored / "images" / "stack.zarr" / doc
    os.chown(private, 0, 0)
    private.chmod(0o600)
    result = validate_collection(authored)
    assert not result.ok and "the metadata of image" in result.errors[0].message
