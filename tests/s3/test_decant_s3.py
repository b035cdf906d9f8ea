"""`decant info | verify | restore s3://…` against archives uploaded to a real SeaweedFS: the same
answers as on local disk, a damaged upload fails (exit 1), a missing key is a usage error (2)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from tests.s3.conftest import S3Bucket
from vfs.decant.packer import PackResult

Cli = Callable[..., tuple[int, str, str]]
# Striped, tiled, big-endian BigTIFF (mode byte-exact) and a compressed TIFF (verbatim).
NAMES = ("striped_odd_u16_37x53.tif", "tiled_chunky_rgb_u8_edge.tif",
         "bigendian_bigtiff_planar_rgb_i16.tif", "zlib_u16.tif")  # fmt: skip


def client(bucket: S3Bucket) -> S3Store:
    return S3Store(bucket.name, client_options={"allow_http": True})  # endpoint from AWS_*


def upload_file(bucket: S3Bucket, path: Path, key: str) -> str:
    obstore.put(client(bucket), bucket.key(key), path.read_bytes())
    return bucket.url(key)


def upload_tree(bucket: S3Bucket, folder: Path, key: str) -> str:
    store = client(bucket)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        obstore.put(store, bucket.key(f"{key}/{path.relative_to(folder).as_posix()}"),
                    path.read_bytes())  # fmt: skip
    return bucket.url(key)


@pytest.fixture
def uploaded(s3_bucket: S3Bucket, packed_corpus: dict[str, PackResult]) -> dict[str, str]:
    """Corpus file name → s3:// URL of its archive."""
    missing = set(NAMES) - set(packed_corpus)
    assert not missing, f"corpus lost {missing}"
    return {
        name: upload_file(s3_bucket, packed_corpus[name].archive, f"a/{name}.zarr.zip")
        for name in NAMES
    }


def test_verify_passes_for_every_uploaded_archive(
    uploaded: dict[str, str], decant_cli: Cli
) -> None:
    status, out, err = decant_cli("verify", *uploaded.values())
    assert (status, err) == (0, "")
    for url in uploaded.values():
        assert f"OK   {url}: " in out


def test_info_matches_the_local_archive(
    uploaded: dict[str, str], packed_corpus: dict[str, PackResult], decant_cli: Cli
) -> None:
    for name, url in uploaded.items():
        local = packed_corpus[name].archive
        status, remote_out, err = decant_cli("info", url)
        assert (status, err) == (0, "")
        _, local_out, _ = decant_cli("info", local)
        assert remote_out.replace(url, "X") == local_out.replace(str(local), "X")
        status, remote_json, _ = decant_cli("info", "--json", url)
        assert status == 0 and remote_json == decant_cli("info", "--json", local)[1]


def test_restore_writes_the_original(
    uploaded: dict[str, str], corpus: dict[str, Path], tmp_path: Path, decant_cli: Cli
) -> None:
    for name, url in uploaded.items():
        status, _, err = decant_cli("restore", url, "-o", tmp_path / name)
        assert (status, err) == (0, "")
        assert (tmp_path / name).read_bytes() == corpus[name].read_bytes()


