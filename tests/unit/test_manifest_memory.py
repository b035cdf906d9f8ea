"""A decant manifest is read in bounded memory (manifest_text, pagetable): what `json.loads` and
the same checks made of any text, parse_manifest makes too (an equal Manifest, or the same kind
of refusal naming the file); and any text that passes manifest_shape, at mode D's bounds or
hostile within them, parses or is refused within MAX_PARSE_PEAK (the resident set of a child
that parses it)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import accumulate
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import peak_in_child
from vfs.decant import manifest, manifest_text
from vfs.decant.geometry import ITEMSIZE
from vfs.decant.limits import (
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_ITEMS,
    MAX_MEMBERS,
    MAX_PAGES,
    MAX_SEGMENTS,
    json_cost,
    manifest_shape,
)
from vfs.decant.manifest import Manifest, PageRecord, manifest_from_doc, parse_manifest
from vfs.errors import DecantError, ManifestError

MiB = 1 << 20
MAX_PARSE_PEAK = 150 * MiB  # the daemon's margin over its cache


def old_parse(raw: bytes, source: str) -> Manifest:
    """parse_manifest as it was: the whole text through json.loads, then the same checks."""
    too_much = manifest_shape(raw)
    if too_much:
        raise ManifestError(f"{source}: manifest not parsed: it holds {too_much}")
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ManifestError(f"{source}: manifest JSON is nested too deeply") from None
    except ValueError as exc:
        raise ManifestError(f"{source}: manifest is not valid JSON ({exc})") from None
    return manifest_from_doc(doc, source)


@st.composite
def page_docs(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """A striped page record whose segments are what its geometry makes (check_geometry)."""
    dtype = draw(st.sampled_from(sorted(ITEMSIZE)))
    y, x = draw(st.integers(1, 30)), draw(st.integers(1, 30))
    samples = draw(st.sampled_from([0, 1, 3]))
    planar = draw(st.sampled_from([1, 2])) if samples else 1
    spp = samples or 1
    planes = spp if planar == 2 else 1
    rows = draw(st.integers(1, y))
    row_bytes = x * ITEMSIZE[dtype] * (spp // planes)
    counts = [min(rows, y - r) * row_bytes for _ in range(planes) for r in range(0, y, rows)]
    first = draw(st.integers(0, 1 << 45))
    return {
        "index": index,
        "shape": [y, x, samples] if samples else [y, x],
        "dtype": dtype,
        "dataoffsets": list(accumulate([first, *counts[:-1]])),
        "databytecounts": counts,
        "samplesperpixel": spp,
        "planarconfig": planar,
        "predictor": 1,
        "rowsperstrip": rows,
        "tilewidth": 0,
        "tilelength": 0,
    }


INT64 = st.integers(-(1 << 63), (1 << 63) - 1)  # beyond: refused by the table, see below
JSON = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=30,
)
NOTES = st.text(max_size=40) | st.text(alphabet='aé€😀\\"\n', min_size=900, max_size=3000)


@st.composite
def manifest_docs(draw: st.DrawFn) -> dict[str, Any]:
    series = draw(st.booleans())
    n = draw(st.integers(0, 5))
    pages = [draw(page_docs(i)) for i in draw(st.permutations(range(n)))]
    husk = draw(st.integers(0, 1 << 30))
    doc: dict[str, Any] = {
        "format": 1,
        "mode": "series" if series else "byte-exact",
        "original_name": "a.tif",
        "original_size": 0 if series else husk + sum(sum(p["databytecounts"]) for p in pages),
        "original_sha256": "" if series else "ab" * 32,
        "byteorder": draw(st.sampled_from("<>")),
        "plane_order": ["z"],
        "husk_raw_size": 0 if series else husk,
        "notes": draw(NOTES),
        "decant_version": "1.0",
    }
    if series:
        doc["series_consolidated"] = True
        doc["members"] = [
            {
                "relpath": f"d/m{i}.tif",
                "original_size": husk + sum(p["databytecounts"]),
                "original_sha256": "cd" * 32,
                "husk_array": f"husk_{i}",
                "husk_raw_size": husk,
                "pages": [p],
            }
            for i, p in enumerate(pages or [draw(page_docs(0))])
        ]
    else:
        doc["pages"] = pages
    doc.update(draw(st.dictionaries(st.sampled_from(["x", "zz", "é"]), JSON, max_size=2)))
    return doc


def objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest object and its page and member records: where a mutation may land."""
    found = [doc]
    for member in doc.get("members", []):
        found += [member, *member["pages"]]
    return found + doc.get("pages", [])


