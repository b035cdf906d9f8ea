#!/usr/bin/env python3
"""Independent recovery reader (spec §7): a decant archive back to its original bytes.

Uses only zarr, numcodecs, numpy and the standard library and shares no code with `vfs` (nor
decant), so a bug in decant's own reader cannot hide inside the proof that archives recover.

    python tools/recover.py ARCHIVE OUTDIR    # exit 1 on a sha256 mismatch, 2 on a bad archive
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import zarr

MANIFEST = ".decant/manifest.json"
RANK = {"t": 0, "z": 2}  # canonical order time → channel/custom (rank 1) → space
Original = tuple[str, int, str, Iterator[bytes]]  # name, size, sha256, byte chunks in file order


class RecoveryError(Exception):
    """The archive is not something this reader may reconstruct (spec §6: refuse, never guess)."""


def page_reader(pixels: Any, plane_order: list[str], page_ndim: int) -> Callable[[int], Any]:
    """§5: storage page index → plane of the canonically ordered pixel array."""
    leading = pixels.shape[: pixels.ndim - page_ndim]
    names = [n.lower() for n in plane_order]
    if len(names) != len(leading):  # empty (back-compat) or not describing 0: plain unravel
        names = ["c"] * len(leading)
    perm = sorted(range(len(names)), key=lambda i: RANK.get(names[i], 1))  # stable
    storage_shape = [leading[perm.index(i)] for i in range(len(perm))]

    def read(index: int) -> Any:
        s = np.unravel_index(index, storage_shape)
        return pixels[tuple(int(s[p]) for p in perm)]

    return read


def serialize_page(a: Any, pm: dict[str, Any], byteorder: str) -> bytes:
    """A page's on-disk pixel bytes: striped chunky/planar, or tiled minus edge padding."""
    a = np.asarray(a).astype(np.dtype(pm["dtype"]).newbyteorder(byteorder), copy=False)
    a = a[:, :, None] if a.ndim == 2 else a
    planes = [a[:, :, s : s + 1] for s in range(a.shape[2])] if pm["planarconfig"] == 2 else [a]
    tw, tl = pm.get("tilewidth", 0), pm.get("tilelength", 0)
    if not (tw and tl):
        return b"".join(p.tobytes() for p in planes)
    ys, xs = range(0, a.shape[0], tl), range(0, a.shape[1], tw)
    return b"".join(p[y : y + tl, x : x + tw].tobytes() for p in planes for y in ys for x in xs)


def husk_reader(husk: Any) -> Callable[[int], bytes]:
    """Sequential husk reads decoding each husk chunk once: memory stays near one chunk."""
    buf, nxt, step = bytearray(), 0, husk.chunks[0]

    def take(n: int) -> bytes:
        nonlocal nxt
        while len(buf) < n:
            if nxt >= husk.shape[0]:
                raise RecoveryError("the husk is shorter than the manifest needs")
            buf.extend(husk[nxt : nxt + step].tobytes())
            nxt += step
        out = bytes(buf[:n])
        del buf[:n]  # CPython trims a bytearray's head in O(1)
        return out

    return take


def walk(group: Any, husk: str, pages: list[dict[str, Any]], order: list[str], byteorder: str,
         size: int) -> Iterator[bytes]:  # fmt: skip
    """§5 splice: pixel segments and husk gaps in ascending file offset, one page held at a time."""
    pixels = group[group.attrs.get("decant", {}).get("pixels", "0")] if pages else None
    regions = []
    for k, pm in enumerate(pages):
        pos = 0
        for off, cnt in zip(pm["dataoffsets"], pm["databytecounts"], strict=True):
            regions.append((off, cnt, k, pos))
            pos += cnt
    regions.sort()
    take, cur, held = husk_reader(group[husk]), 0, (-1, b"")
    for off, cnt, k, ppos in regions:
        if off > cur:
            yield take(off - cur)
        if held[0] != k:
            read = page_reader(pixels, order, len(pages[k]["shape"]))
            held = (k, serialize_page(read(pages[k]["index"]), pages[k], byteorder))
        yield held[1][ppos : ppos + cnt]
        cur = off + cnt
    if cur < size:
        yield take(size - cur)


def open_group(path: Path, stack: ExitStack) -> Any:
    """The archive's Zarr v2 group, from a .zarr.zip or a .zarr/ directory."""
    if path.is_dir():
        store: Any = zarr.storage.LocalStore(path, read_only=True)
    else:
        store = zarr.storage.ZipStore(path, mode="r")
        stack.callback(store.close)
    return zarr.open_group(store, mode="r", zarr_format=2)


