"""An optional Prometheus endpoint over :func:`django_delayqueue.monitoring.stats.collect`.

Needs ``prometheus-client`` (``pip install 'django-delayqueue[metrics]'``); without it the view
answers 501 saying so. The numbers are read from Redis at scrape time by a custom collector (one
round trip for every queue), so every web process serves the same values and nothing is
counted in process memory. Series of a value that could not be read are left out, and
``delayqueue_up`` says whether a queue's stats were read.

Mount it with ``path("delayqueue/", include("django_delayqueue.urls"))`` and keep it off the
public internet (a proxy rule, or a network policy): it names every queue.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from django_delayqueue.conf.connection import monitoring_reads
from django_delayqueue.core import STATES
from django_delayqueue.core.flow_limits import parse_rate
from django_delayqueue.monitoring.access import Access, access, refused
from django_delayqueue.monitoring.health import queue_time_limit
from django_delayqueue.monitoring.processes import past_limit
from django_delayqueue.monitoring.stats import (
    QueueStats,
    collect,
    redis_unreachable,
    unreachable_stats,
)
from django_delayqueue.monitoring.timing_metrics import add_timings, timing_families

logger = logging.getLogger(__name__)

MISSING = (
    "prometheus-client is not installed: pip install 'django-delayqueue[metrics]' "
    "to serve the delay queue metrics.\n"
)


class StatsCollector:
    """A prometheus-client collector: one ``stats.collect()`` per scrape."""

    def describe(self) -> list[Any]:
        # Registering must not touch Redis; the families are only known at scrape time.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        families = {
            name: kinds[kind](f"delayqueue_{name}", help_text, labels=["queue", *extra])
            for name, (kind, help_text, extra) in FAMILIES.items()
        }
        timings = timing_families()
        # Asked first: when Redis does not answer, nothing else is asked of it (each read
        # would wait out its timeout again), and every queue and server reads as down.
        down = redis_unreachable()
        for s in unreachable_stats(down[0]) if down else collect():
            _add(s, families)
            if s.lateness is not None:
                add_timings(s.queue, s.lateness.windows.total, timings)
        yield from families.values()
        yield from timings.values()
        if not down:
            yield from _schedule_families()
        yield from _server_families(down[0] if down else None)


# name (after "delayqueue_") -> (kind, help text, labels after "queue")
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "up": ("gauge", "1 if the queue's stats could be read from Redis.", ()),
    "messages": ("gauge", "Messages in each state.", ("state",)),
    "oldest_overdue_seconds": (
        "gauge",
        "How long the oldest due message has been waiting to be delivered (0: none). Read "
        "from what waits, so it grows while no consumer runs: the lateness alert.",
        (),
    ),
    "overdue_messages": (
        "gauge",
        "Due messages no handler has started: pending and retrying ones past their time, and "
        "ready ones no flow limit holds back.",
        (),
    ),
    "consumers_alive": ("gauge", "Consumers whose last heartbeat is recent.", ()),
    "paused": ("gauge", "1 if the queue is paused.", ()),
    "deliveries": ("counter", "Handler runs recorded in the queue's journal.", ()),
    "failures": (
        "counter",
        "Handler runs that did not acknowledge (retried or sent to the dead letters).",
        (),
    ),
    "outcomes": (
        "counter",
        "Handler runs by outcome as the journal counts them (ack, retry, dead).",
        ("outcome",),
    ),
    "stalled_handlers": (
        "gauge",
        "Handlers running past their queue's time_limit (queues with a time_limit only).",
        (),
    ),
    "longest_running_seconds": (
        "gauge",
        "How long the longest-running handler of the queue has run (0: none runs).",
        (),
    ),
    # Flow control (docs/flow-control.md): only for queues with a rate_limit or max_in_flight.
    "throttled": (
        "counter",
        "Messages that started later because a flow limit (rate_limit, max_in_flight) held "
        "them back.",
        (),
    ),
    "waiting_on_limit": (
        "gauge",
        "Ready messages waiting on a flow limit, by the limit that holds them (rate, in_flight; "
        "key: keyed ready messages waiting for their key's turn, slot or token).",
        ("limit",),
    ),
    "rate_limit_per_second": ("gauge", "The queue's rate_limit, in messages per second.", ()),
    "max_in_flight": ("gauge", "The queue's max_in_flight.", ()),
    "key_concurrency": ("gauge", "The queue's key_concurrency (messages of one key at once).", ()),
    "key_rate_limit_per_second": (
        "gauge",
        "The queue's key_rate_limit, in messages per second of one key.",
        (),
    ),
    "keys_with_ready_messages": ("gauge", "Flow keys with messages ready to start.", ()),
    # The busiest keys by rank, not by name: a label per key would be a series per phone
    # number or store (unbounded, and often personal data); the admin and queuestats name them.
    "busiest_key_messages": (
        "gauge",
        "Ready and in-flight messages of the queue's busiest flow keys, by rank (1: the "
        "busiest; at most 10); their names are in the admin and queuestats.",
        ("rank",),
    ),
    "started_last_second": (
        "gauge",
        "Messages of a rate-limited or capped queue claimed in the last whole second.",
        (),
    ),
}


# What a user reads for the dead letters: "dead", as delayqueue_delivery_outcomes_total says
# (Redis keeps them in the queue's "garbage" zset and the journal writes "garbage").
DEAD = {"garbage": "dead"}


def _add(s: QueueStats, families: dict[str, Any]) -> None:
    q = s.queue
    families["up"].add_metric([q], 1 if s.ok else 0)
    for state in STATES:
        if s.counts[state] is not None:
            families["messages"].add_metric([q, DEAD.get(state, state)], s.counts[state])
    if s.counts["pending"] is not None:
        families["oldest_overdue_seconds"].add_metric([q], s.oldest_overdue_seconds or 0.0)
    if s.overdue_messages is not None:
        families["overdue_messages"].add_metric([q], s.overdue_messages)
    if s.consumers_alive is not None:
        families["consumers_alive"].add_metric([q], s.consumers_alive)
        running = s.running
        longest = running[0].running_seconds(s.now_ms) if running else 0.0
        families["longest_running_seconds"].add_metric([q], longest)
        limit = queue_time_limit(q)
        if limit is not None:
            families["stalled_handlers"].add_metric([q], len(past_limit(running, limit, s.now_ms)))
    if s.paused is not None:
        families["paused"].add_metric([q], 1 if s.paused else 0)
    if s.outcomes is not None:
        families["deliveries"].add_metric([q], s.deliveries)
        families["failures"].add_metric([q], s.failures)
        for outcome, value in s.outcomes.items():
            families["outcomes"].add_metric([q, DEAD.get(outcome, outcome)], value)
    _add_flow(s, families)
    _add_keys(s, families)


def _add_flow(s: QueueStats, families: dict[str, Any]) -> None:
    flow, q = s.flow, s.queue
    if not flow.limited:
        return
    if flow.rate_per_second is not None:
        families["rate_limit_per_second"].add_metric([q], flow.rate_per_second)
    if flow.max_in_flight is not None:
        families["max_in_flight"].add_metric([q], flow.max_in_flight)
    if flow.throttled is not None:
        families["throttled"].add_metric([q], flow.throttled)
    if flow.rate_now is not None:
        families["started_last_second"].add_metric([q], flow.rate_now)
    if flow.waiting is not None:
        for limit in ("rate", "in_flight"):
            families["waiting_on_limit"].add_metric(
                [q, limit], flow.waiting if flow.held == limit else 0
            )
    if flow.key_limited and flow.waiting_on_keys is not None:
        families["waiting_on_limit"].add_metric([q, "key"], flow.waiting_on_keys)
    if flow.key_concurrency is not None:
        families["key_concurrency"].add_metric([q], flow.key_concurrency)
    if flow.key_rate_limit is not None:
        per_second = parse_rate(flow.key_rate_limit).per_second
        families["key_rate_limit_per_second"].add_metric([q], per_second)


def _add_keys(s: QueueStats, families: dict[str, Any]) -> None:
    """A queue's keys: only for one that has keyed messages now, or key limits."""
    busiest = s.busiest_keys
    if busiest is None or not (busiest.keys or s.flow.key_limited):
        return
    families["keys_with_ready_messages"].add_metric([s.queue], busiest.keys_ready)
    for rank, key in enumerate(busiest.keys, 1):
        families["busiest_key_messages"].add_metric([s.queue, str(rank)], key.load)


