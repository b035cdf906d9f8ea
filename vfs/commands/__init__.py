"""The `decant` command: one subcommand module per format, each exposing `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from vfs.errors import DecantError

# Each module adds its own subcommands; a subcommand sets `func(args) -> int` as its default.
SUBCOMMAND_MODULES = ("vfs.commands.archive", "vfs.commands.c4gh", "vfs.commands.acqstore")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decant", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="decant: %(message)s",
    )
    try:
        return int(args.func(args))
    except DecantError as exc:
        print(f"decant: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
