"""TAR index against `tarfile`'s own listing, hostile members, truncation, and which segments an
index decrypts (only those holding headers)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.toolbox import load_tool
from vfs.c4gh.header import open_package
from vfs.c4gh.tarindex import BytesSource, build_index, shown_name, unsafe_reason
from vfs.cache import PageCache
from vfs.errors import UnsupportedFormatError

SEG = 65536


corpus = load_tool("make_c4gh_corpus")


def tarfile_listing(data: bytes) -> list[tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, m.offset_data, m.size) for m in tar.getmembers() if m.isreg()]


def listing(index) -> list[tuple[str, int, int]]:
    return [(m.name, m.offset, m.size) for m in index.members]


segment = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=60).filter(
    lambda s: s not in (".", "..")
)
member_sets = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from(["headers", "d1/d2", "x" * 90])),
        segment,
        st.integers(0, 5000),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda t: (t[0], t[1]),
)


@settings(max_examples=60, deadline=None)
@given(members=member_sets, fmt=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_index_matches_tarfile(members, fmt: int) -> None:
    entries = [
        (f"f-{leaf}" if folder is None else f"{folder}/f-{leaf}", os.urandom(size))
        for folder, leaf, size in members
    ]
    data = corpus.build_tar(entries, fmt)
    index = build_index(BytesSource(data), "gen.tar")
    assert index.complete and not index.dropped and not index.problems
    assert listing(index) == tarfile_listing(data)
    for m, (_, body) in zip(index.members, entries, strict=True):
        assert data[m.offset : m.offset + m.size] == body


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../escape", ".."),
        ("a/../../b", ".."),
        ("a//b", "component 2: empty name"),
        ("./a", "component 1: '.' names the folder itself"),
        ("a/./b", "component 2: '.'"),
        ("a/" + "x" * 256, "longer than 255 bytes (256)"),
        ("a/" + "é" * 128, "longer than 255 bytes (256)"),
        ("a\0b", "NUL"),
        ("d/" * 64 + "leaf", "65 levels deep (more than 64)"),
        ("a/\ud800", "not encodable"),
    ],
)
def test_unsafe_names(name: str, why: str) -> None:
    assert why in (unsafe_reason(name) or "")


@pytest.mark.parametrize(
    "name",
    ["manifest.json", "headers/a.vcf", "a..b", "..a/b..", "x" * 255, "d/" * 63 + "leaf", "\udcff"],
)
def test_safe_names(name: str) -> None:
    assert unsafe_reason(name) is None


def test_hostile_members_are_dropped_and_the_rest_kept() -> None:
    good = [("manifest.json", b"{}"), ("headers/a.vcf", b"##\n")]
    data = corpus.build_tar([*good, *corpus.hostile_entries(), ("z.parquet", b"PAR1")])
    index = build_index(BytesSource(data), "bad.tar")
    assert [m.name for m in index.members] == ["manifest.json", "headers/a.vcf", "z.parquet"]
    reasons = dict(index.dropped)
    assert set(reasons) == {
        "../escape",
        "/etc/absolute",
        "ok/../../twice",
        "link-to-manifest",
        "hard-link",
        "null-device",
        "headers",
    }
    assert "symbolic link" in reasons["link-to-manifest"]
    assert "hard link" in reasons["hard-link"]
    assert "device" in reasons["null-device"]


def test_duplicates_and_file_folder_clashes() -> None:
    data = corpus.build_tar([("a", b"1"), ("a", b"2"), ("a/b", b"3"), ("c/d", b"4"), ("c", b"5")])
    index = build_index(BytesSource(data), "dup.tar")
    assert [(m.name, data[m.offset : m.offset + m.size]) for m in index.members] == [
        ("a", b"1"),
        ("c/d", b"4"),
    ]
    assert [name for name, _ in index.dropped] == ["a", "a/b", "c"]


def test_truncated_tar_exposes_complete_members() -> None:
    entries = [(f"m{i}", os.urandom(3000 + i)) for i in range(8)]
    data = corpus.build_tar(entries)
    for cut in (700, 9000, 15000, len(data) - 2000):
        index = build_index(BytesSource(data[:cut]), "cut.tar")
        complete = [t for t in tarfile_listing(data) if t[1] + t[2] <= cut]
        assert listing(index) == complete
        assert not index.complete and index.problems


def test_oversized_long_name_record_is_refused_without_reading_it() -> None:
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, 64 << 20
    data = info.tobuf(tarfile.GNU_FORMAT) + bytes(4096)
    index = build_index(BytesSource(data), "long.tar")
    assert index.members == [] and "larger than" in index.problems[0]


def test_index_decrypts_only_header_segments(tmp_path: Path) -> None:
    entries = [("manifest.json", b"{}")] + [(f"big{i}", os.urandom(150_000)) for i in range(4)]
    data = corpus.build_tar(entries)
    node, writer = corpus.make_keypair(tmp_path, "node"), corpus.make_keypair(tmp_path, "writer")
    path = tmp_path / "p.tar.c4gh"
    path.write_bytes(corpus.encrypt(data, writer.secret, [node.public]))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        infos = tar.getmembers()
    header_blocks = {m.offset // SEG for m in infos} | {(m.offset_data - 1) // SEG for m in infos}
    end = infos[-1].offset_data + -(-infos[-1].size // 512) * 512
    expected = header_blocks | {end // SEG}
    _, reader = open_package(path, [node.secret], PageCache(64 * SEG))
    with reader:
        index = build_index(reader, path.name)
        assert listing(index) == tarfile_listing(data)
        assert reader.stats.decrypted == len(expected) < -(-len(data) // SEG)


# -- hostile names, depth and counts -------------------------------------------------------


def hostile_tar() -> bytes:
    good = [("manifest.json", b"{}"), ("headers/a.vcf", b"##\n")]
    bad = [*corpus.nul_name_members().values(), *corpus.overlong_members(500).values()]
    return corpus.raw_tar([*good, *bad, *corpus.edge_name_tar_items(), ("z.parquet", b"PAR1")])


def test_names_cut_at_a_nul_are_dropped_not_shortened() -> None:
    index = build_index(BytesSource(hostile_tar()), "nul.tar")
    reasons = dict(index.dropped)
    for written in corpus.nul_name_members():
        assert reasons[written] == "contains a NUL byte", written
    served = {m.name for m in index.members}
    assert not served & {"cut", "dir/in-prefix", "L" * 120, "pax-é", "dir", "pax-é\0evil"}
    with tarfile.open(fileobj=io.BytesIO(hostile_tar())) as tar:  # what tarfile alone shows
        assert {"cut", "dir/in-prefix", "L" * 120} <= set(tar.getnames())


def test_overlong_and_deep_names_are_dropped_and_edge_names_served() -> None:
    data = hostile_tar()
    index = build_index(BytesSource(data), "long.tar")
    reasons = {shown_name(name): why for name, why in index.dropped}
    expected = {
        **{shown_name(n): "contains a NUL byte" for n in corpus.nul_name_members()},
        shown_name("x" * 256): "longer than 255 bytes (256)",
        "é" * 128: "longer than 255 bytes (256)",
        shown_name(f"long/{'y' * 300}/leaf"): "component 2: longer than 255 bytes (300)",
        shown_name("d/" * 500 + "deep.txt"): "501 levels deep (more than 64)",
    }
    assert reasons == expected
    assert all(len(name) < 200 for name, _ in index.dropped)  # logged names are shortened
    by_name = {os.fsencode(m.name): m for m in index.members}
    edge = corpus.edge_name_members()
    assert set(by_name) == {b"manifest.json", b"headers/a.vcf", b"z.parquet", *edge}
    for raw, body in edge.items():
        m = by_name[raw]
        assert data[m.offset : m.offset + m.size] == body
    assert index.complete and not index.problems


def test_depth_limit_is_a_parameter() -> None:
    data = corpus.raw_tar([("a/b/c", b"3"), ("a/b", b"2"), ("x", b"1")])
    index = build_index(BytesSource(data), "d.tar", max_depth=2)
    assert [m.name for m in index.members] == ["a/b", "x"]
    assert index.dropped == [("a/b/c", "3 levels deep (more than 2)")]


def test_too_many_members_refuse_the_package() -> None:
    one = corpus.raw_member(b"same", b"")
    ok = build_index(BytesSource(one * 10 + bytes(1024)), "ten.tar", max_members=10)
    assert ok.complete and len(ok.members) == 1 and len(ok.dropped) == 9
    with pytest.raises(UnsupportedFormatError, match=r"^eleven\.tar: more than 10 TAR members"):
        build_index(BytesSource(one * 11 + bytes(1024)), "eleven.tar", max_members=10)


def test_the_default_member_limit_is_100000() -> None:
    one = corpus.raw_member(b"same", b"")
    data = one * 100_001 + bytes(1024)
    with pytest.raises(UnsupportedFormatError, match=r"many\.tar: more than 100000 TAR members"):
        build_index(BytesSource(data), "many.tar")


def test_too_many_name_characters_refuse_the_package() -> None:
    data = corpus.raw_tar([(f"{i:03d}-" + "n" * 96, b"") for i in range(10)])
    assert len(build_index(BytesSource(data), "n.tar", max_name_chars=1000).members) == 10
    with pytest.raises(UnsupportedFormatError, match=r"^n\.tar: member names add up to more"):
        build_index(BytesSource(data), "n.tar", max_name_chars=999)


def test_too_many_implied_folders_refuse_the_package() -> None:
    """Red team 57 F1: members each under folders of their own, deep, within every other
    bound, made millions of folder nodes (5-7 GB in the daemon). 40 members 10 deep: 400."""
    deep = [("/".join(f"t{i}-{d}" for d in range(10)) + "/m", b"") for i in range(40)]
    data = corpus.raw_tar(deep)
    assert len(build_index(BytesSource(data), "d.tar", max_folders=400).members) == 40
    with pytest.raises(UnsupportedFormatError, match=r"^d\.tar: member paths imply more than 399"):
        build_index(BytesSource(data), "d.tar", max_folders=399)


def test_the_default_folder_limit_holds_a_deep_package_to_megabytes() -> None:
    """2,000 members 63 folders deep, each under a top folder of its own (126,000 folders):
    refused at the 100,000th folder, the walk's traced peak a few tens of MB."""
    import tracemalloc

    names = [("/".join([f"{i:05d}", *["d"] * 62, "m.bin"]), b"") for i in range(2000)]
    data = corpus.raw_tar(names)
    tracemalloc.start()
    try:
        with pytest.raises(UnsupportedFormatError, match="more than 100000 folders"):
            build_index(BytesSource(data), "deep.tar")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - len(data) < 64 << 20, f"peak {peak >> 20} MiB"


