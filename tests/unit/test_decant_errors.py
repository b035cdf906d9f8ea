"""Bad input gives one clear error naming the file and the reason, and leaves nothing behind.

Corrupt archives are made by copying a good one entry by entry with zipfile (decant's entries are
STORED, so every other entry stays byte-identical) and altering exactly one thing.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

import vfs.decant.packer as packer_module
from tests.toolbox import load_tool
from vfs.decant.packer import PackOptions, PackResult, pack_file
from vfs.decant.reader import DecantArchive
from vfs.decant.verify import restore_archive, verify_archive
from vfs.errors import (
    CorruptArchiveError,
    DecantError,
    IntegrityError,
    ManifestError,
    NotAnArchiveError,
    PackError,
    UnsupportedFormatError,
)

Cli = Callable[..., tuple[int, str, str]]
MANIFEST = ".decant/manifest.json"
BASE = "imagej_hyperstack_tzc_u16.tif"  # mode D, 12 pages, husk before and between pixels
FIRST_CHUNK = "0/0.0.0.0.0"


def rewrite(src: Path, dest: Path, edit: Callable[[str, bytes], bytes | None]) -> Path:
    """Copy a zip entry by entry; `edit(name, data)` returns new data, or None to drop the entry."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info, data)
    return dest


# One JSON-entry editor for the fuzzer and these tests (tools/fuzz.py).
edit_json = load_tool("fuzz").json_edit


def manifest_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[str, bytes], bytes]:
    return edit_json(MANIFEST, change)


