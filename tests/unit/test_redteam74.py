"""Red team 74: hostile GDI packages in a folder many users share.

F1: extension headers that cost tarfile far more than their bytes; F2: what the daemon kept of
every package name it saw; F3: one user's changed package emptying everyone's decrypted cache;
F4: a first member named manifest.json that is no file, and members the payload does not list.
"""

from __future__ import annotations

import os
import tarfile
from types import SimpleNamespace

import pytest

from tests.toolbox import load_tool
from tests.unit.c4gh_helpers import backend, files
from vfs.backends import c4gh as c4gh_backend
from vfs.c4gh import segments
from vfs.c4gh.tarindex import BytesSource, build_index
from vfs.errors import CorruptArchiveError, UnsupportedFormatError

corpus = load_tool("make_c4gh_corpus")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("c4gh74")
    keys = SimpleNamespace(**{n: corpus.make_keypair(d, n) for n in ("node", "writer")})
    return SimpleNamespace(dir=d, keys=keys)


def _pax(records: bytes) -> bytes:
    head = corpus.raw_header(b"././@PaxHeader", len(records), tarfile.XHDTYPE)
    return head + records + b"\0" * (-len(records) % 512)


def test_pax_records_beyond_what_a_package_is_read_with_refuse_it() -> None:
    """F1: each member after 64 KiB of 6-byte PAX records (~11,000 records): tarfile parsed
    them at ~1 us each, 18 s of the daemon's CPU for a 100 MB package, every listing of its
    folder waiting. Refused within the first members now."""
    records = b"6 a=b\n" * (65000 // 6)
    members = [_pax(records) + corpus.raw_member(f"f{i}".encode(), b"x") for i in range(20)]
    plain = corpus.raw_tar([corpus.member_bytes("manifest.json", b"{}"), *members])
    with pytest.raises(UnsupportedFormatError, match=r"PAX records .* package not served"):
        build_index(BytesSource(plain), "pax.tar.c4gh")


def test_a_few_pax_records_a_member_are_read() -> None:
    records = b"13 comment=x\n"  # tarfile writes a path record for a long name
    members = [_pax(records) + corpus.raw_member(f"g{i}".encode(), b"x") for i in range(300)]
    plain = corpus.raw_tar([corpus.member_bytes("manifest.json", b"{}"), *members])
    assert len(build_index(BytesSource(plain), "ok.tar.c4gh").members) == 301


def _package(env: SimpleNamespace, name: str, items: list) -> os.PathLike:
    path = env.dir / name
    plain = corpus.raw_tar(items)
    path.write_bytes(corpus.encrypt(plain, env.keys.writer.secret, [env.keys.node.public]))
    return path


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.DIRTYPE])
def test_a_first_member_named_manifest_that_is_no_file_refuses_the_package(
    env: SimpleNamespace, kind: bytes
) -> None:
    """F4: a link or a folder named manifest.json first: the rule "manifest first" held by
    name, no digests were read, and every member was served unchecked."""
    fake = corpus.raw_header(b"manifest.json", 0, kind)
    path = _package(env, f"fake-{kind.decode()}.tar.c4gh", [fake, ("a.bin", b"a" * 1000)])
    with pytest.raises(CorruptArchiveError, match=r"manifest\.json is not a file"):
        backend(env.keys.node).describe(path)


