"""Where the parts of the checkout live, for tests that start child processes or read files.

The test tree is split by layer (core, app, drills, spark, docs); helpers live in
``tests/support`` and the programs that tests start as child processes in
``tests/support/programs``. A child process imports the helpers by their bare names (``ledger``,
``drill_settings``, ``task_examples``) as the tests do: ``child_pythonpath()`` gives it both.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
PROGRAMS = SUPPORT / "programs"


def child_pythonpath(*first: Path) -> str:
    """A ``PYTHONPATH`` for a child process: ``first``, then the helpers, then the checkout."""
    return os.pathsep.join(str(path) for path in (*first, SUPPORT, ROOT))
