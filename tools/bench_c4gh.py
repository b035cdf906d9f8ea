"""GDI package benchmark (issue "Reading through the mount at disk speed"): a `.tar.c4gh` member.

    python tools/bench.py c4gh [--gib 1] [--workdir DIR] [--repeat 3] [--stack-venv DIR]

One package (manifest.json, a VCF header, one large member of random bytes) is written with the
crypt4gh library and reused from --workdir, with its decrypted TAR kept beside it. In one run:
  start-up    from starting decant-mount to the bytes of manifest.json (fresh index, package
              evicted), beside the same daemon serving a plain file, and beside the stack
  sequential  dd bs=1M, rounds of: (plain) the decrypted TAR read from disk; (stack) the member
              through crypt4ghfs 1.2 + ratarmount 1.3; (ours) decant-mount, first read (hashing)
              and verified remount. Page cache dropped and fresh daemons for every figure; the
              ratios are per round. The daemon's CPU is sampled every 0.1 s while dd runs.
  random      aligned 4 KiB os.pread of the member (kernel page evicted first): memfs, ours, stack
  memory      the daemon's peak RSS (VmHWM) after streaming the member, against its cache
The stack: crypt4ghfs mounts the folder of .c4gh files decrypted, ratarmount mounts the decrypted
.tar from it. It runs from its own venv (--stack-venv, built with pip when missing: crypt4ghfs
1.2 needs crypt4gh 1.7). crypt4ghfs 1.2 fails an assertion in `forget` (refcount < 0) and exits
when the kernel drops its inodes, so for the stack the dentry/inode caches are dropped before its
daemons start and only the package's pages are evicted afterwards.
Every figure is printed beside a baseline measured in the same run; nothing asserts a time.
"""

from __future__ import annotations

import argparse
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
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TypeVar

# This checkout's vfs, for the benchmark and every daemon it starts: an editable install of
# another checkout (a console script, or a script run from tools/) would otherwise win.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

from benchlib import (  # noqa: E402
    MB,
    TOOLS,
    CpuProfile,
    CpuSampler,
    MiB,
    Mount,
    Report,
    cpu_seconds,
    dd_read,
    drop_caches,
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
    timed_preads,
    unmount,
    vm_hwm,
    workdir,
)

from vfs.cli import build_parser  # noqa: E402

READ_SIZE = 4096
SEGMENT = 65536
CIPHER_SEGMENT = SEGMENT + 28
MEMBER = "allele-freq.chr1.0.br10000000.00000000000000ff.parquet"
DEFAULT_CACHE: int = build_parser().get_default("cache_size")
PACKAGE_VERSION = 2  # 2: the decrypted TAR is kept (the plain baseline)
STARTUP_TARGET_S = 0.3
SEQUENTIAL_TARGET = 0.6  # ours ÷ the decrypted TAR read from disk
STACK_TARGET = 2.0  # ours ÷ crypt4ghfs + ratarmount
P99_TARGET_MS = 1.0
MEMORY_TARGET_MIB = 150  # peak RSS above the cache
T = TypeVar("T")
STACK_PINS = ("crypt4gh==1.7", "crypt4ghfs==1.2", "ratarmount==1.3.0")
DEFAULT_STACK_VENV = Path("/tmp/c4stack-venv")


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if not drop_caches():
        log("cannot drop dentries and inodes (not root?): 'cold' runs will be warmer")
    with workdir(args.workdir) as work:
        pkg = ensure_package(work, args.gib)
        report = run(args, work, pkg)
    note_end(report)
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
    p.add_argument("--startups", type=int, default=3, help="start-up rounds (default 3)")
    p.add_argument("--samples", type=int, default=500, help="random preads (default 500)")
    p.add_argument("--seed", type=int, default=1, help="random offsets seed")
    p.add_argument(
        "--stack-venv",
        type=Path,
        default=DEFAULT_STACK_VENV,
        metavar="DIR",
        help=f"venv of crypt4ghfs + ratarmount, built when missing (default {DEFAULT_STACK_VENV})",
    )
    p.add_argument("--no-stack", action="store_true", help="skip crypt4ghfs + ratarmount")
    return p


