"""``--verbosity`` of every management command mapped onto the package's logger."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

# Django's verbosity 0..3 -> the level of the ``django_delayqueue`` logger. A long-running
# worker logs what it does at the default verbosity; a batch job (the Spark commands, which
# draw a progress bar) logs only what went wrong.
WORKER_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
BATCH_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


def configure_logging(verbosity: int, levels: Mapping[int, int] = WORKER_LEVELS) -> None:
    """Set the package logger's level; add a stderr handler when nothing would print it."""
    logger = logging.getLogger("django_delayqueue")
    logger.setLevel(levels.get(verbosity, logging.DEBUG))
    if not logger.hasHandlers():  # one here or on an ancestor it propagates to
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
