"""What the chunk digests cost a mount (issue 11): reads of a verified archive, checked or not.

Once an original verifies, the mount records an xxh3 digest of every stored chunk in its index
and checks each chunk read from disk against it before decoding. The baseline is the same
verified archive served with DECANT_NO_CHUNK_DIGESTS set (vfs/mount/daemon.py), as it was
before digests existed: whole entries checked by the zip CRC-32, and a small read of a plane
fetched by range (blosc header, block table, one block) instead of the whole compressed chunk
that a digest covers. "unchecked" (DECANT_NO_CHUNK_DIGESTS=crc-too) drops the CRC-32 as well:
the cost of checking anything at all.

Every figure is cold: a fresh daemon on the same verified index, the archive's pages evicted
and dentries/inodes dropped before each measured read. Variants are interleaved within each
repetition, so a load change on this shared machine hits all of them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sqlite3
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import xxhash
from bench_decant import Mounts, aligned_in, ensure_archive, largest_page, plane_spans
from benchlib import (
    MB,
    MiB,
    Report,
    common_options,
    cpu_seconds,
    dd_read,
    drop_caches,
    duration,
    ensure_stack,
    log,
    machine_context,
    mbps,
    median,
    mounted,
    note_end,
    percentile,
    timed_preads,
    workdir,
)

from vfs.cache import PageCache
from vfs.decant.reader import DecantArchive
from vfs.decant.store import is_chunk_key
from vfs.mount.daemon import NO_CHUNK_DIGESTS

TARGET = 0.05  # issue 11: chunk digest checks cost at most 5 % of sequential throughput
# variant → the switch's value ("" : digests checked, as the mount runs)
VARIANTS = {"digests": "", "no digests": "1", "unchecked": "crc-too"}


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): figures would not be cold")
        return 2
    with workdir(args.workdir) as work:
        report = bench_digests(args, work)
    note_end(report)
    print(report.render())
    return 0


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"bench.py {command}", parents=[common_options(repeat=5)], description=__doc__
    )
    p.add_argument(
        "--reads", type=int, default=0, help="cold random reads per mount (default: one per plane)"
    )
    return p


@contextlib.contextmanager
def switch(value: str) -> Iterator[None]:
    """The daemon started inside inherits DECANT_NO_CHUNK_DIGESTS=value (unset when empty)."""
    old = os.environ.pop(NO_CHUNK_DIGESTS, None)
    if value:
        os.environ[NO_CHUNK_DIGESTS] = value
    try:
        yield
    finally:
        os.environ.pop(NO_CHUNK_DIGESTS, None)
        if old is not None:
            os.environ[NO_CHUNK_DIGESTS] = old


def recorded_digests(index: Path, archive: Path) -> int:
    """How many chunk digests the index holds for `archive` (0: none recorded)."""
    db = sqlite3.connect(index / "index.sqlite")
    try:
        row = db.execute("SELECT doc FROM chunk_digests WHERE path=?", (str(archive),)).fetchone()
    except sqlite3.OperationalError:  # no table yet
        row = None
    finally:
        db.close()
    return 0 if row is None else row[0].count(":")


def verify_once(m: Mounts, archive: Path, name: str, size: int) -> Path:
    """A fresh index in which `name` is verified and its chunk digests recorded: read it whole
    through a mount, then wait for the digests (recorded after the sha256 matched)."""
    index = m.fresh_index("verified")
    cmd, mnt, logfile = m.decant(archive.parent, index, "verify")
    with mounted(cmd, mnt, logfile):
        log("verifying: one full read through the mount")
        _dd(mnt / name, size)
        deadline = time.monotonic() + 300
        while not recorded_digests(index, archive):
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: no chunk digests recorded; see {logfile}")
            time.sleep(0.5)
        state = os.getxattr(mnt / name, "user.decant.verified").decode()
    if state != "yes":
        raise SystemExit(f"bench: {name} is {state!r} after a full read, not verified")
    log(f"verified; {recorded_digests(index, archive)} chunk digests recorded")
    return index


def stored_chunk_mib(archive: Path) -> float:
    """Median stored size of the archive's chunks: what a digest-checked small read fetches."""
    with zipfile.ZipFile(archive) as zf:
        sizes = [i.file_size for i in zf.infolist() if is_chunk_key(i.filename)]
    return median(sizes) / MiB if sizes else 0.0


