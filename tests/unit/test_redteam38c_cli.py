"""Red team 38c: the `decant` command with hostile names and archive names.

Each test names the attack and what went wrong before the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tifffile

import vfs
from tests.toolbox import load_tool
from vfs.commands.status import BAD_INPUT, IO_ERROR, OK
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.verify import restore_archive
from vfs.errors import PackError, UnsafeMemberError

Cli = Callable[..., tuple[int, str, str]]
CHECKOUT = Path(vfs.__file__).resolve().parents[1]

# Sets the terminal's window title, then clears the screen: what a name must not do to the
# terminal of whoever lists it.
ESC = "\x1b]0;owned\x07\x1b[2J"


@pytest.fixture(scope="module")
def tiff(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiff") / "scan.tif"
    tifffile.imwrite(path, np.arange(2 * 32 * 48, dtype=np.uint16).reshape(2, 32, 48))
    return path


def no_controls(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text)


def test_names_from_an_archive_are_printed_escaped(
    tiff: Path, tmp_path: Path, decant_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TIFF named with terminal escapes (a user's file in a shared folder) keeps its name as
    the archive's original_name. `decant pack`, `info`, `verify` and `restore` printed it as
    it is: listing the archive set the admin's window title and cleared the screen."""
    src = tmp_path / f"a{ESC}.tif"
    shutil.copy(tiff, src)
    archive = tmp_path / "a.tif.zarr.zip"
    runs = [("pack", src, "-o", archive), ("info", archive), ("verify", archive)]
    for args in runs:
        status, out, err = decant_cli(*args)
        assert status == OK, (args, err)
        no_controls(out + err)
    monkeypatch.chdir(tmp_path)
    src.unlink()
    status, out, err = decant_cli("restore", archive)
    assert status == OK and src.read_bytes() == tiff.read_bytes(), err
    no_controls(out + err)
    assert "\\x1b]0;owned\\x07" in out


def test_an_error_line_names_a_hostile_file_escaped(tmp_path: Path, decant_cli: Cli) -> None:
    """`decant verify shared/*.zarr.zip`: a file another user named with escapes and made
    not a zip. Its error line carried the name as it is."""
    bad = tmp_path / f"x{ESC}.zarr.zip"
    bad.write_bytes(b"not a zip at all")
    status, out, err = decant_cli("verify", bad)
    assert status == BAD_INPUT and out == ""
    no_controls(err)
    assert err.startswith("decant: ") and len(err.splitlines()) == 1


def test_c4gh_member_names_are_printed_escaped(tmp_path: Path, decant_cli: Cli) -> None:
    """A package member named with terminal escapes: `decant c4gh ls` printed the name as
    it is (the mount presents it, so it is listed; it must not drive the terminal)."""
    corpus = load_tool("make_c4gh_corpus")
    node, writer = (corpus.make_keypair(tmp_path, n) for n in ("node", "writer"))
    name = f"a{ESC}.vcf"
    package = tmp_path / "p.tar.c4gh"
    members = [("manifest.json", corpus.manifest([(name, b"x")])), (name, b"x")]
    corpus.write_package(package, members, writer, [node])
    for args in (("ls", "-l"), ("verify",)):
        _, out, err = decant_cli("c4gh", *args, package, "--key", node.secret_path)
        no_controls(out + err)
        assert "]0;owned" in out, (args, out, err)
        if args[0] == "ls":
            assert out.endswith("  a\\x1b]0;owned\\x07\\x1b[2J.vcf\n"), out


