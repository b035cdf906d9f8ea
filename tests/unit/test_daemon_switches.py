"""The daemon's benchmark switch for chunk digests (vfs/mount/daemon.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfs.cache import PageCache
from vfs.decant.store import ZipArchiveStore
from vfs.mount import daemon
from vfs.mount.config import MountConfig


def _decant_backend(tmp_path: Path) -> object:
    src = tmp_path / "src"
    src.mkdir(parents=True)
    config = MountConfig(src=src, mnt=tmp_path / "mnt", index_dir=tmp_path / "index",
                         read_only=True, watch=False)  # fmt: skip
    tree = daemon.build_tree(config, PageCache(1 << 20))
    return next(b for b in tree.backends if b.name == "decant")


def test_chunk_digests_are_checked_unless_switched_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ZipArchiveStore, "verify_crc", True)
    monkeypatch.delenv(daemon.NO_CHUNK_DIGESTS, raising=False)
    assert _decant_backend(tmp_path / "a").digests is not None  # type: ignore[attr-defined]

    monkeypatch.setenv(daemon.NO_CHUNK_DIGESTS, "1")
    assert _decant_backend(tmp_path / "b").digests is None  # type: ignore[attr-defined]
    assert ZipArchiveStore.verify_crc  # the CRC-32 still checks whole entries

    monkeypatch.setenv(daemon.NO_CHUNK_DIGESTS, "crc-too")
    assert _decant_backend(tmp_path / "c").digests is None  # type: ignore[attr-defined]
    assert not ZipArchiveStore.verify_crc
