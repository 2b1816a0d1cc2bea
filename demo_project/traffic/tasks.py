"""The demo's task (Django's Tasks framework on a delay queue): an export of the orders that
reports its progress as it goes (the admin's In flight tab shows the bar)."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

try:  # Django 6.0+
    from django.tasks import task
except ImportError:  # Django 4.2-5.2: the backport (pip install django-tasks)
    from django_tasks import task

from demo_project.shop.models import Order
from django_delayqueue.tasks import progress

STEPS = 20


@task(queue_name="shop-tasks")
def export_orders() -> dict[str, Any]:
    """Write every order to a CSV file, in ``STEPS`` parts; returns the file and the count."""
    rows = list(Order.objects.order_by("pk").values_list("pk", "amount", "status", "created"))
    folder = Path(settings.EXPORT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"orders-{timezone.now():%Y%m%d-%H%M%S-%f}.csv"
    size = -(-len(rows) // STEPS) or 1
    reported = 0
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "amount", "status", "created"])
        for step in range(STEPS):
            part = rows[step * size : (step + 1) * size]
            writer.writerows(
                (pk, amount, status, created.isoformat()) for pk, amount, status, created in part
            )
            done = min(len(rows), (step + 1) * size)
            if progress(100 * (step + 1) / STEPS, f"{done} of {len(rows)} orders written"):
                reported += 1
            time.sleep(settings.EXPORT_STEP_SECONDS)  # a slower export, to watch its progress
    return {"file": str(path), "orders": len(rows), "progress_reports": reported}
