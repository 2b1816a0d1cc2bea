"""One delayed-message queue on Redis: every state change is one Lua script."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .bound import BoundScript
from .clock import Clock, RedisClock
from .envelope import (
    Message,
    decode_envelope,
    encode_envelope,
    encode_payload,
    new_id,
    to_str,
    validate_id,
)
from .errors import ConfigurationError, CorruptEnvelope, DelayQueueError, PayloadError
from .inspection import Inspection
from .keys import QueueKeys
from .results import (
    BulkResult,
    PromoteResult,
    ReapResult,
    Rejected,
    ScheduleResult,
)
from .scripts import LuaScript
from .settings import QueueSettings

logger = logging.getLogger(__name__)

Delay = float | int | timedelta
MAX_CLAIM = 10_000  # most messages one claim may take (QueueSettings.claim_batch's bound)
DEFAULT_CHUNK = 500  # messages per schedule script call: ~ms of Redis time, never a long block
# Producers announce a new message on the wake channel only when it is due within this long
# (and earlier than every pending one); consumers never sleep longer than this without reading
# the pending head, so later messages are found without an announcement (see schedule.lua).
ANNOUNCE_WITHIN_MS = 2000


def _ms(delay: Delay) -> int:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if seconds != seconds or seconds < 0:  # NaN or negative
        raise PayloadError(f"delay must be zero or more seconds, not {delay!r}")
    return round(seconds * 1000)


def _at_ms(at: datetime | int | float) -> int:
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise PayloadError(
                "at= needs a timezone-aware datetime (naive datetimes are ambiguous)"
            )
        return int(at.timestamp() * 1000)
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return int(at)  # epoch milliseconds
    raise PayloadError(f"at= must be an aware datetime or epoch milliseconds, not {at!r}")


class Queue(Inspection):
    """A named queue. Thread-safe as far as the redis-py client is (a pool per client)."""

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        prefix: str = "dq",
        settings: QueueSettings | None = None,
        clock: Clock | None = None,
        journal_maxlen: int = 100_000,
    ) -> None:
        self.client = client
        self.name = name
        self.keys = QueueKeys(prefix, name)
        self.settings = settings or QueueSettings()
        self.clock = clock or RedisClock(client)
        # Spelled once: schedule() is the hot path of every producer.
        self._schedule_one = BoundScript(
            LuaScript.named("schedule"),
            client,
            [self.keys.pending, self.keys.ready, self.keys.messages],
            [ANNOUNCE_WITHIN_MS, self.keys.wake_channel],
        )
        self.journal_maxlen = journal_maxlen  # cap of the journal stream cancels write to

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} {self.keys.tag}>"

    # --- scheduling -------------------------------------------------------------------------

    def prepare(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        now_ms: int | None = None,
    ) -> tuple[str, int, str]:
        """Validate one message and return ``(id, due_ms, envelope)``; raise PayloadError."""
        if delay is not None and at is not None:
            raise PayloadError("give delay= or at=, not both")
        now = self.clock.now_ms() if now_ms is None else now_ms
        due = now + _ms(delay) if delay is not None else _at_ms(at) if at is not None else now
        message_id = new_id() if id is None else validate_id(id)
        payload_json = encode_payload(payload, self.settings.max_payload_bytes)
        return message_id, due, encode_envelope(payload_json, due, now)

    def schedule(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
    ) -> ScheduleResult:
        """Schedule one message; a message already waiting under ``id`` is left as it is."""
        now = self.clock.now_ms()
        prepared = self.prepare(payload, delay=delay, at=at, id=id, now_ms=now)
        return self.send_prepared(prepared, now_ms=now)

    def send_prepared(
        self, prepared: tuple[str, int, str], *, now_ms: int | None = None
    ) -> ScheduleResult:
        """Send one message validated by :meth:`prepare`, in one script call (no pipeline).

        ``dq.schedule`` prepares at call time and sends on commit through this.
        """
        message_id, due, envelope = prepared
        now = self.clock.now_ms() if now_ms is None else now_ms
        created = self._schedule_one(now, message_id, due, envelope)
        return ScheduleResult(message_id, bool(created), due)

    def schedule_many(
        self, items: Iterable[Mapping[str, Any]], *, chunk_size: int = DEFAULT_CHUNK
    ) -> BulkResult:
        """Schedule many messages in pipelined chunks; invalid ones are reported, not raised.

        Each item is a mapping with ``payload`` and optional ``id``, ``delay`` or ``at``.
        A pipeline holds several chunks so a batch costs few round trips.
        """
        total = BulkResult()
        now = self.clock.now_ms()
        pending: list[tuple[str, int, str]] = []
        for index, item in enumerate(items):
            try:
                pending.append(
                    self.prepare(
                        item.get("payload"),
                        delay=item.get("delay"),
                        at=item.get("at"),
                        id=item.get("id"),
                        now_ms=now,
                    )
                )
            except PayloadError as e:
                total.rejected.append(Rejected(index, _safe_id(item), str(e)))
            if len(pending) >= chunk_size * 8:
                total.merge(self._send_prepared(pending, now, chunk_size))
                pending = []
        total.merge(self._send_prepared(pending, now, chunk_size))
        return total

    def schedule_prepared(
        self, prepared: Sequence[tuple[str, int, str]], *, chunk_size: int = DEFAULT_CHUNK
    ) -> BulkResult:
        """Schedule messages already validated by :meth:`prepare` (used by the Spark job)."""
        return self._send_prepared(prepared, self.clock.now_ms(), chunk_size)

    def _send_prepared(
        self, prepared: Sequence[tuple[str, int, str]], now: int, chunk_size: int
    ) -> BulkResult:
        result = BulkResult()
        if not prepared:
            return result
        calls, sizes = [], []
        for chunk in _chunks(prepared, chunk_size):
            args: list[Any] = [now]
            for message_id, due, envelope in chunk:
                args += (message_id, due, envelope)
            calls.append(args)
            sizes.append(len(chunk))
        for size, created in zip(sizes, self._schedule_one.call_many(calls), strict=True):
            result.scheduled += int(created)
            result.duplicates += size - int(created)
        return result

    def cancel(self, *ids: str) -> int:
        """Remove waiting messages (pending, retry or ready); returns how many were removed.

        In-flight (unack) and dead (garbage) messages are left alone. Each id costs O(log n)
        whatever the queue holds: a ready message's entry stays in the list, dead (see
        :attr:`QueueKeys.cancelled`), unless it is at one end. The cancelled ones are recorded
        in the journal with the outcome ``cancel``.
        """
        if not ids:
            return 0
        k = self.keys
        keys = [k.pending, k.retry, k.ready, k.messages, k.attempts, k.tokens, k.reasons]
        keys += (k.journal, k.unack, k.garbage, k.cancelled, k.ready_since)
        return LuaScript.named("cancel")(
            self.client, keys, [self.clock.now_ms(), max(0, self.journal_maxlen or 0), *ids]
        )

    def run_now(self, *ids: str) -> int:
        """Move waiting messages (pending or retry) to ready, ahead of their due time."""
        if not ids:
            return 0
        k = self.keys
        return LuaScript.named("run_now")(
            self.client,
            [k.pending, k.retry, k.ready, k.tokens, k.ready_since],
            [k.wake_channel, self.clock.now_ms(), *ids],
        )

    # --- the consumer's transitions ---------------------------------------------------------

    def promote_call(self, now_ms: int, limit: int | None = None) -> tuple[LuaScript, list, list]:
        k = self.keys
        return (
            LuaScript.named("promote"),
            [k.pending, k.retry, k.ready, k.tokens, k.ready_since],
            [now_ms, limit or self.settings.promote_batch],
        )

    def promote(self, now_ms: int | None = None, limit: int | None = None) -> PromoteResult:
        """Move due pending and retry messages to ready (at most ``limit`` from each)."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        script, keys, args = self.promote_call(now, limit)
        return self.promote_result(script(self.client, keys, args))

    @staticmethod
    def promote_result(raw: Sequence[Any]) -> PromoteResult:
        moved, more, next_due, ready = (int(x) for x in raw)
        return PromoteResult(moved, bool(more), None if next_due < 0 else next_due, ready)

    def claim_call(self, now_ms: int, count: int | None = None) -> tuple[LuaScript, list, list]:
        k = self.keys
        deadline = now_ms + int(self.settings.visibility_timeout * 1000)
        count = count or self.settings.claim_batch
        # The same bound as the claim_batch setting: one claim is one bounded script call.
        if not 1 <= count <= MAX_CLAIM:
            raise ConfigurationError(f"claim count must be between 1 and {MAX_CLAIM}, not {count}")
        keys = [k.ready, k.unack, k.messages, k.attempts, k.tokens, k.seq, k.garbage, k.reasons]
        keys += (k.cancelled, k.ready_since)
        return LuaScript.named("claim"), keys, [deadline, count, now_ms]

    def claim(self, count: int | None = None, now_ms: int | None = None) -> list[Message]:
        """Claim up to ``count`` ready messages; corrupt ones go to garbage, not to the caller."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        script, keys, args = self.claim_call(now, count)
        return self.claimed(script(self.client, keys, args), now)

    def claimed(self, raw: Sequence[Any], now_ms: int) -> list[Message]:
        """Turn a claim script's reply into messages, burying the corrupt ones."""
        messages: list[Message] = []
        corrupt: list[tuple[Message, str]] = []
        for i in range(0, len(raw), 4):
            message_id, token = to_str(raw[i]), to_str(raw[i + 3])
            attempt = int(raw[i + 2])
            try:
                due, scheduled, payload = decode_envelope(raw[i + 1])
            except CorruptEnvelope as e:
                stub = Message(message_id, self.name, None, 0, 0, attempt, token, now_ms)
                corrupt.append((stub, str(e)))
                continue
            messages.append(
                Message(message_id, self.name, payload, due, scheduled, attempt, token, now_ms)
            )
        if corrupt:
            logger.warning(
                "queue %s: %d corrupt envelope(s) sent to garbage", self.name, len(corrupt)
            )
            try:
                self.nack_many([(m, None, reason) for m, reason in corrupt], bury=True)
            except DelayQueueError as e:  # the good ones are claimed: deliver them anyway
                logger.error("queue %s: could not bury corrupt envelopes: %s", self.name, e)
        return messages

    def ack_call(self, messages: Iterable[Message]) -> tuple[LuaScript, list, list]:
        k = self.keys
        args: list[str] = []
        for m in messages:
            args += (m.id, m.token)
        return (
            LuaScript.named("ack"),
            [k.unack, k.retry, k.garbage, k.messages, k.attempts, k.tokens, k.reasons],
            args,
        )

    def ack(self, *messages: Message) -> int:
        """Acknowledge deliveries; returns how many were current (stale tokens are ignored)."""
        if not messages:
            return 0
        script, keys, args = self.ack_call(messages)
        return script(self.client, keys, args)

    def nack_call(
        self,
        failures: Iterable[tuple[Message, float | None, str]],
        now_ms: int,
        bury: bool = False,
    ) -> tuple[LuaScript, list, list]:
        k = self.keys
        args: list[Any] = [now_ms, self.settings.max_attempts]
        for message, delay, reason in failures:
            if bury:
                retry_at = -1
            else:
                seconds = self.settings.backoff(message.attempt) if delay is None else delay
                retry_at = now_ms + max(0, int(seconds * 1000))
            args += (message.id, message.token, retry_at, reason[:2000])
        return (
            LuaScript.named("nack"),
            [k.unack, k.retry, k.garbage, k.attempts, k.tokens, k.reasons],
            args,
        )

    def nack(self, message: Message, *, delay: float | None = None, reason: str = "") -> int:
        """A delivery failed: retry after ``delay`` seconds (default: backoff with jitter).

        Returns 1 (will retry), 2 (no attempts left: now in garbage) or 0 (stale token).
        """
        return self.nack_many([(message, delay, reason)])[0]

    def nack_many(
        self, failures: Sequence[tuple[Message, float | None, str]], *, bury: bool = False
    ) -> list[int]:
        if not failures:
            return []
        script, keys, args = self.nack_call(failures, self.clock.now_ms(), bury)
        return [int(x) for x in script(self.client, keys, args)]

    def bury(self, message: Message, reason: str) -> bool:
        """Send an in-flight message straight to garbage with ``reason``."""
        return self.nack_many([(message, None, reason)], bury=True)[0] == 2

    def reap_call(self, now_ms: int, limit: int | None = None) -> tuple[LuaScript, list, list]:
        k = self.keys
        s = self.settings
        return (
            LuaScript.named("reap"),
            [k.unack, k.retry, k.garbage, k.attempts, k.reasons],
            [
                now_ms,
                limit or s.promote_batch,
                s.max_attempts,
                int(s.backoff_base * 1000),
                int(s.backoff_max * 1000),
            ],
        )

    def reap(self, now_ms: int | None = None, limit: int | None = None) -> ReapResult:
        """Deliveries past their deadline go to retry, or to garbage on their last attempt."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        script, keys, args = self.reap_call(now, limit)
        return self.reap_result(script(self.client, keys, args))

    @staticmethod
    def reap_result(raw: Sequence[Any]) -> ReapResult:
        retried, buried, more, next_deadline = (int(x) for x in raw)
        return ReapResult(retried, buried, bool(more), None if next_deadline < 0 else next_deadline)

    def release(self, *messages: Message) -> int:
        """Give back claimed deliveries that never started, without using up an attempt."""
        if not messages:
            return 0
        k = self.keys
        args: list[Any] = [k.wake_channel, self.clock.now_ms()]
        for m in messages:
            args += (m.id, m.token)
        return LuaScript.named("release")(
            self.client,
            [k.unack, k.ready, k.attempts, k.tokens, k.garbage, k.reasons, k.ready_since],
            args,
        )

    def extend(self, *messages: Message, seconds: float | None = None) -> int:
        """Push the deadline of running deliveries out by ``seconds`` (default: visibility)."""
        if not messages:
            return 0
        deadline = self.clock.now_ms() + int((seconds or self.settings.visibility_timeout) * 1000)
        args: list[Any] = [deadline]
        for m in messages:
            args += (m.id, m.token)
        return LuaScript.named("extend")(self.client, [self.keys.unack, self.keys.tokens], args)

    # --- dead letters -------------------------------------------------------------------------

    def requeue(self, *ids: str, limit: int = 1000) -> int:
        """Dead letters back to ready with fresh attempts (all of them when no ids are given)."""
        k = self.keys
        script = LuaScript.named("requeue")
        keys = [k.garbage, k.ready, k.attempts, k.tokens, k.reasons, k.ready_since]
        if ids:
            args = [limit, k.wake_channel, self.clock.now_ms(), *ids]
            return int(script(self.client, keys, args)[0])
        return sum(
            self._drain(
                lambda: script(self.client, keys, [limit, k.wake_channel, self.clock.now_ms()])
            )
        )

    def purge(self, *ids: str, limit: int = 1000) -> int:
        """Delete dead letters for good (all of them when no ids are given)."""
        k = self.keys
        script = LuaScript.named("purge")
        keys = [k.garbage, k.messages, k.attempts, k.tokens, k.reasons]
        if ids:
            return int(script(self.client, keys, [limit, *ids])[0])
        return sum(self._drain(lambda: script(self.client, keys, [limit])))

    @staticmethod
    def _drain(call: Any) -> Iterator[int]:
        """Repeat a bounded script call until it reports nothing left (or no progress)."""
        while True:
            done, left = (int(x) for x in call())
            yield done
            if done == 0 or left == 0:
                return


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _safe_id(item: Mapping[str, Any]) -> str | None:
    value = item.get("id") if isinstance(item, Mapping) else None
    return value if isinstance(value, str) else None
