"""Monitoring endpoints: ``path("delayqueue/", include("django_delayqueue.urls"))``.

- ``metrics/``: Prometheus text format (needs the ``metrics`` extra; 501 without it).
- ``health/``: readiness probe, 200 or 503 with a JSON report.

Neither needs a login (scrapers and probes have none): expose them on an internal network, or
set ``MONITORING_TOKEN`` (monitoring.access): then both ask for it as a bearer token.
"""

from django.urls import path

from django_delayqueue.monitoring.health import health_view
from django_delayqueue.monitoring.metrics import metrics_view

app_name = "delayqueue"

urlpatterns = [
    path("metrics/", metrics_view, name="metrics"),
    path("health/", health_view, name="health"),
]
