#!/usr/bin/env python3
"""The job decant-mount does, shown on microscopy-sized data and checked byte for byte.

    .venv/bin/python tools/demo.py [WORKDIR] [--keep] [--planes N]

1. Generates four uint16 z-stacks of 32 planes of 1024 x 1024 (64 MiB each, 256 MiB in all):
   blurred blobs (sums of separable Gaussians, one matrix product a stack) over a camera offset,
   with shot and read noise at a few hundred to a few thousand photons, so that blosc-zstd holds
   them in about half their size, as it does real fluorescence stacks. They are written striped,
   tiled (256 x 256), as an OME-TIFF and as an ImageJ two-channel hyperstack. Full size is kept:
   packing 256 MiB takes a few seconds on 2 cores, and smaller stacks would make read speeds noise.
2. Packs them with `decant pack` and makes a crypt4gh-encrypted GDI package (`.tar.c4gh`) for a
   key generated here (helpers of tools/make_c4gh_corpus.py; its parquet members need pyarrow).
3. Mounts SRC with `decant-mount` (writable, with the key), reads every original through the
   mount and from disk (page cache dropped before each read when root, else "warm"), compares
   sha256, opens each stack with tifffile through the mount, lists the package's members and
   compares their bytes, then `rsync -a`s a small folder into the mount and waits until it is
   archived.

Exits 1, saying why, if any byte differs or ingest does not finish. The console scripts are run
by full path next to sys.executable: the demo is run without the venv on PATH. WORKDIR (default
a temporary folder, removed at the end unless --keep) is kept when given.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import tifffile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLANES, SIDE = 32, 1024
MiB = 1 << 20
INGEST_TIMEOUT = 60.0
PACKAGE = "cohort-af.tar.c4gh"
Writer = Callable[[Path, np.ndarray], tuple[int, ...]]  # returns the shape written


class DemoError(Exception):
    """A step that could not go on; main prints the message and exits 1."""


# -- commands ---------------------------------------------------------------------------------


def console(script: str, entry: str) -> list[str]:
    """A console script of this interpreter's environment, by full path (never from PATH)."""
    path = Path(sys.executable).parent / script
    if path.is_file():
        return [str(path)]
    module, func = entry.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


DECANT = console("decant", "vfs.commands:main")
DECANT_MOUNT = console("decant-mount", "vfs.cli:main")


