"""C4ghBackend on bad packages: each is refused with a DecantError naming it, or served in part.

Which members survive is computed from the plaintext with `tarfile` and file-size arithmetic.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
from types import SimpleNamespace

import pytest

from tests.toolbox import load_tool
from tests.unit.c4gh_helpers import SEG, backend, files
from vfs.errors import (
    CorruptArchiveError,
    DecantError,
    DecryptError,
    NotAnArchiveError,
    UnsupportedFormatError,
)

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
