"""C4ghBackend on bad packages: each is refused with a DecantError naming it, or served in part.

Which members survive is computed from the plaintext with `tarfile` and file-size arithmetic.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import tarfile
from functools import partial
from types import SimpleNamespace

import pytest

from tests.toolbox import load_tool
from tests.unit.c4gh_helpers import SEG, backend, files
from vfs.backends import c4gh as c4gh_backend
from vfs.backends.base import mode_mask_of
from vfs.backends.c4gh import C4ghBackend, add_mount_options, backend_from_args
from vfs.c4gh import tarindex
from vfs.c4gh.verify import verify_package
from vfs.cache import PageCache
from vfs.errors import (
    CorruptArchiveError,
    DecantError,
    DecryptError,
    NotAnArchiveError,
    UnsupportedFormatError,
)
from vfs.mount.index import DescriptionIndex
from vfs.mount.tree import SourceTree, index_key

corpus = load_tool("make_c4gh_corpus")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("c4gh")
    k = SimpleNamespace(**{n: corpus.make_keypair(d, n) for n in ("node", "other", "writer")})
    members = corpus.gdi_members(parquet_rows=(12000, 900))
    one = d / "one.tar.c4gh"
    plain = corpus.write_package(one, members, k.writer, [k.node])
    return SimpleNamespace(dir=d, keys=k, members=members, plain=plain, one=one)


@pytest.mark.parametrize(
    ("make", "error", "reason"),
    [
        (lambda e: corpus.not_crypt4gh(), NotAnArchiveError, "bad magic"),
        (lambda e: corpus.header_past_eof(), CorruptArchiveError, "runs past the end"),
        (
            lambda e: b"crypt4gh" + (2).to_bytes(4, "little") + bytes(8),
            UnsupportedFormatError,
            "version 2",
        ),
        (lambda e: e.one.read_bytes()[:10], CorruptArchiveError, "preamble runs past"),
        (lambda e: b"", CorruptArchiveError, "preamble runs past"),
    ],
)
def test_unservable_packages_raise_a_decant_error(env, tmp_path, make, error, reason) -> None:
    path = tmp_path / "bad.tar.c4gh"
    path.write_bytes(make(env))
    with pytest.raises(DecantError) as info:
        backend(env.keys.node).describe(path)
    assert isinstance(info.value, error)
    assert "bad.tar.c4gh" in str(info.value) and reason in str(info.value)


def test_wrong_key(env) -> None:
    with pytest.raises(DecryptError, match=r"one\.tar\.c4gh: .*wrong key"):
        backend(env.keys.other).describe(env.one)


def test_tampered_segment_gives_eio_only_where_it_is_touched(env, tmp_path) -> None:
    path = tmp_path / "tampered.tar.c4gh"
    path.write_bytes(corpus.tamper(env.one.read_bytes(), 2))
    be = backend(env.keys.node)
    tree = files(be.describe(path).root)
    name, data = env.members[3]  # the big parquet member spans segment 2
    entry = tree[name]
    start = entry.locator["offset"]
    handle = be.open(path, name, entry)
    inside = 2 * SEG - start + 10
    with pytest.raises(CorruptArchiveError) as info:
        handle.read(inside, 100)
    assert info.value.errno == 5  # EIO
    assert handle.read(0, 100) == data[:100]
    assert handle.read(3 * SEG - start, 100) == data[3 * SEG - start : 3 * SEG - start + 100]
    for other, body in env.members[:3]:
        assert be.open(path, other, tree[other]).read(0, 1 << 20) == body


def test_truncated_package_serves_complete_members(env, tmp_path, caplog) -> None:
    data = env.one.read_bytes()
    path = tmp_path / "cut.tar.c4gh"
    path.write_bytes(data[: len(data) // 2])
    hlen = corpus.header_len_of(data)
    readable = (len(data) // 2 - hlen) // (SEG + 28) * SEG  # whole segments left on disk
    with tarfile.open(fileobj=io.BytesIO(env.plain)) as tar:
        complete = {m.name for m in tar.getmembers() if m.offset_data + m.size <= readable}
    be = backend(env.keys.node)
    with caplog.at_level(logging.WARNING):
        tree = files(be.describe(path).root)
    assert set(tree) == complete and len(complete) < len(env.members)
    assert "not serving" in caplog.text or "no end-of-archive" in caplog.text
    for name, body in env.members:
        if name in tree:
            assert be.open(path, name, tree[name]).read(0, 1 << 22) == body


def test_unsafe_members_are_not_served(env, tmp_path, caplog) -> None:
    path = tmp_path / "unsafe.tar.c4gh"
    corpus.write_package(
        path, [*env.members, *corpus.hostile_entries()], env.keys.writer, [env.keys.node]
    )
    with caplog.at_level(logging.WARNING):
        desc = backend(env.keys.node).describe(path)
    assert set(files(desc.root)) == {name for name, _ in env.members}
    assert set(desc.root.children) == {"manifest.json", "headers"} | {
        n for n, _ in env.members if "/" not in n
    }
    for dropped in ("../escape", "/etc/absolute", "link-to-manifest", "hard-link", "null-device"):
        assert repr(dropped) in caplog.text


def test_replaced_package_never_serves_old_bytes(env, tmp_path) -> None:
    path = tmp_path / "swap.tar.c4gh"
    first = [("manifest.json", b'{"v": 1}'), ("data.bin", b"A" * 100_000)]
    second = [("manifest.json", b'{"v": 2}'), ("data.bin", b"B" * 100_000)]
    be = backend(env.keys.node)
    corpus.write_package(path, first, env.keys.writer, [env.keys.node])
    entry = be.describe(path).root.children["data.bin"]
    assert be.open(path, "data.bin", entry).read(0, 10) == b"A" * 10
    corpus.write_package(path, second, env.keys.writer, [env.keys.node])
    os.utime(path, ns=(0, 10**18))  # a new mtime even on a coarse clock
    entry = be.describe(path).root.children["data.bin"]
    assert be.open(path, "data.bin", entry).read(0, 10) == b"B" * 10


# -- hostile shapes: depth, names, counts ------------------------------------------------


def write_raw(path, items, env) -> bytes:
    """Encrypt a hand-built TAR (raw member bytes allowed) to the node key."""
    plain = corpus.raw_tar(items)
    path.write_bytes(corpus.encrypt(plain, env.keys.writer.secret, [env.keys.node.public]))
    return plain


def test_a_500_deep_member_is_dropped_and_the_tree_is_indexed(env, tmp_path, caplog) -> None:
    """The package that once overflowed the stack while its description went into the index."""
    src = tmp_path / "src"
    src.mkdir()
    deep = "d/" * 500 + "deep.txt"
    write_raw(src / "deep.tar.c4gh", [*env.members, (deep, b"deep\n")], env)
    be = backend(env.keys.node)
    index = DescriptionIndex(tmp_path / "index" / "descriptions.sqlite")
    tree = SourceTree(src, [be], index=index)
    with caplog.at_level(logging.WARNING):
        shown = tree.scan(src)
    node = shown["deep.tar.c4gh"]
    assert node.is_dir and node.entry is None  # its tree is kept by the tree's LRU
    root = tree.tree_of(node)
    assert set(files(root)) == {n for n, _ in env.members}
    (line,) = [r.getMessage() for r in caplog.records if "not serving" in r.getMessage()]
    assert line.startswith("deep.tar.c4gh: not serving 1 member(s): 'd/d/d/")
    assert "501 levels deep (more than 64)" in line and len(line) < 400
    stored = index.get(src / "deep.tar.c4gh", index_key(be), *stamp(src / "deep.tar.c4gh"))
    assert stored is not None and stored.root == root
    index.close()


def stamp(path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def test_nul_and_overlong_names_are_dropped_and_edge_names_served(env, tmp_path, caplog) -> None:
    path = tmp_path / "names.tar.c4gh"
    bad = [*corpus.nul_name_members().values(), *corpus.overlong_members(500).values()]
    edge = corpus.edge_name_members()
    listed = corpus.with_manifest(
        [*env.members[1:], *((os.fsdecode(n), d) for n, d in edge.items())]
    )
    write_raw(path, [*listed[: len(env.members)], *bad, *corpus.edge_name_tar_items()], env)
    be = backend(env.keys.node)
    with caplog.at_level(logging.WARNING):
        desc = be.describe(path)
    tree = {os.fsencode(k): v for k, v in files(desc.root).items()}
    assert set(tree) == {n.encode() for n, _ in env.members} | set(edge)
    for raw, body in [*((n.encode(), d) for n, d in env.members[1:]), *edge.items()]:
        assert be.open(path, os.fsdecode(raw), tree[raw]).read(0, 1 << 22) == body
    assert b"cut" not in tree and "pax-é".encode() not in tree  # never the part before a NUL
    (line,) = [r.getMessage() for r in caplog.records if "not serving" in r.getMessage()]
    assert line.startswith("names.tar.c4gh: not serving 8 member(s): ")
    assert "'cut\\x00evil': contains a NUL byte" in line and len(line) < 2000


def test_too_many_members_refuse_the_package(env, tmp_path, monkeypatch) -> None:
    path = tmp_path / "many.tar.c4gh"
    write_raw(path, [(f"m{i}", b"") for i in range(11)], env)
    monkeypatch.setattr(c4gh_backend, "build_index", partial(tarindex.build_index, max_members=10))
    with pytest.raises(UnsupportedFormatError, match=r"^many\.tar\.c4gh: more than 10 TAR"):
        backend(env.keys.node).describe(path)


def test_the_log_names_at_most_50_dropped_members(env, tmp_path, caplog) -> None:
    path = tmp_path / "dups.tar.c4gh"
    write_raw(path, [("manifest.json", b"{}"), *[("same", b"1")] * 200], env)
    with caplog.at_level(logging.WARNING):
        desc = backend(env.keys.node).describe(path)
    assert set(desc.root.children) == {"manifest.json", "same"}
    (line,) = [r.getMessage() for r in caplog.records if "not serving" in r.getMessage()]
    assert "not serving 199 member(s)" in line and line.endswith("; and 149 more")
    assert line.count("'same': duplicate") == 50


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_mount_options(p)
    return p


@pytest.mark.parametrize(("given", "mask"), [([], 0o440), (["--c4gh-mode", "0444"], 0o444),
                                             (["--c4gh-mode", "440"], 0o440),
                                             (["--c4gh-mode", "0o550"], 0o550),
                                             (["--c4gh-mode", "0"], 0)])  # fmt: skip
def test_c4gh_mode_option(env, given: list[str], mask: int) -> None:
    args = parser().parse_args(["--c4gh-key", str(env.keys.node.secret_path), *given])
    be = backend_from_args(args, PageCache(SEG))
    assert be is not None and be.mode_mask == mask
    assert mode_mask_of(be) == mask


@pytest.mark.parametrize("bad", ["0640", "0644", "4440", "rw", "0x1ff", "-1"])
def test_c4gh_mode_refuses_write_special_and_non_octal(bad: str, capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--c4gh-mode", bad])
    assert "--c4gh-mode" in capsys.readouterr().err
    with pytest.raises(ValueError, match="bits other than read and search"):
        C4ghBackend([], PageCache(SEG), mode_mask=0o640)


def test_a_deeply_nested_manifest_refuses_the_package(env, tmp_path) -> None:
    """It cost the members their digests, and they were served unchecked: segments reordered
    into a manifest can make it unparsable so (red team 57), so the package is refused."""
    path = tmp_path / "nested.tar.c4gh"
    nested = b"[" * 100_000 + b"]" * 100_000  # json's decoder recurses once per level
    write_raw(path, [("manifest.json", nested), *env.members[1:]], env)
    with pytest.raises(CorruptArchiveError, match="nested too deeply"):
        backend(env.keys.node).describe(path)
    report = verify_package(path, [env.keys.node.secret])
    assert "manifest.json is not valid JSON (JSON nested too deeply)" in report.problems


def test_a_manifest_of_nested_values_is_not_parsed(env, tmp_path) -> None:
    """12 MiB of `[[[…]]]` 400 deep, within the manifest's byte limit and the decoder's depth:
    parsed, it cost ~580 MiB of memory (48 bytes a byte). Counted first, it is not parsed, and
    the package is refused (its members cannot be checked)."""
    import tracemalloc

    path = tmp_path / "values.tar.c4gh"
    nested = b"[" + b",".join([b"[" * 400 + b"]" * 400] * 15_000) + b"]"
    write_raw(path, [("manifest.json", nested), *env.members[1:]], env)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptArchiveError, match="could take"):
            backend(env.keys.node).describe(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20, f"peak {peak >> 20} MiB"


def test_a_manifest_made_unparsable_by_a_segment_moved_into_it_refuses_the_package(
    env, tmp_path
) -> None:
    """Red team 57 F2: with no key, a segment of digits (from a numeric member) moved into the
    manifest made one of its numbers 65,540 digits long; Python refuses to convert it (a
    ValueError, not a JSONDecodeError), the package was served with no member digests, and
    segments then swapped inside a member were served as its bytes without an error."""
    digits = b"7" * (SEG + 10)
    manifest = b'{"n": ' + digits + b', "payload": {"algorithm": "sha256", "members": {}}}'
    path = tmp_path / "digits.tar.c4gh"
    write_raw(path, [("manifest.json", manifest), *env.members[1:]], env)
    with pytest.raises(CorruptArchiveError, match="cannot be parsed"):
        backend(env.keys.node).describe(path)


@pytest.mark.parametrize(
    "payload",
    [
        b"[]",
        b'{"members": []}',
        b'{"members": {"a.parquet": {"sha256": "00"}}}',
        b'{"members": {"a.parquet": "0"}}',
    ],
)
def test_a_payload_that_is_not_a_map_of_digests_refuses_the_package(
    env, tmp_path, payload: bytes
) -> None:
    """A payload the spec's schema would refuse checks nothing: not served unchecked."""
    path = tmp_path / "payload.tar.c4gh"
    write_raw(path, [("manifest.json", b'{"payload": ' + payload + b"}"), *env.members[1:]], env)
    with pytest.raises(CorruptArchiveError, match="not a map of sha256 digests"):
        backend(env.keys.node).describe(path)