def command_env() -> dict[str, str]:
    """Run the `vfs` of the checkout this demo lives in, even if the venv's is another one."""
    env = dict(os.environ)
    if (ROOT / "vfs").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run(cmd: list[str], what: str) -> str:
    """Run a command; its stdout, or DemoError with its stderr."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=command_env(), check=False)
    if done.returncode != 0:
        raise DemoError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_demo_{name}", HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve through sys.modules
    spec.loader.exec_module(module)
    return module


# -- data -------------------------------------------------------------------------------------


def microscopy_stack(rng: np.random.Generator, peak: float, planes: int = PLANES,
                     side: int = SIDE) -> np.ndarray:  # fmt: skip
    """Blurred blobs + shot noise + read noise over a camera offset, as uint16 (planes, side²)."""
    blobs = 40

    def profiles(n: int, lo: float, hi: float) -> np.ndarray:
        centre, width = rng.uniform(0, n, blobs), rng.uniform(lo, hi, blobs)
        axis = np.arange(n, dtype=np.float32)[:, None]
        return np.exp(-0.5 * ((axis - centre) / width) ** 2).astype(np.float32)

    pz, py, px = profiles(planes, 2, 10), profiles(side, 8, 120), profiles(side, 8, 120)
    weight = pz * (rng.uniform(0.2, 1.0, blobs).astype(np.float32) * peak)
    photons = (py[None, :, :] * weight[:, None, :]) @ px.T  # sum of separable 3-D Gaussians
    photons += 20.0  # autofluorescence background
    noise = rng.standard_normal(photons.shape, dtype=np.float32)
    noise *= np.sqrt(photons + 4.0)  # Poisson shot noise (Gaussian limit) + read noise sigma 2
    photons += noise
    photons += 100.5  # camera offset, and rounding
    np.clip(photons, 0, 65535, out=photons)
    return photons.astype(np.uint16)


def write_striped(path: Path, data: np.ndarray) -> tuple[int, ...]:
    tifffile.imwrite(path, data)
    return data.shape


def write_tiled(path: Path, data: np.ndarray) -> tuple[int, ...]:
    tifffile.imwrite(path, data, tile=(256, 256))
    return data.shape


def write_ome(path: Path, data: np.ndarray) -> tuple[int, ...]:
    meta = {"axes": "ZYX", "PhysicalSizeX": 0.1625, "PhysicalSizeY": 0.1625, "PhysicalSizeZ": 0.5}
    tifffile.imwrite(path, data, ome=True, metadata=meta)
    return data.shape


def write_imagej(path: Path, data: np.ndarray) -> tuple[int, ...]:
    zcyx = data.reshape(data.shape[0] // 2, 2, SIDE, SIDE)  # planes alternate: two channels
    meta = {"axes": "ZCYX", "spacing": 0.5, "unit": "um"}
    tifffile.imwrite(path, zcyx, imagej=True, metadata=meta, resolution=(1 / 0.1625, 1 / 0.1625))
    return zcyx.shape


# name, layout, brightest blob in photons (sets how noisy, i.e. how compressible), writer
STACKS: list[tuple[str, str, float, Writer]] = [
    ("nuclei_striped.tif", "striped", 400.0, write_striped),
    ("actin_tiled.tif", "tiled 256x256", 1000.0, write_tiled),
    ("membrane.ome.tif", "OME-TIFF ZYX", 2000.0, write_ome),
    ("twocolour_imagej.tif", "ImageJ ZCYX", 3000.0, write_imagej),
]


@dataclass
class Stack:
    path: Path
    layout: str
    shape: tuple[int, ...]
    probe: tuple[int, int, int]  # (page, y, x) checked through the mount
    value: int  # the generated pixel there


def generate_stacks(folder: Path, planes: int = PLANES) -> list[Stack]:
    folder.mkdir(parents=True, exist_ok=True)
    stacks = []
    for seed, (name, layout, peak, write) in enumerate(STACKS):
        rng = np.random.default_rng(seed)
        data = microscopy_stack(rng, peak, planes)
        shape = write(folder / name, data)
        page, y, x = (int(v) for v in rng.integers(0, (planes, SIDE, SIDE)))
        stacks.append(Stack(folder / name, layout, shape, (page, y, x), int(data[page, y, x])))
    return stacks


def write_ingest_folder(folder: Path) -> list[Path]:
    """What an acquisition PC leaves behind: a few small stacks and their text sidecars."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(100)
    for well in ("A01", "A02", "A03"):
        tifffile.imwrite(folder / f"well-{well}.tif", microscopy_stack(rng, 800.0, 8, 512))
    settings = {"objective": "40x/1.3 oil", "exposure_ms": 50, "wells": ["A01", "A02", "A03"]}
    (folder / "acquisition.json").write_text(json.dumps(settings, indent=2) + "\n")
    (folder / "notes.txt").write_text("plate 7, stained 2024-05-03; A03 slightly out of focus\n")
    return sorted(folder.iterdir())


# -- measuring --------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(MiB):
            digest.update(block)
    return digest.hexdigest()


def drop_caches() -> bool:
    """Drop the page cache (root only): True if the next read is cold."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def read_speed(path: Path) -> tuple[float, bool]:
    """(MB/s of one front-to-back read in 1 MiB requests, whether it was cold)."""
    cold = drop_caches()
    buf = bytearray(MiB)
    total, start = 0, time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            total += n
    return total / 1e6 / (time.perf_counter() - start), cold


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


# -- steps ------------------------------------------------------------------------------------


@dataclass
class Report:
    problems: list[str]

    def check(self, ok: bool, problem: str) -> str:
        if not ok:
            self.problems.append(problem)
        return "byte-exact" if ok else "DIFFERENT"


def pack(stacks: list[Stack], src: Path) -> None:
    start = time.perf_counter()
    run([*DECANT, "pack", *(str(s.path) for s in stacks), "-o", str(src)], "decant pack")
    print(f"2. Packed them with `decant pack` in {time.perf_counter() - start:.1f} s\n")
    print(f"   {'file':22} {'layout':15} {'mode':11} {'original':>10} {'archive':>10} "
          f"{'archive/original':>17}")  # fmt: skip
    before = after = 0
    for s in stacks:
        archive = src / f"{s.path.name}.zarr.zip"
        size, packed = s.path.stat().st_size, archive.stat().st_size
        before, after = before + size, after + packed
        print(f"   {s.path.name:22} {s.layout:15} {archive_mode(archive):11} {human(size):>10} "
              f"{human(packed):>10} {packed / size:>17.3f}")  # fmt: skip
    print(f"   {'total':50} {human(before):>10} {human(after):>10} {after / before:>17.3f}")
    print(f"   space saved: {human(before - after)} ({1 - after / before:.0%})\n")


def archive_mode(archive: Path) -> str:
    """The mode `decant pack` chose, from the archive's own manifest (spec §4b)."""
    with zipfile.ZipFile(archive) as z:
        return str(json.loads(z.read(".decant/manifest.json"))["mode"])


