"""What a schedule needs next, from its definition, its state in Redis and the time: a pure
function, so that every consumer computes the same plan and the tests can drive any clock.

The chain: the state's cursor is the latest tick created. Once it is due (and so being
delivered), the next tick is created, so a running schedule always has its next tick waiting.
Ticks whose instant passed before anyone could create them were missed (every consumer was
down): ``catch_up`` decides which of those run. A tick at most ``LATE_GRACE_MS`` old is only
late (a slow round, a failed call tried again), not missed: it is created whatever the policy.

A deleted schedule leaves a tombstone state (``DELETED``) with the version of the definitions
that deleted it, so a consumer a refresh behind, which still has the schedule, cannot bring it
back: the version check leaves the tombstone alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from django_delayqueue.core.recurring.recurrence import MAX_INSTANT_MS, Recurrence

LATE_GRACE_MS = 2000
PAUSED = "paused"
DELETED = "deleted"


@dataclass(frozen=True)
class RecurrenceState:
    """What advance_recurrence.lua keeps for a schedule on its queue."""

    cursor_ms: int  # the latest tick created (or, paused, when it was paused)
    signature: str  # the definition it followed; "paused:<sig>" while paused
    version: int = 0  # of the published definitions it followed (see plan_ticks)

    @classmethod
    def parse(cls, raw: str | bytes | None) -> RecurrenceState | None:
        if not raw:
            return None
        try:
            text = raw.decode() if isinstance(raw, bytes) else raw
            cursor, _, rest = text.partition(" ")
            signature, _, version = rest.partition(" ")
            state = cls(int(cursor), signature, int(version or 0))
        except ValueError:  # UnicodeDecodeError too
            return None  # unreadable: treated as new, and overwritten (see plan_ticks)
        # A cursor no schedule can reach (written by hand, or past an older release's bounds)
        # would be a tick waiting for ever: unreadable too.
        return state if 0 <= state.cursor_ms < MAX_INSTANT_MS else None

    def encode(self) -> str:
        return f"{self.cursor_ms} {self.signature} {self.version}"


@dataclass(frozen=True)
class TickPlan:
    """One call of advance_recurrence.lua: expected state, new state, ticks to create."""

    expected: str | bytes  # the state as read, byte for byte ("" for none)
    new_state: str
    withdraw: bool  # withdraw the schedule's future ticks first
    instants: tuple[int, ...]
    missed: int = 0  # ticks skipped by the catch-up policy (at least; a bounded look back)
    forget: bool = False  # the schedule is gone: its last run goes too
    drop: tuple[int, ...] = ()  # waiting ticks (instants) the catch-up policy skips
    missed_exact: bool = True  # False: ``missed`` is a lower bound (a long cron outage)


def signature_of(recurrence: Recurrence) -> str:
    sig = recurrence.signature()
    return f"{PAUSED}:{sig}" if recurrence.paused else sig


def plan_ticks(
    recurrence: Recurrence | None,
    raw_state: str | bytes | None,
    now_ms: int,
    version: int = 0,
    running_since_ms: int | None = None,
) -> TickPlan | None:
    """The call that brings the schedule up to date at ``now_ms``, or None if it is.

    ``recurrence`` None: the schedule was deleted (or moved to another queue), so its state and
    future ticks go. ``version`` is that of the definitions the caller holds: a state written
    under newer ones is left alone (this consumer has not refreshed yet), so two consumers a
    refresh apart never undo each other's edit.

    ``running_since_ms``: since when the caller has kept the schedules without a break. A tick
    due after that was not missed, however late this round is (a slow round, a short Redis
    blip): only ticks due before it, and before the late grace, meet the catch-up policy.
    """
    expected = raw_state or ""
    state = RecurrenceState.parse(raw_state)
    if state is not None and state.version > version:
        return None
    if recurrence is None:
        gone = state is not None and state.signature == DELETED
        if gone or (state is None and not expected):
            return None
        tombstone = RecurrenceState(0, DELETED, version).encode()
        return TickPlan(expected, tombstone, True, (), forget=True)
    signature = signature_of(recurrence)
    if state is None or state.signature != signature:
        # New, edited, paused or resumed: whatever was planned under another definition goes,
        # and the schedule starts from now (an edit does not catch up on the old definition).
        if recurrence.paused:
            return TickPlan(
                expected, RecurrenceState(now_ms, signature, version).encode(), True, ()
            )
        first = recurrence.next_after(now_ms)
        new = RecurrenceState(first, signature, version).encode()
        return TickPlan(expected, new, state is not None, (first,))
    if recurrence.paused or state.cursor_ms > now_ms:
        return None  # paused, or the next tick is waiting
    # The latest tick created (the cursor) is waiting too: if it came due long ago, no one ran
    # then, and it is a missed tick like those after it that were never created.
    limit = recurrence.catch_up_limit
    passed = recurrence.instants(state.cursor_ms, now_ms, limit + 2)
    cutoff = now_ms - LATE_GRACE_MS
    if running_since_ms is not None:
        cutoff = min(cutoff, running_since_ms)
    recent = [t for t in passed if t >= cutoff]
    old = [t for t in passed if t < cutoff]
    cursor_missed = state.cursor_ms < cutoff
    missed = [state.cursor_ms] if cursor_missed else []
    missed.extend(old)
    if recurrence.catch_up == "all":
        chosen = missed[-limit:]
    elif recurrence.catch_up == "latest" and not recent:
        chosen = missed[-1:]
    else:
        chosen = []
    # How many were skipped: exact for an interval; for cron, what the bounded look back saw.
    before = recurrence.count_between(state.cursor_ms, cutoff - 1)
    skipped = (before if before is not None else len(old)) + cursor_missed - len(chosen)
    drop = (state.cursor_ms,) if cursor_missed and state.cursor_ms not in chosen else ()
    following = recurrence.next_after(now_ms)
    create = tuple(t for t in chosen if t != state.cursor_ms)
    new = RecurrenceState(following, signature, state.version).encode()
    return TickPlan(
        expected,
        new,
        False,
        (*create, *recent, following),
        missed=skipped,
        drop=drop,
        missed_exact=before is not None or len(passed) < limit + 2,
    )


def forget_tombstone(raw_state: str | bytes | None, older_than_ms: int) -> TickPlan | None:
    """The call that removes a deletion's tombstone once it is old (written by definitions
    published before ``older_than_ms``: every consumer has refreshed since), or None."""
    state = RecurrenceState.parse(raw_state)
    if state is None or state.signature != DELETED or not 0 < state.version < older_than_ms:
        return None
    return TickPlan(raw_state or "", "", False, ())
