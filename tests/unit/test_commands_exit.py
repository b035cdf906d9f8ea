"""One exit-status table for every `decant` subcommand, documented in each --help.

0 ok; 1 verification failed (damage, mismatch, invalid); 2 usage or an input that is not what the
command takes; 3 an output that cannot be written. Errors are one line `decant: FILE: reason`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

import vfs
import vfs.commands
from tests.toolbox import load_tool
from vfs.commands import build_parser, decant_version
from vfs.commands.status import BAD_INPUT, EXIT_STATUS, FAILED, IO_ERROR, OK

Cli = Callable[..., tuple[int, str, str]]
CHECKOUT = Path(vfs.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiff(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiff") / "scan.tif"
    data = np.arange(8 * 128 * 256, dtype=np.uint16).reshape(8, 128, 256)
    tifffile.imwrite(path, data, imagej=True, metadata={"axes": "ZYX"})
    return path


@pytest.fixture
def archive(tiff: Path, tmp_path: Path, decant_cli: Cli) -> Path:
    out = tmp_path / "scan.tif.zarr.zip"
    assert decant_cli("pack", tiff, "-o", out)[0] == OK
    return out


def one_error_line(err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("decant: "), err
    assert "Traceback" not in err and "decant: error" not in err
    for word in words:
        assert word in lines[0], (word, err)
    return lines[0]


def damage_first_chunk(archive: Path) -> None:
    """Flip a byte in the middle of plane 0's compressed chunk, in place."""
    payload = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = next(i for i in zf.infolist() if i.filename.startswith("0/"))
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    payload[start + info.compress_size // 2] ^= 0xFF
    archive.write_bytes(bytes(payload))


def test_verify_of_a_damaged_archive_is_1(archive: Path, decant_cli: Cli) -> None:
    assert decant_cli("verify", archive)[0] == OK
    damage_first_chunk(archive)
    status, out, err = decant_cli("verify", archive)
    assert status == FAILED, (out, err)
    assert "OK" not in out


def test_pack_of_a_missing_file_is_2(tmp_path: Path, decant_cli: Cli) -> None:
    missing = tmp_path / "nothere.tif"
    status, out, err = decant_cli("pack", missing)
    assert (status, out) == (BAD_INPUT, "")
    assert one_error_line(err) == f"decant: {missing}: No such file or directory"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["verify", "restore", "info"])
def test_a_non_archive_is_2(command: str, tiff: Path, tmp_path: Path, decant_cli: Cli) -> None:
    folder = tmp_path / "plain.zarr"
    folder.mkdir()
    empty = tmp_path / "empty.zarr.zip"
    empty.write_bytes(b"")
    extra = ["-o", tmp_path / "x"] if command == "restore" else []
    for path in (tiff, folder, empty, tmp_path / "missing.zarr.zip"):
        status, out, err = decant_cli(command, path, *extra)
        assert (status, out) == (BAD_INPUT, ""), (path, err)
        one_error_line(err, str(path))
    assert not (tmp_path / "x").exists()


def test_a_malformed_tiff_packed_verbatim_prints_no_warning_of_tifffile(
    tmp_path: Path, decant_cli: Cli
) -> None:
    """Packed verbatim with status 0, and the output line says why; tifffile's own log line
    ("decant: <tifffile.TiffPages @16> invalid offset to first page 16") read as an error
    (red team 45). With --verbose it is still printed."""
    bad = tmp_path / "bad.tif"
    bad.write_bytes(b"II*\0" + (16).to_bytes(4, "little") + bytes(8))  # its IFD: at its end

    def decant(*args: str) -> subprocess.CompletedProcess[str]:  # its own logging, not pytest's
        return subprocess.run([sys.executable, "-m", "vfs.commands", *args, str(bad)],
                              capture_output=True, text=True, timeout=60, check=False,
                              env=dict(os.environ, PYTHONPATH=str(CHECKOUT)))  # fmt: skip

    done = decant("pack")
    assert (done.returncode, done.stderr) == (OK, "")
    assert "verbatim" in done.stdout and "no pages" in done.stdout
    done = decant("-v", "pack", "--force")
    assert done.returncode == OK and "tifffile" in done.stderr


