#!/usr/bin/env python3
"""Hostile and fuzzed decant archives: builders the tests share, and a fuzz runner with tallies.

    python tools/fuzz.py [--seed N] [--cases N] [--timeout S] [--json] [--case I]

Packs a few small files (every mode: byte-exact striped/tiled/big-endian, verbatim, consolidated
and nested series), then for each case mutates one archive — a manifest or .zarray field, chunk
bits, a blosc header, a dropped or swapped entry, zip directory bytes, truncation — and reads it
through vfs.backends.decant (describe, open, a partial, a full and random reads; no mount),
comparing with the original bytes. Outcomes:

  ok              every read equal to the original
  renamed         a series member presented under a mutated name (its bytes are not compared)
  error           a DecantError or OSError (by class, and by mutation kind)
  wrong-bytes     full-length reads that differ (a flipped bit in compressed data can decode to
                  other bytes: the sha256 a whole-file read checks catches those; counted by kind)
  FAIL kinds      short-read, missing-served (a dropped chunk read as fill), unexpected (any other
                  exception), memory (MemoryError), timeout — the tests require none
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MANIFEST = ".decant/manifest.json"
Entries = list[tuple[str, bytes]]
FAILURES = ("short-read", "missing-served", "unexpected", "memory", "timeout", "wrong-size")


# ---------------------------------------------------------------- archive editing helpers


def zip_entries(path: Path) -> Entries:
    with zipfile.ZipFile(path) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def build_zip(entries: Entries) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in entries:
            zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def rewrite_zip(src: Path, dest: Path, edit: Callable[[str, bytes], bytes | None]) -> Path:
    """Copy a zip entry by entry; `edit(name, data)` returns new data, or None to drop it."""
    kept = []
    for name, data in zip_entries(src):
        new = edit(name, data)
        if new is not None:
            kept.append((name, new))
    dest.write_bytes(build_zip(kept))
    return dest


def json_edit(key: str, change: Callable[[dict[str, Any]], None]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if name != key:
            return data
        doc = json.loads(data)
        change(doc)
        return json.dumps(doc).encode()

    return edit


def chain(*edits: Callable[[str, bytes], bytes | None]) -> Callable[[str, bytes], bytes | None]:
    def edit(name: str, data: bytes) -> bytes | None:
        out: bytes | None = data
        for e in edits:
            if out is None:
                return None
            out = e(name, out)
        return out

    return edit


_BOMBS: dict[int, bytes] = {}


def blosc_bomb(nbytes: int) -> bytes:
    """A valid blosc chunk of `nbytes` zeros (1 GiB compresses to 135 KB at clevel 5)."""
    if nbytes not in _BOMBS:
        import numcodecs
        import numpy as np

        zeros = np.zeros(nbytes, np.uint8)  # calloc: untouched pages cost no memory
        _BOMBS[nbytes] = bytes(numcodecs.Blosc("zstd", 5, 0).encode(zeros))
    return _BOMBS[nbytes]


def headline_cases(good_d: Path, good_v: Path, out: Path) -> dict[str, Path]:
    """The hostile archives of the hardening brief, each made from a good archive by one edit."""
    out.mkdir(parents=True, exist_ok=True)
    gib = 1 << 30

    def husk_chunks(n: int) -> Callable[[str, bytes], bytes]:
        return json_edit("husk/.zarray", lambda d: d.__setitem__("chunks", [n]))

    def husk_data(data: bytes) -> Callable[[str, bytes], bytes]:
        return lambda n, d: data if n == "husk/0" else d

    def pixel_chunks(doc: dict[str, Any]) -> None:
        doc["chunks"] = [gib // (doc["chunks"][-1] * doc["chunks"][-2] * 2), *doc["chunks"][1:]]

    def size(value: int) -> Callable[[str, bytes], bytes]:
        return json_edit(MANIFEST, lambda d: d.__setitem__("original_size", value))

    def utf16_manifest(name: str, data: bytes) -> bytes:
        """JSON is UTF-8; json.loads also read UTF-16, the manifest reader does not."""
        return data.decode().encode("utf-16") if name == MANIFEST else data

    def offset_2e63(doc: dict[str, Any]) -> None:
        """No size, offset or count of the format reaches 2^63 (pages are 64-bit columns)."""
        page = doc["pages"][0]
        page["dataoffsets"] = [1 << 63, *page["dataoffsets"][1:]]

    first_chunk = next(n for n, _ in zip_entries(good_d) if n.startswith("0/") and "/." not in n)
    cases: dict[str, tuple[Path, Callable[[str, bytes], bytes | None]]] = {
        "husk-chunk-2gib": (good_d, husk_chunks(2 * gib)),
        "husk-bomb-1gib": (good_d, chain(husk_chunks(gib), husk_data(blosc_bomb(gib)))),
        "husk-bomb-in-small-chunk": (good_d, husk_data(blosc_bomb(gib))),
        "pixel-chunk-1gib": (good_d, json_edit("0/.zarray", pixel_chunks)),
        "pixel-chunk-missing": (good_d, lambda n, d: None if n == first_chunk else d),
        "verbatim-size-2e62": (good_v, size(1 << 62)),
        "verbatim-size-0-with-data": (good_v, size(0)),
        "verbatim-chunk-missing": (good_v, lambda n, d: None if n == "original/0" else d),
        "manifest-utf16": (good_d, utf16_manifest),
        "page-offset-2e63": (good_d, json_edit(MANIFEST, offset_2e63)),
    }
    return {
        name: rewrite_zip(src, out / f"{name}.tif.zarr.zip", edit)
        for name, (src, edit) in cases.items()
    }


# ---------------------------------------------------------------- the sample archives


@dataclass
class Sample:
    """A packed archive and the original bytes of every file it presents (by relpath)."""

    name: str
    path: Path
    originals: dict[str, bytes]

    @property
    def is_zip(self) -> bool:
        return self.path.is_file()


SAMPLE_FILES = (
    "imagej_hyperstack_tzc_u16.tif",  # D, striped, 12 pages, husk between pixels
    "tiled_planar_rgb_u16_edge.tif",  # D, tiled, planar, right-edge tiles
    "bigendian_tiled_f32_edge.tif",  # D, big-endian float
    "zlib_u16.tif",  # V
    "empty.tif",  # V, 0 bytes
)


def make_samples(work: Path) -> list[Sample]:
    from tests.toolbox import load_tool
    from vfs.decant.packer import PackOptions, pack_file
    from vfs.decant.series import pack_series

    corpus = load_tool("make_corpus")
    src = work / "originals"
    paths = {p.name: p for p in corpus.generate(src, "small")}
    samples = []
    archives = work / "archives"
    archives.mkdir()
    for name in SAMPLE_FILES:
        out = pack_file(paths[name], archives / f"{name}.zarr.zip", PackOptions()).archive
        samples.append(Sample(name, out, {name: paths[name].read_bytes()}))
    blob = work / "blob.bin"  # V over three chunks, the last one partial
    blob.write_bytes(bytes(range(256)) * (10 * 1024 + 77))
    out = pack_file(blob, archives / "blob.bin.zarr.zip", PackOptions()).archive
    samples.append(Sample("blob.bin", out, {"blob.bin": blob.read_bytes()}))
    for kind, members in (
        ("consolidated", ["zstack_u16.tif", "zstack_u16.tif"]),
        ("nested", ["zstack_u16.tif", "zlib_u16.tif"]),
    ):
        folder = work / kind
        folder.mkdir()
        for i, member in enumerate(members):
            shutil.copy(paths[member], folder / f"{i}-{member}")
        suffix = ".zarr.zip" if kind == "consolidated" else ".zarr"
        out = pack_series(folder, archives / f"{kind}{suffix}", PackOptions()).archive
        originals = {p.name: p.read_bytes() for p in folder.iterdir()}
        samples.append(Sample(kind, out, originals))
    return samples


# ---------------------------------------------------------------- mutations

INTERESTING_INTS = [0, 1, -1, 2, 255, 65536, 2**31, 2**31 - 1, 2**32, 2**40 + 7, 2**62, 2**63]
INTERESTING_STRS = ["", "..", "../x", "a/b", "pickle", "|O", "(1000000000,)u1", ">u2", "<f8",
                    "/", "verbatim", "byte-exact", "series", "husk", "0", "original",
                    "x" * 5000]  # fmt: skip
DEEP = "[" * 100_000 + "]" * 100_000
BIGINT = "9" * 5000


def json_positions(doc: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value in a JSON document, walked without recursion."""
    out: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            out.append((node, key))
            if isinstance(value, dict | list) and len(out) < 100_000:
                stack.append(value)
    return out


