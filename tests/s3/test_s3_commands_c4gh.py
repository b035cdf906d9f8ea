"""`.tar.c4gh` packages in a real SeaweedFS bucket: the core and backend read them byte-exact (vs
the crypt4gh library's own decryption), and `decant c4gh ls|verify s3://…` answers as for the
local file, with the same exit statuses."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import obstore
import pytest
from crypt4gh import lib as c4gh_lib
from obstore.store import S3Store

from tests.s3.conftest import S3Bucket
from tests.toolbox import load_tool
from tests.unit.c4gh_helpers import SEG, backend, files
from vfs.c4gh.header import open_package
from vfs.cache import PageCache
from vfs.stores.s3 import S3Folder

Cli = Callable[..., tuple[int, str, str]]
corpus = load_tool("make_c4gh_corpus")
PARQUET = "allele-freq.chr{}.0.br10000000.00000000000000aa.parquet"


def crypt4gh_decrypt(data: bytes, secret: bytes) -> bytes:
    out = io.BytesIO()
    c4gh_lib.decrypt([(0, secret, None)], io.BytesIO(data), out)
    return out.getvalue()


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("c4s3")
    node, other, writer = (corpus.make_keypair(d, n) for n in ("node", "other", "writer"))
    members = corpus.gdi_members(parquet_rows=(150000, 900))  # ~5 MiB: more than one 4 MiB span
    corpus.write_package(d / "good.tar.c4gh", members, writer, [node])
    vcf = ("headers/00000000000000aa.vcf", b"##fileformat=VCFv4.3\n")
    p1 = (PARQUET.format(1), b"PAR1" + b"\x01" * 100)
    doc = json.loads(corpus.manifest([vcf, (p1[0], p1[1] + b"!"), ("gone.vcf", b"x")]))
    link = corpus.normalized_info("link", kind=tarfile.SYMTYPE)
    plain = corpus.build_tar([("manifest.json", json.dumps(doc).encode()), vcf, p1, link])
    (d / "bad.tar.c4gh").write_bytes(corpus.encrypt(plain, writer.secret, [node.public]))
    (d / "plain.bin").write_bytes(b"not a package" * 100)
    return SimpleNamespace(dir=d, node=node, other=other, writer=writer, members=members)


@pytest.fixture
def uploaded(s3_bucket: S3Bucket, pkgs: SimpleNamespace) -> dict[str, str]:
    store = S3Store(s3_bucket.name, client_options={"allow_http": True})  # endpoint from AWS_*
    urls = {}
    for name in ("good.tar.c4gh", "bad.tar.c4gh", "plain.bin"):
        obstore.put(store, s3_bucket.key(f"p/{name}"), (pkgs.dir / name).read_bytes())
        urls[name] = s3_bucket.url(f"p/{name}")
    return urls


def test_segment_reader_over_the_bucket_is_byte_exact(
    s3_bucket: S3Bucket, uploaded: dict[str, str], pkgs: SimpleNamespace
) -> None:
    data = (pkgs.dir / "good.tar.c4gh").read_bytes()
    expected = crypt4gh_decrypt(data, pkgs.node.secret)
    folder = S3Folder(s3_bucket.url("p"))
    _, rd = open_package(folder.open("good.tar.c4gh"), [pkgs.node.secret], PageCache(32 * SEG))
    with rd:
        assert rd.size == len(expected) > 64 * SEG
        assert rd.read(0, rd.size) == expected
        for off, n in [(0, 1), (SEG - 3, 7), (17 * SEG + 5, 3 * SEG), (rd.size - 10, 100)]:
            assert rd.read(off, n) == expected[off : off + n]


def test_backend_describe_at_and_open_at_the_bucket(
    s3_bucket: S3Bucket, uploaded: dict[str, str], pkgs: SimpleNamespace
) -> None:
    plain = crypt4gh_decrypt((pkgs.dir / "good.tar.c4gh").read_bytes(), pkgs.node.secret)
    folder = S3Folder(s3_bucket.url(""))
    be = backend(pkgs.node)
    desc = be.describe_at(folder, "p/good.tar.c4gh")
    assert desc == be.describe(pkgs.dir / "good.tar.c4gh")
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        expected = {m.name: plain[m.offset_data : m.offset_data + m.size] for m in tar}
    got = files(desc.root)
    assert set(got) == set(expected)
    for name, entry in got.items():
        handle = be.open_at(folder, "p/good.tar.c4gh", name, entry)
        data = b"".join(bytes(handle.read(o, 200_000)) for o in range(0, entry.size, 200_000))
        handle.close()
        assert data == expected[name], name


def _same(remote: tuple[int, str, str], local: tuple[int, str, str], url: str, path: Path):
    norm = [text.replace(url, "PKG").replace(str(path), "PKG") for text in remote[1:]]
    lnorm = [text.replace(str(path), "PKG") for text in local[1:]]
    assert (remote[0], norm) == (local[0], lnorm)


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("name", ["good.tar.c4gh", "bad.tar.c4gh"])
def test_ls_matches_the_local_file(
    uploaded: dict[str, str], pkgs: SimpleNamespace, decant_cli: Cli, name: str, long: bool
) -> None:
    key = pkgs.node.secret_path
    flags = ["-l"] if long else []
    remote = decant_cli("c4gh", "ls", *flags, uploaded[name], "--key", key)
    local = decant_cli("c4gh", "ls", *flags, pkgs.dir / name, "--key", key)
    assert remote[0] == 0 and remote[1]
    _same(remote, local, uploaded[name], pkgs.dir / name)


@pytest.mark.parametrize("name,status", [("good.tar.c4gh", 0), ("bad.tar.c4gh", 1)])
def test_verify_matches_the_local_file(
    uploaded: dict[str, str], pkgs: SimpleNamespace, decant_cli: Cli, name: str, status: int
) -> None:
    key = pkgs.node.secret_path
    remote = decant_cli("c4gh", "verify", uploaded[name], "--key", key)
    local = decant_cli("c4gh", "verify", pkgs.dir / name, "--key", key)
    assert remote[0] == status
    assert f"package: {uploaded[name]}" in remote[1]
    _same(remote, local, uploaded[name], pkgs.dir / name)
    if status:
        assert "problem: member 'link' not served: symbolic link" in remote[1]


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_refusals_are_usage_errors(
    s3_bucket: S3Bucket,
    uploaded: dict[str, str],
    pkgs: SimpleNamespace,
    decant_cli: Cli,
    command: str,
) -> None:
    key = pkgs.node.secret_path
    missing = s3_bucket.url("p/none.tar.c4gh")
    status, out, err = decant_cli("c4gh", command, missing, "--key", key)
    assert (status, out) == (2, "") and "none.tar.c4gh: no such key" in err
    status, _, err = decant_cli("c4gh", command, uploaded["plain.bin"], "--key", key)
    assert status == 2 and "not a crypt4gh file" in err
    other = pkgs.other.secret_path
    status, _, err = decant_cli("c4gh", command, uploaded["good.tar.c4gh"], "--key", other)
    assert status == 2 and "wrong key" in err
    status, _, err = decant_cli("c4gh", command, "s3://", "--key", key)
    assert status == 2 and "no bucket" in err
