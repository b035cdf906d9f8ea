"""What /proc/self/mountinfo says is mounted at a path: read there, so nothing is asked of the
mount itself (whose daemon may not be serving it, or may be gone: a stale mount is listed too)."""

from __future__ import annotations

from pathlib import Path


def topmost(mnt: Path | str) -> tuple[str, str] | None:
    """(major:minor, filesystem type) of the topmost mount at the path `mnt`, as given (no link
    resolved), or None when nothing is mounted there."""
    target = str(mnt).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    target = target.replace("\n", "\\012")
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 4 and fields[4] == target and " - " in line:
                fstype = line.split(" - ", 1)[1].split()[0]
                found = (fields[2], fstype)  # the last match is the topmost
    return found