def test_a_member_the_payload_does_not_list_is_not_served(
    env: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    """F4: with payload.members empty (or missing a member) the member was served with no
    digest to check it against; the spec lists every member but the manifest."""
    listed = [("a.bin", b"a" * 1000)]
    items = [*corpus.with_manifest(listed), ("b.bin", b"b" * 1000)]
    path = _package(env, "unlisted.tar.c4gh", items)
    desc = backend(env.keys.node).describe(path)
    assert set(files(desc.root)) == {"manifest.json", "a.bin"}
    assert "'b.bin': not listed in the manifest's payload" in caplog.text


def test_sessions_and_counts_are_kept_for_the_latest_packages_only(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F2: each package name a user made and listed kept its session and its count for the
    daemon's life (with its long path: ~17 KB a name)."""
    monkeypatch.setattr(c4gh_backend, "SESSIONS_KEPT", 3, raising=False)
    monkeypatch.setattr(segments, "PACKAGES_COUNTED", 3, raising=False)
    be = backend(env.keys.node)
    items = corpus.with_manifest([("a.bin", b"a" * 100)])
    paths = [_package(env, f"p{i}.tar.c4gh", items) for i in range(6)]
    for path in paths:
        be.describe(path)
    assert list(be._sessions) == [str(p) for p in paths[-3:]]
    assert list(be.stats.per_package) == [str(p) for p in paths[-3:]]


def test_a_changed_package_frees_only_its_own_cached_segments(env: SimpleNamespace) -> None:
    """F3: any user touching a package of theirs emptied every other user's decrypted cache."""
    be = backend(env.keys.node)
    items = corpus.with_manifest([("a.bin", os.urandom(200_000))])
    mine, theirs = (_package(env, f"{n}.tar.c4gh", items) for n in ("mine", "theirs"))
    for path in (mine, theirs):
        entry = files(be.describe(path).root)["a.bin"]
        assert len(be.open(path, "a.bin", entry).read(0, 200_000)) == 200_000

    def held(path: os.PathLike) -> int:
        return sum(1 for k in be.cache._data if k[:2] == ("c4gh", str(path)))

    before = held(theirs)
    assert before and held(mine)
    os.utime(mine, ns=(1, 1))  # another version of it: its session is read again
    be.describe(mine)
    assert held(theirs) == before


def test_what_the_tree_remembers_of_names_it_logged_does_not_hold_the_names(
    tmp_path: os.PathLike, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F2: each name a user made in a deep folder (paths of ~3.4 KB) was kept whole by the
    log-once set and the failed-archives map for the daemon's life: ~7 KB a name."""
    import logging
    import tracemalloc

    from vfs.mount import tree as tree_module

    silent = logging.getLogger("decant-mount.test-silent")
    silent.disabled = True  # pytest keeps every record it captures: not what is measured
    monkeypatch.setattr(tree_module, "log", silent)
    tree = tree_module.SourceTree(tmp_path, [])
    deep = "d/" * 1700
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            tree._log_once(tmp_path / f"{deep}{i}.tar.c4gh", "not an archive: shown raw")
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"{kept / 2**20:.1f} MiB kept for 2,000 names"


def test_a_global_pax_header_ends_the_walk() -> None:
    """Red team 77, F2: tarfile applies a global PAX header's records to every later member,
    copying them each time: 56,000 keys in 8 global headers held every `ls` of the package's
    folder 44 s. The spec's packages have none; the walk stops at one."""
    records = b"".join(b"%d k%05d=v\n" % (len(b"k00000=v\n") + 3, i) for i in range(2000))
    head = corpus.raw_header(b"././@GlobalHead", len(records), tarfile.XGLTYPE)
    glob = head + records + b"\0" * (-len(records) % 512)
    members = [corpus.raw_member(f"f{i}".encode(), b"x") for i in range(50)]
    plain = corpus.raw_tar([corpus.member_bytes("manifest.json", b"{}"), glob, *members])
    index = build_index(BytesSource(plain), "global.tar.c4gh")
    assert [m.name for m in index.members] == ["manifest.json"]
    assert "global PAX header" in index.problems[0]


def test_a_package_whose_walk_found_no_member_says_why(env: SimpleNamespace) -> None:
    head = corpus.raw_header(b"././@GlobalHead", 12, tarfile.XGLTYPE)
    glob = head + b"12 k00000=v\n" + b"\0" * 500
    path = _package(env, "global-first.tar.c4gh", [glob, *corpus.with_manifest([("a", b"a")])])
    with pytest.raises(CorruptArchiveError, match=r"no member \(global PAX header at 0;"):
        backend(env.keys.node).describe(path)
