"""Multipart uploads a killed daemon left in the bucket: found by key, and aborted.

A file larger than one PUT takes goes up in parts (vfs.stores.upload). A daemon killed midway
neither completes nor aborts its upload, and the store keeps every part it took, billed and
listed by nothing but `?uploads`, until a lifecycle rule of the bucket (if it has one) drops
them (red team 60, F6). The write side notes each key in its journal before its upload starts
(BucketTree's pending entries); at the next start the uploads of those keys begun before that
start are aborted here. Another host's upload of the same key begun before is aborted too:
hosts writing into one bucket keep to their own prefixes (README, "Many hosts, one bucket").

An upload can also complete after its file was removed: an `rm` of a file during its upload,
the daemon killed before it withdrew the object, left the object in the bucket for good (red
team 60, F1). Each upload of the write side carries a random token as user metadata
(`x-amz-meta-decant-upload`); the `rm` notes the key and that token in the journal, and the
next start deletes the object at the key only if it carries that token: never another host's
object put there since.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import logging
import os
import secrets
import socket
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vfs.errors import DecantError
from vfs.stores.s3list import Plain, _fetch, _quote, _text

log = logging.getLogger(__name__)

MAX_KEYS = 1000  # keys looked at per start: the journal's pending entries, normally a few


def uploads_of(p: Plain, key: str) -> list[tuple[str, float]]:
    """(upload id, initiated as a Unix time) of the multipart uploads in progress of exactly
    `key` (a full key), from the first page of ListMultipartUploads (up to 1,000)."""
    url = urllib.parse.urlsplit(p.endpoint)
    query = {"uploads": "", "prefix": key, "encoding-type": "url"}
    root = ET.fromstring(_fetch(p, url, "/" + _quote(p.bucket), query))
    encoded = _text(root, "EncodingType") == "url"
    found = []
    for upload in root.findall("{*}Upload"):
        name = _text(upload, "Key")
        if (urllib.parse.unquote_plus(name) if encoded else name) != key:
            continue  # a longer key under it
        when = dt.datetime.fromisoformat(_text(upload, "Initiated").replace("Z", "+00:00"))
        found.append((_text(upload, "UploadId"), when.timestamp()))
    return found


def abort(p: Plain, key: str, upload_id: str) -> None:
    url = urllib.parse.urlsplit(p.endpoint)
    path = "/" + _quote(p.bucket) + "/" + "/".join(_quote(part) for part in key.split("/"))
    _fetch(p, url, path, {"uploadId": upload_id}, method="DELETE")


def abort_left_behind(p: Plain, keys: Iterable[str], before: float, within: float) -> int:
    """Abort the uploads of these full keys begun before `before` (a Unix time), looking for
    at most `within` seconds; the number aborted. A key that cannot be listed or an upload that
    cannot be aborted is logged and left (a lifecycle rule, or the next start, takes it)."""
    if not (p.access_key and p.secret_key):
        log.info("uploads left by an earlier run are not looked for: no static credentials")
        return 0
    aborted = 0
    deadline = time.monotonic() + within
    # Each request tried once, within what is left of `within` (a request's body may take 3x
    # its timeout): the deadline was looked at between keys only, and a store listing 1,000
    # uploads of one key and answering each DELETE slowly held the start for good (red team
    # 62, F3).
    quick = dataclasses.replace(p, retries=0, timeout=max(0.5, min(p.timeout, within / 3)))
    for n, key in enumerate(keys):
        if n == MAX_KEYS or time.monotonic() > deadline:
            log.warning("uploads left by an earlier run: %d keys looked at, the others not "
                        "(at most %d keys, %g s at start)", n, MAX_KEYS, within)  # fmt: skip
            break
        try:
            for upload_id, initiated in uploads_of(quick, key):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not all aborted within {within:g} s")
                if initiated < before:
                    abort(quick, key, upload_id)
                    aborted += 1
                    log.info("s3://%s/%s: aborted the multipart upload an earlier run left "
                             "(begun %s)", p.bucket, key,
                             dt.datetime.fromtimestamp(initiated, dt.UTC).isoformat())  # fmt: skip
        except (OSError, ValueError, ET.ParseError) as exc:
            log.warning("s3://%s/%s: uploads an earlier run left not aborted: %s", p.bucket, key,
                        exc)  # fmt: skip
    return aborted


UPLOAD_TOKEN = "decant-upload"  # the user metadata naming one upload of the write side
SECRET_BYTES = 32


class UploadTokens:
    """The tokens one host's uploads carry: a random nonce (each upload its own, so a token
    noted for an upload withdrawn never names a later one at the key) and an HMAC of the key
    and nonce under the host's secret, kept in its spool. Only an object carrying a token this
    host signed for its key is its upload: the same bytes put there by another host or anyone
    else are not (an ETag is their MD5; taken for the host's own upload, the spooled copy was
    deleted and the other's owner then deleted the object, the only copy gone: red team 86)."""

    def __init__(self, secret: bytes, host: str = "") -> None:
        self._secret = secret
        # The host's name is signed too: a spool copied to another host (a cloned image) holds
        # the same secret, and each host took the other's uploads for its own, so one's user
        # could delete the other's only copy (red team 92, F4). A host renamed no longer
        # knows its earlier uploads: a file whose upload a kill cut short stays spooled.
        self._host = host

    @classmethod
    def kept_in(cls, path: Path) -> UploadTokens:
        """The secret at `path` (the daemon's alone: its spool is 0700), made at first use.
        One there of another length is refused, not replaced: made anew, every upload of this
        host's a kill cut short would be taken for another host's (red team 92, F5)."""
        host = socket.gethostname()
        try:
            secret = path.read_bytes()
        except FileNotFoundError:
            secret = b""
        else:
            if len(secret) != SECRET_BYTES:
                raise DecantError(
                    f"{path}: {len(secret)} bytes, not the {SECRET_BYTES} of this host's upload "
                    "secret (damaged?); remove it to have a new one made: uploads a kill cut "
                    "short are then taken for another host's, and their files stay spooled"
                )
            return cls(secret, host)
        if not secret:
            secret = secrets.token_bytes(SECRET_BYTES)
            tmp = path.with_name(path.name + ".new")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secret)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        return cls(secret, host)

    def new(self, key: str) -> str:
        nonce = secrets.token_hex(8)
        return f"{nonce}.{self._mac(key, nonce)}"

    def signed(self, key: str, token: str | None) -> bool:
        """Whether `token` (an object's UPLOAD_TOKEN, or None) is one this host made for `key`."""
        nonce, dot, mac = (token or "").partition(".")
        return bool(dot) and hmac.compare_digest(mac, self._mac(key, nonce))

    def _mac(self, key: str, nonce: str) -> str:
        message = f"{self._host}\0{key}\0{nonce}".encode("utf-8", "surrogateescape")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]