def test_a_manifest_too_large_to_read_refuses_the_package(env, tmp_path, monkeypatch) -> None:
    """Red team 65 F1: a manifest padded past the limit was not read, and the package was
    served with no member digests: segments swapped inside a member, with no key, were served
    as its bytes without an error or a log line."""
    monkeypatch.setattr("vfs.backends.c4gh.MAX_MANIFEST", 4096)
    doc = json.loads(env.members[0][1])
    doc["notes"] = "x" * 5000
    path = tmp_path / "padded.tar.c4gh"
    write_raw(path, [("manifest.json", json.dumps(doc).encode()), *env.members[1:]], env)
    with pytest.raises(CorruptArchiveError, match=r"manifest\.json is \d+ bytes, more than 4096"):
        backend(env.keys.node).describe(path)


def test_a_manifest_with_no_payload_serves_its_members_unchecked(env, tmp_path) -> None:
    """The spec makes payload optional: such a package is served, its members without digests."""
    path = tmp_path / "bare.tar.c4gh"
    write_raw(path, [("manifest.json", b'{"config": {}}'), *env.members[1:]], env)
    tree = files(backend(env.keys.node).describe(path).root)
    assert set(tree) == {n for n, _ in env.members}
    assert all("user.c4gh.sha256" not in e.xattrs for e in tree.values())


