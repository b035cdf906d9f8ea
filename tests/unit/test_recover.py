"""tools/recover.py against archives built by hand in this file straight from the spec (§3–§5).

Nothing here comes from `vfs`: the archives are assembled from tifffile's offsets, numpy and zarr,
so these tests check recover.py against the spec, not against the packer.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import tifffile
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import load_tool

recover_tool = load_tool("recover")

PIXEL_CODEC = numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
HUSK_CODEC = numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE)


def page_records(raw: bytes, path: Path, first_index: int = 0) -> list[dict[str, Any]]:
    """§4b page records from tifffile, tiled segments trimmed to real pixels as §5 orders them."""
    records = []
    with tifffile.TiffFile(path) as tif:
        for i, page in enumerate(tif.pages):
            spp = page.samplesperpixel
            shape = [page.imagelength, page.imagewidth] + ([spp] if spp > 1 else [])
            offs, counts = list(page.dataoffsets), list(page.databytecounts)
            if page.is_tiled:
                offs, counts = real_tile_segments(page, offs)
            records.append({
                "index": first_index + i, "shape": shape, "dtype": page.dtype.name,
                "dataoffsets": offs, "databytecounts": counts, "samplesperpixel": spp,
                "planarconfig": page.planarconfig, "predictor": 1,
                "rowsperstrip": 0 if page.is_tiled else page.rowsperstrip,
                "tilewidth": page.tilewidth, "tilelength": page.tilelength,
            })  # fmt: skip
            assert len(raw) >= max(o + c for o, c in zip(offs, counts, strict=True))
    return records


def real_tile_segments(page: Any, tile_offsets: list[int]) -> tuple[list[int], list[int]]:
    """Full-width tiles: one run of real rows; right-edge tiles: one segment per real row."""
    tw, tl, Y, X = page.tilewidth, page.tilelength, page.imagelength, page.imagewidth
    px = page.dtype.itemsize * (1 if page.planarconfig == 2 else page.samplesperpixel)
    grid = [(y, x) for y in range(0, Y, tl) for x in range(0, X, tw)]
    offs, counts = [], []
    for n, off in enumerate(tile_offsets):
        y, x = grid[n % len(grid)]
        ys, xs = min(tl, Y - y), min(tw, X - x)
        rows = [(0, ys * tw)] if xs == tw else [(r * tw, xs) for r in range(ys)]
        for start, width in rows:
            offs.append(off + start * px)
            counts.append(width * px)
    return offs, counts


def husk_of(raw: bytes, pages: list[dict[str, Any]]) -> bytes:
    """§4: the original with every pixel segment cut out, in ascending offset order."""
    keep = np.ones(len(raw), dtype=bool)
    for pm in pages:
        for off, cnt in zip(pm["dataoffsets"], pm["databytecounts"], strict=True):
            keep[off : off + cnt] = False
    return np.frombuffer(raw, dtype=np.uint8)[keep].tobytes()


def manifest(raw: bytes, name: str, mode: str, **fields: Any) -> dict[str, Any]:
    """Every §4b field, with this original's identity filled in."""
    doc = {
        "decant_version": "hand-built", "format": 1, "mode": mode, "original_name": name,
        "original_size": len(raw), "original_sha256": hashlib.sha256(raw).hexdigest(),
        "byteorder": "<", "pixel_codec": "blosc:zstd:byteshuffle:clevel=5", "pages": [],
        "plane_order": [], "husk_raw_size": 0, "notes": "", "members": [],
        "series_consolidated": False,
    }  # fmt: skip
    doc.update(fields)
    return doc


