"""A plain signed ListObjectsV2, page by page, bounded: a folder's listing where obstore's is not.

obstore's delimited LIST (`list_with_delimiter`) gathers every page before it returns, with no
bound: a prefix of 300,000 keys cost the daemon 654 MB before the mount could cut it, and a
store whose listing never ends (a continuation token each page, a pagination bug) grew it by
~64 MB a second until it was killed (red team 58). Read here a page at a time, a listing stops
at `limit` entries, at a continuation token the store gave before, and at MAX_PAGES; each page
is read within a deadline and tried again (`retries`) after a dropped connection or a 5xx.

It also lists the keys obstore refuses a whole page for (a control character, an empty, "." or
".." segment: "Encountered object with invalid path"), which anyone who may upload under a
prefix can make: the caller skips those (and logs them) and shows the rest. Credentials are the
static ones of the same variables or profile obstore used; without them (instance metadata, web
identity) the caller lists with obstore.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass

MAX_PAGE_BYTES = 32 << 20  # one page of 1,000 keys is well under 1 MiB
MAX_PAGES = 100_000  # 100 M keys: a store that never ends its listing is cut off
READ_BLOCK = 64 << 10
_EMPTY_SHA = hashlib.sha256(b"").hexdigest()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """An S3 LIST is never redirected to be answered: a 3xx is an error (HTTPError). urllib
    follows one with every header added, the signed `Authorization` and the session token
    included, to whichever host the reply names."""

    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass(frozen=True)
class Plain:
    """Where and as whom to list."""

    endpoint: str  # scheme://host[:port], path-style requests
    bucket: str
    region: str
    access_key: str | None
    secret_key: str | None
    session_token: str | None
    timeout: float
    retries: int = 0  # after the first try of a page: a dropped connection, a timeout, a 5xx


@dataclass(frozen=True)
class Page:
    prefixes: list[str]  # full common prefixes, "/"-terminated
    objects: list[tuple[str, int, float, str]]  # full key, size, mtime, ETag


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def _sign(
    p: Plain, path: str, query: dict[str, str], host: str, method: str = "GET"
) -> dict[str, str]:
    """AWS Signature Version 4 headers for a request without a body."""
    now = dt.datetime.now(dt.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"host": host, "x-amz-content-sha256": _EMPTY_SHA, "x-amz-date": stamp}
    if p.session_token:
        headers["x-amz-security-token"] = p.session_token
    if not (p.access_key and p.secret_key):
        return headers  # an anonymous request: a public bucket, or a test server
    names = sorted(headers)
    canonical = "\n".join([
        method, path, "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items())),
        "".join(f"{n}:{headers[n].strip()}\n" for n in names), ";".join(names), _EMPTY_SHA,
    ])  # fmt: skip
    scope = f"{day}/{p.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])  # fmt: skip
    key = ("AWS4" + p.secret_key).encode()
    for part in (day, p.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={p.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def _text(node: ET.Element, tag: str) -> str:
    found = node.find(f"{{*}}{tag}")
    return (found.text or "") if found is not None else ""


def _parse(body: bytes) -> tuple[Page, str | None]:
    root = ET.fromstring(body)
    encoded = _text(root, "EncodingType") == "url"

    def key(text: str) -> str:
        return urllib.parse.unquote_plus(text) if encoded else text

    prefixes = [key(_text(cp, "Prefix")) for cp in root.findall("{*}CommonPrefixes")]
    objects = []
    for c in root.findall("{*}Contents"):
        when = dt.datetime.fromisoformat(_text(c, "LastModified").replace("Z", "+00:00"))
        objects.append((key(_text(c, "Key")), int(_text(c, "Size") or 0), when.timestamp(),
                        _text(c, "ETag")))  # fmt: skip
    more = (_text(root, "IsTruncated") == "true" and _text(root, "NextContinuationToken")) or None
    return Page(prefixes, objects), more


def list_pages(
    p: Plain, prefix: str, delimiter: str | None, limit: int | None = None
) -> Iterator[Page]:
    """ListObjectsV2 below `prefix`, page by page, ending once `limit` entries (prefixes and
    objects) were given (raises OSError or ValueError on failure)."""
    url = urllib.parse.urlsplit(p.endpoint)
    if url.scheme not in ("http", "https"):
        raise ValueError(f"endpoint {p.endpoint!r} is not http(s)")
    path = "/" + _quote(p.bucket)
    token: str | None = None
    seen: set[str] = set()
    given = 0
    for _ in range(MAX_PAGES):
        query = {"list-type": "2", "encoding-type": "url"}
        if prefix:
            query["prefix"] = prefix
        if delimiter:
            query["delimiter"] = delimiter
        if token:
            query["continuation-token"] = token
        page, token = _parse(_fetch(p, url, path, query))
        yield page
        given += len(page.prefixes) + len(page.objects)
        if token is None or (limit is not None and given >= limit):
            return
        if token in seen:  # its listing would go round for good
            raise ValueError("the store gave a continuation token it gave before")
        seen.add(token)
    raise ValueError(f"a listing of more than {MAX_PAGES} pages")


def _fetch(
    p: Plain,
    url: urllib.parse.SplitResult,
    path: str,
    query: dict[str, str],
    method: str = "GET",
) -> bytes:
    """One page's body, tried `1 + p.retries` times; each within 3 x the timeout, whole."""
    qs = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
    for attempt in range(p.retries + 1):
        req = urllib.request.Request(f"{url.scheme}://{url.netloc}{path}?{qs}", method=method)
        for name, value in _sign(p, path, query, url.netloc, method).items():
            if name != "host":
                req.add_header(name, value)
        try:
            return _read_within(req, p.timeout)
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == p.retries:
                raise
        except (OSError, TimeoutError):
            if attempt == p.retries:
                raise
        except http.client.HTTPException as exc:
            # An answer that is not HTTP (a status line or chunk damaged on the way): a
            # traceback in the log, and the lookup it served failed "unexpectedly", before.
            if attempt == p.retries:
                raise ConnectionError(f"a malformed answer ({type(exc).__name__})") from None
        time.sleep(min(2.0, 0.1 * 2**attempt))
    raise AssertionError("unreachable")


def _read_within(req: urllib.request.Request, timeout: float) -> bytes:
    """The reply's body, at most MAX_PAGE_BYTES, all of it within 3 x `timeout`: the socket's
    timeout bounds each read only, and a body trickled a byte at a time never ended."""
    deadline = time.monotonic() + 3 * timeout
    parts: list[bytes] = []
    size = 0
    with _OPENER.open(req, timeout=timeout) as reply:
        while block := reply.read1(READ_BLOCK):
            size += len(block)
            if size > MAX_PAGE_BYTES:
                raise ValueError(f"a listing page of more than {MAX_PAGE_BYTES} bytes")
            if time.monotonic() > deadline:
                raise TimeoutError(f"a listing page took more than {3 * timeout:g} s")
            parts.append(block)
    return b"".join(parts)
