"""Whether a caller may change a folder's entries: for what the mount does on a caller's behalf
that the kernel's own check (default_permissions) does not cover.

Writing into a published file moves it into the spool and publishes it again (a new archive, a
new name in the folder): on a local filesystem that needs write and search permission on the
folder, not only on the file, and the daemon, often root, must never do more for a caller than
the caller could do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def caller_groups(pid: int, gid: int) -> set[int]:
    """The caller's primary and supplementary groups (/proc/PID/status), or just its primary
    group where those cannot be read (the check is then stricter, never looser)."""
    groups = {gid}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                groups.update(int(g) for g in line.split()[1:])
                break
    except (OSError, ValueError):
        pass
    return groups


def may_change_entries(folder: Path, uid: int, gid: int, pid: int) -> bool:
    """Whether the caller may add and remove names in `folder` (write and search permission,
    as the kernel would judge them). Blocking (a stat, a /proc read): not on the event loop."""
    if uid == 0:
        return True
    st = os.stat(folder, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_uid == uid:
        need = stat.S_IWUSR | stat.S_IXUSR
    elif st.st_gid in caller_groups(pid, gid):
        need = stat.S_IWGRP | stat.S_IXGRP
    else:
        need = stat.S_IWOTH | stat.S_IXOTH
    return st.st_mode & need == need
