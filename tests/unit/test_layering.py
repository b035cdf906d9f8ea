"""The layers of STYLE.md hold: the cores import neither pyfuse3 nor trio, the write side and the
backends no pyfuse3, and nothing imports the CLI — directly or through another vfs module.

Checked from the source (AST), module by module, over whatever files the core packages hold when
the test runs, so a module added later is covered without touching this file.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_PACKAGES = ("vfs/decant", "vfs/c4gh", "vfs/acqstore")
CORE_MODULES = ("vfs/cache.py", "vfs/errors.py", "vfs/integrity.py", "vfs/nodes.py",
                "vfs/names.py", "vfs/mount/tree.py", "vfs/mount/index.py")  # fmt: skip
FORBIDDEN = frozenset({"pyfuse3", "trio"})
NO_FUSE_PACKAGES = ("vfs/ingest", "vfs/backends")


def core_files() -> list[Path]:
    files = [p for pkg in CORE_PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return files + [ROOT / m for m in CORE_MODULES if (ROOT / m).exists()]


def no_fuse_files() -> list[Path]:
    return [p for pkg in NO_FUSE_PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Dotted names a file imports anywhere (functions included), relative ones made absolute,
    plus `from X import name` as X.name (it may be a submodule) and constant import_module()."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                found.add(str(arg.value))
    return {n for n in found if n}


def vfs_file(name: str) -> list[Path]:
    """Files Python runs for `import name` inside vfs: every parent package, then the module."""
    parts = name.split(".")
    out = []
    for k in range(1, len(parts) + 1):
        stem = ROOT.joinpath(*parts[:k])
        for candidate in (stem / "__init__.py", stem.with_suffix(".py")):
            if candidate.is_file():
                out.append(candidate)
    return out


def forbidden_chain(start: Path, forbidden: frozenset[str] = FORBIDDEN) -> list[str] | None:
    """A chain of imports from `start` to a forbidden module, following vfs modules, or None."""
    seen: set[Path] = set()
    stack: list[tuple[Path, list[str]]] = [(start, [module_name(start)])]
    while stack:
        path, chain = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in sorted(imports_of(path)):
            if name.split(".")[0] in forbidden or name in forbidden:
                return [*chain, name]
            if name.split(".")[0] == "vfs":
                stack.extend((f, [*chain, module_name(f)]) for f in vfs_file(name))
    return None


def test_the_cores_exist() -> None:
    names = {module_name(p) for p in core_files()}
    assert {"vfs.decant.reader", "vfs.decant.packer", "vfs.cache", "vfs.errors"} <= names


@pytest.mark.parametrize("path", core_files(), ids=lambda p: module_name(p))
def test_core_module_imports_no_fuse_or_trio(path: Path) -> None:
    assert forbidden_chain(path) is None, " → ".join(forbidden_chain(path) or [])


@pytest.mark.parametrize("path", no_fuse_files(), ids=lambda p: module_name(p))
def test_write_side_and_backends_import_no_fuse(path: Path) -> None:
    chain = forbidden_chain(path, frozenset({"pyfuse3"}))
    assert chain is None, " → ".join(chain or [])


@pytest.mark.parametrize(
    "path", sorted(p for p in (ROOT / "vfs").rglob("*.py") if p.name != "cli.py"),
    ids=lambda p: module_name(p),
)  # fmt: skip
def test_nothing_imports_the_cli(path: Path) -> None:
    assert not {n for n in imports_of(path) if n == "vfs.cli" or n.startswith("vfs.cli.")}


def test_the_checker_sees_forbidden_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The AST walk catches direct, function-local, relative-via-vfs and import_module forms."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    pkg = tmp_path / "vfs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fuse_ops.py").write_text("import pyfuse3\n")
    (pkg / "direct.py").write_text("def f():\n    import trio.lowlevel\n")
    (pkg / "relative.py").write_text("from . import fuse_ops\n")
    (pkg / "dynamic.py").write_text("import importlib\nimportlib.import_module('trio')\n")
    (pkg / "clean.py").write_text("import os\nfrom vfs import errors_missing\n")
    assert forbidden_chain(pkg / "direct.py") == ["vfs.direct", "trio.lowlevel"]
    assert forbidden_chain(pkg / "relative.py") == ["vfs.relative", "vfs.fuse_ops", "pyfuse3"]
    assert forbidden_chain(pkg / "dynamic.py") == ["vfs.dynamic", "trio"]
    assert forbidden_chain(pkg / "clean.py") is None


def test_importing_the_cores_loads_neither() -> None:
    """The same at run time, in a fresh interpreter importing every core module."""
    modules = sorted(module_name(p) for p in core_files())
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(set(sys.modules) & {set(FORBIDDEN)!r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
