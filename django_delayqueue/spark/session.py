"""A local-first SparkSession with the settings the pipeline's jobs expect."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any

from pyspark.sql import SparkSession

from django_delayqueue.spark.package import ship_package
from django_delayqueue.spark.storage import is_local_master

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
    *,
    ship: bool | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one on ``master``.

    The master defaults to ``$SPARK_MASTER``, then ``local[*]``. An already active session is
    returned as it is (Spark ignores a new master for it).

    On a local master the Python workers run this interpreter (``sys.executable``) unless
    ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` says otherwise. On a cluster they run the
    executors' own Python (``python3``, or what ``spark.pyspark.python`` names), which needs
    pyarrow, pandas and redis; this package is shipped to them as a zip (``ship``, default:
    on a non-local master unless ``spark.submit.pyFiles`` is set).
    """
    master = master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    local = is_local_master(master)
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {**DEFAULT_CONF, **{k: str(v) for k, v in (conf or {}).items()}}
    if local and not os.environ.get("PYSPARK_PYTHON") and "spark.pyspark.python" not in settings:
        # Read when the SparkContext starts; the default ("python3" on PATH) may lack redis.
        # Never on a cluster: the driver's interpreter path means nothing on another host.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if "spark.driver.extraJavaOptions" not in settings:
        log_config = resources.files(__package__).joinpath("log4j2.properties")
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={log_config}"
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if ship is None:
        ship = not local and not spark.sparkContext.getConf().get("spark.submit.pyFiles")
    if ship:
        ship_package(spark)
    logger.debug("Spark %s on %s", spark.version, spark.sparkContext.master)
    return spark