def check_seconds(archive: Path, rounds: int = 5) -> dict[str, float]:
    """Seconds to check every stored chunk once, held in memory: xxh3 (the digests) and CRC-32
    (what they replace). The checks' own CPU, apart from the disk and the load's noise."""
    with zipfile.ZipFile(archive) as zf:
        chunks = [zf.read(i) for i in zf.infolist() if is_chunk_key(i.filename)]
    out = {}
    for name, check in (("xxh3", xxhash.xxh3_64_intdigest), ("crc32", zlib.crc32)):
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for data in chunks:
                check(data)
            best = min(best, time.perf_counter() - start)
        out[name] = best
    return out


def _dd(path: Path, size: int) -> float:
    seconds, nbytes = dd_read(path)
    if nbytes != size:
        raise SystemExit(f"bench: dd read {nbytes} bytes of {path}, expected {size}")
    return seconds


def bench_digests(args: argparse.Namespace, work: Path) -> Report:
    stack = ensure_stack(work, args.gib, args.stack)
    archive = ensure_archive(work, stack)
    size = stack.stat().st_size
    with DecantArchive.open(archive) as arc:
        name = arc.manifest.original_name
        spans = plane_spans(arc.open_original(name, PageCache(0)))
    plane = largest_page(archive)
    m = Mounts(work)
    index = verify_once(m, archive, name, size)
    rng = random.Random(args.seed)
    reads = args.reads or len(spans)
    kinds = ("cold", "warm", "cpu_cold", "cpu_warm", "p50", "p99", "pooled")
    out: dict[str, dict[str, list[float]]] = {k: {v: [] for v in VARIANTS} for k in kinds}
    order = list(VARIANTS)
    for r in range(args.repeat):
        # The same offsets for every variant within a repetition; new ones each repetition.
        if reads == len(spans):
            pages = rng.sample(list(spans), len(spans))
        else:
            pages = rng.choices(list(spans), k=reads)
        offsets = [aligned_in(spans[p], rng) for p in pages]
        order = order[1:] + order[:1]  # rotate who goes first
        for variant in order:
            with switch(VARIANTS[variant]):
                log(f"round {r + 1}/{args.repeat}: {variant}: {reads} cold random preads")
                with _fresh(m, archive, index, variant, name):
                    drop_caches([archive])
                    times = timed_preads(m.work / "mnt-decant" / name, offsets, evict=False)
                out["p50"][variant].append(percentile(times, 50))
                out["p99"][variant].append(percentile(times, 99))
                out["pooled"][variant] += times
                # cold: archive evicted; warm: archive left in the page cache by the cold read,
                # so the disk (and other users of it) drop out and the checks' CPU remains.
                for kind in ("cold", "warm"):
                    log(f"round {r + 1}/{args.repeat}: {variant}: sequential dd ({kind} archive)")
                    with _fresh(m, archive, index, variant, name) as pid:
                        if kind == "cold":
                            drop_caches([archive])
                        before = cpu_seconds(pid)
                        seconds = _dd(m.work / "mnt-decant" / name, size)
                        out[f"cpu_{kind}"][variant].append(cpu_seconds(pid) - before)
                    out[kind][variant].append(mbps(size, seconds))
    ctx = machine_context(
        input=f"{stack.name} {size / MB:.1f} MB, {len(spans)} planes of {plane / MiB:g} MiB, "
        f"{recorded_digests(index, archive)} chunk digests, stored chunks "
        f"{stored_chunk_mib(archive):.2f} MiB (median)",
        runs=f"{args.repeat} repetitions × 3 variants, {reads} random 4 KiB preads per mount",
        cache=f"{m.cache_size / MiB:.0f} MiB (decant-mount default)",
    )
    report = Report("decant bench: digests", ctx)
    _report(report, out, size, check_seconds(archive))
    return report