def mutate_json(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw, "not json"
    positions = json_positions(doc)
    if not positions:
        return raw, "empty"
    node, key = rng.choice(positions)
    old = node[key]
    op = rng.choice(["int", "int", "near", "type", "delete", "dup", "str", "deep", "bigint"])
    placeholder = "\x00PLACEHOLDER\x00"
    if op == "int":
        node[key] = rng.choice(INTERESTING_INTS)
    elif op == "near" and isinstance(old, int) and not isinstance(old, bool):
        node[key] = old + rng.choice([-1, 1, old, -old - 1, 4096])
    elif op == "type":
        node[key] = rng.choice(["7", None, [], {}, True, 1.5, [old]])
    elif op == "delete":
        del node[key]
    elif op == "dup" and isinstance(node, list):
        node.insert(key, old)
    elif op == "str":
        node[key] = rng.choice(INTERESTING_STRS)
    elif op in ("deep", "bigint"):
        node[key] = placeholder
    else:
        node[key] = rng.choice(INTERESTING_INTS)
    text = json.dumps(doc)
    if op in ("deep", "bigint"):
        text = text.replace(json.dumps(placeholder), DEEP if op == "deep" else BIGINT)
    path = f"{key!r}" if not isinstance(node, list) else f"[{key}]"
    return text.encode(), f"{op} {path}"


def is_chunk(name: str) -> bool:
    return "/" in name and not name.rsplit("/", 1)[1].startswith(".")


def mutate_zip(data: bytes, rng: random.Random) -> tuple[bytes, str, str, str | None]:
    """(new zip bytes, kind, description, dropped chunk key or None)."""
    entries = [(i.filename, z) for i, z in _read_entries(data)]
    chunks = [i for i, (n, _) in enumerate(entries) if is_chunk(n)]
    kinds = ["manifest", "zarray", "chunk-bits", "chunk-header", "drop-chunk", "swap-chunks",
             "zip-directory", "truncate", "zip-bytes", "drop-metadata"]  # fmt: skip
    kind = rng.choice(kinds)
    if kind in ("manifest", "zarray", "drop-metadata"):
        metas = [i for i, (n, _) in enumerate(entries) if n.endswith((".zarray", "manifest.json"))]
        targets = [i for i in metas if (entries[i][0] == MANIFEST) == (kind == "manifest")]
        i = rng.choice(targets if kind != "drop-metadata" else metas)
        name = entries[i][0]
        if kind == "drop-metadata":
            del entries[i]
            return build_zip(entries), kind, f"drop {name}", None
        new, what = mutate_json(entries[i][1], rng)
        entries[i] = (name, new)
        return build_zip(entries), kind, f"{name}: {what}", None
    if kind in ("chunk-bits", "chunk-header", "drop-chunk", "swap-chunks") and chunks:
        i = rng.choice(chunks)
        name, payload = entries[i]
        if kind == "drop-chunk":
            del entries[i]
            return build_zip(entries), kind, f"drop {name}", name
        if kind == "swap-chunks":
            j = rng.choice(chunks)
            other = entries[j][0]
            entries[i], entries[j] = (name, entries[j][1]), (other, payload)
            return build_zip(entries), kind, f"swap {name} {other}", None
        entries[i] = (name, _flip_chunk(payload, rng, header=kind == "chunk-header"))
        return build_zip(entries), kind, f"{kind} {name}", None
    buf = bytearray(data)
    if kind == "truncate":
        cut = rng.randrange(len(buf))
        return bytes(buf[:cut]), kind, f"truncate at {cut}/{len(buf)}", None
    if kind == "zip-directory":
        start = max(0, len(buf) - 22 - 64 * len(entries))
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(start, len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf), kind, "flip central directory bits", None
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    return bytes(buf), "zip-bytes", "flip bits anywhere", None


def _read_entries(data: bytes) -> Iterator[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            yield info, zf.read(info)


def _flip_chunk(payload: bytes, rng: random.Random, header: bool) -> bytes:
    buf = bytearray(payload)
    if not buf:
        return b"\x00"
    if header and len(buf) >= 16:
        field_at = rng.choice([2, 3, 4, 8, 12])
        value = rng.choice([0, 1, len(buf) - 1, len(buf) + 1, 2**31, 2**32 - 1, 1 << 30])
        if field_at < 4:
            buf[field_at] = value & 0xFF
        else:
            struct.pack_into("<I", buf, field_at, value & 0xFFFFFFFF)
        return bytes(buf)
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    return bytes(buf)


def mutate(sample: Sample, dest: Path, rng: random.Random) -> tuple[str, str, str | None]:
    """Write a mutated copy of `sample` to `dest`: (kind, description, dropped chunk key)."""
    if sample.is_zip:
        data, kind, what, dropped = mutate_zip(sample.path.read_bytes(), rng)
        dest.write_bytes(data)
        return kind, what, dropped
    shutil.copytree(sample.path, dest)
    bundles = sorted(p for p in dest.iterdir() if p.name.endswith(".zarr.zip"))
    kind = rng.choice(["manifest", "bundle", "bundle", "drop-bundle"])
    if kind == "manifest":
        new, what = mutate_json((dest / MANIFEST).read_bytes(), rng)
        (dest / MANIFEST).write_bytes(new)
        return "series-manifest", what, None
    target = rng.choice(bundles)
    if kind == "drop-bundle":
        target.unlink()
        return kind, f"drop {target.name}", None
    data, sub_kind, what, dropped = mutate_zip(target.read_bytes(), rng)
    target.write_bytes(data)
    return f"bundle-{sub_kind}", f"{target.name} {what}", dropped


# ---------------------------------------------------------------- reading a case


class CaseTimeout(Exception):
    """The per-case time limit passed."""


@dataclass
class Outcome:
    kind: str  # mutation kind
    result: str  # ok | error | wrong-bytes | one of FAILURES
    detail: str = ""


def _files(root: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    stack = [(prefix, root)]
    while stack:
        path, entry = stack.pop()
        if not entry.is_dir:
            yield path, entry
            continue
        for name, child in entry.children.items():
            stack.append((f"{path}/{name}".lstrip("/"), child))


def read_all(path: Path, sample: Sample, rng: random.Random) -> tuple[str, str]:
    """Describe, open and read every presented file: ("ok" | "wrong-bytes" | failure, detail)."""
    from vfs.backends.decant import DecantBackend
    from vfs.cache import PageCache

    backend = DecantBackend(PageCache(64 << 20))
    desc = backend.describe(path)
    series = desc.root.is_dir
    wrong = ""
    for member, entry in _files(desc.root):
        want = sample.originals.get(member) if series else next(iter(sample.originals.values()))
        if want is None:  # a mutated relpath: the same bytes under another name
            return "renamed", f"unknown member {member!r}"
        if entry.size != len(want):
            return "wrong-size", f"{member or desc.name}: listed {entry.size}, is {len(want)}"
        handle = backend.open(path, member, entry)
        try:
            wrong = wrong or _read_checks(handle, want, rng)
        finally:
            handle.close()
    return ("wrong-bytes", wrong) if wrong else ("ok", "")


def _read_checks(handle: Any, want: bytes, rng: random.Random) -> str:
    size = len(want)
    spans = [(0, 4096)]
    spans += [(off, 256 * 1024) for off in range(0, size, 256 * 1024)]
    spans += [(rng.randrange(size + 10) if size else 0, rng.randrange(1, 70_000)) for _ in range(8)]
    wrong = ""
    for off, n in spans:
        got = bytes(handle.read(off, n))
        expect = want[off : off + n]
        if len(got) != len(expect):
            raise ShortRead(f"read({off}, {n}) gave {len(got)} bytes, expected {len(expect)}")
        if got != expect and not wrong:
            wrong = f"read({off}, {n}) differs"
    return wrong


class ShortRead(Exception):
    """A read returned fewer bytes than the file holds there, without an error."""


def run_case(sample: Sample, index: int, seed: int, work: Path, timeout: float) -> Outcome:
    from vfs.errors import DecantError

    rng = random.Random(seed * 1_000_003 + index)
    dest = work / f"case-{index}{'.zarr.zip' if sample.is_zip else '.zarr'}"
    kind, what, dropped = mutate(sample, dest, rng)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        result, detail = read_all(dest, sample, rng)
    except CaseTimeout:
        result, detail = "timeout", f"more than {timeout} s"
    except ShortRead as exc:
        result, detail = "short-read", str(exc)
    except MemoryError:
        result, detail = "memory", "MemoryError"
    except (DecantError, OSError) as exc:
        result, detail = f"error:{type(exc).__name__}", str(exc)[:200]
    except Exception as exc:
        tb = traceback.format_exception(exc)[-3:]
        result, detail = "unexpected", f"{type(exc).__name__}: {exc!s:.200} {''.join(tb)[-600:]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if dest.is_dir():
            shutil.rmtree(dest)
        else:
            dest.unlink(missing_ok=True)
    if result == "wrong-bytes" and dropped:
        result = "missing-served"
    return Outcome(kind, result, f"{sample.name} case {index}: {what}: {detail}")


@dataclass
class Tally:
    cases: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    results: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    errors_by_kind: Counter[str] = field(default_factory=Counter)
    wrong_by_kind: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    max_rss_mib: int = 0

    def add(self, out: Outcome) -> None:
        self.cases += 1
        self.by_kind[out.kind] += 1
        result = "error" if out.result.startswith("error:") else out.result
        self.results[result] += 1
        if result == "error":
            self.errors[out.result.removeprefix("error:")] += 1
            self.errors_by_kind[out.kind] += 1
        elif result == "wrong-bytes":
            self.wrong_by_kind[out.kind] += 1
        elif result in (*FAILURES, "unexpected"):
            self.failures.append(f"{out.result}: {out.detail}")

    def to_json(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Counter) else v) for k, v in vars(self).items()}


def fuzz(seed: int, cases: int, timeout: float, only: int | None = None) -> Tally:
    tally = Tally()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="decant-fuzz-") as tmp:
        work = Path(tmp)
        samples = make_samples(work)
        _reset_peak_rss()  # packing the samples (worker threads, zarr) is not what is measured
        for index in [only] if only is not None else range(cases):
            sample = samples[index % len(samples)]
            tally.add(run_case(sample, index, seed, work, timeout))
    tally.seconds = round(time.monotonic() - start, 1)
    tally.max_rss_mib = _peak_rss_mib()
    return tally