@st.composite
def manifest_texts(draw: st.DrawFn) -> bytes:
    """A valid manifest, or one with a field dropped or replaced, or its text cut or spliced."""
    doc = draw(manifest_docs())
    target = draw(st.sampled_from(objects(doc)))
    change = draw(st.sampled_from(["none", "none", "drop", "replace", "ints", "cut", "splice"]))
    if change == "drop" and target:
        del target[draw(st.sampled_from(sorted(target)))]
    if change == "replace":
        target[draw(st.sampled_from([*sorted(target), "new"]))] = draw(JSON)
    if change == "ints" and "dtype" in target:  # a page's list of integers, perhaps not all so
        key = draw(st.sampled_from(["shape", "dataoffsets", "databytecounts"]))
        at = draw(st.integers(0, len(target[key]) - 1))
        odd = draw(st.sampled_from([-target[key][at], -1, True, float(target[key][at]), None]))
        target[key][at] = odd
    raw = json.dumps(
        doc,
        indent=draw(st.sampled_from([None, 0, 1, 3])),
        ensure_ascii=draw(st.booleans()),
        sort_keys=draw(st.booleans()),
    ).encode()
    at = draw(st.integers(0, len(raw)))
    if change == "cut":
        raw = raw[:at]
    if change == "splice":
        raw = (
            raw[:at]
            + draw(st.sampled_from([b" ", b",", b"]", b"}", b'"', b"0", b"\xc3"]))
            + raw[at:]
        )
    return raw


def outcome(parse: Any, raw: bytes) -> Any:
    try:
        return parse(raw, "m.zarr.zip")
    except DecantError as exc:
        assert str(exc).startswith("m.zarr.zip: "), exc
        return type(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=manifest_texts(), window=st.sampled_from([1, 7, 64, 1024]), walk=st.booleans())
