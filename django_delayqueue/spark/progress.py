"""Task progress of a Spark job, polled from the status tracker on a background thread."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator

from pyspark import SparkContext

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (tasks done, tasks known so far)


@contextlib.contextmanager
def watch_progress(
    sc: SparkContext,
    callback: ProgressCallback | None,
    description: str = "django-delayqueue",
    interval: float = 0.5,
) -> Iterator[None]:
    """Run the jobs started inside the block in one job group and report their tasks.

    The callback runs on the watcher thread every ``interval`` seconds, and once more at the
    end; without a callback nothing is started.
    """
    if callback is None:
        yield
        return
    group = f"delayqueue-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, description)
    stop = threading.Event()

    def poll() -> None:
        tracker = sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        callback(done, total)

    def run() -> None:
        while not stop.wait(interval):
            try:
                poll()
            except Exception as e:  # progress is cosmetic; never fail the job for it
                logger.debug("progress poll failed: %s", e)
                return

    thread = threading.Thread(target=run, name="delayqueue-spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        with contextlib.suppress(Exception):
            poll()
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
