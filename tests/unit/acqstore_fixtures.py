"""Editing an AcqStore collection's JSON documents in tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def edit_json(root: Path, rel: str, change: Any) -> None:
    """Apply `change` to the JSON document at `rel` in place."""
    path = root / rel
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
