"""Which seeds a randomized exploration runs: fixed ones in CI, or what the environment asks.

``DQ_EXPLORE_SEED=<seed>`` replays one run; ``DQ_EXPLORE_EXAMPLES=<n>`` explores ``n`` fresh
random seeds (each failure names its seed).
"""

from __future__ import annotations

import os
import random


def seeds(ci_seeds: list[int]) -> list[int]:
    if os.environ.get("DQ_EXPLORE_SEED"):
        return [int(os.environ["DQ_EXPLORE_SEED"])]
    if os.environ.get("DQ_EXPLORE_EXAMPLES"):
        return [random.randrange(2**32) for _ in range(int(os.environ["DQ_EXPLORE_EXAMPLES"]))]
    return ci_seeds
