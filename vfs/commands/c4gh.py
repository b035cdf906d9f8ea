"""`decant c4gh …` subcommands (filled in with the c4gh backend)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    del sub  # no subcommands yet


__all__ = ["argparse", "register"]
