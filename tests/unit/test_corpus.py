"""tools/make_corpus.py: every promised file exists, is reproducible, and has the layout it claims.

Layouts are checked from the raw TIFF tags (and header bytes), not from the generator's own
parameters, so a tifffile default that silently changed a layout would show up here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from tests.toolbox import load_tool

make_corpus = load_tool("make_corpus")

NOT_TIFF = {"not_a_tiff.csv", "empty.tif", "one_byte.tif"}
EXPECTED = {
    "striped_chunky_gray_u8.tif", "striped_odd_u16_37x53.tif", "striped_i16.tif",
    "striped_f32_specials.tif", "striped_chunky_rgb_u8.tif", "striped_planar_rgb_u16.tif",
    "striped_planar_2samples_i16.tif", "tiled_chunky_u16.tif", "tiled_chunky_rgb_u8_edge.tif",
    "tiled_planar_rgb_u16_edge.tif", "tiled_f32_narrow.tif", "zstack_u16.tif",
    "imagej_hyperstack_tzc_u16.tif", "ome_zcyx_u16.ome.tif", "ome_ztcyx_u8.ome.tif",
    "ome_czyx_u16.ome.tif", "bigtiff_u16_2pages.tif", "bigtiff_tiled_planar_rgb_u16_edge.tif",
    "bigendian_u16_2pages.tif", "bigendian_tiled_f32_edge.tif",
    "bigendian_bigtiff_planar_rgb_i16.tif", "trailing_description_u8.tif", "mixed_shapes_u8.tif",
    "zlib_u16.tif", "zlib_predictor_u16.tif", "zlib_tiled_rgb_u8.tif", "lzw_u8.tif",
    "packbits_u8.tif", *NOT_TIFF,
}  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    paths = make_corpus.generate(tmp_path_factory.mktemp("corpus"))
    return {p.name: p for p in paths}


def tag(page: Any, name: str, default: Any = None) -> Any:
    """A raw tag value (None/default when absent): the file's claim, not tifffile's reading."""
    t = page.tags.get(name)
    return default if t is None else t.value


def layout(path: Path) -> dict[str, Any]:
    """The first page's layout facts, straight from tags and header bytes."""
    head = path.read_bytes()[:4]
    with tifffile.TiffFile(path) as tif:
        p = tif.pages.first
        return {
            "order": head[:2], "bigtiff": head[2:4] in (b"\x2b\x00", b"\x00\x2b"),
            "tiled": "TileWidth" in p.tags, "tw": tag(p, "TileWidth", 0),
            "tl": tag(p, "TileLength", 0), "w": tag(p, "ImageWidth"), "h": tag(p, "ImageLength"),
            "spp": tag(p, "SamplesPerPixel", 1), "planar": int(tag(p, "PlanarConfiguration", 1)),
            "bps": tag(p, "BitsPerSample"), "fmt": int(np.ravel(tag(p, "SampleFormat", 1))[0]),
            "rps": tag(p, "RowsPerStrip", 0), "comp": int(tag(p, "Compression", 1)),
            "pred": int(tag(p, "Predictor", 1)), "pages": len(tif.pages),
            "axes": tif.series[0].axes, "ome": tif.is_ome, "imagej": tif.is_imagej,
        }  # fmt: skip


def edges(f: dict[str, Any]) -> bool:
    return f["w"] % f["tw"] != 0 and f["h"] % f["tl"] != 0


