"""Building a view that holds synthesized TIFFs starts importing what opening one needs (zarr
above all) on a worker thread: the first open of an image used to import it on the spot. Run in
a fresh interpreter, so no other test's imports count."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import vfs.backends.acqstore as acq
    from vfs.cache import PageCache

    before = "zarr" in sys.modules
    desc = acq.AcqStoreBackend(PageCache(1 << 24)).describe(Path(sys.argv[1]))
    acq._PRELOADING.result(timeout=60)
    print(json.dumps({"before": before, "after": "zarr.storage" in sys.modules,
                      "chunks": "vfs.acqstore.chunks" in sys.modules}))
    """
)


def test_a_view_with_images_imports_their_readers_ahead(template: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(template)],
        capture_output=True, text=True, timeout=120, cwd=root, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"before": False, "after": True, "chunks": True}
