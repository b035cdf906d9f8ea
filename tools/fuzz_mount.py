#!/usr/bin/env python3
"""Fuzzed decant archives read through a real mount, as a user's tools read them.

    python tools/fuzz_mount.py [--seed N] [--cases N] [--timeout S] [--json]

Mutates the packer's archives as tools/fuzz.py does (one case per folder of SRC), mounts SRC
once with `decant-mount`, and for every presented file does a partial read (`head`), then a full
read, then random preads, comparing with the original bytes. Outcomes per file:

  ok           the full read returned the original bytes
  error        a read failed (EIO etc.): the damage was refused
  raw          the archive is shown as its raw file (it could not be served)
  renamed      a series member appears under a mutated name (bytes not compared)
  FAIL kinds   wrong-full (a full read returned other bytes with no error), wrong-verified (a
               random pread of a file that had just read whole and correct returned other bytes
               with no error), hang (a read outlived the timeout), mount-died — the tests
               require none
Random preads of files not verified yet may return wrong bytes without error (the sha256 needs
the whole file); they are counted apart as unverified-random-wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.toolbox import load_tool  # noqa: E402

FAILS = ("wrong-full", "wrong-verified", "hang", "mount-died")


def build_cases(work: Path, src: Path, seed: int, cases: int) -> dict[str, Any]:
    """SRC/case-NNNN/<archive>: one mutated archive per folder; name → its Sample."""
    fuzz = load_tool("fuzz")
    samples = fuzz.make_samples(work)
    rng = random.Random(seed)
    out = {}
    for i in range(cases):
        sample = samples[i % len(samples)]
        folder = src / f"case-{i:04d}"
        folder.mkdir(parents=True)
        fuzz.mutate(sample, folder / sample.path.name, rng)
        out[folder.name] = sample
    return out


def expected(sample: Any, relpath: str) -> bytes | None:
    """The original bytes a presented path should hold (None: a name the archive never had)."""
    if len(sample.originals) == 1 and "/" not in relpath:
        return next(iter(sample.originals.values())) if relpath in sample.originals else None
    return sample.originals.get(relpath.split("/", 1)[1] if "/" in relpath else relpath)


def check_file(path: Path, want: bytes, rng: random.Random) -> tuple[str, int]:
    """(outcome, random preads of the unverified file that came back wrong without error)."""
    size = len(want)
    unverified_wrong = 0
    try:
        with open(path, "rb") as fh:
            fh.read(4096)  # the partial read first: it must not let the full read skip its check
            for _ in range(4):
                off = rng.randrange(size + 1) if size else 0
                with contextlib.suppress(OSError):
                    if os.pread(fh.fileno(), 4096, off) != want[off : off + 4096]:
                        unverified_wrong += 1
    except OSError:
        pass  # refused early: the full read below must be refused too, or be right
    try:
        data = path.read_bytes()
    except OSError:
        return "error", unverified_wrong
    if data != want:
        return "wrong-full", unverified_wrong
    with open(path, "rb") as fh:
        for _ in range(8):
            off = rng.randrange(size + 1) if size else 0
            try:
                got = os.pread(fh.fileno(), 4096, off)
            except OSError:
                continue  # refusing is always allowed
            if got != want[off : off + 4096]:
                return "wrong-verified", unverified_wrong
    return "ok", unverified_wrong


def read_case(mnt: Path, case: str, sample: Any, rng: random.Random) -> list[tuple[str, str]]:
    results = []
    root = mnt / case
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if rel == sample.path.name or rel.startswith(sample.path.name + "/"):
                results.append(("raw", rel))
                continue
            want = expected(sample, rel)
            if want is None:
                results.append(("renamed", rel))
                continue
            outcome, wrong = check_file(path, want, rng)
            results.append((outcome, rel))
            results.extend(("unverified-random-wrong", rel) for _ in range(wrong))
    return results


def fuzz_mount(seed: int, cases: int, timeout: float, work: Path) -> dict[str, Any]:
    src, mnt = work / "src", work / "mnt"
    mnt.mkdir(parents=True)
    built = build_cases(work / "samples", src, seed, cases)
    log = work / "decant-mount.log"
    cmd = [sys.executable, "-m", "vfs.cli", str(src), str(mnt), "-f", "--read-only",
           "--index-dir", str(work / "index"), "--log-file", str(log)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=HERE.parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    tally: Counter[str] = Counter()
    details: list[str] = []
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        _wait_mounted(mnt, proc)
        rng = random.Random(seed)
        for case, sample in built.items():
            future = pool.submit(read_case, mnt, case, sample, rng)
            try:
                results = future.result(timeout=timeout)
            except FutureTimeout:
                tally["hang"] += 1
                details.append(f"{case}: reads outlived {timeout} s")
                break  # the reading thread is stuck in the kernel; the mount is aborted below
            for outcome, rel in results:
                tally[outcome] += 1
                if outcome in FAILS:
                    details.append(f"{case}/{rel}: {outcome}")
        if proc.poll() is not None or not os.listdir(mnt):
            tally["mount-died"] += 1
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
    return {"seed": seed, "cases": cases, "tally": dict(tally), "fails": details,
            "log_lines": len(log.read_text(errors="replace").splitlines())}  # fmt: skip


def _wait_mounted(mnt: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.ismount(mnt):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"decant-mount exited {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError("the mount did not come up")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None, help="default: random")
    p.add_argument("--cases", type=int, default=300)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    work = Path(tempfile.mkdtemp(prefix="decant-fuzz-mount-"))
    try:
        doc = fuzz_mount(seed, args.cases, args.timeout, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"seed {doc['seed']}, {doc['cases']} cases, daemon log {doc['log_lines']} lines")
        for outcome, count in sorted(doc["tally"].items()):
            print(f"  {outcome:24} {count}")
        for line in doc["fails"]:
            print(f"  FAIL {line}")
    return 1 if doc["fails"] else 0


if __name__ == "__main__":
    sys.exit(main())
