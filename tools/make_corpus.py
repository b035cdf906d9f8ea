#!/usr/bin/env python3
"""Deterministic TIFF corpus covering every layout of spec §5, plus a large stack for benchmarks.

Standalone on purpose (tifffile + numpy only, nothing from `vfs`): the corpus is the yardstick the
packer is measured against, so it must not share the packer's idea of what a TIFF looks like.

    python tools/make_corpus.py OUTDIR [--size small|large]
    python tools/make_corpus.py --stack OUT.tif --gib 1
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

Writer = Callable[[Path, np.random.Generator, int], None]
WRITERS: dict[str, Writer] = {}
SCALES = {"small": 1, "large": 8}
STACK_PLANE = (2048, 2048)
# A fixed OME UUID/Creator: tifffile otherwise stamps uuid1() and its version, breaking determinism.
OME_FIXED = {"UUID": "urn:uuid:00000000-0000-4000-8000-00000000dec1", "Creator": "make_corpus"}


def corpus_file(name: str) -> Callable[[Writer], Writer]:
    """Register a writer under its output file name; the registry is the corpus file list."""

    def register(fn: Writer) -> Writer:
        WRITERS[name] = fn
        return fn

    return register


def pixels(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Gradient plus noise: compressible like microscopy, yet no two planes or pages alike."""
    ramp = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / max(np.prod(shape), 1)
    value = 0.8 * ramp + 0.2 * rng.random(shape)
    if dtype == "float32":
        return (value * 2.0 - 1.0).astype(np.float32)
    if dtype == "int16":
        return (value * 60000.0 - 30000.0).astype(np.int16)
    return (value * (np.iinfo(dtype).max - 1)).astype(dtype)


def odd(n: int, k: int) -> int:
    """Scale a base size while keeping it off every strip/tile multiple (k=1 keeps it as is)."""
    return n * k + k - 1


def write(path: Path, data: np.ndarray, **kwargs: Any) -> None:
    """One place for tifffile defaults; no DateTime tag is written, so output is reproducible."""
    tifffile.imwrite(path, data, **kwargs)


@corpus_file("striped_chunky_gray_u8.tif")
def _striped_gray(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (48 * k, 64 * k), "uint8"), rowsperstrip=16)


@corpus_file("striped_odd_u16_37x53.tif")
def _striped_odd(p: Path, rng: np.random.Generator, k: int) -> None:
    """Odd width/height (same at every size), rowsperstrip 10 not dividing 53: short last strip."""
    write(p, pixels(rng, (53, 37), "uint16"), rowsperstrip=10)


@corpus_file("striped_i16.tif")
def _striped_i16(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (odd(40, k), odd(33, k)), "int16"), rowsperstrip=7)


@corpus_file("striped_f32_specials.tif")
def _striped_f32(p: Path, rng: np.random.Generator, k: int) -> None:
    """NaN (two payloads), ±inf and -0.0: float bits must survive the archive untouched."""
    a = pixels(rng, (odd(31, k), odd(29, k)), "float32")
    bits = a.view(np.uint32)
    a[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.nan]
    bits[0, 5] = 0x7FC0_1234  # quiet NaN with a non-default payload
    write(p, a, rowsperstrip=8)


@corpus_file("striped_chunky_rgb_u8.tif")
def _striped_rgb(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (odd(35, k), odd(41, k), 3), "uint8")
    write(p, a, photometric="rgb", planarconfig="contig", rowsperstrip=6)


@corpus_file("striped_planar_rgb_u16.tif")
def _striped_planar(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (3, odd(29, k), odd(43, k)), "uint16")
    write(p, a, photometric="rgb", planarconfig="separate", rowsperstrip=5)


@corpus_file("striped_planar_2samples_i16.tif")
def _striped_planar_2s(p: Path, rng: np.random.Generator, k: int) -> None:
    """Two samples per pixel without RGB (ExtraSamples): S is not always 3."""
    a = pixels(rng, (2, odd(22, k), odd(31, k)), "int16")
    write(p, a, photometric="minisblack", planarconfig="separate", rowsperstrip=9)