def _reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux)


def _peak_rss_mib() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--case", type=int, default=None, help="run only this case index")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    ap.add_argument("--max-memory", type=int, default=4096, help="address-space limit, MiB")
    ap.add_argument("--json", action="store_true", help="print the tallies as JSON")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    limit = args.max_memory << 20  # a runaway allocation fails fast instead of swapping
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tally = fuzz(seed, args.cases, args.timeout, args.case)
    doc = {"seed": seed, **tally.to_json()}
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        _print_report(doc)
    return 1 if tally.failures else 0


def _print_report(doc: dict[str, Any]) -> None:
    print(f"seed {doc['seed']}: {doc['cases']} cases in {doc['seconds']} s, "
          f"max RSS {doc['max_rss_mib']} MiB")  # fmt: skip
    print("results:        ", _fmt(doc["results"]))
    print("cases by kind:  ", _fmt(doc["by_kind"]))
    print("errors by class:", _fmt(doc["errors"]))
    print("errors by kind: ", _fmt(doc["errors_by_kind"]))
    print("wrong bytes without error, by kind (sha256 catches on a whole read):",
          _fmt(doc["wrong_by_kind"]) or "none")  # fmt: skip
    for line in doc["failures"][:30]:
        print("FAIL", line)


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    sys.exit(main())
