"""Every module imported under vfs/, tools/ and tests/ is standard library, our own, or declared.

A package installed by hand on one machine hides an undeclared dependency there and fails on a
fresh one (that is how `watchfiles` went missing once). This reads pyproject.toml and maps each
import to the distribution that provides it with `importlib.metadata.packages_distributions()`.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("vfs", "tools", "tests")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return {_norm(re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0]) for r in reqs}


def local_names() -> set[str]:
    """Our own packages and the scripts tools/ and tests/ load by file name."""
    names = {"vfs", "tools", "tests", "conftest"}
    for folder in ("tools", "tests"):
        names.update(p.stem for p in (ROOT / folder).rglob("*.py"))
    return names


def top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def undeclared(root: Path = ROOT) -> dict[str, str]:
    wanted = declared()
    owners = {k: {_norm(d) for d in v} for k, v in md.packages_distributions().items()}
    ours = local_names()
    missing: dict[str, str] = {}
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            for top in top_level_imports(path):
                if top in sys.stdlib_module_names or top in ours or top == "__future__":
                    continue
                if not owners.get(top, {_norm(top)}) & wanted:
                    missing.setdefault(top, str(path.relative_to(root)))
    return missing


def test_every_import_is_declared() -> None:
    missing = undeclared()
    assert not missing, "undeclared imports (add to pyproject.toml): " + ", ".join(
        f"{name} (first in {where})" for name, where in sorted(missing.items())
    )


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    (tmp_path / "vfs").mkdir()
    code = "import os\nimport numpy\nfrom surely_not_a_dist import y\n"
    (tmp_path / "vfs" / "x.py").write_text(code)
    missing = undeclared(tmp_path)
    assert set(missing) == {"surely_not_a_dist"}, missing
