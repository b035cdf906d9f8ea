"""GDI package benchmark (issue 4, "Speed"): decant-mount serving a `.tar.c4gh` package.

    python tools/bench.py c4gh [--gib 1] [--workdir DIR] [--repeat 3] [--samples 1000]

One package (manifest.json, a VCF header, one large member of random bytes) is written with the
crypt4gh library and reused from --workdir. In one run:
  start-up    from starting decant-mount to the bytes of manifest.json: fresh index, package
              evicted (cold) and remounted (persistent index); segments decrypted, counted from
              the daemon's DEBUG log; beside the same daemon serving a plain file (its floor)
  sequential  dd of the large member ÷ tools/memfs.py serving the same plaintext from memory
  random      aligned 4 KiB os.pread of the member (kernel page evicted first), beside memfs
  memory      the daemon's RSS with the default cache, before and after streaming the member
Every figure is printed beside a baseline measured in the same run; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from benchlib import (
    MB,
    TOOLS,
    MiB,
    Mount,
    Report,
    cpu_seconds,
    dd_read,
    drop_caches,
    latency_text,
    log,
    machine_context,
    mbps,
    median,
    mounted,
    percentile,
    require,
    run_child,
    timed_preads,
    tool,
    unmount,
    vm_hwm,
    workdir,
)

from vfs.cli import build_parser

READ_SIZE = 4096
SEGMENT = 65536
CIPHER_SEGMENT = SEGMENT + 28
MEMBER = "allele-freq.chr1.0.br10000000.00000000000000ff.parquet"
DEFAULT_CACHE: int = build_parser().get_default("cache_size")
STARTUP_TARGET_S = 0.4
STARTUP_SEGMENTS = 2
SEQUENTIAL_TARGET = 0.6
P99_TARGET_MS = 1.0
# Issue 4's figures for crypt4ghfs + ratarmount on these machines (not measured by this run).
RIVAL = {"startup": "0.65 s", "sequential": "0.35", "p99": "1.18 ms"}


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): 'cold' runs will be warmer")
    with workdir(args.workdir) as work:
        pkg = ensure_package(work, args.gib)
        report = run(args, work, pkg)
    report.context["load at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(report.render())
    return 0


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"bench.py {command}", description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="size of the large member (GiB)")
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="scratch folder; a package generated there is reused (default: a temp folder)",
    )
    p.add_argument("--repeat", type=int, default=3, help="sequential rounds (default 3)")
    p.add_argument("--startups", type=int, default=5, help="start-up rounds (default 5)")
    p.add_argument("--samples", type=int, default=1000, help="random preads (default 1000)")
    p.add_argument("--seed", type=int, default=1, help="random offsets seed")
    return p


# -- the package ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """The generated package in its own SRC folder, the plaintext member beside it, the key."""

    path: Path
    member: Path  # the member's plaintext (what memfs serves)
    key: Path
    manifest: bytes
    segments: int

    @property
    def src(self) -> Path:
        return self.path.parent


def corpus_tool() -> ModuleType:
    sys.path.insert(0, str(TOOLS))
    import make_c4gh_corpus

    return make_c4gh_corpus


def ensure_package(work: Path, gib: float) -> Package:
    """work/c4gh-<gib>GiB/{src/bench.tar.c4gh, plain/MEMBER, keys/}: generated once, reused."""
    base = work / f"c4gh-{gib:g}GiB"
    done = base / "done.json"
    if not done.is_file():
        shutil.rmtree(base, ignore_errors=True)
        _generate(base, int(gib * (1 << 30)), corpus_tool())
    facts = json.loads(done.read_text())
    return Package(
        path=base / "src" / "bench.tar.c4gh",
        member=base / "plain" / MEMBER,
        key=base / "keys" / "node.sec",
        manifest=(base / "plain" / "manifest.json").read_bytes(),
        segments=int(facts["segments"]),
    )


def _generate(base: Path, size: int, corpus: ModuleType) -> None:
    for sub in ("src", "plain"):
        (base / sub).mkdir(parents=True)
    node = corpus.make_keypair(base / "keys", "node")
    writer = corpus.make_keypair(base / "keys", "writer")
    member = base / "plain" / MEMBER
    log(f"writing the {size / MiB:.0f} MiB member")
    digest = _random_file(member, size)
    vcf = ("headers/00000000000000ff.vcf", b"##fileformat=VCFv4.3\n##source=bench\n")
    doc = json.loads(corpus.manifest([vcf]))
    doc["payload"]["members"][MEMBER] = {"sha256": digest, "size": size}
    manifest = json.dumps(doc, indent=2).encode()
    (base / "plain" / "manifest.json").write_bytes(manifest)
    tar = base / "plain.tar"
    with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as out:
        for name, data in (("manifest.json", manifest), vcf):
            out.addfile(corpus.normalized_info(name, len(data)), io.BytesIO(data))
        with open(member, "rb") as body:
            out.addfile(corpus.normalized_info(MEMBER, size), body)
    log("encrypting with the crypt4gh library")
    from crypt4gh import lib

    package = base / "src" / "bench.tar.c4gh"
    with open(tar, "rb") as plain, open(package, "wb") as sealed:
        lib.encrypt([(0, writer.secret, node.public)], plain, sealed)
    segments = -(-tar.stat().st_size // SEGMENT)
    tar.unlink()
    (base / "done.json").write_text(json.dumps({"segments": segments}))


def _random_file(path: Path, size: int, chunk: int = 8 * MiB) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            block = os.urandom(min(chunk, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


# -- mounts ---------------------------------------------------------------------------------


@dataclass
class Daemons:
    """Command lines for decant-mount and memfs; each decant mount gets its own log file."""

    work: Path
    pkg: Package
    count: int = 0
    logs: Path = field(init=False)

    def __post_init__(self) -> None:
        # One folder a run: the daemon appends to its log file, and segments are counted from it.
        self.logs = self.work / "c4gh-logs" / time.strftime("%Y%m%d-%H%M%S")
        self.logs.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.work / "c4gh-index", ignore_errors=True)

    def index(self, tag: str) -> Path:
        folder = self.work / "c4gh-index" / f"{tag}-{time.monotonic_ns()}"
        folder.mkdir(parents=True)
        return folder

    def decant(self, src: Path, index: Path, *extra: str) -> tuple[list[str], Path, Path]:
        self.count += 1
        logfile = self.logs / f"decant-{self.count:02d}.log"
        mnt = self.work / "mnt-c4gh"
        cmd = [*tool("decant-mount"), str(src), str(mnt), "-f", "--index-dir", str(index)]
        cmd += ["--log-file", str(logfile), "--c4gh-key", str(self.pkg.key), *extra]
        return cmd, mnt, logfile

    def memfs(self, copy: bool = False) -> tuple[list[str], Path, Path]:
        tag = "memfs-copy" if copy else "memfs"
        mnt = self.work / f"mnt-{tag}"
        cmd = [sys.executable, str(TOOLS / "memfs.py"), str(mnt), str(self.pkg.member), "-f"]
        return ([*cmd, "--copy"] if copy else cmd), mnt, self.logs / f"{tag}.log"


def time_to_bytes(
    cmd: Sequence[str], mnt: Path, target: Path, expect: bytes, err: Path
) -> tuple[float, Mount]:
    """Seconds from starting `cmd` to holding the bytes of `target` (a path on the mount).

    Polled every millisecond: before the mount exists the path is missing from the bare
    mountpoint; once it exists an open blocks until the daemon answers.
    """
    mnt.mkdir(parents=True, exist_ok=True)
    with open(err, "wb") as sink:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink)
    mount = Mount(mnt, proc)
    data: bytes | None = None
    try:
        while data is None:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                with open(target, "rb") as f:
                    data = f.read()
                break
            if proc.poll() is not None:
                break
            time.sleep(0.001)
        seconds = time.perf_counter() - start
    finally:
        if data != expect:
            unmount(mount)
    if data is None:
        raise SystemExit(f"bench: decant-mount exited {proc.returncode}: {err.read_text()}")
    if data != expect:
        raise SystemExit(f"bench: {target} read {len(data)} bytes, not the manifest written")
    return seconds, mount


def segments_logged(logfile: Path, package: Path) -> list[int]:
    pattern = re.compile(rf"{re.escape(str(package))}: decrypted segment (\d+) ")
    return [int(m.group(1)) for m in pattern.finditer(logfile.read_text())]


def stop(mount: Mount) -> None:
    unmount(mount)


# -- start-up -------------------------------------------------------------------------------


def bench_startup(args: argparse.Namespace, d: Daemons) -> dict[str, list[float]]:
    pkg = d.pkg
    out: dict[str, list[float]] = {k: [] for k in ("cold", "remount", "plain", "segs", "segs_re")}
    plain_src = d.work / "c4gh-plain-src"
    plain_src.mkdir(exist_ok=True)
    (plain_src / "manifest.json").write_bytes(pkg.manifest)
    target = Path(pkg.path.name) / "manifest.json"
    for r in range(args.startups):
        log(f"start-up round {r + 1}/{args.startups}")
        cmd, mnt, logfile = d.decant(plain_src, d.index("plain"))
        drop_caches([plain_src])
        err = logfile.with_suffix(".stderr")
        seconds, m = time_to_bytes(cmd, mnt, mnt / "manifest.json", pkg.manifest, err)
        out["plain"].append(seconds)
        stop(m)
        index = d.index("startup")
        # The last round logs at DEBUG to count decrypted segments; the others run as users do.
        debug = ["--log-level", "DEBUG"] if r == args.startups - 1 else []
        for key in ("cold", "remount"):
            cmd, mnt, logfile = d.decant(pkg.src, index, *debug)
            drop_caches([pkg.path])
            err = logfile.with_suffix(".stderr")
            seconds, m = time_to_bytes(cmd, mnt, mnt / target, pkg.manifest, err)
            stop(m)
            out[key].append(seconds)
            if debug:
                out["segs" if key == "cold" else "segs_re"] = [
                    float(len(segments_logged(logfile, pkg.path)))
                ]
    return out


def import_floors() -> dict[str, float]:
    python = [sys.executable, "-c", "pass"]
    imports = [sys.executable, "-c", "import vfs.cli, vfs.mount.daemon, vfs.backends.c4gh"]
    return {
        "python": median([require(run_child(python), "python").seconds for _ in range(5)]),
        "imports": median([require(run_child(imports), "imports").seconds for _ in range(5)]),
    }


# -- sequential, random, memory -------------------------------------------------------------


def bench_sequential(args: argparse.Namespace, d: Daemons) -> dict[str, list[float]]:
    """Rounds of: memfs and memfs --copy; decant cold with a fresh index (hashing), then
    remounted on that index (verified). Then decant with the package in the page cache."""
    pkg = d.pkg
    size = pkg.member.stat().st_size
    out: dict[str, list[float]] = collections.defaultdict(list)
    cmd, mnt, err = d.memfs()
    cmd_c, mnt_c, err_c = d.memfs(copy=True)
    with mounted(cmd, mnt, err) as mem, mounted(cmd_c, mnt_c, err_c) as mem_c:
        for m in (mem, mem_c):
            _dd(m.mnt / MEMBER, size)  # untimed: first touches are not the file system's
        for r in range(args.repeat):
            log(f"sequential round {r + 1}/{args.repeat}: memfs, memfs --copy")
            for key, m in (("memfs", mem), ("memfs_copy", mem_c)):
                drop_caches([m.mnt / MEMBER])
                cpu = cpu_seconds(m.pid)
                out[key].append(_dd(m.mnt / MEMBER, size))
                out[f"cpu_{key}"].append(cpu_seconds(m.pid) - cpu)
            index = d.index("seq")
            for key in ("hashing", "verified"):
                log(f"sequential round {r + 1}/{args.repeat}: decant-mount ({key})")
                cmd, dmnt, logfile = d.decant(pkg.src, index)
                with mounted(cmd, dmnt, logfile) as dec:
                    shown = dmnt / pkg.path.name / MEMBER
                    shown.stat()  # the package is described (not timed: start-up is above)
                    out["rss_idle"].append(vm_rss(dec.pid))
                    drop_caches([pkg.path])
                    cpu = cpu_seconds(dec.pid)
                    out[key].append(_dd(shown, size))
                    out[f"cpu_{key}"].append(cpu_seconds(dec.pid) - cpu)
                    out[f"hwm_{key}"].append(vm_hwm(dec.pid))
                    out[f"rss_{key}"].append(vm_rss(dec.pid))
    log("sequential: decant-mount with the package in the page cache (diagnostic)")
    cmd, dmnt, logfile = d.decant(pkg.src, index)
    with mounted(cmd, dmnt, logfile):
        shown = dmnt / pkg.path.name / MEMBER
        for _ in range(args.repeat):
            _dd(pkg.path, pkg.path.stat().st_size)  # the cipher text, into the page cache
            drop_caches([shown])  # the kernel's copy of the member only
            out["cached"].append(_dd(shown, size))
    return out


def bench_random(args: argparse.Namespace, d: Daemons) -> dict[str, list[float]]:
    pkg = d.pkg
    size = pkg.member.stat().st_size
    rng = random.Random(args.seed)
    pages = (size - READ_SIZE) // READ_SIZE
    offsets = [rng.randrange(pages) * READ_SIZE for _ in range(args.samples)]
    out: dict[str, list[float]] = {}
    cmd, mnt, err = d.memfs()
    with mounted(cmd, mnt, err):
        log("random preads: memfs")
        out["memfs"] = timed_preads(mnt / MEMBER, offsets, evict=True)
    expected = _expected(pkg.member, offsets[:16])
    for key, warm_package in (("disk", False), ("pagecache", True)):
        log(f"random preads: decant-mount, fresh daemon, package {key}")
        cmd, dmnt, logfile = d.decant(pkg.src, d.index("rnd"))
        with mounted(cmd, dmnt, logfile):
            shown = dmnt / pkg.path.name / MEMBER
            shown.stat()
            if warm_package:
                _dd(pkg.path, pkg.path.stat().st_size)
            else:
                drop_caches([pkg.path])
            out[key] = timed_preads(shown, offsets, evict=True)
            _check(shown, expected)
            if warm_package:
                log("random preads: decant-mount, segments in the daemon's cache")
                out["warm"] = timed_preads(shown, offsets[-len(offsets) // 4 :], evict=True)
    return out


def _expected(member: Path, offsets: list[int]) -> dict[int, bytes]:
    with open(member, "rb") as f:
        return {o: os.pread(f.fileno(), READ_SIZE, o) for o in offsets}


def _check(shown: Path, expected: dict[int, bytes]) -> None:
    fd = os.open(shown, os.O_RDONLY)
    try:
        for offset, data in expected.items():
            if os.pread(fd, READ_SIZE, offset) != data:
                raise SystemExit(f"bench: {shown} differs from the plaintext at {offset}")
    finally:
        os.close(fd)


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for pid {pid}")


def _dd(path: Path, size: int) -> float:
    seconds, nbytes = dd_read(path)
    if nbytes != size:
        raise SystemExit(f"bench: dd read {nbytes} bytes of {path}, expected {size}")
    return seconds


# -- the run and its report ------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path, pkg: Package) -> Report:
    d = Daemons(work, pkg)
    floors = import_floors()
    startup = bench_startup(args, d)
    seq = bench_sequential(args, d)
    rnd = bench_random(args, d)
    size = pkg.member.stat().st_size
    ctx = machine_context(
        input=f"{pkg.path.name} {pkg.path.stat().st_size / MiB:.0f} MiB, {pkg.segments} "
        f"segments; member {size / MB:.0f} MB, manifest.json {len(pkg.manifest)} B",
        cache=f"{DEFAULT_CACHE / MiB:.0f} MiB (decant-mount default)",
    )
    report = Report("decant bench: c4gh (GDI .tar.c4gh package)", ctx)
    _report_startup(report, startup, floors)
    _report_sequential(report, seq, size)
    _report_random(report, rnd)
    _report_memory(report, seq)
    return report


def _runs(values: list[float], fmt: str = "{:.3f}") -> str:
    return "[" + " ".join(fmt.format(v) for v in values) + "]"


def _report_startup(report: Report, s: dict[str, list[float]], floors: dict[str, float]) -> None:
    report.section("start-up: from starting decant-mount to the bytes of manifest.json (medians)")
    report.add("python -c pass (interpreter floor)", f"{floors['python']:.3f} s")
    report.add("import vfs.cli+daemon+c4gh (import floor)", f"{floors['imports']:.3f} s")
    plain = median(s["plain"])
    report.add("same daemon, a plain file instead (floor)", f"{plain:.3f} s", _runs(s["plain"]))
    cold = median(s["cold"])
    report.target("cold: fresh index, package evicted", cold, STARTUP_TARGET_S, "s", at_most=True)
    report.add("  per round", _runs(s["cold"]))
    report.add("  ÷ plain-file floor", f"{cold / plain:.2f}×", f"(c4gh adds {cold - plain:.3f} s)")
    segs = s["segs"][0] if s["segs"] else float("nan")
    report.target("  segments decrypted", segs, STARTUP_SEGMENTS, "", at_most=True)
    again = median(s["remount"])
    report.add("remount: persistent index", f"{again:.3f} s", _runs(s["remount"]))
    if s["segs_re"]:
        report.add("  segments decrypted", f"{s['segs_re'][0]:.0f}")
    report.add("crypt4ghfs + ratarmount (issue 4)", RIVAL["startup"], "(not measured in this run)")


def _report_sequential(report: Report, seq: dict[str, list[float]], size: int) -> None:
    report.section("sequential: dd bs=1M of the large member, page cache dropped each run")
    for key, label in (
        ("memfs", "(a) memfs ceiling (same plaintext)"),
        ("memfs_copy", "(a') memfs --copy (a bytes copy a read)"),
        ("hashing", "(b) decant cold, first read (hashing)"),
        ("verified", "(b') decant cold, verified remount"),
        ("cached", "(c) decant, package in page cache"),
    ):
        speed = mbps(size, median(seq[key]))
        report.add(label, f"{speed:.0f} MB/s", f"median of {_runs(seq[key], '{:.2f}')} s")
    for key, label in (("hashing", "(b)/(a) median"), ("verified", "(b')/(a) median")):
        ratios = [a / b for a, b in zip(seq["memfs"], seq[key], strict=True)]
        report.target(label, median(ratios), SEQUENTIAL_TARGET, "", at_most=False)
        report.add("  per round", _runs(ratios, "{:.2f}"))
    for key, label in (
        ("hashing", "(b)/(a') median"),
        ("verified", "(b')/(a') median"),
        ("cached", "(c)/(a) (diagnostic: no disk reads)"),
    ):
        base = "memfs" if key == "cached" else "memfs_copy"
        report.add(label, f"{median(seq[base]) / median(seq[key]):.2f}")
    report.add("crypt4ghfs + ratarmount ÷ ceiling", RIVAL["sequential"], "(issue 4, not measured)")
    for key, label in (("memfs", "(a)"), ("hashing", "(b)"), ("verified", "(b')")):
        busy = median([c / w for c, w in zip(seq[f"cpu_{key}"], seq[key], strict=True)])
        report.add(f"{label} daemon CPU ÷ wall", f"{busy:.2f}", "(cores busy while dd ran)")


def _report_random(report: Report, rnd: dict[str, list[float]]) -> None:
    n = len(rnd["disk"])
    report.section(f"random aligned 4 KiB os.pread of the member (n={n}, kernel page evicted)")
    report.add("memfs ceiling", latency_text(rnd["memfs"]))
    for key, label in (
        ("disk", "decant, fresh daemon, package evicted"),
        ("pagecache", "decant, fresh daemon, package cached"),
    ):
        report.add(label, latency_text(rnd[key]))
        p99 = percentile(rnd[key], 99) * 1e3
        report.target("  p99", p99, P99_TARGET_MS, "ms", at_most=True)
        ratio = percentile(rnd[key], 99) / percentile(rnd["memfs"], 99)
        report.add("  p99 ÷ memfs p99", f"{ratio:.1f}×")
    report.add("decant, segment in the daemon's cache", latency_text(rnd["warm"]))
    report.add("crypt4ghfs + ratarmount p99", RIVAL["p99"], "(issue 4, not measured)")


def _report_memory(report: Report, seq: dict[str, list[float]]) -> None:
    report.section(f"memory: decant-mount, default cache ({DEFAULT_CACHE / MiB:.0f} MiB)")
    report.add("RSS once mounted, package described", f"{max(seq['rss_idle']) / MiB:.0f} MiB")
    for key, label in (("hashing", "(b) first read"), ("verified", "(b') verified")):
        rss, hwm = max(seq[f"rss_{key}"]) / MiB, max(seq[f"hwm_{key}"]) / MiB
        report.add(f"after streaming the member, {label}", f"{rss:.0f} MiB", f"VmHWM {hwm:.0f} MiB")
