"""The metrics endpoint scraped by a real Prometheus (2.42, Debian's package), as docs/operations.md
configures it: a bearer token through Prometheus' ``authorization`` block, the shipped alert
rules loaded as a rules file, and the shipped Grafana dashboard's queries run by it.

The app is served by the test's live server; messages are delivered by ``runqueue``; the test
waits (bounded) for a scrape that started after the last delivery, then asks Prometheus' HTTP
API. Without ``prometheus`` on PATH the tests skip, and fail under ``CI=true``
(.ci/install-system-deps installs it there).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from exported_metrics import METRIC_NAME, exported_names
from prometheus_support import Prometheus, running_prometheus
from waiting import wait_until

import django_delayqueue as dq

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "django_delayqueue" / "contrib" / "prometheus"
RULES = CONTRIB / "alerts.yml"
DASHBOARD = CONTRIB / "grafana-dashboard.json"
QUEUE = "prom-shop"
TOKEN = "prometheus-test-token-0123456789abcdef"
SCRAPE_WAIT = 60.0  # bound on waiting for a scrape (they come every second)

# The panels that must show data after a few deliveries (the others need a flow limit, a time
# limit or a recurring schedule, which this queue does not have: their queries must still run).
CORE_PANELS = {
    "Queues readable (delayqueue_up)",
    "Live consumers",
    "Dead letters",
    "Oldest overdue message",
    "Overdue messages",
    "Start lateness p50 / p99",
    "Handler runs per second by outcome",
    "Failures per second",
    "Messages by state",
    "Handler duration p50 / p99",
    "Redis memory",
}


@pytest.fixture
def ledger() -> Iterator[Counter[str]]:
    """The queue's handler, and what it did: every third message is rejected (dead), every
    fourth fails its first attempt (retried once, then acknowledged)."""
    did: Counter[str] = Counter()

    def handle(message: dq.Message, **kwargs: Any) -> None:
        n = message.payload["n"]
        did["runs"] += 1
        if n % 3 == 0:
            did["dead"] += 1
            raise dq.Reject("a bad order")
        if n % 4 == 1 and message.attempt == 1:
            did["retry"] += 1
            raise RuntimeError("the partner timed out")
        did["ack"] += 1

    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"backoff_base": 0, "backoff_max": 0}}
    delayqueue = {**settings.DELAYQUEUE, "QUEUES": queues, "MONITORING_TOKEN": TOKEN}
    with override_settings(DELAYQUEUE=delayqueue):
        dq.topic(QUEUE).connect(handle)
        try:
            yield did
        finally:
            dq.topic(QUEUE).disconnect(handle)


def config(folder: Path, target: str) -> dict[str, Any]:
    """What docs/operations.md configures, on a one-second scrape and evaluation interval."""
    token = folder / "delayqueue-token"
    token.write_text(TOKEN + "\n")
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "delayqueue",
                "metrics_path": "/delayqueue/metrics/",
                "authorization": {"type": "Bearer", "credentials_file": str(token)},
                "static_configs": [{"targets": [target]}],
            }
        ],
        "rule_files": [str(RULES)],
    }


def scraped_since(prometheus: Prometheus, since: float) -> bool:
    """Whether a scrape that started after ``since`` (Unix time) is stored."""
    found = prometheus.values(f'timestamp(delayqueue_up{{queue="{QUEUE}"}})', "queue")
    return found.get(QUEUE, 0.0) > since


def wait_for_scrape(prometheus: Prometheus, since: float) -> float:
    """Wait (bounded) until a scrape that started after ``since`` is stored; the time then."""
    wait_until(
        lambda: scraped_since(prometheus, since),
        timeout=SCRAPE_WAIT,
        what="a scrape after the deliveries",
        every=0.2,
        details=prometheus.log_text,
    )
    return time.time()


@pytest.fixture
def prometheus(
    ledger: Counter[str], live_server: Any, redis_client: Any, tmp_path: Path
) -> Iterator[Prometheus]:
    """Prometheus scraping the live server, with a first scrape of the queue (empty) done."""
    target = live_server.url.removeprefix("http://")
    with running_prometheus(tmp_path, config(tmp_path, target)) as server:

        def targets() -> str:
            return json.dumps(server.api("targets")["activeTargets"], indent=1)

        wait_until(
            lambda: scraped_since(server, 0),
            timeout=SCRAPE_WAIT,
            what="a first scrape of the queue",
            every=0.2,
            details=lambda: targets() + "\n" + server.log_text(),
        )
        yield server


def deliver(count: int) -> float:
    """Schedule ``count`` messages and run ``runqueue --burst`` until they are settled; the
    Unix time once it has returned."""
    for n in range(count):
        dq.schedule(QUEUE, {"n": n}, on_commit=False)
    call_command("runqueue", QUEUE, "--burst")
    return time.time()


@pytest.mark.django_db(transaction=True)
def test_prometheus_counts_every_delivery_runqueue_made(
    prometheus: Prometheus, ledger: Counter[str]
) -> None:
    done = deliver(24)
    assert ledger["runs"] == 24 + ledger["retry"] and ledger["dead"] == 8  # what the queue did
    wait_for_scrape(prometheus, done)
    (target,) = prometheus.api("targets")["activeTargets"]
    assert target["health"] == "up", target  # through the token: 401 without it

    def by_queue(metric: str) -> float:
        return prometheus.values(f'{metric}{{queue="{QUEUE}"}}', "queue")[QUEUE]

    def by_outcome(metric: str) -> dict[str, float]:
        return prometheus.values(f'{metric}{{queue="{QUEUE}"}}', "outcome")

    assert by_queue("delayqueue_deliveries_total") == ledger["runs"]
    assert by_queue("delayqueue_failures_total") == ledger["retry"] + ledger["dead"]
    expected = {o: float(ledger[o]) for o in ("ack", "retry", "dead")}
    assert by_outcome("delayqueue_outcomes_total") == expected
    outcomes = by_outcome("delayqueue_delivery_outcomes_total")
    assert {o: outcomes[o] for o in expected} == expected
    assert by_queue("delayqueue_start_lateness_seconds_count") == ledger["runs"]
    assert by_queue("delayqueue_handler_duration_seconds_count") == ledger["runs"]
    dead = prometheus.values(f'delayqueue_messages{{queue="{QUEUE}",state="dead"}}', "queue")
    assert dead == {QUEUE: ledger["dead"]}


@pytest.mark.django_db(transaction=True)
def test_the_shipped_alert_rules_load_and_evaluate_without_error(
    prometheus: Prometheus,
) -> None:
    def rules() -> list[dict[str, Any]]:
        groups = prometheus.api("rules")["groups"]
        assert [g["file"] for g in groups] == [str(RULES)]
        return [r for g in groups for r in g["rules"]]

    # Health is "unknown" until a rule's first evaluation (every second here).
    evaluated = wait_until(
        lambda: (found := rules()) and all(r["health"] != "unknown" for r in found) and found,
        timeout=SCRAPE_WAIT,
        what="every rule evaluated once",
        every=0.2,
    )
    assert len(evaluated) == 8
    failing = {r["name"]: r.get("lastError") for r in evaluated if r["health"] != "ok"}
    assert not failing


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the shipped dashboard, rows' panels included."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    panels += [p for row in panels for p in row.get("panels", [])]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def as_prometheus_reads(expr: str) -> str:
    """A panel's query with Grafana's variables as a dashboard opened on every queue sets them:
    ``$queue`` (All: its allValue ``.*``) and ``$__rate_interval`` (a minute: the samples of
    the scrapes before and after the deliveries)."""
    return expr.replace("$queue", ".*").replace("$__rate_interval", "1m")


def test_the_dashboard_names_only_metrics_the_app_exports() -> None:
    queries = dashboard_queries()
    assert {title for title, _ in queries} >= CORE_PANELS
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v["query"]["query"] for v in dashboard["templating"]["list"] if "query" in v]
    used = {name for _, expr in queries for name in METRIC_NAME.findall(expr)}
    used |= {name for text in variables for name in METRIC_NAME.findall(text)}
    assert used <= exported_names(), sorted(used - exported_names())
    # Every variable a query uses is one the dashboard defines or Grafana's own.
    defined = {v["name"] for v in dashboard["templating"]["list"]} | {"__rate_interval"}
    named = {v for _, expr in queries for v in re.findall(r"\$\{?(\w+)", expr)}
    assert named <= defined, sorted(named - defined)


@pytest.mark.django_db(transaction=True)
def test_prometheus_runs_every_dashboard_query(
    prometheus: Prometheus, ledger: Counter[str]
) -> None:
    done = deliver(12)
    # Two samples after the first one: rate() over the minute sees the deliveries.
    wait_for_scrape(prometheus, wait_for_scrape(prometheus, done))
    shown: Counter[str] = Counter()
    for title, expr in dashboard_queries():
        result = prometheus.query(as_prometheus_reads(expr))  # fails on a query it refuses
        shown[title] += len(result)
    # A panel shows data when one of its queries does (maxmemory is drawn only where set).
    assert not {title for title in CORE_PANELS if not shown[title]}, shown
    queues = prometheus.api("label/queue/values", **{"match[]": "delayqueue_up"})
    assert QUEUE in queues  # the $queue variable's options
    runs = prometheus.values(
        as_prometheus_reads(
            'max by (queue) (rate(delayqueue_deliveries_total{queue=~"$queue"}[$__rate_interval]))'
        ),
        "queue",
    )
    assert runs[QUEUE] > 0


def test_the_dashboard_imports_with_one_question_the_data_source() -> None:
    """Grafana's import asks for each ``__inputs`` entry: one, the Prometheus data source, which
    every panel and query names; panel ids are unique and panels fit the 24-column grid."""
    dashboard = json.loads(DASHBOARD.read_text())
    (source,) = dashboard["__inputs"]
    assert (source["type"], source["pluginId"]) == ("datasource", "prometheus")
    uid = f"${{{source['name']}}}"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        named = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        assert all(d == {"type": "prometheus", "uid": uid} for d in named), panel["title"]