def test_a_series_archive_named_dot_dot_restores_nowhere_outside(
    tiff: Path, tmp_path: Path, decant_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`decant restore ...zarr.zip` (a name anyone can give a file in a shared folder) of a
    series: without -o the members go to a folder named after the archive, here `..`. They
    were written into the parent of the working folder, replacing what was there."""
    run = tmp_path / "run1"
    run.mkdir()
    shutil.copy(tiff, run / "a.tif")
    assert decant_cli("pack", run, "--series", "-q")[0] == OK
    hostile = tmp_path / "...zarr.zip"
    (tmp_path / "run1.zarr.zip").rename(hostile)
    (tmp_path / "a.tif").write_bytes(b"mine")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    status, out, err = decant_cli("restore", hostile)
    assert (tmp_path / "a.tif").read_bytes() == b"mine"
    assert status == BAD_INPUT and out == "" and "-o" in err, (status, out, err)
    assert list(work.iterdir()) == []
    with pytest.raises(UnsafeMemberError, match="no folder"):  # the core refuses it too
        restore_archive(hostile, None, work)
    assert (tmp_path / "a.tif").read_bytes() == b"mine"
    assert decant_cli("restore", hostile, "-o", work / "r", "-q")[0] == OK  # -o still works
    assert (work / "r" / "a.tif").read_bytes() == tiff.read_bytes()


def test_an_original_with_a_255_byte_name_restores(
    tiff: Path, tmp_path: Path, decant_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose name is as long as Linux allows packs (exit 0), but its restore made the
    temp file `.NAME.decant-restore-PID` beside it, longer than NAME_MAX: exit 3, "File name
    too long", naming the temp file; the original could not be had back under its name."""
    name = "x" + "é" * 125 + ".tif"  # 255 bytes; a cut at 128 bytes falls inside an é
    assert len(name.encode()) == 255
    src = tmp_path / name
    shutil.copy(tiff, src)
    archive = tmp_path / "long.zarr.zip"
    assert decant_cli("pack", src, "-o", archive, "-q")[0] == OK
    src.unlink()
    monkeypatch.chdir(tmp_path)
    status, _, err = decant_cli("restore", archive, "-q")
    assert (status, err) == (OK, ""), err
    assert src.read_bytes() == tiff.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "long.zarr.zip"])