def test_the_bounded_reading_parses_what_json_loads_did(
    raw: bytes, window: int, walk: bool
) -> None:
    """Equal Manifests, or the same kind of refusal; with small windows (values cut anywhere)
    and with every page walked as a large one is (its integer lists read into arrays). The
    walker reads every text here: json.loads would read these small ones (SMALL_PARSE_COST)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest, "SMALL_PARSE_COST", 0)
        mp.setattr(manifest_text, "_FIRST_WINDOW", window)
        if walk:
            mp.setattr(manifest_text, "MAX_PAGE_COST", 0)
        new = outcome(parse_manifest, raw)
    assert new == outcome(old_parse, raw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=manifest_texts())
def test_a_small_manifest_read_by_json_loads_is_the_walker_s_manifest(raw: bytes) -> None:
    """parse_manifest hands a text whose cost bound is small to json.loads (40 times faster on
    a small archive's manifest): the same Manifest as the walker's, or the same refusal in the
    same words (json.loads' own errors are never shown: the walker says what is wrong)."""

    def words(raw: bytes) -> Any:
        try:
            return parse_manifest(raw, "m.zarr.zip")
        except DecantError as exc:
            return type(exc), str(exc)

    fast = words(raw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest, "SMALL_PARSE_COST", 0)
        assert fast == words(raw)


def test_a_small_manifest_is_not_walked_and_a_costly_one_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walked: list[int] = []
    real = manifest.ManifestText.document

    def document(self: Any) -> Any:
        walked.append(len(self.raw))
        return real(self)

    monkeypatch.setattr(manifest.ManifestText, "document", document)
    raw = one_page(2)
    assert parse_manifest(raw, "a.zarr.zip") == old_parse(raw, "a.zarr.zip")
    assert walked == []
    monkeypatch.setattr(manifest, "SMALL_PARSE_COST", json_cost(raw) - 1)
    assert parse_manifest(raw, "a.zarr.zip") == old_parse(raw, "a.zarr.zip")
    assert walked == [len(raw)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=manifest_docs())
def test_a_valid_manifest_reads_as_its_json(doc: dict[str, Any]) -> None:
    """Independently of the checks: every field is what json.loads reads, pages in order."""
    m = parse_manifest(json.dumps(doc).encode(), "m.zarr.zip")
    pages = [PageRecord(**{k: tuple(v) if isinstance(v, list) else v for k, v in p.items()})
             for p in doc.get("pages", [])]  # fmt: skip
    assert list(m.pages) == pages and m.pages == tuple(pages)
    assert [list(mem.pages) for mem in m.members] == [
        [PageRecord(**{k: tuple(v) if isinstance(v, list) else v for k, v in p.items()})
         for p in mem["pages"]] for mem in doc.get("members", [])
    ]  # fmt: skip
    assert (m.notes, m.original_size, m.byteorder) == (doc["notes"], doc["original_size"],
                                                       doc["byteorder"])  # fmt: skip
    assert m.extra == {k: v for k, v in doc.items() if k in ("x", "zz", "é")}


HEAD = b'{"format": 1, "mode": "byte-exact", "original_name": "a.tif", "original_sha256": "%s"' % (
    b"0" * 64
)
PAGE = (
    b'{"index": %d, "shape": [512, 512], "dtype": "uint16", "dataoffsets": [%s], '
    b'"databytecounts": [%s], "samplesperpixel": 1, "planarconfig": 1, "predictor": 1, '
    b'"rowsperstrip": %d, "tilewidth": 0, "tilelength": 0}'
)


def at_bounds(pages: int, segments: int, tail: bytes = b"") -> bytes:
    """A mode D manifest of `pages` 512x512 uint16 pages of `segments` strips each, every
    offset distinct (as in a real file), written as the packer writes it but without indent."""
    count = 512 * 512 * 2 // segments
    counts = b",".join([b"%d" % count] * segments)
    husk = 4096
    records = (
        PAGE % (i, b",".join(b"%d" % (husk + (i * segments + k) * count) for k in range(segments)),
                counts, 512 // segments)
        for i in range(pages)
    )  # fmt: skip
    size = husk + pages * 512 * 512 * 2
    return b"%s, %s\"original_size\": %d, \"husk_raw_size\": %d, \"pages\": [%s]}" % (
        HEAD, tail, size, husk, b",".join(records),
    )  # fmt: skip


def one_page(segments: int) -> bytes:
    """One page of `segments` one-row strips: the segment bound on a single page."""
    husk = 4096
    offsets = b",".join(b"%d" % (husk + 64 * k) for k in range(segments))
    page = PAGE.replace(b'"uint16"', b'"uint8"').replace(b"[512, 512]", b"[%d, 64]" % segments)
    record = page % (0, offsets, b",".join([b"64"] * segments), 1)
    return b'%s, "original_size": %d, "husk_raw_size": %d, "pages": [%s]}' % (
        HEAD, husk + 64 * segments, husk, record,
    )  # fmt: skip


def verbatim(extra: bytes) -> bytes:
    return HEAD.replace(b"byte-exact", b"verbatim") + b', "original_size": 1, ' + extra + b"}"


N_VALUES = MAX_MANIFEST_ITEMS - 1000
PAGE_KEYS = [b"index", b"shape", b"dtype", b"predictor", b"tilewidth", b"tilelength", b"x", b"y"]
HOSTILE = {
    # json memoizes every key for the whole of json.loads: 600 MiB
    "distinct keys": lambda: verbatim(
        b'"x": {' + b",".join(b'"k%d":0' % i for i in range(N_VALUES // 2)) + b"}"
    ),
    # ~36 bytes an int: 540 MiB
    "distinct ints": lambda: verbatim(
        b'"x": [' + b",".join(b"%d" % (1000 + i) for i in range(N_VALUES)) + b"]"
    ),
    # the text decoded whole at 4 bytes a character, the string again: 960 MiB
    "a string made wide by one emoji": lambda: verbatim(
        b'"notes": "\xf0\x9f\x98\x80' + b"a" * (MAX_MANIFEST_BYTES - 4096) + b'"'
    ),
    # ~60 bytes a string: 800 MiB
    "distinct strings": lambda: verbatim(
        b'"x": [' + b",".join(b'"s%d"' % i for i in range(N_VALUES)) + b"]"
    ),
    "deep nesting": lambda: verbatim(b'"x": ' + b"[" * 100_000 + b"]" * 100_000),
    # every page with 40 long keys of its own: each page's keys die with it
    "pages with keys of their own": lambda: (
        at_bounds(1 << 15, 1).replace(b'"tilelength": 0}', b"%s}")
        % tuple(
            b'"tilelength": 0, "k": {%s}'
            % b",".join(b'"%s%d":0' % (b"k" * 24, 40 * i + k) for k in range(40))
            for i in range(1 << 15)
        )
    ),
    # one page of the most segments the counts allow (2.6 times the bound): 440 MiB
    "a page of 5.5 M segments": lambda: one_page((MAX_MANIFEST_ITEMS - 100) // 2),
    # a page's fields, each a long string, all kept until the page is checked: 250 MiB
    "a page of long fields": lambda: at_bounds(1, 1).replace(
        b'"index": 0, "shape": [512, 512], "dtype": "uint16"',
        b",".join(b'"%s": "%s"' % (k, b"a" * (15 * MiB)) for k in PAGE_KEYS),
    ),
    # 350,000 members of no pages, names of 150 characters (a ~3 MB archive): 1.2 GiB
    "many members": lambda: series_of(350_000, lambda i: b""),
    # as many members as a series may hold, a page each (each refused: kept as its error)
    "members at the bound, a page each": lambda: series_of(
        MAX_MEMBERS, lambda i: PAGE % (i, b"%d" % (4096 + i * 8), b"8", 512)
    ),
    "members with long names": lambda: (
        HEAD.replace(b"byte-exact", b"series")
        + b', "original_size": 0, "members": ['
        + b",".join([b'{"relpath": "\xf0\x9f\x98\x80%s"}' % (b"a" * (20 * MiB))] * 5)
        + b"]}"
    ),
}


def series_of(members: int, page: Callable[[int], bytes]) -> bytes:
    """A consolidated series manifest of `members` members, each with `page(i)` as its pages."""
    record = (b'{"relpath": "d%%03d/%%07d%s.tif", "original_size": 1, "original_sha256": "%s", '
              b'"husk_array": "husk_%%d", "husk_raw_size": 1, "pages": [%%s]}'
              % (b"x" * 140, b"0" * 64))  # fmt: skip
    listed = b",".join(record % (i % 997, i, i, page(i)) for i in range(members))
    head = HEAD.replace(b"byte-exact", b"series")
    return head + b', "original_size": 0, "series_consolidated": true, "members": [%s]}' % listed


SETUP = "from tests.unit.test_manifest_memory import *\n"
# Checked in the child before its peak is measured: the text is one the daemon would parse.
WITHIN_COUNTS = "\nassert len(raw) <= MAX_MANIFEST_BYTES and manifest_shape(raw) == ''"


def hostile_child(params: dict[str, Any]) -> tuple[str, str]:
    return SETUP + f"raw = HOSTILE[{params['case']!r}]()" + WITHIN_COUNTS, (
        "repr(outcome(parse_manifest, raw))"
    )


def bounds_child(params: dict[str, Any]) -> tuple[str, str]:
    pages, segments = params["pages"], params["segments"]
    build = "at_bounds(pages, segments, MOST_ELSE)" if pages > 1 else "one_page(segments)"
    return SETUP + f"pages, segments = {pages}, {segments}\nraw = {build}", (
        "summary(parse_manifest(raw, 'bounds.zarr.zip'))"
    )


CHILDREN: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "test_a_hostile_manifest_costs_at_most_the_bound": hostile_child,
    "test_a_manifest_at_mode_d_bounds_parses_within_the_bound": bounds_child,
}


@pytest.fixture(scope="module")
def children(request: pytest.FixtureRequest) -> Iterator[dict[tuple[str, str], Future[Any]]]:
    """The children of the memory tests this run selected, started two at a time as soon as
    the first is asked for: each is one core's work for 5-15 s, and one after another they took
    ~70 s of the suite. Their peaks are each child's own resident set: running beside another
    changes its time, not its memory."""
    with ThreadPoolExecutor(2) as pool:
        started = {}
        for item in request.session.items:
            make = CHILDREN.get(getattr(item, "originalname", ""))
            if make is not None and getattr(item, "module", None) is request.module:
                args = make(item.callspec.params)  # type: ignore[attr-defined]
                started[args] = pool.submit(peak_in_child, *args)
        yield started


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_manifest_costs_at_most_the_bound(
    case: str, children: dict[tuple[str, str], Future[Any]]
) -> None:
    """Within manifest_shape's counts and MAX_MANIFEST_BYTES, each was 500-960 MiB to parse."""
    result, peak = children[hostile_child({"case": case})].result()
    print(f"{case}: peak {peak / MiB:.1f} MiB, {result}")
    assert peak <= MAX_PARSE_PEAK, f"peak {peak / MiB:.1f} MiB"


# Besides its pages, what a manifest may keep (notes, unknown fields) and cost to parse.
MOST_ELSE = b'"notes": "%s", "x": "%s", ' % (b"a" * (15 * MiB), b"b" * (7 * MiB))


@pytest.mark.parametrize(
    ("pages", "segments"), [(MAX_PAGES, MAX_SEGMENTS // MAX_PAGES), (1, MAX_SEGMENTS)]
)
def test_a_manifest_at_mode_d_bounds_parses_within_the_bound(
    pages: int, segments: int, children: dict[tuple[str, str], Future[Any]]
) -> None:
    """What the packer may write at mode D's bounds was ~480 MiB (2^18 pages of 8 segments);
    with the most a manifest may keep and parse besides, it still fits."""
    got, peak = children[bounds_child({"pages": pages, "segments": segments})].result()
    print(f"{pages} pages of {segments} segments: peak {peak / MiB:.1f} MiB")
    assert peak <= MAX_PARSE_PEAK, f"peak {peak / MiB:.1f} MiB"
    notes = 15 * MiB if pages > 1 else 0
    assert got == [pages, MAX_SEGMENTS, pages - 1, segments, True, notes]


def summary(m: Manifest) -> list[int | bool]:
    """What the test of mode D's bounds checks of a parsed manifest (read in the child)."""
    last = m.pages[-1]
    return [len(m.pages), m.pages.segments(), last.index, len(last.dataoffsets),  # type: ignore[attr-defined]
            last.nbytes == last.plane_nbytes, len(m.notes)]  # fmt: skip


def test_an_integer_of_64_bits_or_more_in_a_page_is_refused_naming_it() -> None:
    raw = one_page(2).replace(b'"index": 0', b'"index": %d' % (1 << 63))
    with pytest.raises(ManifestError, match=r"^p\.zarr\.zip: pages\[0\] holds an integer of 2\^63"):
        parse_manifest(raw, "p.zarr.zip")


def test_a_repeated_pages_field_counts_once_as_json_loads_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last of repeated keys is the one json.loads keeps: the pages of the first do not
    count towards mode D's bounds (here the tables would hold 1.5 times as many pages)."""
    monkeypatch.setattr(manifest_text, "MAX_PAGES", 1000)
    monkeypatch.setattr("vfs.decant.manifest.MAX_PAGES", 1000)
    raw = at_bounds(750, 1)
    tail = raw[raw.index(b', "pages": [') :]
    raw = raw[: -len(tail)] + tail[:-1] + tail
    m = parse_manifest(raw, "twice.zarr.zip")
    assert m == old_parse(raw, "twice.zarr.zip") and len(m.pages) == 750


def test_a_manifest_in_utf_16_is_refused_and_a_utf_8_bom_read() -> None:
    """json.loads read UTF-16 and UTF-32 too; decant writes UTF-8, as RFC 8259 asks."""
    text = one_page(2).decode()
    with pytest.raises(ManifestError, match=r"^u\.zarr\.zip: manifest is not UTF-8 JSON"):
        parse_manifest(text.encode("utf-16"), "u.zarr.zip")
    assert parse_manifest(text.encode("utf-8-sig"), "u.zarr.zip") == old_parse(
        text.encode(), "u.zarr.zip"
    )
