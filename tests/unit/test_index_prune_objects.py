"""DescriptionIndex.prune_objects: the rows of a bucket folder's objects its listing no longer
holds are forgotten; nothing of another folder (a deeper one, a sibling sharing its prefix)."""

from __future__ import annotations

from pathlib import Path

from vfs.backends.base import Description, Entry
from vfs.mount.index import DescriptionIndex
from vfs.stores.base import ObjectInfo


def test_prune_objects_drops_only_the_folder_s_unlisted_rows(tmp_path: Path) -> None:
    index = DescriptionIndex(tmp_path / "index.sqlite")
    desc = Description("x.tif", Entry(size=1, sha256="0" * 64))
    urls = ["s3://b/pre/a.zarr.zip", "s3://b/pre/b.zarr.zip", "s3://b/pre/c.zarr",
            "s3://b/pre/sub/d.zarr.zip", "s3://b/prefix/e.zarr.zip", "s3://b/pre"]  # fmt: skip
    for url in urls:
        for backend in ("decant@3", "decant@2"):
            index.put_object(url, backend, ObjectInfo(url, 1, 1.0, "e"), desc)
    try:
        assert index.prune_objects("s3://b/pre/", {"s3://b/pre/a.zarr.zip"}) == 2
        kept = {u for u in urls for b in ("decant@3", "decant@2")
                if u in index.objects_in(u.rpartition("/")[0], b)}  # fmt: skip
        assert kept == set(urls) - {"s3://b/pre/b.zarr.zip", "s3://b/pre/c.zarr"}
        assert index.prune_objects("s3://b/pre", {"s3://b/pre/a.zarr.zip"}) == 0
    finally:
        index.close()
