"""The Django consumer: dispatches each message to its queue's signal receivers.

:class:`Worker` is the consumer that ``runqueue`` runs. It delivers a message to its queue's
signal receivers (on a handler thread, or on the event loop when one is ``async def``), runs
the tasks among them (the task side is :class:`~django_delayqueue.tasks.serving.TaskServing`,
a part it builds and owns: ``worker.tasks``), relays the outbox while it runs, and at each
maintenance refreshes what it follows: the Redis servers' policy, the settings staff published
(``mirror.following``), the recurring schedules and the registry of task queues.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from django_delayqueue import inbox
from django_delayqueue.alive import AliveFile
from django_delayqueue.api import topic
from django_delayqueue.conf.queues import configured, shard_queues
from django_delayqueue.conf.settings import dq_settings, envelope_format, queue_atomic
from django_delayqueue.conf.task_backends import DEFAULT_TASK_QUEUE, any_task_queue
from django_delayqueue.conf.task_registry import registered
from django_delayqueue.core.consumer.limits.runs import handler_returned, stop_error
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.envelope import Message
from django_delayqueue.core.errors import ConfigurationError, DelayQueueError, Reject, Retry
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.recurring.keeper import ScheduleKeeper
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.dispatch import (
    asend_robust,
    has_async_receivers,
    in_thread_to_its_end,
)
from django_delayqueue.inbox import run_atomically
from django_delayqueue.mirror import recurrences
from django_delayqueue.mirror.following import follow_queue_settings, sync_settings
from django_delayqueue.mirror.kinds import recurrences_mirror
from django_delayqueue.monitoring.servers import ServerGuard
from django_delayqueue.observability import tracing
from django_delayqueue.observability.log_fields import message_fields
from django_delayqueue.tasks.flow_keys import schedule_task_key
from django_delayqueue.tasks.payload import is_task_payload, task_payload
from django_delayqueue.tasks.serving import TaskServing

logger = logging.getLogger(__name__)

# Set while this thread is inside a delivery's send_robust: a receiver's error is logged once,
# by handle() below with the queue, message id and attempt, not a second time by Django's
# "django.dispatch" logger (apps.py filters those records out).
dispatching = threading.local()
# How often a worker prunes the inbox of its atomic queues (a batch per queue each time), when
# it is not behind (then at every maintenance: see inbox.InboxPruner.behind).
INBOX_PRUNE_SECONDS = 60.0


class Worker(Consumer):
    """Delivers the due messages of some configured queues to their Django handlers.

    Every ``SETTINGS_REFRESH_SECONDS`` it re-reads the settings staff published from the admin
    (one Redis round trip for all its queues), so a pause stops it within seconds. With a
    TASKS backend that takes any queue (``"QUEUES": []``), a worker started for every queue
    (``discover``) also serves each queue tasks are sent to, found in the registry of task
    queues (``conf.task_registry``) at that refresh.
    """

    def __init__(
        self,
        queues: Sequence[Queue],
        *,
        discover: bool = False,
        worker_id: str | None = None,
        alive_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("journal_maxlen", int(dq_settings.JOURNAL_MAXLEN))
        kwargs.setdefault("maintenance_seconds", float(dq_settings.SETTINGS_REFRESH_SECONDS))
        kwargs.setdefault("keeper", ScheduleKeeper(payload_for=tick_payload, key_for=tick_key))
        kwargs.setdefault("reads_format", envelope_format())
        super().__init__(queues, **kwargs)
        # A bad value is the system check E004's to report: the default then.
        if dq_settings.OTEL_PARENT in tracing.PARENT_MODES:
            tracing.set_parent_mode(dq_settings.OTEL_PARENT)
        self._by_name = {q.name: q for q in self.queues}
        # The task side: which queues run tasks, and their runner (imported on the first).
        # What a task's result lists in worker_ids: the name runqueue was given (--name), the
        # same for every consumer process under one supervisor (each process's own name,
        # NAME.<slot>-<pid>, is in heartbeats and log lines), else this consumer's name.
        self.tasks = TaskServing(
            self.name,
            worker_id or self.name,
            self.write_soon,
            self.add_queues,
            discover=discover,
        )
        self._said_no_schedule_rows = False
        # Atomic queues (docs/exactly-once.md): logical queue -> the database alias its
        # handlers run in a transaction on (None: not atomic). A bad "atomic" raises here.
        self._atomic = {q.logical_name: queue_atomic(q.logical_name) for q in self.queues}
        self._pruned_at: float | None = None  # when the inbox was last pruned (monotonic)
        self._pruner = inbox.InboxPruner()
        # The Redis servers are judged before the first delivery, or once they answer: one
        # whose policy evicts keys stops the worker (see monitoring.servers).
        self.servers = ServerGuard()
        self.refused: str | None = None
        # runqueue --alive-file: touched as the loop goes round (a liveness probe reads it).
        self.alive = AliveFile(alive_file) if alive_file else None

    def run(self) -> int:
        # What the process holds as it starts delivering (Django, its apps, the settings,
        # the modules: the bulk of its heap) is frozen out of the collector's sweeps while it
        # runs: a task's run allocates enough containers to set off collections whose oldest
        # sweep walked all of that again and again (issue 37: a fifth of a no-op task's CPU
        # in a worker). What the run allocates is collected as before, and the start's heap
        # goes back to the collector when the run ends (a burst in a test process, say).
        with _heap_frozen():
            code = self._run()
        return 1 if self.refused else code

    def step(self, now_ms: int | None = None) -> int:
        # Touched before the round, so a round that fails (Redis down: the loop retries)
        # still says the loop turns; a loop stuck in a round stops touching it.
        if self.alive is not None:
            self.alive.touch()
        return super().step(now_ms)

    def _run(self) -> int:
        if self.tasks.runs_tasks(self.queues):
            self.tasks.prepare(self.queues)
        # The outbox: messages committed while Redis was down are sent from here. A burst sends
        # them first, so that what is due among them is delivered by this very run.
        from django_delayqueue.outbox.relay import OutboxRelay, RelayThread

        relay = OutboxRelay()
        if self.burst:
            try:
                relay.relay_all()
            except Exception:  # the relay must never keep a burst from delivering
                logger.exception(
                    "%s: the outbox relay failed; delivering what Redis has", self.name
                )
            return super().run()
        thread = RelayThread(relay).start()
        try:
            return super().run()
        finally:
            thread.stop()

    @classmethod
    def for_queues(cls, names: Sequence[str] | None = None, **kwargs: Any) -> Worker:
        """A worker for ``names`` (default: every configured queue), with fresh Queue objects.

        Raises ConfigurationError for a name that is not configured. With a TASKS backend that
        takes any queue, any name is a task queue, and the default adds Django's default
        queue and the registered ones (and those registered later: ``discover``).
        """
        chosen = configured(names or None, tasks=True)
        discover = not names and any_task_queue()
        if discover:
            try:
                found = registered()
            except DelayQueueError as e:  # Redis down: found at a refresh once it is back
                logger.warning("task queues not read from the registry yet: %s", e)
                found = []
            chosen = list(dict.fromkeys([*chosen, DEFAULT_TASK_QUEUE, *found]))
        if not chosen:
            raise ConfigurationError("no queues configured in DELAYQUEUE['QUEUES']")
        # A sharded queue is claimed from shard by shard: each shard is a queue of the loop.
        queues = [q for name in chosen for q in shard_queues(name)]
        worker = cls(queues, discover=discover, **kwargs)
        inbox.require_tables(worker._atomic)  # an atomic queue without its table: no start
        return worker

    def sync_settings(self) -> None:
        """Mirror the settings file into the rows and Redis; never raises (logs and retries)."""
        sync_settings()

    # --- Consumer hooks ----------------------------------------------------------------------

    def handle(self, message: Message) -> Any:
        """Run the task in the message, or send it to its queue's signal receivers.

        Re-raises what the task or a receiver raised: the consumer turns it into a retry or a
        dead letter.
        """
        shard, message = self._logical(message)
        atomic = self._atomic_alias(shard.logical_name)
        tasks = self.tasks
        if tasks.is_task(message):
            close_old_connections()
            try:
                return tasks.runner().run(message, shard, atomic=atomic)
            finally:
                close_old_connections()
        signal = topic(message.queue)
        close_old_connections()
        dispatching.active = True
        try:
            if atomic is not None:
                return run_atomically(
                    atomic, message, lambda: self._send_in_transaction(shard, message, signal)
                )
            responses = signal.send_robust(sender=message.queue, message=message)
        finally:
            handler_returned()  # its receivers are done: no limit lands past here
            dispatching.active = False
            close_old_connections()
        return self._answered(shard, message, responses)

    def _send_in_transaction(self, shard: Queue, message: Message, signal: Any) -> Any:
        """The receivers of an atomic queue's delivery, in its transaction: the first error
        among them raised, so that the transaction rolls back."""
        responses = signal.send_robust(sender=message.queue, message=message)
        # Before the commit: no limit lands in it. A delivery aborted or stopped at its limit
        # ends so whatever its receivers returned (dead letters, retry): rolled back to match.
        handler_returned()
        stopped = stop_error()
        if stopped is not None:
            raise stopped
        return self._answered(shard, message, responses)

    def _atomic_alias(self, logical_name: str) -> str | None:
        """The database of an atomic queue (None: not atomic); a task queue found after the
        start is looked up once."""
        try:
            return self._atomic[logical_name]
        except KeyError:
            alias = self._atomic[logical_name] = queue_atomic(logical_name)
            return alias

    def _logical(self, message: Message) -> tuple[Queue, Message]:
        """The message's shard, and the message as handlers see it (on its logical queue)."""
        shard = self._by_name[message.queue]
        if shard.logical_name != message.queue:  # a shard: handlers see the logical queue
            message = dataclasses.replace(message, queue=shard.logical_name)
        return shard, message

    def _answered(self, shard: Queue, message: Message, responses: list[tuple[Any, Any]]) -> Any:
        """The receivers' responses, or the first error among them raised (logged here, naming
        ``shard``, the queue or shard it was claimed from, as the consumer's lines do)."""
        if not responses:
            raise Reject(f"no handler for queue {message.queue!r}")
        for receiver, result in responses:
            if isinstance(result, BaseException):
                if not isinstance(result, (Retry, Reject)):
                    logger.warning(
                        "queue %s: handler %s failed on message %s (attempt %d)",
                        shard.name,
                        getattr(receiver, "__qualname__", receiver),
                        message.id,
                        message.attempt,
                        exc_info=result,
                        extra=message_fields(message, shard.name),
                    )
                raise result
        return responses

    # --- async handlers (on the consumer's event loop: see core/consumer/handlers/coroutines.py)

    def runs_async(self, message: Message) -> bool:
        """An ``async def`` task, or a message whose signal has an ``async def`` receiver
        (then its sync receivers run beside them, see django_delayqueue.dispatch)."""
        # On the loop's thread for every message: the common cases first, without copies.
        if self._atomic_alias(self._by_name[message.queue].logical_name) is not None:
            # An atomic queue's transaction is one thread's connection: its async receivers
            # and tasks run there too (Django runs them with async_to_sync).
            return False
        if message.task:
            return self.tasks.is_async(message)
        name = self._by_name[message.queue].logical_name
        if is_task_payload(message.payload):
            _, logical = self._logical(message)
            if self.tasks.is_task(logical):
                return self.tasks.is_async(logical)
        return has_async_receivers(topic(name), name)

    async def ahandle(self, message: Message) -> Any:
        """:meth:`handle` on the event loop: the task awaited, or the receivers sent to by
        ``dispatch.asend_robust``."""
        shard, message = self._logical(message)
        tasks = self.tasks
        if tasks.is_task(message):
            return await tasks.runner().arun(message, shard)
        signal = topic(message.queue)
        # The connections of asgiref's thread, where sync receivers and the coroutines'
        # sync_to_async calls run: checked around each message, as a handler thread's are.
        await in_thread_to_its_end(close_old_connections)
        try:
            responses = await asend_robust(signal, message.queue, message=message)
        except GeneratorExit:  # closed with its loop: nothing may be awaited any more
            raise
        except BaseException:
            await in_thread_to_its_end(close_old_connections)
            raise
        await in_thread_to_its_end(close_old_connections)
        return self._answered(shard, message, responses)

    def task_retry_buried(self, queue: Queue, message: Message, reason: str) -> None:
        """A task's retry buried as aborted at its nack: its task side sends task_finished."""
        self.tasks.retry_buried(queue, message, reason)

    def add_queues(self, queues: Sequence[Queue]) -> list[Queue]:
        """Consume ``queues`` too (a task queue found in the registry), its shards known to
        :meth:`_logical` from then on."""
        added = super().add_queues(queues)
        self._by_name.update((q.name, q) for q in added)
        return added

    def handler_thread_exit(self) -> None:
        """A handler thread ends (fewer threads, or the worker stops): close its DB connections."""
        connections.close_all()

    def refresh(self) -> None:
        """Reload the published settings of every queue (and republish them if missing), then
        the recurring schedules and the registry of task queues; the first refresh that
        reaches Redis judges its servers (:meth:`guard_servers`)."""
        self.guard_servers()
        if not follow_queue_settings(self.queues, self.sync_settings):
            return  # Redis could not be read: the rest waits for the next refresh
        self._refresh_schedules()
        self.tasks.follow_registry(self.queues)
        self._prune_inbox()

    def _prune_inbox(self) -> None:
        """Delete the inbox rows of this worker's atomic queues that no redelivery can need,
        a small batch per queue, every INBOX_PRUNE_SECONDS, or at every maintenance while
        the last batch of a queue was full (see inbox.InboxPruner)."""
        now = time.monotonic()
        waiting = self._pruned_at is not None and now - self._pruned_at < INBOX_PRUNE_SECONDS
        if waiting and not self._pruner.behind:
            return
        self._pruned_at = now
        by_alias: dict[str, list[Queue]] = {}
        for q in self.queues:
            alias = self._atomic_alias(q.logical_name)
            if alias is not None:
                by_alias.setdefault(alias, []).append(q)
        keep = float(dq_settings.INBOX_KEEP_SECONDS)
        try:
            for alias, queues in by_alias.items():
                deleted = self._pruner.prune(alias, queues, keep)
                if deleted:
                    logger.debug("%s: %d inbox rows pruned on %r", self.name, deleted, alias)
        finally:
            close_old_connections()

    def guard_servers(self) -> None:
        """Stop (and set ``refused``) on a Redis whose policy evicts keys, unless accepted."""
        if self.refused:
            return
        try:
            self.servers.check()
        except ConfigurationError as e:
            self.refused = str(e)
            logger.error("%s will not deliver: %s", self.name, e)
            self.request_stop()

    def _refresh_schedules(self) -> None:
        """Give the keeper the published recurring schedules (the admin's edits included)."""
        keeper = self.keeper
        if not isinstance(keeper, ScheduleKeeper):  # built with keeper=None: no schedules
            return
        try:
            published = recurrences.load_published()
            if published is None:  # never published, or Redis lost it: from the rows
                published = self._publish_schedules()
        except DelayQueueError as e:
            logger.debug("recurring schedules not refreshed: %s", e)
            return
        self.tasks.register_schedules(published.recurrences)
        keeper.set_definitions(
            published.recurrences,
            self.queues,
            published.version,
            published.unreadable,
            # From the settings file alone (nothing published, no rows): schedules added in
            # the admin are unknown here, not deleted.
            authoritative=published.version > 0,
        )

    def refresh_wanted(self) -> bool:
        """Refresh at the next round, not at the next maintenance: the servers or the schedules
        could not be read yet (Redis was down), and a round that claims before they are would
        deliver on a server that evicts, or a tick waiting since before the outage whatever
        its catch-up policy says."""
        if not self.servers.verified:  # Redis was down: judge it before a claim on it
            return True
        return isinstance(self.keeper, ScheduleKeeper) and not self.keeper.loaded

    def _publish_schedules(self) -> recurrences.Published:
        try:
            recurrences_mirror.publish_from_db()
            published = recurrences.load_published()
        except DatabaseError as e:  # no table yet: the settings file alone, unpublished
            # Said once (at WARNING) per worker, not at every refresh.
            level = logging.DEBUG if self._said_no_schedule_rows else logging.WARNING
            logger.log(level, "recurring schedules read from the settings file only: %s", e)
            self._said_no_schedule_rows = True
            return recurrences.Published(0, recurrences.declared_recurrences())
        finally:
            close_old_connections()
        if published is None:
            return recurrences.Published(0, recurrences.declared_recurrences())
        return published


