"""What a missing tool means: a skip on a developer's machine, a failure in CI (``CI=true``).

CI installs everything the suite uses (``make test`` runs .ci/install-system-deps), so a test
that skips there for want of a browser or a TLS-capable redis-server would hide that the CI
image lost it, and the feature would go untested without anyone noticing.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """``CI`` set to true (GitHub Actions, GitLab CI and most others set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with ``reason``; under ``CI=true``, fail with it instead."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing tool is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)