@contextlib.contextmanager
def _fresh(m: Mounts, archive: Path, index: Path, variant: str, name: str) -> Iterator[int]:
    """A fresh daemon on the verified index; yields its pid once `name` shows as verified.
    Fails the run if the daemon hashed the file (it would not be served as verified)."""
    cmd, mnt, logfile = m.decant(archive.parent, index, variant.replace(" ", "-"))
    with mounted(cmd, mnt, logfile) as dec:
        state = os.getxattr(mnt / name, "user.decant.verified").decode()
        if state != "yes":
            raise SystemExit(f"bench: {name} served as {state!r}, not verified")
        yield dec.pid
    if "verified sha256" in logfile.read_text():  # INFO, the default level
        raise SystemExit(f"bench: the daemon hashed a verified file; see {logfile}")


def _cost(table: dict[str, list[float]], base: str, higher_is_better: bool) -> float:
    """Percent the digests cost against variant `base`, from medians."""
    with_, without = median(table["digests"]), median(table[base])
    return (without / with_ - 1 if higher_is_better else with_ / without - 1) * 100


def _report(
    report: Report, out: dict[str, dict[str, list[float]]], size: int, checks: dict[str, float]
) -> None:
    gb = size / 1e9
    for kind, what in (("cold", "archive evicted"), ("warm", "archive in the page cache")):
        report.section(f"sequential dd of the whole original, {what}, fresh daemon (median)")
        for v in VARIANTS:
            runs = " ".join(f"{x:.0f}" for x in out[kind][v])
            report.add(f"{v} MB/s", f"{median(out[kind][v]):.0f}", f"runs: {runs}")
        for v in VARIANTS:
            cpu = " ".join(f"{c / gb:.2f}" for c in out[f"cpu_{kind}"][v])
            per_gb = median([c / gb for c in out[f"cpu_{kind}"][v]])
            report.add(f"{v} daemon CPU s/GB", f"{per_gb:.2f}", f"runs: {cpu}")
        cost = _cost(out[kind], "no digests", higher_is_better=True)
        report.target(f"{kind}: cost vs no digests", cost, TARGET * 100, "%", at_most=True)
        # Each repetition's two runs are minutes apart at most: their ratio drifts less with load.
        paired = [
            b / a - 1 for a, b in zip(out[kind]["digests"], out[kind]["no digests"], strict=True)
        ]
        spread = f"{min(paired) * 100:+.0f} … {max(paired) * 100:+.0f} %"
        report.add(f"{kind}: same, median of paired runs", f"{median(paired) * 100:+.1f} %", spread)
        cost = _cost(out[kind], "unchecked", higher_is_better=True)
        report.add(f"{kind}: cost vs unchecked", f"{cost:+.1f} %", "no CRC-32 either")
        cpu_cost = _cost(out[f"cpu_{kind}"], "no digests", higher_is_better=False)
        report.add(f"{kind}: daemon CPU vs no digests", f"{cpu_cost:+.1f} %")
    report.section("the checks alone: every stored chunk once, in memory (best of 5)")
    seq_s = gb * 1e3 / median(out["warm"]["digests"])
    for name, seconds in checks.items():
        share = seconds / seq_s * 100
        report.add(f"{name} of all chunks", duration(seconds), f"{share:.1f} % of the warm dd time")
    report.section("cold random 4 KiB preads (medians of per-mount p50 and p99)")
    for v in VARIANTS:
        report.add(
            f"{v} p50 / p99",
            f"{duration(median(out['p50'][v]))} / {duration(median(out['p99'][v]))}",
            f"pooled p99 {duration(percentile(out['pooled'][v], 99))}",
        )
    for q in ("p50", "p99"):
        cost = _cost(out[q], "no digests", higher_is_better=False)
        report.target(f"random {q} cost vs no digests", cost, TARGET * 100, "%", at_most=True)
