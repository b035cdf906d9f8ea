"""Daemon memory per listed name: a folder of N empty files listed through a real mount.

    python tools/bench.py names [--files 100000] [--workdir DIR]

Through a mount (this checkout's `python -m vfs.cli SRC MNT -f`): the daemon's VmRSS and VmHWM
before, after `ls -f` and after `ls -l` of the folder (readdirplus hands every name an inode).
In process: tracemalloc of the same folder scanned into a `Folder` and every name given an inode
in an `InodeTable` (what readdir does), as bytes per name and the top allocation sites.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's vfs, not another installed one
    sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from benchlib import log, mounted  # noqa: E402

from vfs.mount.inodes import Folder, InodeTable  # noqa: E402
from vfs.mount.tree import SourceTree  # noqa: E402


def main(command: str = "names", argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"bench.py {command}", description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-names-") as tmp:
        work = Path(tmp)
        src, folder = work / "src", work / "src" / "many"
        folder.mkdir(parents=True)
        for i in range(args.files):
            (folder / f"file-{i:07d}.dat").touch()
        log(f"{args.files} empty files in {folder}")
        in_process(src, folder, args.files)
        through_mount(work, src, args.files)
    return 0


def in_process(src: Path, folder: Path, n: int) -> None:
    tree = SourceTree(src, [])
    table = InodeTable(tree.root_node())
    tree.scan(folder)  # once before: the interpreter's own tables grow to what a scan needs
    tracemalloc.start(4)
    before = tracemalloc.take_snapshot()
    listing = Folder()
    listing.merge(tree.scan(folder))
    for _c, _name, node in listing.after(0):  # readdirplus: every name gets an inode
        table.count(table.assign(node))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"in process: {total / n:.0f} B per name (Folder + Node + InodeTable, {n} names)")
    for s in stats[:8]:
        frame = s.traceback[0]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        print(f"  {s.size_diff / n:7.1f} B/name  {where}")
    del listing, table


def through_mount(work: Path, src: Path, n: int) -> None:
    mnt = work / "mnt"
    cmd = [sys.executable, "-m", "vfs.cli", src, mnt, "-f", "--index-dir", work / "index",
           "--log-file", work / "daemon.log"]  # fmt: skip
    with mounted(cmd, mnt, work / "stderr.txt") as mount:
        base = _memory(mount.pid)
        print(f"mount: daemon at start  VmRSS {base[0] / 2**20:7.1f} MiB  "
              f"VmHWM {base[1] / 2**20:7.1f} MiB")  # fmt: skip
        for cmdline in (["ls", "-f"], ["ls", "-l"]):
            start = time.perf_counter()
            done = subprocess.run([*cmdline, mnt / "many"], capture_output=True, check=True)
            took = time.perf_counter() - start
            rss, hwm = _memory(mount.pid)
            print(f"mount: after {' '.join(cmdline)} ({len(done.stdout.splitlines())} lines, "
                  f"{took:.1f} s)  VmRSS {rss / 2**20:7.1f} MiB  VmHWM {hwm / 2**20:7.1f} MiB  "
                  f"= {(rss - base[0]) / n:.0f} B/name over start")  # fmt: skip


def _memory(pid: int) -> tuple[int, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found["VmRSS"], found["VmHWM"]


if __name__ == "__main__":
    sys.exit(main())
