"""The fixture itself: a real S3 server that obstore can write and read."""

from __future__ import annotations

import obstore
from obstore.store import S3Store

from tests.s3.conftest import S3Bucket


def test_obstore_round_trip(s3_bucket: S3Bucket) -> None:
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})  # endpoint from env
    obstore.put(store, s3_bucket.key("b.bin"), b"x" * 1000)
    assert bytes(obstore.get_range(store, s3_bucket.key("b.bin"), start=10, length=5)) == b"xxxxx"
    assert obstore.head(store, s3_bucket.key("b.bin"))["size"] == 1000
