"""`decant c4gh verify` / `ls`: a good package passes, a bad one lists every problem."""

from __future__ import annotations

import argparse
import hashlib
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.toolbox import load_tool
from vfs.c4gh.verify import check_layout, check_manifest, verify_package
from vfs.commands import c4gh as c4gh_command

corpus = load_tool("make_c4gh_corpus")
PARQUET = "allele-freq.chr{}.0.br10000000.00000000000000aa.parquet"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="decant")
    c4gh_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("verify")
    node, writer = corpus.make_keypair(d, "node"), corpus.make_keypair(d, "writer")
    members = corpus.gdi_members(parquet_rows=(4000, 500))
    corpus.write_package(d / "good.tar.c4gh", members, writer, [node])
    return SimpleNamespace(dir=d, node=node, writer=writer, members=members)


def test_good_package_passes(env) -> None:
    report = verify_package(env.dir / "good.tar.c4gh", [env.node.secret])
    assert report.problems == []
    assert report.writer_fingerprint == "sha256:" + hashlib.sha256(env.writer.public).hexdigest()
    assert [m.name for m in report.members] == [name for name, _ in env.members]


def write_bad_package(env: SimpleNamespace) -> tuple[Path, list[tuple[str, bytes]]]:
    """A package breaking every rule `verify` checks: its path and the payload members
    p2, p3 (whose problems name them)."""
    vcf = ("headers/00000000000000aa.vcf", b"##fileformat=VCFv4.3\n")
    p1, p2, p3 = [(PARQUET.format(c), b"PAR1" + bytes([c]) * 100) for c in (1, 2, 3)]
    declared = [
        vcf,
        p1,
        (p2[0], b"PAR1" + bytes([9]) * 100),
        (p3[0], p3[1] + b"!"),
        ("gone.vcf", b"x"),
    ]
    doc = json.loads(corpus.manifest(declared, manifestVersion=2))
    loose = corpus.normalized_info("headers/loose.vcf")
    loose.uid = 1000
    link = corpus.normalized_info("link", kind=tarfile.SYMTYPE)
    plain = corpus.build_tar(
        [
            vcf,
            ("manifest.json", json.dumps(doc).encode()),
            p1,
            p2,
            p3,
            ("notes.txt", b"hi"),
            loose,
            link,
        ]
    )
    path = env.dir / "bad.tar.c4gh"
    path.write_bytes(corpus.encrypt(plain, env.writer.secret, [env.node.public]))
    return path, [p2, p3]


def test_every_problem_is_listed(env) -> None:
    path, (p2, p3) = write_bad_package(env)
    report = verify_package(path, [env.node.secret])
    text = "\n".join(report.problems)
    for needle in [
        "first member is 'headers/00000000000000aa.vcf', not manifest.json",
        "member 'manifest.json' is out of order",
        "config.manifestVersion is 2, expected 1",
        f"member '{p2[0]}': sha256",
        f"member '{p3[0]}': size 104, manifest declares 105",
        "member 'notes.txt' does not follow the package layout",
        "member 'notes.txt' is not declared in payload.members",
        "declared member 'gone.vcf' is not in the package",
        "member 'link' not served: symbolic link",
        "member 'headers/loose.vcf': TAR header not normalized (mode 0644, uid 1000",
        "member 'headers/loose.vcf' is out of order",
    ]:
        assert needle in text, needle
    assert len(report.problems) >= 11
    assert not report.ok


def test_layout_rules() -> None:
    ok = ["manifest.json", "headers/a.vcf", "headers/b.vcf", PARQUET.format(1), PARQUET.format(2)]
    assert check_layout(ok) == []
    for chrom in ("X", "Y", "M", "22"):
        assert check_layout(["manifest.json", PARQUET.format(chrom)]) == []
    bad = [
        "allele-freq.chr23.0.br1.aa.parquet",
        "allele-freq.chr1.0.aa.parquet",
        "allele-freq.chr1.x.br1.aa.parquet",
        "allele-freq.chr1.0.br1.a.b.parquet",
        "headers/sub/a.vcf",
    ]
    for name in bad:
        assert any("does not follow" in p for p in check_layout(["manifest.json", name])), name
    assert any("out of order" in p for p in check_layout(list(reversed(ok))))


def test_manifest_without_payload_is_not_a_pass() -> None:
    _, problems = check_manifest({"config": {"manifestVersion": 1}})
    assert problems == ["manifest has no payload section: member digests are unverifiable"]
    _, problems = check_manifest({"config": {"manifestVersion": 1}, "payload": {"members": []}})
    assert "payload.members is missing or not an object" in problems


def test_cli_verify_and_ls(env, capsys) -> None:
    key = str(env.node.secret_path)
    assert run(["c4gh", "verify", str(env.dir / "good.tar.c4gh"), "--key", key]) == 0
    out = capsys.readouterr().out
    assert "sha256:" + hashlib.sha256(env.writer.public).hexdigest() in out
    bad, _members = write_bad_package(env)  # as test_every_problem_is_listed does: not its file
    assert run(["c4gh", "verify", str(bad), "--key", key]) == 1
    out = capsys.readouterr().out
    assert out.count("problem: ") >= 11
    assert run(["c4gh", "ls", str(env.dir / "good.tar.c4gh"), "--key", key]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in lines] == [name for name, _ in env.members]
    assert [int(line.split()[0]) for line in lines] == [len(data) for _, data in env.members]


def test_cli_ls_of_a_package_with_a_segment_failing_exits_1(env, tmp_path, capsys) -> None:
    """Red team 46b: of a package with bytes appended, `ls` printed "segment … fails
    authentication" and exited 0; the help says 1 is a damaged package (as `verify` exits)."""
    key = str(env.node.secret_path)
    damaged = tmp_path / "damaged.tar.c4gh"
    damaged.write_bytes((env.dir / "good.tar.c4gh").read_bytes() + bytes(range(256)) * 4)
    assert run(["c4gh", "ls", str(damaged), "--key", key]) == 1
    assert "fails authentication" in capsys.readouterr().err
    assert run(["c4gh", "verify", str(damaged), "--key", key]) == 1