def make_package(src: Path, keys: Path) -> tuple[Path, dict[str, bytes]]:
    """A GDI package for a node key made here; returns the key and the members put in."""
    c4gh = load_tool("make_c4gh_corpus")
    node, writer = c4gh.make_keypair(keys, "node"), c4gh.make_keypair(keys, "writer")
    members = c4gh.gdi_members((20000, 1500), long_name=False)
    c4gh.write_package(src / PACKAGE, members, writer, [node])
    size = human((src / PACKAGE).stat().st_size)
    print(f"3. Made a GDI package {PACKAGE} ({size}), crypt4gh-encrypted for keys/node.sec\n")
    return node.secret_path, dict(members)


@contextmanager
def mounted(src: Path, mnt: Path, work: Path, key: Path) -> Iterator[None]:
    """`decant-mount SRC MNT`, always unmounted afterwards, even when a check fails."""
    log = work / "decant-mount.log"
    cmd = [*DECANT_MOUNT, str(src), str(mnt), "--index-dir", str(work / "index"),
           "--log-file", str(log), "--c4gh-key", str(key)]  # fmt: skip
    run(cmd, "decant-mount")
    print(f"4. Mounted: decant-mount {src.name} {mnt.name} --c4gh-key keys/{key.name} "
          f"(writable; log {log.name})\n")  # fmt: skip
    try:
        yield
    finally:
        if os.path.ismount(mnt):
            subprocess.run([*DECANT_MOUNT, "-u", str(mnt)], env=command_env(), check=False)


def compare_reads(stacks: list[Stack], mnt: Path, report: Report) -> None:
    print("5. Every original read through the mount, against the plain TIFF on disk")
    drop_caches()
    start = time.perf_counter()
    with open(mnt / stacks[0].path.name, "rb") as fh:
        fh.read(4096)
    print(f"   first 4 KiB through the fresh mount: {time.perf_counter() - start:.2f} s\n")
    print(f"   {'file':22} {'disk MB/s':>10} {'mount MB/s':>11} {'mount/disk':>11}"
          "  sha256 through the mount")  # fmt: skip
    colds = []
    for s in stacks:
        disk, cold_disk = read_speed(s.path)
        via, cold_mount = read_speed(mnt / s.path.name)
        colds += [cold_disk, cold_mount]
        verdict = report.check(sha256(mnt / s.path.name) == sha256(s.path),
                               f"{s.path.name}: sha256 through the mount differs")  # fmt: skip
        print(f"   {s.path.name:22} {disk:>10.0f} {via:>11.0f} {via / disk:>11.2f}  {verdict}")
    how = "cold: page cache dropped before each read" if all(colds) else "warm: not root"
    print(f"   ({how}; 1 MiB reads; MB = 10^6 bytes)")
    print("   (a first read through the mount also checks the file's sha256, and the first file")
    print("   read after mounting pays for the daemon warming up)\n")


def open_with_tifffile(stacks: list[Stack], mnt: Path, report: Report) -> None:
    print("6. tifffile opens each original through the mount and reads one page of it")
    print(f"   {'file':22} {'series shape':20} {'dtype':7} {'pixel (page, y, x)':19} "
          f"{'mount':>6} {'generated':>9}")  # fmt: skip
    for stack in stacks:
        page, y, x = stack.probe
        with tifffile.TiffFile(mnt / stack.path.name) as tif:
            shape, dtype = tuple(tif.series[0].shape), tif.series[0].dtype
            value = int(tif.pages[page].asarray()[y, x])
        ok = shape == stack.shape and dtype == np.uint16 and value == stack.value
        if not ok:
            report.problems.append(f"tifffile, {stack.path.name}: {shape} {dtype} {value}")
        print(f"   {stack.path.name:22} {shape!s:20} {dtype!s:7} {stack.probe!s:19} "
              f"{value:>6} {stack.value:>9}  {'same' if ok else 'DIFFERENT'}")  # fmt: skip
    print()


def list_package(mnt: Path, members: dict[str, bytes], report: Report) -> None:
    folder = mnt / PACKAGE
    print(f"7. {PACKAGE} through the mount: a folder of decrypted members")
    found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    width = max(map(len, found), default=0)
    for name in found:
        data = (folder / name).read_bytes()
        verdict = report.check(data == members.get(name), f"{PACKAGE}/{name}: bytes differ")
        print(f"   {name:{width}} {human(len(data)):>10}  {verdict}")
    if found != sorted(members):
        report.problems.append(f"{PACKAGE}: members {found}, packed {sorted(members)}")
    print(f"   ({len(found)} of {len(members)} members, each compared with what was packed)\n")


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def wait_ingested(mnt: Path, count: int) -> float:
    """Seconds until `count` files are published, or DemoError after INGEST_TIMEOUT."""
    start = time.monotonic()
    while True:
        doc = status(mnt)
        if doc["failed"]:
            raise DemoError(f"ingest failed: {doc['failed']}")
        if doc["done"] >= count and doc["queued"] == 0 and doc["packing"] == 0:
            return time.monotonic() - start
        if time.monotonic() - start > INGEST_TIMEOUT:
            raise DemoError(f"ingest did not finish in {INGEST_TIMEOUT:.0f} s: {doc}")
        time.sleep(0.2)