def test_a_zip_without_a_manifest_is_2(tmp_path: Path, decant_cli: Cli) -> None:
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("readme.txt", "not decant")
    status, _, err = decant_cli("verify", other)
    assert status == BAD_INPUT
    one_error_line(err, str(other), "manifest")


def test_several_archives_give_the_highest_status(
    archive: Path, tiff: Path, decant_cli: Cli
) -> None:
    """Every input is tried: the good one still says OK; a non-archive (2) outranks damage (1)."""
    good = archive.with_name("good.zarr.zip")
    good.write_bytes(archive.read_bytes())
    damage_first_chunk(archive)
    status, out, _ = decant_cli("verify", good, archive)
    assert status == FAILED and f"OK   {good}" in out
    status, out, err = decant_cli("verify", good, archive, tiff)
    assert status == BAD_INPUT and f"OK   {good}" in out and str(tiff) in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == OK
    assert capsys.readouterr().out == f"decant {decant_version()}\n"


def test_version_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vfs.commands", "--version"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(CHECKOUT)),
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (OK, "")
    assert done.stdout.startswith("decant ") and done.stdout.split()[1][0].isdigit()


def test_version_without_an_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert decant_version() == f"{vfs.__version__} (not installed)"


def leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Any]:
    """(command words, parser) of every subcommand that runs something."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    found = []
    for name, child in subs[0].choices.items():
        found += leaf_parsers(child, (*path, name))
    return found


def test_every_help_documents_the_exit_statuses() -> None:
    leaves = leaf_parsers(build_parser())
    names = {" ".join(words) for words, _ in leaves}
    assert {"pack", "restore", "verify", "info", "c4gh ls", "c4gh verify"} <= names
    assert "acqstore validate" in names
    for words, parser in leaves:
        text = parser.format_help()
        assert EXIT_STATUS in text, words  # verbatim: RawDescriptionHelpFormatter kept the table
        assert "--quiet" in text, words


def test_quiet_and_verbose_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        vfs.commands.main(["-q", "verify", "-v", "x.zarr.zip"])
    assert info.value.code == BAD_INPUT
    assert "--quiet" in capsys.readouterr().err


def test_bad_codec_is_a_usage_error(tiff: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        vfs.commands.main(["pack", str(tiff), "--codec", "nosuch", "-o", str(tmp_path / "x")])
    assert info.value.code == BAD_INPUT
    assert list(tmp_path.iterdir()) == []


def test_restore_onto_a_full_disk_is_3(
    archive: Path, tmp_path: Path, decant_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    status, out, err = decant_cli("restore", archive, "-o", tmp_path / "back.tif")
    assert (status, out) == (IO_ERROR, "")
    one_error_line(err, str(archive), "No space left")
    assert not (tmp_path / "back.tif").exists()


def test_pack_into_a_file_as_folder_is_3(tiff: Path, tmp_path: Path, decant_cli: Cli) -> None:
    """Several inputs and -o naming a file: the folder cannot be made, an output error."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    status, _, err = decant_cli("pack", tiff, tiff, "-o", blocker)
    assert status == IO_ERROR
    assert len(err.strip().splitlines()) == 2 and "Traceback" not in err


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Any:
    corpus = load_tool("make_c4gh_corpus")
    d = tmp_path_factory.mktemp("c4gh")
    node, other = corpus.make_keypair(d, "node"), corpus.make_keypair(d, "other")
    corpus.write_package(d / "for-other.tar.c4gh", [("a.txt", b"hello")], other, [other])
    return d, node


@pytest.mark.parametrize("action", ["ls", "verify"])
def test_c4gh_refusals_are_2(action: str, keys: Any, tiff: Path, decant_cli: Cli) -> None:
    d, node = keys
    for package in (d / "missing.tar.c4gh", tiff, d / "for-other.tar.c4gh"):
        status, out, err = decant_cli("c4gh", action, package, "--key", node.secret_path)
        assert (status, out) == (BAD_INPUT, ""), (package, err)
        one_error_line(err, package.name)
    status, _, err = decant_cli("c4gh", action, tiff, "--key", d / "nosuch.sec")
    assert status == BAD_INPUT
    one_error_line(err, "nosuch.sec")


