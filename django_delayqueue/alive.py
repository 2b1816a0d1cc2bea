"""A liveness file for ``runqueue``, and the probe that reads it.

``runqueue --alive-file PATH`` touches PATH each time a consumer process's loop goes round (at
most once a second): it goes round every few seconds even while idle (its maintenance) and
while Redis is down (its retries), so a file that stops changing means that no loop turns: the
process is stuck, not waiting. A worker pod's liveness probe (or a systemd watchdog script)
reads it without Django, in a few milliseconds::

    python -m django_delayqueue.alive /tmp/runqueue-alive --max-age 60

exits 0 when PATH changed within the last 60 seconds, 1 (saying why on stderr) when it is
older or missing. With ``--processes N`` the file is fresh while any process's loop turns.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

EVERY_SECONDS = 1.0  # the most often the file is touched
DEFAULT_MAX_AGE_SECONDS = 60.0


class AliveFile:
    """Touches ``path`` (creating it) at most every ``every`` seconds. A file that cannot be
    written is said once in the log and never stops the loop that touches it."""

    def __init__(
        self,
        path: str,
        every: float = EVERY_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._every = every
        self._monotonic = monotonic
        self._next = -math.inf
        self._failed = False

    def touch(self) -> None:
        now = self._monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        try:
            with open(self.path, "a"):
                pass
            os.utime(self.path)
        except OSError as e:
            if not self._failed:
                self._failed = True
                logger.error("cannot touch the --alive-file %s: %s", self.path, e)
            return
        self._failed = False


def file_age(path: str, now: float | None = None) -> float:
    """Seconds since ``path`` was last touched (OSError when it cannot be read)."""
    return (time.time() if now is None else now) - os.stat(path).st_mtime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_delayqueue.alive",
        description="Exit 0 if runqueue's --alive-file changed recently, 1 otherwise.",
    )
    parser.add_argument("path", help="the file given to runqueue --alive-file")
    parser.add_argument(
        "--max-age",
        type=float,
        default=DEFAULT_MAX_AGE_SECONDS,
        metavar="SECONDS",
        help=f"how old the file may be (default {DEFAULT_MAX_AGE_SECONDS:g})",
    )
    args = parser.parse_args(argv)
    if not (args.max_age > 0 and math.isfinite(args.max_age)):
        parser.error(f"--max-age must be a finite number of seconds above 0, not {args.max_age}")
    try:
        age = file_age(args.path)
    except OSError as e:
        print(f"not alive: {args.path} cannot be read ({e.strerror})", file=sys.stderr)
        return 1
    if age > args.max_age:
        print(
            f"not alive: {args.path} last changed {age:.0f} s ago (--max-age {args.max_age:g})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
