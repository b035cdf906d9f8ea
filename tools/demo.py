#!/usr/bin/env python3
"""The main job on built-in sample data: pack sample TIFFs, mount the archives, read them back.

    python3 tools/demo.py [WORKDIR]

Generates the sample corpus (tools/make_corpus.py), packs every file with `decant pack`, mounts
the archives with `decant-mount`, and checks each file's sha256 through the mount against the
original. Exits non-zero if any file differs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="decant-demo-"))
    originals, archives, mnt = work / "originals", work / "archive", work / "mnt"
    for folder in (archives, mnt):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    spec = importlib.util.spec_from_file_location("make_corpus", HERE / "make_corpus.py")
    assert spec and spec.loader
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    files = corpus.generate(originals, "small")
    print(f"1. generated {len(files)} sample files in {originals}")
    subprocess.run(["decant", "pack", *map(str, files), "-o", str(archives)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    print(f"2. packed them into {archives}")
    subprocess.run(["decant-mount", str(archives), str(mnt), "--index-dir", str(work / "index"),
                    "--log-file", str(work / "decant-mount.log")], check=True)  # fmt: skip
    print(f"3. mounted {archives} on {mnt}\n")
    bad = 0
    try:
        print(f"   {'file':42} {'size':>9} {'archive/original':>17}  sha256 through the mount")
        for path in files:
            archive = archives / f"{path.name}.zarr.zip"
            ratio = archive.stat().st_size / max(path.stat().st_size, 1)
            ok = sha256(mnt / path.name) == sha256(path)
            bad += not ok
            verdict = "byte-exact" if ok else "DIFFERENT"
            print(f"   {path.name:42} {path.stat().st_size:>9} {ratio:>17.3f}  {verdict}")
    finally:
        subprocess.run(["decant-mount", "-u", str(mnt)], check=False)
    print(f"\n{len(files) - bad} of {len(files)} files read back byte-exact through the mount")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