# -- the package ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """The generated package in its own SRC folder, its plaintext beside it, the key."""

    path: Path
    member: Path  # the member's plaintext (what memfs serves)
    tar: Path  # the decrypted TAR (the plain baseline)
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
    """work/c4gh-<gib>GiB/{src/bench.tar.c4gh, plain/{MEMBER, bench.tar}, keys/}: made once."""
    base = work / f"c4gh-{gib:g}GiB"
    done = base / "done.json"
    if not done.is_file() or json.loads(done.read_text()).get("version") != PACKAGE_VERSION:
        shutil.rmtree(base, ignore_errors=True)
        _generate(base, int(gib * (1 << 30)), corpus_tool())
    facts = json.loads(done.read_text())
    return Package(
        path=base / "src" / "bench.tar.c4gh",
        member=base / "plain" / MEMBER,
        tar=base / "plain" / "bench.tar",
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
    tar = base / "plain" / "bench.tar"
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
    facts = {"version": PACKAGE_VERSION, "segments": segments}
    (base / "done.json").write_text(json.dumps(facts))


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


# -- our daemon and memfs -------------------------------------------------------------------


@dataclass
class Daemons:
    """Command lines for decant-mount and memfs; each decant mount gets its own log file."""

    work: Path
    pkg: Package
    count: int = 0
    logs: Path = field(init=False)

    def __post_init__(self) -> None:
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
        cmd = [sys.executable, "-m", "vfs.cli", str(src), str(mnt), "-f", "--index-dir", str(index)]
        cmd += ["--log-file", str(logfile), "--c4gh-key", str(self.pkg.key), *extra]
        return cmd, mnt, logfile

    def memfs(self) -> tuple[list[str], Path, Path]:
        mnt = self.work / "mnt-memfs"
        cmd = [sys.executable, str(TOOLS / "memfs.py"), str(mnt), str(self.pkg.member), "-f"]
        return cmd, mnt, self.logs / "memfs.log"


def wait_for_bytes(
    procs: Sequence[subprocess.Popen[bytes]], target: Path, timeout: float = 60.0
) -> bytes | None:
    """The bytes of `target` once it can be read (polled every ms); None if a daemon exits.

    Before a mount exists the path is missing from the bare mountpoint; once it exists an open
    blocks until the daemon answers.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), open(target, "rb") as f:
            return f.read()
        if any(p.poll() is not None for p in procs):
            return None
        time.sleep(0.001)
    return None


def time_to_bytes(
    cmd: Sequence[str], mnt: Path, target: Path, expect: bytes, err: Path
) -> tuple[float, Mount]:
    """Seconds from starting `cmd` to holding the bytes of `target` (a path on the mount)."""
    mnt.mkdir(parents=True, exist_ok=True)
    with open(err, "wb") as sink:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink)
    mount = Mount(mnt, proc)
    data = wait_for_bytes([proc], target)
    seconds = time.perf_counter() - start
    if data != expect:
        unmount(mount)
        what = f"exited {proc.returncode}" if proc.poll() is not None else "did not serve"
        raise SystemExit(f"bench: decant-mount {what} {target}: {err.read_text()[-2000:]}")
    return seconds, mount


def segments_logged(logfile: Path, package: Path) -> list[int]:
    pattern = re.compile(rf"{re.escape(str(package))}: decrypted segment (\d+) ")
    return [int(m.group(1)) for m in pattern.finditer(logfile.read_text())]


# -- the stack: crypt4ghfs + ratarmount -----------------------------------------------------


@dataclass
class Stack:
    """crypt4ghfs 1.2 over SRC (bench.tar.c4gh shows as bench.tar), ratarmount 1.3 over that."""

    venv: Path
    work: Path
    pkg: Package
    reason: str | None = None  # why the stack is not measured, when it is not
    crashes: int = 0  # measurements retried because crypt4ghfs exited under them

    def __post_init__(self) -> None:
        self.dir = self.work / "c4gh-stack"
        self.c4fs_mnt, self.tar_mnt = self.dir / "crypt4ghfs", self.dir / "ratarmount"
        self.conf = self.dir / "fs.conf"
        self._c4fs: subprocess.Popen[bytes] | None = None
        self._pids: list[int] = []

    @property
    def member(self) -> Path:
        return self.tar_mnt / MEMBER

    def prepare(self) -> bool:
        """Build the venv when missing and write crypt4ghfs's configuration; False with a reason."""
        self.reason = _ensure_stack_venv(self.venv)
        if self.reason is not None:
            log(f"stack not measured: {self.reason}")
            return False
        for folder in (self.c4fs_mnt, self.tar_mnt):
            folder.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            f"[DEFAULT]\nrootdir = {self.pkg.src}\nlog_level = WARNING\n"
            f"[CRYPT4GH]\nseckey = {self.pkg.key}\n[FUSE]\noptions = ro,default_permissions\n"
        )
        self.conf.chmod(0o600)  # crypt4ghfs refuses a configuration others can read
        return True

    def run(self, fn: Callable[[], T], tries: int = 3) -> tuple[float, T]:
        """(start-up seconds, fn()) with fresh daemons; retried when crypt4ghfs exited under fn
        (its `forget` assertion: any drop_caches on this shared machine can set it off)."""
        for _ in range(tries):
            try:
                with self.started() as seconds:
                    return seconds, fn()
            except (SystemExit, OSError):
                if self._c4fs is None or self._c4fs.poll() is None:
                    raise
                self.crashes += 1
                log(f"crypt4ghfs exited with {self._c4fs.returncode} mid-measurement; retrying")
        raise SystemExit(f"bench: crypt4ghfs exited {tries} times; see {self.dir}")

    @contextlib.contextmanager
    def started(self) -> Iterator[float]:
        """Fresh daemons (inode caches dropped before, package evicted); yields the seconds
        from starting crypt4ghfs to the bytes of manifest.json through ratarmount."""
        drop_caches()  # before the daemons start: see the module docstring
        evict_file(self.pkg.path)
        index = self.dir / "ratarmount.index.sqlite"
        index.unlink(missing_ok=True)
        bin_dir = self.venv / "bin"
        mounts: list[Mount] = []
        try:
            with open(self.dir / "crypt4ghfs.log", "ab") as err:
                start = time.perf_counter()
                c4fs = subprocess.Popen(
                    [bin_dir / "crypt4ghfs", "--conf", self.conf, "-f", self.c4fs_mnt],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=_stack_env(),
                )
            self._c4fs = c4fs
            mounts.append(Mount(self.c4fs_mnt, c4fs))
            self._wait(c4fs, self.c4fs_mnt / "bench.tar")
            with open(self.dir / "ratarmount.log", "ab") as err:
                cmd = [bin_dir / "ratarmount", self.c4fs_mnt / "bench.tar", self.tar_mnt, "-f"]
                tar = subprocess.Popen(
                    [*cmd, "--index-file", index],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=_stack_env(),
                )
            mounts.insert(0, Mount(self.tar_mnt, tar))
            self._pids = [c4fs.pid, tar.pid]
            data = wait_for_bytes([c4fs, tar], self.tar_mnt / "manifest.json")
            seconds = time.perf_counter() - start
            if data != self.pkg.manifest:
                raise SystemExit(f"bench: the stack did not serve manifest.json; see {self.dir}")
            evict_file(self.pkg.path)  # what reading the index brought in
            yield seconds
        finally:
            for mount in mounts:
                unmount(mount)

    def cpu_seconds(self) -> float:
        """CPU time crypt4ghfs and ratarmount have used so far (while they run)."""
        return sum(cpu_seconds(pid) for pid in self._pids)

    def _wait(self, proc: subprocess.Popen[bytes], path: Path, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench: crypt4ghfs did not show {path.name}; see {self.dir}")
            time.sleep(0.001)


def _stack_env() -> dict[str, str]:
    """The environment without the PYTHONPATH this benchmark set for its own daemons."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def _ensure_stack_venv(venv: Path) -> str | None:
    """None once `venv` holds crypt4ghfs and ratarmount (pip-installing them if missing), else
    the reason they cannot be run here."""
    if (venv / "bin" / "crypt4ghfs").exists() and (venv / "bin" / "ratarmount").exists():
        return None
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing"
    log(f"building {venv}: pip install {' '.join(STACK_PINS)}")
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *STACK_PINS],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_stack_env())
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return f"{' '.join(cmd[:4])}… failed: {' / '.join(tail)}"
    return None


# -- start-up -------------------------------------------------------------------------------


def bench_startup(args: argparse.Namespace, d: Daemons, stack: Stack | None) -> dict[str, list]:
    pkg = d.pkg
    out: dict[str, list] = defaultdict(list)
    plain_src = d.work / "c4gh-plain-src"
    plain_src.mkdir(exist_ok=True)
    (plain_src / "manifest.json").write_bytes(pkg.manifest)
    target = Path(pkg.path.name) / "manifest.json"
    for r in range(args.startups):
        log(f"start-up round {r + 1}/{args.startups}")
        cmd, mnt, logfile = d.decant(plain_src, d.index("plain"))
        drop_caches([plain_src])
        seconds, m = time_to_bytes(cmd, mnt, mnt / "manifest.json", pkg.manifest, logfile)
        out["plain"].append(seconds)
        unmount(m)
        index = d.index("startup")
        # The last round logs at DEBUG to count decrypted segments; the others run as users do.
        debug = ["--log-level", "DEBUG"] if r == args.startups - 1 else []
        for key in ("cold", "remount"):
            cmd, mnt, logfile = d.decant(pkg.src, index, *debug)
            drop_caches([pkg.path])
            err = logfile.with_suffix(".stderr")
            seconds, m = time_to_bytes(cmd, mnt, mnt / target, pkg.manifest, err)
            unmount(m)
            out[key].append(seconds)
            if debug:
                out[f"segs_{key}"] = [len(segments_logged(logfile, pkg.path))]
        if stack is not None:
            out["stack"].append(stack.run(lambda: None)[0])
    return out


def import_floors() -> dict[str, float]:
    python = [sys.executable, "-c", "pass"]
    imports = [sys.executable, "-c", "import vfs.cli, vfs.mount.daemon, vfs.backends.c4gh"]
    return {
        "python": median([require(run_child(python), "python").seconds for _ in range(5)]),
        "imports": median([require(run_child(imports), "imports").seconds for _ in range(5)]),
    }


# -- sequential -----------------------------------------------------------------------------


@dataclass
class Sequential:
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, list[CpuProfile]] = field(default_factory=lambda: defaultdict(list))
    hwm: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    stack_cpu: list[float] = field(default_factory=list)  # CPU seconds of both stack daemons


def bench_sequential(args: argparse.Namespace, d: Daemons, stack: Stack | None) -> Sequential:
    """Rounds of: the decrypted TAR from disk; the stack; ours first read (fresh index: the
    member is hashed as it is served) and ours remounted on that index (verified)."""
    pkg = d.pkg
    size = pkg.member.stat().st_size
    out = Sequential()
    for r in range(args.repeat):
        log(f"sequential round {r + 1}/{args.repeat}: the decrypted TAR from disk")
        drop_caches([pkg.tar])
        out.seconds["plain"].append(_dd(pkg.tar, pkg.tar.stat().st_size))
        if stack is not None:
            log(f"sequential round {r + 1}/{args.repeat}: crypt4ghfs + ratarmount")
            seconds, cpu = stack.run(partial(_stack_dd, stack, size))[1]
            out.seconds["stack"].append(seconds)
            out.stack_cpu.append(cpu)
        index = d.index("seq")
        for key in ("hashing", "verified"):
            log(f"sequential round {r + 1}/{args.repeat}: decant-mount ({key})")
            cmd, dmnt, logfile = d.decant(pkg.src, index)
            with mounted(cmd, dmnt, logfile) as dec:
                shown = dmnt / pkg.path.name / MEMBER
                shown.stat()  # the package is described (not timed: start-up is above)
                drop_caches([pkg.path])
                with CpuSampler(dec.pid) as cpu:
                    out.seconds[key].append(_dd(shown, size))
                assert cpu.profile is not None
                out.cpu[key].append(cpu.profile)
                out.hwm[key].append(vm_hwm(dec.pid))
    log("sequential: decant-mount, a first read of the package in RAM (diagnostic: no disk)")
    with _in_ram(pkg.path) as src:
        cmd, dmnt, logfile = d.decant(src, index)
        with mounted(cmd, dmnt, logfile) as dec:
            shown = dmnt / pkg.path.name / MEMBER
            drop_caches([shown])  # the kernel's copy of the member only
            with CpuSampler(dec.pid) as cpu:
                out.seconds["cached"].append(_dd(shown, size))
            assert cpu.profile is not None
            out.cpu["cached"].append(cpu.profile)
    return out


@contextlib.contextmanager
def _in_ram(package: Path) -> Iterator[Path]:
    """A SRC folder in tmpfs holding a copy of `package`. Not the package in the page cache:
    its loads read past the page cache (O_DIRECT), so they went to the disk all the same."""
    with tempfile.TemporaryDirectory(prefix="bench-c4gh-", dir="/dev/shm") as folder:
        shutil.copyfile(package, Path(folder) / package.name)
        yield Path(folder)


def _stack_dd(stack: Stack, size: int) -> tuple[float, float]:
    """Seconds of dd of the member through the stack, and the CPU its daemons used meanwhile."""
    cpu = stack.cpu_seconds()
    seconds = _dd(stack.member, size)
    return seconds, stack.cpu_seconds() - cpu


def _dd(path: Path, size: int) -> float:
    seconds, nbytes = dd_read(path)
    if nbytes != size:
        raise SystemExit(f"bench: dd read {nbytes} bytes of {path}, expected {size}")
    return seconds


# -- random ---------------------------------------------------------------------------------


def bench_random(args: argparse.Namespace, d: Daemons, stack: Stack | None) -> dict[str, list]:
    pkg = d.pkg
    size = pkg.member.stat().st_size
    rng = random.Random(args.seed)
    pages = (size - READ_SIZE) // READ_SIZE
    offsets = [rng.randrange(pages) * READ_SIZE for _ in range(args.samples)]
    out: dict[str, list] = {}
    log("random preads: the package itself, a cipher segment a read (the disk's floor)")
    segments = [o // SEGMENT * CIPHER_SEGMENT for o in offsets]
    out["disk_floor"] = timed_preads(pkg.path, segments, evict=True, size=CIPHER_SEGMENT)
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
    if stack is not None:
        log("random preads: crypt4ghfs + ratarmount, fresh daemons, package evicted")
        member = stack.member

        def preads() -> list[float]:
            samples = timed_preads(member, offsets, evict=True)
            _check(member, expected)
            return samples

        out["stack"] = stack.run(preads)[1]
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


# -- the run and its report ------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path, pkg: Package) -> Report:
    d = Daemons(work, pkg)
    stack = None if args.no_stack else Stack(args.stack_venv, work, pkg)
    reason = "--no-stack" if stack is None else None
    if stack is not None and not stack.prepare():
        reason, stack = stack.reason, None
    floors = import_floors()
    startup = bench_startup(args, d, stack)
    seq = bench_sequential(args, d, stack)
    rnd = bench_random(args, d, stack)
    size = pkg.member.stat().st_size
    ctx = machine_context(
        input=f"{pkg.path.name} {pkg.path.stat().st_size / MiB:.0f} MiB, {pkg.segments} "
        f"segments; member {size / MB:.0f} MB, manifest.json {len(pkg.manifest)} B",
        cache=f"{DEFAULT_CACHE / MiB:.0f} MiB (decant-mount default)",
        stack="crypt4ghfs 1.2 + ratarmount 1.3" if reason is None else f"not measured: {reason}",
    )
    if stack is not None and stack.crashes:
        ctx["stack"] += f" (crypt4ghfs exited mid-measurement {stack.crashes}×; those retried)"
    report = Report("decant bench: c4gh (GDI .tar.c4gh package)", ctx)
    _report_startup(report, startup, floors)
    _report_sequential(report, seq, size, pkg.tar.stat().st_size)
    _report_random(report, rnd)
    _report_memory(report, seq)
    return report


def _runs(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    return "[" + " ".join(fmt.format(v) for v in values) + "]"


def _report_startup(report: Report, s: dict[str, list], floors: dict[str, float]) -> None:
    report.section("start-up: from starting the daemon(s) to the bytes of manifest.json (medians)")
    report.add("python -c pass (interpreter floor)", f"{floors['python']:.3f} s")
    report.add("import vfs.cli+daemon+c4gh (import floor)", f"{floors['imports']:.3f} s")
    plain = median(s["plain"])
    report.add("same daemon, a plain file instead (floor)", f"{plain:.3f} s", _runs(s["plain"]))
    cold = median(s["cold"])
    report.target("ours: fresh index, package evicted", cold, STARTUP_TARGET_S, "s", at_most=True)
    report.add("  per round", _runs(s["cold"]))
    if s["segs_cold"]:
        report.add("  segments decrypted", f"{s['segs_cold'][0]}")
    again = median(s["remount"])
    report.add("ours: remount, persistent index", f"{again:.3f} s", _runs(s["remount"]))
    if s["stack"]:
        stack = median(s["stack"])
        report.add("crypt4ghfs + ratarmount (fresh index)", f"{stack:.3f} s", _runs(s["stack"]))
        report.add("  stack ÷ ours", f"{stack / cold:.2f}×")


def _report_sequential(report: Report, seq: Sequential, size: int, tar_size: int) -> None:
    t = seq.seconds
    report.section("sequential: dd bs=1M, page cache dropped and fresh daemons for each figure")
    rows = [("plain", "decrypted TAR from disk (plain)", tar_size)]
    if t["stack"]:
        rows.append(("stack", "member: crypt4ghfs + ratarmount", size))
    rows += [
        ("hashing", "member: ours, first read (hashing)", size),
        ("verified", "member: ours, verified remount", size),
    ]
    speeds: dict[str, list[float]] = {}
    for key, label, nbytes in rows:
        speeds[key] = [mbps(nbytes, x) for x in t[key]]
        report.add(
            label, f"{median(speeds[key]):.0f} MB/s", f"per round {_runs(speeds[key], '{:.0f}')}"
        )
    for key in ("hashing", "verified"):
        ratios = [a / b for a, b in zip(speeds[key], speeds["plain"], strict=True)]
        label = f"ours ({key}) ÷ plain, median of rounds"
        report.target(label, median(ratios), SEQUENTIAL_TARGET, "", at_most=False)
        report.add("  per round", _runs(ratios, "{:.2f}"))
        if "stack" in speeds:
            ratios = [a / b for a, b in zip(speeds[key], speeds["stack"], strict=True)]
            label = f"ours ({key}) ÷ stack, median of rounds"
            report.target(label, median(ratios), STACK_TARGET, "", at_most=False)
            report.add("  per round", _runs(ratios, "{:.2f}"))
    if "stack" in speeds:
        ratios = [a / b for a, b in zip(speeds["stack"], speeds["plain"], strict=True)]
        report.add(
            "stack ÷ plain, median of rounds", f"{median(ratios):.2f}", _runs(ratios, "{:.2f}")
        )
    cached = mbps(size, median(t["cached"]))
    report.add("member: ours, first read, package in tmpfs", f"{cached:.0f} MB/s", "(no disk)")
    gib = size / (1 << 30)
    work = [("hashing", [c.process for c in seq.cpu["hashing"]]),
            ("verified", [c.process for c in seq.cpu["verified"]])]  # fmt: skip
    if seq.stack_cpu:
        work.append(("stack", seq.stack_cpu))
    report.section("CPU work per GiB of member served (less load-sensitive than MB/s)")
    for key, seconds in work:
        report.add(f"{key}: daemon CPU-seconds per GiB", f"{median(seconds) / gib:.2f} s",
                   _runs([x / gib for x in seconds], "{:.2f}"))  # fmt: skip
    report.section("daemon CPU while dd ran (0.1 s samples of /proc/PID/stat utime+stime)")
    for key, label in (("hashing", "hashing"), ("verified", "verified"), ("cached", "tmpfs")):
        for i, profile in enumerate(seq.cpu[key]):
            report.add(f"{label} round {i + 1}", f"{profile.busy:.2f}", profile.text())


def _report_random(report: Report, rnd: dict[str, list]) -> None:
    n = len(rnd["disk"])
    report.section(f"random aligned 4 KiB os.pread of the member (n={n}, kernel page evicted)")
    report.add("memfs ceiling", latency_text(rnd["memfs"]))
    report.add("package on disk: 64 KiB pread, evicted", latency_text(rnd["disk_floor"]))
    for key, label in (
        ("disk", "ours, fresh daemon, package evicted"),
        ("pagecache", "ours, fresh daemon, package cached"),
    ):
        report.add(label, latency_text(rnd[key]))
        p99 = percentile(rnd[key], 99) * 1e3
        report.target("  p99", p99, P99_TARGET_MS, "ms", at_most=True)
    report.add("ours, segment in the daemon's cache", latency_text(rnd["warm"]))
    if "stack" in rnd:
        report.add("crypt4ghfs + ratarmount, package evicted", latency_text(rnd["stack"]))


def _report_memory(report: Report, seq: Sequential) -> None:
    report.section(f"memory: decant-mount, default cache ({DEFAULT_CACHE / MiB:.0f} MiB)")
    for key, label in (("hashing", "first read"), ("verified", "verified remount")):
        hwm = max(seq.hwm[key]) / MiB
        above = hwm - DEFAULT_CACHE / MiB
        report.add(f"peak RSS streaming the member, {label}", f"{hwm:.0f} MiB")
        report.target("  above the cache", above, MEMORY_TARGET_MIB, "MiB", at_most=True)
