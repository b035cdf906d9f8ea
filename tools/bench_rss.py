"""Daemon memory under read patterns (`tools/bench.py rss`): RSS against --cache-size + 150 MiB.

Runs this checkout's `python -m vfs.cli SRC MNT -f` on two generated N MiB uint16 z-stacks
(2048×2048 planes, a smooth field plus noise, packed byte-exact) and samples the daemon's VmRSS
every second (VmHWM for the peak):

- A: fresh index; T threads, each on its own long-lived descriptor, random 4 KiB preads for S
  seconds; then every handle closes and RSS is read again after 5 s (background verifications
  started by the random reads run meanwhile).
- B: the same once both files verified (sha256sum through a first mount, remount on that index).
- C: fresh index; `sha256sum` of both files, one after the other.
- D: fresh index; K small archives (64 KiB TIFFs) read back whole with `sha256sum`.
- E: fresh index; 2T readers at once, T on each stack, half streaming 1 MiB reads from a random
  start, half random reads of 1 byte to 2 MiB, for S seconds (many users on one daemon).

Each scenario prints its peak and end RSS, the ratio to the budget and PASS/MISS.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's vfs, not another installed one
    sys.path.insert(0, str(ROOT))
# The daemons are `python -m vfs.cli` children: they must import this checkout's vfs too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from benchlib import (  # noqa: E402
    MiB,
    Mount,
    Report,
    cpu_seconds,
    log,
    machine_context,
    mounted,
    note_end,
    workdir,
)

SLACK = 150 * MiB  # the budget: --cache-size + 150 MiB
PLANE = (2048, 2048)
SMALL_SHAPE = (128, 256)  # uint16: 64 KiB of pixels per small TIFF
SETTLE = 5.0  # seconds after the last handle closed before the end RSS is read


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    cache = _size(args.cache_size)
    with workdir(args.workdir) as work:
        big = ensure_stacks(work / "src-big", args.mib)
        small = ensure_small(work / "src-small", args.small) if "D" in args.scenarios else None
        report = Report(
            f"decant-mount RSS (budget = cache {cache // MiB} MiB + {SLACK // MiB} MiB)",
            machine_context(code=_code_version(), cache_size=args.cache_size),
        )
        bench = RssBench(work, args, cache, report)
        runs: dict[str, Callable[[], None]] = {
            "A": lambda: bench.random(big),
            "B": lambda: bench.random_verified(big),
            "C": lambda: bench.sequential(big),
            "D": lambda: bench.small(small),
            "E": lambda: bench.mixed(big),
        }
        for name in args.scenarios.upper():
            runs[name]()
    note_end(report)
    print(report.render())
    return 0 if bench.all_met else 1


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"bench.py {command}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mib", type=int, default=256, help="size of each of the two stacks (MiB)")
    p.add_argument("--cache-size", default="256M", help="decant-mount --cache-size (256M)")
    p.add_argument(
        "--threads",
        type=int,
        default=8,
        help="pread threads in A and B; readers per stack in E (8)",
    )
    p.add_argument("--seconds", type=float, default=30.0, help="pread time in A and B (30)")
    p.add_argument("--small", type=int, default=2000, help="small archives in D (2000)")
    p.add_argument("--scenarios", default="ABCDE", help="which of A-E to run (ABCDE)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="scratch folder; inputs found there are reused (default: a temp folder)",
    )
    p.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra decant-mount argument (repeatable), e.g. --daemon-arg=--no-index",
    )
    return p


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if m is None:
        raise SystemExit(f"bench rss: bad size {text!r}")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2]]


def _code_version() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "vfs"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{ROOT} {done.stdout.strip()[:60]}{' +uncommitted' if dirty else ''}"


# -- inputs ---------------------------------------------------------------------------------


def ensure_stacks(src: Path, mib: int) -> list[str]:
    """Two packed stacks of `mib` MiB each in `src` (made once per size); their presented names."""
    import numpy as np
    import tifffile

    from vfs.decant.packer import pack_file

    names = [f"stack{k}-{mib}M.tif" for k in ("a", "b")]
    src.mkdir(parents=True, exist_ok=True)
    count = max(1, mib * MiB // (PLANE[0] * PLANE[1] * 2))
    yy = np.arange(PLANE[0], dtype=np.float32)[:, None]
    xx = np.arange(PLANE[1], dtype=np.float32)[None, :]
    for seed, name in enumerate(names):
        archive = src / f"{name}.zarr.zip"
        if archive.exists():
            continue
        log(f"generating and packing {name} ({count} planes)")
        rng = np.random.default_rng(seed)
        base = 1500.0 + 900.0 * np.sin(xx / (300.0 + 40 * seed)) * np.cos(yy / 270.0)

        def planes(base: Any = base, rng: Any = rng) -> Iterator[Any]:
            for z in range(count):
                smooth = base + 300.0 * np.sin(z / 9.0 + yy / 500.0)
                yield smooth.astype(np.uint16) + rng.integers(0, 64, PLANE, dtype=np.uint16)

        with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
            tif = Path(tmp) / name
            with tifffile.TiffWriter(tif) as writer:
                writer.write(
                    planes(), shape=(count, *PLANE), dtype=np.uint16, metadata={"axes": "ZYX"}
                )
            pack_file(tif, archive)
    return names


def ensure_small(src: Path, count: int) -> int:
    """`count` archives of 64 KiB TIFFs, 200 to a folder; returns how many there are."""
    import numpy as np
    import tifffile

    from vfs.decant.packer import pack_file

    missing = [k for k in range(count) if not _small_archive(src, k).exists()]
    if missing:
        log(f"packing {len(missing)} small archives")
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
        for k in missing:
            tif = Path(tmp) / f"f{k:05d}.tif"
            ramp = np.arange(SMALL_SHAPE[1], dtype=np.uint16)[None, :] * 8 + k
            tifffile.imwrite(tif, ramp + rng.integers(0, 64, SMALL_SHAPE, dtype=np.uint16))
            out = _small_archive(src, k)
            out.parent.mkdir(parents=True, exist_ok=True)
            pack_file(tif, out)
            tif.unlink()
    return count


def _small_archive(src: Path, k: int) -> Path:
    return src / f"d{k // 200:02d}" / f"f{k:05d}.tif.zarr.zip"


# -- sampling -------------------------------------------------------------------------------


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


@dataclass
class RssSampler:
    """VmRSS of `pid` once a second, in a thread, until stopped."""

    pid: int
    interval: float = 1.0
    samples: list[int] = field(default_factory=list)  # bytes
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(status_kib(self.pid)["VmRSS"] * 1024)
            except (OSError, KeyError):
                return
            if self._stop.wait(self.interval):
                return


# -- workloads ------------------------------------------------------------------------------


def random_preads(paths: list[Path], threads: int, seconds: float, seed: int) -> int:
    """`threads` threads, each with its own descriptor (file k % len(paths)), reading 4 KiB at
    random aligned offsets until `seconds` pass; the descriptors close together at the end."""
    fds = [os.open(paths[k % len(paths)], os.O_RDONLY) for k in range(threads)]
    counts = [0] * threads
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def work(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        pages = os.fstat(fds[k]).st_size // 4096
        try:
            while time.monotonic() < deadline:
                if len(os.pread(fds[k], 4096, rng.randrange(pages) * 4096)) != 4096:
                    raise OSError(f"short read in {paths[k % len(paths)]}")
                counts[k] += 1
        except OSError as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for fd in fds:
        os.close(fd)
    if errors:
        raise SystemExit(f"bench rss: pread failed: {errors[0]}")
    return sum(counts)


def mixed_reads(paths: list[Path], per_file: int, seconds: float, seed: int) -> int:
    """`per_file` readers of each path on their own descriptors: even ones stream 1 MiB reads
    from a random start (wrapping), odd ones read 1 B to 2 MiB at random offsets."""
    sizes = [1, 4096, 65536, 300_000, MiB, 2 * MiB]
    jobs = [(p, k) for p in paths for k in range(per_file)]
    counts = [0] * len(jobs)
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def work(j: int) -> None:
        path, k = jobs[j]
        rng = random.Random(seed * 1000 + j)
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        pos = rng.randrange(size)
        try:
            while time.monotonic() < deadline:
                if k % 2:
                    off, n = rng.randrange(size), rng.choice(sizes)
                else:
                    off, n = pos, MiB
                    pos = (pos + n) % size
                if len(os.pread(fd, n, off)) != min(n, size - off):
                    raise OSError(f"short read in {path}")
                counts[j] += 1
        except OSError as exc:
            errors.append(exc)
        finally:
            os.close(fd)

    workers = [threading.Thread(target=work, args=(j,)) for j in range(len(jobs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise SystemExit(f"bench rss: read failed: {errors[0]}")
    return sum(counts)


def sha256sum(paths: list[Path]) -> None:
    for start in range(0, len(paths), 500):  # one process per 500 files
        done = subprocess.run(
            ["sha256sum", *map(str, paths[start : start + 500])],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"bench rss: sha256sum failed: {done.stderr.strip()[-500:]}")


class RssBench:
    """Runs the scenarios against fresh daemons and adds their rows to the report."""

    def __init__(self, work: Path, args: argparse.Namespace, cache: int, report: Report) -> None:
        self.work, self.args, self.cache, self.report = work, args, cache, report
        self.budget = cache + SLACK
        self.all_met = True
        self.count = 0
        self.logs = work / "logs" / time.strftime("%Y%m%d-%H%M%S")

    def _mount(
        self, src: Path, index: Path | None = None
    ) -> tuple[AbstractContextManager[Mount], Path]:
        self.count += 1
        if index is None:
            index = self.work / "index" / f"i{time.monotonic_ns()}"
            index.mkdir(parents=True)
        mnt = self.work / "mnt"
        logfile = self.logs / f"daemon-{self.count:02d}.log"
        cmd = [
            sys.executable,
            "-m",
            "vfs.cli",
            src,
            mnt,
            "-f",
            "--cache-size",
            self.args.cache_size,
            "--index-dir",
            index,
            "--log-file",
            logfile,
            *self.args.daemon_arg,
        ]
        return mounted(cmd, mnt, logfile), index

    def _row(self, name: str, peak: int, end: int, series: list[int], note: str) -> None:
        ok = peak <= self.budget and end <= self.budget
        self.all_met &= ok
        ratio = f"{peak / self.budget:.2f}× / {end / self.budget:.2f}× budget"
        self.report.add(
            f"{name} peak / end RSS",
            f"{peak // MiB} / {end // MiB} MiB",
            f"{ratio}  {'PASS' if ok else 'MISS'}",
        )
        self.report.add(f"{name} workload", "", note)
        if series:
            shown = " ".join(str(s // MiB) for s in series)
            self.report.add(f"{name} RSS (MiB) by second", f"{len(series)} s", shown)

    def _measure(
        self, pid: int, action: Callable[[], str | None], name: str, note: str = ""
    ) -> None:
        """Run `action` while sampling; the peak is VmHWM when it ends, the end RSS 5 s later."""
        cpu, start = cpu_seconds(pid), time.perf_counter()
        with RssSampler(pid) as sampler:
            detail = action()
            seconds = time.perf_counter() - start
            spent = f"{seconds:.1f} s, daemon CPU {cpu_seconds(pid) - cpu:.1f} s"
            peak = status_kib(pid)["VmHWM"] * 1024
            time.sleep(SETTLE)
        end = status_kib(pid)["VmRSS"] * 1024
        self._row(name, peak, end, sampler.samples, f"{note} ({detail or spent})")

    def random(self, names: list[str], index: Path | None = None, label: str = "A") -> None:
        a = self.args
        log(f"{label}: {a.threads} threads × random 4 KiB preads for {a.seconds:g} s")
        ctx, _ = self._mount(self.work / "src-big", index)
        with ctx as m:
            paths = [m.mnt / n for n in names]
            states = [os.getxattr(p, "user.decant.verified").decode() for p in paths]

            def run() -> str:
                cpu = cpu_seconds(m.pid)
                n = random_preads(paths, a.threads, a.seconds, a.seed)
                per_read = (cpu_seconds(m.pid) - cpu) / max(n, 1)
                return (
                    f"{n / a.seconds:.0f} preads/s, daemon CPU {per_read * 1e6:.0f} µs/pread; "
                    f"verified at start: {','.join(states)}"
                )

            self._measure(m.pid, run, label, "then closed, +5 s")

    def random_verified(self, names: list[str]) -> None:
        log("B: verifying both files through a first mount")
        ctx, index = self._mount(self.work / "src-big")
        with ctx as m:
            sha256sum([m.mnt / n for n in names])
        self.random(names, index, "B")

    def sequential(self, names: list[str]) -> None:
        log("C: sha256sum of both stacks through a fresh daemon")
        ctx, _ = self._mount(self.work / "src-big")
        with ctx as m:
            paths = [m.mnt / n for n in names]
            size = sum(p.stat().st_size for p in paths)

            def run() -> str:
                cpu, start = cpu_seconds(m.pid), time.perf_counter()
                sha256sum(paths)
                seconds = time.perf_counter() - start
                return (
                    f"{size / 1e6 / seconds:.0f} MB/s, daemon CPU {cpu_seconds(m.pid) - cpu:.1f} s"
                )

            self._measure(m.pid, run, "C", "+5 s")

    def small(self, count: int | None) -> None:
        assert count is not None
        log(f"D: {count} small archives read back whole through a fresh daemon")
        src = self.work / "src-small"
        ctx, _ = self._mount(src)
        with ctx as m:
            paths = [
                m.mnt / p.relative_to(src).as_posix().removesuffix(".zarr.zip")
                for p in sorted(src.rglob("*.zarr.zip"))[:count]
            ]
            self._measure(m.pid, lambda: sha256sum(paths), "D", "+5 s")

    def mixed(self, names: list[str]) -> None:
        a = self.args
        log(f"E: {2 * a.threads} readers, streaming and random, for {a.seconds:g} s")
        ctx, _ = self._mount(self.work / "src-big")
        with ctx as m:
            paths = [m.mnt / n for n in names]

            def run() -> str:
                n = mixed_reads(paths, a.threads, a.seconds, a.seed)
                return f"{n / a.seconds:.0f} reads/s"

            self._measure(m.pid, run, "E", "then closed, +5 s")
