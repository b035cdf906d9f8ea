"""S3-compatible object storage as byte sources, on obstore (Rust object_store): ranged GETs.

Why obstore: its ranged 4 KiB GET against SeaweedFS measured p50 ~1-2 ms in-process with no event
loop of ours (`tools/bench.py s3` compares s3fs), its sync calls release the GIL so worker threads
overlap GETs, and it retries with back-off and time limits we configure.

Consistency: an object is opened with one HEAD; every later ranged GET carries `If-Match` with that
ETag (and the answer's ETag is compared too, for stores that ignore the header), so a zip central
directory is never paired with the bytes of an object replaced in between: that raises
`ObjectChangedError` instead. Errors become `StoreError` subclasses naming the s3:// URL; messages
never carry credentials (obstore's own text is cut to its first line and scrubbed).
"""

from __future__ import annotations

import bisect
import configparser
import contextlib
import logging
import os
import re
import threading
import time
import urllib.error
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import obstore
from obstore.exceptions import (
    BaseError,
    InvalidPathError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from vfs.errors import (
    DecantError,
    ObjectChangedError,
    ObjectMissingError,
    StoreAccessError,
    StoreError,
)
from vfs.owned import Untrusted, read_trusted
from vfs.stores.base import LEVEL_MAX, ObjectInfo, check_range, join_key, key_problem
from vfs.stores.diskcache import DiskCache
from vfs.stores.ranges import Ranges
from vfs.stores.s3list import Page, Plain, list_pages
from vfs.threads import name_this_thread

log = logging.getLogger(__name__)
Buffer = bytes | memoryview

SCHEME = "s3://"
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
PREFETCH_MAX = 64 << 20  # one prefetched range at most (a chunk is at most this)
READAHEAD_BYTES = 48 << 20  # prefetched bytes held (or in flight) per open object at most
READAHEAD_TOTAL = 192 << 20  # ... and by all objects of one connection together
BUDGET_SHARE = 4  # ... and at most this part of the page cache it counts against
STALE_BEHIND = 4  # a range this part of the budget behind the last read is not coming back
POOL_PREFIX = "s3-get"
GET_SPAN = 16 << 20  # ranges fetched ahead that follow each other: one GET of up to this
SPAN_GAP = 4096  # ... that may skip this many unused bytes between two of them
SMALL_COPY = 64 * 1024  # GETs up to this size come back as bytes (callers slice and join them)
FORGET_AFTER = 2  # ranges read this many read-ahead budgets away from the reader are forgotten
GOT_MAX = 1024  # ... and at most this many runs of them are kept, the farthest going first
FETCHED_OBJECTS = 256  # objects whose fetched ranges FETCHED keeps, to count bytes fetched again
_PROFILE_SECRETS: set[str] = set()  # values read from a profile, scrubbed like the variables
_SIGNED = re.compile(r"(X-Amz-[A-Za-z-]+|Signature|Credential|AWSAccessKeyId)=[^&\s]*")


@dataclass(frozen=True)
class S3Options:
    """How to reach the store. Unset fields come from the usual AWS_* environment variables
    (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), read by obstore."""

    endpoint: str | None = None
    region: str | None = None
    timeout: float = 10.0  # one request, connect to last byte
    connect_timeout: float = 3.0
    retries: int = 3  # after the first try; 5xx, dropped connections and timeouts
    retry_timeout: float = 20.0  # no new try starts later than this after the first
    concurrency: int = 8  # ranged GETs in flight for one read_many
    profile: str | None = None  # AWS profile when no AWS_ACCESS_KEY_ID is set (else AWS_PROFILE)
    disk_cache: Path | None = None  # keep fetched ranges here (vfs.stores.diskcache)
    disk_cache_size: int = 10 << 30


def is_s3_url(text: str) -> bool:
    return text.startswith(SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """s3://BUCKET/PREFIX → (BUCKET, PREFIX without slashes at either end)."""
    if not is_s3_url(url):
        raise ValueError(f"{url}: not an s3:// URL")
    bucket, _, prefix = url[len(SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"{url}: no bucket")
    return bucket, prefix.strip("/")


def _scrub(text: str) -> str:
    """obstore's message, first line only, with anything credential-like removed."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    for value in [os.environ.get(var) for var in _SECRET_ENV] + sorted(_PROFILE_SECRETS):
        if value and len(value) >= 4:
            line = line.replace(value, "***")
    return _SIGNED.sub(r"\1=***", line)[:300]


def scrubbed(exc: BaseException) -> str:
    """An error as a log line may hold it: ours as is, a store's first line with anything
    credential-like removed (a DELETE refused for a bad signature echoes the access key id)."""
    return str(exc) if isinstance(exc, DecantError) else _scrub(str(exc))


def translate(exc: BaseException, url: str, what: str = "") -> StoreError:
    """An obstore or socket error as the StoreError the cores and the errno boundary know."""
    reason = _scrub(str(exc))
    where = f"{url}: {what}" if what else f"{url}:"
    if isinstance(exc, FileNotFoundError):
        return ObjectMissingError(f"{where} no such key")
    if isinstance(exc, PreconditionError):
        return ObjectChangedError(f"{where} object replaced since it was opened (ETag changed)")
    if "169.254.169.254" in reason:  # obstore fell back to the EC2 instance metadata service
        return StoreAccessError(
            f"{where} no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    if what == "listing:" and "404 Not Found" in reason:
        return ObjectMissingError(f"{where} no such bucket")
    refused = "403 Forbidden" in reason or "401 Unauthorized" in reason  # a listing's plain error
    if refused or isinstance(exc, (PermissionDeniedError, UnauthenticatedError)):
        return StoreAccessError(f"{where} access refused; check the credentials ({reason})")
    return StoreError(f"{where} object store failed after retries ({reason})")


def profile_settings(name: str | None = None) -> dict[str, str]:
    """Credentials, region and endpoint of an AWS profile (`name`, else AWS_PROFILE, else
    "default") from the shared files (AWS_SHARED_CREDENTIALS_FILE / ~/.aws/credentials and
    AWS_CONFIG_FILE / ~/.aws/config), as obstore config keys. Used only when the environment
    holds no AWS_ACCESS_KEY_ID: variables win, as with the AWS CLI. {} when there is none."""
    name = name or os.environ.get("AWS_PROFILE") or "default"
    home = Path(os.path.expanduser("~"))
    files = (
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws/credentials", name),
        (os.environ.get("AWS_CONFIG_FILE") or home / ".aws/config",
         name if name == "default" else f"profile {name}"),
    )  # fmt: skip
    keys = {"aws_access_key_id": "access_key_id", "aws_secret_access_key": "secret_access_key",
            "aws_session_token": "session_token", "region": "region",
            "endpoint_url": "endpoint"}  # fmt: skip
    out: dict[str, str] = {}
    for path, section in files:
        text = _profile_file(Path(path))
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text or "", str(path))
        except configparser.Error:
            continue
        if parser.has_section(section):
            for key, value in parser.items(section):
                if key in keys and value.strip():
                    out.setdefault(keys[key], value.strip())
    if os.environ.get("AWS_ENDPOINT_URL"):
        out.pop("endpoint", None)
    if os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        out.pop("region", None)
    for key in ("secret_access_key", "session_token", "access_key_id"):
        if key in out:
            _PROFILE_SECRETS.add(out[key])
    return out


MAX_PROFILE_FILE = 1 << 20  # bytes read of a shared credentials or config file


def _profile_file(path: Path) -> str | None:
    """The text of an AWS shared credentials or config file (None when there is none to read),
    refused unless it is this user's or root's and no one else may write it: an endpoint put
    there by another user would send this daemon's signed requests, and its archives, their
    way. Opened as the AWS CLI does (a link is followed); the file checked is the file read."""
    try:
        return read_trusted(path, MAX_PROFILE_FILE).decode("utf-8", "replace")
    except Untrusted as why:
        raise StoreAccessError(f"AWS profile file {path} is {why}: refused") from None
    except OSError:
        return None


def _client(bucket: str, options: S3Options) -> S3Store:
    config: dict[str, Any] = {}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        config.update(profile_settings(options.profile))
    endpoint = (options.endpoint or os.environ.get("AWS_ENDPOINT_URL")
                or config.get("endpoint"))  # fmt: skip
    if options.endpoint:
        config["endpoint"] = options.endpoint
    # `obstore.copy(..., overwrite=False)` (a `mv` through a mount) completes a one-part copy
    # with If-None-Match: * (AWS S3, SeaweedFS); plain copies are not changed by it.
    config["copy_if_not_exists"] = "multipart"
    if options.region:
        config["region"] = options.region
    elif not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
              or config.get("region")):  # fmt: skip
        config["region"] = "us-east-1"  # S3-compatible stores rarely care; AWS needs it set
    client: dict[str, Any] = {
        "timeout": timedelta(seconds=options.timeout),
        "connect_timeout": timedelta(seconds=options.connect_timeout),
    }
    if endpoint and endpoint.startswith("http://"):
        client["allow_http"] = True
    retry: dict[str, Any] = {
        "max_retries": options.retries,
        "retry_timeout": timedelta(seconds=options.retry_timeout),
        "backoff": {
            "init_backoff": timedelta(milliseconds=100),
            "max_backoff": timedelta(seconds=2),
            "base": 2,
        },
    }
    try:
        return S3Store(bucket, config=config, client_options=client, retry_config=retry)  # type: ignore[arg-type]
    except BaseError as exc:  # a bad configuration key or value
        reason = _scrub(str(exc))
        raise StoreError(f"{SCHEME}{bucket}: cannot configure the client ({reason})") from None


def _plain(bucket: str, options: S3Options) -> Plain:
    """The settings `_client` gave obstore, for the fallback listing (vfs.stores.s3list)."""
    config = {} if os.environ.get("AWS_ACCESS_KEY_ID") else profile_settings(options.profile)
    env = os.environ.get
    region = (options.region or env("AWS_REGION") or env("AWS_DEFAULT_REGION")
              or config.get("region") or "us-east-1")  # fmt: skip
    endpoint = (options.endpoint or env("AWS_ENDPOINT_URL") or config.get("endpoint")
                or f"https://s3.{region}.amazonaws.com")  # fmt: skip
    return Plain(
        endpoint.rstrip("/"), bucket, region,
        env("AWS_ACCESS_KEY_ID") or config.get("access_key_id"),
        env("AWS_SECRET_ACCESS_KEY") or config.get("secret_access_key"),
        env("AWS_SESSION_TOKEN") or config.get("session_token"),
        options.timeout,
        options.retries,
    )  # fmt: skip


_skipped: set[str] = set()  # odd keys already logged (bounded: a flood of them is not logged)


class Fetched:
    """Ranged GETs of objects' bytes made by this process, and the bytes they fetched: the
    daemon's `.decant-status` shows them, so a benchmark or a test can tell a read that fetched
    an archive once from one that fetched it twice (a digest pass, read-ahead thrown away).
    `refetched` counts the bytes of GETs that this process had fetched before from the same
    object version (of the last FETCHED_OBJECTS objects, each as at most GOT_MAX runs): what a
    GET of them fetched again, whichever reader, handle or verification asked."""

    def __init__(self) -> None:
        self.gets = 0
        self.bytes = 0
        self.refetched = 0
        self._seen: OrderedDict[tuple[str, str], Ranges] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, nbytes: int, name: str = "", etag: str = "", offset: int = -1) -> int:
        """Count one GET of `nbytes` at `offset` of object `name` (version `etag`); returns the
        bytes of it fetched before."""
        with self._lock:
            self.gets += 1
            self.bytes += nbytes
            if offset < 0 or not name:
                return 0
            seen = self._seen.pop((name, etag), None) or Ranges(GOT_MAX)
            self._seen[name, etag] = seen
            while len(self._seen) > FETCHED_OBJECTS:
                self._seen.popitem(last=False)
            again = seen.covered(offset, offset + nbytes)
            seen.add(offset, offset + nbytes)
            self.refetched += again
            return again


FETCHED = Fetched()


def _skip(url: str, problem: str) -> None:
    if url not in _skipped and len(_skipped) < 10_000:
        _skipped.add(url)
        log.warning("%s: not shown: the key %s", url, problem)


def _info(meta: Any, key: str) -> ObjectInfo:
    return ObjectInfo(key, int(meta["size"]), meta["last_modified"].timestamp(), meta["e_tag"])


class S3Object:
    """One object read by ranged GETs pinned to the ETag it had when opened."""

    tail_hint = 256 * 1024  # a zip's end record and central directory in one GET
    readahead_bytes = READAHEAD_BYTES  # the decant store prefetches this far ahead

    def __init__(self, folder: S3Folder, key: str, info: ObjectInfo) -> None:
        self._folder = folder
        self.key = key
        self.name = folder.url_of(key)
        self.info = info
        self.size = info.size
        self._ahead: dict[tuple[int, int], Future[Buffer]] = {}  # spans fetched ahead: GETs
        self._members: dict[tuple[int, int], set[tuple[int, int]]] = {}  # span → ranges not read
        self._spans: list[tuple[int, int]] = []  # the keys of _ahead by offset; never overlapping
        self._got = Ranges(GOT_MAX)  # bytes reads took (or are fetching) near the reader
        self._at: int | None = None  # offset of the last read
        self._lock = threading.Lock()

    @property
    def identity(self) -> tuple[object, ...]:
        return (self.name, self.info.etag, self.size, self.info.mtime)

    def prefetch(self, offset: int, size: int) -> None:
        """Start fetching [offset, offset + size) in the background: `prefetch_run` of one."""
        self.prefetch_run([(offset, size)])

    def prefetch_run(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Start fetching `ranges` in the background (the decant store asks for the chunks
        after the ones the reader decodes): sequential reads keep several GETs in flight (up
        to the connection's `concurrency`). Ranges that follow each other in the object (a
        zip's entries, a chunk's local header and bytes) go out as one GET of up to GET_SPAN
        bytes; each range is still read alone (`read_buffer` slices it out of the span). On
        SeaweedFS, which shares the two cores here, a GET costs the server ~3 ms of CPU
        besides its bytes: 256 MiB cost it 0.23-0.28 s of CPU in 4 MiB GETs (a chunk each),
        0.18-0.21 s in 16 MiB ones, 0.72-0.83 s in 1 MiB ones.

        At most `readahead_bytes` are held (or in flight) per object, READAHEAD_TOTAL per
        connection. Room is made only from spans the reader has left behind or jumped away
        from (`_stale`), never from the ones still ahead of it: those are the next reads, and
        dropping them (as this once did, oldest first) made every chunk a GET of the reader's
        own after its prefetch was thrown away. Past the budget a range is not fetched ahead
        (it is asked again as the reader moves on). Sizes come from the archive: a range over
        PREFETCH_MAX, or outside the object, is never fetched ahead.

        No byte is fetched ahead twice, nor after a read took it: a range that overlaps a span
        held, or what a read took or is fetching itself (`_got`), is left out. The mount's
        read-ahead runs a few chunks behind the decoders at times, and asks for chunks they
        have taken, by their data offsets by then (the first read of an entry takes its local
        header too): a cold `dd` of a 512 MiB original fetched 278-300 MiB of its 270 MiB
        archive in 34-38 GETs (363-392 MiB in 45-47 with the read-ahead thread held back
        80 ms), where 31 GETs of 270.0 MiB is once."""
        with self._lock:
            todo = self._unclaimed(ranges)
            if not todo:
                return
            held = sum(n for _off, n in self._ahead)
            want = sum(n for _off, n in todo)
            for old in self._stale(max(off + n for off, n in todo), ranges):
                if held + want <= self.readahead_bytes:
                    break
                self._drop(old)
                held -= old[1]
            group: list[tuple[int, int]] = []
            conn = self._folder.conn
            # With a disk cache each range is a GET (and a cache entry) of its own: a span's
            # bounds depend on the budget at the time, and its entry would not serve the next
            # reader, whose spans differ.
            alone = conn.disk_cache is not None
            for part in todo:
                room = 0 if alone else min(self.readahead_bytes - held, conn.room())
                if group and _joins(group, part, room) and not self._claimed(_end(group), part[0]):
                    group.append(part)
                    continue
                if group:
                    if not self._submit(group):
                        return
                    held += _span(group)[1]
                if held + part[1] > self.readahead_bytes:
                    return
                group = [part]
            self._submit(group)

    def _unclaimed(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """`ranges` within the limits that no span held, no read and no range before them in
        the list has (lock held), sorted."""
        out: list[tuple[int, int]] = []
        for off, n in sorted(ranges):
            if not (0 < n <= PREFETCH_MAX and off >= 0 and off + n <= self.size):
                continue
            if (out and off < sum(out[-1])) or self._claimed(off, off + n):
                continue
            out.append((off, n))
        return out

    def _claimed(self, start: int, end: int) -> bool:
        """Whether a byte of [start, end) is in a span held or was taken by a read."""
        return self._got.overlaps(start, end) or any(True for _ in self._over(start, end))

    def _over(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The spans held that overlap [start, end) (lock held), in order."""
        spans = self._spans
        i = max(0, bisect.bisect_left(spans, (start + 1,)) - 1)  # the last starting by `start`
        while i < len(spans) and spans[i][0] < end:
            if sum(spans[i]) > start:
                yield spans[i]
            i += 1

    def _submit(self, group: list[tuple[int, int]]) -> bool:
        """One GET for the ranges of `group` (lock held), if the connection has room for it."""
        span = _span(group)
        conn = self._folder.conn
        if span in self._ahead or not conn.hold(span[1]):
            return False
        self._ahead[span] = conn.pool.submit(self._fetch, *span)
        self._members[span] = set(group)
        bisect.insort(self._spans, span)
        return True

    def _stale(self, end: int, wanted: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Prefetched ranges that may make room for one ending at `end` (lock held): first
        those wholly behind the last read by more than STALE_BEHIND of this object's budget
        (two decoders take neighbouring chunks in either order), then those after `end`,
        farthest first (the reader jumped back: what it will read next comes first). Never a
        span holding one of the `wanted` ranges (the read-ahead asking still wants it): `decant
        pack`'s threads store a plane's chunk after the next one's at times (4 after 5), and
        read-ahead asking for chunk 4 once the spans after it filled the budget dropped the
        farthest of them (fetched, or in flight) and fetched its chunks again later: 8.4 MiB
        more in 7 more GETs for a cold `dd` of a 512 MiB original (278.4 MiB of a 269.8 MiB
        archive, in 38 GETs, every time for that archive)."""
        at = self._at
        if at is None:
            return []
        slack = self.readahead_bytes // STALE_BEHIND
        ranks = sorted(wanted)

        def needed(span: tuple[int, int]) -> bool:  # the ranges are disjoint: ends grow too
            i = bisect.bisect_left(ranks, (span[0] + span[1],))  # those starting before its end
            return i > 0 and sum(ranks[i - 1]) > span[0]

        free = [r for r in self._ahead if not needed(r)]
        behind = sorted(r for r in free if r[0] + r[1] + slack <= at)
        # Each span once: one both behind the reader and past `end` (read-ahead asked late, for
        # ranges before it) was given back twice, and the run then took its room again.
        beyond = sorted((r for r in free if r[0] >= end and r not in behind), reverse=True)
        return behind + beyond

    def read(self, offset: int, size: int) -> bytes:
        data = self.read_buffer(offset, size)
        return data if isinstance(data, bytes) else bytes(data)

    def read_apart(self, offset: int, size: int) -> bytes:
        """As `read`, for bytes the caller keeps to itself (a zip's tail, parsed once): not
        noted as taken by a read, so read-ahead still fetches the chunks they overlap for the
        reads that need them (a small archive's chunks may lie in its tail whole)."""
        check_range(self, offset, size)
        data = self._fetch(offset, size) if size else b""
        return data if isinstance(data, bytes) else bytes(data)

    def read_buffer(self, offset: int, size: int) -> Buffer:
        """As `read`, but a large range comes back as a read-only view of the buffer obstore
        received it in, not a copy (the decant store reads chunks with this). Copying each
        GET's body into `bytes` cost a memcpy and fresh pages per byte fetched: 256 MiB in
        4 MiB GETs took 0.09-0.29 s of client CPU copied, 0.04-0.09 s as views
        (SeaweedFS on this machine), on the two cores the server shares."""
        check_range(self, offset, size)
        if size == 0:
            return b""
        self._at = offset  # where the reader is: what `_stale` keeps prefetched ranges around
        with self._lock:
            if self._got.overlaps(offset, offset + size):  # read again: a new pass from here on
                self._got.forget_from(offset)
            # Noted before the GET below starts: read-ahead asked for it meanwhile leaves it out.
            self._got.add(offset, offset + size)
            self._got.keep_near(offset, offset + size, FORGET_AFTER * self.readahead_bytes)
            span, ahead = self._take(offset, size)
        # A pool thread never waits on a queued prefetch (read_many runs reads there).
        if ahead is not None and (ahead.done() or not _in_pool()):
            waited = not ahead.done()
            # A prefetch cancelled when dropped, or one that had failed before this read came
            # (the store may be back): asked again below. One this read waited for and saw fail
            # has spent the GET's retries just now: its error is the read's. Asked again, a read
            # while the store hung took two GETs' retries, and the decoder's own try after it a
            # third: 12.1 s to EIO with --s3-timeout 2 --s3-retries 1 (~3x the timeout is the
            # bound promised), 8.2 s now.
            with contextlib.suppress(CancelledError, *(() if waited else (StoreError,))):
                data = ahead.result()
                if span == (offset, size):
                    return data
                return memoryview(data)[offset - span[0] : offset - span[0] + size]
        return self._fetch(offset, size)

    def _fetch(self, offset: int, size: int) -> Buffer:
        """The range from the on-disk cache (--disk-cache) if it holds it, else a GET."""
        conn = self._folder.conn
        cache = conn.disk_cache
        if cache is None or not self.info.etag:
            return self._get(offset, size)
        # The store's endpoint too: mounts of one bucket name at two stores may share the
        # folder, and an ETag and a Last-Modified are whatever a store (or whoever answers for
        # an http:// one) says: another store's bytes were served as this one's.
        url = f"{conn.endpoint} {self.name}"
        key = cache.key(url, self.info.etag, offset, size, self.info.mtime)
        data = cache.get(key, size, self.name)
        if data is None:
            data = self._get(offset, size)
            cache.put(key, data, self.name)
        return data

    def _get(self, offset: int, size: int) -> Buffer:
        options: dict[str, Any] = {"range": (offset, offset + size)}
        if self.info.etag:
            options["if_match"] = self.info.etag
        full = self._folder.full_key(self.key)
        self._folder.conn.gets += 1  # approximate under threads: for logs and benchmarks
        again = FETCHED.add(size, self.name, self.info.etag or "", offset)
        if log.isEnabledFor(logging.DEBUG):
            thread = threading.current_thread().name
            log.debug("%s: GET %d+%d (%s), %d bytes fetched before", self.name, offset, size,
                      thread, again)  # fmt: skip
        try:
            result = obstore.get(self._folder.client, full, options=options)  # type: ignore[arg-type]
            body = result.bytes()  # obstore's Bytes: the buffer protocol, no copy
        except (BaseError, OSError) as exc:
            error = translate(exc, self.name, f"GET bytes {offset}-{offset + size - 1}:")
            if isinstance(error, ObjectMissingError):
                # Opened, so it existed: deleted since. ENOENT on a file held open said "no
                # such file" to a reader that has it; like NFS, say its handle is stale.
                raise ObjectChangedError(
                    f"{self.name}: object deleted since it was opened"
                ) from None
            raise error from None
        data: Buffer = bytes(body) if size <= SMALL_COPY else memoryview(body)
        etag = result.meta.get("e_tag")
        if self.info.etag and etag and etag != self.info.etag:
            raise ObjectChangedError(f"{self.name}: object replaced since it was opened")
        # The ETag of a single PUT is the MD5 of its body, which two bodies may share (published
        # collision blocks): a rewrite with such a twin passed the If-Match above, and an open
        # went on with the new body's bytes (a read of bytes of both). Its Last-Modified moved.
        # Both come from the same header (Last-Modified, this HEAD's and this GET's): compared
        # exactly; a rewrite within the same second is not told apart (S3 tells no more).
        modified = result.meta.get("last_modified")
        if modified is not None and self.info.mtime and modified.timestamp() != self.info.mtime:
            raise ObjectChangedError(
                f"{self.name}: object replaced since it was opened (Last-Modified changed)"
            )
        if len(data) != size:
            raise StoreError(f"{self.name}: GET at {offset} returned {len(data)} of {size} bytes")
        return data

    def _take(self, offset: int, size: int) -> tuple[tuple[int, int], Future[Buffer] | None]:
        """The span fetched ahead that holds [offset, offset + size) (lock held), and its GET;
        else the range itself and None. The ranges of spans the read overlaps are taken; a span
        is let go once each of its ranges was (the views handed out keep its bytes alive)."""
        end = offset + size
        found: tuple[tuple[int, int], Future[Buffer] | None] = ((offset, size), None)
        for span in list(self._over(offset, end)):
            if span[0] <= offset and end <= sum(span):
                found = span, self._ahead[span]
            members = self._members[span]
            members -= {m for m in members if m[0] < end and offset < sum(m)}
            if not members:
                self._drop(span, cancel=False)
        return found

    def _drop(self, key: tuple[int, int], cancel: bool = True) -> Future[Buffer] | None:
        """Take a prefetched span out (with the lock held), giving its bytes back to the
        connection's budget; unless it is taken to be used, a fetch not started is cancelled."""
        ahead = self._ahead.pop(key, None)
        self._members.pop(key, None)
        if ahead is not None:
            del self._spans[bisect.bisect_left(self._spans, key)]
            if cancel:
                ahead.cancel()
            self._folder.conn.release(key[1])
        return ahead

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several ranges, up to `concurrency` GETs in flight, results in the order asked."""
        if len(ranges) <= 1:
            return [self.read(off, n) for off, n in ranges]
        return list(self._folder.conn.pool.map(lambda r: self.read(*r), ranges))

    def close(self) -> None:
        with self._lock:
            for old in list(self._ahead):
                self._drop(old)
            self._got.clear()


def _span(group: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The (offset, size) one GET covering `group` (sorted ranges) fetches."""
    start = group[0][0]
    return start, max(off + n for off, n in group) - start


def _end(group: Sequence[tuple[int, int]]) -> int:
    start, size = _span(group)
    return start + size


def _joins(group: Sequence[tuple[int, int]], part: tuple[int, int], room: int) -> bool:
    """Whether `part` goes out in the same GET as `group`: it starts where the group ends (or
    within SPAN_GAP after: those bytes are fetched and unused), and the span stays within
    GET_SPAN and the `room` the budget has left."""
    start, size = _span(group)
    gap = part[0] - (start + size)
    grown = part[0] + part[1] - start
    return 0 <= gap <= SPAN_GAP and grown <= min(GET_SPAN, room)


def _in_pool() -> bool:
    return threading.current_thread().name.startswith(POOL_PREFIX)


class Budget(Protocol):
    """What read-ahead counts against (the mount's PageCache): bytes lent are evicted from it
    while they are held, so prefetched ranges and cached pages together stay within its size."""

    max_bytes: int

    def lend(self, nbytes: int) -> None: ...

    def unlend(self, nbytes: int) -> None: ...


class S3Connection:
    """One configured client for a bucket and the thread pool that keeps GETs in flight; shared
    by a folder and its sub-folders. With a `budget`, the bytes fetched ahead count against it."""

    def __init__(self, bucket: str, options: S3Options, budget: Budget | None = None) -> None:
        self.bucket = bucket
        self.options = options
        self.budget = budget
        self.client = _client(bucket, options)
        self.endpoint = _plain(bucket, options).endpoint  # what the disk cache keys carry
        self.disk_cache: DiskCache | None = None
        if options.disk_cache is not None:
            self.disk_cache = DiskCache(options.disk_cache, options.disk_cache_size)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._held = 0  # bytes prefetched (or being fetched) by this connection's objects
        self.gets = 0  # ranged GETs made by its objects

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.options.concurrency,
                    thread_name_prefix=POOL_PREFIX,
                    initializer=name_this_thread,
                    initargs=(POOL_PREFIX,),
                )
            return self._pool

    def _limit(self) -> int:
        if self.budget is None:
            return READAHEAD_TOTAL
        return min(READAHEAD_TOTAL, self.budget.max_bytes // BUDGET_SHARE)

    def room(self) -> int:
        """Bytes that may be fetched ahead now (what `hold` would grant)."""
        with self._lock:
            return self._limit() - self._held

    def hold(self, size: int) -> bool:
        """Whether `size` more bytes may be fetched ahead: all open objects together hold at
        most READAHEAD_TOTAL (many files read at once each get a part of it), and at most a
        BUDGET_SHARE of the budget's size, lent by it while held."""
        with self._lock:
            if self._held + size > self._limit():
                return False
            self._held += size
            if self.budget is not None:
                self.budget.lend(size)
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._held -= size
            if self.budget is not None:
                self.budget.unlend(size)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None


class S3Folder:
    """s3://BUCKET/PREFIX as a `Folder`; keys are relative to PREFIX."""

    def __init__(
        self,
        url: str,
        options: S3Options | None = None,
        connection: S3Connection | None = None,
        budget: Budget | None = None,
    ) -> None:
        bucket, self.prefix = split_url(url)
        self.bucket = bucket
        self.full_key("")  # a prefix no key can have fails here, at start
        self.conn = connection or S3Connection(bucket, options or S3Options(), budget)
        self.client = self.conn.client
        self.name = f"{SCHEME}{bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{bucket}"
        self._first: tuple[float, list[str], list[ObjectInfo]] | None = None

    def full_key(self, key: str) -> str:
        """PREFIX/key, refused (ObjectMissingError) where obstore would refuse it as a path: a
        control character, an empty, '.' or '..' segment. Such a key cannot name an object we
        reach (listings leave them out), and obstore's own ValueError was a traceback in
        `decant verify s3://…/ctl\x01.zarr.zip` or `decant info s3://B/P/../x.zarr.zip`."""
        full = join_key(self.prefix, key)
        problem = key_problem(full) if full else None
        if problem is not None:
            raise ObjectMissingError(
                f"{SCHEME}{self.bucket}/{full}: not a key an object store takes (it {problem})"
            )
        return full

    def url_of(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{join_key(self.prefix, key)}"

    def check(self) -> None:
        """One cheap request, so wrong credentials or a dead endpoint fail at start, clearly.
        It lists the top level, which `take_listing` hands to the mount's first readdir."""
        self._first = (time.monotonic(), *self._list_level(""))

    def take_listing(self) -> tuple[float, list[str], list[ObjectInfo]] | None:
        """The listing `check` made (time.monotonic() it was made, sub-prefixes, objects),
        once; None after that or without a check."""
        first, self._first = self._first, None
        return first

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return _info(obstore.head(self.client, self.full_key(key)), key)
        except FileNotFoundError:
            return None
        except (BaseError, OSError) as exc:
            raise translate(exc, self.url_of(key), "HEAD:") from None

    def upload_token(self, key: str) -> str | None:
        """The write side's upload token the object at `key` carries (vfs.stores.s3uploads),
        by a HEAD; None when it carries none, or no object is there."""
        from vfs.stores.s3uploads import UPLOAD_TOKEN

        try:
            found = obstore.get(self.client, self.full_key(key), options={"head": True})
        except FileNotFoundError:
            return None
        except (BaseError, OSError) as exc:
            raise translate(exc, self.url_of(key), "HEAD:") from None
        token = found.attributes.get(UPLOAD_TOKEN)
        return None if token is None else str(token)

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(obstore.get(self.client, self.full_key(key)).bytes())
        except FileNotFoundError:
            return None
        except (BaseError, OSError) as exc:
            raise translate(exc, self.url_of(key), "GET:") from None

    def open(self, key: str) -> S3Object:
        info = self.stat(key)
        if info is None:
            raise ObjectMissingError(f"{self.url_of(key)}: no such key")
        return S3Object(self, key, info)

    def sub(self, prefix: str) -> S3Folder:
        return S3Folder(self.url_of(prefix), connection=self.conn)

    def forget_fetched(self, url: str) -> None:
        """Ranges of the object at `url`, or below it, kept in --disk-cache go: they are
        fetched again (vfs.stores.diskcache.DiskCache.forget)."""
        cache = self.conn.disk_cache
        if cache is not None and (dropped := cache.forget(url)):
            log.info("%s: %d ranges kept in the disk cache dropped; fetched again", url, dropped)

    def _relative(self, path: str) -> str:
        return path[len(self.prefix) + 1 :] if self.prefix else path

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object below `prefix`, recursively, in the store's (key) order."""
        full = self.full_key(prefix)
        last: str | None = None
        try:
            for batch in obstore.list(self.client, prefix=full or None, chunk_size=1000):
                for meta in batch:
                    last = meta["path"]
                    yield _info(meta, self._relative(meta["path"]))
        except InvalidPathError:  # a key obstore will not parse: list again, without it
            for page in self._plain_pages(prefix, None):
                _dirs, files = self._plain_level(page)
                yield from (f for f in files if last is None or self.full_key(f.key) > last)
        except (BaseError, OSError) as exc:
            raise translate(exc, self.url_of(prefix), "listing:") from None

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[ObjectInfo]]:
        """One level below `prefix`: (sub-prefix names, objects)."""
        return self._list_level(prefix)

    def _list_level(self, prefix: str) -> tuple[list[str], list[ObjectInfo]]:
        """Read a page at a time where the credentials allow (vfs.stores.s3list: bounded,
        at LEVEL_MAX entries), else by obstore, which gathers every page first."""
        plain = _plain(self.bucket, self.conn.options)
        if plain.access_key and plain.secret_key:
            return self._paged_level(prefix, plain)
        full = self.full_key(prefix)
        try:
            out = obstore.list_with_delimiter(self.client, prefix=full or None)
        except InvalidPathError:  # a key obstore will not parse: list again, without it
            return self._paged_level(prefix, plain)
        except (BaseError, OSError) as exc:
            raise translate(exc, self.url_of(prefix), "listing:") from None
        return self._level(out, full)

    def _paged_level(self, prefix: str, plain: Plain) -> tuple[list[str], list[ObjectInfo]]:
        dirs: list[str] = []
        files: list[ObjectInfo] = []
        for page in self._plain_pages(prefix, "/", LEVEL_MAX, plain):
            more_dirs, more_files = self._plain_level(page)
            dirs += more_dirs
            files += more_files
        return sorted(set(dirs)), sorted(files, key=lambda i: i.key)

    def _plain_pages(
        self,
        prefix: str,
        delimiter: str | None,
        limit: int | None = None,
        plain: Plain | None = None,
    ) -> Iterator[Page]:
        full = self.full_key(prefix)
        plain = plain or _plain(self.bucket, self.conn.options)
        try:
            yield from list_pages(plain, full + "/" if full else "", delimiter, limit)
        except urllib.error.HTTPError as exc:  # told as obstore's are: "no such bucket", …
            said = OSError(f"{exc.code} {exc.reason}")
            raise translate(said, self.url_of(prefix), "listing:") from None
        except OSError as exc:
            raise translate(exc, self.url_of(prefix), "listing:") from None
        except (ValueError, SyntaxError) as exc:  # ET.ParseError is a SyntaxError
            raise StoreError(f"{self.url_of(prefix)}: listing: {_scrub(str(exc))}") from None

    def _plain_level(self, page: Page) -> tuple[list[str], list[ObjectInfo]]:
        """A fallback page as (sub-prefix names, objects), without the keys obstore refuses."""
        dirs = []
        for full in page.prefixes:
            level = full.removesuffix("/")  # only the delimiter: "P//" is the level "P/" + ""
            problem = key_problem(level)
            if problem is None:
                dirs.append(level.rsplit("/", 1)[-1])
            else:
                _skip(f"{SCHEME}{self.bucket}/{full}", problem)
        files = []
        for key, size, mtime, etag in page.objects:
            if key.endswith("/"):
                continue  # a folder marker, as obstore leaves it out
            problem = key_problem(key)
            if problem is None:
                files.append(ObjectInfo(self._relative(key), size, mtime, etag))
            else:
                _skip(f"{SCHEME}{self.bucket}/{key}", problem)
        return dirs, files

    def _level(self, out: Any, full: str) -> tuple[list[str], list[ObjectInfo]]:
        dirs = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in out["common_prefixes"])
        # obstore gives the level's own folder marker (`P/`, a console's "Create folder") as
        # the object `P`: no file of the level (it showed as `P/P`, which opened with ENOENT).
        files = [_info(m, self._relative(m["path"])) for m in out["objects"] if m["path"] != full]
        return dirs, sorted(files, key=lambda i: i.key)

    def abort_left_behind(self, keys: list[str], before: float, within: float) -> int:
        """Abort the multipart uploads of these keys (this folder's) begun before `before`
        (vfs.stores.s3uploads), for at most `within` seconds; the number aborted."""
        from vfs.stores.s3uploads import abort_left_behind

        full = [join_key(self.prefix, key) for key in keys]
        full = [key for key in full if key and key_problem(key) is None]
        return abort_left_behind(_plain(self.bucket, self.conn.options), full, before, within)

    def withdraw_left_behind(self, items: list[tuple[str, str]], within: float) -> list[str]:
        """Delete the objects at these keys (this folder's) that carry their upload tokens
        (vfs.stores.s3uploads), for at most `within` seconds; the keys settled."""
        from vfs.stores.s3uploads import withdraw_left_behind

        items = [(k, t) for k, t in items if k and key_problem(join_key(self.prefix, k)) is None]
        return withdraw_left_behind(
            self.client, lambda key: join_key(self.prefix, key), items, within
        )

    def close(self) -> None:
        self.conn.close()
