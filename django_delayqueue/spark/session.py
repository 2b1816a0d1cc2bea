"""A local-first SparkSession with the settings the pipeline's jobs expect."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

# Small jobs on few cores: 200 shuffle partitions (Spark's default) would mostly be empty tasks.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # callers show their own progress
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",  # hours and days in reports are UTC hours and days
    "spark.driver.memory": "2g",
}


def get_spark(
    app_name: str = "django-delayqueue",
    master: str | None = None,
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one on ``master``.

    The master defaults to ``$SPARK_MASTER``, then ``local[*]``. An already active session is
    returned as it is (Spark ignores a new master for it).

    Python workers run this interpreter (``sys.executable``) unless ``PYSPARK_PYTHON`` or
    ``spark.pyspark.python`` says otherwise: the executors must import the same packages.
    """
    master = master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {**DEFAULT_CONF, **{k: str(v) for k, v in (conf or {}).items()}}
    if not os.environ.get("PYSPARK_PYTHON") and "spark.pyspark.python" not in settings:
        # Read when the SparkContext starts; the default ("python3" on PATH) may lack redis.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if "spark.driver.extraJavaOptions" not in settings:
        log_config = resources.files(__package__).joinpath("log4j2.properties")
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={log_config}"
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    logger.debug("Spark %s on %s", spark.version, spark.sparkContext.master)
    return spark