def tick_payload(recurrence: Recurrence, instant_ms: int) -> Any:
    """What a tick carries: the schedule's payload, or the message of its ``task``."""
    if recurrence.task:
        return task_payload(
            recurrence.task, list(recurrence.args), dict(recurrence.kwargs), recurrence.backend
        )
    return recurrence.payload


def tick_key(recurrence: Recurrence) -> str | None:
    """A tick's flow key: the schedule's ``key``, else for a ``task`` schedule what the task's
    key argument (its backend's ``KEY_ARGUMENT``) says of the schedule's arguments, as an
    enqueue of the task with them would have."""
    if recurrence.key is not None or not recurrence.task:
        return recurrence.key
    return schedule_task_key(
        recurrence.task, recurrence.backend, list(recurrence.args), dict(recurrence.kwargs)
    )


# Worker runs in this process that hold the heap frozen (tests run several, in threads too):
# the first freezes it, the last gives it back. Counted here, not read from
# gc.get_freeze_count(): Python 3.12 starts with objects frozen already.
_frozen_runs = 0
_frozen_lock = threading.Lock()


@contextmanager
def _heap_frozen() -> Iterator[None]:
    global _frozen_runs
    with _frozen_lock:
        _frozen_runs += 1
        if _frozen_runs == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_runs -= 1
            if _frozen_runs == 0:
                gc.unfreeze()
