"""A long-lived sweep runner: runs ``oprl train`` argument lists one after another in this process.

``oprl sweep`` keeps ``parallel`` of these alive, so each run skips the seconds of importing torch and
transformers (about 10% of a 40-second reproduction run). Protocol, one JSON object per line: the sweep writes
``{"argv": [...], "log": "<sweep>/logs/<run>.log"}`` to stdin; the runner runs it with stdout/stderr (file descriptors
1 and 2, so native libraries' output too) sent to the log, then answers ``{"rc": exit code}`` on the original
stdout. Runs are independent: each seeds everything it uses, which the sweep test checks against a fresh run.

A runner holds the code it imported; the workers a run starts (processes, Ray actors) import the code on disk. So a
runner whose oprl source changed since it started (a sweep of hours beside development) refuses the next job with
``{"stale": true}`` and exits, and the sweep gives that run to a fresh runner: mixing two versions of oprl in one
run failed every run of a sweep once (a config class moved between modules: its pickle no longer loaded).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def source_stamp() -> float:
    """The newest modification time of oprl's Python source files."""
    import oprl

    root = Path(oprl.__file__).parent
    return max(path.stat().st_mtime for path in root.rglob("*.py"))


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)  # the sweep reads results here, not the runs' output
    from oprl.cli import main as cli_main  # import once: this is the point of the runner

    imported = source_stamp()
    for line in sys.stdin:
        job = json.loads(line)
        if source_stamp() > imported:
            answers.write(json.dumps({"stale": True}) + "\n")
            return 0
        saved = os.dup(1), os.dup(2)
        with open(job["log"], "ab", buffering=0) as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                rc = cli_main(job["argv"])
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:
                print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
                rc = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        answers.write(json.dumps({"rc": int(rc or 0)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
