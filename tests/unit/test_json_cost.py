"""JSON from packages, collections and archive metadata is parsed only when json_cost bounds
what the parse allocates: the bound holds (tracemalloc), the costliest accepted document stays
under it, one just over is refused naming its file, and legitimate documents still fit. A decant
manifest is bounded by its shape (values, objects, lists) at mode D's bounds instead."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import traced_peak
from vfs.acqstore import validate as acq
from vfs.decant.limits import (
    MAX_JSON_COST,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_OBJECTS,
    MAX_PAGES,
    MAX_SEGMENTS,
    json_cost,
    json_kept,
    manifest_shape,
    parse_json,
)
from vfs.decant.manifest import Manifest, PageRecord, parse_manifest
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


def nested_notes(n: int) -> bytes:
    group = b'{"a":' * 500 + b"0" + b"}" * 500
    return b'{"format": 1, "notes": [' + b",".join([group] * n) + b"]}"


def test_a_manifest_is_bounded_by_its_shape_before_parsing() -> None:
    """Nested one-key objects cost ~33 bytes of memory a byte of text: the most objects a
    manifest may hold parse within a bound, one group more is refused unparsed, naming it."""
    groups = (MAX_MANIFEST_OBJECTS - 1) // 500
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match=r"max\.zarr\.zip: manifest not parsed"):
            parse_manifest(nested_notes(groups), "max.zarr.zip")  # its notes cost too much
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{groups * 500} nested objects: parse peak {peak / 2**20:.1f} MiB")
    assert peak <= 160 * 2**20
    with pytest.raises(ManifestError) as info:
        parse_manifest(nested_notes(groups + 2), "over.zarr.zip")
    message = str(info.value)
    assert message.startswith("over.zarr.zip: manifest not parsed: it holds"), message
    assert "JSON objects, more than" in message


def page(i: int, segments: int) -> PageRecord:
    count = 512 * 512 * 2 // segments
    offsets = tuple(10**12 + (i * segments + k) * count for k in range(segments))
    return PageRecord(i, (512, 512), "uint16", offsets, (count,) * segments, 1, 1, 1, 0, 64, 64)


def manifest_text(pages: int, segments: int) -> bytes:
    """A mode D manifest of `pages` pages of `segments` segments each, as the packer writes it
    (its text made from one page's, repeated: the counts are what matters here)."""
    doc = Manifest(
        format=1, mode="byte-exact", original_name="a.tif", original_size=10**13,
        original_sha256="0" * 64, pages=(), plane_order=("z",),
    ).to_json()  # fmt: skip
    doc["pages"] = ["PAGES"]
    shell = json.dumps(doc, indent=1, sort_keys=True).encode()
    one = json.dumps(page(0, segments).to_json(), indent=1, sort_keys=True).encode()
    return shell.replace(b'"PAGES"', b",".join([one] * pages))


@pytest.mark.parametrize(
    ("pages", "segments"),
    [(MAX_PAGES, MAX_SEGMENTS // MAX_PAGES), (MAX_PAGES, 1), (1, MAX_SEGMENTS)],
)
def test_a_manifest_at_mode_d_bounds_passes_the_shape_check(pages: int, segments: int) -> None:
    """Mode D's bounds (pages, segments: what the packer may write) make a manifest the reader
    parses: archives written within them stay readable."""
    raw = manifest_text(pages, segments)
    assert len(raw) <= MAX_MANIFEST_BYTES
    assert manifest_shape(raw) == ""
    json.loads(raw)  # well-formed: what was counted is a manifest


def test_a_large_manifest_is_parsed_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past BIG_MANIFEST_BYTES a parse holds the lock that keeps large parses from adding up."""
    records = tuple(page(i, 4) for i in range(256))
    raw = Manifest(
        format=1, mode="byte-exact", original_name="a.tif", original_size=10**13,
        original_sha256="0" * 64, pages=records, plane_order=("z",),
    ).dumps()  # fmt: skip
    monkeypatch.setattr("vfs.decant.manifest.BIG_MANIFEST_BYTES", len(raw) - 1)
    held = []

    class Spy:
        def __enter__(self) -> None:
            held.append(True)

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr("vfs.decant.manifest._BIG_PARSE", Spy())
    with pytest.raises(ManifestError) as info:  # parsed; its offsets are made up
        parse_manifest(raw, "big.zarr.zip")
    assert "not parsed" not in str(info.value)
    assert held == [True]


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
    result, peak = traced_peak(lambda: acq.validate_collection(tmp_path))
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
