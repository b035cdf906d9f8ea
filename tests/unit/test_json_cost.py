"""JSON from archives, packages and collections is parsed only when json_cost bounds what the
parse allocates: the bound holds (tracemalloc), the costliest accepted document stays under it,
one just over is refused naming its file, and legitimate documents still fit."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfs.acqstore import validate as acq
from vfs.decant.limits import (
    MAX_JSON_COST,
    MAX_PAGES,
    MAX_SEGMENTS,
    json_cost,
    json_kept,
    parse_json,
)
from vfs.decant.manifest import Manifest, PageRecord, manifest_fits, parse_manifest
from vfs.errors import ManifestError

N = 20_000
# The shapes that cost most per byte of text or per counted value.
SHAPES: dict[str, Callable[[int], str]] = {
    "empty objects": lambda n: "[" + ",".join(["{}"] * n) + "]",
    "one-element lists": lambda n: "[" + ",".join(["[[0]]"] * n) + "]",
    "lists of a string": lambda n: "[" + ",".join(['["ab"]'] * n) + "]",
    "short strings": lambda n: "[" + ",".join(['"ab"'] * n) + "]",
    "wide strings": lambda n: "[" + ",".join(['"\\ud83d\\ude00a"'] * n) + "]",
    "raw wide strings": lambda n: "[" + ",".join(['"\U0001f600"'] * n) + "]",
    "one latin-1 escape": lambda n: '["\\u00e9' + "a" * n + '"]',
    "big ints": lambda n: "[" + ",".join(str(10**9 + i) for i in range(n)) + "]",
    "one-key objects": lambda n: "[" + ",".join(['{"a":"bc"}'] * n) + "]",
    "distinct keys": lambda n: "{" + ",".join(f'"k{i}":"ab"' for i in range(n)) + "}",
    "objects of distinct keys": lambda n: "[" + ",".join(f'{{"k{i}":0}}' for i in range(n)) + "]",
    "nested one-key objects": lambda n: (
        "[" + ",".join(['{"a":' * 50 + "0" + "}" * 50] * (n // 50)) + "]"
    ),
    "nested lists": lambda n: "[" + ",".join(["[" * 50 + '"bc"' + "]" * 50] * (n // 50)) + "]",
}


def parse_peak(raw: bytes) -> int:
    tracemalloc.start()
    try:
        doc = json.loads(raw)
        peak = tracemalloc.get_traced_memory()[1]
        del doc
    finally:
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_json_cost_bounds_the_parse(shape: str) -> None:
    raw = SHAPES[shape](N).encode()
    assert parse_peak(raw) <= json_cost(raw)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=JSON, compact=st.booleans(), ascii_only=st.booleans())
def test_json_cost_bounds_any_document(doc: Any, compact: bool, ascii_only: bool) -> None:
    separators = (",", ":") if compact else None
    raw = json.dumps(doc, separators=separators, ensure_ascii=ascii_only).encode()
    assert parse_peak(raw) <= json_cost(raw)


def largest_accepted(make: Callable[[int], bytes]) -> tuple[bytes, bytes]:
    """The largest `make(n)` json_cost accepts, and the next one."""
    lo, hi = 1, 2
    while json_cost(make(hi)) <= MAX_JSON_COST:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if json_cost(make(mid)) <= MAX_JSON_COST else (lo, mid)
    return make(lo), make(hi)


def nested_notes(n: int) -> bytes:
    group = b'{"a":' * 500 + b"0" + b"}" * 500
    return b'{"format": 1, "notes": [' + b",".join([group] * n) + b"]}"


def test_the_costliest_accepted_manifest_stays_under_the_bound() -> None:
    accepted, over = largest_accepted(nested_notes)
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match=r"max\.zarr\.zip: manifest is missing"):
            parse_manifest(accepted, "max.zarr.zip")  # parsed, then refused field by field
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{len(accepted)} bytes: parse peak {peak / 2**20:.1f} MiB")
    assert peak <= MAX_JSON_COST
    with pytest.raises(ManifestError) as info:
        parse_manifest(over, "over.zarr.zip")
    message = str(info.value)
    assert message.startswith("over.zarr.zip: manifest not parsed:"), message
    assert "memory to parse, more than 48 MiB" in message


def page(i: int, segments: int) -> PageRecord:
    count = 512 * 512 * 2 // segments
    offsets = tuple(10**12 + (i * segments + k) * count for k in range(segments))
    return PageRecord(i, (512, 512), "uint16", offsets, (count,) * segments, 1, 1, 1, 0, 64, 64)


@pytest.mark.parametrize(
    ("pages", "segments"), [(MAX_PAGES, MAX_SEGMENTS // MAX_PAGES), (1, MAX_SEGMENTS)]
)
def test_the_largest_mode_d_manifest_is_read(pages: int, segments: int) -> None:
    """Mode D's bounds (pages, segments) make a manifest the reader parses, ASCII names."""
    records = tuple(page(i, segments) for i in range(pages))
    assert manifest_fits(records, ["a.tif"])
    manifest = Manifest(
        format=1, mode="byte-exact", original_name="a.tif", original_size=10**13,
        original_sha256="0" * 64, pages=records, plane_order=("z",),
    )  # fmt: skip
    assert json_cost(manifest.dumps()) <= MAX_JSON_COST
    with pytest.raises(ManifestError) as info:  # parsed; its offsets are made up
        parse_manifest(manifest.dumps(), "big.zarr.zip")
    assert "not parsed" not in str(info.value)


