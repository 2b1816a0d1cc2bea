"""The producer's side of a queue: one message checked, encoded and stored, in one script call.

A part of :class:`~django_delayqueue.core.queue.Queue`, given the queue's
:class:`~.queue_place.QueuePlace`; it binds the schedule scripts to the queue's keys and owns
them (``bulk.py``, which sends many messages at once, uses them too).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.clock import producer_now_ms
from django_delayqueue.core.due_times import MAX_DUE_MS, Delay, at_ms, delay_ms_of, round_up_ms
from django_delayqueue.core.envelope import (
    encode_envelope,
    encode_payload,
    has_key,
    new_id,
    to_str,
    validate_id,
    validate_key,
)
from django_delayqueue.core.errors import ConfigurationError, NotReplicated, PayloadError
from django_delayqueue.core.observability import tracing
from django_delayqueue.core.observability.trace_context import current_trace
from django_delayqueue.core.results import Prepared, ScheduleResult
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import (
    ENQUEUE_TASK,
    REPLACE,
    SCHEDULE,
    SCHEDULE_UNIQUE,
    SEND_ONCE,
)
from django_delayqueue.core.uniqueness import UniqueFor, window_ms_of

if TYPE_CHECKING:
    from django_delayqueue.core.queue_place import QueuePlace
    from django_delayqueue.core.scripts.fast_path import BoundScript

# How long send_once remembers a token: the outbox sends a row again only when its sender held
# it past its lease (30 s) without deleting it, so an hour is ample; every message scheduled in
# a transaction leaves one (~140 bytes), so a week would cost gigabytes on a busy site.
SEND_TOKEN_MEMORY_MS = 3600 * 1000


class Scheduling:
    """Checks, encodes and stores one message at a time (:meth:`schedule` and its steps)."""

    def __init__(self, place: QueuePlace) -> None:
        self.place = place
        client, keys = place.client, place.keys
        # schedule() is the hot path of every producer: its keys are bound once. replace=True
        # has a script of its own, so that path stays as lean as it was.
        self.schedule_one: BoundScript = SCHEDULE.bind(client, keys)
        self.replace_one: BoundScript = REPLACE.bind(client, keys)
        self.schedule_unique: BoundScript = SCHEDULE_UNIQUE.bind(client, keys)  # unique_for=

    def prepare(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        now_ms: int | None = None,
        task: bool = False,
        key: str | None = None,
    ) -> Prepared:
        """Validate one message and return it encoded (:class:`Prepared`); raise PayloadError.

        ``task``: the envelope carries the task mark (``envelope.TASK_MARK``), for the Tasks
        backend alone: its consumer runs the payload as a task. ``key``: the message's flow key
        (see :meth:`schedule`), carried in its envelope.

        Never early: the due time is the instant asked for rounded up to a whole millisecond,
        a delay counted from the producer's reading of the clock (never behind the server's,
        see :func:`~.clock.producer_now_ms`) or from ``now_ms`` if that is later. ``now_ms``
        (default: the clock's ``now_ms``) is the envelope's scheduled time, and the due time
        without a delay (or with a zero one): due at once, straight to ready.

        The envelope carries the trace context of the current OpenTelemetry span, if any
        (``observability.context``): the producer span of whoever schedules it.
        """
        if delay is not None and at is not None:
            raise PayloadError("give delay= or at=, not both")
        place = self.place
        now = place.clock.now_ms() if now_ms is None else now_ms
        if at is not None:
            due = at_ms(at)
        elif delay is None or (delay_ms := delay_ms_of(delay)) == 0:
            due = now
        else:
            due = round_up_ms(max(now, producer_now_ms(place.clock)) + delay_ms)
            if due > MAX_DUE_MS:
                raise PayloadError(f"delay {delay!r} is too long: due times end with year 9999")
        message_id = new_id() if id is None else validate_id(id)
        if key is not None:
            validate_key(key)
        payload_json = encode_payload(payload, place.settings.max_payload_bytes)
        envelope = encode_envelope(
            payload_json, due, now, task=task, key=key, trace=current_trace()
        )
        return Prepared(message_id, due, envelope)

    def schedule(
        self,
        payload: Any,
        *,
        delay: Delay | None = None,
        at: datetime | int | float | None = None,
        id: str | None = None,
        replace: bool = False,
        unique_for: UniqueFor | None = None,
        key: str | None = None,
    ) -> ScheduleResult:
        """Schedule one message.

        A message already holding ``id`` is left as it is: nothing is created and the result
        names its state. With ``replace=True`` the new message replaces a waiting or dead one
        at once, or follows one in flight (scheduled by its ack): see :class:`ScheduleResult`.
        With ``unique_for`` (seconds or a timedelta; needs ``id``) a message stored opens a
        window for its id, and a schedule with ``unique_for`` of the id while it is open is
        refused (``result.within_window``), even once the first is acknowledged.

        ``key`` (a non-empty str of at most 200 characters) is the message's flow key: the
        queue's ``key_concurrency`` and ``key_rate_limit`` count the messages of one key, and
        ready messages take turns by key (docs/flow-control.md, "Keys"); the handler sees it
        as ``message.key``. With ``replace=True`` the new message's key (or none) replaces the
        old one's, when the new message takes the id's place.
        """
        with tracing.producing(self.place.logical_name) as span:
            window_ms = window_ms_of(unique_for, id)
            now = self.place.clock.now_ms()
            prepared = self.prepare(payload, delay=delay, at=at, id=id, now_ms=now, key=key)
            tracing.scheduled(span, prepared.id, prepared.due_ms)
            return self.send_prepared(prepared, now_ms=now, replace=replace, unique_ms=window_ms)

    def send_prepared(
        self,
        prepared: Prepared,
        *,
        now_ms: int | None = None,
        replace: bool = False,
        unique_ms: int = 0,
    ) -> ScheduleResult:
        """Send one message validated by :meth:`prepare`, in one script call (no pipeline).

        ``dq.schedule`` prepares at call time and sends on commit through this. ``unique_ms``
        (from :func:`~.uniqueness.window_ms_of`; 0: none) is the uniqueness window to check and
        open, counted from the send.
        """
        message_id, due, envelope = prepared
        place = self.place
        now = place.clock.now_ms() if now_ms is None else now_ms
        if unique_ms:
            mode = "replace" if replace else "schedule"
            if place.replicas is None:
                reply = self.schedule_unique(
                    now, *place.announce_args, mode, message_id, due, envelope, unique_ms
                )
            else:
                horizon, channel = place.announce_args
                call = SCHEDULE_UNIQUE.call(
                    place.keys,
                    now_ms=now,
                    horizon_ms=horizon,
                    wake_channel=channel,
                    mode=mode,
                    quadruples=[message_id, due, envelope, unique_ms],
                )
                reply = self._run_message_call(call, message_id, due)
            return result_of(reply, message_id, due)
        if place.replicas is None:  # the fast path: the bound script's arguments, in order
            script = self.replace_one if replace else self.schedule_one
            reply = script(now, *place.announce_args, message_id, due, envelope)
        else:
            horizon, channel = place.announce_args
            call = (REPLACE if replace else SCHEDULE).call(
                place.keys,
                now_ms=now,
                horizon_ms=horizon,
                wake_channel=channel,
                triples=prepared,
            )
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
        self._check_record(record_key, priority, prepared)
        message_id, due, envelope = prepared
        place = self.place
        horizon, channel = place.announce_args
        call = ENQUEUE_TASK.call(
            place.keys,
            record=record_key,
            now_ms=place.clock.now_ms() if now_ms is None else now_ms,
            horizon_ms=horizon,
            wake_channel=channel,
            id=message_id,
            due_ms=due,
            envelope=envelope,
            enqueued=record,
            priority=priority,
        )
        reply = self._run_message_call(call, message_id, due)
        return result_of(reply, message_id, due)

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
        unique_ms: int = 0,
    ) -> ScheduleResult | None:
        """Send one prepared message as :meth:`send_prepared` (or, with ``record_key`` and
        ``record``, :meth:`send_with_record`) would, unless ``token`` was sent in the last
        :data:`SEND_TOKEN_MEMORY_MS`: then nothing changes and the result is None.
        ``unique_ms``: as :meth:`send_prepared`'s (not for a task with its record).

        The transactional outbox sends each row under the row's token, so a row that is sent
        again (its first sender died or timed out before deleting it) never becomes a second
        message, even when the first was delivered and acknowledged in between.
        """
        if not token or not isinstance(token, str):
            raise PayloadError(f"a send token must be a non-empty string, not {token!r}")
        if (record_key is None) != (record is None):
            raise ConfigurationError("record_key and record go together")
        if record_key is not None:
            if replace or unique_ms:
                raise ConfigurationError(
                    "a task with its record cannot replace a message or take a uniqueness window"
                )
            self._check_record(record_key, priority, prepared)
            mode = "task"
        else:
            mode = "replace" if replace else "schedule"
        message_id, due, envelope = prepared
        place = self.place
        horizon, channel = place.announce_args
        call = SEND_ONCE.call(
            place.keys,
            record=record_key or place.keys.sent,  # any key of the queue when there is none
            now_ms=place.clock.now_ms() if now_ms is None else now_ms,
            horizon_ms=horizon,
            wake_channel=channel,
            id=message_id,
            due_ms=due,
            envelope=envelope,
            mode=mode,
            token=token,
            remembered_ms=SEND_TOKEN_MEMORY_MS,
            enqueued=record or "",
            priority=priority,
            unique_ms=unique_ms,
        )
        reply = self._run_message_call(call, message_id, due)
        if int(reply[0]) < 0:
            return None
        return result_of(reply, message_id, due)

    def _check_record(self, record_key: str, priority: int, prepared: Prepared) -> None:
        if not record_key.startswith(self.place.keys.tag):
            raise ConfigurationError(f"{record_key!r} is not a key of queue {self.place.name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 100:
            raise PayloadError(f"priority must be an integer from -100 to 100, not {priority!r}")
        # Keyed ready messages take turns by key (their own lists, docs/flow-control.md "Keys"),
        # prioritised ones by priority (the ranked zset): one message cannot be in both orders.
        if priority != 0 and has_key(prepared.envelope):
            raise PayloadError(
                "a message with a flow key cannot have a priority: keyed messages take turns by "
                "key (give key= or a priority other than 0, not both)"
            )

    def _run_message_call(self, call: ScriptCall, message_id: str, due: int) -> Any:
        """Run a call that stores one message; with ``replicas``, in one pipeline with their
        acknowledgement (core.replication), its NotReplicated carrying the ScheduleResult."""
        place = self.place
        if place.replicas is None:
            return call.run(place.client)
        what = f"queue {place.name}: message {message_id}"
        try:
            return place.replicas.run(place.client, call, place.keys.replicated, what)
        except NotReplicated as e:
            reply = e.result
            if isinstance(reply, list) and reply and int(reply[0]) >= 0:
                e.result = result_of(reply, message_id, due)
            raise


def result_of(reply: Any, message_id: str, due: int) -> ScheduleResult:
    """The ScheduleResult of one message's script reply: ``{stored}``, or ``{stored, 1,
    state}`` when the id was taken, or, from a schedule with a window, ``{stored, 1, state,
    window end}`` (state '' for none; window end 0 when no window refused it)."""
    state = (to_str(reply[2]) or None) if len(reply) > 2 else None
    until = int(reply[3]) if len(reply) > 3 and int(reply[3]) > 0 else None
    return ScheduleResult(message_id, bool(reply[0]), due, state, until)
