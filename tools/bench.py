#!/usr/bin/env python3
"""Benchmark dispatcher: `python tools/bench.py COMMAND [options]` (COMMAND --help for its options).

Each command lives in a `tools/bench_*.py` module imported only when chosen, so one benchmark's
imports (or a missing optional dependency) never slow or break another. A module provides
`main(command, argv) -> int`; adding a benchmark is one line in COMMANDS.
Every command prints a paste-able block of figures as ratios against a baseline measured in the
same run, with the absolute numbers beside them.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# command → (module in tools/, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "pack": ("bench_decant", "decant pack MB/s and archive size ÷ original, vs cp"),
    "restore": ("bench_decant", "decant restore MB/s vs cp, and its peak RSS"),
    "read": ("bench_decant", "random 4 KiB reads through the core reader (and zarr-python)"),
    "mount": ("bench_decant", "decant-mount vs an in-memory pyfuse3 ceiling: dd, preads, ls -l"),
    "c4gh": ("bench_c4gh", "GDI package: dd vs plain TAR and crypt4ghfs+ratarmount; start-up"),
    "acqstore": ("bench_acqstore", "AcqStore: validate 1,000 members; synthetic TIFF dd vs memfs"),
    "ingest": ("bench_ingest", "rsync -a into the mount until published, vs rsync + decant pack"),
    "rss": ("bench_rss", "daemon RSS vs --cache-size + 150 MiB: random, sequential, small reads"),
    "digests": ("bench_digests", "verified archive: cold preads and dd with/without chunk digests"),
    "names": ("bench_names", "daemon memory per listed name: ls -f / ls -l of N empty files"),
    "s3": ("bench_s3", "S3 (local SeaweedFS): ranged GET p50/p99, download MB/s, verify in bucket"),
}


def usage() -> str:
    lines = [__doc__.strip().splitlines()[0], "", "commands:"]
    lines += [f"  {name:<10}{summary}" for name, (_mod, summary) in COMMANDS.items()]
    lines += [
        "",
        "--disk-mbps N (any command): a slower disk. Every block device's reads are throttled",
        "to N MB/s for the benchmark and all it starts (daemons included), by a blkio cgroup",
        "(root); the report says so. Baselines and decant read the same throttled disk.",
    ]
    return "\n".join(lines)


def _take_disk_mbps(args: list[str]) -> int | None:
    """Remove `--disk-mbps N` from `args` (any command takes it): N, 0 if absent, None if bad."""
    if "--disk-mbps" not in args:
        return 0
    at = args.index("--disk-mbps")
    try:
        value = int(args[at + 1])
        if value <= 0:
            raise ValueError
    except (IndexError, ValueError):
        print("bench: --disk-mbps takes a positive number of MB/s", file=sys.stderr)
        return None
    del args[at : at + 2]
    return value


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    slow = _take_disk_mbps(args)
    if slow is None:
        return 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"bench: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    tools = str(Path(__file__).resolve().parent)
    if tools not in sys.path:  # also when imported rather than run as a script
        sys.path.insert(0, tools)
    root = str(Path(tools).parent)  # this checkout's vfs, not an editable install's elsewhere
    if root not in sys.path:
        sys.path.insert(1, root)
    if slow:
        from benchlib import throttle_disk_reads

        throttle_disk_reads(slow)
    from benchlib import page_reporting_held

    module = importlib.import_module(COMMANDS[command][0])
    with page_reporting_held():
        return int(module.main(command, rest))


if __name__ == "__main__":
    sys.exit(main())
