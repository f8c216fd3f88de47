"""The old name of ``oprl.experiments.sweep_runner`` (#43 renamed it: "worker" means a role worker only).

Kept only so that an ``oprl sweep`` started before the rename, whose loaded code still starts runners as
``python -m oprl.experiments.sweep_worker``, can replace one that died. Delete it once no such sweep runs.
"""

from __future__ import annotations

import sys

from oprl.experiments.sweep_runner import main

if __name__ == "__main__":
    sys.exit(main())
