"""The delivery journal's vocabulary, shared by the consumer that writes it and the Spark jobs
and stats that read it."""

from __future__ import annotations

from typing import Literal

OutcomeStatus = Literal["ack", "retry", "garbage"]
ACK: OutcomeStatus = "ack"
RETRY: OutcomeStatus = "retry"
GARBAGE: OutcomeStatus = "garbage"

# Journal stream entries hold one consumer batch each (one XADD per batch, pipelined with
# the acks, is what keeps the journal cheap). Field "o" is a JSON list of rows in this order:
JOURNAL_FIELDS = (
    "id",
    "scheduled_ms",
    "due_ms",
    "delivered_ms",
    "finished_ms",
    "attempt",
    "outcome",
    "error",
    # Added later: how long a flow limit held the message back before its claim (ms), which
    # is not lateness. Rows written before it (and cancel.lua's) have 8 fields: read it as 0.
    "limit_wait_ms",
)
# The fields every row has (a reader takes a row this long or longer, a missing field as 0).
JOURNAL_MIN_FIELDS = 8
