"""Shared fixtures: the small TIFF corpus, each file packed once, and the standalone tools."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tifffile

from tests.toolbox import load_tool
from vfs.commands import main as decant_main
from vfs.decant.packer import PackOptions, PackResult, pack_file

# Tests run commands by name (decant, decant-mount, crypt4gh): those of the environment running
# pytest, which need not be activated (`.venv/bin/python -m pytest`).
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test asking for `corpus_name` runs once per corpus file (the generator's own list)."""
    if "corpus_name" in metafunc.fixturenames:
        metafunc.parametrize("corpus_name", sorted(load_tool("make_corpus").WRITERS))


@pytest.fixture(scope="session")
def make_corpus_tool() -> ModuleType:
    return load_tool("make_corpus")


@pytest.fixture(scope="session")
def recover_tool() -> ModuleType:
    return load_tool("recover")


@pytest.fixture(scope="session")
def corpus(
    tmp_path_factory: pytest.TempPathFactory, make_corpus_tool: ModuleType
) -> dict[str, Path]:
    """File name → path of every file of tools/make_corpus.py's small corpus (read-only)."""
    paths = make_corpus_tool.generate(tmp_path_factory.mktemp("corpus"), "small")
    return {p.name: p for p in paths}


@pytest.fixture(scope="session")
def packed_corpus(
    tmp_path_factory: pytest.TempPathFactory, corpus: dict[str, Path]
) -> dict[str, PackResult]:
    """File name → the PackResult of packing it (mode auto) into NAME.zarr.zip (read-only)."""
    out = tmp_path_factory.mktemp("archives")
    return {
        name: pack_file(path, out / f"{name}.zarr.zip", PackOptions())
        for name, path in corpus.items()
    }


def _tag(page: Any, name: str, default: Any) -> Any:
    found = page.tags.get(name)
    return default if found is None else found.value


def mode_from_tags(path: Path) -> str:
    """The mode a file must get, from its raw TIFF tags alone (not from vfs's own scan).

    Mode D exactly when tifffile reads a TIFF whose pages are all uncompressed, predictor 1 and
    of one geometry and sample format; everything else (compressed, not a TIFF, empty, mixed
    pages) is mode V.
    """
    try:
        tif = tifffile.TiffFile(path)
    except tifffile.TiffFileError:
        return "verbatim"
    with tif:
        kinds = set()
        for page in tif.pages:
            if int(_tag(page, "Compression", 1)) != 1 or int(_tag(page, "Predictor", 1)) != 1:
                return "verbatim"
            kinds.add(
                tuple(
                    str(_tag(page, name, 1))
                    for name in (
                        "ImageWidth",
                        "ImageLength",
                        "SamplesPerPixel",
                        "BitsPerSample",
                        "SampleFormat",
                    )
                )
            )
    return "byte-exact" if len(kinds) == 1 else "verbatim"


@pytest.fixture(scope="session")
def expected_mode() -> Callable[[Path], str]:
    """`expected_mode(path)`: "byte-exact" or "verbatim", decided from the file's tags."""
    return mode_from_tags


CliResult = tuple[int, str, str]


@pytest.fixture
def decant_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `decant ARGS…` in-process: (exit status, stdout, stderr)."""

    def run(*args: object) -> CliResult:
        capsys.readouterr()
        status = decant_main([str(a) for a in args])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run
