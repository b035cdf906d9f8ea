"""`decant acqstore validate ROOT [--json]`: every §10 violation, exit status 1 on errors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vfs.commands.status import (
    EXIT_STATUS,
    FAILED,
    OK,
    UsageError,
    add_command,
    quiet,
    require_readable,
    say,
)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "acqstore",
        help="AcqStore OME-Zarr collections",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="acqstore_command", required=True, metavar="ACTION")
    validate = add_command(
        actions,
        "validate",
        help="check a collection against the AcqStore v1 schema and §10 rules",
        description="Report every violation as 'error|warning: DOCUMENT POINTER: MESSAGE'.",
    )
    validate.add_argument("root", type=Path, metavar="ROOT", help="the folder holding acqstore/")
    validate.add_argument("--json", action="store_true", help="print one JSON report instead")
    validate.set_defaults(func=run_validate)


def collection_root(path: Path) -> Path:
    """Accept the collection folder or, as a convenience, its acqstore/collection.json."""
    if path.name == "collection.json" and path.parent.name == "acqstore":
        return path.parent.parent
    return path


def run_validate(args: argparse.Namespace) -> int:
    # Imported here: jsonschema costs ~0.1-0.3 s, which every other `decant` command paid at
    # start-up (a third of a 512 MiB `decant restore` on a quiet machine).
    from vfs.acqstore.validate import ENTRY_POINT, validate_collection

    root = collection_root(args.root)
    require_readable(root)
    if not (root / ENTRY_POINT).is_file():
        raise UsageError(f"{root}: not an AcqStore collection (no {ENTRY_POINT})")
    result = validate_collection(root)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for issue in result.issues:
            say(issue.line())
        if not quiet(args):
            verdict = "valid" if result.ok else "INVALID"
            say(
                f"{root / ENTRY_POINT}: {verdict} ({len(result.errors)} errors, "
                f"{len(result.warnings)} warnings)",
                sys.stderr,
            )
    return OK if result.ok else FAILED
