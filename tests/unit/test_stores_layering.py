"""The cores never know where bytes come from: they reach the byte-source interface and the local
sources, never the object-store client (statically, through any chain of vfs imports, and at run
time in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_layering import ROOT, core_files, forbidden_chain, module_name

OBJECT_STORE = frozenset({"obstore", "vfs.stores.s3", "vfs.stores.locate"})


@pytest.mark.parametrize("path", core_files(), ids=lambda p: module_name(p))
def test_core_module_never_reaches_the_object_store(path: Path) -> None:
    chain = forbidden_chain(path, OBJECT_STORE)
    assert chain is None, " → ".join(chain or [])


def test_the_stores_top_level_is_standard_library_only() -> None:
    for name in ("__init__.py", "base.py", "local.py"):
        chain = forbidden_chain(ROOT / "vfs" / "stores" / name, OBJECT_STORE)
        assert chain is None, " → ".join(chain or [])


def test_the_check_sees_the_s3_module() -> None:
    assert forbidden_chain(ROOT / "vfs" / "stores" / "locate.py", OBJECT_STORE) is not None


def test_importing_the_cores_loads_no_object_store_client() -> None:
    modules = sorted(module_name(p) for p in core_files())
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'obstore'"
        " or m == 'vfs.stores.s3'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
