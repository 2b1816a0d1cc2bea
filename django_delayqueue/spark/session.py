"""A local-first SparkSession with the settings the pipeline's jobs expect."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from django_delayqueue.spark import class_archive
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
    archive = None
    if not _driver_java_options_given(settings):
        log_config = resources.files(__package__).joinpath("log4j2.properties")
        options = log_option = f"-Dlog4j2.configurationFile={log_config}"
        if _starts_a_new_jvm():
            archive = class_archive.plan()
        if archive is not None:
            options = f"{options} {archive.java_options}"
        settings["spark.driver.extraJavaOptions"] = options
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except BaseException:
        if archive is None:
            raise
        class_archive.release(archive)
        if archive.pending is not None:
            raise
        # The JVM did not start while mapping the archive (damaged since it was written?):
        # set it aside and start once more without one.
        logger.warning("Spark did not start with class archive %s: retrying", archive.final)
        class_archive.set_aside(archive)
        builder = builder.config("spark.driver.extraJavaOptions", log_option)
        archive = None
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if archive is not None:
        class_archive.finish_at_exit(spark, archive)
    if ship is None:
        ship = not local and not spark.sparkContext.getConf().get("spark.submit.pyFiles")
    if ship:
        ship_package(spark)
    logger.debug("Spark %s on %s", spark.version, spark.sparkContext.master)
    return spark


def _driver_java_options_given(settings: Mapping[str, str]) -> bool:
    """Whether the user set the driver's JVM options anywhere: ours would replace theirs."""
    if "spark.driver.extraJavaOptions" in settings:
        return True
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "spark.driver.extraJavaOptions" in submit_args or "--driver-java-options" in submit_args:
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    defaults = os.path.join(conf_dir, "spark-defaults.conf") if conf_dir else None
    if defaults and os.path.exists(defaults):
        with open(defaults, encoding="utf-8", errors="replace") as lines:
            return any(line.strip().startswith("spark.driver.extraJavaOptions") for line in lines)
    return False


def _starts_a_new_jvm() -> bool:
    """False when a JVM already runs (this process's, or spark-submit's): options come too late."""
    return SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")