def check_all_chunks(path: Path, group: Any) -> None:
    """zarr reads a missing chunk as the fill value; an archive whose writer stored every chunk
    (`all_chunks_stored`) must not be recovered with zeros where data was lost."""
    if path.is_dir():
        keys = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    else:
        with zipfile.ZipFile(path) as zf:
            keys = set(zf.namelist())
    for name, arr in group.arrays():
        sep = getattr(arr.metadata, "dimension_separator", None) or "."
        grid = [range(-(-n // c)) for n, c in zip(arr.shape, arr.chunks, strict=True)]
        for index in itertools.product(*grid):
            key = f"{name}/" + sep.join(map(str, index)) if index else f"{name}/0"
            if key not in keys:
                raise RecoveryError(f"{path}: chunk {key!r} is missing; refusing to fill zeros")


def read_manifest(path: Path) -> dict[str, Any]:
    """The .decant/manifest.json store key; refuses any format but 1 (spec §6)."""
    if path.is_dir():
        raw = (path / MANIFEST).read_bytes()
    else:
        with zipfile.ZipFile(path) as zf:
            raw = zf.read(MANIFEST)
    manifest = json.loads(raw)
    if manifest.get("format") != 1:
        raise RecoveryError(f"{path}: format {manifest.get('format')!r} is not 1; refusing")
    return manifest


def originals(path: Path, stack: ExitStack) -> Iterator[Original]:
    """Every original in the archive, each as (name, size, sha256, lazily produced chunks)."""
    m = read_manifest(path)
    mode, members = m["mode"], m.get("members") or []
    if mode == "series" and not m["series_consolidated"]:
        for mem in members:
            for _, _, _, chunks in originals(path / mem["subarchive"], stack):
                yield mem["relpath"], mem["original_size"], mem["original_sha256"], chunks
        return
    group = open_group(path, stack)
    if m.get("all_chunks_stored"):
        check_all_chunks(path, group)
    if mode == "series":
        for mem in members:
            size = mem["original_size"]
            chunks = walk(group, mem["husk_array"], mem["pages"], m["plane_order"],
                          mem["byteorder"], size)  # fmt: skip
            yield mem["relpath"], size, mem["original_sha256"], chunks
        return
    if mode == "verbatim":
        arr = group["original"]
        step = arr.chunks[0] or 1
        chunks = (arr[i : i + step].tobytes() for i in range(0, arr.shape[0], step))
    elif mode == "byte-exact":
        chunks = walk(
            group, "husk", m["pages"], m["plane_order"], m["byteorder"], m["original_size"]
        )
    else:
        raise RecoveryError(f"{path}: unknown mode {mode!r}")
    yield m["original_name"], m["original_size"], m["original_sha256"], chunks


def recover(archive: Path, verify: bool = True) -> dict[str, bytes]:
    """All originals in memory, keyed by relpath (series) or original_name; checks sha256."""
    out = {}
    with ExitStack() as stack:
        for name, _size, sha, chunks in originals(Path(archive), stack):
            data = b"".join(chunks)
            if verify and hashlib.sha256(data).hexdigest() != sha:
                raise RecoveryError(f"{archive}: {name}: sha256 mismatch")
            out[name] = data
    return out


def main(argv: list[str] | None = None) -> int:
    """Stream each original to OUTDIR via a .part file; only a verified file gets its name."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print("usage: recover.py ARCHIVE OUTDIR", file=sys.stderr)
        return 2
    archive, outdir, status = Path(args[0]), Path(args[1]), 0
    try:
        with ExitStack() as stack:
            for name, _size, sha, chunks in originals(archive, stack):
                dest = (outdir / name).resolve()
                if not dest.is_relative_to(outdir.resolve()):
                    raise RecoveryError(f"{archive}: member path {name!r} leaves OUTDIR")
                dest.parent.mkdir(parents=True, exist_ok=True)
                part, digest = dest.with_name(dest.name + ".part"), hashlib.sha256()
                with part.open("wb") as f:
                    for chunk in chunks:
                        digest.update(chunk)
                        f.write(chunk)
                if digest.hexdigest() == sha:
                    part.replace(dest)
                    print(dest)
                else:
                    part.unlink()
                    print(f"recover: {archive}: {name}: sha256 mismatch", file=sys.stderr)
                    status = 1
    except (RecoveryError, KeyError, OSError, ValueError) as e:
        print(f"recover: {archive}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