def ingest(incoming: Path, src: Path, mnt: Path, report: Report) -> None:
    files = write_ingest_folder(incoming / "plate-07")
    rsync = shutil.which("rsync")
    if rsync is None:
        raise DemoError("rsync is not installed (apt-get install rsync)")
    run([rsync, "-a", f"{incoming}/", f"{mnt}/"], "rsync -a into the mount")
    print(f"8. rsync -a {incoming.name}/ {mnt.name}/ ({len(files)} files), then waited for the"
          " pack queue")  # fmt: skip
    waited = wait_ingested(mnt, len(files))
    line = run([*DECANT_MOUNT, "--status", str(mnt)], "decant-mount --status").strip()
    print(f"   decant-mount --status {mnt.name}: {line}  (after {waited:.1f} s)")
    print(f"   {'copied in':26} {'size':>9}   {'now in SRC':34} {'size':>9}  {'as':18}"
          "  through the mount")  # fmt: skip
    for path in files:
        print("   " + landed(path, path.relative_to(incoming), src, mnt, report))
    print()


def landed(path: Path, rel: Path, src: Path, mnt: Path, report: Report) -> str:
    """One row: where an ingested file went in SRC, and whether the mount gives it back."""
    archive = src / f"{rel}.zarr.zip"
    stored = archive if archive.exists() else src / rel
    if path.suffix == ".tif" and stored != archive:
        report.problems.append(f"{rel}: a TIFF copied in was not archived")
    verdict = report.check(sha256(mnt / rel) == sha256(path), f"{rel}: differs after ingest")
    size, kept = human(path.stat().st_size), human(stored.stat().st_size)
    how = f"{archive_mode(archive)} archive" if stored == archive else "plain file, moved"
    return f"{rel!s:26} {size:>9}   {stored.relative_to(src)!s:34} {kept:>9}  {how:18}  {verdict}"


# -- main -------------------------------------------------------------------------------------


def prepare(work: Path) -> None:
    """Start from empty folders (a kept WORKDIR may hold a previous run)."""
    if os.path.ismount(work / "mnt"):
        raise DemoError(f"{work / 'mnt'} is still mounted: decant-mount -u {work / 'mnt'}")
    for name in ("originals", "src", "mnt", "keys", "incoming", "index"):
        shutil.rmtree(work / name, ignore_errors=True)
        (work / name).mkdir(parents=True)
    (work / "decant-mount.log").unlink(missing_ok=True)


def demo(work: Path, report: Report, planes: int = PLANES) -> None:
    prepare(work)
    src, mnt = work / "src", work / "mnt"
    start = time.perf_counter()
    stacks = generate_stacks(work / "originals", planes)
    print(f"1. Generated {len(stacks)} microscopy-like uint16 z-stacks ({planes} planes of "
          f"{SIDE}x{SIDE}) in {time.perf_counter() - start:.1f} s\n")  # fmt: skip
    pack(stacks, src)
    key, members = make_package(src, work / "keys")
    with mounted(src, mnt, work, key):
        compare_reads(stacks, mnt, report)
        open_with_tifffile(stacks, mnt, report)
        list_package(mnt, members, report)
        ingest(work / "incoming", src, mnt, report)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", nargs="?", type=Path, help="kept (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--planes", type=int, default=PLANES, choices=range(2, 257, 2),
                        metavar="N", help=f"planes per stack, even, 2-256 (default {PLANES}); "
                        "the tests run fewer: the same job on less data")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="decant-demo-"))
    print(f"decant-mount demo in {work}\n")
    start, report = time.perf_counter(), Report([])
    try:
        demo(work.resolve(), report, args.planes)
    except (DemoError, OSError) as exc:
        report.problems.append(str(exc))
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for problem in report.problems:
        print(f"FAILED: {problem}")
    verdict = "FAILED" if report.problems else "every file byte-exact through the mount"
    print(f"{verdict} ({time.perf_counter() - start:.0f} s)")
    if args.workdir is not None or args.keep:
        print(f"kept {work}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
