"""The fallback listing's reading of one level (keys obstore refuses), without a server."""

import logging

import pytest

from vfs.stores.s3 import S3Folder
from vfs.stores.s3list import Page


def _folder(prefix: str) -> S3Folder:
    folder = S3Folder.__new__(S3Folder)  # only the names `_plain_level` uses; no connection
    folder.bucket, folder.prefix = "b", prefix
    return folder


@pytest.mark.parametrize("prefix", ["", "P"])
def test_a_doubled_slash_is_no_folder_of_the_level_itself(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # AWS keeps `P//x`: listing `P/` with delimiter "/" gives the common prefix `P//`. Read as
    # the level "P" with every "/" stripped, it showed a phantom folder "P" inside P.
    base = f"{prefix}/" if prefix else ""
    page = Page(
        prefixes=[f"{base}/", f"{base}sub/"],
        objects=[(f"{base}a.tif.zarr.zip", 5, 0.0, '"e"')],
    )
    with caplog.at_level(logging.WARNING):
        dirs, files = _folder(prefix)._plain_level(page)
    assert dirs == ["sub"]
    assert [f.key for f in files] == ["a.tif.zarr.zip"]
    assert "empty, '.' or '..' segment" in caplog.text
