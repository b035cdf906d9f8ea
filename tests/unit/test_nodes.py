"""A node keeps its path as a folder and a name: what it answers must be what the path would."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from vfs.nodes import Node
from vfs.stores.base import ObjectPath

_part = st.text(st.characters(blacklist_characters="/\0"), min_size=1, max_size=8)
_parts = st.lists(_part.filter(lambda p: p not in (".", "..")), max_size=4)


@given(_parts, st.sampled_from([Path, ObjectPath, PurePosixPath]), st.booleans())
def test_folder_and_real_text_are_those_of_the_path(
    parts: list[str], kind: type[PurePosixPath], absolute: bool
) -> None:
    path = kind("/" if absolute else ".", *parts)
    node = Node(False, 0, 0, 0o644, 0, 0, path)  # type: ignore[arg-type]
    assert node.real == path
    assert node.folder == path.parent
    assert type(node.folder) is type(path.parent)
    assert node.real_text == str(path)
