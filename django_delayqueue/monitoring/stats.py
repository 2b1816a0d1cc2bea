"""The one stats function behind the admin page, ``queuestats``, the metrics and the health check.

:func:`collect` reads every configured queue in one Redis round trip: per queue the core's
``counts.lua`` (the size of each state, how late the oldest due message is) and ``stats.lua``
(live consumers from the heartbeat zset, the settings published to Redis, and delivery totals).

Delivery totals come from the journal stream the consumers append to: ``stats.lua`` tallies
the entries added since the last call into a small hash (a cursor plus one counter per
outcome), so a call reads only the new entries, at most ``JOURNAL_BATCH`` of them (the rest
next time), and every process sees the same monotonic totals. Entries trimmed from the capped
journal before any call tallied them are not counted; with the default cap (100,000 batches)
that takes a long time without a scrape, the admin page or ``queuestats``.

Nothing here raises because Redis is down: values that could not be read are ``None`` and
``error`` says why, so a page or a probe can still render.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import redis

from django_delayqueue.conf.connection import get_client, monitoring_timeout
from django_delayqueue.conf.queues import configured, shard_queues
from django_delayqueue.conf.settings import dq_settings, envelope_format, file_queue_settings
from django_delayqueue.core import STATES, ConfigurationError, DelayQueueError, Queue, QueueSettings
from django_delayqueue.core.envelope import ENVELOPE_FORMAT, ms_to_datetime, to_str
from django_delayqueue.core.inspection import counts_and_activity
from django_delayqueue.monitoring.busiest_keys import (
    TOP,
    BusiestKeys,
    merge_busiest,
    read_busiest,
)
from django_delayqueue.monitoring.flow import FlowStats, merge_flow, read_flow
from django_delayqueue.monitoring.formats import (
    MOST_ENTRIES,
    EnvelopeFormats,
    merge_formats,
    read_formats,
)
from django_delayqueue.monitoring.lateness import LatenessStats, merge_lateness, read_lateness
from django_delayqueue.monitoring.processes import (
    ConsumerProcess,
    RunningNow,
    merge_processes,
    read_processes,
    supervisors_dict,
)
from django_delayqueue.monitoring.start_failures import read_start_failures

logger = logging.getLogger(__name__)

OUTCOMES = ("ack", "retry", "garbage")
JOURNAL_BATCH = 2000  # journal entries (consumer batches) tallied per queue per call
MAX_CONSUMERS_LISTED = 50
DEFAULT_ALIVE_SECONDS = 30.0  # consumers heartbeat every ~5 s


@dataclass(frozen=True)
class QueueStats:
    """What one queue looks like right now. ``None`` means "could not be read"."""

    queue: str
    now_ms: int
    counts: dict[str, int | None]
    oldest_overdue_ms: int | None = None  # how late the oldest due message is; None: none is
    next_due_ms: int | None = None  # earliest pending/retry time still to come (or overdue)
    # How many due messages no consumer has started (see overdue_count); None: not read.
    overdue_messages: int | None = None
    paused: bool | None = None
    consumers_alive: int | None = None
    consumers: list[tuple[str, int]] = field(default_factory=list)  # (name, last seen ms)
    outcomes: dict[str, int] | None = None  # deliveries per outcome since the tally began
    # Of the acks, the deliveries an atomic queue found already done and did not run again
    # (docs/exactly-once.md); None: not read.
    already_done: int | None = None
    errors: list[str] = field(default_factory=list)
    # The live consumers with what their heartbeats said (pid, supervisor, what runs now).
    processes: list[ConsumerProcess] = field(default_factory=list)
    # Flow control (docs/flow-control.md): the limits, what they do now.
    flow: FlowStats = field(default_factory=lambda: FlowStats())
    # How late handlers start (core.timings via monitoring.lateness); None: not read.
    lateness: LatenessStats | None = None
    # The flow keys with the most ready and in-flight messages (None: could not be read).
    busiest_keys: BusiestKeys | None = None
    # Messages waiting for a newer consumer, live consumers older than this process (None:
    # could not be read): docs/upgrades.md.
    formats: EnvelopeFormats | None = None
    # "consumers keep dying at start: <error>", one per supervisor whose children do
    # (monitoring.start_failures).
    start_failures: list[str] = field(default_factory=list)

    @property
    def running(self) -> list[RunningNow]:
        """The messages the live consumers run now, longest running first."""
        return sorted((r for p in self.processes for r in p.running), key=lambda r: r.started_ms)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def error(self) -> str:
        return "; ".join(self.errors)

    @property
    def oldest_overdue_seconds(self) -> float | None:
        return None if self.oldest_overdue_ms is None else self.oldest_overdue_ms / 1000

    @property
    def next_due_at(self) -> datetime | None:
        return None if self.next_due_ms is None else ms_to_datetime(self.next_due_ms)

    @property
    def deliveries(self) -> int | None:
        """Handler runs counted in the journal (every outcome)."""
        return None if self.outcomes is None else sum(self.outcomes.values())

    @property
    def failures(self) -> int | None:
        """Handler runs that did not acknowledge (retried or sent to garbage)."""
        return None if self.outcomes is None else self.outcomes["retry"] + self.outcomes["garbage"]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``queuestats --json``, the health check)."""
        return {
            "queue": self.queue,
            "counts": dict(self.counts),
            "oldest_overdue_seconds": self.oldest_overdue_seconds,
            "overdue_messages": self.overdue_messages,
            "next_due_at": self.next_due_at.isoformat() if self.next_due_at else None,
            "paused": self.paused,
            "consumers_alive": self.consumers_alive,
            "consumers": self._consumers_dicts(),
            "supervisors": supervisors_dict(self.processes),
            "deliveries": self.deliveries,
            "failures": self.failures,
            "outcomes": dict(self.outcomes) if self.outcomes is not None else None,
            "already_done": self.already_done,
            "flow": self.flow.to_dict(),
            "lateness": self.lateness.to_dict() if self.lateness is not None else None,
            "busiest_keys": None if self.busiest_keys is None else self.busiest_keys.to_dict(),
            "envelope_formats": None if self.formats is None else self.formats.to_dict(),
            "start_failures": list(self.start_failures),
            "errors": list(self.errors),
        }

    def _consumers_dicts(self) -> list[dict[str, Any]]:
        details = {p.name: p for p in self.processes}
        return [
            details[name].to_dict(self.now_ms)
            if name in details
            else {"name": name, "last_seen_seconds_ago": max(0, self.now_ms - seen) / 1000}
            for name, seen in self.consumers
        ]