@corpus_file("tiled_chunky_u16.tif")
def _tiled_exact(p: Path, rng: np.random.Generator, k: int) -> None:
    """Width and height exact tile multiples: no edge tiles."""
    write(p, pixels(rng, (64 * k, 96 * k), "uint16"), tile=(32, 32))


@corpus_file("tiled_chunky_rgb_u8_edge.tif")
def _tiled_rgb_edge(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (odd(50, k), odd(70, k), 3), "uint8")
    write(p, a, photometric="rgb", planarconfig="contig", tile=(16, 32))


@corpus_file("tiled_planar_rgb_u16_edge.tif")
def _tiled_planar_edge(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (3, odd(45, k), odd(70, k)), "uint16")
    write(p, a, photometric="rgb", planarconfig="separate", tile=(16, 32))


@corpus_file("tiled_f32_narrow.tif")
def _tiled_narrow(p: Path, rng: np.random.Generator, k: int) -> None:
    """Image narrower than one tile: every tile is a right-edge tile."""
    write(p, pixels(rng, (odd(40, k), 20), "float32"), tile=(16, 32))


@corpus_file("zstack_u16.tif")
def _zstack(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (6, odd(24, k), odd(32, k)), "uint16"), metadata={"axes": "ZYX"})


@corpus_file("imagej_hyperstack_tzc_u16.tif")
def _imagej(p: Path, rng: np.random.Generator, k: int) -> None:
    """ImageJ stores TZCYX: z before c is not canonical (t→c→z)."""
    a = pixels(rng, (2, 3, 2, odd(20, k), odd(30, k)), "uint16")
    write(p, a, imagej=True, metadata={"axes": "TZCYX"})


@corpus_file("ome_zcyx_u16.ome.tif")
def _ome_zc(p: Path, rng: np.random.Generator, k: int) -> None:
    """DimensionOrder XYCZT: pages run c fastest inside z, storage order z→c."""
    a = pixels(rng, (3, 2, odd(20, k), odd(30, k)), "uint16")
    write(p, a, metadata={"axes": "ZCYX", **OME_FIXED})


@corpus_file("ome_ztcyx_u8.ome.tif")
def _ome_ztc(p: Path, rng: np.random.Generator, k: int) -> None:
    """DimensionOrder XYCTZ: t sits between z and c, the most scrambled storage order."""
    a = pixels(rng, (3, 2, 2, odd(16, k), odd(24, k)), "uint8")
    write(p, a, metadata={"axes": "ZTCYX", **OME_FIXED})


@corpus_file("ome_czyx_u16.ome.tif")
def _ome_cz(p: Path, rng: np.random.Generator, k: int) -> None:
    """Control: storage order c→z is already canonical."""
    a = pixels(rng, (2, 3, odd(18, k), odd(26, k)), "uint16")
    write(p, a, metadata={"axes": "CZYX", **OME_FIXED})


@corpus_file("bigtiff_u16_2pages.tif")
def _bigtiff(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (2, odd(33, k), odd(47, k)), "uint16"), bigtiff=True, rowsperstrip=8)


@corpus_file("bigtiff_tiled_planar_rgb_u16_edge.tif")
def _bigtiff_tiled(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (3, odd(21, k), odd(40, k)), "uint16")
    write(p, a, bigtiff=True, photometric="rgb", planarconfig="separate", tile=(16, 16))


@corpus_file("bigendian_u16_2pages.tif")
def _bigendian(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (2, odd(27, k), odd(39, k)), "uint16"), byteorder=">", rowsperstrip=4)


@corpus_file("bigendian_tiled_f32_edge.tif")
def _bigendian_tiled(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (odd(53, k), odd(37, k)), "float32"), byteorder=">", tile=(16, 16))


@corpus_file("bigendian_bigtiff_planar_rgb_i16.tif")
def _bigendian_bigtiff(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (3, odd(19, k), odd(23, k)), "int16")
    write(p, a, byteorder=">", bigtiff=True, photometric="rgb", planarconfig="separate")


