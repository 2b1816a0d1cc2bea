"""The queue report: what the journal says about each queue, per hour and overall.

Definitions (every figure is exact; percentiles use Spark's exact ``percentile``, which
interpolates linearly between the two nearest ranks, like ``numpy.percentile``):

- ``outcomes``: journal rows (deliveries and cancels); ``ack``/``retry``/``garbage``/``cancel``
  split them by outcome; ``deliveries`` = ack + retry + garbage.
- lateness = delivered_ms - due_ms - limit_wait_ms, over first deliveries only
  (``attempt == 1``): later attempts wait for their backoff on purpose, which is not lateness,
  and neither is the time a flow limit (rate, in-flight cap, key limits) held a due message
  back, as the site asked. That wait is its own figures: ``limit_wait_p50_ms`` ...
  ``limit_wait_max_ms`` over the same first deliveries (rows written before the journal kept
  it, or a journal exported before, read as 0).
- ``dead_letter_rate`` = garbage / (ack + garbage): of the deliveries that ended a message,
  the share that sent it to the dead letters. ``retry_rate`` = retry / deliveries.
- ``throughput_per_s`` = deliveries / 3600 per hour; overall, over the hours with activity.
- Hours are UTC hours of the outcome (``finished_ms``), as ``hour_ms`` (epoch ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from django_delayqueue.core.journal import ACK, GARBAGE, RETRY

CANCEL = "cancel"
OUTCOMES = (ACK, RETRY, GARBAGE, CANCEL)
HOUR_MS = 3_600_000
PERCENTILES = (0.5, 0.95, 0.99)
HISTOGRAM_BINS = 30

FIGURES = (
    "outcomes", *OUTCOMES, "deliveries", "first_deliveries",
    "lateness_p50_ms", "lateness_p95_ms", "lateness_p99_ms", "lateness_max_ms",
    "limit_wait_p50_ms", "limit_wait_p99_ms", "limit_wait_max_ms",
    "dead_letter_rate", "retry_rate", "throughput_per_s",
)  # fmt: skip


@dataclass
class Report:
    """The report's tables (Spark DataFrames; small: one row per queue, hour, ...)."""

    summary: DataFrame  # queue, hours, first_hour_ms, last_hour_ms, FIGURES, top_error
    hourly: DataFrame  # queue, hour_ms, hour, FIGURES
    attempts: DataFrame  # queue, hour_ms, attempt, deliveries
    errors: DataFrame  # queue, hour_ms, error, count, rank (top N per queue and hour)
    histogram: DataFrame  # queue, bin, lower_ms, upper_ms, count (first-delivery lateness)

    def tables(self) -> dict[str, DataFrame]:
        return {
            "summary": self.summary,
            "hourly": self.hourly,
            "attempts": self.attempts,
            "errors": self.errors,
            "lateness_histogram": self.histogram,
        }


def with_hour(journal: DataFrame) -> DataFrame:
    """Add ``hour_ms``: the UTC hour of the outcome (time-zone free integer arithmetic)."""
    when = F.coalesce("finished_ms", "delivered_ms")
    return journal.withColumn("hour_ms", F.floor(when / HOUR_MS).cast("long") * HOUR_MS)


def _first_delivery() -> Column:
    return (
        F.col("outcome").isin(ACK, RETRY, GARBAGE)
        & (F.col("attempt") == 1)
        & F.col("delivered_ms").isNotNull()
        & F.col("due_ms").isNotNull()
    )


def limit_wait() -> Column:
    """How long a flow limit held a first delivery back (0 when not recorded), null for other
    rows."""
    return F.when(_first_delivery(), F.coalesce(F.col("limit_wait_ms"), F.lit(0)))


def lateness() -> Column:
    """delivered - due - limit wait of a first delivery, null for other rows."""
    return F.when(_first_delivery(), F.col("delivered_ms") - F.col("due_ms") - limit_wait())


