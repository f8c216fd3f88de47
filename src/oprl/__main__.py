"""``python -m oprl ...`` is ``oprl ...`` (the console script's entry point, ``oprl.cli.main``), for an environment
whose scripts directory is not on ``PATH``."""

import sys

from oprl.cli import main

sys.exit(main())