@corpus_file("trailing_description_u8.tif")
def _trailing(p: Path, rng: np.random.Generator, k: int) -> None:
    """tiffcomment moves a grown ImageDescription to the end of the file, after the pixels."""
    write(p, pixels(rng, (odd(20, k), odd(30, k)), "uint8"), description="short")
    tifffile.tiffcomment(p, "metadata written after the pixel data; " * 16)


@corpus_file("mixed_shapes_u8.tif")
def _mixed(p: Path, rng: np.random.Generator, k: int) -> None:
    """Three pages of different shapes (three tifffile series)."""
    with tifffile.TiffWriter(p) as tif:
        for shape in ((30 * k, 40 * k), (odd(17, k), odd(23, k)), (50 * k, 10 * k)):
            tif.write(pixels(rng, shape, "uint8"), rowsperstrip=8)


@corpus_file("zlib_u16.tif")
def _zlib(p: Path, rng: np.random.Generator, k: int) -> None:
    write(p, pixels(rng, (odd(40, k), odd(50, k)), "uint16"), compression="zlib", rowsperstrip=8)


@corpus_file("zlib_predictor_u16.tif")
def _zlib_pred(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (2, odd(40, k), odd(50, k)), "uint16")
    write(p, a, compression="zlib", predictor=2, rowsperstrip=8)


@corpus_file("zlib_tiled_rgb_u8.tif")
def _zlib_tiled(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (odd(33, k), odd(45, k), 3), "uint8")
    write(p, a, photometric="rgb", compression="zlib", tile=(16, 16))


@corpus_file("lzw_u8.tif")
def _lzw(p: Path, rng: np.random.Generator, k: int) -> None:
    """tifffile encodes LZW only via imagecodecs, so we encode; strips long enough for a Clear."""
    pre_encoded(p, pixels(rng, (odd(60, k), odd(97, k)), "uint8"), 5, lzw_encode, rps=64)


