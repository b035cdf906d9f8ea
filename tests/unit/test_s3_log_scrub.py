"""A store's error that reaches a log line (a failed DELETE of an upload) is scrubbed: one line,
no credential. Red team 46: three such warnings wrote obstore's message raw; an S3 error body
(SignatureDoesNotMatch) carries the access key id, and spans lines."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from vfs.stores import upload
from vfs.stores.s3 import scrubbed

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"


class _Refusing:
    """An S3 folder whose every request fails as a store answering with its error body."""

    def url_of(self, key: str) -> str:
        return f"s3://bucket/{key}"

    def stat(self, key: str) -> Any:
        raise OSError(f"403 SignatureDoesNotMatch <AWSAccessKeyId>{KEY_ID}</AWSAccessKeyId>\n"
                      f"<StringToSign>{SECRET}</StringToSign>")  # fmt: skip


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)


def test_a_failed_delete_of_a_bad_upload_logs_one_line_without_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="vfs.stores.upload"):
        assert not upload._delete_if_ours(_Refusing(), "x.zarr.zip", "etag")  # type: ignore[arg-type]
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "could not delete the bad upload" in said
    assert KEY_ID not in said and SECRET not in said and said.count("\n") == 0, said


def test_scrubbed_keeps_our_own_errors_and_cuts_a_store_s_to_one_clean_line() -> None:
    from vfs.errors import StoreError

    assert scrubbed(StoreError("s3://b/k: no such key")) == "s3://b/k: no such key"
    line = scrubbed(OSError(f"denied for {KEY_ID}\nsecond line {SECRET}"))
    assert line == "denied for ***"
