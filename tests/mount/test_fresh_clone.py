"""A fresh clone, a fresh venv, the README's own set-up command: nothing installed by hand counts.

This is how a new user starts, and how an undeclared dependency was once missed (`watchfiles`
was only installed by hand on the machine that ran CI). The clone's venv sees no package of this
machine's; after the README's first command (which also runs the demo), the clone's own tests of
live updates and declared imports must pass inside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The two set-up commands the README opens with."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "README has no ```sh block"
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(lines) == 2, lines
    return lines


def test_readme_opens_with_two_commands_and_ci_runs_the_second() -> None:
    setup, tests = readme_commands()
    assert "tools/demo.py" in setup and "venv" in setup
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in [ln.strip() for ln in ci], f"{tests!r} is not a line of .ci/run"


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout to clone")
@pytest.mark.skipif(os.geteuid() != 0, reason="the README's set-up command runs apt-get as root")
@pytest.mark.skipif(
    not os.environ.get("DECANT_SLOW_TESTS"),
    reason="a fresh venv installed from scratch (70-95 s; .ci/run does the same install on "
    "every run): DECANT_SLOW_TESTS=1 runs it",
)
def test_fresh_clone_installs_and_serves_changes(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    setup, _ = readme_commands()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if ".venv" not in p)  # fmt: skip
    env["DEBIAN_FRONTEND"] = "noninteractive"
    done = subprocess.run(["bash", "-c", setup], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "byte-exact" in done.stdout
    venv_python = clone / ".venv" / "bin" / "python"
    # The venv must not see this machine's site-packages.
    probe = subprocess.run([str(venv_python), "-c", "import sys; print(sys.prefix)"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(probe.stdout.strip()).resolve() == (clone / ".venv").resolve()
    tests = subprocess.run(
        [str(venv_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'pt'}", "tests/unit/test_declared_imports.py",
         "tests/mount/test_mount_namespace.py::test_archives_added_and_removed_while_mounted"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert re.search(r"\b4 passed\b", tests.stdout), tests.stdout[-500:]
    shutil.rmtree(clone / ".venv", ignore_errors=True)