@corpus_file("packbits_u8.tif")
def _packbits(p: Path, rng: np.random.Generator, k: int) -> None:
    a = pixels(rng, (odd(30, k), odd(41, k)), "uint8")
    a[:, : a.shape[1] // 2] = 7  # long runs, so PackBits has something to pack
    pre_encoded(p, a, 32773, packbits_encode, rps=8)


@corpus_file("not_a_tiff.csv")
def _csv(p: Path, rng: np.random.Generator, k: int) -> None:
    rows = ["t,x,y,intensity"]
    rows += [f"{i},{x},{y},{v}" for i, (x, y, v) in enumerate(rng.integers(0, 999, (40 * k, 3)))]
    p.write_text("\n".join(rows) + "\n", encoding="ascii")


@corpus_file("empty.tif")
def _empty(p: Path, rng: np.random.Generator, k: int) -> None:
    p.write_bytes(b"")


@corpus_file("one_byte.tif")
def _one_byte(p: Path, rng: np.random.Generator, k: int) -> None:
    p.write_bytes(b"I")


def pre_encoded(
    path: Path, a: np.ndarray, code: int, encode: Callable[[bytes], bytes], rps: int
) -> None:
    """Write strips we encoded ourselves, then set the Compression tag tifffile cannot write.

    tifffile refuses LZW/PackBits without imagecodecs even for ready-encoded bytes, so the
    strips go in labelled zlib and the tag is overwritten in place (same size, same offset).
    """
    strips = [encode(a[y : y + rps].tobytes()) for y in range(0, a.shape[0], rps)]
    tifffile.imwrite(
        path, iter(strips), shape=a.shape, dtype=a.dtype, compression="zlib", rowsperstrip=rps
    )
    with tifffile.TiffFile(path, mode="r+b") as tif:
        tif.pages.first.tags["Compression"].overwrite(code)


def lzw_encode(data: bytes) -> bytes:
    """TIFF LZW: MSB-first codes, 9→12 bits with the TIFF 'early change', Clear at 4094."""
    out = bytearray()
    acc = nbits = 0

    def put(code: int, width: int) -> None:
        nonlocal acc, nbits
        acc = (acc << width) | code
        nbits += width
        while nbits >= 8:
            nbits -= 8
            out.append((acc >> nbits) & 0xFF)
        acc &= (1 << nbits) - 1

    def fresh() -> dict[bytes, int]:
        return {bytes([i]): i for i in range(256)}

    table, nxt, width = fresh(), 258, 9
    put(256, width)
    w = data[:1]
    for i in range(1, len(data) + 1):
        c = data[i : i + 1]
        if c and w + c in table:
            w += c
            continue
        put(table[w], width)
        # Count an entry for every code, even the last (the decoder adds a phantom one after it
        # while reading EOI): that keeps both sides switching code width on the same code.
        table[w + c] = nxt
        nxt += 1
        if nxt == 4094:
            put(256, width)
            table, nxt, width = fresh(), 258, 9
        elif nxt == 1 << width:
            width += 1
        w = c
    put(257, width)
    if nbits:
        out.append((acc << (8 - nbits)) & 0xFF)
    return bytes(out)


def packbits_encode(data: bytes) -> bytes:
    """PackBits: runs of ≥3 equal bytes as (1-n, byte), everything else as literal blocks."""
    out = bytearray()
    i, lit = 0, bytearray()
    while i < len(data):
        run = 1
        while i + run < len(data) and run < 128 and data[i + run] == data[i]:
            run += 1
        if lit and (run >= 3 or len(lit) == 128):
            out += bytes([len(lit) - 1]) + lit
            lit = bytearray()
        if run >= 3:
            out += bytes([257 - run, data[i]])
            i += run
        else:
            lit.append(data[i])
            i += 1
    if lit:
        out += bytes([len(lit) - 1]) + lit
    return bytes(out)


def generate(outdir: Path, size: str = "small") -> list[Path]:
    """Write the whole corpus into outdir; each file has its own seed, so output is stable."""
    k = SCALES[size]
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, writer in WRITERS.items():
        path = outdir / name
        path.unlink(missing_ok=True)  # tifffile.tiffcomment and r+ patches must start fresh
        writer(path, np.random.default_rng(zlib.crc32(name.encode())), k)
        written.append(path)
    return written


def stack_planes(count: int, seed: int = 1) -> Iterator[np.ndarray]:
    """Yield 2048×2048 uint16 planes one at a time: a drifting gradient plus 6-bit noise."""
    rng = np.random.default_rng(seed)
    yy = np.arange(STACK_PLANE[0], dtype=np.float32)[:, None]  # broadcast: no full index grids
    xx = np.arange(STACK_PLANE[1], dtype=np.float32)[None, :]
    base = 1500.0 + 900.0 * np.sin(xx / 310.0) * np.cos(yy / 270.0) + 0.4 * (xx + yy)
    for z in range(count):
        plane = base + 300.0 * np.sin(z / 9.0 + yy / 500.0)
        noise = rng.integers(0, 64, STACK_PLANE, dtype=np.uint16)
        yield plane.astype(np.uint16) + noise


def write_stack(out: Path, gib: float) -> Path:
    """Multi-page uint16 stack of about `gib` GiB, streamed so memory stays at a few planes."""
    plane_bytes = STACK_PLANE[0] * STACK_PLANE[1] * 2
    count = max(1, round(gib * 2**30 / plane_bytes))
    bigtiff = count * plane_bytes > 2**32 - 2**26
    out.parent.mkdir(parents=True, exist_ok=True)
    with tifffile.TiffWriter(out, bigtiff=bigtiff) as tif:
        planes = stack_planes(count)
        tif.write(planes, shape=(count, *STACK_PLANE), dtype=np.uint16, metadata={"axes": "ZYX"})
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("outdir", nargs="?", type=Path, help="folder that receives the corpus")
    ap.add_argument("--size", choices=sorted(SCALES), default="small")
    ap.add_argument("--stack", type=Path, metavar="OUT.tif", help="write a benchmark stack")
    ap.add_argument("--gib", type=float, default=1.0, help="stack size in GiB (with --stack)")
    args = ap.parse_args(argv)
    if args.stack is None and args.outdir is None:
        ap.error("give OUTDIR or --stack OUT.tif")
    if args.stack is not None:
        print(write_stack(args.stack, args.gib))
    if args.outdir is not None:
        for path in generate(args.outdir, args.size):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
