"""`python -m vfs.commands` runs `decant` from a checkout, without the installed entry point."""

import sys

from vfs.commands import main

sys.exit(main())
