"""Building a view that holds synthesized TIFFs starts importing what opening one needs (zarr
above all) on a worker thread: the first open of an image used to import it on the spot. Run in
a fresh interpreter, so no other test's imports count."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.toolbox import json_in_child

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
    out = json_in_child(SCRIPT, str(template))
    assert out == {"before": False, "after": True, "chunks": True}