def withdraw_left_behind(
    client: Any, full: Callable[[str], str], items: Iterable[tuple[str, str]], within: float
) -> list[str]:
    """Delete the object at each key (`full(key)` its full key) that carries its upload
    token, looking for at most `within` seconds; the keys settled (deleted, or holding no
    object of that upload). A key the store cannot answer for is left for the next start."""
    import obstore

    from vfs.stores.s3 import scrubbed

    settled = []
    deadline = time.monotonic() + within
    for n, (key, token) in enumerate(items):
        if n == MAX_KEYS or time.monotonic() > deadline:
            log.warning("files removed during their upload: %d keys looked at, the others at "
                        "the next start", n)  # fmt: skip
            break
        try:
            try:
                found = obstore.get(client, full(key), options={"head": True})
            except FileNotFoundError:
                settled.append(key)
                continue
            if found.attributes.get(UPLOAD_TOKEN) == token:
                obstore.delete(client, full(key))
                log.info("%s: deleted the upload of a file removed while it was uploaded (the "
                         "daemon stopped before it withdrew it)", full(key))  # fmt: skip
            settled.append(key)
        except Exception as exc:  # obstore's errors: the store down, refused; tried next start
            log.warning("%s: a file removed during its upload: its object not looked at: %s",
                        full(key), scrubbed(exc))  # fmt: skip
    return settled