def write_archive(
    dest: Path, doc: dict[str, Any], arrays: dict[str, np.ndarray], husk_chunk: int = 64,
    sep: str = "/",
) -> Path:  # fmt: skip
    """A Zarr v2 group in a STORED .zarr.zip (or a .zarr/ directory) plus the manifest key."""
    store: Any = (
        zarr.storage.LocalStore(dest)
        if dest.suffix == ".zarr"
        else zarr.storage.ZipStore(dest, mode="w")
    )
    # Attributes at creation: set later they would rewrite .zgroup, a duplicate zip entry.
    group = zarr.create_group(store, zarr_format=2, attributes={"decant": {"pixels": "0"}})
    for key, data in arrays.items():
        one_d = data.ndim == 1
        chunks = (husk_chunk,) if one_d else (1,) * (data.ndim - 2) + data.shape[-2:]
        if not one_d and doc["pages"] and len(doc["pages"][0]["shape"]) == 3:
            chunks = (1,) * (data.ndim - 3) + data.shape[-3:]
        arr = group.create_array(
            key, shape=data.shape, chunks=chunks, dtype=data.dtype,
            compressors=HUSK_CODEC if one_d else PIXEL_CODEC,
            chunk_key_encoding={"name": "v2", "separator": sep},
        )  # fmt: skip
        if data.size:
            arr[...] = data
    body = json.dumps(doc).encode()
    if dest.suffix == ".zarr":
        (dest / ".decant").mkdir()
        (dest / ".decant" / "manifest.json").write_bytes(body)
    else:
        store.close()
        with zipfile.ZipFile(dest, "a", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr(".decant/manifest.json", body)
    return dest


def tiff(path: Path, data: np.ndarray, **kwargs: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """Write a TIFF and return its bytes with its page records."""
    tifffile.imwrite(path, data, **kwargs)
    raw = path.read_bytes()
    return raw, page_records(raw, path)


def byte_exact(
    tmp: Path, data: np.ndarray, canonical: np.ndarray, name: str, plane_order: list[str],
    suffix: str = ".zarr.zip", sep: str = "/", **kwargs: Any,
) -> tuple[bytes, Path]:  # fmt: skip
    """Mode D archive of `data` written as a TIFF, `canonical` being the `0` array to store."""
    kwargs.setdefault("photometric", "minisblack")  # else tifffile reads (3|4, Y, X) as RGB(A)
    raw, pages = tiff(tmp / name, data, **kwargs)
    assert all(list(canonical.shape[-len(pm["shape"]) :]) == pm["shape"] for pm in pages)
    husk = husk_of(raw, pages)
    doc = manifest(
        raw, name, "byte-exact", pages=pages, plane_order=plane_order, husk_raw_size=len(husk),
        byteorder=kwargs.get("byteorder", "<"),
    )  # fmt: skip
    arrays = {"0": canonical, "husk": np.frombuffer(husk, dtype=np.uint8)}
    return raw, write_archive(tmp / (name + suffix), doc, arrays, sep=sep)


def rng_data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 250, shape).astype(dtype)


def test_striped_two_pages(tmp_path: Path) -> None:
    data = rng_data((2, 37, 29), "uint16")
    raw, archive = byte_exact(tmp_path, data, data, "s.tif", ["z"], rowsperstrip=5)
    assert recover_tool.recover(archive) == {"s.tif": raw}


def test_directory_form(tmp_path: Path) -> None:
    data = rng_data((3, 11, 13), "int16")
    raw, archive = byte_exact(tmp_path, data, data, "d.tif", ["z"], suffix=".zarr", sep=".")
    assert archive.is_dir()
    assert recover_tool.recover(archive) == {"d.tif": raw}


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_float_bits_survive(tmp_path: Path, byteorder: str) -> None:
    """NaN payloads, a signalling NaN, ±inf and -0.0 must come back bit for bit."""
    bits = np.arange(2 * 7 * 5, dtype=np.uint32).reshape(2, 7, 5) * 7919 + 0x3F000000
    bits[0, 0, :5] = [0x7FC01234, 0x7F800001, 0xFF800000, 0x80000000, 0xFFC00000]
    data = bits.view(np.float32)
    raw, archive = byte_exact(tmp_path, data, data, "f.tif", ["z"], byteorder=byteorder)
    assert recover_tool.recover(archive) == {"f.tif": raw}


def test_trailing_husk_after_pixels(tmp_path: Path) -> None:
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, rng_data((9, 10), "uint8"), description="x")
    tifffile.tiffcomment(path, "grown description lands after the pixels " * 4)
    raw = path.read_bytes()
    pages = page_records(raw, path)
    assert max(pages[0]["dataoffsets"]) + sum(pages[0]["databytecounts"]) < len(raw)
    husk = husk_of(raw, pages)
    doc = manifest(raw, "t.tif", "byte-exact", pages=pages, plane_order=["z"])
    arrays = {"0": tifffile.imread(path)[None], "husk": np.frombuffer(husk, dtype=np.uint8)}
    assert recover_tool.recover(write_archive(tmp_path / "t.zarr.zip", doc, arrays)) == {
        "t.tif": raw
    }


@pytest.mark.parametrize("planar", ["contig", "separate"])
@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_tiled_rgb_edge_tiles(tmp_path: Path, planar: str, byteorder: str) -> None:
    yxs = rng_data((37, 53, 3), "uint16")
    data = yxs if planar == "contig" else np.moveaxis(yxs, -1, 0)
    raw, archive = byte_exact(
        tmp_path, data, yxs[None], "t.tif", ["z"], tile=(16, 32), photometric="rgb",
        planarconfig=planar, byteorder=byteorder,
    )  # fmt: skip
    assert recover_tool.recover(archive) == {"t.tif": raw}


def test_striped_planar_rgb_big_endian(tmp_path: Path) -> None:
    yxs = rng_data((19, 23, 3), "int16")
    raw, archive = byte_exact(
        tmp_path, np.moveaxis(yxs, -1, 0), yxs[None], "p.tif", ["z"], photometric="rgb",
        planarconfig="separate", byteorder=">", rowsperstrip=4, bigtiff=True,
    )  # fmt: skip
    assert recover_tool.recover(archive) == {"p.tif": raw}


