"""The fallback S3 listing (vfs/stores/s3list.py) never follows a redirect with its credentials."""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.toolbox import loopback_http
from vfs.stores import s3list


@contextmanager
def server(reply: int, location: str = "") -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A loopback HTTP server answering every GET with `reply`; yields its URL and the
    headers of each request it got."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            self.send_response(reply)
            if location:
                self.send_header("Location", location + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    with loopback_http(Handler) as url:
        yield url, seen


def test_a_redirected_listing_is_an_error_and_the_other_host_gets_no_credentials() -> None:
    """urllib follows a 307 with the headers it was given: the signed Authorization and the
    session token went to whatever host the endpoint (or anyone between) named."""
    with server(200) as (elsewhere, stolen), server(307, elsewhere) as (endpoint, asked):
        plain = s3list.Plain(endpoint, "bucket", "us-east-1", "AKIDEXAMPLE", "secret",
                             "session-token", timeout=5)  # fmt: skip
        with pytest.raises(OSError, match="307"):
            list(s3list.list_pages(plain, "p/", "/"))
    assert len(asked) == 1 and "Authorization" in asked[0]  # the endpoint was asked, signed
    assert stolen == []