def figures(journal: DataFrame, keys: list[str]) -> DataFrame:
    """The FIGURES of ``journal`` grouped by ``keys`` (plus ``hours``: distinct hours)."""
    outcome = F.col("outcome")
    late, waited = lateness(), limit_wait()
    counts = [F.sum(F.when(outcome == name, 1).otherwise(0)).alias(name) for name in OUTCOMES]
    grouped = journal.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("outcomes"),
        *counts,
        F.count(late).alias("first_deliveries"),
        F.percentile(late, list(PERCENTILES)).alias("_p"),
        F.max(late).alias("lateness_max_ms"),
        F.percentile(waited, [0.5, 0.99]).alias("_w"),
        F.max(waited).alias("limit_wait_max_ms"),
        F.countDistinct("hour_ms").alias("hours"),
        F.min("hour_ms").alias("first_hour_ms"),
        F.max("hour_ms").alias("last_hour_ms"),
    )
    deliveries = F.col(ACK) + F.col(RETRY) + F.col(GARBAGE)
    ended = F.col(ACK) + F.col(GARBAGE)
    return (
        grouped.withColumn("deliveries", deliveries)
        .withColumn("lateness_p50_ms", F.col("_p")[0])
        .withColumn("lateness_p95_ms", F.col("_p")[1])
        .withColumn("lateness_p99_ms", F.col("_p")[2])
        .withColumn("limit_wait_p50_ms", F.col("_w")[0])
        .withColumn("limit_wait_p99_ms", F.col("_w")[1])
        .withColumn("dead_letter_rate", F.when(ended > 0, F.col(GARBAGE) / ended))
        .withColumn("retry_rate", F.when(deliveries > 0, F.col(RETRY) / deliveries))
        .withColumn("throughput_per_s", F.col("deliveries") / (F.col("hours") * 3600.0))
        .drop("_p", "_w")
    )


def compute_report(journal: DataFrame, top_errors: int = 5) -> Report:
    """All tables of the report for the journal rows in ``journal``."""
    rows = with_hour(journal)
    hourly = figures(rows, ["queue", "hour_ms"]).select(
        "queue", "hour_ms", F.timestamp_millis("hour_ms").alias("hour"), *FIGURES
    )
    delivered = rows.where(F.col("outcome").isin(ACK, RETRY, GARBAGE))
    attempts = delivered.groupBy("queue", "hour_ms", "attempt").agg(
        F.count(F.lit(1)).alias("deliveries")
    )
    # An ack's error is not a failure: AlreadyDone, an atomic queue's skipped redelivery.
    failed = rows.where((F.col("error") != "") & (F.col("outcome") != ACK))
    errors = _top(failed.groupBy("queue", "hour_ms", "error").count(), ["queue", "hour_ms"])
    overall_errors = _top(failed.groupBy("queue", "error").count(), ["queue"])
    top_error = overall_errors.where(F.col("rank") == 1).select(
        "queue", F.col("error").alias("top_error")
    )
    summary = (
        figures(rows, ["queue"])
        .join(top_error, "queue", "left")
        .select("queue", "hours", "first_hour_ms", "last_hour_ms", *FIGURES, "top_error")
    )
    return Report(
        summary=summary.orderBy("queue"),
        hourly=hourly.orderBy("queue", "hour_ms"),
        attempts=attempts.orderBy("queue", "hour_ms", "attempt"),
        errors=errors.where(F.col("rank") <= top_errors).orderBy("queue", "hour_ms", "rank"),
        histogram=lateness_histogram(rows, summary),
    )


def lateness_histogram(
    rows: DataFrame, summary: DataFrame, bins: int = HISTOGRAM_BINS
) -> DataFrame:
    """Counts of first-delivery lateness in ``bins`` equal bins per queue, 0 .. p99.

    The last bin also holds everything above p99, so that one very late delivery does not
    squash the picture (the chart says so); the first also holds early (negative) ones.
    """
    bounds = summary.select(
        "queue",
        F.lit(0.0).alias("lower"),
        F.greatest(F.col("lateness_p99_ms"), F.lit(1.0)).alias("upper"),
    ).withColumn("width", (F.col("upper") - F.col("lower")) / bins)
    late = rows.select("queue", lateness().alias("lateness")).where(F.col("lateness").isNotNull())
    index = F.floor((F.col("lateness") - F.col("lower")) / F.col("width")).cast("int")
    binned = late.join(F.broadcast(bounds), "queue").withColumn(
        "bin", F.least(F.greatest(index, F.lit(0)), F.lit(bins - 1))
    )
    return (
        binned.groupBy("queue", "bin", "lower", "width")
        .count()
        .select(
            "queue",
            "bin",
            (F.col("lower") + F.col("bin") * F.col("width")).alias("lower_ms"),
            (F.col("lower") + (F.col("bin") + 1) * F.col("width")).alias("upper_ms"),
            "count",
        )
        .orderBy("queue", "bin")
    )


def _top(counted: DataFrame, keys: list[str]) -> DataFrame:
    order = Window.partitionBy(*keys).orderBy(F.col("count").desc(), F.col("error"))
    return counted.withColumn("rank", F.row_number().over(order))
