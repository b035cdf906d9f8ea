"""`decant acqstore …` subcommands (filled in with the acqstore backend)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    del sub  # no subcommands yet


__all__ = ["argparse", "register"]
