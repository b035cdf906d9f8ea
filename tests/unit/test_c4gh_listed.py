"""A package is described only as the version a listing found.

The owner of a folder holding two packages of a served owner, one readable and one private,
can exchange their names (RENAME_EXCHANGE) between the listing's lstat of a name and the
description read at that name. The private package's member names, sizes and digests were
then shown under the readable one's owner and bits. Decant archives had the same gap
(tests/mount/test_redteam40a.py); here the swap is put exactly into that window."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.toolbox import load_tool
from tests.unit.c4gh_helpers import backend, files
from vfs.backends.c4gh import C4ghBackend
from vfs.errors import ArchiveGoneError
from vfs.mount.index import DescriptionIndex
from vfs.mount.tree import SourceTree, index_key

corpus = load_tool("make_c4gh_corpus")

PUBLIC = [("manifest.json", b'{"public": true}'), ("readme.txt", b"shared\n")]
PRIVATE = [("manifest.json", b'{"private": true}'), ("patient-0042.vcf", b"##fileformat\n")]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("c4gh-listed")
    return SimpleNamespace(**{n: corpus.make_keypair(d, n) for n in ("node", "writer")})


def _packages(folder: Path, keys: SimpleNamespace) -> tuple[Path, Path]:
    shown, private = folder / "data.tar.c4gh", folder / "private.tar.c4gh"
    corpus.write_package(shown, PUBLIC, keys.writer, [keys.node])
    corpus.write_package(private, PRIVATE, keys.writer, [keys.node])
    return shown, private


def _swapping(keys: SimpleNamespace, shown: Path, private: Path) -> C4ghBackend:
    """A backend whose first description of `shown` finds `private` at its name: what the
    folder's owner does between the listing's lstat and the read, put there deterministically."""
    swapped: list[bool] = []

    def swap(path: Path) -> None:
        if path == shown and not swapped:
            swapped.append(True)
            os.rename(shown, private.with_name("public.aside"))
            os.rename(private, shown)

    class Swapping(C4ghBackend):
        def describe(self, path: Path):  # type: ignore[no-untyped-def]
            swap(path)
            return super().describe(path)

    listed = getattr(C4ghBackend, "describe_listed", None)  # what the tree calls when there
    if listed is not None:

        def describe_listed(self, path: Path, st: os.stat_result):  # type: ignore[no-untyped-def]
            swap(path)
            return listed(self, path, st)

        Swapping.describe_listed = describe_listed  # type: ignore[attr-defined]

    plain = backend(keys.node)
    return Swapping(plain.secret_keys, plain.cache)


def test_a_package_swapped_in_after_the_listing_lends_no_member_names(
    keys: SimpleNamespace, tmp_path: Path
) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    shown, private = _packages(folder, keys)
    listed = shown.stat()
    be = _swapping(keys, shown, private)
    index = DescriptionIndex(tmp_path / "index" / "descriptions.sqlite")
    tree = SourceTree(folder, [be], index=index)
    node = tree.scan(folder)["data.tar.c4gh"]
    if node.is_dir:
        seen = set(files(tree.tree_of(node)))
        assert "patient-0042.vcf" not in seen, "the private package's members were listed"
    stamp = (listed.st_size, listed.st_mtime_ns, listed.st_ino, listed.st_ctime_ns)
    kept = index.get(shown, index_key(be), *stamp)
    assert kept is None or "patient-0042.vcf" not in files(kept.root)  # nor kept for later
    index.close()
    # What is at the name now is described as what it is, at the next listing.
    node = tree.scan(folder)["data.tar.c4gh"]
    assert node.is_dir and set(files(tree.tree_of(node))) == {n for n, _ in PRIVATE}


def test_describe_listed_refuses_another_file_and_describes_the_listed_one(
    keys: SimpleNamespace, tmp_path: Path
) -> None:
    shown, private = _packages(tmp_path, keys)
    be = backend(keys.node)
    desc = be.describe_listed(shown, shown.stat())
    assert set(files(desc.root)) == {n for n, _ in PUBLIC}
    with pytest.raises(ArchiveGoneError, match="replaced since it was listed"):
        be.describe_listed(shown, private.stat())
    link = tmp_path / "link.tar.c4gh"
    link.symlink_to(private)  # a link's own lstat is never the file it names
    with pytest.raises((ArchiveGoneError, OSError)):
        be.describe_listed(link, link.lstat())