def test_a_manifest_too_costly_to_read_is_packed_verbatim(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from vfs.decant.packer import pack_file

    tifffile.imwrite(tmp_path / "a.tif", np.zeros((4, 16, 16), np.uint16))
    monkeypatch.setattr("vfs.decant.manifest.MAX_JSON_COST", 1000)
    result = pack_file(tmp_path / "a.tif", tmp_path / "a.tif.zarr.zip")
    assert result.mode == "verbatim"
    assert "manifest would cost more than" in result.reason


def write_collection(root: Path, extra: bytes = b"", members: int = 0) -> Path:
    doc = root / "acqstore/collection.json"
    doc.parent.mkdir(parents=True, exist_ok=True)
    listed = b",".join([b"1"] * members)
    doc.write_bytes(
        b'{"format": "acqstore-ome-zarr-collection", "version": 1, "id": "c", "name": "c", '
        b'"members": [' + listed + b"]" + extra + b"}"
    )
    return doc


def test_a_collection_document_too_costly_is_refused_naming_it(tmp_path: Path) -> None:
    group = b'{"a":' * 500 + b"0" + b"}" * 500
    junk = b', "junk": [' + b",".join([group] * (MAX_JSON_COST // 500 // 340 + 1)) + b"]"
    write_collection(tmp_path, junk)
    result = acq.validate_collection(tmp_path)
    [issue] = result.issues
    assert issue.document == "acqstore/collection.json"
    assert "not a readable JSON document" in issue.message
    assert "memory to parse, more than 48 MiB" in issue.message


def test_schema_errors_are_listed_up_to_a_bound(tmp_path: Path) -> None:
    """262,144 members that are not objects: each was a jsonschema error (a few KiB while
    sorted), then an Issue: ~1 GiB of RSS for a 26 MiB-cost document."""
    write_collection(tmp_path, members=1 << 18)
    tracemalloc.start()
    try:
        result = acq.validate_collection(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(result.issues) == acq.MAX_ISSUES + 1
    assert result.issues[0].pointer == "/members/0"
    assert result.issues[-1].message == "more issues not listed (only the first 1000 are kept)"
    assert result.issues[-1].severity == "error" and not result.ok
    assert peak < 64 << 20, f"peak {peak >> 20} MiB"


def test_a_collection_costly_only_in_all_is_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each document is within MAX_JSON_COST but they are all kept until the view is built."""
    from tests.toolbox import load_tool

    load_tool("make_acqstore_corpus").make_collection(tmp_path)
    assert acq.validate_collection(tmp_path).ok
    first = json_kept((tmp_path / "acqstore/collection.json").read_bytes())
    monkeypatch.setattr(acq, "MAX_COLLECTION_COST", first + 1)
    result = acq.validate_collection(tmp_path)
    assert not result.ok
    assert any(
        "documents up to this one could take more than" in i.message for i in result.errors
    ), result.issues


def test_parse_json_turns_deep_nesting_into_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json(b"[" * 100_000 + b"]" * 100_000)


def test_ten_thousand_members_fit_in_what_a_collection_keeps(tmp_path: Path) -> None:
    """tools/make_acqstore_corpus.py large: json_kept grows by member; 10,000 must fit (the
    corpus of 10,000 keeps 141 MiB by json_kept, 82 MiB by tracemalloc)."""
    from tests.toolbox import load_tool

    load_tool("make_acqstore_corpus").make_large_collection(tmp_path, 200)
    kept = [json_kept(p.read_bytes()) for p in (tmp_path / "acqstore").rglob("*.json")]
    assert len(kept) == 2 * 200 + 1
    assert sum(kept) * 10_000 // 200 <= acq.MAX_COLLECTION_COST
    assert acq.validate_collection(tmp_path).ok