# Recurring schedules: name (after "delayqueue_schedule_") -> help text; labels schedule, queue.
SCHEDULE_FAMILIES: dict[str, str] = {
    "next_run_timestamp_seconds": "When the schedule's next tick is due (Unix time).",
    "last_run_timestamp_seconds": "The instant of the latest tick that ran (Unix time).",
    "last_run_succeeded": "1 if the latest tick that ran was acknowledged, 0 if it failed.",
    "paused": "1 if the schedule is paused.",
}


def _schedule_families() -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from django_delayqueue.monitoring.recurrences import configured_statuses

    families = {
        name: GaugeMetricFamily(f"delayqueue_schedule_{name}", text, labels=["schedule", "queue"])
        for name, text in SCHEDULE_FAMILIES.items()
    }
    for s in configured_statuses():
        labels = [s.name, s.queue]
        families["paused"].add_metric(labels, 1 if s.paused else 0)
        if s.error:
            continue
        if s.next_run_ms is not None:
            families["next_run_timestamp_seconds"].add_metric(labels, s.next_run_ms / 1000)
        if s.last_tick_ms is not None:
            families["last_run_timestamp_seconds"].add_metric(labels, s.last_tick_ms / 1000)
            families["last_run_succeeded"].add_metric(labels, 1 if s.last_outcome == "ack" else 0)
    yield from families.values()


