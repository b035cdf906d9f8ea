"""The paged listing (vfs/stores/s3list.py), a folder's listing on a bucket: bounded whatever the
store answers (red team 58 F2, F3). A loopback server stands in for a broken or hostile store."""

from __future__ import annotations

import http.server
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.toolbox import loopback_http
from vfs.stores import s3list
from vfs.stores.s3 import S3Folder

Answer = Callable[[str], tuple[int, bytes, float]]  # path -> status, body, seconds a byte


def page(keys: list[str], token: str | None) -> bytes:
    contents = "".join(
        f"<Contents><Key>{k}</Key><Size>1</Size><LastModified>2026-01-01T00:00:00Z"
        "</LastModified><ETag>&quot;e&quot;</ETag></Contents>"
        for k in keys
    )
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>"
    tail = more if token else "<IsTruncated>false</IsTruncated>"
    return f"<ListBucketResult>{contents}{tail}</ListBucketResult>".encode()


@contextmanager
def store(answer: Answer) -> Iterator[tuple[str, list[str]]]:
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            status, body, trickle = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if not trickle:
                    self.wfile.write(body)
                for i in range(len(body)) if trickle else ():
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(trickle)
            except OSError:
                pass  # the client gave up

        def log_message(self, *_args: object) -> None:
            pass

    with loopback_http(Handler) as url:
        yield url, asked


def plain(endpoint: str, timeout: float = 5, retries: int = 0) -> s3list.Plain:
    return s3list.Plain(endpoint, "bkt", "us-east-1", "AKID", "secret", None, timeout, retries)


def test_a_listing_that_never_ends_stops_at_its_limit() -> None:
    """A new token and a page of new keys at each page, for good: obstore's listing gathered
    ~7,100 pages in 20 s (1.28 GB) and went on until the daemon was killed."""
    counter = itertools.count()

    def endless(_path: str) -> tuple[int, bytes, float]:
        n = next(counter)
        return 200, page([f"p/k{n}-{i}" for i in range(1000)], f"t{n}"), 0

    with store(endless) as (endpoint, asked):
        pages = list(s3list.list_pages(plain(endpoint), "p/", "/", limit=5000))
    assert sum(len(p.objects) for p in pages) == 5000 and len(asked) == 5


def test_a_token_given_twice_ends_the_listing_with_an_error() -> None:
    with (
        store(lambda _p: (200, page([], "same"), 0)) as (endpoint, asked),
        pytest.raises(ValueError, match="continuation token it gave before"),
    ):
        list(s3list.list_pages(plain(endpoint), "p/", "/"))
    assert len(asked) == 2


def test_a_page_trickled_a_byte_at_a_time_fails_within_three_timeouts() -> None:
    body = page(["p/a"], None)
    with store(lambda _p: (200, body, 0.05)) as (endpoint, _asked):
        asked_at = time.monotonic()
        with pytest.raises(TimeoutError, match=r"took more than 0\.6 s"):
            list(s3list.list_pages(plain(endpoint, timeout=0.2), "p/", "/"))
    assert time.monotonic() - asked_at < 3  # the whole body would take 9 s


def test_a_5xx_is_tried_again_and_a_4xx_is_not() -> None:
    answers = iter([(503, b"", 0.0), (200, page(["p/a"], None), 0.0)])
    with store(lambda _p: next(answers)) as (endpoint, asked):
        pages = list(s3list.list_pages(plain(endpoint, retries=1), "p/", "/"))
    assert [o[0] for o in pages[0].objects] == ["p/a"] and len(asked) == 2
    with (
        store(lambda _p: (403, b"", 0.0)) as (endpoint, asked),
        pytest.raises(OSError, match="403"),
    ):
        list(s3list.list_pages(plain(endpoint, retries=3), "p/", "/"))
    assert len(asked) == 1


def test_a_bucket_folder_is_listed_a_page_at_a_time_and_cut_past_the_mount_s_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through S3Folder, with static keys: the listing ends one entry past what a mount keeps
    (LEVEL_MAX), not once the store ends it."""
    monkeypatch.setattr("vfs.stores.s3.LEVEL_MAX", 2500)
    counter = itertools.count()

    def endless(_path: str) -> tuple[int, bytes, float]:
        n = next(counter)
        return 200, page([f"pre/k{n:04d}-{i:04d}" for i in range(1000)], f"t{n}"), 0

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    with store(endless) as (endpoint, asked):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        folder = S3Folder("s3://bkt/pre")
        dirs, files = folder.list_dir("")
    assert dirs == [] and len(files) == 3000 and len(asked) == 3
    assert files[0].key == "k0000-0000"


def test_an_answer_that_is_not_http_is_tried_again_then_a_connection_error() -> None:
    """A status line damaged on the way (b"\\x08TTP/1.1 200 OK"): http.client's BadStatusLine
    is no OSError, and it reached the mount as a traceback and an "unexpected error" (EIO) of
    the lookup the listing served."""
    answers = iter([b"\x08TTP/1.1 200 OK\r\n\r\n", None])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            raw = next(answers, b"\x08TTP/1.1 200 OK\r\n\r\n")
            if raw is not None:
                self.wfile.write(raw)
                self.close_connection = True
                return
            body = page(["p/a"], None)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    with loopback_http(Handler) as endpoint:
        pages = list(s3list.list_pages(plain(endpoint, retries=1), "p/", "/"))
        assert [o[0] for o in pages[0].objects] == ["p/a"]
        with pytest.raises(ConnectionError, match="malformed answer"):
            list(s3list.list_pages(plain(endpoint), "p/", "/"))