def gather(
    queues: Sequence[Queue],
    *,
    now_ms: int | None = None,
    alive_seconds: float = DEFAULT_ALIVE_SECONDS,
    journal_batch: int = JOURNAL_BATCH,
    format: int = ENVELOPE_FORMAT,
) -> list[QueueStats]:
    """Stats of ``queues`` (which share one client) in one pipeline. Django-free; never raises
    for Redis errors. ``format``: the envelope format this process writes at most, the one
    the live consumers are compared with (monitoring.formats)."""
    if not queues:
        return []
    now = queues[0].clock.now_ms() if now_ms is None else now_ms
    alive_since = now - int(alive_seconds * 1000)
    try:
        replies = counts_and_activity(
            queues,
            alive_since,
            journal_batch,
            MAX_CONSUMERS_LISTED,
            now_ms=now,
            busiest_top=TOP,
            most_newer=MOST_ENTRIES,
        )
    except DelayQueueError as e:
        logger.warning("queue stats unavailable: %s", e)
        return [_unreadable(q.name, now, str(e), q.settings.paused) for q in queues]
    read = [
        _with_overdue(_with_busiest(_read(q, counts, stats, flow, timings, now), busiest), overdue)
        for q, (counts, stats, flow, timings, busiest, _, overdue) in zip(
            queues, replies, strict=True
        )
    ]
    processes = read_processes(queues, [s.consumers for s in read])
    out = []
    for s, p, reply in zip(read, processes, replies, strict=True):
        newer = reply[5]
        if isinstance(newer, Exception):
            s = replace(s, errors=[*s.errors, f"envelope formats: {newer}"])
        announced = {c.name: c.reads_format for c in p}
        formats = read_formats(format, newer, s.consumers, announced)
        out.append(replace(s, processes=p, formats=formats))
    return out