def test_plane_order_permutation(tmp_path: Path) -> None:
    """OME ZCYX stores z outer, c inner; `0` is canonical (c, z), so plane_order must be used."""
    stored = rng_data((3, 2, 8, 9), "uint16")  # storage order z, c
    canonical = np.ascontiguousarray(stored.transpose(1, 0, 2, 3))
    raw, archive = byte_exact(
        tmp_path, stored, canonical, "o.ome.tif", ["z", "c"], metadata={"axes": "ZCYX"}
    )
    assert recover_tool.recover(archive) == {"o.ome.tif": raw}


def test_plane_order_imagej_tzc(tmp_path: Path) -> None:
    stored = rng_data((2, 3, 2, 6, 7), "uint16")  # ImageJ storage order t, z, c
    canonical = np.ascontiguousarray(stored.transpose(0, 2, 1, 3, 4))
    raw, archive = byte_exact(
        tmp_path, stored, canonical, "ij.tif", ["t", "z", "c"], imagej=True,
        metadata={"axes": "TZCYX"},
    )  # fmt: skip
    assert recover_tool.recover(archive) == {"ij.tif": raw}


def test_ignoring_plane_order_is_caught_by_sha(tmp_path: Path) -> None:
    """With plane_order dropped the pages come out mis-ordered, and sha256 must say so."""
    stored = rng_data((3, 2, 8, 9), "uint16")
    canonical = np.ascontiguousarray(stored.transpose(1, 0, 2, 3))
    _, archive = byte_exact(tmp_path, stored, canonical, "o.tif", [], metadata={"axes": "ZCYX"})
    with pytest.raises(recover_tool.RecoveryError, match="sha256"):
        recover_tool.recover(archive)


def test_verbatim(tmp_path: Path) -> None:
    raw = bytes(np.random.default_rng(3).integers(0, 256, 1000, dtype=np.uint8))
    doc = manifest(raw, "x.csv", "verbatim")
    archive = write_archive(
        tmp_path / "x.zarr.zip", doc, {"original": np.frombuffer(raw, np.uint8)}, husk_chunk=300
    )
    assert recover_tool.recover(archive) == {"x.csv": raw}


def test_verbatim_empty(tmp_path: Path) -> None:
    doc = manifest(b"", "empty.tif", "verbatim")
    archive = write_archive(tmp_path / "e.zarr.zip", doc, {"original": np.zeros(0, np.uint8)})
    assert recover_tool.recover(archive) == {"empty.tif": b""}


def test_series_consolidated(tmp_path: Path) -> None:
    planes = rng_data((3, 10, 12), "uint8")
    members, arrays, page_base = [], {}, 0
    for n, count in enumerate((1, 2)):
        name = f"sub/m{n}.tif"
        (tmp_path / "sub").mkdir(exist_ok=True)
        tifffile.imwrite(tmp_path / name, planes[page_base : page_base + count], rowsperstrip=3)
        raw = (tmp_path / name).read_bytes()
        pages = page_records(raw, tmp_path / name, first_index=page_base)
        husk = husk_of(raw, pages)
        arrays[f"husk_{n}"] = np.frombuffer(husk, dtype=np.uint8)
        members.append({
            "relpath": name, "original_size": len(raw), "byteorder": "<",
            "original_sha256": hashlib.sha256(raw).hexdigest(), "husk_array": f"husk_{n}",
            "husk_raw_size": len(husk), "pages": pages, "raw": raw,
        })  # fmt: skip
        page_base += count
    originals = {m["relpath"]: m.pop("raw") for m in members}
    doc = manifest(b"", "s.zarr.zip", "series", members=members, series_consolidated=True)
    doc.update(original_size=0, original_sha256="", plane_order=["z"])
    archive = write_archive(tmp_path / "s.zarr.zip", doc, {"0": planes, **arrays})
    assert recover_tool.recover(archive) == originals


