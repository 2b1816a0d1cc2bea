"""Every script's KEYS and ARGV, by name and in the order of its ``.lua`` header.

One declaration per file of ``lua/`` (names separated by spaces, as a namedtuple's fields; see
:class:`~.contract.Contract` for what a name means). tests/core/test_core_scripts_contracts.py
checks that each header says the same, name by name, and that no script is left without one.
Every script call is built from these.
"""

from __future__ import annotations

from django_delayqueue.core.scripts.contract import Contract

# What every script that stores a message reads first: where an id may already be.
_STATES = "pending ready messages unack retry garbage"
# What replace.lua (and send_once.lua, which may replace) clear of the message they replace.
_REPLACED = "attempts tokens reasons successors cancelled ready_since ranked priorities"
# Flow keys: the id -> key hash, and where keyed ready messages take turns (key_turns.lua).
_KEYED = "flow_keys key_turns key_waiting key_state key_tats key_lists key_load"
# What a purged message may still hold besides its state: its flow key, a leftover progress.
_PURGED_TOO = "flow_keys progress"
# The time, then when and where to announce a message due soon (includes/scheduling.lua).
_ANNOUNCE = "now_ms horizon_ms wake_channel"

# --- storing messages ------------------------------------------------------------------------
# The keyed keys come last (before a group): a message's key is read from its envelope.
SCHEDULE = Contract("schedule", keys=f"{_STATES} {_KEYED}", args=f"{_ANNOUNCE} *triples")
REPLACE = Contract("replace", keys=f"{_STATES} {_REPLACED} {_KEYED}", args=f"{_ANNOUNCE} *triples")
ENQUEUE_TASK = Contract(
    "enqueue_task",
    keys=f"{_STATES} record ranked priorities {_KEYED}",
    args=f"{_ANNOUNCE} id due_ms envelope enqueued priority",
)
SEND_ONCE = Contract(
    "send_once",
    keys=f"{_STATES} {_REPLACED} sent record unique {_KEYED}",
    args=f"{_ANNOUNCE} id due_ms envelope mode token remembered_ms enqueued priority unique_ms",
)
# Schedules with a uniqueness window (unique_for=): a script of their own, so that schedule.lua
# and replace.lua, every other producer's path, stay as lean as they were.
SCHEDULE_UNIQUE = Contract(
    "schedule_unique",
    keys=f"{_STATES} {_REPLACED} unique {_KEYED}",
    args=f"{_ANNOUNCE} mode *quadruples",
)

# --- the consumer's transitions ---------------------------------------------------------------
PROMOTE = Contract(
    "promote",
    keys=f"pending retry ready tokens ready_since ranked priorities {_KEYED}",
    args="now_ms limit",
)
CLAIM = Contract(
    "claim",
    keys="ready unack messages attempts tokens seq garbage reasons cancelled ready_since ranked "
    f"limiter newer {_KEYED} receipt",
    args="now_ms deadline_ms most_ids limits reads_format claim_id replay_only",
    optional="receipt claim_id replay_only",  # a consumer claims with them (rounds/claims)
)
ACK = Contract(
    "ack",
    keys="unack retry garbage messages attempts tokens reasons successors pending ready priorities "
    f"aborts {_KEYED} progress",
    args=f"{_ANNOUNCE} *pairs",
)
NACK = Contract(
    "nack",
    keys="unack retry garbage attempts tokens reasons successors messages pending ready priorities "
    f"aborts {_KEYED} progress",
    args="now_ms max_attempts horizon_ms wake_channel *quadruples",
)
REAP = Contract(
    "reap",
    keys="unack retry garbage attempts reasons tokens successors messages pending ready priorities "
    f"aborts {_KEYED} progress",
    args="now_ms limit max_attempts backoff_base_ms backoff_max_ms horizon_ms wake_channel",
)
RELEASE = Contract(
    "release",
    keys="unack ready attempts tokens garbage reasons ready_since ranked priorities aborts "
    f"{_KEYED} progress",
    args="now_ms wake_channel *triples",
)
# A consumer leaves what a newer release wrote for a consumer that reads it (core/delivery.py).
DEFER = Contract(
    "defer",
    keys=f"unack retry attempts tokens garbage reasons aborts progress newer {_KEYED}",
    args="now_ms first_wait_ms longest_wait_ms reads_format *triples",
)
SLOT_FREED = Contract("slot_freed", keys="limiter", args="now_ms wake_channel")
EXTEND = Contract("extend", keys="unack tokens", args="deadline_ms *pairs")
PROGRESS = Contract("progress", keys="unack tokens progress", args="*triples")
JOURNAL = Contract("journal", keys="journal", args="max_length *fields")
HEARTBEAT = Contract("heartbeat", keys="heartbeats", args="now_ms forget_before_ms consumer")

