"""Shared benchmark plumbing: the report block, timing and percentiles, cache dropping, child RSS,
FUSE mounts in subprocesses, and the generated benchmark stack.

Benchmarks are not tests: nothing here asserts a time. Every figure is printed beside a baseline
measured in the same run, because these 2-core machines are shared and absolute numbers drift.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vfs.mount.daemon import mount_device

MB = 1_000_000  # throughputs in MB/s (decimal), as dd prints them
MiB = 1 << 20
TOOLS = Path(__file__).resolve().parent
# Children (decant, decant-mount, memfs) import `vfs` from this checkout, not from wherever the
# environment's editable install points: a benchmark measures the code beside it.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(TOOLS.parent), os.environ.get("PYTHONPATH")])
)


def log(message: str) -> None:
    """Progress on stderr, so stdout carries only the paste-able report."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the report -----------------------------------------------------------------------------


@dataclass
class Report:
    """Rows of (label, value, note) rendered as one fixed-width block for pasting into a note."""

    title: str
    context: dict[str, str] = field(default_factory=dict)
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def section(self, name: str) -> None:
        self.rows.append((f"-- {name}", "", ""))

    def add(self, label: str, value: str = "", note: str = "") -> None:
        self.rows.append((label, value, note))

    def target(self, label: str, value: float, limit: float, unit: str, at_most: bool) -> None:
        """A figure with its target: 'met' or 'MISSED', so a reader need not compare by eye."""
        ok = value <= limit if at_most else value >= limit
        sign = "<=" if at_most else ">="
        shown = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        self.add(label, f"{shown} {unit}".rstrip(), f"target {sign} {limit:.3g}  {_met(ok)}")

    def render(self) -> str:
        rows = [row for row in self.rows if row[1]]  # not sections or footnotes
        width = max((len(label) for label, _v, _n in rows), default=10) + 2
        # Short figures align; long ones (latency triples) just push their note along.
        vwidth = max((len(v) for _l, v, _n in rows if len(v) <= 16), default=8)
        head = f"=== {self.title} ==="
        lines = [head]
        lines += [f"  {k}: {v}" for k, v in self.context.items()]
        for label, value, note in self.rows:
            if label.startswith("-- "):
                lines.append(label)
            else:
                shown = f"{value:>{vwidth}}" if len(value) <= vwidth else value
                lines.append(f"  {label:<{width}}{shown}  {note}".rstrip())
        lines.append("=" * len(head))
        return "\n".join(lines)


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def compile_checkout() -> str:
    """Compile this checkout's `vfs` to bytecode, as installing a package does. Without it a
    daemon started where PYTHONDONTWRITEBYTECODE is set (this VM sets it) compiles every module
    from source at each start: ~40 ms of every start-up figure, which no installed daemon pays."""
    import compileall

    ok = compileall.compile_dir(TOOLS.parent / "vfs", quiet=1)
    return "compiled, as an install does" if ok else "compile failed: modules built at each start"


BYTECODE = compile_checkout()  # before any benchmark starts a daemon