# Each Redis server the app writes to: name (after "delayqueue_redis_") -> help text; label
# server (host:port), and policy for "evicts".
SERVER_FAMILIES: dict[str, str] = {
    "up": "1 if the server's INFO could be read.",
    "used_memory_bytes": "Memory the server uses (INFO used_memory).",
    "maxmemory_bytes": "The server's maxmemory (0: no limit).",
    "evicts": "1 if the server's maxmemory-policy deletes keys (messages) when memory is full.",
    "persistent": "1 if the server keeps its data on disk (AOF or RDB snapshots); absent: unknown.",
}


def _server_families(down: str | None = None) -> Iterator[Any]:
    """``down``: why Redis does not answer (then every server reads as down, unasked)."""
    from prometheus_client.core import GaugeMetricFamily

    from django_delayqueue.monitoring.servers import app_servers, unreachable_servers

    families = {
        name: GaugeMetricFamily(
            f"delayqueue_redis_{name}",
            text,
            labels=["server", "policy"] if name == "evicts" else ["server"],
        )
        for name, text in SERVER_FAMILIES.items()
    }
    for s in app_servers() if down is None else unreachable_servers(down):
        families["up"].add_metric([s.address], 1 if s.ok else 0)
        if not s.ok:
            continue
        if s.used_memory is not None:
            families["used_memory_bytes"].add_metric([s.address], s.used_memory)
        if s.maxmemory is not None:
            families["maxmemory_bytes"].add_metric([s.address], s.maxmemory)
        if s.policy is not None:
            families["evicts"].add_metric([s.address, s.policy], 1 if s.evicts else 0)
        if s.persistent is not None:
            families["persistent"].add_metric([s.address], 1 if s.persistent else 0)
    yield from families.values()


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text exposition of every queue's stats (501 without prometheus-client;
    401 without the ``MONITORING_TOKEN``, when one is set: monitoring.access)."""
    if access(request) in (Access.ANONYMOUS, Access.REFUSED):
        return refused("metrics/")
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError:
        return HttpResponse(MISSING, status=501, content_type="text/plain; charset=utf-8")
    # A private registry: the process's default one may hold the site's own metrics, and
    # registering there twice (tests, reloads) would raise.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector())
    with monitoring_reads():  # Redis reads with the endpoints' own deadline
        text = generate_latest(registry)
    response = HttpResponse(text, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
