"""Multipart plans (vfs.stores.upload.multipart_plan): S3 takes at most 10,000 parts of at most
5 GiB, so the part size grows with the file, and the parts in flight shrink as it does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vfs.stores.upload import (
    CHUNK_SIZE,
    MAX_PART,
    MAX_PARTS,
    PART_BUFFER,
    PART_CONCURRENCY,
    UploadError,
    multipart_plan,
)

MiB, GiB = 1 << 20, 1 << 30


@given(size=st.integers(0, MAX_PARTS * MAX_PART) | st.integers(150 * GiB, 170 * GiB))
def test_every_object_s3_takes_fits_its_parts_and_the_buffers_stay_bounded(size: int) -> None:
    part, in_flight = multipart_plan("s3://b/k", size, CHUNK_SIZE)
    assert part * MAX_PARTS >= size  # 10,000 parts reach the end
    assert CHUNK_SIZE <= part <= MAX_PART and part % MiB == 0
    assert 1 <= in_flight <= PART_CONCURRENCY
    assert in_flight * part <= max(PART_BUFFER, part)


def test_files_up_to_156_gib_keep_the_parts_they_had() -> None:
    assert multipart_plan("s3://b/k", MAX_PARTS * CHUNK_SIZE, CHUNK_SIZE) == (
        CHUNK_SIZE,
        PART_CONCURRENCY,
    )


def test_a_file_past_156_gib_is_not_cut_into_more_parts_than_s3_takes() -> None:
    part, in_flight = multipart_plan("s3://b/k", 1 << 40, CHUNK_SIZE)  # 1 TiB
    assert -(-(1 << 40) // part) <= MAX_PARTS
    assert in_flight == 1


def test_an_object_larger_than_s3_holds_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(UploadError, match=r"s3://b/k: \d+ bytes, more than an S3 object holds"):
        multipart_plan("s3://b/k", MAX_PARTS * MAX_PART + 1, CHUNK_SIZE)
