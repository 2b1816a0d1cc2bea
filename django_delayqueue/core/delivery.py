"""The consumer's transitions of a queue: promote, claim, ack, nack, reap, release, extend.

A part of :class:`~django_delayqueue.core.queue.Queue`, given the queue's
:class:`~.queue_place.QueuePlace` (its settings read there at each call: staff change them at
run time). Each transition the consumer sends in its pipelines has a ``*_call`` method that
builds it (a ScriptCall, from the script's contract) and a method that runs it alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.due_times import retry_ms
from django_delayqueue.core.envelope import (
    ENVELOPE_FORMAT,
    Message,
    decode_envelope_parts,
    storable_text,
    to_str,
)
from django_delayqueue.core.errors import (
    ConfigurationError,
    CorruptEnvelope,
    DelayQueueError,
    NewerEnvelope,
)
from django_delayqueue.core.observability.log_fields import message_fields
from django_delayqueue.core.progress import encode_progress
from django_delayqueue.core.results import PromoteResult, ReapResult
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import (
    ACK,
    CLAIM,
    DEFER,
    EXTEND,
    NACK,
    PROGRESS,
    PROMOTE,
    REAP,
    RELEASE,
)

if TYPE_CHECKING:
    from django_delayqueue.core.queue_place import QueuePlace

logger = logging.getLogger(__name__)

# What nack.lua says became of each message (besides 0: its token was no longer current).
NACK_RETRY, NACK_DEAD, NACK_ABORTED = 1, 2, 3


def nack_aborted_reasons(reply: Sequence[Any], count: int) -> list[str]:
    """The dead letters' reasons (``aborted: <reason>``) nack.lua gives after the codes of its
    ``count`` messages, one for each :data:`NACK_ABORTED` among them, in their order."""
    return [to_str(told) for told in reply[count:]]


MAX_CLAIM = 10_000  # most messages one claim may take (QueueSettings.claim_batch's bound)
# A message a consumer cannot read (an envelope of a newer format) waits in retry this long
# before a consumer claims it again, doubled each time one leaves it again, up to the longest
# (defer.lua): a consumer that reads it, started during a deploy, delivers it within a minute,
# and those that cannot read it claim it about once a minute, not in a loop.
NEWER_FIRST_WAIT_MS = 1_000
NEWER_LONGEST_WAIT_MS = 60_000


class Delivery:
    """The consumer's transitions of one queue's messages."""

    def __init__(self, place: QueuePlace) -> None:
        self.place = place
        # The envelope formats this part said it left messages of (logged once each).
        self.newer_said: set[int] = set()

    def promote_call(self, now_ms: int, limit: int | None = None) -> ScriptCall:
        place = self.place
        return PROMOTE.call(place.keys, now_ms=now_ms, limit=limit or place.settings.promote_batch)

    def promote(self, now_ms: int | None = None, limit: int | None = None) -> PromoteResult:
        """Move due pending and retry messages to ready (at most ``limit`` from each)."""
        now = self.place.clock.now_ms() if now_ms is None else now_ms
        call = self.promote_call(now, limit)
        return self.promote_result(call.run(self.place.client))

    @staticmethod
    def promote_result(raw: Sequence[Any]) -> PromoteResult:
        moved, more, next_due, ready = (int(x) for x in raw)
        return PromoteResult(moved, bool(more), None if next_due < 0 else next_due, ready)

    def claim_call(
        self,
        now_ms: int,
        count: int | None = None,
        *,
        receipt: str | None = None,
        claim_id: str = "",
        replay_only: bool = False,
        reads_format: int = ENVELOPE_FORMAT,
    ) -> ScriptCall:
        """The claim of ``count`` messages; with ``receipt`` (a consumer's receipt key, see
        consumer/rounds/claims.py) recorded there under ``claim_id``, or that claim's messages again
        when it is the claim recorded (and, with ``replay_only``, nothing new).
        ``reads_format``: the newest envelope format the claiming consumer reads (the messages
        it reads wait for no newer consumer any more: claim.lua)."""
        place = self.place
        settings, keys = place.settings, place.keys
        deadline = now_ms + int(settings.visibility_timeout * 1000)
        count = count or settings.claim_batch
        # '' without a limit: the claim pays one comparison (see core/flow_limits.py).
        limits = ""
        if settings.flow_limited or settings.key_limited:
            limits = settings.claim_limits(keys.shard, place.shard_count)
        # The same bound as the claim_batch setting: one claim is one bounded script call.
        if not 1 <= count <= MAX_CLAIM:
            raise ConfigurationError(f"claim count must be between 1 and {MAX_CLAIM}, not {count}")
        if receipt is None:
            return CLAIM.call(
                keys,
                now_ms=now_ms,
                deadline_ms=deadline,
                most_ids=count,
                limits=limits,
                reads_format=reads_format,
            )
        return CLAIM.call(
            keys,
            now_ms=now_ms,
            deadline_ms=deadline,
            most_ids=count,
            limits=limits,
            reads_format=reads_format,
            receipt=receipt,
            claim_id=claim_id,
            replay_only="1" if replay_only else "0",
        )

    def claim(
        self,
        count: int | None = None,
        now_ms: int | None = None,
        *,
        reads_format: int = ENVELOPE_FORMAT,
    ) -> list[Message]:
        """Claim up to ``count`` ready messages; corrupt ones go to garbage, those of an
        envelope format newer than ``reads_format`` wait for a consumer that reads it
        (:meth:`leave_for_newer`): neither reaches the caller."""
        now = self.place.clock.now_ms() if now_ms is None else now_ms
        call = self.claim_call(now, count, reads_format=reads_format)
        return self.claimed(call.run(self.place.client), now, reads_format)

    def claimed(
        self, raw: Sequence[Any], now_ms: int, reads_format: int = ENVELOPE_FORMAT
    ) -> list[Message]:
        """Turn a claim script's reply into messages, burying the corrupt ones and leaving
        those of a format newer than ``reads_format`` for a consumer that reads it (a limit's
        "come back at" after the quadruples is read by :func:`claim_hold`)."""
        name = self.place.name
        messages: list[Message] = []
        corrupt: list[tuple[Message, str]] = []
        newer: list[tuple[Message, int]] = []
        raw, came_back, waits = _claim_tables(raw)
        for i in range(0, len(raw) - len(raw) % 4, 4):
            message_id, token = to_str(raw[i]), to_str(raw[i + 3])
            attempt = int(raw[i + 2])
            try:  # whatever one envelope holds, it costs only its own message
                parts = decode_envelope_parts(raw[i + 1], reads_format)
            except NewerEnvelope as e:  # not corrupt: a newer consumer delivers it
                stub = Message(message_id, name, None, 0, 0, attempt, token, now_ms)
                newer.append((stub, e.format))
                continue
            except Exception as e:  # CorruptEnvelope, or anything decode_envelope missed
                stub = Message(message_id, name, None, 0, 0, attempt, token, now_ms)
                reason = str(e) if isinstance(e, CorruptEnvelope) else f"corrupt: {e!r}"
                corrupt.append((stub, reason))
                continue
            messages.append(
                Message(
                    message_id,
                    name,
                    parts.payload,
                    parts.due_ms,
                    parts.scheduled_ms,
                    attempt,
                    token,
                    now_ms,
                    parts.task,
                    parts.key,
                    parts.trace,
                    came_back.get(message_id) if came_back else None,
                    int(waits[i // 4]) if waits else 0,
                )
            )
        if corrupt:
            logger.warning("queue %s: %d corrupt envelope(s) sent to garbage", name, len(corrupt))
            for m, reason in corrupt:  # one line each, with its fields, for a log search
                logger.warning(
                    "queue %s: message %s (attempt %d) to the dead letters: %s",
                    name,
                    m.id,
                    m.attempt,
                    reason,
                    extra=message_fields(m),
                )
            try:
                self.nack_many([(m, None, reason) for m, reason in corrupt], bury=True)
            except DelayQueueError as e:  # the good ones are claimed: deliver them anyway
                logger.error("queue %s: could not bury corrupt envelopes: %s", name, e)
        if newer:
            try:
                self.leave_for_newer(newer, reads_format)
            except DelayQueueError as e:  # they come back after their visibility timeout
                logger.error(
                    "queue %s: could not leave %d message(s) for a newer consumer: %s",
                    name,
                    len(newer),
                    e,
                )
        return messages

    def leave_for_newer(
        self, messages: Sequence[tuple[Message, int]], reads_format: int = ENVELOPE_FORMAT
    ) -> list[int]:
        """Leave claimed deliveries whose envelope is of a newer format (``(message, its
        format)``) for a consumer that reads it: back to retry without using an attempt, a
        little later each time (defer.lua). Says so in the log once per format for this queue
        object (a consumer's), at debug level after that. Returns defer.lua's result per
        message: 1 left, 2 dead (aborted while claimed), 0 stale."""
        if not messages:
            return []
        place = self.place
        call = DEFER.call(
            place.keys,
            now_ms=place.clock.now_ms(),
            first_wait_ms=NEWER_FIRST_WAIT_MS,
            longest_wait_ms=NEWER_LONGEST_WAIT_MS,
            reads_format=reads_format,
            triples=[part for m, format in messages for part in (m.id, m.token, format)],
        )
        results = [int(x) for x in call.run(place.client)]
        for format in sorted({format for _, format in messages}):
            count = sum(1 for _, f in messages if f == format)
            first = format not in self.newer_said
            self.newer_said.add(format)
            logger.log(
                logging.WARNING if first else logging.DEBUG,
                "queue %s: %d message(s) written in envelope format %d wait for a consumer that "
                "reads it: this one reads formats up to %d. Left in retry (no attempt used), "
                "not dead-lettered; upgrade this consumer%s",
                place.name,
                count,
                format,
                reads_format,
                " (said once per format)" if first else "",
            )
        return results

    @staticmethod
    def claim_hold(raw: Sequence[Any]) -> int | None:
        """When a claim held back by a flow limit says the next message may start (ms; -1:
        when a message in flight ends), or None when no limit held it back."""
        raw = _claim_tables(raw)[0]
        return int(raw[-1]) if len(raw) % 4 else None

    def ack_call(self, messages: Iterable[Message]) -> ScriptCall:
        place = self.place
        horizon, channel = place.announce_args
        return ACK.call(
            place.keys,
            now_ms=place.clock.now_ms(),  # it decides where a successor goes: see ack.lua
            horizon_ms=horizon,
            wake_channel=channel,
            pairs=[part for m in messages for part in (m.id, m.token)],
        )

    def ack(self, *messages: Message) -> int:
        """Acknowledge deliveries; returns how many were current (stale tokens are ignored)."""
        if not messages:
            return 0
        call = self.ack_call(messages)
        return call.run(self.place.client)

    def nack_call(
        self,
        failures: Iterable[tuple[Message, float | None, str]],
        now_ms: int,
        bury: bool = False,
    ) -> ScriptCall:
        place = self.place
        s = place.settings
        quadruples: list[Any] = []
        for message, delay, reason in failures:
            if bury:
                retry_at = -1
            elif delay is None:
                try:
                    seconds = s.backoff(message.attempt)
                except OverflowError:  # 2 ** attempt beyond a float: past the cap anyway
                    seconds = s.backoff_max
                retry_at = now_ms + retry_ms(seconds, s.backoff_max)
            else:
                retry_at = now_ms + retry_ms(delay, s.backoff_max)
            quadruples += (message.id, message.token, retry_at, storable_text(reason, 2000))
        horizon, channel = place.announce_args
        return NACK.call(
            place.keys,
            now_ms=now_ms,
            max_attempts=s.max_attempts,
            horizon_ms=horizon,
            wake_channel=channel,
            quadruples=quadruples,
        )

    def nack(self, message: Message, *, delay: float | None = None, reason: str = "") -> int:
        """A delivery failed: retry after ``delay`` seconds (default: backoff with jitter).

        Returns 1 (will retry), 2 (no attempts left: now in garbage), 3 (aborted, by
        ``abort()``: now in garbage with the abort's reason, whatever was asked) or 0 (stale
        token).
        """
        return self.nack_many([(message, delay, reason)])[0]

    def nack_many(
        self, failures: Sequence[tuple[Message, float | None, str]], *, bury: bool = False
    ) -> list[int]:
        if not failures:
            return []
        call = self.nack_call(failures, self.place.clock.now_ms(), bury)
        # The codes only: what follows them is the reasons of aborted ones (nack_aborted_reasons).
        return [int(x) for x in call.run(self.place.client)[: len(failures)]]

    def bury(self, message: Message, reason: str) -> bool:
        """Send an in-flight message straight to garbage with ``reason``."""
        result = self.nack_many([(message, None, reason)], bury=True)[0]
        return result in (NACK_DEAD, NACK_ABORTED)

    def reap_call(self, now_ms: int, limit: int | None = None) -> ScriptCall:
        place = self.place
        s = place.settings
        horizon, channel = place.announce_args
        return REAP.call(
            place.keys,
            now_ms=now_ms,
            limit=limit or s.promote_batch,
            max_attempts=s.max_attempts,
            backoff_base_ms=int(s.backoff_base * 1000),
            backoff_max_ms=int(s.backoff_max * 1000),
            horizon_ms=horizon,
            wake_channel=channel,
        )

    def reap(self, now_ms: int | None = None, limit: int | None = None) -> ReapResult:
        """Deliveries past their deadline go to retry, or to garbage on their last attempt."""
        now = self.place.clock.now_ms() if now_ms is None else now_ms
        call = self.reap_call(now, limit)
        return self.reap_result(call.run(self.place.client))

    @staticmethod
    def reap_result(raw: Sequence[Any]) -> ReapResult:
        retried, buried, more, next_deadline = (int(x) for x in raw)
        return ReapResult(retried, buried, bool(more), None if next_deadline < 0 else next_deadline)

    def release(self, *messages: Message) -> int:
        """Give back claimed deliveries that never started, without using up an attempt."""
        if not messages:
            return 0
        # A retry keeps the instant it came back to ready if that is still to come (claimed
        # a claim lead early): whoever claims it next holds it until then (release.lua).
        place = self.place
        call = RELEASE.call(
            place.keys,
            now_ms=place.clock.now_ms(),
            wake_channel=place.keys.wake_channel,
            triples=[
                part
                for m in messages
                for part in (m.id, m.token, "" if m.ready_since_ms is None else m.ready_since_ms)
            ],
        )
        return call.run(place.client)

    def extend(self, *messages: Message, seconds: float | None = None) -> int:
        """Push the deadline of running deliveries out by ``seconds`` (default: visibility)."""
        if not messages:
            return 0
        place = self.place
        deadline = place.clock.now_ms() + int((seconds or place.settings.visibility_timeout) * 1000)
        call = EXTEND.call(
            place.keys,
            deadline_ms=deadline,
            pairs=[part for m in messages for part in (m.id, m.token)],
        )
        return call.run(place.client)

    def write_progress(self, reports: Iterable[tuple[str, str, float, str]]) -> int:
        """Store the progress ``(id, token, percent, note)`` of running deliveries, each only
        if its token is still the message's in flight (checked reports: see core/progress.py).
        Returns how many were written."""
        place = self.place
        now = place.clock.now_ms()
        triples = [
            part
            for message_id, token, percent, note in reports
            for part in (message_id, token, encode_progress(percent, note, now))
        ]
        if not triples:
            return 0
        return PROGRESS.call(place.keys, triples=triples).run(place.client)


def _claim_tables(raw: Sequence[Any]) -> tuple[Sequence[Any], dict[str, int], list[int]]:
    """A claim's reply without its trailing tables (the only lists in it), and what they say:
    the claimed messages that came back to ready, by id ({id, ready_since, ...}: ids first),
    and the limit wait of each claimed message, in order (numbers only; empty: none waited)."""
    came_back: dict[str, int] = {}
    waits: list[int] = []
    while raw and isinstance(raw[-1], list):
        table, raw = raw[-1], raw[:-1]
        if table and isinstance(table[0], int):
            waits = table
        else:
            # A score of the retry zset, written by promote.lua, may read as a float ("1e+12").
            came_back = {
                to_str(table[i]): int(float(table[i + 1])) for i in range(0, len(table) - 1, 2)
            }
    return raw, came_back, waits