def test_info_of_a_folder_archive_nested_1500_deep_is_no_traceback(
    tiff: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """`decant info run.zarr` of a folder archive holding a chain of 1,500 folders beside
    its keys (its owner's to make): the on-disk size for the ratio was summed with
    Path.rglob, which recursed once a level: RecursionError, a traceback and exit 1."""
    packed = tmp_path / "x.zarr.zip"
    assert decant_cli("pack", tiff, "-o", packed, "-q")[0] == OK
    folder = tmp_path / "x.zarr"
    with zipfile.ZipFile(packed) as zf:
        zf.extractall(folder)
    try:
        subprocess.run(["mkdir", "-p", folder / ("d/" * 1500)], check=True)  # os.makedirs recurses
        status, out, err = decant_cli("info", folder)
    finally:  # shutil.rmtree (tmp_path's cleanup) recurses a level at a time as well
        subprocess.run(["rm", "-rf", folder / "d"], check=True)
    assert (status, err) == (OK, ""), err[-2000:]
    assert "name:        scan.tif" in out


def test_pack_series_of_a_folder_nested_1500_deep_is_refused_cleanly(
    tiff: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """`decant pack USERS_FOLDER --series` (root packing a user's folder) where the user made
    a chain of 1,500 folders: the members were listed with Path.rglob, which recursed once a
    level: RecursionError, a traceback and exit 1. No member can lie deeper than a manifest
    allows (64 names), so the folder is refused, saying why."""
    run = tmp_path / "run1"
    run.mkdir()
    shutil.copy(tiff, run / "a.tif")
    try:
        subprocess.run(["mkdir", "-p", run / ("d/" * 1500)], check=True)  # os.makedirs recurses
        status, out, err = decant_cli("pack", run, "--series", "-q")
    finally:  # shutil.rmtree (tmp_path's cleanup) recurses a level at a time as well
        subprocess.run(["rm", "-rf", run / "d"], check=True)
    assert (status, out) == (BAD_INPUT, ""), err[-2000:]
    assert err.startswith(f"decant: {run}/d/") and "deep" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1"]
    run.joinpath(*["d"] * 63).mkdir(parents=True)  # as deep as a member's folder may be
    assert decant_cli("pack", run, "--series", "-q")[0] == OK


def test_pack_force_of_two_inputs_of_one_name_keeps_both_or_says_so(
    tiff: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """`decant pack --force a/scan.tif b/scan.tif -o out/`: both inputs get the archive name
    out/scan.tif.zarr.zip. The second replaced the first one this very run had written, and
    the run exited 0 with a line for each: one original had no archive left."""
    a, b = tmp_path / "a" / "scan.tif", tmp_path / "b" / "scan.tif"
    for src, factor in ((a, 1), (b, 3)):
        src.parent.mkdir()
        data = tifffile.imread(tiff) * factor
        tifffile.imwrite(src, data)
    out = tmp_path / "out"
    status, stdout, err = decant_cli("pack", "--force", a, b, "-o", out)
    assert status == BAD_INPUT, (stdout, err)
    assert stdout.startswith(f"{a} -> ") and str(b) not in stdout
    line = err.strip()
    assert line.startswith(f"decant: {b}: ") and str(a) in line and len(err.splitlines()) == 1
    archive = out / "scan.tif.zarr.zip"
    assert decant_cli("restore", archive, "-o", tmp_path / "back.tif", "-q")[0] == OK
    assert (tmp_path / "back.tif").read_bytes() == a.read_bytes()


def test_c4gh_of_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`decant c4gh verify inbox/*.tar.c4gh` where a user put a FIFO of that name in the
    inbox: the header was read with a blocking open(), which waits for a writer that never
    comes. `ls` and `verify` hung for good; now they refuse it (exit 2) at once."""
    corpus = load_tool("make_c4gh_corpus")
    node = corpus.make_keypair(tmp_path, "node")
    fifo = tmp_path / "x.tar.c4gh"
    os.mkfifo(fifo)
    for action in ("ls", "verify"):
        cmd = ["-m", "vfs.commands", "c4gh", action, str(fifo), "--key", str(node.secret_path)]
        done = subprocess.run(
            [sys.executable, *cmd], capture_output=True, text=True, timeout=10, cwd=CHECKOUT
        )
        assert (done.returncode, done.stdout) == (BAD_INPUT, ""), (action, done.stderr)
        assert done.stderr.startswith("decant: ") and "x.tar.c4gh" in done.stderr, done.stderr
        assert "regular file" in done.stderr and len(done.stderr.splitlines()) == 1


def test_verify_into_a_closed_pipe_stops_once_and_quietly(
    tiff: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """`decant verify archive/*.zarr.zip | head -1`: each line written after the reader left
    raised BrokenPipeError, which the per-archive loop took for that archive's error: it
    printed `decant: Broken pipe` once per remaining archive (hundreds) and went on verifying
    every one of them for nobody."""
    archive = tmp_path / "a.zarr.zip"
    assert decant_cli("pack", tiff, "-o", archive, "-q")[0] == OK
    many = []
    for i in range(300):
        many.append(tmp_path / f"l{i:03d}.zarr.zip")
        many[-1].symlink_to(archive)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vfs.commands", "verify", *map(str, many)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=CHECKOUT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"OK   ")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == IO_ERROR
    assert err == "", err[:500]


def test_pack_force_onto_a_folder_of_archives_deletes_nothing(
    tiff: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """`decant pack --force scan.tif -o archive/` (as one writes it for several inputs):
    -o names the archive for one input, so the packer took the existing folder `archive`
    for a folder archive to replace, removed it with everything in it (the other archives
    there) and put scan.tif's folder archive in its place: exit 0."""
    folder = tmp_path / "archive"
    folder.mkdir()
    (folder / "other.tif.zarr.zip").write_bytes(b"precious")
    status, out, err = decant_cli("pack", "--force", tiff, "-o", folder)
    assert (folder / "other.tif.zarr.zip").read_bytes() == b"precious"
    assert sorted(p.name for p in folder.iterdir()) == ["other.tif.zarr.zip"]
    assert (status, out) == (BAD_INPUT, ""), err
    assert err.startswith(f"decant: {folder}: ") and "not a decant archive" in err
    with pytest.raises(PackError, match="not a decant archive"):  # the core refuses it too
        pack_file(tiff, folder, PackOptions(overwrite=True))
    assert sorted(p.name for p in folder.iterdir()) == ["other.tif.zarr.zip"]
    again = tmp_path / "x.zarr"  # a folder archive itself is still replaced
    for _ in range(2):
        assert decant_cli("pack", "--force", tiff, "-o", again, "-q")[0] == OK


def test_pack_force_onto_a_folder_with_a_linked_manifest_deletes_nothing(
    tiff: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """A folder of archives given a `.decant` (or a `.decant/manifest.json`) that is a link
    to a real archive's passed for a folder archive: `pack --force -o` removed it whole."""
    real = tmp_path / "real.zarr"
    assert decant_cli("pack", tiff, "-o", real, "-q")[0] == OK
    for i, link in enumerate([".decant", ".decant/manifest.json"]):
        folder = tmp_path / f"archive{i}"
        (folder / ".decant").mkdir(parents=True)
        (folder / "other.tif.zarr.zip").write_bytes(b"precious")
        if link == ".decant":
            (folder / ".decant").rmdir()
        (folder / link).symlink_to(real / link)
        status, _out, err = decant_cli("pack", "--force", tiff, "-o", folder)
        assert (status, (folder / "other.tif.zarr.zip").read_bytes()) == (BAD_INPUT, b"precious")
        assert "not a decant archive" in err


def test_log_lines_of_a_decant_run_are_escaped(tmp_path: Path) -> None:
    """Hardening, not an observed leak: the cores log names (packer: "SOURCE: REASON; packing
    verbatim", at WARNING, so without -v) and `decant` logged through a plain formatter. A
    record naming a file with terminal escapes must reach stderr escaped, as the daemon's do
    (vfs.logsafe.SafeFormatter)."""
    code = (
        "import logging, sys\n"
        "import vfs.commands.archive as archive\n"
        "from vfs.commands import main\n"
        "def info(args):\n"
        "    logging.getLogger('vfs.decant.packer').warning('%s: packing verbatim', args.archive)\n"
        "    return 0\n"
        "archive.cmd_info = info\n"
        "sys.exit(main(['info', sys.argv[1]]))\n"
    )
    name = f"x{ESC}.tif"
    done = subprocess.run(
        [sys.executable, "-c", code, name], capture_output=True, text=True, cwd=CHECKOUT
    )
    assert done.returncode == OK, done.stderr
    no_controls(done.stderr)
    assert done.stderr == "decant: x\\x1b]0;owned\\x07\\x1b[2J.tif: packing verbatim\n"


def test_restore_without_o_replaces_no_existing_file(
    tmp_path: Path, decant_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cd ~ && decant restore /shared/scan.tif.zarr.zip` (no -o): the archive's manifest names
    the output, here `.bashrc`. The restore replaced the user's ~/.bashrc with the archive's
    bytes (exit 0); the name was only shown once it was done. Without -o an existing file is
    now refused; -o still names (and replaces) one."""
    evil, home = tmp_path / "evil", tmp_path / "home"
    evil.mkdir()
    home.mkdir()
    (evil / ".bashrc").write_bytes(b"echo owned\n")
    archive = evil / "scan.tif.zarr.zip"
    assert decant_cli("pack", evil / ".bashrc", "-o", archive, "-q")[0] == OK
    (home / ".bashrc").write_bytes(b"mine\n")
    monkeypatch.chdir(home)
    status, out, err = decant_cli("restore", archive)
    assert (home / ".bashrc").read_bytes() == b"mine\n"
    assert (status, out) == (IO_ERROR, ""), err
    assert err.startswith("decant: ") and ".bashrc" in err and "-o" in err
    assert sorted(p.name for p in home.iterdir()) == [".bashrc"]
    assert decant_cli("restore", archive, "-o", home / ".bashrc", "-q")[0] == OK
    assert (home / ".bashrc").read_bytes() == b"echo owned\n"