def flip_decoded_pixel(name: str, data: bytes, zarray: dict[str, Any]) -> bytes:
    """Decode the first plane, flip one bit of one pixel, encode it again with the same codec."""
    if name != FIRST_CHUNK:
        return data
    codec = numcodecs.get_codec(zarray["compressor"])
    plane = bytearray(codec.decode(data))
    plane[len(plane) // 2] ^= 0x01
    return bytes(codec.encode(np.frombuffer(bytes(plane), dtype=np.uint8)))


def pop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc.pop(key)


def set_field(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc.__setitem__(key, value)


def overlap(doc: dict[str, Any]) -> None:
    doc["pages"][1]["dataoffsets"][0] = doc["pages"][0]["dataoffsets"][0] + 2


def past_end(doc: dict[str, Any]) -> None:
    doc["pages"][-1]["dataoffsets"][0] = doc["original_size"] - 100


def page_field_missing(doc: dict[str, Any]) -> None:
    del doc["pages"][3]["databytecounts"]


def page_field_mistyped(doc: dict[str, Any]) -> None:
    doc["pages"][0]["dataoffsets"] = "368"


def shorten_husk(name: str, data: bytes) -> bytes:
    if name != "husk/.zarray":
        return data
    doc = json.loads(data)
    doc["shape"] = [doc["shape"][0] - 1]
    return json.dumps(doc).encode()


# id → (edit of the archive's entries, exception class, words the message must contain)
CASES: dict[str, tuple[Callable[[str, bytes], bytes | None], type[DecantError], list[str]]] = {
    "format-2": (manifest_edit(set_field("format", 2)), UnsupportedFormatError, ["format 2"]),
    "missing-field": (manifest_edit(pop("original_sha256")), ManifestError, ["original_sha256"]),
    "missing-page-field": (
        manifest_edit(page_field_missing),
        ManifestError,
        ["pages[3]", "databytecounts"],
    ),
    "mistyped-field": (
        manifest_edit(set_field("original_size", "16594")),
        ManifestError,
        ["original_size", "str"],
    ),
    "mistyped-page-field": (manifest_edit(page_field_mistyped), ManifestError, ["dataoffsets"]),
    "bool-format": (manifest_edit(set_field("format", True)), ManifestError, ["format"]),
    "segments-overlap": (manifest_edit(overlap), ManifestError, ["overlap"]),
    "segments-past-end": (manifest_edit(past_end), ManifestError, ["original_size"]),
    "husk-too-short": (shorten_husk, ManifestError, ["husk", "shorter"]),
    "no-manifest": (lambda n, d: None if n == MANIFEST else d, NotAnArchiveError, [MANIFEST]),
    "manifest-not-json": (
        lambda n, d: b"{not json" if n == MANIFEST else d,
        ManifestError,
        ["JSON"],
    ),
    "husk-array-missing": (
        lambda n, d: None if n.startswith("husk/") else d,
        CorruptArchiveError,
        ["husk"],
    ),
}


@pytest.fixture
def good(packed_corpus: dict[str, PackResult]) -> Path:
    return packed_corpus[BASE].archive


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(where bad archives go, an empty folder that must stay empty)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "in", tmp_path / "out"


# Exit statuses (vfs/commands/status.py): 1 damaged data, 2 not an input we take, 3 output I/O.
DAMAGED, BAD_INPUT, IO_ERROR = 1, 2, 3


def assert_cli_error(status: int, err: str, *words: str, code: int = DAMAGED) -> None:
    """One stderr line `decant: FILE: reason`, no traceback, and the documented exit status."""
    assert status == code, (status, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("decant: ") and not lines[0].startswith("decant: error"), err
    for word in words:
        assert word in lines[0], (word, err)


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_archive_api(case: str, good: Path, dirs: tuple[Path, Path]) -> None:
    edit, error, words = CASES[case]
    bad = rewrite(good, dirs[0] / f"{case}.zarr.zip", edit)
    with pytest.raises(error) as info:
        restore_archive(bad, dirs[1] / BASE, dirs[1])
    message = str(info.value)
    assert str(bad) in message
    for word in words:
        assert word in message
    assert list(dirs[1].iterdir()) == []
    with pytest.raises(error):
        verify_archive(bad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_archive_cli(
    case: str,
    good: Path,
    dirs: tuple[Path, Path],
    decant_cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    edit, error, words = CASES[case]
    # Not an archive we read at all (no manifest, format 2) is bad input; the rest is damage.
    code = BAD_INPUT if issubclass(error, NotAnArchiveError | UnsupportedFormatError) else DAMAGED
    bad = rewrite(good, dirs[0] / f"{case}.zarr.zip", edit)
    monkeypatch.chdir(dirs[1])  # the default restore target
    status, out, err = decant_cli("restore", bad)
    assert_cli_error(status, err, str(bad), *words, code=code)
    status, out, err = decant_cli("restore", bad, "-o", dirs[1] / "x.tif")
    assert_cli_error(status, err, str(bad), *words, code=code)
    assert list(dirs[1].iterdir()) == []
    status, out, err = decant_cli("verify", bad)
    assert_cli_error(status, err, str(bad), *words, code=code)
    assert "OK" not in out


def test_format_2_message(good: Path, dirs: tuple[Path, Path], recover_tool: Any) -> None:
    """The reader refuses rather than guesses (spec §6) — and so does the independent one."""
    bad = rewrite(good, dirs[0] / "f2.zarr.zip", manifest_edit(set_field("format", 2)))
    with pytest.raises(UnsupportedFormatError, match=r"format 2 is not supported") as info:
        DecantArchive.open(bad)
    assert str(bad) in str(info.value)
    with pytest.raises(recover_tool.RecoveryError):
        recover_tool.recover(bad)


def test_truncated_zip(good: Path, dirs: tuple[Path, Path], decant_cli: Cli) -> None:
    bad = dirs[0] / "cut.zarr.zip"
    payload = good.read_bytes()
    for keep in (len(payload) // 2, len(payload) - 10):
        bad.write_bytes(payload[:keep])
        with pytest.raises(CorruptArchiveError, match="zip") as info:
            restore_archive(bad, dirs[1] / "x.tif", dirs[1])
        assert str(bad) in str(info.value)
        status, _, err = decant_cli("restore", bad, "-o", dirs[1] / "x.tif")
        assert_cli_error(status, err, str(bad))
        status, _, err = decant_cli("verify", bad)
        assert_cli_error(status, err, str(bad))
        assert list(dirs[1].iterdir()) == []


def test_flipped_pixel_is_a_sha256_mismatch(
    good: Path, dirs: tuple[Path, Path], decant_cli: Cli, corpus: dict[str, Path]
) -> None:
    with zipfile.ZipFile(good) as zf:
        zarray = json.loads(zf.read("0/.zarray"))
    bad = rewrite(good, dirs[0] / "flip.zarr.zip", lambda n, d: flip_decoded_pixel(n, d, zarray))
    want = hashlib.sha256(corpus[BASE].read_bytes()).hexdigest()

    status, out, err = decant_cli("verify", bad)
    assert status == 1 and err == ""
    assert f"FAIL {bad}: {BASE}" in out and f"expected {want}" in out
    (verdict,) = verify_archive(bad)
    assert not verdict.ok and verdict.expected == want

    with pytest.raises(IntegrityError, match="sha256") as info:
        restore_archive(bad, dirs[1] / BASE, dirs[1])
    assert str(bad) in str(info.value) and BASE in str(info.value)
    status, _, err = decant_cli("restore", bad, "-o", dirs[1] / BASE)
    assert_cli_error(status, err, str(bad), "sha256", want)
    assert list(dirs[1].iterdir()) == []


def test_flipped_byte_on_disk(good: Path, dirs: tuple[Path, Path], decant_cli: Cli) -> None:
    """One byte of a compressed chunk flipped in place: undecodable or wrong, never restored."""
    bad = dirs[0] / "disk.zarr.zip"
    payload = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo(FIRST_CHUNK)
    local = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    payload[local + info.compress_size // 2] ^= 0xFF
    bad.write_bytes(bytes(payload))
    with pytest.raises((CorruptArchiveError, IntegrityError)):
        restore_archive(bad, dirs[1] / BASE, dirs[1])
    status, _, err = decant_cli("restore", bad, "-o", dirs[1] / BASE)
    assert_cli_error(status, err, str(bad))
    status, _, _ = decant_cli("verify", bad)
    assert status == 1
    assert list(dirs[1].iterdir()) == []


def test_not_an_archive(corpus: dict[str, Path], dirs: tuple[Path, Path], decant_cli: Cli) -> None:
    plain_dir = dirs[0] / "plain.zarr"
    plain_dir.mkdir()
    (plain_dir / "readme.txt").write_text("not an archive", encoding="ascii")
    missing = dirs[0] / "missing.zarr.zip"
    for path in (corpus[BASE], corpus["not_a_tiff.csv"], corpus["empty.tif"], plain_dir, missing):
        with pytest.raises(DecantError) as info:
            restore_archive(path, dirs[1] / "x", dirs[1])
        assert isinstance(info.value, CorruptArchiveError | NotAnArchiveError)
        assert str(path) in str(info.value)
        status, _, err = decant_cli("restore", path, "-o", dirs[1] / "x")
        assert_cli_error(status, err, str(path), code=BAD_INPUT)
        assert list(dirs[1].iterdir()) == []


def test_cli_process_exit_and_stderr(corpus: dict[str, Path], tmp_path: Path) -> None:
    """The real entry point in its own process: status 2, one stderr line, no traceback."""
    code = "import sys; from vfs.commands import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, "restore", str(corpus[BASE]), "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_cli_error(proc.returncode, proc.stderr, str(corpus[BASE]), code=BAD_INPUT)
    assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["zlib_u16.tif", "lzw_u8.tif", "not_a_tiff.csv", "empty.tif"])
def test_forced_byte_exact_is_refused(
    name: str, corpus: dict[str, Path], tmp_path: Path, decant_cli: Cli
) -> None:
    out = tmp_path / "x.zarr.zip"
    with pytest.raises(PackError) as info:
        pack_file(corpus[name], out, PackOptions(mode="byte-exact"))
    assert str(corpus[name]) in str(info.value) and "byte-exact" in str(info.value)
    status, _, err = decant_cli("pack", corpus[name], "--mode", "byte-exact", "-o", out)
    assert_cli_error(status, err, str(corpus[name]), "byte-exact", code=BAD_INPUT)
    assert list(tmp_path.iterdir()) == []


def test_forced_byte_exact_names_compression(corpus: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(PackError, match="compressed"):
        pack_file(corpus["zlib_u16.tif"], tmp_path / "x.zarr.zip", PackOptions(mode="byte-exact"))


def wrong_pixels(real: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def deserialize(*args: Any) -> np.ndarray:
        plane = real(*args).copy()
        plane.flat[0] += 1
        return plane

    return deserialize


def test_pack_gate_blocks_a_bad_reconstruction(
    corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pixels written wrong: byte-exact is refused, auto falls back to verbatim, both exact."""
    monkeypatch.setattr(
        packer_module, "deserialize_page", wrong_pixels(packer_module.deserialize_page)
    )
    src, out = corpus[BASE], tmp_path / "x.zarr.zip"
    with pytest.raises(IntegrityError, match=BASE):
        pack_file(src, out, PackOptions(mode="byte-exact"))
    assert list(tmp_path.iterdir()) == []
    result = pack_file(src, out, PackOptions())
    assert result.mode == "verbatim" and "verif" in result.reason
    assert [p.name for p in tmp_path.iterdir()] == ["x.zarr.zip"]
    restore_archive(out, tmp_path / "back", tmp_path)
    assert (tmp_path / "back").read_bytes() == src.read_bytes()


def test_pack_refuses_to_overwrite(
    corpus: dict[str, Path], tmp_path: Path, decant_cli: Cli
) -> None:
    out = tmp_path / "x.zarr.zip"
    out.write_bytes(b"keep me")
    status, _, err = decant_cli("pack", corpus[BASE], "-o", out)
    assert_cli_error(status, err, str(out), "exists", code=BAD_INPUT)
    assert out.read_bytes() == b"keep me"


def test_restore_onto_a_folder(good: Path, dirs: tuple[Path, Path], decant_cli: Cli) -> None:
    """`-o` naming an existing folder: one error line, the folder untouched, no temp file."""
    status, _, err = decant_cli("restore", good, "-o", dirs[1])
    assert_cli_error(status, err, str(good), str(dirs[1]), code=BAD_INPUT)
    assert list(dirs[1].iterdir()) == []
    assert sorted(p.name for p in dirs[1].parent.iterdir()) == ["in", "out"]


@pytest.fixture
def series_folder(corpus: dict[str, Path], tmp_path: Path) -> Path:
    folder = tmp_path / "src" / "plates"
    folder.mkdir(parents=True)
    for name in ("bigtiff_u16_2pages.tif", "zstack_u16.tif", "zlib_u16.tif"):
        (folder / name).write_bytes(corpus[name].read_bytes())
    return folder


def test_series_member_escaping_its_folder(
    series_folder: Path, dirs: tuple[Path, Path], decant_cli: Cli
) -> None:
    good = dirs[0] / "plates.zarr"
    assert decant_cli("pack", series_folder, "--series", "-o", good)[0] == 0
    doc = json.loads((good / MANIFEST).read_bytes())
    doc["members"][0]["relpath"] = "../evil.tif"
    (good / MANIFEST).write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ManifestError, match="unsafe") as info:
        restore_archive(good, dirs[1] / "plates", dirs[1])
    assert str(good) in str(info.value)
    status, _, err = decant_cli("restore", good, "-o", dirs[1] / "plates")
    assert_cli_error(status, err, str(good), "../evil.tif")
    assert list(dirs[1].iterdir()) == [] and not (dirs[1].parent / "evil.tif").exists()


def test_nested_series_with_a_missing_bundle(
    series_folder: Path, dirs: tuple[Path, Path], decant_cli: Cli
) -> None:
    archive = dirs[0] / "plates.zarr"
    assert decant_cli("pack", series_folder, "--series", "-o", archive)[0] == 0
    manifest = json.loads((archive / MANIFEST).read_bytes())
    lost = manifest["members"][-1]
    (archive / lost["subarchive"]).unlink()
    with pytest.raises(NotAnArchiveError, match=lost["subarchive"]):
        verify_archive(archive)
    status, _, err = decant_cli("restore", archive, "-o", dirs[1] / "plates")
    assert_cli_error(status, err, lost["subarchive"])
    restored = {p.name for p in (dirs[1] / "plates").iterdir()}
    assert lost["relpath"] not in restored  # members before it were verified and kept, no temp
    assert restored == {m["relpath"] for m in manifest["members"][:-1]}


def test_a_failed_pack_leaves_no_temp(
    corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decant_cli: Cli
) -> None:
    """The disk fills up half way: one error line, no archive, no hidden temp archive."""

    def full(*args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(packer_module, "husk_blocks", full)
    out = tmp_path / "x.zarr.zip"
    status, _, err = decant_cli("pack", corpus[BASE], "-o", out)
    assert_cli_error(status, err, BASE, "No space left", code=IO_ERROR)
    assert list(tmp_path.iterdir()) == []


def test_verify_goes_on_after_a_bad_archive(
    good: Path, dirs: tuple[Path, Path], decant_cli: Cli
) -> None:
    bad = dirs[0] / "cut.zarr.zip"
    bad.write_bytes(good.read_bytes()[:100])
    status, out, err = decant_cli("verify", bad, good)
    assert_cli_error(status, err, str(bad))
    assert out.splitlines() == [f"OK   {good}: {BASE}"]
