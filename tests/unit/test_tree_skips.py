"""Names a scan of SRC never shows: the daemon's own at SRC's top only, archives being written
(temp names) anywhere, and the mountpoint in the one folder that holds it; and the names below
SRC an archive's xattr gives."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from vfs.decant import TEMP_PREFIX
from vfs.mount.tree import SourceTree


def test_each_folder_skips_only_its_own_names(tmp_path: Path) -> None:
    deep = tmp_path / "lab" / "deep"
    deep.mkdir(parents=True)
    for folder in (tmp_path, tmp_path / "lab", deep):
        for name in ("kept.dat", ".spool", "mnt", f"{TEMP_PREFIX}x.zarr.zip"):
            (folder / name).mkdir() if name == "mnt" else (folder / name).touch()
    tree = SourceTree(tmp_path, [], hidden=[".spool"])
    tree.excluded.add(tmp_path / "lab" / "mnt")  # a mountpoint inside SRC

    assert sorted(tree.scan(tmp_path)) == ["kept.dat", "lab", "mnt"]
    assert sorted(tree.scan(tmp_path / "lab")) == [".spool", "deep", "kept.dat"]
    assert sorted(tree.scan(deep)) == [".spool", "kept.dat", "mnt"]


@given(parts=st.lists(st.sampled_from(["a", "b", "ab", "a b", ".x", "é", "a.zarr"]), max_size=4),
       root=st.sampled_from(["/", "/src", "/src/a", "/sr"]))  # fmt: skip
def test_relative_names_are_what_relative_to_gives(parts: list[str], root: str) -> None:
    """What an archive's `user.decant.archive` shows: its path below SRC."""
    tree = SourceTree(Path(root), [])
    path = Path("/src", *parts)
    try:
        expected = path.relative_to(root).as_posix()
    except ValueError:
        expected = str(path)
    assert tree._relative(path) == expected