def _with_busiest(stats: QueueStats, raw: Any) -> QueueStats:
    if isinstance(raw, Exception):
        return replace(stats, errors=[*stats.errors, f"busiest keys: {raw}"])
    return replace(stats, busiest_keys=read_busiest(raw))


def _with_overdue(stats: QueueStats, raw: Any) -> QueueStats:
    if isinstance(raw, Exception):
        return replace(stats, errors=[*stats.errors, f"overdue: {raw}"])
    due_pending, due_retry, keyed_free = (int(x) for x in raw)
    count = overdue_count(stats, due_pending, due_retry, keyed_free)
    return replace(stats, overdue_messages=count)


def overdue_count(
    stats: QueueStats, due_pending: int, due_retry: int, keyed_free: int
) -> int | None:
    """How many due messages no consumer has started: the pending and retrying ones whose time
    has come (a consumer's round moves them to ready within milliseconds; while no consumer
    runs they stay there) and the ready ones, less those that wait on purpose, by the oldest
    overdue's rule: all of them behind a limit that holds the queue (rate, in flight); of the
    keyed ones, those their key's slot or token holds back (``keyed_free``, overdue.lua: the
    keyed ready messages their key's limits let go now; all of them without key limits).
    None when the counts could not be read."""
    ready = stats.counts["ready"]
    if ready is None:
        return None
    keyed = stats.flow.waiting_on_keys or 0
    waiting = 0 if stats.flow.holds_queue else max(0, ready - keyed) + min(keyed, keyed_free)
    return due_pending + due_retry + waiting


def _unreadable(name: str, now: int, error: str, paused: bool | None = None) -> QueueStats:
    return QueueStats(name, now, dict.fromkeys(STATES), paused=paused, errors=[error])


def _read(
    q: Queue, counts_raw: Any, stats_raw: Any, flow_raw: Any, timings_raw: Any, now: int
) -> QueueStats:
    values: dict[str, Any] = {"counts": dict.fromkeys(STATES), "paused": q.settings.paused}
    errors: list[str] = []
    published: dict[str, str] = {}
    if isinstance(counts_raw, Exception):
        errors.append(f"counts: {counts_raw}")
    else:
        snapshot = q.snapshot_result(counts_raw, now)
        values.update(
            counts=snapshot.counts,
            oldest_overdue_ms=snapshot.oldest_overdue_ms,
            next_due_ms=snapshot.next_due_ms,
        )
    if isinstance(stats_raw, Exception):
        errors.append(f"stats: {stats_raw}")
    else:
        ack, retry, garbage, more, alive, consumers, config, *later = stats_raw
        if int(more):
            logger.info("queue %s: journal tally is catching up", q.name)
        pairs = [
            (to_str(consumers[i]), int(float(consumers[i + 1])))
            for i in range(0, len(consumers), 2)
        ]
        published = {to_str(config[i]): to_str(config[i + 1]) for i in range(0, len(config), 2)}
        paused = published_paused(published)
        values.update(
            outcomes=dict(zip(OUTCOMES, (int(ack), int(retry), int(garbage)), strict=True)),
            already_done=int(later[0]) if later else 0,
            consumers_alive=int(alive),
            consumers=pairs,
            paused=q.settings.paused if paused is None else paused,
        )
    if isinstance(flow_raw, Exception):
        errors.append(f"flow limits: {flow_raw}")
        flow_raw = None
    if isinstance(timings_raw, Exception):
        errors.append(f"timings: {timings_raw}")
    else:
        values["lateness"] = read_lateness(timings_raw, published, q.settings.lateness_warning_ms)
    keyed = None
    if not isinstance(counts_raw, Exception) and len(counts_raw) > 8:
        keyed = int(counts_raw[8])
    ready = values["counts"]["ready"]
    flow = values["flow"] = read_flow(q.settings, published, flow_raw, ready, keyed)
    if flow.holds_queue and not isinstance(counts_raw, Exception):
        # Ready messages held back by a flow limit wait on purpose, as the site asked: not
        # late (they are counted in flow.waiting and flow.throttled). Late is only what no
        # consumer moved to ready in time. (Those a key's limits hold counts.lua left out.)
        values["oldest_overdue_ms"] = overdue_without_ready(counts_raw, now)
    return QueueStats(q.name, now, errors=errors, **values)