@pytest.mark.parametrize("count", [9, 3000])
def test_long_extension_header_chains_stop_the_walk(count: int) -> None:
    """tarfile recurses once per extension header: 3,000 of them once overflowed the stack."""
    pax = tarfile.TarInfo("././@PaxHeader")
    record = b"13 comment=x\n"
    pax.type, pax.size = tarfile.XHDTYPE, len(record)
    chunk = pax.tobuf(tarfile.USTAR_FORMAT) + record + bytes(512 - len(record))
    data = corpus.raw_tar([("first", b"1"), chunk * count + corpus.member_bytes("late", b"2")])
    index = build_index(BytesSource(data), "chain.tar")
    assert [m.name for m in index.members] == ["first"]
    assert "more than 8 extension headers" in index.problems[0]


def test_a_few_extension_headers_are_fine() -> None:
    gnu = corpus.gnu_long_member(b"g" * 200 + b"/leaf", b"gnu")
    pax = corpus.member_bytes("p" * 150 + "é", b"pax", tarfile.PAX_FORMAT)
    data = corpus.raw_tar([gnu, pax])
    index = build_index(BytesSource(data), "ok.tar")
    assert [(m.name, data[m.offset : m.offset + m.size]) for m in index.members] == [
        ("g" * 200 + "/leaf", b"gnu"),
        ("p" * 150 + "é", b"pax"),
    ]
    assert index.complete and not index.dropped and not index.problems


def test_any_long_name_record_cut_at_a_nul_drops_the_member() -> None:
    """tarfile uses the first of two GNU long-name records; a cut second one is still refused."""

    def long_name(record: bytes) -> bytes:
        header = corpus.raw_header(b"././@LongLink", len(record), tarfile.GNUTYPE_LONGNAME)
        return header + record + bytes(-len(record) % 512)

    chained = long_name(b"first-name\0") + long_name(b"second\0evil")
    data = corpus.raw_tar([chained + corpus.raw_member(b"placeholder", b"x"), ("ok", b"1")])
    index = build_index(BytesSource(data), "two.tar")
    assert [m.name for m in index.members] == ["ok"]
    assert index.dropped == [("second\0evil", "contains a NUL byte")]
