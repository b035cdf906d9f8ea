"""Red team, round 37c (unit level): folder archives in a local SRC. Each test failed before the
fix its docstring names."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from vfs.mount.access import readable_beneath


def test_the_access_walk_of_a_folder_of_many_subfolders_holds_few_descriptors(
    tmp_path: Path,
) -> None:
    """Opening a folder archive as a user other than root walks it (may the caller read every
    file?); the walk opened every subfolder it found at once and held them all until each was
    scanned. A folder archive with 25,000 sibling subfolders (`mkdir 0/junk/{1..25000}`: free
    to make) took the daemon past its descriptor limit (20,000) on each such open: another
    user's open of an unrelated archive failed with EIO ("Too many open files"), and the
    walker's own open with EACCES. Fixed: a subfolder is opened when its turn comes, so a
    walk holds one descriptor per level of depth."""
    archive = tmp_path / "a.zarr"
    junk = archive / "0" / "junk"
    junk.mkdir(parents=True)
    for i in range(600):
        (junk / str(i)).mkdir()
    (junk / "7" / "deep").mkdir()
    (junk / "7" / "deep" / "f").write_bytes(b"x")
    for dirpath, _dirs, files in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 100, hard))
    try:
        found = readable_beneath(tmp_path, archive, 54321, 54321, os.getpid())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    st = archive.stat()
    assert found == (st.st_dev, st.st_ino)
    (junk / "7" / "deep" / "f").chmod(0o600)  # still checked, however deep
    assert readable_beneath(tmp_path, archive, 54321, 54321, os.getpid()) is None
