"""One delayed-message queue on Redis: every state change is one Lua script."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django_delayqueue.core.bulk import (
    DEFAULT_CHUNK as DEFAULT_CHUNK,  # re-exported: the Spark job reads it here
)
from django_delayqueue.core.bulk import BulkScheduling
from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock, RedisClock, producer_now_ms
from django_delayqueue.core.due_times import MAX_DUE_MS as MAX_DUE_MS  # re-exported
from django_delayqueue.core.due_times import Delay, at_ms, delay_ms_of, retry_ms, round_up_ms
from django_delayqueue.core.envelope import (
    Message,
    decode_marked_envelope,
    encode_envelope,
    encode_payload,
    new_id,
    storable_text,
    to_str,
    validate_id,
)
from django_delayqueue.core.errors import (
    ConfigurationError,
    CorruptEnvelope,
    DelayQueueError,
    NotReplicated,
    PayloadError,
)
from django_delayqueue.core.housekeeping import Housekeeping
from django_delayqueue.core.inspection import Inspection
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.replication import ReplicaAck
from django_delayqueue.core.results import (
    Prepared,
    PromoteResult,
    ReapResult,
    ScheduleResult,
)
from django_delayqueue.core.scripts.calls import LuaScript, ScriptCall
from django_delayqueue.core.scripts.fast_path import BoundScript
from django_delayqueue.core.settings import QueueSettings

logger = logging.getLogger(__name__)

MAX_CLAIM = 10_000  # most messages one claim may take (QueueSettings.claim_batch's bound)
# Producers announce a new message on the wake channel only when it is due within this long
# (and earlier than every pending one); consumers never sleep longer than this without reading
# the pending head, so later messages are found without an announcement (see schedule.lua).
ANNOUNCE_WITHIN_MS = 2000
# How long send_once remembers a token: the outbox sends a row again only when its sender held
# it past its lease (30 s) without deleting it, so an hour is ample; every message scheduled in
# a transaction leaves one (~140 bytes), so a week would cost gigabytes on a busy site.
SEND_TOKEN_MEMORY_MS = 3600 * 1000


class Queue(Inspection, Housekeeping, BulkScheduling):
    """A named queue. Thread-safe as far as the redis-py client is (a pool per client)."""

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        prefix: str = "dq",
        settings: QueueSettings | None = None,
        clock: Clock | None = None,
        journal_maxlen: int = 100_000,
        replicas: ReplicaAck | None = None,
        shard: int | None = None,
    ) -> None:
        self.client = client
        # MIN_REPLICAS: schedules (and the consumer's acks) wait for this many replicas.
        self.replicas = replicas
        # One shard of a sharded queue (core.sharding) is named "<queue>#<shard>": what the
        # consumer, its heartbeats and its journal call it. The handlers see ``logical_name``.
        self.logical_name = name
        self.name = name if shard is None else f"{name}#{shard}"
        self.keys = QueueKeys(prefix, name, shard)
        self.settings = settings or QueueSettings()
        self.clock = clock or RedisClock(client)
        # Spelled once: schedule() is the hot path of every producer.
        k = self.keys
        self._schedule_keys = [k.pending, k.ready, k.messages, k.unack, k.retry, k.garbage]
        self._schedule_one = BoundScript(LuaScript.named("schedule"), client, self._schedule_keys)
        # replace=True: a script of its own, so the hot path above stays as lean as it was.
        replace_keys = [k.pending, k.ready, k.messages, k.unack, k.retry, k.garbage]
        replace_keys += (k.attempts, k.tokens)
        replace_keys += (k.reasons, k.successors, k.cancelled, k.ready_since, *k.priority_keys())
        self._replace_keys = replace_keys
        self._replace_one = BoundScript(LuaScript.named("replace"), client, replace_keys)
        # What schedule.lua and replace.lua take after the time: when and where to announce.
        self.announce_args: tuple[int, str] = (ANNOUNCE_WITHIN_MS, k.wake_channel)
        self.journal_maxlen = journal_maxlen  # cap of the journal stream cancels write to

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} {self.keys.tag}>"

    # A queue is its own only shard: callers that route by id (core.sharding) need not care.
    @property
    def shards(self) -> list[Queue]:
        return [self]

    def shard_for(self, message_id: str) -> Queue:
        """The queue that holds (or would hold) ``message_id``: this one."""
        return self

    def keys_for(self, message_id: str) -> QueueKeys:
        """The keys of the queue holding ``message_id`` (its task record, say)."""
        return self.keys

    def confirm_replicas(self, what: str, result: Any = None) -> None:
        """With ``replicas``: return once they have every write of this queue so far, else
        raise :class:`~.errors.NotReplicated` (carrying ``result``). Without: return at once."""
        if self.replicas is not None:
            where = f"queue {self.name}: {what}"
            self.replicas.confirm(self.client, self.keys.replicated, where, result)

    def _run_message_call(self, call: ScriptCall, message_id: str, due: int) -> Any:
        """Run a call that stores one message; with ``replicas``, in one pipeline with their
        acknowledgement (core.replication), its NotReplicated carrying the ScheduleResult."""
        if self.replicas is None:
            return call.run(self.client)
        what = f"queue {self.name}: message {message_id}"
        try:
            return self.replicas.run(self.client, call, self.keys.replicated, what)
        except NotReplicated as e:
            reply = e.result
            if isinstance(reply, list) and reply and int(reply[0]) >= 0:
                state = to_str(reply[2]) if len(reply) > 1 else None
                e.result = ScheduleResult(message_id, bool(reply[0]), due, state)
            raise

    # --- scheduling -------------------------------------------------------------------------

    def prepare(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        now_ms: int | None = None,
        task: bool = False,
    ) -> Prepared:
        """Validate one message and return it encoded (:class:`Prepared`); raise PayloadError.

        ``task``: the envelope carries the task mark (``envelope.TASK_MARK``), for the Tasks
        backend alone: its consumer runs the payload as a task.

        Never early: the due time is the instant asked for rounded up to a whole millisecond,
        a delay counted from the producer's reading of the clock (never behind the server's,
        see :func:`~.clock.producer_now_ms`) or from ``now_ms`` if that is later. ``now_ms``
        (default: the clock's ``now_ms``) is the envelope's scheduled time, and the due time
        without a delay (or with a zero one): due at once, straight to ready.
        """
        if delay is not None and at is not None:
            raise PayloadError("give delay= or at=, not both")
        now = self.clock.now_ms() if now_ms is None else now_ms
        if at is not None:
            due = at_ms(at)
        elif delay is None or (delay_ms := delay_ms_of(delay)) == 0:
            due = now
        else:
            due = round_up_ms(max(now, producer_now_ms(self.clock)) + delay_ms)
            if due > MAX_DUE_MS:
                raise PayloadError(f"delay {delay!r} is too long: due times end with year 9999")
        message_id = new_id() if id is None else validate_id(id)
        payload_json = encode_payload(payload, self.settings.max_payload_bytes)
        return Prepared(message_id, due, encode_envelope(payload_json, due, now, task=task))

    def schedule(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        replace: bool = False,
    ) -> ScheduleResult:
        """Schedule one message.

        A message already holding ``id`` is left as it is: nothing is created and the result
        names its state. With ``replace=True`` the new message replaces a waiting or dead one
        at once, or follows one in flight (scheduled by its ack): see :class:`ScheduleResult`.
        """
        now = self.clock.now_ms()
        prepared = self.prepare(payload, delay=delay, at=at, id=id, now_ms=now)
        return self.send_prepared(prepared, now_ms=now, replace=replace)

    def send_prepared(
        self,
        prepared: Prepared,
        *,
        now_ms: int | None = None,
        replace: bool = False,
    ) -> ScheduleResult:
        """Send one message validated by :meth:`prepare`, in one script call (no pipeline).

        ``dq.schedule`` prepares at call time and sends on commit through this.
        """
        message_id, due, envelope = prepared
        now = self.clock.now_ms() if now_ms is None else now_ms
        arguments = (now, *self.announce_args, message_id, due, envelope)
        if self.replicas is None:  # the fast path
            script = self._replace_one if replace else self._schedule_one
            reply = script(*arguments)
        else:
            name, keys = (
                ("replace", self._replace_keys) if replace else ("schedule", self._schedule_keys)
            )
            call = ScriptCall(LuaScript.named(name), keys, arguments)
            reply = self._run_message_call(call, message_id, due)
        state = to_str(reply[2]) if len(reply) > 1 else None
        return ScheduleResult(message_id, bool(reply[0]), due, state)

    def send_with_record(
        self,
        prepared: Prepared,
        record_key: str,
        record: str,
        *,
        priority: int = 0,
        now_ms: int | None = None,
    ) -> ScheduleResult:
        """Send one prepared message and create its record at ``record_key``, atomically.

        The record (a hash: a task's result, see django_delayqueue.tasks.payload) gets
        ``record`` as its ``enqueued`` field and status READY, only when the message is
        created; ``record_key`` must carry this queue's hash tag. Among messages
        that are ready, those of a higher ``priority`` (-100..100; 0 is every other message's)
        are claimed first, and within one priority the oldest first.
        """
        self._check_record(record_key, priority)
        message_id, due, envelope = prepared
        now = self.clock.now_ms() if now_ms is None else now_ms
        k = self.keys
        keys = [k.pending, k.ready, k.messages, k.unack, k.retry, k.garbage, record_key]
        keys += (k.ranked, k.priorities)
        arguments = [now, *self.announce_args, message_id, due, envelope, record, priority]
        call = ScriptCall(LuaScript.named("enqueue_task"), keys, arguments)
        reply = self._run_message_call(call, message_id, due)
        state = to_str(reply[2]) if len(reply) > 1 else None
        return ScheduleResult(message_id, bool(reply[0]), due, state)

    def send_once(
        self,
        prepared: Prepared,
        token: str,
        *,
        replace: bool = False,
        record_key: str | None = None,
        record: str | None = None,
        priority: int = 0,
        now_ms: int | None = None,
    ) -> ScheduleResult | None:
        """Send one prepared message as :meth:`send_prepared` (or, with ``record_key`` and
        ``record``, :meth:`send_with_record`) would, unless ``token`` was sent in the last
        :data:`SEND_TOKEN_MEMORY_MS`: then nothing changes and the result is None.

        The transactional outbox sends each row under the row's token, so a row that is sent
        again (its first sender died or timed out before deleting it) never becomes a second
        message, even when the first was delivered and acknowledged in between.
        """
        if not token or not isinstance(token, str):
            raise PayloadError(f"a send token must be a non-empty string, not {token!r}")
        if (record_key is None) != (record is None):
            raise ConfigurationError("record_key and record go together")
        if record_key is not None:
            if replace:
                raise ConfigurationError("a task with its record cannot replace a message")
            self._check_record(record_key, priority)
            mode = "task"
        else:
            mode = "replace" if replace else "schedule"
        message_id, due, envelope = prepared
        now = self.clock.now_ms() if now_ms is None else now_ms
        k = self.keys
        keys = [k.pending, k.ready, k.messages, k.unack, k.retry, k.garbage, k.attempts]
        keys += (k.tokens, k.reasons, k.successors, k.cancelled, k.ready_since, k.ranked)
        keys += (k.priorities, k.sent, record_key or k.sent)
        arguments = [now, *self.announce_args, message_id, due, envelope, mode, token]
        arguments += (SEND_TOKEN_MEMORY_MS, record or "", priority)
        call = ScriptCall(LuaScript.named("send_once"), keys, arguments)
        reply = self._run_message_call(call, message_id, due)
        if int(reply[0]) < 0:
            return None
        state = to_str(reply[2]) if len(reply) > 1 else None
        return ScheduleResult(message_id, bool(reply[0]), due, state)

    def _check_record(self, record_key: str, priority: int) -> None:
        if not record_key.startswith(self.keys.tag):
            raise ConfigurationError(f"{record_key!r} is not a key of queue {self.name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 100:
            raise PayloadError(f"priority must be an integer from -100 to 100, not {priority!r}")

    # --- the consumer's transitions ---------------------------------------------------------

    def promote_call(self, now_ms: int, limit: int | None = None) -> ScriptCall:
        k = self.keys
        return ScriptCall(
            LuaScript.named("promote"),
            [k.pending, k.retry, k.ready, k.tokens, k.ready_since, *k.priority_keys()],
            [now_ms, limit or self.settings.promote_batch],
        )

    def promote(self, now_ms: int | None = None, limit: int | None = None) -> PromoteResult:
        """Move due pending and retry messages to ready (at most ``limit`` from each)."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        call = self.promote_call(now, limit)
        return self.promote_result(call.run(self.client))

    @staticmethod
    def promote_result(raw: Sequence[Any]) -> PromoteResult:
        moved, more, next_due, ready = (int(x) for x in raw)
        return PromoteResult(moved, bool(more), None if next_due < 0 else next_due, ready)

    def claim_call(self, now_ms: int, count: int | None = None) -> ScriptCall:
        k = self.keys
        deadline = now_ms + int(self.settings.visibility_timeout * 1000)
        count = count or self.settings.claim_batch
        # The same bound as the claim_batch setting: one claim is one bounded script call.
        if not 1 <= count <= MAX_CLAIM:
            raise ConfigurationError(f"claim count must be between 1 and {MAX_CLAIM}, not {count}")
        keys = [k.ready, k.unack, k.messages, k.attempts, k.tokens, k.seq, k.garbage, k.reasons]
        keys += (k.cancelled, k.ready_since, k.ranked)
        return ScriptCall(LuaScript.named("claim"), keys, [now_ms, deadline, count])

    def claim(self, count: int | None = None, now_ms: int | None = None) -> list[Message]:
        """Claim up to ``count`` ready messages; corrupt ones go to garbage, not to the caller."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        call = self.claim_call(now, count)
        return self.claimed(call.run(self.client), now)

    def claimed(self, raw: Sequence[Any], now_ms: int) -> list[Message]:
        """Turn a claim script's reply into messages, burying the corrupt ones."""
        messages: list[Message] = []
        corrupt: list[tuple[Message, str]] = []
        for i in range(0, len(raw), 4):
            message_id, token = to_str(raw[i]), to_str(raw[i + 3])
            attempt = int(raw[i + 2])
            try:  # whatever one envelope holds, it costs only its own message
                due, scheduled, payload, task = decode_marked_envelope(raw[i + 1])
            except Exception as e:  # CorruptEnvelope, or anything decode_envelope missed
                stub = Message(message_id, self.name, None, 0, 0, attempt, token, now_ms)
                reason = str(e) if isinstance(e, CorruptEnvelope) else f"corrupt: {e!r}"
                corrupt.append((stub, reason))
                continue
            messages.append(
                Message(
                    message_id, self.name, payload, due, scheduled, attempt, token, now_ms, task
                )
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

    def ack_call(self, messages: Iterable[Message]) -> ScriptCall:
        k = self.keys
        # The time decides where a successor goes (pending or ready): see ack.lua.
        args: list[Any] = [self.clock.now_ms(), ANNOUNCE_WITHIN_MS, k.wake_channel]
        for m in messages:
            args += (m.id, m.token)
        keys = [k.unack, k.retry, k.garbage, k.messages, k.attempts, k.tokens, k.reasons]
        keys += (k.successors, k.pending, k.ready, k.priorities)
        return ScriptCall(LuaScript.named("ack"), keys, args)

    def ack(self, *messages: Message) -> int:
        """Acknowledge deliveries; returns how many were current (stale tokens are ignored)."""
        if not messages:
            return 0
        call = self.ack_call(messages)
        return call.run(self.client)

    def nack_call(
        self,
        failures: Iterable[tuple[Message, float | None, str]],
        now_ms: int,
        bury: bool = False,
    ) -> ScriptCall:
        k = self.keys
        s = self.settings
        args: list[Any] = [now_ms, s.max_attempts, ANNOUNCE_WITHIN_MS, k.wake_channel]
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
            args += (message.id, message.token, retry_at, storable_text(reason, 2000))
        keys = [k.unack, k.retry, k.garbage, k.attempts, k.tokens, k.reasons, k.successors]
        keys += (k.messages, k.pending, k.ready)  # where a successor goes: see nack.lua
        keys.append(k.priorities)  # which a successor does not inherit
        return ScriptCall(LuaScript.named("nack"), keys, args)

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
        call = self.nack_call(failures, self.clock.now_ms(), bury)
        return [int(x) for x in call.run(self.client)]

    def bury(self, message: Message, reason: str) -> bool:
        """Send an in-flight message straight to garbage with ``reason``."""
        return self.nack_many([(message, None, reason)], bury=True)[0] == 2

    def reap_call(self, now_ms: int, limit: int | None = None) -> ScriptCall:
        k = self.keys
        s = self.settings
        keys = [k.unack, k.retry, k.garbage, k.attempts, k.reasons, k.tokens, k.successors]
        keys += (k.messages, k.pending, k.ready)  # where a successor goes: see reap.lua
        keys.append(k.priorities)  # which a successor does not inherit
        return ScriptCall(
            LuaScript.named("reap"),
            keys,
            [
                now_ms,
                limit or s.promote_batch,
                s.max_attempts,
                int(s.backoff_base * 1000),
                int(s.backoff_max * 1000),
                ANNOUNCE_WITHIN_MS,
                k.wake_channel,
            ],
        )

    def reap(self, now_ms: int | None = None, limit: int | None = None) -> ReapResult:
        """Deliveries past their deadline go to retry, or to garbage on their last attempt."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        call = self.reap_call(now, limit)
        return self.reap_result(call.run(self.client))

    @staticmethod
    def reap_result(raw: Sequence[Any]) -> ReapResult:
        retried, buried, more, next_deadline = (int(x) for x in raw)
        return ReapResult(retried, buried, bool(more), None if next_deadline < 0 else next_deadline)

    def release(self, *messages: Message) -> int:
        """Give back claimed deliveries that never started, without using up an attempt."""
        if not messages:
            return 0
        k = self.keys
        args: list[Any] = [self.clock.now_ms(), k.wake_channel]
        for m in messages:
            args += (m.id, m.token)
        return ScriptCall(
            LuaScript.named("release"),
            [
                k.unack,
                k.ready,
                k.attempts,
                k.tokens,
                k.garbage,
                k.reasons,
                k.ready_since,
                *k.priority_keys(),
            ],
            args,
        ).run(self.client)

    def extend(self, *messages: Message, seconds: float | None = None) -> int:
        """Push the deadline of running deliveries out by ``seconds`` (default: visibility)."""
        if not messages:
            return 0
        deadline = self.clock.now_ms() + int((seconds or self.settings.visibility_timeout) * 1000)
        args: list[Any] = [deadline]
        for m in messages:
            args += (m.id, m.token)
        return ScriptCall(LuaScript.named("extend"), [self.keys.unack, self.keys.tokens], args).run(
            self.client
        )