CLAIMS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "striped_chunky_gray_u8.tif": lambda f: not f["tiled"] and f["spp"] == 1 and f["bps"] == 8,
    "striped_odd_u16_37x53.tif": lambda f: (f["w"], f["h"], f["rps"], f["bps"]) == (37, 53, 10, 16),
    "striped_i16.tif": lambda f: f["fmt"] == 2 and f["bps"] == 16 and f["h"] % f["rps"] != 0,
    "striped_f32_specials.tif": lambda f: f["fmt"] == 3 and f["bps"] == 32 and not f["tiled"],
    "striped_chunky_rgb_u8.tif": lambda f: f["spp"] == 3 and f["planar"] == 1 and not f["tiled"],
    "striped_planar_rgb_u16.tif": lambda f: f["spp"] == 3 and f["planar"] == 2 and not f["tiled"],
    "striped_planar_2samples_i16.tif": lambda f: f["spp"] == 2 and f["planar"] == 2,
    "tiled_chunky_u16.tif": lambda f: f["tiled"] and f["w"] % f["tw"] == 0 == f["h"] % f["tl"],
    "tiled_chunky_rgb_u8_edge.tif": lambda f: f["tiled"] and f["planar"] == 1 and edges(f),
    "tiled_planar_rgb_u16_edge.tif": lambda f: (
        f["tiled"] and f["planar"] == 2 and f["spp"] == 3 and f["bps"] == (16, 16, 16) and edges(f)
    ),
    "tiled_f32_narrow.tif": lambda f: f["tiled"] and f["w"] < f["tw"] and f["fmt"] == 3,
    "zstack_u16.tif": lambda f: f["pages"] == 6 and f["axes"] == "ZYX",
    "imagej_hyperstack_tzc_u16.tif": lambda f: f["imagej"] and f["axes"] == "TZCYX",
    "ome_zcyx_u16.ome.tif": lambda f: f["ome"] and f["axes"] == "ZCYX" and f["pages"] == 6,
    "ome_ztcyx_u8.ome.tif": lambda f: f["ome"] and f["axes"] == "ZTCYX" and f["pages"] == 12,
    "ome_czyx_u16.ome.tif": lambda f: f["ome"] and f["axes"] == "CZYX",
    "bigtiff_u16_2pages.tif": lambda f: f["bigtiff"] and f["order"] == b"II" and f["pages"] == 2,
    "bigtiff_tiled_planar_rgb_u16_edge.tif": lambda f: (
        f["bigtiff"] and f["tiled"] and f["planar"] == 2 and edges(f)
    ),
    "bigendian_u16_2pages.tif": lambda f: f["order"] == b"MM" and not f["bigtiff"],
    "bigendian_tiled_f32_edge.tif": lambda f: f["order"] == b"MM" and f["tiled"] and edges(f),
    "bigendian_bigtiff_planar_rgb_i16.tif": lambda f: (
        f["order"] == b"MM" and f["bigtiff"] and f["planar"] == 2 and f["fmt"] == 2
    ),
    "trailing_description_u8.tif": lambda f: f["comp"] == 1,
    "mixed_shapes_u8.tif": lambda f: f["pages"] == 3,
    "zlib_u16.tif": lambda f: f["comp"] == 8 and f["pred"] == 1,
    "zlib_predictor_u16.tif": lambda f: f["comp"] == 8 and f["pred"] == 2,
    "zlib_tiled_rgb_u8.tif": lambda f: f["comp"] == 8 and f["tiled"] and f["spp"] == 3,
    "lzw_u8.tif": lambda f: f["comp"] == 5,
    "packbits_u8.tif": lambda f: f["comp"] == 32773,
}
UNCOMPRESSED_PRED1 = {n for n in CLAIMS if not n.startswith(("zlib", "lzw", "packbits"))}


def test_every_listed_file_is_written(corpus: dict[str, Path]) -> None:
    assert set(corpus) == EXPECTED == set(CLAIMS) | NOT_TIFF
    assert all(p.is_file() for p in corpus.values())


def test_deterministic(corpus: dict[str, Path], tmp_path: Path) -> None:
    again = make_corpus.generate(tmp_path)
    for p in again:
        assert hashlib.sha256(p.read_bytes()).digest() == (
            hashlib.sha256(corpus[p.name].read_bytes()).digest()
        ), p.name


def test_small_corpus_stays_small(corpus: dict[str, Path]) -> None:
    sizes = [p.stat().st_size for p in corpus.values()]
    assert sum(sizes) < 20 * 2**20
    assert sum(s < 2**20 for s in sizes) > 0.8 * len(sizes)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_layout_claim(corpus: dict[str, Path], name: str) -> None:
    facts = layout(corpus[name])
    assert CLAIMS[name](facts), facts
    if name in UNCOMPRESSED_PRED1:
        assert (facts["comp"], facts["pred"]) == (1, 1)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_pixels_decode(corpus: dict[str, Path], name: str) -> None:
    """tifffile opens every TIFF; LZW it cannot decode without imagecodecs, so Pillow checks it."""
    with tifffile.TiffFile(corpus[name]) as tif:
        if name == "lzw_u8.tif":
            image = pytest.importorskip("PIL.Image")
            with image.open(corpus[name]) as im:
                assert np.asarray(im).shape == tif.pages.first.shape
            return
        for page in tif.pages:
            a = page.asarray()
            assert a.size and np.unique(a).size > 1


