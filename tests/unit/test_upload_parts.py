"""Multipart plans (vfs.stores.upload.multipart_plan): S3 takes at most 10,000 parts, so the part
size grows with the file, up to the 64 MiB a part may hold in memory, and the parts in flight
shrink as it does."""

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
    part, in_flight = multipart_plan("s3://b/k", 500 * GiB, CHUNK_SIZE)
    assert -(-(500 * GiB) // part) <= MAX_PARTS
    assert in_flight == 1


@pytest.mark.parametrize("size", [MAX_PARTS * MAX_PART + 1, 4 << 40])
def test_an_object_whose_parts_would_pass_64_mib_is_refused_before_anything_is_sent(
    size: int,
) -> None:
    """Red team 50: `truncate -s 4T` through a spool mount made 440 MiB parts (930 MiB RSS)."""
    assert 64 * MiB == MAX_PART
    with pytest.raises(UploadError, match=r"s3://b/k: \d+ bytes, more than one upload takes"):
        multipart_plan("s3://b/k", size, CHUNK_SIZE)
