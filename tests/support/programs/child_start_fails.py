"""A supervised ``runqueue`` whose consumer processes all die as they start (before their first
round trip), with the exception the cluster outage showed ("no default node"): what a client a
child cannot use, or any start-up error of a forked child, looks like to the supervisor.

Only the children fail: the supervisor (this process) sets up Django and judges the servers as
usual, then every child it forks raises in ``SupervisedWorker.refresh``, after
``$DRILL_START_SECONDS`` (default 0) of a start that takes its time.
"""

import os
import sys
import time

import django
from django.core.management import call_command

if __name__ == "__main__":
    django.setup()
    from redis.exceptions import RedisClusterException

    from django_delayqueue.supervisor.child import SupervisedWorker

    supervisor = os.getpid()

    def refresh(self: SupervisedWorker) -> None:
        if os.getpid() != supervisor:
            time.sleep(float(os.environ.get("DRILL_START_SECONDS", "0")))
            raise RedisClusterException("drill: the cluster has no default node")

    SupervisedWorker.refresh = refresh  # type: ignore[method-assign]
    call_command("runqueue", *sys.argv[1:])