def damaged(path: Path, tmp_path: Path) -> Path:
    """A copy with one byte flipped in the middle of its largest entry's stored bytes."""
    with zipfile.ZipFile(path) as zf:
        info = max(zf.infolist(), key=lambda i: i.compress_size)
    data = bytearray(path.read_bytes())
    header = info.header_offset
    start = header + 30 + int.from_bytes(data[header + 26 : header + 28], "little")
    start += int.from_bytes(data[header + 28 : header + 30], "little")
    data[start + info.compress_size // 2] ^= 0x40
    out = tmp_path / f"bad-{path.name}"
    out.write_bytes(bytes(data))
    return out


def test_a_damaged_upload_fails_verification(
    s3_bucket: S3Bucket, packed_corpus: dict[str, PackResult], tmp_path: Path, decant_cli: Cli
) -> None:
    good = packed_corpus[NAMES[0]].archive
    bad = damaged(good, tmp_path)
    status, _, _ = decant_cli("verify", bad)
    assert status == 1  # the damage is real on local disk too
    good_url = upload_file(s3_bucket, good, "good.tif.zarr.zip")
    bad_url = upload_file(s3_bucket, bad, "bad.tif.zarr.zip")
    status, out, err = decant_cli("verify", good_url, bad_url)
    assert status == 1, (out, err)
    assert f"OK   {good_url}" in out
    assert f"FAIL {bad_url}" in out or bad_url in err


def test_a_nested_series_folder_in_the_bucket(
    s3_bucket: S3Bucket, corpus: dict[str, Path], tmp_path: Path, decant_cli: Cli
) -> None:
    """NAME.zarr/ is a key prefix: its manifest and member bundles are objects under it."""
    folder = tmp_path / "run1"
    folder.mkdir()
    for name in ("striped_i16.tif", "zlib_u16.tif", "not_a_tiff.csv"):
        (folder / name).write_bytes(corpus[name].read_bytes())
    status, _, err = decant_cli("pack", folder, "--series", "-o", tmp_path / "run1.zarr")
    assert (status, err) == (0, "")
    url = upload_tree(s3_bucket, tmp_path / "run1.zarr", "run1.zarr")
    status, out, err = decant_cli("verify", url)
    assert (status, err) == (0, ""), err
    assert out.count("OK") == 3
    status, _, err = decant_cli("restore", url, "-o", tmp_path / "back")
    assert (status, err) == (0, "")
    for name in ("striped_i16.tif", "zlib_u16.tif", "not_a_tiff.csv"):
        assert (tmp_path / "back" / name).read_bytes() == corpus[name].read_bytes()


def test_missing_or_foreign_inputs_are_usage_errors(
    s3_bucket: S3Bucket, corpus: dict[str, Path], decant_cli: Cli
) -> None:
    url = s3_bucket.url("none.tif.zarr.zip")
    status, _, err = decant_cli("verify", url)
    assert status == 2 and err == f"decant: {url}: no such key\n"
    plain = upload_file(s3_bucket, corpus["zlib_u16.tif"], "plain.zarr.zip")
    status, _, err = decant_cli("info", plain)
    assert status == 2 and err == f"decant: {plain}: not a decant archive (not a zip file)\n"
    status, _, err = decant_cli("info", s3_bucket.url("nothing.zarr"))
    assert status == 2 and "no such archive" in err


def test_the_command_line_reads_the_environment(uploaded: dict[str, str]) -> None:
    """A real `decant` process: endpoint and credentials from AWS_* only; nothing secret printed."""
    url = next(iter(uploaded.values()))
    cmd = [sys.executable, "-m", "vfs.commands", "verify", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"OK   {url}: " in done.stdout


def test_pack_to_a_bucket_refuses_a_name_an_object_holds(
    s3_bucket: S3Bucket, corpus: dict[str, Path], decant_cli: Cli
) -> None:
    """A plain `scan.tif` in the bucket keeps its name over a newer `scan.tif.zarr.zip` in
    every mount (the older object wins): uploading the archive would publish it hidden. The
    command refuses before packing, saying why; without the plain object it uploads."""
    name = sorted(corpus)[0]
    obstore.put(client(s3_bucket), s3_bucket.key(name), b"squatted\n")
    url = s3_bucket.url(f"{name}.zarr.zip")
    status, out, err = decant_cli("pack", corpus[name], "-o", url)
    assert status != 0 and out == "", (status, out, err)
    assert "an object of the name this archive presents is in the bucket" in err, err
    assert "not uploaded" in err
    assert not list(obstore.list(client(s3_bucket), prefix=s3_bucket.key(f"{name}.zarr.zip")))
    other = s3_bucket.url(f"elsewhere/{name}.zarr.zip")
    status, out, err = decant_cli("pack", corpus[name], "-o", other)
    assert (status, err) == (0, ""), err
