"""Aborting the multipart uploads a killed run left is bounded (red team 62, F3): a store
listing 1,000 uploads of one key and answering each DELETE slowly held a bucket mount's start
for good, the deadline being looked at between keys only. Against a loopback fake store."""

from __future__ import annotations

import http.server
import time

from tests.toolbox import loopback_http
from vfs.stores.s3list import Plain
from vfs.stores.s3uploads import abort_left_behind

UPLOADS = 1000
DELAY = 0.2


class SlowStore(http.server.BaseHTTPRequestHandler):
    deletes = 0

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:
        uploads = "".join(
            f"<Upload><Key>k/big.bin</Key><UploadId>u{i}</UploadId>"
            "<Initiated>2001-01-01T00:00:00.000Z</Initiated></Upload>"
            for i in range(UPLOADS)
        )
        body = f"<ListMultipartUploadsResult>{uploads}</ListMultipartUploadsResult>".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self) -> None:
        SlowStore.deletes += 1
        time.sleep(DELAY)
        self.send_response(204)
        self.end_headers()


def test_a_slow_store_holds_the_start_no_longer_than_the_bound() -> None:
    with loopback_http(SlowStore) as url:
        plain = Plain(url, "bkt", "us-east-1", "k", "s", None, timeout=30.0, retries=3)
        started = time.monotonic()
        aborted = abort_left_behind(plain, ["k/big.bin"], time.time(), within=1.0)
        took = time.monotonic() - started
    assert 1 <= aborted < 10 and SlowStore.deletes == aborted
    assert took < 5  # 1,000 DELETEs of 0.2 s each: 200 s unbounded
