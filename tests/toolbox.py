"""The standalone scripts of tools/ as importable modules, for tests."""

from __future__ import annotations

import importlib.util
import os
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def proc_status(pid: int, field: str) -> int:
    """A byte figure of /proc/PID/status (VmHWM: the peak RSS; VmRSS: the RSS now), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


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
