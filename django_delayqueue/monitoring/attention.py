"""What needs attention in a queue, in words: what the admin's overview and queue page say first.

Read from the stats alone (monitoring.stats: one round trip for every queue), each finding says
what holds and where to look:

- **consumers dying at start**: a supervisor's children die before they consume;
- **no consumer**: nothing delivers the queue (not paused), so due messages wait;
- **stalled**: handlers running past the queue's ``time_limit`` (each holds a handler slot);
- **overdue**: the oldest due message has waited a minute or more: consumers do not keep up;
- **late**: the p99 start lateness over 5 minutes is above ``lateness_warning_ms``;
- **dead letters growing**: messages died in the last 5 minutes (the consumers' minute counts);
- **held by a limit**: a flow limit holds ready messages back, as configured (a note, not a
  fault: it explains a backlog);
- **paused**: nothing is delivered until staff resume it.

Severity: "error" (work is not being done), "warning" (done, but worse than asked), "info".
"""

from __future__ import annotations

from dataclasses import dataclass

from django_delayqueue.monitoring.lateness import format_ms
from django_delayqueue.monitoring.processes import past_limit
from django_delayqueue.monitoring.stats import QueueStats, format_seconds

OVERDUE_SECONDS = 60.0  # the oldest due message waited this long: consumers do not keep up
SEVERITIES = ("error", "warning", "info")
HELD_BY = {"rate": "its rate limit", "in_flight": "its in-flight cap", "key": "its key limits"}


# What a finding says of several queues at once (the overview's grouped lines).
SAID_OF_MANY = {
    "dying": "have consumer processes that die at start: see why above.",
    "no-consumer": "have no live consumer: nothing delivers their messages (is runqueue running?).",
    "stalled": "have handlers running past their time limit: each holds a handler slot.",
    "overdue": "are behind: their oldest due messages have waited a minute or more.",
    "late": "start handlers late: p99 over the last 5 minutes above their lateness_warning_ms.",
    "dead-letters": "keep dead letters: requeue or purge them.",
    "held": "are held back by their flow limits, as configured.",
    "paused": "are paused: nothing is delivered until they are resumed.",
}
SAID_OF_MANY_GROWING = "have new dead letters in the last 5 minutes."


@dataclass(frozen=True)
class Finding:
    queue: str
    kind: str  # dying, no-consumer, stalled, overdue, late, dead-letters, held, paused
    severity: str  # one of SEVERITIES
    text: str  # a sentence that reads after the queue's name
    state: str | None = None  # the queue page's tab that shows what it is about


def findings(stats: QueueStats, time_limit: float | None = None) -> list[Finding]:
    """What needs attention in the queue ``stats`` describes, most severe first.
    ``time_limit``: the queue's (seconds; None: none), which says what is stalled."""
    s, out = stats, []
    waiting = sum(s.counts[state] or 0 for state in ("pending", "ready", "retry"))
    if s.start_failures:
        text = "has consumer processes that die at start: see why above."
        out.append(Finding(s.queue, "dying", "error", text))
    if s.consumers_alive == 0 and not s.paused:
        text = "has no live consumer: nothing would deliver its messages (is runqueue running?)."
        if waiting:
            text = (
                f"has no live consumer: nothing delivers its {_count(waiting, 'waiting message')} "
                "(is runqueue running?)."
            )
        out.append(Finding(s.queue, "no-consumer", "error" if waiting else "warning", text))
    stalled = past_limit(s.running, time_limit, s.now_ms) if time_limit else []
    if stalled:
        n = len(stalled)
        out.append(
            Finding(
                s.queue,
                "stalled",
                "error",
                f"has {_count(n, 'handler')} running past its time limit "
                f"({format_seconds(time_limit)}), stalled: each holds a handler slot.",
                "unack",
            )
        )
    overdue = s.oldest_overdue_seconds
    if overdue is not None and overdue >= OVERDUE_SECONDS:
        out.append(
            Finding(
                s.queue,
                "overdue",
                "error" if s.consumers_alive == 0 else "warning",
                f"is behind: its oldest due message has waited {format_seconds(overdue)}"
                + (
                    f" ({_count(s.overdue_messages, 'due message')} not started)."
                    if s.overdue_messages
                    else "."
                ),
                "pending",
            )
        )
    lateness = s.lateness
    if lateness is not None and lateness.flagged and lateness.p99_5m is not None:
        out.append(
            Finding(
                s.queue,
                "late",
                "warning",
                f"starts handlers late: p99 {format_ms(lateness.p99_5m)} over the last 5 minutes, "
                f"above its lateness_warning_ms ({format_ms(float(lateness.warning_ms or 0))}).",
            )
        )
    died = lateness.windows.last_5m.outcomes.get("dead", 0) if lateness is not None else 0
    dead = s.counts["garbage"] or 0
    if died and dead:
        out.append(
            Finding(
                s.queue,
                "dead-letters",
                "warning",
                f"has new dead letters: {died} in the last 5 minutes, {dead} in all.",
                "garbage",
            )
        )
    elif dead:
        out.append(
            Finding(
                s.queue,
                "dead-letters",
                "info",
                f"keeps {_count(dead, 'dead letter')}: requeue or purge them.",
                "garbage",
            )
        )
    flow = s.flow
    if flow.held and flow.waiting:
        out.append(
            Finding(
                s.queue,
                "held",
                "info",
                f"is held back by {HELD_BY.get(flow.held, 'a flow limit')}, as configured "
                f"({_count(flow.waiting, 'ready message')} waiting).",
                "ready",
            )
        )
    if s.paused:
        text = "is paused: nothing is delivered until it is resumed."
        out.append(Finding(s.queue, "paused", "info", text))
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


@dataclass(frozen=True)
class Group:
    """One kind of finding, in one severity, over one or more queues."""

    kind: str
    severity: str
    findings: list[Finding]

    @property
    def text(self) -> str:
        """What it says after the queues' names: a finding's own sentence when it is alone."""
        if len(self.findings) == 1:
            return self.findings[0].text
        if self.kind == "dead-letters" and self.severity == "warning":
            return SAID_OF_MANY_GROWING
        return SAID_OF_MANY[self.kind]


def grouped(found: list[Finding]) -> list[Group]:
    """``found`` by kind and severity (most severe first, then in order of appearance): one
    line for every queue without a consumer rather than a line per queue."""
    groups: dict[tuple[str, str], Group] = {}
    for f in found:
        group = groups.get((f.kind, f.severity))
        if group is None:
            group = groups[(f.kind, f.severity)] = Group(f.kind, f.severity, [])
        group.findings.append(f)
    return sorted(groups.values(), key=lambda g: SEVERITIES.index(g.severity))


def _count(n: int, noun: str) -> str:
    """ "1 dead letter", "3 dead letters"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
