"""decant benchmarks (issues 2 and 3, "Speed"): pack, restore, read, mount.

Each compares against a baseline taken in the same run on the same input: `cp` for pack and
restore, zarr-python's own read path for the core reader, an in-memory pyfuse3 filesystem
(tools/memfs.py) for the mount. Before every cold measurement the files it reads are evicted
from the page cache and dentries/inodes dropped (root); decant-mount is freshly mounted.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import shutil
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import (
    MB,
    TOOLS,
    CpuUse,
    MiB,
    Report,
    ThreadCpuSampler,
    common_options,
    dd_read,
    drop_caches,
    ensure_stack,
    evict_file,
    latency_text,
    log,
    machine_context,
    mbps,
    median,
    mounted,
    note_end,
    percentile,
    require,
    run_child,
    time_ls,
    timed_preads,
    tool,
    vm_hwm,
    workdir,
)

import vfs.decant.verify as _verify
from vfs.cache import PageCache
from vfs.cli import build_parser
from vfs.decant.layout import page_coordinate
from vfs.decant.manifest import parse_manifest
from vfs.decant.reader import DecantArchive, OriginalReader
from vfs.decant.regions import HUSK
from vfs.decant.store import MANIFEST_KEY

READ_SIZE = 4096
COLD_P99_TARGET_MS = 2.0  # a 4 KiB read on a fresh daemon, archive evicted
DEFAULT_CACHE: int = build_parser().get_default("cache_size")  # decant-mount's default


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): 'cold' listings will be warm")
    with workdir(args.workdir) as work:
        report = RUNNERS[command](args, work)
    note_end(report)
    print(report.render())
    return 0


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"bench.py {command}", parents=[common_options(repeat=3)], description=__doc__
    )
    if command in ("restore", "read", "mount"):
        p.add_argument(
            "--codec",
            help="pack the stack with this decant pack --codec (default: the packer's, the "
            "spec's zstd:byteshuffle:5); the report names it",
        )
    if command in ("read", "mount"):
        p.add_argument("--samples", type=int, default=256, help="cold random reads (default 256)")
    if command == "mount":
        p.add_argument(
            "--archives",
            type=int,
            default=1000,
            help="archives in the ls -l folder (0: skip the listing)",
        )
    return p


# -- inputs ----------------------------------------------------------------------------------


def codec_name(args: argparse.Namespace) -> str:
    return args.codec or "zstd:byteshuffle:5 (the packer's default)"


def ensure_archive(work: Path, stack: Path, codec: str | None = None) -> Path:
    """The stack packed by `decant pack` into work/src/ (the mount's SRC), reused when current:
    same mtime as the stack and packed with the same `--codec` (None: the packer's default)."""
    out = work / "src" / f"{stack.name}.zarr.zip"
    marker = work / "archive-codec.txt"  # outside SRC: the mount must not show it
    wanted = codec or "default"
    if (
        out.is_file()
        and out.stat().st_mtime_ns == stack.stat().st_mtime_ns  # the packer gives it this mtime
        and (marker.read_text() if marker.is_file() else "default") == wanted
    ):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    log(f"packing {stack.name} (codec: {wanted})")
    extra = ["--codec", codec] if codec else []
    require(run_child([*tool("decant"), "pack", stack, "-o", out, *extra]), "decant pack")
    marker.write_text(wanted)
    return out


def ensure_many(work: Path, count: int) -> Path:
    """`count` tiny valid archives with distinct original names, in one folder.

    One tiny TIFF is packed for real; the copies differ only in the manifest's original_name
    (what the mount shows), rewritten with the project's own manifest model, entries STORED.
    """
    folder = work / f"many-{count}"
    if folder.is_dir() and sum(1 for _ in folder.glob("*.zarr.zip")) == count:
        return folder
    part = folder.with_name(folder.name + ".part")
    for stale in (folder, part):
        shutil.rmtree(stale, ignore_errors=True)
    import tifffile

    tiny = work / "tiny.tif"
    tifffile.imwrite(tiny, np.arange(32 * 24, dtype=np.uint16).reshape(32, 24))
    template = work / "tiny.tif.zarr.zip"
    template.unlink(missing_ok=True)
    require(run_child([*tool("decant"), "pack", tiny, "-o", template]), "decant pack (tiny)")
    with zipfile.ZipFile(template) as zf:
        entries = [(info, zf.read(info)) for info in zf.infolist()]
    raw_manifest = next(data for info, data in entries if info.filename == MANIFEST_KEY)
    manifest = parse_manifest(raw_manifest, str(template))
    st = template.stat()
    part.mkdir(parents=True)
    log(f"writing {count} small archives")
    for i in range(count):
        name = f"tiny-{i:04d}.tif"
        raw = dataclasses.replace(manifest, original_name=name).dumps()
        dest = part / f"{name}.zarr.zip"
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
            for info, data in entries:
                out.writestr(info, raw if info.filename == MANIFEST_KEY else data)
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    require(run_child([*tool("decant"), "verify", dest]), "decant verify (renamed copy)")
    part.replace(folder)
    return folder


def largest_page(archive: Path) -> int:
    with DecantArchive.open(archive) as arc:
        return max((p.nbytes for p in arc.manifest.pages), default=0)


def cp_once(src: Path, work: Path, fsync: bool) -> float:
    """Seconds for a cold `cp` of the original (then `sync FILE` when the rival fsyncs too)."""
    dst = work / "cp-copy.bin"
    dst.unlink(missing_ok=True)
    drop_caches([src])
    seconds = require(run_child(["cp", src, dst]), "cp").seconds
    if fsync:
        seconds += require(run_child(["sync", dst]), "sync").seconds
    dst.unlink()
    return seconds


# -- pack and restore ------------------------------------------------------------------------


def bench_pack(args: argparse.Namespace, work: Path) -> Report:
    stack = ensure_stack(work, args.gib, args.stack)
    size = stack.stat().st_size
    report = Report("decant bench: pack", machine_context(input=f"{stack} ({size / MB:.1f} MB)"))
    out = work / "pack-out" / f"{stack.name}.zarr.zip"
    out.parent.mkdir(exist_ok=True)
    cp_s, cps_s, pack_runs = [], [], []
    for r in range(args.repeat):
        log(f"pack round {r + 1}/{args.repeat}")
        cp_s.append(cp_once(stack, work, fsync=False))
        cps_s.append(cp_once(stack, work, fsync=True))
        out.unlink(missing_ok=True)
        drop_caches([stack])
        pack_runs.append(require(run_child([*tool("decant"), "pack", stack, "-o", out]), "pack"))
    archive_size = out.stat().st_size
    cached = work / "src" / out.name
    if cached.exists():
        out.unlink()
    else:  # later commands reuse this archive
        cached.parent.mkdir(exist_ok=True)
        out.replace(cached)
    pack_s = median([p.seconds for p in pack_runs])
    report.section("baseline (same input; input evicted from the page cache before each run)")
    _throughput(report, "cp", size, cp_s)
    _throughput(report, "cp + fsync", size, cps_s)
    report.section("decant pack (scan, sha256, compress, fsync, reconstruct-and-verify)")
    _throughput(report, "decant pack", size, [p.seconds for p in pack_runs])
    report.add("pack peak RSS", f"{max(p.max_rss for p in pack_runs) / MiB:.0f} MiB")
    report.add("archive size", f"{archive_size / MB:.1f} MB")
    report.add("archive ÷ original", f"{archive_size / size:.3f}")
    report.section("ratios (medians)")
    report.add("pack MB/s ÷ cp MB/s", f"{median(cp_s) / pack_s:.3f}")
    report.add("pack MB/s ÷ cp+fsync MB/s", f"{median(cps_s) / pack_s:.3f}")
    return report


def bench_restore(args: argparse.Namespace, work: Path) -> Report:
    stack = ensure_stack(work, args.gib, args.stack)
    size = stack.stat().st_size
    archive = ensure_archive(work, stack, args.codec)
    plane = largest_page(archive)
    report = Report(
        "decant bench: restore",
        machine_context(input=f"{archive} ({size / MB:.1f} MB)", codec=codec_name(args)),
    )
    floor = require(run_child([*tool("decant"), "info", archive]), "decant info")
    out = work / "restored.tif"
    cp_s, cps_s, runs, checks = [], [], [], []
    for r in range(args.repeat):
        log(f"restore round {r + 1}/{args.repeat}")
        cp_s.append(cp_once(stack, work, fsync=False))
        cps_s.append(cp_once(stack, work, fsync=True))
        out.unlink(missing_ok=True)
        drop_caches([archive])
        runs.append(require(run_child([*tool("decant"), "restore", archive, "-o", out]), "restore"))
        out.unlink()
        drop_caches([archive])
        checks.append(require(run_child([*tool("decant"), "verify", archive]), "verify").seconds)
    restore_s = median([r.seconds for r in runs])
    report.section("baseline (same input; input evicted from the page cache before each run)")
    _throughput(report, "cp", size, cp_s)
    _throughput(report, "cp + fsync", size, cps_s)
    report.add("`decant info` (startup floor)", f"{floor.seconds:.2f} s")
    report.section("decant restore (reconstruct, sha256, O_DIRECT write, fsync, rename)")
    _throughput(report, "decant restore", size, [r.seconds for r in runs])
    _throughput(report, "decant verify (same, no write)", size, checks)
    report.section("ratios (medians)")
    ratio = median(cp_s) / restore_s
    report.target("restore MB/s ÷ cp MB/s", ratio, 0.5, "", at_most=False)
    report.add(
        "restore MB/s ÷ cp+fsync MB/s", f"{median(cps_s) / restore_s:.3f}", "(fair: both fsync)"
    )
    report.section("memory")
    rss = max(r.max_rss for r in runs)
    ahead = getattr(_verify, "AHEAD", 1)  # verify.private_cache: the planes in flight
    cache = (ahead + 1) * plane + 8 * MiB
    report.add("`decant info` peak RSS (imports floor)", f"{floor.max_rss / MiB:.0f} MiB")
    report.target("restore peak RSS", rss / MiB, (cache + 150 * MiB) / MiB, "MiB", at_most=True)
    report.add(
        "restore RSS above the floor",
        f"{(rss - floor.max_rss) / MiB:.0f} MiB",
        f"(its cache: {ahead + 1} planes + 8 MiB = {cache / MiB:.0f} MiB)",
    )
    return report


def _throughput(report: Report, label: str, size: int, seconds: list[float]) -> None:
    runs = " ".join(f"{s:.2f}" for s in seconds)
    report.add(label, f"{mbps(size, median(seconds)):.0f} MB/s", f"median of [{runs}] s")


# -- read: the core reader, no mount -------------------------------------------------------


def pixel_offsets(reader: OriginalReader, rng: random.Random, count: int) -> list[int]:
    """`count` 4 KiB-aligned offsets inside pixel segments, uniform over the pixel bytes."""
    regions = [r for r in reader.regions if r.page != HUSK and r.length >= 2 * READ_SIZE]
    chosen = rng.choices(regions, [r.length for r in regions], k=count)
    return [aligned_in((r.start, r.length), rng) for r in chosen]


class ZarrPath:
    """zarr-python's own route to the same bytes: ZipStore, array '0', the whole plane decoded."""

    def __init__(self, archive: Path, reader: OriginalReader, arc: DecantArchive) -> None:
        import zarr
        import zarr.storage

        self.store = zarr.storage.ZipStore(archive, mode="r")
        self.array = zarr.open_array(self.store, path="0", mode="r")
        self.reader = reader
        page = arc.manifest.pages[0]
        self.leading = tuple(self.array.shape[: self.array.ndim - len(page.shape)])
        order = arc.manifest.plane_order
        self.plane_order = order if len(order) == len(self.leading) else ()

    def prepare(self, offset: int) -> Callable[[], bytes]:
        region = self.reader.regions[self.reader.regions.locate(offset)]
        coord = page_coordinate(region.page, self.leading, self.plane_order)
        start = region.pos + offset - region.start

        def read() -> bytes:
            plane: Any = self.array[coord]
            return bytes(plane.view(np.uint8).reshape(-1)[start : start + READ_SIZE])

        return read

    def close(self) -> None:
        self.store.close()


def bench_read(args: argparse.Namespace, work: Path) -> Report:
    stack = ensure_stack(work, args.gib, args.stack)
    archive = ensure_archive(work, stack, args.codec)
    rng = random.Random(args.seed)
    with DecantArchive.open(archive) as arc:
        name = arc.manifest.original_name
        shared = arc.open_original(name, PageCache(DEFAULT_CACHE))
        offsets = pixel_offsets(shared, rng, args.samples)

        def core(offset: int) -> Callable[[], bytes]:
            reader = arc.open_original(name, PageCache(DEFAULT_CACHE))  # fresh: nothing decoded
            return lambda: reader.read(offset, READ_SIZE)

        zarr_path = ZarrPath(archive, shared, arc)
        try:
            for warm_up in (core(offsets[0]), zarr_path.prepare(offsets[0])):
                warm_up()  # first-use costs (zarr opens its zip lazily) are not compared
            log("cold reads, archive evicted from the page cache")
            disk = _interleaved(offsets, core, zarr_path.prepare, lambda: evict_file(archive))
            log("cold reads, archive bytes in the page cache")
            cached = _interleaved(offsets, core, zarr_path.prepare, lambda: None)
        finally:
            zarr_path.close()
        log("warm reads")
        warm = _warm_core(shared, rng, args.samples * 4)
    ctx = machine_context(
        input=f"{archive}", codec=codec_name(args), samples=f"{args.samples} cold, {len(warm)} warm"
    )
    report = Report("decant bench: read (random 4 KiB, no mount)", ctx)
    report.section("core reader: vfs.decant DecantArchive.open_original(...).read(off, 4096)")
    report.add("cold (fresh cache, archive evicted)", latency_text(disk[0]))
    report.target("cold p99", percentile(disk[0], 99) * 1e3, COLD_P99_TARGET_MS, "ms", at_most=True)
    report.add("cold decode (archive in page cache)", latency_text(cached[0]))
    report.add("warm (plane in the PageCache)", latency_text(warm))
    report.section("baseline: zarr-python ZipStore + zarr.open_array('0')[plane] (same offsets)")
    report.add("cold (archive evicted)", latency_text(disk[1]))
    report.add("cold decode (archive in page cache)", latency_text(cached[1]))
    report.section("ratios zarr ÷ core (> 1: the direct STORED-zip path is faster)")
    for label, (core_s, zarr_s) in (("archive evicted", disk), ("archive cached", cached)):
        p50 = percentile(zarr_s, 50) / percentile(core_s, 50)
        p99 = percentile(zarr_s, 99) / percentile(core_s, 99)
        report.add(label, f"p50 {p50:.2f}×  p99 {p99:.2f}×")
    return report


def _interleaved(
    offsets: list[int],
    core: Callable[[int], Callable[[], bytes]],
    zarr_read: Callable[[int], Callable[[], bytes]],
    before: Callable[[], None],
) -> tuple[list[float], list[float]]:
    """Time both paths on every offset, alternating which goes first, so drift hits both."""
    times: tuple[list[float], list[float]] = ([], [])
    for i, offset in enumerate(offsets):
        results: list[bytes] = []
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            read = (core, zarr_read)[which](offset)  # setup is not timed
            before()
            start = time.perf_counter()
            results.append(read())
            times[which].append(time.perf_counter() - start)
        if results[0] != results[1]:
            raise SystemExit(f"bench: core and zarr disagree at offset {offset}")
    return times


def _warm_core(reader: OriginalReader, rng: random.Random, count: int) -> list[float]:
    """Reads inside a few planes decoded beforehand: the cost of a PageCache hit plus slicing."""
    offsets = pixel_offsets(reader, rng, 8)
    pages = {reader.regions[reader.regions.locate(o)].page for o in offsets}
    spans = [r for r in reader.regions if r.page in pages and r.length >= 2 * READ_SIZE]
    for r in spans:
        reader.read(r.start, READ_SIZE)
    out = []
    for _ in range(count):
        r = rng.choice(spans)
        offset = r.start + rng.randrange(0, r.length - READ_SIZE, READ_SIZE)
        start = time.perf_counter()
        reader.read(offset, READ_SIZE)
        out.append(time.perf_counter() - start)
    return out


# -- mount: decant-mount against the memfs ceiling -----------------------------------------


@dataclasses.dataclass
class Mounts:
    """Where things are mounted and logged during one `mount` run."""

    work: Path
    cache_size: int = DEFAULT_CACHE
    count: int = 0

    def decant(self, src: Path, index: Path, tag: str, *extra: str) -> tuple[list[str], Path, Path]:
        """Command, mountpoint and log file for a foreground decant-mount of `src`."""
        self.count += 1
        logfile = self.work / "logs" / f"decant-{self.count:02d}-{tag}.log"
        logfile.parent.mkdir(exist_ok=True)
        cmd = [*tool("decant-mount"), str(src), str(self.work / "mnt-decant"), "-f"]
        cmd += ["--index-dir", str(index), "--log-file", str(logfile), *extra]
        return cmd, self.work / "mnt-decant", logfile

    def fresh_index(self, tag: str) -> Path:
        folder = self.work / "index" / f"{tag}-{time.monotonic_ns()}"
        folder.mkdir(parents=True)
        return folder


def plane_spans(reader: OriginalReader) -> dict[int, tuple[int, int]]:
    """Each page's longest pixel run (start, length): where a read lands in that plane only."""
    spans: dict[int, tuple[int, int]] = {}
    for r in reader.regions:
        if r.page != HUSK and r.length > spans.get(r.page, (0, 0))[1]:
            spans[r.page] = (r.start, r.length)
    return spans


def aligned_in(span: tuple[int, int], rng: random.Random) -> int:
    """A random 4 KiB-aligned offset whose whole read stays inside (start, length): aligned, so
    the kernel asks the daemon for exactly one page."""
    first = -(-span[0] // READ_SIZE) * READ_SIZE
    return first + rng.randrange(0, max(1, span[0] + span[1] - READ_SIZE - first), READ_SIZE)


def bench_mount(args: argparse.Namespace, work: Path) -> Report:
    stack = ensure_stack(work, args.gib, args.stack)
    archive = ensure_archive(work, stack, args.codec)
    many = ensure_many(work, args.archives) if args.archives else None
    size = stack.stat().st_size
    m = Mounts(work)
    rng = random.Random(args.seed)
    with DecantArchive.open(archive) as arc:
        name = arc.manifest.original_name
        reader = arc.open_original(name, PageCache(0))
        spans = plane_spans(reader)
        plane = largest_page(archive)
    seq = _sequential(args, m, stack, archive, name, spans, rng)
    rnd = _random_preads(args, m, archive, name, spans, plane, rng, seq["verified_index"])
    rnd.update(_disk_floor(archive, rng))
    ls = _listing(args, m, many) if many is not None else None
    ctx = machine_context(
        input=f"{stack.name} {size / MB:.1f} MB, {len(spans)} planes of {plane / MiB:g} MiB",
        read_ahead_kb=f"memfs {seq['ra_memfs']}, decant-mount {seq['ra_decant']}",
        cache=f"{m.cache_size / MiB:.0f} MiB (decant-mount default)",
        codec=codec_name(args),
    )
    report = Report("decant bench: mount", ctx)
    _report_sequential(report, seq, size, m.cache_size)
    _report_random(report, rnd, seq["memfs_pread"])
    if ls is not None:
        _report_listing(report, ls, args.archives)
    return report


def _sequential(
    args: argparse.Namespace,
    m: Mounts,
    stack: Path,
    archive: Path,
    name: str,
    spans: dict[int, tuple[int, int]],
    rng: random.Random,
) -> dict[str, Any]:
    """Rounds of: the plain TIFF from disk; memfs; decant first read (fresh daemon and index:
    hashing); decant once verified (fresh daemon, same index). Every figure cold: the file
    read is evicted from the page cache first, dentries and inodes dropped.

    Each daemon runs alone: memfs is mounted for its own figures only. Held for the whole run,
    its 1 GiB (as any process holding 2 GiB here) cut decant's verified read from 691-787 to
    187-290 MB/s, with 4.9 s of the daemon's system time instead of 0.55 s. The same 2 GiB
    held made memfs itself faster (859-987 -> 2202-2227 MB/s). Reads that fill the page cache
    (not opened direct_io) move with the state of this VM's memory, whichever way; no daemon
    is measured now beside another's gigabyte. Measured with these helpers, 2026-12-04."""
    size = stack.stat().st_size
    keys = ("plain", "memfs", "hashing", "verified")
    out: dict[str, Any] = {k: [] for k in (*keys, "hwm", "hwm_v", "verified_logged")}
    out.update({f"cpu_{k}": [] for k in keys})
    memfs = [sys.executable, str(TOOLS / "memfs.py"), str(m.work / "mnt-memfs"), str(stack), "-f"]
    for r in range(args.repeat):
        log(f"sequential round {r + 1}/{args.repeat}: plain TIFF from disk")
        drop_caches([stack])
        out["plain"].append(_dd(stack, size))
        log(f"sequential round {r + 1}/{args.repeat}: memfs")
        with mounted(memfs, m.work / "mnt-memfs", m.work / "logs" / "memfs.log") as mem:
            out["ra_memfs"] = mem.read_ahead_kb
            _dd(mem.mnt / stack.name, size)  # untimed: first touches are not the fs
            drop_caches([mem.mnt / stack.name])
            with ThreadCpuSampler(mem.pid) as cpu:
                out["memfs"].append(_dd(mem.mnt / stack.name, size))
            out["cpu_memfs"].append(cpu.use)
        index = m.fresh_index("seq")
        for key, hwm in (("hashing", "hwm"), ("verified", "hwm_v")):
            log(f"sequential round {r + 1}/{args.repeat}: decant-mount ({key})")
            cmd, mnt, logfile = m.decant(archive.parent, index, key)
            with mounted(cmd, mnt, logfile) as dec:
                out["ra_decant"] = dec.read_ahead_kb
                drop_caches([archive])
                with ThreadCpuSampler(dec.pid) as cpu:
                    out[key].append(_dd(mnt / name, size))
                out[f"cpu_{key}"].append(cpu.use)
                out[hwm].append(vm_hwm(dec.pid))
            if key == "hashing":
                out["verified_logged"].append("verified sha256" in logfile.read_text())
        out["verified_index"] = index  # the archive verified in it: for cold random reads
    log("random preads through memfs")
    offsets = [aligned_in(spans[p], rng) for p in rng.choices(list(spans), k=args.samples)]
    with mounted(memfs, m.work / "mnt-memfs", m.work / "logs" / "memfs.log") as mem:
        out["memfs_pread"] = timed_preads(mem.mnt / stack.name, offsets, evict=True)
    out["in_cache"], out["cpu_in_cache"], out["hwm_c"] = _served_from_cache(
        args, m, archive, name, size
    )
    return out


def _served_from_cache(
    args: argparse.Namespace, m: Mounts, archive: Path, name: str, size: int
) -> tuple[list[float], list[CpuUse], int]:
    """Warm: dd with every plane already decoded in a daemon cache big enough for the file
    (kernel pages evicted, so each request reaches the daemon). Against memfs this isolates the
    per-request path (trio, thread hand-off, copies, FUSE) from fetching and decoding planes."""
    log("sequential: decant-mount serving from its own cache (warm)")
    cache = ["--cache-size", str(size + 256 * MiB)]
    cmd, mnt, logfile = m.decant(archive.parent, m.fresh_index("cached"), "cached", *cache)
    out, cpus = [], []
    with mounted(cmd, mnt, logfile) as dec:
        _dd(mnt / name, size)  # decodes every plane (and verifies, so later opens do not hash)
        for _ in range(args.repeat):
            drop_caches([mnt / name])  # the kernel's copy only
            with ThreadCpuSampler(dec.pid) as cpu:
                out.append(_dd(mnt / name, size))
            cpus.append(cpu.use)
        hwm = vm_hwm(dec.pid)
    return out, cpus, hwm


def _dd(path: Path, size: int) -> float:
    seconds, nbytes = dd_read(path)
    if nbytes != size:
        raise SystemExit(f"bench: dd read {nbytes} bytes of {path}, expected {size}")
    return seconds


def _random_preads(
    args: argparse.Namespace,
    m: Mounts,
    archive: Path,
    name: str,
    spans: dict[int, tuple[int, int]],
    plane: int,
    rng: random.Random,
    verified_index: Path,
) -> dict[str, list[float]]:
    """Cold: fresh mounts, archive evicted, one read per plane; first on the index where the
    archive verified (what a remount serves), then on a fresh index (not verified yet). Warm
    and hot on the last verified-index mount: an archive not verified yet is served direct_io
    (no kernel page cache), so a "hot" figure there measured daemon reads."""
    out: dict[str, list[float]] = {"cold": [], "cold_verified": [], "warm": [], "hot": []}
    rounds = math.ceil(args.samples / len(spans))
    for r in range(rounds):
        log(f"random preads: cold mount on the verified index {r + 1}/{rounds}")
        cmd, mnt, logfile = m.decant(archive.parent, verified_index, "random-verified")
        with mounted(cmd, mnt, logfile):
            cold, read = _one_per_plane(mnt / name, archive, spans, rng)
            out["cold_verified"] += cold
            if r < rounds - 1:
                continue
            # The very offsets the cold reads took: a cold read decodes only the blocks it
            # needs, so another offset of the same plane would be a cold read again.
            keep = max(1, min(len(read), m.cache_size // max(plane, 1) - 2))
            warm = rng.choices(read[-keep:], k=4 * args.samples)  # still in the daemon's LRU
            log("random preads: warm (daemon cache) and hot (kernel page cache)")
            out["warm"] = timed_preads(mnt / name, warm, evict=True)
            timed_preads(mnt / name, warm, evict=False)  # fill the kernel's page cache
            out["hot"] = timed_preads(mnt / name, warm, evict=False)
    for r in range(rounds):
        log(f"random preads: cold mount {r + 1}/{rounds}")
        cmd, mnt, logfile = m.decant(archive.parent, m.fresh_index("rnd"), "random")
        with mounted(cmd, mnt, logfile):
            out["cold"] += _one_per_plane(mnt / name, archive, spans, rng)[0]
    return out


def _disk_floor(archive: Path, rng: random.Random) -> dict[str, list[float]]:
    """What the disk alone takes for a cold 4 KiB read's I/O, one sample per plane chunk in
    random order, the archive evicted: one pread of a blosc block's stream (typical size: the
    chunk's compressed bytes per block) at a random place in the chunk (all a verified read
    needs), and the same after a dependent 4 KiB pread of the chunk's head (the header and block
    table: what a read of an archive not verified yet reads first). No decode, no FUSE."""
    with zipfile.ZipFile(archive) as z:
        chunks = [i for i in z.infolist()
                  if i.filename.startswith("0/") and i.compress_type == zipfile.ZIP_STORED
                  and i.compress_size > 1 << 16]  # fmt: skip
        if not chunks:
            return {}  # planes too small to be read block by block
        head = z.open(chunks[0]).read(16)
    nbytes, blocksize, cbytes = (int.from_bytes(head[k : k + 4], "little") for k in (4, 8, 12))
    stream = -(-cbytes * min(blocksize, nbytes) // nbytes // 4096) * 4096
    rng.shuffle(chunks)
    out: dict[str, list[float]] = {"disk_one": [], "disk_two": [], "disk_stream": [stream]}
    drop_caches([archive])
    fd = os.open(archive, os.O_RDONLY)
    try:
        for info in chunks:
            start = info.header_offset + 30 + len(info.filename)  # about where its bytes start
            at = start + rng.randrange(0, max(1, info.compress_size - stream), 4096)
            t0 = time.perf_counter()
            os.pread(fd, 4096, start)
            t1 = time.perf_counter()
            os.pread(fd, stream, at)
            t2 = time.perf_counter()
            out["disk_one"].append(t2 - t1)
            out["disk_two"].append(t2 - t0)
    finally:
        os.close(fd)
    return out


def _one_per_plane(
    shown: Path, archive: Path, spans: dict[int, tuple[int, int]], rng: random.Random
) -> tuple[list[float], list[int]]:
    """Seconds of one aligned 4 KiB read per plane of `shown`, planes in random order, the
    archive evicted first; and the offsets read, in that order."""
    order = list(spans)
    rng.shuffle(order)
    offsets = [aligned_in(spans[p], rng) for p in order]
    drop_caches([archive])
    return timed_preads(shown, offsets, False), offsets


def ensure_names(work: Path, count: int) -> list[Path]:
    """`count` files named and sized as the originals the folder of small archives shows: what
    the memfs ceiling of the listing serves."""
    folder = work / f"names-{count}"
    folder.mkdir(exist_ok=True)
    tiny = (work / "tiny.tif").read_bytes()
    paths = [folder / f"tiny-{i:04d}.tif" for i in range(count)]
    for path in paths:
        if not path.is_file() or path.stat().st_size != len(tiny):
            path.write_bytes(tiny)
    return paths


def _listing(args: argparse.Namespace, m: Mounts, many: Path) -> dict[str, list[float]]:
    """`ls -l` of the folder of small archives: real folder, memfs serving the same names
    (getxattr answered, as decant-mount must), cold mount, remount with index."""
    out: dict[str, list[float]] = {"real": [], "memfs": [], "cold": [], "again": [], "indexed": []}
    names = ensure_names(m.work, args.archives)
    ceiling = m.work / "mnt-memfs"
    memfs = [
        sys.executable,
        str(TOOLS / "memfs.py"),
        str(ceiling),
        *map(str, names),
        "-f",
        "--xattrs",
    ]
    for r in range(args.repeat):
        log(f"ls -l round {r + 1}/{args.repeat}")
        drop_caches([many])
        out["real"].append(time_ls(many))
        with mounted(memfs, ceiling, m.work / "logs" / "memfs-ls.log"):
            drop_caches([])
            out["memfs"].append(time_ls(ceiling))
        index = m.fresh_index("ls")
        for key in ("cold", "indexed"):
            cmd, mnt, logfile = m.decant(many, index, f"ls-{key}")
            with mounted(cmd, mnt, logfile):
                drop_caches([many, index])
                out[key].append(time_ls(mnt))
                if key == "cold":
                    out["again"].append(time_ls(mnt))
                    shown = [n for n in os.listdir(mnt) if n.startswith("tiny-")]
                    if len(shown) != args.archives:
                        raise SystemExit(f"bench: mount shows {len(shown)} of {args.archives}")
    return out


def _report_sequential(report: Report, seq: dict[str, Any], size: int, cache: int) -> None:
    report.section(
        "sequential: dd bs=1M; cold = file evicted from the page cache, fresh decant daemon"
    )
    _throughput(report, "(p) plain TIFF from the same disk", size, seq["plain"])
    _throughput(report, "(m) memfs ceiling (in-memory pyfuse3)", size, seq["memfs"])
    _throughput(report, "(h) decant first read (hashing)", size, seq["hashing"])
    _throughput(report, "(v) decant already verified", size, seq["verified"])
    _throughput(report, "(w) decant warm (planes in its cache)", size, seq["in_cache"])
    report.section("ratios (per round: each figure ÷ the baseline of its own round)")
    for label, key, base, target in (
        ("(h)/(p) first read ÷ plain", "hashing", "plain", 0.6),
        ("(v)/(p) verified ÷ plain", "verified", "plain", 1.0),
        ("(h)/(m) first read ÷ memfs", "hashing", "memfs", 0.0),
        ("(v)/(m) verified ÷ memfs", "verified", "memfs", 0.0),
    ):
        ratios = [b / a for a, b in zip(seq[key], seq[base], strict=True)]
        if target:
            report.target(f"{label} median", median(ratios), target, "", at_most=False)
        else:
            report.add(f"{label} median", f"{median(ratios):.3f}")
        report.add("  per round", " ".join(f"{x:.2f}" for x in ratios))
    # Above 1, the plain file streamed faster than any FUSE file system can here (the "disk" is
    # the host's page cache behind virtio): the ratios to it then measure that, not decant.
    over = " ".join(f"{m / p:.2f}" for p, m in zip(seq["plain"], seq["memfs"], strict=True))
    report.add("(p)/(m) plain ÷ memfs ceiling, per round", over, "(> 1: plain beat FUSE)")
    warm = median(seq["memfs"]) / median(seq["in_cache"])
    report.target("(w)/(m) warm ÷ memfs (medians)", warm, 0.9, "", at_most=False)
    report.add(
        "hash verified on the first full read", f"{sum(seq['verified_logged'])}/{len(seq['plain'])}"
    )
    report.section("CPU while dd ran (medians of rounds; per-core busy counts every process)")
    for key, label in (
        ("memfs", "(m)"),
        ("hashing", "(h)"),
        ("verified", "(v)"),
        ("in_cache", "(w)"),
    ):
        uses: list[CpuUse] = seq[f"cpu_{key}"]
        mid = sorted(uses, key=lambda u: u.daemon_cores)[len(uses) // 2]
        report.add(f"{label} CPU", mid.text())
        per_gb = median([u.daemon_cores * u.seconds for u in uses]) / (size / 1e9)
        report.add(
            f"{label}   daemon CPU per GB served",
            f"{per_gb:.2f} s",
            "(less load-sensitive than MB/s; grows on a busy host too)",
        )
        per_s = " ".join(f"{c:.2f}" for c in mid.per_second)
        report.add(f"{label}   daemon cores per second", per_s or "-")
        report.add(f"{label}   threads (cores)", mid.threads_text())
        report.add(f"{label}   threads (CPU s per GB)", _per_gb_text(mid, size))
    report.section("memory: decant-mount VmHWM after streaming the file")
    limit = (cache + 150 * MiB) / MiB
    report.target("peak RSS, hashing", max(seq["hwm"]) / MiB, limit, "MiB", at_most=True)
    report.target("peak RSS, verified", max(seq["hwm_v"]) / MiB, limit, "MiB", at_most=True)
    warm_limit = (size + 256 * MiB + 150 * MiB) / MiB
    report.target("peak RSS, warm (cache = file + 256 MiB)", seq["hwm_c"] / MiB, warm_limit,
                  "MiB", at_most=True)  # fmt: skip


def _per_gb_text(use: CpuUse, size: int, top: int = 4) -> str:
    """Each thread group's CPU seconds per GB served: where the work went, whatever the load."""
    ranked = sorted(use.threads.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{name} {sec / (size / 1e9):.2f}" for name, sec in ranked)


def _report_random(report: Report, rnd: dict[str, list[float]], memfs: list[float]) -> None:
    report.section("random aligned 4 KiB os.pread through the mount")
    report.add("memfs (kernel page evicted first)", latency_text(memfs))
    report.add(f"decant cold (n={len(rnd['cold'])})", latency_text(rnd["cold"]), "(1)")
    cold_p99 = percentile(rnd["cold"], 99) * 1e3
    report.target("decant cold p99", cold_p99, COLD_P99_TARGET_MS, "ms", at_most=True)
    verified = rnd["cold_verified"]
    report.add(f"decant cold, verified (n={len(verified)})", latency_text(verified), "(4)")
    cold_p99 = percentile(verified, 99) * 1e3
    report.target("decant cold p99, verified", cold_p99, COLD_P99_TARGET_MS, "ms", at_most=True)
    if rnd.get("disk_one"):
        stream = rnd["disk_stream"][0] // 1024
        report.add(f"disk alone: block stream, {stream} KiB", latency_text(rnd["disk_one"]), "(6)")
        report.add("disk alone: 4 KiB head, then stream", latency_text(rnd["disk_two"]), "(6)")
    report.add(f"decant warm (n={len(rnd['warm'])})", latency_text(rnd["warm"]), "(2)")
    report.add("decant hot", latency_text(rnd["hot"]), "(3)")
    for key in ("cold", "warm"):
        p50 = percentile(rnd[key], 50) / percentile(memfs, 50)
        p99 = percentile(rnd[key], 99) / percentile(memfs, 99)
        report.add(f"  {key} ÷ memfs", f"p50 {p50:.1f}×  p99 {p99:.1f}×")
    report.add(
        "(1) fresh mount + index (so the hasher sees reads), archive evicted, one read/plane"
    )
    report.add(
        "(2) a cold (4) read's offset again (its blocks in the daemon's cache), page evicted"
    )
    report.add("(3) kernel page cache hit (the archive verified: served through the page cache)")
    report.add("(4) as (1), on the index where the archive verified: reads checked by digests")
    report.add(
        "(6) the archive's own preads, evicted, one per plane chunk: the I/O floor of (4) and (1)"
    )


def _report_listing(report: Report, ls: dict[str, list[float]], count: int) -> None:
    report.section(f"ls -l of {count} small archives (files evicted, dentries dropped; medians)")
    real = median(ls["real"])
    report.add("real SRC folder (baseline)", f"{real:.3f} s")
    ceiling = median(ls["memfs"])
    report.add("memfs ceiling, the same names", f"{ceiling:.3f} s", "(5)")
    for key, label, target in (
        ("cold", "decant cold (fresh index)", 1.0),
        ("indexed", "decant remount, persistent index", 0.2),
    ):
        value = median(ls[key])
        report.target(label, value, target, "s", at_most=True)
        report.add("  ÷ real folder", f"{value / real:.1f}×")
        report.add("  ÷ memfs ceiling", f"{value / ceiling:.1f}×")
    report.add("decant second ls on the same mount", f"{median(ls['again']):.3f} s")
    report.add(
        "(5) tools/memfs.py --xattrs, fresh: `ls -l` asks getxattr twice an entry (SELinux "
        "label, ACL), which a filesystem with xattrs must answer: the pyfuse3 floor"
    )


RUNNERS: dict[str, Callable[[argparse.Namespace, Path], Report]] = {
    "pack": bench_pack,
    "restore": bench_restore,
    "read": bench_read,
    "mount": bench_mount,
}
