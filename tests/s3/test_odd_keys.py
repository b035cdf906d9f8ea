"""Keys obstore will not parse (a newline, an empty segment): the listing falls back to a plain
signed ListObjectsV2 (vfs/stores/s3list.py) that leaves them out and shows the rest."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.toolbox import load_tool
from vfs.stores import s3list
from vfs.stores.base import key_problem
from vfs.stores.s3 import S3Folder, S3Options, _plain

seaweed = load_tool("seaweed")

IDENTITIES = {
    "identities": [
        {"name": "anonymous", "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
        {
            "name": "tester",
            "credentials": [{"accessKey": seaweed.ACCESS_KEY, "secretKey": seaweed.SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        },
    ]
}
KEYS = ["p/good.txt", "p/odd\nname.txt", "p/sub/x y+z.txt", "p/sub/odd\nkey.txt"]


def _put(endpoint: str, bucket: str, key: str) -> None:
    url = f"{endpoint}/{bucket}/{urllib.parse.quote(key, safe='/')}"  # unsigned: anonymous
    with urllib.request.urlopen(urllib.request.Request(url, data=key.encode(), method="PUT")):
        pass


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SeaweedFS that checks signatures (a wrong key is refused), holding KEYS."""
    base = tmp_path_factory.mktemp("oddkeys")
    config = base / "s3.json"
    config.write_text(json.dumps(IDENTITIES))
    weed = seaweed.weed_binary()
    assert weed is not None
    server = seaweed.SeaweedServer(base / "weed", weed, extra_args=[f"-s3.config={config}"])
    with pytest.MonkeyPatch.context() as mp:
        server.start()
        try:
            for key, value in server.env().items():
                mp.setenv(key, value)
            name = server.create_bucket()
            for key in KEYS:
                _put(server.endpoint, name, key)
            yield name
        finally:
            server.stop()


def test_odd_keys_are_left_out_and_the_rest_listed(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = S3Folder(f"s3://{bucket}/p")
    with caplog.at_level(logging.WARNING, logger="vfs.stores.s3"):
        assert folder.list_dir("") == (["sub"], folder.list_dir("")[1])
        assert [i.key for i in folder.list_dir("")[1]] == ["good.txt"]
        assert [i.key for i in folder.list_dir("sub")[1]] == ["sub/x y+z.txt"]
        assert [i.key for i in folder.list("")] == ["good.txt", "sub/x y+z.txt"]
        assert [(i.key, i.size) for i in folder.list("sub")] == [("sub/x y+z.txt", 15)]
    said = [r.getMessage() for r in caplog.records]
    for odd in ("p/odd\nname.txt", "p/sub/odd\nkey.txt"):
        assert sum(odd in line for line in said) == 1, said  # once, however often listed
    assert folder.open("sub/x y+z.txt").read(0, 15) == b"p/sub/x y+z.txt"


def test_the_fallback_listing_is_signed(bucket: str) -> None:
    plain = _plain(bucket, S3Options())
    assert plain.access_key == seaweed.ACCESS_KEY
    pages = list(s3list.list_pages(plain, "p/", None))
    assert [k for page in pages for k, *_ in page.objects] == sorted(KEYS)
    wrong = dataclasses.replace(plain, secret_key="not-the-secret")
    with pytest.raises(urllib.error.HTTPError) as refused:  # the server checks what we sign
        list(s3list.list_pages(wrong, "p/", None))
    refused.value.close()
    assert refused.value.code == 403


@pytest.mark.parametrize("key", ["a\nb", "a/\x7f", "a//b", "a/./b", "../a", "a/"])
def test_keys_obstore_refuses_are_named(key: str) -> None:
    assert key_problem(key) is not None


def test_plain_keys_pass() -> None:
    assert key_problem("a b/c+d/é.txt") is None


def test_pages_are_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A store that never ends its listing is cut off, not followed for ever (a new token each
    page; one given twice ends it sooner: tests/unit/test_s3list_bounds.py)."""
    tokens = iter(range(10**6))

    class Reply:
        def __init__(self) -> None:
            token = b"t%d" % next(tokens)
            self.body = (b"<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>"
                         + token + b"</NextContinuationToken></ListBucketResult>")  # fmt: skip

        def __enter__(self) -> Reply:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read1(self, n: int) -> bytes:
            body, self.body = self.body, b""
            return body

    monkeypatch.setattr(s3list, "MAX_PAGES", 5)
    monkeypatch.setattr(s3list._OPENER, "open", lambda *a, **k: Reply())
    plain = s3list.Plain("http://127.0.0.1:1", "b", "r", None, None, None, 1.0)
    with pytest.raises(ValueError, match="more than 5 pages"):
        list(s3list.list_pages(plain, "", None))


def test_a_key_logged_at_start_cannot_forge_a_line(bucket: str, tmp_path: Path) -> None:
    """The bucket's first listing (the credentials check, before the mount) leaves out the keys
    with a newline and logs them. Logging was set up only after that check, so those lines
    went out through logging's last-resort handler, unescaped: a key could write whole log
    lines of its choosing (red team, stop 25). Now they are escaped like every other line."""
    from tests.mount.conftest import HAVE_FUSE, Mount

    if not HAVE_FUSE:
        pytest.skip("needs /dev/fuse and fusermount3")
    m = Mount(f"s3://{bucket}/p", tmp_path / "mnt", tmp_path / "mnt.log", tmp_path / "idx")  # type: ignore[arg-type]
    m.start()
    try:
        assert sorted(os.listdir(m.mnt)) == ["good.txt", "sub"]
    finally:
        m.stop()
    said = m.log_text()
    assert "odd\\x0aname.txt: not shown" in said, said
    assert not [line for line in said.splitlines() if line.startswith("name.txt")], said


def test_a_folder_marker_is_no_file_of_its_own_folder(bucket: str) -> None:
    """A zero-byte `p/mk/` (the AWS console's "Create folder") came back from obstore as the
    object `p/mk` in the listing of `p/mk`, and the mount showed a file `mk/mk` that opened
    with ENOENT (red team 50)."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    _put(endpoint, bucket, "p/mk/")
    _put(endpoint, bucket, "p/mk/in.txt")
    folder = S3Folder(f"s3://{bucket}/p")
    dirs, files = folder.list_dir("mk")
    assert (dirs, [i.key for i in files]) == ([], ["mk/in.txt"])
    assert "mk" in folder.list_dir("")[0]
