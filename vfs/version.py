"""`--version` for both commands, looked up only when asked: importlib.metadata and its search
of the installed distributions cost ~35 ms of a command's ~0.25 s start here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import vfs

DISTRIBUTION = "decant-mount"


def installed_version() -> str:
    """The installed distribution's version; a source checkout falls back to vfs.__version__."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return f"{getattr(vfs, '__version__', 'unknown')} (not installed)"


class VersionAction(argparse.Action):
    """argparse's "version" action with the version looked up when the option is given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS) -> None:  # fmt: skip
        super().__init__(option_strings, dest, nargs=0, default=default,
                         help="show program's version number and exit")  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        sys.stdout.write(f"{parser.prog} {installed_version()}\n")
        parser.exit()