def test_series_nested_and_cli(tmp_path: Path) -> None:
    base = tmp_path / "series.zarr"
    base.mkdir()
    data = rng_data((2, 9, 14), "uint16")
    raw0, sub0 = byte_exact(tmp_path, data, data, "a.tif", ["z"])
    raw1 = b"time,value\n0,1\n"
    sub1 = write_archive(
        tmp_path / "b.zarr.zip", manifest(raw1, "b.csv", "verbatim"),
        {"original": np.frombuffer(raw1, np.uint8)},
    )  # fmt: skip
    members = []
    for n, (sub, raw, rel) in enumerate(((sub0, raw0, "a.tif"), (sub1, raw1, "deep/b.csv"))):
        sub.rename(base / f"m{n}.zarr.zip")
        members.append({
            "relpath": rel, "original_size": len(raw), "byteorder": "<",
            "original_sha256": hashlib.sha256(raw).hexdigest(), "subarchive": f"m{n}.zarr.zip",
        })  # fmt: skip
    doc = manifest(b"", "series.zarr", "series", members=members)
    doc.update(original_size=0, original_sha256="")
    (base / ".decant").mkdir()
    (base / ".decant" / "manifest.json").write_text(json.dumps(doc))
    assert recover_tool.recover(base) == {"a.tif": raw0, "deep/b.csv": raw1}

    out = tmp_path / "out"
    assert recover_tool.main([str(base), str(out)]) == 0
    assert (out / "a.tif").read_bytes() == raw0
    assert (out / "deep" / "b.csv").read_bytes() == raw1


def test_cli_sha_mismatch_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = b"0123456789" * 10
    doc = manifest(raw, "f.bin", "verbatim", original_sha256="0" * 64)
    archive = write_archive(
        tmp_path / "f.zarr.zip", doc, {"original": np.frombuffer(raw, np.uint8)}
    )
    out = tmp_path / "out"
    assert recover_tool.main([str(archive), str(out)]) == 1
    assert list(out.iterdir()) == []
    assert "sha256 mismatch" in capsys.readouterr().err


def test_unknown_format_refused(tmp_path: Path) -> None:
    raw = b"abc"
    doc = manifest(raw, "f.bin", "verbatim", format=2)
    archive = write_archive(
        tmp_path / "f.zarr.zip", doc, {"original": np.frombuffer(raw, np.uint8)}
    )
    with pytest.raises(recover_tool.RecoveryError, match="format 2"):
        recover_tool.recover(archive)
    assert recover_tool.main([str(archive), str(tmp_path / "out")]) == 2


def test_short_husk_is_an_error(tmp_path: Path) -> None:
    data = rng_data((1, 5, 6), "uint8")
    raw, pages = tiff(tmp_path / "h.tif", data)
    husk = husk_of(raw, pages)[:-3]
    doc = manifest(raw, "h.tif", "byte-exact", pages=pages, plane_order=["z"])
    arrays = {"0": data, "husk": np.frombuffer(husk, dtype=np.uint8)}
    with pytest.raises(recover_tool.RecoveryError, match="husk"):
        recover_tool.recover(write_archive(tmp_path / "h.zarr.zip", doc, arrays))


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    y=st.integers(1, 40), x=st.integers(1, 40), spp=st.sampled_from([1, 3]),
    planar=st.booleans(), tile=st.sampled_from([None, (16, 16), (16, 32)]),
    dtype=st.sampled_from(["uint8", "int16", "float32"]), byteorder=st.sampled_from("<>"),
)  # fmt: skip
def test_random_layouts(
    tmp_path_factory: pytest.TempPathFactory, y: int, x: int, spp: int, planar: bool,
    tile: tuple[int, int] | None, dtype: str, byteorder: str,
) -> None:  # fmt: skip
    tmp = tmp_path_factory.mktemp("h")
    yxs = rng_data((y, x, spp), dtype, seed=y * 41 + x)
    kwargs: dict[str, Any] = {"byteorder": byteorder, "tile": tile, "rowsperstrip": 3}
    if spp == 1:
        data, canonical = yxs[..., 0], yxs[None, ..., 0]
        kwargs["photometric"] = "minisblack"
    else:
        data = np.moveaxis(yxs, -1, 0) if planar else yxs
        canonical = yxs[None]
        kwargs.update(photometric="rgb", planarconfig="separate" if planar else "contig")
    raw, archive = byte_exact(tmp, data, canonical, "r.tif", ["z"], **kwargs)
    assert recover_tool.recover(archive) == {"r.tif": raw}


def test_a_missing_chunk_is_refused_when_the_writer_stored_every_chunk(
    tmp_path: Path, packed_corpus: dict[str, Any]
) -> None:
    """The packer stores every chunk (all_chunks_stored): zarr's fill value must not stand in."""
    name = next(n for n, r in packed_corpus.items() if r.mode == "byte-exact")
    archive = Path(packed_corpus[name].archive)
    with zipfile.ZipFile(archive) as zin:
        manifest_doc = json.loads(zin.read(".decant/manifest.json"))
        assert manifest_doc.get("all_chunks_stored") is True
        dropped = next(n for n in zin.namelist() if n.startswith("0/") and "/." not in n)
        damaged = tmp_path / archive.name
        with zipfile.ZipFile(damaged, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                if info.filename != dropped:
                    zout.writestr(info.filename, zin.read(info))
    assert recover_tool.recover(archive)  # the intact archive recovers
    with pytest.raises(recover_tool.RecoveryError, match="missing"):
        recover_tool.recover(damaged)