@pytest.mark.parametrize("name", sorted(NOT_TIFF))
def test_non_tiffs_are_refused(corpus: dict[str, Path], name: str) -> None:
    with pytest.raises(tifffile.TiffFileError):
        tifffile.TiffFile(corpus[name]).close()
    size = corpus[name].stat().st_size
    assert size == {"empty.tif": 0, "one_byte.tif": 1}.get(name, size) and size < 2**20


def test_tiled_edge_tiles_carry_padding(corpus: dict[str, Path]) -> None:
    """Edge tiles are stored full-size, so their padding is real bytes the husk must hold."""
    with tifffile.TiffFile(corpus["tiled_planar_rgb_u16_edge.tif"]) as tif:
        p = tif.pages.first
        across, down = -(-p.imagewidth // p.tilewidth), -(-p.imagelength // p.tilelength)
        assert len(p.dataoffsets) == 3 * across * down
        assert set(p.databytecounts) == {p.tilewidth * p.tilelength * 2}


def test_description_after_pixels(corpus: dict[str, Path]) -> None:
    with tifffile.TiffFile(corpus["trailing_description_u8.tif"]) as tif:
        p = tif.pages.first
        pixel_end = max(o + c for o, c in zip(p.dataoffsets, p.databytecounts, strict=True))
        assert p.tags["ImageDescription"].valueoffset >= pixel_end


def test_storage_orders_are_non_canonical(corpus: dict[str, Path]) -> None:
    """Pages enumerate in storage order; canonical is t→c→z, which these files violate."""
    rank = {"T": 0, "C": 1, "Z": 2}
    for name in ("imagej_hyperstack_tzc_u16.tif", "ome_zcyx_u16.ome.tif", "ome_ztcyx_u8.ome.tif"):
        axes = layout(corpus[name])["axes"][:-2]
        assert [rank[a] for a in axes] != sorted(rank[a] for a in axes), name


def test_mixed_page_shapes_differ(corpus: dict[str, Path]) -> None:
    with tifffile.TiffFile(corpus["mixed_shapes_u8.tif"]) as tif:
        assert len({p.shape for p in tif.pages}) == 3


def test_float_specials_are_in_the_file(corpus: dict[str, Path]) -> None:
    bits = tifffile.imread(corpus["striped_f32_specials.tif"]).view(np.uint32)[0, :6]
    assert list(bits) == [0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0, 0x7FC01234]


def test_lzw_encoder_round_trips_through_pillow(tmp_path: Path) -> None:
    """The hand-written LZW must switch widths and emit Clear where libtiff expects them."""
    image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(7)
    a = np.concatenate([rng.integers(0, 256, 9000), np.repeat(rng.integers(0, 3, 300), 40)])
    a = a.astype(np.uint8).reshape(1, -1)
    make_corpus.pre_encoded(tmp_path / "l.tif", a, 5, make_corpus.lzw_encode, rps=1)
    with image.open(tmp_path / "l.tif") as im:
        assert np.array_equal(np.asarray(im), a)


def test_stack_is_streamed_uint16_planes(tmp_path: Path) -> None:
    out = make_corpus.write_stack(tmp_path / "s.tif", 2 / 128)  # two 8 MiB planes
    with tifffile.TiffFile(out) as tif:
        assert len(tif.pages) == 2
        a, b = tif.pages[0].asarray(), tif.pages[1].asarray()
    assert a.shape == (2048, 2048) and a.dtype == np.uint16
    assert not np.array_equal(a, b) and np.unique(a).size > 1000
    assert abs(out.stat().st_size - 2 * 2048 * 2048 * 2) < 2**16


def test_cli_needs_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        make_corpus.main([])
    assert "OUTDIR" in capsys.readouterr().err


def test_large_corpus_keeps_the_layouts(tmp_path: Path) -> None:
    """Scaling up must not land a size on a tile or strip multiple and lose an edge case."""
    paths = make_corpus.generate(tmp_path, size="large")
    assert {p.name for p in paths} == EXPECTED
    failing = [p.name for p in paths if p.name in CLAIMS and not CLAIMS[p.name](layout(p))]
    assert failing == []
