"""The standalone scripts of tools/ as importable modules, for tests."""

from __future__ import annotations

import errno
import http.server
import importlib.util
import itertools
import json
import os
import struct
import subprocess
import sys
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def proc_status(pid: int, field: str) -> int:
    """A byte figure of /proc/PID/status (VmHWM: the peak RSS; VmRSS: the RSS now), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def in_threads(work: Callable[[int], object], count: int) -> None:
    """Run `work(0)` … `work(count - 1)` on as many threads at once, and wait for them all."""
    workers = [threading.Thread(target=work, args=(k,)) for k in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def json_in_child(script: str, *args: str, timeout: float = 120) -> Any:
    """What `script`, run by a fresh interpreter from the repository's root with `args`, prints
    as JSON: for tests of what a process imports, which another test's imports would hide."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=timeout, cwd=TOOLS.parent, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def load_tool(name: str) -> ModuleType:
    """A script from tools/ as a module, under a private name so it never shadows anything."""
    module_name = f"_decant_tool_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, TOOLS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and typing resolve through sys.modules
        spec.loader.exec_module(module)
    return module


def make_chain(top: Path, name: str, levels: int) -> Path:
    """`top/name/name/…` `levels` deep, made level by level (Path.mkdir recurses per level)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return top.joinpath(*[name] * levels)


def remove_chain(top: Path, name: str) -> None:
    """Remove a chain of folders `top/name/name/…` (and the files in its last folder) without
    recursion: shutil.rmtree, and pytest's own clean-up, recurse once per level."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while True:
            try:
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                fds.append(os.open(name, flags, dir_fd=fds[-1]))
            except (FileNotFoundError, NotADirectoryError):
                break
        for leaf in os.listdir(fds[-1]):
            os.unlink(leaf, dir_fd=fds[-1])
        os.close(fds.pop())
        while fds:
            fd = fds.pop()
            try:
                os.rmdir(name, dir_fd=fd)
            finally:
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def traced_peak(call: Callable[[], T]) -> tuple[T, int]:
    """`call()` and the peak of the memory Python allocated while it ran (tracemalloc)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


_PEAK_CHILD = r"""
import gc, json, sys
sys.path.insert(0, {root!r})
{setup}
gc.collect()
def _vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the kernel forgets the peak so far (VmHWM = VmRSS from here)
    _traced = False
    _base = _vm("VmRSS:")
except OSError:  # no clear_refs here: Python's own allocations, as traced_peak counts them
    import tracemalloc
    tracemalloc.start()
    _traced = True
_result = {call}
_peak = tracemalloc.get_traced_memory()[1] if _traced else _vm("VmHWM:") - _base
print(json.dumps({{"peak": _peak, "result": _result}}, default=repr))
"""


def peak_in_child(setup: str, call: str) -> tuple[Any, int]:
    """In a fresh interpreter: run `setup` (statements: imports, the input built), then
    evaluate `call`; its result (JSON, else repr) and how far the process's resident set rose
    above where it stood before `call` (VmHWM after resetting it through clear_refs). What the
    bounds are about is the daemon's memory, and tracemalloc made the largest parse 5-6x
    slower (one test took 50-60 s of the suite with it, ~11 s so)."""
    code = _PEAK_CHILD.format(root=str(Path(__file__).resolve().parents[1]), setup=setup,
                              call=call)  # fmt: skip
    with _SPAWN:
        child = _spawn([sys.executable, "-c", code])
    with child:
        try:
            stdout, stderr = child.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
    assert child.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    return out["result"], int(out["peak"])


# Children are started from two threads at once (test_manifest_memory). Once in a CI run the
# second of two such starts failed in the parent with "OSError: [Errno 14] Bad address" naming
# the interpreter: CPython spawns through vfork, and the two starts shared the parent's memory
# while they ran. Starting one child at a time costs milliseconds; a start that still fails with
# EFAULT started no child, so it is tried again once.
_SPAWN = threading.Lock()


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    for attempt in (1, 2):
        try:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip
        except OSError as e:
            if e.errno != errno.EFAULT or attempt == 2:
                raise
    raise AssertionError("unreachable")


def zip_of_many(
    path: Path, count: int, claim: int | None = None, first: dict[str, bytes] | None = None
) -> Path:
    """A valid stored ZIP64 zip of `count` one-byte entries named "a/<n>", written directly (zipfile
    takes ~10 µs an entry): what a user can drop in SRC for a few dozen bytes an entry. Its end
    records claim `claim` entries (default: the truth). `first`: entries stored before them
    (a decant archive's, so that the zip is still that archive)."""
    local = struct.Struct("<4sHHHHHIIIHH")
    central = struct.Struct("<4sHHHHHHIIIHHHHHII")
    records, pos = [], 0
    first = first or {}
    entries = itertools.chain(first.items(), ((f"a/{n}", b"x") for n in range(count)))
    with open(path, "wb") as out:
        for text, data in entries:
            name, crc, size = text.encode(), zlib.crc32(data), len(data)
            out.write(local.pack(b"PK\x03\x04", 20, 0, 0, 0, 0, crc, size, size, len(name), 0))
            out.write(name + data)
            fields = (20, 20, 0, 0, 0, 0, crc, size, size, len(name), 0, 0, 0, 0, 0, pos)
            records.append(central.pack(b"PK\x01\x02", *fields) + name)
            pos += local.size + len(name) + size
        count += len(first)
        directory = b"".join(records)
        claimed = count if claim is None else claim
        out.write(directory)
        out.write(struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, claimed, claimed,
                              len(directory), pos))  # fmt: skip
        out.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, pos + len(directory), 1))
        small = min(claimed, 0xFFFF)
        out.write(
            struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, small, small, len(directory), pos, 0)
        )
    return path


ACL_ANY = 0xFFFFFFFF  # the id field of an ACL entry that names nobody (owner, group, mask, other)


def acl(*entries: tuple[int, int, int]) -> bytes:
    """A system.posix_acl_access (or _default) value: version 2, then (tag, perm, id) entries
    in the order the kernel keeps them. Written by hand: `setfacl` need not be installed."""
    out = (2).to_bytes(4, "little")
    for tag, perm, ident in sorted(entries):
        out += tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + ident.to_bytes(4, "little")
    return out


def tiff_of_shape(width: int, height: int, samples: int) -> bytes:
    """A classic 8-bit TIFF of one strip (100 bytes) whose header says `width` x `height` x
    `samples`: tifffile writes no empty axis, so the IFD is built by hand."""
    tags = [(256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 1), (262, 3, 1)]
    tags += [(273, 4, 8), (277, 3, samples), (278, 4, height), (279, 4, 100), (284, 3, 1)]
    out = b"II*\0" + struct.pack("<I", 108) + bytes(range(100)) + struct.pack("<H", len(tags))
    for tag, kind, value in tags:
        packed = struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, 1) + packed
    return out + b"\0\0\0\0"


@contextmanager
def loopback_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on a free loopback port answering with `handler`; yields its URL.
    Stopped, and its port closed, on exit."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
