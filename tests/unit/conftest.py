"""Fixtures shared by the unit tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.toolbox import load_tool


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = load_tool("make_acqstore_corpus").make_collection(
        tmp_path_factory.mktemp("corpus") / "c"
    )
    return Path(made["root"])


@pytest.fixture
def root(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "c"))


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """An empty SRC folder."""
    folder = tmp_path / "src"
    folder.mkdir()
    return folder


@pytest.fixture(autouse=True)
def _no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests describe archives written a moment before and check what the index keeps:
    with the racy window on (vfs.mount.racy.RACY_NS) nothing written in the last 2 s would be
    kept. The window is tested on its own (test_racy_descriptions.py), and the mount tests
    run with it."""
    from vfs.mount import racy

    monkeypatch.setattr(racy, "RACY_NS", 0)