def overdue_without_ready(counts_raw: Sequence[Any], now: int) -> int | None:
    """How late the oldest due pending or retrying message is (counts.lua's reply), leaving
    out the ready ones."""
    heads = [int(counts_raw[5]), int(counts_raw[6])]  # earliest pending due, retry-at
    overdue = [t for t in heads if 0 <= t <= now]
    return now - min(overdue) if overdue else None


def published_paused(config: dict[str, str]) -> bool | None:
    """The paused flag in a queue's published settings hash, or None when it has none."""
    value = config.get("paused")
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def collect(queue_names: Iterable[str] | None = None) -> list[QueueStats]:
    """Stats of the configured queues (or of ``queue_names``), in settings order.

    Raises :class:`~django_delayqueue.core.ConfigurationError` for a name that is not a
    configured queue; Redis errors never raise (see :class:`QueueStats`).
    """
    queues: list[list[Any]] = []
    unreadable: dict[int, QueueStats] = {}  # position -> a queue whose keys cannot be named
    for name in configured(queue_names):
        # Not get_queue: it re-reads each queue's published settings (a round trip per
        # queue); stats.lua reads them in the one pipeline. The file settings are only the
        # fallback for the paused flag when nothing is published.
        try:
            settings = file_queue_settings(name)
        except ConfigurationError:  # reported by the system checks
            settings = QueueSettings()
        try:
            queues.append(shard_queues(name, settings))
            continue
        except ConfigurationError:  # a bad "shards" (reported by the checks): read it unsharded
            pass
        try:
            queues.append(shard_queues(name, settings, count=1))
        except ConfigurationError as e:  # a name no key can hold (E004): this queue alone
            unreadable[len(queues) + len(unreadable)] = QueueStats(
                queue=name, now_ms=0, counts=dict.fromkeys(STATES), errors=[str(e)]
            )
    # One pipeline over every queue and shard (a round trip per Redis node); a sharded
    # queue's stats are its shards' added up.
    flat = gather(
        [q for shards in queues for q in shards],
        alive_seconds=consumer_alive_seconds(),
        format=envelope_format(),
    )
    merged, start = [], 0
    for shards in queues:
        parts = flat[start : start + len(shards)]
        start += len(shards)
        merged.append(parts[0] if len(parts) == 1 else merge_stats(parts))
    for position, stats in sorted(unreadable.items()):
        merged.insert(position, stats)
    return _with_start_failures(merged)


def _with_start_failures(all_stats: list[QueueStats]) -> list[QueueStats]:
    """Each queue's stats with what the supervisors publish of children dying at start."""
    if not all_stats:
        return all_stats
    try:
        # Wall time, as the supervisors stamp their entries (a stale one is minutes old).
        now = int(time.time() * 1000)
        failures = read_start_failures(get_client(), str(dq_settings.PREFIX), now)
    except (redis.RedisError, DelayQueueError, OSError) as e:
        logger.debug("start failures not read: %s", e)
        return all_stats
    if not failures:
        return all_stats
    return [
        replace(s, start_failures=[f.message for f in failures if f.covers(s.queue)])
        for s in all_stats
    ]