@pytest.mark.parametrize("action", ["ls", "verify"])
def test_a_folder_given_as_a_package_is_2_naming_it(
    action: str, keys: Any, tmp_path: Path, decant_cli: Cli
) -> None:
    """Red team 57 F7: it was "decant: 3: Is a directory" (the descriptor), exit 3 (output)."""
    folder = tmp_path / "pkg.tar.c4gh"
    folder.mkdir()
    status, out, err = decant_cli("c4gh", action, folder, "--key", keys[1].secret_path)
    assert (status, out) == (BAD_INPUT, "")
    one_error_line(err, "pkg.tar.c4gh: not a regular file")


def test_c4gh_ls_fails_a_package_a_mount_shows_raw(keys: Any, decant_cli: Cli) -> None:
    """`ls` lists "the members a package would show in a mount": one whose first member is not
    manifest.json, or whose manifest cannot be parsed, is shown raw there (red team 57 F7)."""
    corpus = load_tool("make_c4gh_corpus")
    d, node = keys
    last = d / "manifest-last.tar.c4gh"
    corpus.write_package(last, [("a.txt", b"hello"), ("manifest.json", b"{}")], node, [node])
    deep = d / "manifest-deep.tar.c4gh"
    corpus.write_package(deep, [("manifest.json", b"[" * 10**5 + b"]" * 10**5)], node, [node])
    bad = d / "payload-not-digests.tar.c4gh"
    payload = b'{"payload": {"members": {"a.txt": {"sha256": "0"}}}}'
    corpus.write_package(bad, [("manifest.json", payload), ("a.txt", b"hello")], node, [node])
    good = d / "good.tar.c4gh"
    corpus.write_package(good, [("manifest.json", b"{}"), ("a.txt", b"hello")], node, [node])
    for package, why in (
        (last, "first member 'a.txt'"),
        (deep, "nested too deeply"),
        (bad, "not a map of sha256 digests"),
    ):
        status, _out, err = decant_cli("c4gh", "ls", package, "--key", node.secret_path)
        assert status == FAILED and why in err and "a mount shows it raw" in err, err
    assert decant_cli("c4gh", "ls", good, "--key", node.secret_path)[0] == OK


def test_acqstore_outside_a_collection_is_2(tmp_path: Path, decant_cli: Cli) -> None:
    for root in (tmp_path, tmp_path / "missing"):
        status, out, err = decant_cli("acqstore", "validate", root)
        assert (status, out) == (BAD_INPUT, "")
        one_error_line(err, str(root))


def test_acqstore_quiet_drops_the_verdict(root: Path, decant_cli: Cli) -> None:
    assert decant_cli("acqstore", "validate", root) == (OK, "", verdict_line(root))
    assert decant_cli("acqstore", "validate", "-q", root) == (OK, "", "")


def verdict_line(root: Path) -> str:
    return f"{root / 'acqstore/collection.json'}: valid (0 errors, 0 warnings)\n"


def test_decant_starts_no_blas_threads() -> None:
    """numpy's OpenBLAS would start a worker per extra core that spins once started (CPU the
    restore's sha256 and decode need): `decant` asks for none, unless the caller set a count."""
    count = "import vfs.commands, numpy, os; print(len(os.listdir('/proc/self/task')))"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    run = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "1"
    env["OPENBLAS_NUM_THREADS"] = "2"  # the caller's own setting wins
    run = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "2" or (os.cpu_count() or 1) < 2


def test_pack_onto_its_own_input_is_a_usage_error(tiff: Path, decant_cli: Cli) -> None:
    """`-o` naming the input (or a hard link of it), even with --force: it said "cannot write
    a.tif: Not a directory", exit 3, as if the disk had failed (red team 59). The input stays."""
    before = tiff.read_bytes()
    link = tiff.with_name("link.tif")
    os.link(tiff, link)
    for out in (tiff, link):
        status, _, err = decant_cli("pack", tiff, "-o", out, "--force")
        assert status == BAD_INPUT
        one_error_line(err, str(tiff), "names the input itself")
    assert tiff.read_bytes() == before