# --- reading -----------------------------------------------------------------------------------
COUNTS = Contract(
    "counts",
    keys="pending ready unack retry garbage messages cancelled ready_since ranked key_state "
    "key_turns key_waiting key_tats key_lists",
    args="now_ms key_limits",
)
PEEK = Contract(
    "peek",
    keys=f"pending ready unack retry garbage messages attempts reasons cancelled ranked {_KEYED}",
    args="state offset limit",
)
FLOW_STATE = Contract("flow_state", keys="limiter unack", args="now_ms")
NEWER_WAITING = Contract("newer_waiting", keys="newer messages unack", args="most_entries")
DEAD_LETTER_REASONS = Contract("dead_letter_reasons", keys="garbage reasons", args="most")
DEAD_LETTERS_WITH_REASON = Contract(
    "dead_letters_with_reason", keys="garbage reasons", args="most reason"
)
BUSIEST_KEYS = Contract(
    "busiest_keys",
    keys="key_turns key_waiting key_load key_state key_lists",
    args="top",
)
OVERDUE = Contract(
    "overdue",
    keys="pending retry key_state key_turns key_waiting key_tats key_lists",
    args="now_ms key_limits",
)
STATS = Contract(
    "stats",
    keys="journal tally heartbeats config",
    args="most_entries alive_since_ms most_consumers",
)

# --- staff's actions on waiting and dead messages, and on running ones -------------------------
ABORT = Contract(
    "abort",
    keys="unack tokens aborts messages pending retry garbage",
    args="wake_channel id reason",
)
CANCEL = Contract(
    "cancel",
    keys="pending retry ready messages attempts tokens reasons journal unack garbage cancelled "
    f"ready_since successors ranked priorities {_KEYED} progress *records",
    args="now_ms journal_max_length record_kept_seconds *ids",
)
RUN_NOW = Contract(
    "run_now",
    keys=f"pending retry ready tokens ready_since ranked priorities {_KEYED}",
    args="now_ms wake_channel *ids",
)
REQUEUE = Contract(
    "requeue",
    keys=f"garbage ready attempts tokens reasons ready_since ranked priorities {_KEYED} *records",
    args="now_ms wake_channel *ids",
)
PURGE = Contract(
    "purge",
    keys=f"garbage messages attempts tokens reasons successors priorities {_PURGED_TOO} *records",
    args="record_kept_seconds *ids",
)

# --- a task's result record --------------------------------------------------------------------
WRITE_RECORD = Contract(
    "write_record",
    keys="record",
    args="kept_seconds order fields required",
    optional="required",
)
# The writes of several records of a queue in one call (those a consumer's round sends with its
# acks: see django_delayqueue.core.consumer.rounds.recording).
WRITE_RECORDS = Contract("write_records", keys="*records", args="writes")

# --- recurrences (recurring schedules) ------------------------------------------------------
ADVANCE_RECURRENCE = Contract(
    "advance_recurrence",
    keys=f"{_STATES} recurrence_states ticks tick_runs {_KEYED}",
    args=f"{_ANNOUNCE} name expected new_state withdraw skips *skipped_ids *triples",
)
RECURRENCE_STATES = Contract("recurrence_states", keys="recurrence_states")
RECORD_TICK = Contract("record_tick", keys="tick_runs recurrence_states", args="name run")
PUBLISH_RECURRENCES = Contract("publish_recurrences", keys="published", args="definitions")

# --- delivery timings (core/timings) -----------------------------------------------------------
RECORD_TIMINGS = Contract("record_timings", keys="timings minute", args="ttl_seconds *increments")
READ_TIMINGS = Contract("read_timings", keys="timings *minutes")

CONTRACTS: dict[str, Contract] = {
    contract.name: contract
    for contract in (
        *(SCHEDULE, REPLACE, ENQUEUE_TASK, SEND_ONCE, SCHEDULE_UNIQUE),
        *(PROMOTE, CLAIM, ACK, NACK, REAP, RELEASE, EXTEND, PROGRESS, JOURNAL, HEARTBEAT),
        *(SLOT_FREED, DEFER),
        *(COUNTS, PEEK, STATS, FLOW_STATE, BUSIEST_KEYS, NEWER_WAITING, OVERDUE),
        *(DEAD_LETTER_REASONS, DEAD_LETTERS_WITH_REASON),
        *(CANCEL, RUN_NOW, REQUEUE, PURGE, ABORT),
        *(WRITE_RECORD, WRITE_RECORDS),
        *(ADVANCE_RECURRENCE, RECURRENCE_STATES, RECORD_TICK, PUBLISH_RECURRENCES),
        *(RECORD_TIMINGS, READ_TIMINGS),
    )
}
