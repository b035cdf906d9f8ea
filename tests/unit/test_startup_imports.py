"""What a daemon loads before it serves: start-up time is mostly imports (~0.3 s in all)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "zarr", "numcodecs", "tifffile", "jsonschema", "obstore")
# The plain LIST client of buckets (urllib, XML) and syslog's handler (socket, pickle): ~20 ms
# of a local mount's start together, for code it runs only on a bucket or when detached.
SPARED = ("vfs.stores.s3list", "urllib.request", "xml.etree.ElementTree", "logging.handlers")


def test_a_daemon_serving_packages_loads_no_array_or_bucket_library() -> None:
    """numpy alone is ~50 ms: loaded when a decant archive or AcqStore collection is first read,
    never on the way to a package's first bytes."""
    code = (
        "import sys, vfs.cli, vfs.mount.daemon, vfs.backends.c4gh\n"
        f"print(' '.join(m for m in {HEAVY + SPARED!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_command_looks_its_version_up_only_when_asked() -> None:
    """importlib.metadata and its search of the installed distributions: ~35 ms a start."""
    code = (
        "import sys\nfrom vfs.commands import build_parser\nfrom vfs.cli import build_parser as b\n"
        "build_parser(); b()\nprint('importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