def machine_context(**extra: object) -> dict[str, str]:
    """Facts that make a pasted block interpretable later: host, kernel, load at start; and
    whether this checkout's bytecode was compiled before any daemon started (`BYTECODE`)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    ctx = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.node()} {platform.release()} cpus={os.cpu_count()} load={load}",
        "python": sys.version.split()[0],
        "vfs bytecode": BYTECODE,
        "disk": DISK,
        "free page reporting": PAGE_REPORTING,
    }
    ctx.update({k: str(v) for k, v in extra.items()})
    return ctx


DISK = "as it is (not throttled)"
PAGE_REPORTING = "as it is"
_REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")


@contextlib.contextmanager
def page_reporting_held() -> Iterator[None]:
    """Hold off the balloon's free page reporting for the run (root, a VM that has it).

    With it on, the guest hands memory it frees back to the host, which takes the pages away;
    the next use of that memory faults on the host, inside whatever copy touches it first. Here
    that made the kernel's copy into the page cache 3x slower in some rounds and not others
    (a warm read through the mount: 0.35 s or 1.0-1.4 s, 71 % of the daemon's time in the
    kernel's memcpy; steady 0.35 s with reporting held off). Baselines and decant-mount pay it
    alike, at random, so it is noise in every ratio. An order above the allocator's largest
    (10) reports nothing; the old order is put back afterwards."""
    global PAGE_REPORTING
    try:
        before = _REPORTING_ORDER.read_text().strip()
        _REPORTING_ORDER.write_text("11\n")
    except OSError:
        yield  # not a VM with reporting, or not root: as it is
        return
    PAGE_REPORTING = f"held off during the run (order {before} put back after)"
    try:
        yield
    finally:
        _REPORTING_ORDER.write_text(f"{before}\n")


def _stolen_ticks() -> tuple[int, int]:
    """(stolen, total) CPU ticks of the machine so far (/proc/stat): stolen is time the
    hypervisor gave another guest while ours wanted to run."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return v[7], sum(v)


_TICKS_AT_START = _stolen_ticks()  # when the benchmark started (this module's import)


def note_end(report: Report) -> None:
    """Add the load at the end, and the share of the machine's CPU time stolen by the hypervisor
    during the run, to `report`'s context. On this shared VM a run with much of it stolen runs
    slow throughout: a warm-index `ls -l` of 1,000 archives in a bucket took 0.13-0.25 s with
    under 10 % stolen, 0.5-0.9 s with 30-40 % (and the system time of every request tripled)."""
    stolen, total = (b - a for a, b in zip(_TICKS_AT_START, _stolen_ticks(), strict=True))
    report.context["load at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    report.context["cpu stolen by the hypervisor during the run"] = f"{stolen / max(1, total):.0%}"


def throttle_disk_reads(mbps: int) -> None:
    """Make this process, and every process it starts from now on, read each block device at no
    more than `mbps` MB/s: a slower disk than this VM's (its "disk" streams from the host's
    cache at 0.6-3 GB/s). cgroup v1 blkio or v2 io.max; the baseline read (`dd` of the plain
    file) and the daemons are throttled alike, so the ratios show what a slower disk does."""
    global DISK
    devices = []
    for dev in Path("/sys/block").iterdir():
        if dev.name.startswith(("loop", "ram", "zram")) or not (dev / "dev").is_file():
            continue
        devices.append((dev / "dev").read_text().strip())
    limit = mbps * MB
    v1 = Path("/sys/fs/cgroup/blkio")
    if (v1 / "cgroup.procs").is_file():
        group = v1 / "decant-bench"
        group.mkdir(exist_ok=True)
        for dev in devices:
            (group / "blkio.throttle.read_bps_device").write_text(f"{dev} {limit}")
    else:
        root = next(
            (
                p
                for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
                if (p / "cgroup.controllers").is_file()
                and "io" in (p / "cgroup.controllers").read_text()
            ),
            None,
        )
        if root is None:
            raise SystemExit("bench: --disk-mbps needs the blkio or io cgroup controller")
        (root / "cgroup.subtree_control").write_text("+io")
        group = root / "decant-bench"
        group.mkdir(exist_ok=True)
        for dev in devices:
            (group / "io.max").write_text(f"{dev} rbps={limit}")
    (group / "cgroup.procs").write_text(str(os.getpid()))
    DISK = f"reads throttled to {mbps} MB/s on {', '.join(devices)} (--disk-mbps, {group})"


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds if seconds > 0 else float("inf")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: with few samples p99 is an observed value, never interpolated."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def duration(seconds: float) -> str:
    """3 significant digits in ms, or µs below 0.1 ms (a page-cache hit is a few µs)."""
    ms = seconds * 1e3
    return f"{ms * 1e3:.3g} µs" if ms < 0.1 else f"{ms:.3g} ms"


def latency_text(samples_s: Sequence[float]) -> str:
    """'p50 0.41 ms  p99 2.3 ms  max 4 ms' from samples in seconds."""
    p50, p99, top = percentile(samples_s, 50), percentile(samples_s, 99), max(samples_s)
    return f"p50 {duration(p50)}  p99 {duration(p99)}  max {duration(top)}"


# -- caches, children, timing -------------------------------------------------------------


def drop_caches(files: Iterable[Path] = ()) -> bool:
    """Make the next run cold: evict `files` from the page cache, then drop dentries and inodes.
    False if the dentry/inode caches could not be dropped (not root).

    Not `sync; echo 3 > drop_caches`: both walk every superblock under its lock, so one hung FUSE
    mount anywhere on the machine leaves the benchmark in uninterruptible sleep (seen here: a
    deadlocked daemon's `fusermount3 -u -z` held its superblock and `sync` waited in super_lock).
    Evicting the files a run reads touches nothing else; `echo 2` only try-locks superblocks.
    """
    for path in files:
        for file in path.rglob("*") if path.is_dir() else [path]:
            if file.is_file():
                evict_file(file)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("2\n")
    except OSError:
        return False
    return True


def evict_file(path: Path) -> None:
    """Write back and drop one file's cached pages: cheap enough to do before every timed read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # e.g. a FUSE file system without fsync
            os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ChildRun:
    seconds: float
    max_rss: int  # bytes: the child's peak resident set, as /usr/bin/time reports it
    returncode: int
    stderr: str


def run_child(cmd: Sequence[str | Path], cwd: Path | None = None) -> ChildRun:
    """Run a command to completion: wall time, and its peak RSS through /usr/bin/time.

    Not our own wait4 rusage: a forked child's ru_maxrss starts at its parent's peak (a 13 MiB
    /bin/true here once the parent had held 500 MiB), so a small `time` process does the forking.
    """
    with tempfile.NamedTemporaryFile("w+") as rss, tempfile.TemporaryFile("w+") as err:
        timed = ["/usr/bin/time", "-f", "%M", "-o", rss.name, *map(str, cmd)]
        start = time.perf_counter()
        done = subprocess.run(timed, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, check=False)
        seconds = time.perf_counter() - start
        err.seek(0)
        last = (rss.read().strip().splitlines() or ["0"])[-1]
        max_rss = int(last) * 1024 if last.isdigit() else 0
        return ChildRun(seconds, max_rss, done.returncode, err.read())


def require(run: ChildRun, what: str) -> ChildRun:
    if run.returncode != 0:
        raise SystemExit(f"bench: {what} failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    return run


def dd_read(path: Path, block: str = "1M") -> tuple[float, int]:
    """Seconds and bytes for `dd if=path of=/dev/null bs=block`: a plain sequential reader."""
    run = require(run_child(["dd", f"if={path}", "of=/dev/null", f"bs={block}"]), f"dd {path}")
    match = re.search(r"^(\d+) bytes", run.stderr, re.MULTILINE)
    return run.seconds, int(match.group(1)) if match else -1


def tool(name: str) -> list[str]:
    """A console script of this interpreter's environment, skipping slow pyenv-style shims."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"bench: {name} is not installed (pip install -e .)")
    return [found]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used (to tell CPU-bound from waiting)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuProfile:
    """Where a process's CPU time went while a timed run went on (see CpuSampler)."""

    wall: float
    process: float  # CPU seconds (user + system) of the process
    samples: list[float]  # cores the process kept busy, per sampling interval
    threads: list[float]  # CPU seconds per thread, busiest first
    cores: list[float]  # busy share of each CPU of the machine (every process), whole window

    @property
    def busy(self) -> float:
        """Mean cores the process kept busy."""
        return self.process / self.wall if self.wall > 0 else 0.0

    def above(self, cores: float) -> float:
        """Share of sampling intervals in which the process used more than `cores` cores."""
        return sum(s > cores for s in self.samples) / len(self.samples) if self.samples else 0.0

    def text(self) -> str:
        top = " ".join(f"{t / self.wall:.2f}" for t in self.threads[:4])
        machine = " ".join(f"cpu{i} {c:.0%}" for i, c in enumerate(self.cores))
        return (
            f"{self.busy:.2f} cores (p90 {percentile(self.samples, 90):.2f}, "
            f">1 core {self.above(1.0):.0%} of the time); threads {top}; machine {machine}"
        )


class CpuSampler:
    """Samples a process's CPU (/proc/PID/stat utime + stime) every `interval` seconds, its
    threads' totals (/proc/PID/task) and each CPU's busy share (/proc/stat), in a thread."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.profile: CpuProfile | None = None
        self._stop = threading.Event()
        self._samples: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._t0 = time.perf_counter()
        self._cpu0 = cpu_seconds(self.pid)
        self._threads0 = thread_cpu_seconds(self.pid)
        self._cores0 = _cpu_ticks()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self._t0
        threads1 = thread_cpu_seconds(self.pid)
        per_thread = [t - self._threads0.get(tid, 0.0) for tid, t in threads1.items()]
        cores = [
            (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
            for (busy0, total0), (busy1, total1) in zip(self._cores0, _cpu_ticks(), strict=False)
        ]
        self.profile = CpuProfile(
            wall=wall,
            process=cpu_seconds(self.pid) - self._cpu0,
            samples=self._samples,
            threads=sorted(per_thread, reverse=True),
            cores=cores,
        )

    def _run(self) -> None:
        last, then = self._cpu0, self._t0
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                now, cpu = time.perf_counter(), cpu_seconds(self.pid)
                self._samples.append((cpu - last) / (now - then))
                last, then = cpu, now


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each live thread of a process, by thread id."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_ticks() -> list[tuple[int, int]]:
    """(busy, total) clock ticks of each CPU since boot, from /proc/stat."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            ticks = [int(x) for x in line.split()[1:]]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
            out.append((sum(ticks) - idle, sum(ticks)))
    return out


def _proc_cpu_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """(name, utime+stime ticks) of each thread of `pid`, by thread id. Keyed by id, not name:
    trio renames a worker thread for each job it runs."""
    out: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            raw = (task / "stat").read_text()
            comm = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            out[int(task.name)] = (comm, int(fields[11]) + int(fields[12]))
    return out


def _cores_busy_ticks() -> list[tuple[int, int]]:
    """(busy, total) ticks of each CPU from /proc/stat (iowait counts as idle)."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]
            out.append((sum(v[:8]) - idle, sum(v[:8])))
    return out


@dataclass
class CpuUse:
    """CPU used while something ran: the daemon's (in cores), each core's (all processes), and
    the daemon's threads grouped by name, from samples taken every `interval` seconds."""

    seconds: float = 0.0
    daemon_cores: float = 0.0  # daemon CPU seconds ÷ wall seconds (2.0: both cores, all daemon)
    per_second: list[float] = field(default_factory=list)  # daemon cores in each ~1 s window
    core_busy: list[float] = field(default_factory=list)  # each CPU's busy fraction, any process
    threads: dict[str, float] = field(default_factory=dict)  # thread name → CPU seconds

    def text(self) -> str:
        cores = " ".join(f"{b:.0%}" for b in self.core_busy)
        return f"daemon {self.daemon_cores:.2f} cores; per core (all processes) {cores}"

    def threads_text(self, top: int = 4) -> str:
        ranked = sorted(self.threads.items(), key=lambda kv: -kv[1])[:top]
        return ", ".join(f"{name} {sec / max(self.seconds, 1e-9):.2f}" for name, sec in ranked)


class ThreadCpuSampler:
    """Samples a daemon's per-thread CPU ticks (by thread name) and /proc/stat in a thread while a
    block runs: which threads of the daemon did the work (CpuSampler gives the totals)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.use = CpuUse()
        self._stop = threading.Event()
        self._samples: list[tuple[float, dict[int, tuple[str, int]]]] = []

    def __enter__(self) -> ThreadCpuSampler:
        self._cores0 = _cores_busy_ticks()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        with contextlib.suppress(OSError):
            self._samples.append((time.perf_counter(), _proc_cpu_ticks(self.pid)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        hz = os.sysconf("SC_CLK_TCK")
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        use = self.use
        use.seconds = t1 - t0
        names: dict[str, float] = {}
        for tid, (name, ticks) in last.items():
            # A trio worker thread is named after the job it runs ("FN from TASK"), so its name
            # at the last sample says only what it does now (the folder watcher's 200 ms wait,
            # say), not what its CPU went to: all of them count as one.
            trio = name.startswith("Trio thread") or " from " in name
            label = "trio worker" if trio else name
            used = (ticks - first.get(tid, (name, 0))[1]) / hz
            names[label] = names.get(label, 0.0) + used
        use.threads = names
        use.daemon_cores = sum(names.values()) / max(use.seconds, 1e-9)
        start = 0
        for i, (t, ticks) in enumerate(self._samples):
            if t - self._samples[start][0] >= 1.0 or (i == len(self._samples) - 1 and i > start):
                before = self._samples[start][1]
                used = sum(v - before.get(k, (n, 0))[1] for k, (n, v) in ticks.items()) / hz
                use.per_second.append(used / (t - self._samples[start][0]))
                start = i
        cores1 = _cores_busy_ticks()
        use.core_busy = [
            (b1 - b0) / max(1, n1 - n0)
            for (b0, n0), (b1, n1) in zip(self._cores0, cores1, strict=True)
        ]


def vm_hwm(pid: int) -> int:
    """Peak resident set size of a live process, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmHWM for pid {pid}")


def timed_preads(path: Path, offsets: list[int], evict: bool, size: int = 4096) -> list[float]:
    """Seconds per os.pread(size); with `evict` the file's kernel pages are dropped first, so each
    read reaches the FUSE daemon rather than the page cache."""
    fd = os.open(path, os.O_RDONLY)  # the open (and FUSE open) is not timed
    try:
        out = []
        for offset in offsets:
            if evict:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            start = time.perf_counter()
            data = os.pread(fd, size, offset)
            out.append(time.perf_counter() - start)
            if len(data) != size:
                raise SystemExit(f"bench: short read at {offset} in {path}")
        return out
    finally:
        os.close(fd)


def time_ls(folder: Path) -> float:
    return require(run_child(["ls", "-l", folder]), f"ls -l {folder}").seconds


# -- mounts --------------------------------------------------------------------------------


@dataclass
class Mount:
    """A FUSE daemon running in the foreground as our child, and where it is mounted."""

    mnt: Path
    proc: subprocess.Popen[bytes]
    read_ahead_kb: int = -1

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def mounted(cmd: Sequence[str | Path], mnt: Path, stderr: Path) -> Iterator[Mount]:
    """Run a foreground FUSE daemon; yield once it serves with 1 MiB read-ahead; always unmount."""
    mnt.mkdir(parents=True, exist_ok=True)
    stderr.parent.mkdir(parents=True, exist_ok=True)
    with open(stderr, "ab") as err:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=err)
    mount = Mount(mnt, proc)
    try:
        _wait_mounted(mount, stderr)
        mount.read_ahead_kb = _wait_read_ahead(mnt)
        yield mount
    finally:
        unmount(mount)


def _wait_mounted(mount: Mount, stderr: Path, timeout: float = 60.0) -> None:
    # Polls /proc/self/mountinfo, not stat(MNT): a stat would block on a daemon not serving yet.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mount.proc.poll() is not None:
            raise SystemExit(f"bench: mount of {mount.mnt} failed: {stderr.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            mount_device(mount.mnt)
            os.stat(mount.mnt)  # answered by the daemon: it is serving
            return
        time.sleep(0.02)
    raise SystemExit(f"bench: {mount.mnt} not mounted after {timeout:.0f} s")


def _wait_read_ahead(mnt: Path, want: int = 1024, timeout: float = 5.0) -> int:
    """The daemon raises read_ahead_kb shortly after FUSE INIT; measure only once it has."""
    path = Path(f"/sys/class/bdi/{mount_device(mnt)}/read_ahead_kb")
    deadline = time.monotonic() + timeout
    value = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            value = int(path.read_text())
            if value >= want:
                return value
        time.sleep(0.05)
    log(f"warning: {mnt} read_ahead_kb stayed {value} (wanted {want})")
    return value


def unmount(mount: Mount, timeout: float = 30.0) -> None:
    """fusermount3 -u (lazily if busy), then reap the daemon; kill it if it will not go."""
    if mount.proc.poll() is None or _is_mounted(mount.mnt):
        for args in (["-u"], ["-uz"]):
            done = subprocess.run(
                ["fusermount3", *args, str(mount.mnt)], capture_output=True, check=False
            )
            if done.returncode == 0 or not _is_mounted(mount.mnt):
                break
    try:
        mount.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        mount.proc.kill()
        try:
            mount.proc.wait(10)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): nothing more to do
            log(f"warning: daemon {mount.pid} for {mount.mnt} will not exit")


def _is_mounted(mnt: Path) -> bool:
    try:
        mount_device(mnt)
    except OSError:
        return False
    return True


# -- options and inputs --------------------------------------------------------------------


def common_options(repeat: int) -> argparse.ArgumentParser:
    """Options every benchmark takes (a parent parser; `repeat` is the command's default)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--gib", type=float, default=1.0, help="size of the generated stack (GiB)")
    p.add_argument("--stack", type=Path, metavar="PATH", help="use this TIFF stack instead")
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="scratch folder; generated inputs found there are reused (default: a temp folder, "
        "removed afterwards)",
    )
    p.add_argument("--repeat", type=int, default=repeat, help=f"timed rounds (default {repeat})")
    p.add_argument("--seed", type=int, default=1, help="random offsets seed")
    return p


@contextlib.contextmanager
def workdir(given: Path | None) -> Iterator[Path]:
    """The given folder (kept, so its inputs are reused), or a temp folder on disk, not tmpfs."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given.resolve()
        return
    folder = Path(tempfile.mkdtemp(prefix="decant-bench-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def ensure_stack(work: Path, gib: float, given: Path | None) -> Path:
    """The uint16 2048×2048 multi-page stack: --stack, or generated once per size in `work`."""
    if given is not None:
        if not given.is_file():
            raise SystemExit(f"bench: --stack {given}: no such file")
        return given.resolve()
    out = work / f"stack-{gib:g}GiB.tif"
    if not out.is_file():
        sys.path.insert(0, str(TOOLS))
        from make_corpus import write_stack

        log(f"generating {out.name}")
        tmp = out.with_name(out.name + ".part")
        write_stack(tmp, gib)
        tmp.replace(out)
    return out