def merge_stats(parts: Sequence[QueueStats]) -> QueueStats:
    """A sharded queue's stats from its shards': counts and outcomes added up, the oldest
    overdue and the nearest due time over all of them, its consumers (each heartbeats on every
    shard it claims from) by name."""

    def added(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v or 0 for v in values)

    overdue = [p.oldest_overdue_ms for p in parts if p.oldest_overdue_ms is not None]
    overdue_messages = added([p.overdue_messages for p in parts])
    upcoming = [p.next_due_ms for p in parts if p.next_due_ms is not None]
    seen: dict[str, int] = {}
    for p in parts:
        for name, last in p.consumers:
            seen[name] = max(last, seen.get(name, last))
    alive = [p.consumers_alive for p in parts if p.consumers_alive is not None]
    lateness = [p.lateness for p in parts if p.lateness is not None]
    formats = [p.formats for p in parts if p.formats is not None]
    outcomes: dict[str, int] | None = None
    if all(p.outcomes is not None for p in parts):
        outcomes = {}
        for p in parts:
            for key, value in (p.outcomes or {}).items():
                outcomes[key] = outcomes.get(key, 0) + value
    return QueueStats(
        parts[0].queue.split("#", 1)[0],
        parts[0].now_ms,
        {state: added([p.counts[state] for p in parts]) for state in STATES},
        max(overdue) if overdue else None,
        min(upcoming) if upcoming else None,
        overdue_messages=overdue_messages,
        paused=parts[0].paused,
        consumers_alive=max(alive) if alive else None,
        consumers=sorted(seen.items(), key=lambda item: -item[1]),
        processes=merge_processes([p.processes for p in parts]),
        outcomes=outcomes,
        already_done=added([p.already_done for p in parts]),
        errors=[f"{p.queue}: {e}" for p in parts for e in p.errors],
        flow=merge_flow([p.flow for p in parts]),
        lateness=merge_lateness(lateness) if len(lateness) == len(parts) else None,
        busiest_keys=merge_busiest([p.busiest_keys for p in parts]),
        formats=merge_formats(formats) if len(formats) == len(parts) else None,
    )


def redis_unreachable() -> list[str]:
    """What keeps Redis from answering a PING, in words (empty: it answers). The monitoring
    endpoints ask this first: when Redis is down, every further read would wait out its
    timeout again, and the stats would say no consumer had a heartbeat."""
    try:
        get_client().ping()
    except redis.TimeoutError:
        return [f"Redis unreachable: no reply within {format_seconds(monitoring_timeout())}"]
    except Exception as e:  # any failure to answer is "not reachable"
        return [f"Redis unreachable: {e}"]
    return []


def unreachable_stats(error: str) -> list[QueueStats]:
    """The configured queues' stats when Redis does not answer: nothing read, ``error`` said
    (no read of Redis: the queue names come from the settings)."""
    try:
        names = configured()
    except ConfigurationError:  # reported by the system checks
        names = []
    return [_unreadable(name, 0, error) for name in names]


def consumer_alive_seconds() -> float:
    """How recent a heartbeat must be for its consumer to count as alive."""
    value = setting("HEALTH_CONSUMER_SECONDS", DEFAULT_ALIVE_SECONDS)
    return DEFAULT_ALIVE_SECONDS if value is None else value


def setting(name: str, default: float | None) -> float | None:
    """A numeric ``DELAYQUEUE`` setting of the monitoring side (None: turned off)."""
    try:
        value = getattr(dq_settings, name)
    except AttributeError:  # a key conf.DEFAULTS does not list
        value = dq_settings.user_settings.get(name, default)
    return None if value is None else float(value)


def format_seconds(seconds: float | None) -> str:
    """A short human duration ("950 ms", "42 s", "3 min 12 s", "2 h 5 min", "3 d 4 h")."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    whole = int(seconds)
    for unit, size, sub_unit, sub_size in (
        ("d", 86_400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            major, rest = divmod(whole, size)
            minor = rest // sub_size
            return f"{major} {unit} {minor} {sub_unit}" if minor else f"{major} {unit}"
    return f"{whole} s"