def test_a_package_whose_leading_segments_were_dropped_is_refused(env, tmp_path) -> None:
    """Red team 46b: with no key, anyone who may read a package can drop its first segments so
    that it starts at a later member's TAR header (one on a 64 KiB boundary): every segment
    left authenticates, and with manifest.json gone nothing checked the members. Two segments
    of `b.bin` swapped as well were served as its bytes, with no error and no log line."""
    data = os.urandom(4 * SEG)
    plain = corpus.build_tar(corpus.member_at_segment(2, data))
    whole = corpus.encrypt(plain, env.keys.writer.secret, [env.keys.node.public])
    (tmp_path / "legit.tar.c4gh").write_bytes(whole)
    evil = tmp_path / "evil.tar.c4gh"
    evil.write_bytes(corpus.segments_dropped(whole, 2, swap=(1, 2)))
    be = backend(env.keys.node)
    legit = files(be.describe(tmp_path / "legit.tar.c4gh").root)
    assert be.open(tmp_path / "legit.tar.c4gh", "b.bin", legit["b.bin"]).read(0, 1 << 20) == data
    with pytest.raises(CorruptArchiveError, match=r"first member 'b\.bin', not manifest\.json"):
        be.describe(evil)
    assert verify_package(evil, [env.keys.node.secret]).problems  # as `decant c4gh verify` says


@pytest.mark.parametrize("before", ["../escape.bin", "/abs.bin", "a\\b"])
def test_a_package_whose_first_member_is_dropped_before_its_manifest_is_refused(
    env, tmp_path, before
) -> None:
    """The manifest-first rule looks at the first TAR header, not the first member served:
    a member whose name the mount drops (`..`, absolute) and then a manifest.json is not a
    package that starts with its manifest (stop 46 let it through)."""
    members = corpus.with_manifest([("b.bin", b"B" * 100)])
    package = tmp_path / "p.tar.c4gh"
    plain = corpus.build_tar([(before, b"x" * 10), *members])
    package.write_bytes(corpus.encrypt(plain, env.keys.writer.secret, [env.keys.node.public]))
    with pytest.raises(CorruptArchiveError, match=r"first member .*, not manifest\.json"):
        backend(env.keys.node).describe(package)
    assert verify_package(package, [env.keys.node.secret]).problems
