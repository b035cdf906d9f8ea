"""Listing a large bucket folder from a warm index (what `ls -l` of 1,000 archives costs): no GET
or HEAD per archive, the index rows read together, and the daemon's start-up LIST reused by
the first readdir; a replaced archive is still described afresh."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import obstore
import pytest

from tests.s3.conftest import S3Bucket
from vfs.backends.decant import DecantBackend
from vfs.backends.objects import BoundBackend
from vfs.cache import PageCache
from vfs.decant.packer import PackResult
from vfs.mount import buckettree
from vfs.mount.buckettree import BucketTree
from vfs.mount.index import DescriptionIndex
from vfs.stores.base import ObjectPath
from vfs.stores.s3 import S3Folder, S3Object

MANY = buckettree.BATCH_FROM + 8


def make_tree(folder: S3Folder, index: DescriptionIndex) -> BucketTree:
    tree: BucketTree

    def key_of(path: Path) -> str:
        return tree.key_of(path)

    bound = BoundBackend(DecantBackend(PageCache(8 << 20)), folder, key_of, (".zarr.zip",))
    tree = BucketTree(folder, ObjectPath.of_url(folder.name), [bound], index, relist=3600)
    return tree


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every GET, HEAD and LIST the S3 folder and byte sources make."""
    seen: list[str] = []
    for cls, name in ((S3Object, "_get"), (S3Folder, "stat"), (S3Folder, "get"),
                      (S3Folder, "list_dir"), (S3Folder, "open")):  # fmt: skip
        real = getattr(cls, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            seen.append(_name)
            return _real(*args)

        monkeypatch.setattr(cls, name, counted)
    return seen


def test_a_warm_index_lists_a_large_folder_without_a_request_per_archive(
    s3_bucket: S3Bucket,
    packed_corpus: dict[str, PackResult],
    tmp_path: Path,
    requests: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sources = itertools.cycle(sorted(packed_corpus.items())[:3])
    folder = S3Folder(s3_bucket.url())
    for i in range(MANY):
        name, result = next(sources)
        obstore.put(folder.client, folder.full_key(f"a{i:03d}-{name}.zarr.zip"),
                    result.archive.read_bytes())  # fmt: skip
    index = DescriptionIndex(tmp_path / "index.sqlite")
    root = ObjectPath.of_url(folder.name)
    first = make_tree(folder, index).scan(root)
    assert len(first) == MANY
    queries: list[str] = []
    real_get_object = DescriptionIndex.get_object
    monkeypatch.setattr(DescriptionIndex, "get_object",
                        lambda *a: queries.append("one") or real_get_object(*a))  # fmt: skip
    requests.clear()
    again_folder = S3Folder(s3_bucket.url())
    again_folder.check()  # the daemon's start-up LIST: taken by the first scan
    again = make_tree(again_folder, index).scan(root)
    assert requests == [] and queries == []
    assert {n: (node.size, node.entry) for n, node in again.items()} == {
        n: (node.size, node.entry) for n, node in first.items()
    }
    # One archive replaced by other bytes: a new ETag and size, so it alone is described
    # afresh (opened: its tail and manifest fetched), the others still from the index.
    victim = sorted(first)[0]
    key = first[victim].real.name
    replacement = packed_corpus["zstack_u16.tif"].archive.read_bytes()
    obstore.put(folder.client, folder.full_key(key), replacement)
    requests.clear()
    third = make_tree(S3Folder(s3_bucket.url()), index).scan(root)
    assert requests.count("open") == 1 and len(third) == MANY
    (node,) = [n for n in third.values() if n.real.name == key]
    assert node.real.info.size == len(replacement)  # type: ignore[attr-defined]
    index.close()
