"""Every Redis key of a queue, spelled in one place.

All keys of one queue share the hash tag ``{<prefix>:<queue>}`` so that Redis Cluster keeps
them in one slot and every Lua script can touch them atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Spelled in core/names.py (what a queue name and a key prefix may hold), imported from here
# by the rest of the package as before.
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.names import validate_name, validate_prefix

# The five states of a message. Shown in the admin as Pending, Ready, In flight, Retrying and
# Dead letters; everywhere else (settings, stats, metrics, docs) by these names.
State = Literal["pending", "ready", "unack", "retry", "garbage"]
STATES: tuple[State, ...] = ("pending", "ready", "unack", "retry", "garbage")
# The field of the cancelled hash that sums its counts; never an id (ids have no edge spaces).
TOMBSTONE_TOTAL = " total"


def published_recurrences_key(prefix: str) -> str:
    """Hash: the recurring schedules published for every runqueue of the site
    (django_delayqueue.mirror.recurrences), and with ``:lock`` its publish lock. No queue
    key ends in ":recurring" or ":recurring:lock", so neither is a queue's key, whatever the
    two prefixes."""
    return f"{{{validate_prefix(prefix)}}}:recurring"


def start_failures_key(prefix: str) -> str:
    """Hash: supervisor name -> JSON of why its consumer processes keep dying before they
    consume (django_delayqueue.supervisor.start_failures), read by the stats. No queue key
    ends in ":start-failures"."""
    return f"{{{validate_prefix(prefix)}}}:start-failures"


# Shards of one queue: 1 to this many (core.sharding).
MAX_SHARDS = 1024


@dataclass(frozen=True)
class QueueKeys:
    """The key names of one queue, or of shard ``shard`` of a sharded queue.

    A shard's keys carry ``#<shard>`` in their hash tag, so each shard is a slot of its own
    (and, on a cluster, may live on another master), and no queue name can clash with it
    (names never contain ``#``).
    """

    prefix: str
    queue: str
    shard: int | None = None

    def __post_init__(self) -> None:
        validate_prefix(self.prefix)
        validate_name(self.queue, "queue name")
        if self.shard is not None and not (
            isinstance(self.shard, int) and 0 <= self.shard < MAX_SHARDS
        ):
            raise ConfigurationError(f"shard must be 0 to {MAX_SHARDS - 1}, not {self.shard!r}")

    @property
    def tag(self) -> str:
        if self.shard is None:
            return f"{{{self.prefix}:{self.queue}}}"
        return f"{{{self.prefix}:{self.queue}#{self.shard}}}"

    def _key(self, suffix: str) -> str:
        return f"{self.tag}:{suffix}"

    # The five states of a message.
    @property
    def pending(self) -> str:  # zset: id -> due time (ms)
        return self._key("pending")

    @property
    def ready(self) -> str:  # list of ids, oldest first
        return self._key("ready")

    @property
    def unack(self) -> str:  # zset: id -> visibility deadline (ms)
        return self._key("unack")

    @property
    def retry(self) -> str:  # zset: id -> retry-at (ms)
        return self._key("retry")

    @property
    def garbage(self) -> str:  # zset: id -> time it died (ms)
        return self._key("garbage")

    # Data about messages, keyed by id.
    @property
    def messages(self) -> str:  # hash: id -> JSON envelope
        return self._key("messages")

    @property
    def attempts(self) -> str:  # hash: id -> deliveries so far
        return self._key("attempts")

    @property
    def tokens(self) -> str:  # hash: id -> token of the delivery allowed to ack/nack
        return self._key("tokens")

    @property
    def reasons(self) -> str:  # hash: id -> why it died (garbage) or last error (retry)
        return self._key("reasons")

    @property
    def cancelled(self) -> str:
        """Hash: id -> how many of its entries in the ready list are dead (cancelled there).

        Removing an id from the middle of a list is a scan of the list, so cancel leaves it in
        place and counts it here; claim drops such an entry, and counts and peek skip it. A
        dead entry of an id always comes before the id's live entry (anything entering ready
        is pushed behind it), so the first ``n`` entries of an id from the head are its dead
        ones. The field ``TOMBSTONE_TOTAL`` holds the sum, for the ready count.
        """
        return self._key("cancelled")

    @property
    def ready_since(self) -> str:
        """Hash: id -> when (ms) a message came back to ready, if not at its envelope's due time.

        Written by the rarer ways into ready (a retry promoted, run now, requeue, release of a
        redelivery) and cleared when the message leaves ready, so that how overdue the ready
        head is counts from then, not from a due time it was delivered at before.
        """
        return self._key("ready_since")

    @property
    def priorities(self) -> str:
        """Hash: id -> priority (-100..100) of a message that has one other than 0.

        Given by a task's enqueue (``enqueue_task.lua``) and kept until the message is
        acknowledged, cancelled, replaced or purged, through its retries and dead letter.
        """
        return self._key("priorities")

    @property
    def ranked(self) -> str:
        """Zset: the ready messages that have a priority, highest first (see ready_list.lua).

        Score ``(100 - priority) * 2**43 + when it entered ready (ms)``. A claim takes those
        above priority 0 first, then the ready list (priority 0), then those below 0: a ready
        message is in exactly one of the list and this zset.
        """
        return self._key("ranked")

    def priority_keys(self) -> tuple[str, str]:
        """The ranked zset and the priorities hash: what a script putting ids in ready needs."""
        return (self.ranked, self.priorities)

    @property
    def limiter(self) -> str:
        """Hash: the flow control state of the queue (of this shard, with its share of the
        limits): the rate limit's GCRA time, whether and why messages wait on a limit, how
        many were throttled, how many started lately (lua/includes/flow_limits.lua)."""
        return self._key("limiter")

    @property
    def flow_keys(self) -> str:
        """Hash: id -> flow key of a message scheduled with ``key=`` (docs/flow-control.md,
        "Keys"); no field for a message without one.

        Written with the message by every script that stores one (from the key in its envelope,
        see lua/includes/flow_keys.lua) and deleted with it wherever a message is deleted (ack,
        cancel, purge, replace, a successor taking its place). Kept through retries and the
        dead letters, like the envelope. Empty (one HLEN of 0) on a queue without keyed
        messages: what lets the key limits cost such a queue nothing.
        """
        return self._key("flow_keys")

    # Keyed ready messages and their turns (lua/includes/key_turns.lua says how they are used).
    @property
    def key_turns(self) -> str:
        """Zset: flow key -> turn, the keys whose ready messages claims take turns from."""
        return self._key("key_turns")

    @property
    def key_waiting(self) -> str:
        """Zset: flow key -> when (ms) its next token of ``key_rate_limit`` comes, for keys with
        ready messages waiting for it."""
        return self._key("key_waiting")

    @property
    def key_state(self) -> str:
        """Hash: per flow key, how many of its messages are in flight (``c:<key>``); per id in
        flight, its key (``i:<id>``); the rotation's last turn, the keyed ready count and the
        unkeyed list's turn (fields starting with a space)."""
        return self._key("key_state")

    @property
    def key_tats(self) -> str:
        """Zset: flow key -> its ``key_rate_limit`` GCRA time (ms), while that is ahead."""
        return self._key("key_tats")

    @property
    def key_lists(self) -> str:
        """Not a key: the prefix of the per-key ready lists, ``<prefix><flow key>``."""
        return self._key("key:")

    @property
    def key_load(self) -> str:
        """Zset: flow key -> its messages ready plus in flight, for an exact top of the busiest
        keys at any number of keys; a key leaves it at 0 (lua/includes/key_turns.lua)."""
        return self._key("key_load")

    def key_list(self, flow_key: str) -> str:
        """List: the ready messages of one flow key, oldest first."""
        return self.key_lists + flow_key

    @property
    def newer(self) -> str:
        """Hash: id -> "<format> <times>" of a message whose envelope is of a format a consumer
        did not read (a newer release's), left by it for a consumer that reads it (defer.lua),
        and how many times it was left so.

        Read by the stats ("3 messages wait for a newer consumer": newer_waiting.lua, which
        also forgets the entries of messages that are gone). Nothing else writes it: a
        queue whose envelopes every consumer reads never has it.
        """
        return self._key("newer")

    @property
    def successors(self) -> str:
        """Hash: id -> envelope of the message booked to follow the id's running delivery.

        ``schedule(..., replace=True)`` of an id in flight stores the new message here; the
        delivery's ack (or its death) makes it the id's message. Not a state of its own: it is
        not counted, and cancel of the id removes it.
        """
        return self._key("successors")

    @property
    def aborts(self) -> str:
        """Hash: id -> "<token> <reason>" of an in-flight delivery someone aborted (dq.abort).

        Written by abort.lua only while the message is in unack; removed when the delivery
        ends (ack, nack, reap, release), and each of those that would retry it sends it to
        the dead letters instead: an aborted message is never retried by itself.
        """
        return self._key("aborts")

    @property
    def progress(self) -> str:
        """Hash: id -> JSON of the progress its running delivery reported (``message.progress``,
        ``dq.progress``): percent, note and when (core/progress.py).

        Written by progress.lua only for the delivery holding the message's current token while
        it is in unack; every script that takes a message out of unack (ack, nack, reap,
        release) removes its entry, and cancel and purge too: progress ends with its delivery.
        """
        return self._key("progress")

    @property
    def sent(self) -> str:
        """Zset: send token -> when (ms) it was sent, for the transactional outbox.

        ``Queue.send_once`` stores a message only if its token is not here (see send_once.lua):
        an outbox row sent a second time creates nothing. Tokens are forgotten after an hour
        (``SEND_TOKEN_MEMORY_MS``).
        """
        return self._key("sent")

    @property
    def unique(self) -> str:
        """Zset: id -> end (ms) of the uniqueness window its last schedule with ``unique_for``
        opened; a schedule with ``unique_for`` of an id whose window is open is refused.

        Read and written only by schedules that ask for a window (schedule_unique.lua,
        send_once.lua); each one that opens windows forgets up to twice as many that are over.
        """
        return self._key("unique")

    @property
    def replicated(self) -> str:
        """Counter written before each ``WAIT`` of ``MIN_REPLICAS`` (core.replication): a
        replica that has it has every write of the queue that returned before it."""
        return self._key("replicated")

    @property
    def seq(self) -> str:  # counter handing out delivery tokens
        return self._key("seq")

    @property
    def journal(self) -> str:  # capped stream of delivery outcomes
        return self._key("journal")

    @property
    def tally(self) -> str:  # hash: journal cursor + deliveries per outcome (stats.lua)
        return self._key("tally")

    @property
    def exported(self) -> str:  # hash: export destination URI -> newest journal entry id there
        return self._key("exported")

    @property
    def timings(self) -> str:
        """Hash: delivery timings since the queue began, summed over its consumers (bucket
        counts of start lateness, handler duration and limit wait, their sums, outcome counts:
        core.timings). Only ever incremented, never expiring: what Prometheus reads as
        counters. Its fields are fixed, so it stays small."""
        return self._key("timings")

    def timings_minute(self, minute: int) -> str:
        """Hash: the same counts for one minute (``minute``: ms since the epoch // 60000),
        expiring a little over an hour later: what the admin's p50/p99 are read from."""
        return self._key(f"timings:{minute}")

    @property
    def config(self) -> str:  # hash: effective queue settings published by the Django layer
        return self._key("config")

    @property
    def heartbeats(self) -> str:  # zset: consumer name -> last seen (ms)
        return self._key("consumers")

    @property
    def consumer_details(self) -> str:
        """Hash: consumer name -> JSON of its process as its last heartbeat saw it (pid, host,
        supervisor, messages handled, memory, what it runs on this queue now); written with
        the heartbeat, removed with it (core.consumer.rounds.details)."""
        return self._key("consumer_details")

    def claim_receipt(self, consumer: str) -> str:
        """String: the last claim of consumer instance ``consumer`` that took messages, its
        claim id and what it took (claim.lua), so that a claim whose reply was lost can be
        asked for again. Expires with the claimed messages' visibility deadline."""
        return self._key(f"claimed:{consumer}")

    def task_result(self, message_id: str) -> str:
        """Hash: the result record of the task whose message is ``message_id``.

        Written with its message by enqueue_task.lua; kept while the task may still run, and
        for the backend's ``RESULT_TTL`` once it finished (django_delayqueue.tasks).
        """
        return self._key(f"task:{message_id}")

    @property
    def recurrence_states(self) -> str:
        """Hash: recurring schedule name -> "<cursor ms> <signature>": the latest tick created
        for it on this queue and the definition it followed (advance_recurrence.lua).

        The key keeps its first name, ``schedules``: existing deployments hold states there."""
        return self._key("schedules")

    @property
    def ticks(self) -> str:
        """Zset: tick message id -> instant (ms), for ticks not yet due: what an edit or a
        deletion of their schedule withdraws."""
        return self._key("ticks")

    @property
    def tick_runs(self) -> str:
        """Hash: recurring schedule name -> JSON of its latest delivered tick (record_tick.lua)."""
        return self._key("tick_runs")

    @property
    def wake_channel(self) -> str:
        """Pub/sub channel on which producers wake sleeping consumers (not a key)."""
        return self._key("wake")

    def all_keys(self) -> list[str]:
        return [
            self.pending,
            self.ready,
            self.unack,
            self.retry,
            self.garbage,
            self.messages,
            self.attempts,
            self.tokens,
            self.reasons,
            self.seq,
            self.journal,
            self.tally,
            self.config,
            self.heartbeats,
            self.consumer_details,
            self.cancelled,
            self.ready_since,
            self.successors,
            self.exported,
            self.priorities,
            self.ranked,
            self.sent,
            self.aborts,
            self.progress,
            self.replicated,
            self.recurrence_states,
            self.ticks,
            self.tick_runs,
            self.limiter,
            self.unique,
            self.flow_keys,
            self.timings,
            self.key_turns,
            self.key_waiting,
            self.key_state,
            self.key_tats,
            self.key_load,
            self.newer,
        ]
