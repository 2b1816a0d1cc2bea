"""The package as a zip for Spark executors that do not have it installed.

The commands call :func:`ship_package` when the master is not local, so a worker with its own
Python (pyarrow, pandas and redis installed, not this project) imports ``django_delayqueue``
from the zip Spark hands it; the Lua scripts load from the zip too. For ``spark-submit``,
build the zip once and pass it with ``--py-files``::

    python -m django_delayqueue.spark.package /tmp/django_delayqueue.zip
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import django_delayqueue

logger = logging.getLogger(__name__)


def build_zip(target: str | os.PathLike[str]) -> str:
    """Zip the installed ``django_delayqueue`` (code, Lua, templates; no caches) to ``target``."""
    root = Path(django_delayqueue.__file__).resolve().parent
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: the package is not installed as files")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, Path("django_delayqueue") / path.relative_to(root))
    return str(target)


@cache
def _zip_for_this_process() -> str:
    directory = tempfile.mkdtemp(prefix="django-delayqueue-spark-")
    return build_zip(Path(directory) / "django_delayqueue.zip")


def ship_package(spark: Any) -> str | None:
    """Add the package zip to every executor's ``sys.path`` (``SparkContext.addPyFile``).

    Returns the zip's path, or None when the package cannot be zipped (imported from a zip
    itself, e.g. a driver started by ``spark-submit --py-files``: Spark ships that one).
    """
    try:
        path = _zip_for_this_process()
    except FileNotFoundError as e:
        logger.debug("not shipping the package: %s", e)
        return None
    spark.sparkContext.addPyFile(path)
    logger.debug("shipped %s to the executors", path)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m django_delayqueue.spark.package OUT.zip", file=sys.stderr)
        return 2
    print(build_zip(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
