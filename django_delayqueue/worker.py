"""The Django consumer: dispatches each message to its queue's signal receivers."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from django_delayqueue.api import topic
from django_delayqueue.conf.queues import configured, shard_queues
from django_delayqueue.conf.settings import dq_settings, file_queue_settings, queue_names
from django_delayqueue.conf.task_backends import (
    DEFAULT_TASK_QUEUE,
    any_task_queue,
    backend_takes,
    task_queue_names,
)
from django_delayqueue.conf.task_registry import is_registered, register, registered
from django_delayqueue.core.consumer.limits import handler_returned
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
    is_async_receiver,
)
from django_delayqueue.mirror import queue_overrides, recurrences
from django_delayqueue.mirror.kinds import MIRRORS, queue_settings_mirror, recurrences_mirror
from django_delayqueue.monitoring.servers import ServerGuard
from django_delayqueue.tasks.payload import TASK_KEY, is_task_payload, task_payload

logger = logging.getLogger(__name__)

# Set while this thread is inside a delivery's send_robust: a receiver's error is logged once,
# by handle() below with the queue, message id and attempt, not a second time by Django's
# "django.dispatch" logger (apps.py filters those records out).
dispatching = threading.local()


class Worker(Consumer):
    """Delivers the due messages of some configured queues to their Django handlers.

    Every ``SETTINGS_REFRESH_SECONDS`` it re-reads the settings staff published from the admin
    (one Redis round trip for all its queues), so a pause stops it within seconds. With a
    TASKS backend that takes any queue (``"QUEUES": []``), a worker started for every queue
    (``discover``) also serves each queue tasks are sent to, found in the registry of task
    queues (``conf.task_registry``) at that refresh.
    """

    def __init__(self, queues: Sequence[Queue], *, discover: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("journal_maxlen", int(dq_settings.JOURNAL_MAXLEN))
        kwargs.setdefault("maintenance_seconds", float(dq_settings.SETTINGS_REFRESH_SECONDS))
        kwargs.setdefault("keeper", ScheduleKeeper(payload_for=tick_payload))
        super().__init__(queues, **kwargs)
        self._by_name = {q.name: q for q in self.queues}
        # Read by handler threads, replaced (never changed in place) by the loop's.
        self._task_queues = frozenset(task_queue_names())
        self._any_queue = any_task_queue()
        self._discover = discover and self._any_queue
        self._tasks: Any = None
        self._async_tasks: dict[str, bool] = {}  # task path -> whether it is async def
        self._said_no_schedule_rows = False
        # The Redis servers are judged before the first delivery, or once they answer: one
        # whose policy evicts keys stops the worker (see monitoring.servers).
        self.servers = ServerGuard()
        self.refused: str | None = None

    def run(self) -> int:
        code = self._run()
        return 1 if self.refused else code

    def _run(self) -> int:
        if self._any_queue or self._task_queues & {q.logical_name for q in self.queues}:
            self._prepare_for_tasks()
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

    def _prepare_for_tasks(self) -> None:
        """Pay before the first task what it would pay late: importing the framework, its
        backends and the ``tasks`` modules of the installed apps (as Celery and huey do), and
        loading the script that writes results. Nothing here stops the worker: a module that
        fails to import is logged, and its tasks fail (and retry) as they would have."""
        try:
            self._task_runner()
        except Reject as e:
            logger.warning("%s", e)
            return
        from django.utils.module_loading import autodiscover_modules

        from django_delayqueue.tasks import framework

        try:
            autodiscover_modules("tasks")
            framework.task_backends.all()
        except Exception:
            logger.exception(
                "%s: preparing for tasks failed; they will import as they run", self.name
            )
        self._load_task_scripts(self.queues)

    def _load_task_scripts(self, queues: Sequence[Queue]) -> None:
        """Load the script that writes results on the task queues among ``queues``."""
        runner = self._tasks
        for q in queues:
            if runner is not None and (self._any_queue or q.logical_name in self._task_queues):
                try:
                    runner.load_scripts(q)
                except DelayQueueError as e:
                    logger.debug("scripts not loaded ahead on %s: %s", q.name, e)

    def _task_runner(self) -> Any:
        """The runner of Django tasks (imported on the first task: it needs the framework)."""
        if self._tasks is None:
            try:
                from django_delayqueue.tasks.runner import TaskRunner
            except ImportError as e:
                raise Reject(f"a task message, but no Tasks framework here: {e}") from e
            self._tasks = TaskRunner(self.name, self.write_soon)
        return self._tasks

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
        return cls(queues, discover=discover, **kwargs)

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
        if self._is_task(message):
            close_old_connections()
            try:
                return self._task_runner().run(message, shard)
            finally:
                close_old_connections()
        signal = topic(message.queue)
        close_old_connections()
        dispatching.active = True
        try:
            responses = signal.send_robust(sender=message.queue, message=message)
        finally:
            handler_returned()  # its receivers are done: no limit lands past here
            dispatching.active = False
            close_old_connections()
        return self._answered(message, responses)

    def _logical(self, message: Message) -> tuple[Queue, Message]:
        """The message's shard, and the message as handlers see it (on its logical queue)."""
        shard = self._by_name[message.queue]
        if shard.logical_name != message.queue:  # a shard: handlers see the logical queue
            message = dataclasses.replace(message, queue=shard.logical_name)
        return shard, message

    def _answered(self, message: Message, responses: list[tuple[Any, Any]]) -> Any:
        """The receivers' responses, or the first error among them raised (logged here)."""
        if not responses:
            raise Reject(f"no handler for queue {message.queue!r}")
        for receiver, result in responses:
            if isinstance(result, BaseException):
                if not isinstance(result, (Retry, Reject)):
                    logger.warning(
                        "queue %s: handler %s failed on message %s (attempt %d)",
                        message.queue,
                        getattr(receiver, "__qualname__", receiver),
                        message.id,
                        message.attempt,
                        exc_info=result,
                    )
                raise result
        return responses

    # --- async handlers (on the consumer's event loop: see core/consumer/handler_coroutines.py)

    def runs_async(self, message: Message) -> bool:
        """An ``async def`` task, or a message whose signal has an ``async def`` receiver
        (then its sync receivers run beside them, see django_delayqueue.dispatch)."""
        # On the loop's thread for every message: the common cases first, without copies.
        if message.task:
            return self._task_is_async(message)
        name = self._by_name[message.queue].logical_name
        if is_task_payload(message.payload):
            _, logical = self._logical(message)
            if self._is_task(logical):
                return self._task_is_async(logical)
        return has_async_receivers(topic(name), name)

    def _task_is_async(self, message: Message) -> bool:
        path = message.payload.get(TASK_KEY) if isinstance(message.payload, dict) else None
        if not isinstance(path, str):
            return False
        known = self._async_tasks.get(path)
        if known is None:
            try:
                from django_delayqueue.tasks.results import load_task

                known = is_async_receiver(load_task(path).func)
            except Exception:  # fails on a handler thread, as it always did
                known = False
            self._async_tasks[path] = known
        return known

    async def ahandle(self, message: Message) -> Any:
        """:meth:`handle` on the event loop: the task awaited, or the receivers sent to by
        ``dispatch.asend_robust``."""
        shard, message = self._logical(message)
        if self._is_task(message):
            return await self._task_runner().arun(message, shard)
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
        return self._answered(message, responses)

    def handler_thread_exit(self) -> None:
        """A handler thread ends (fewer threads, or the worker stops): close its DB connections."""
        connections.close_all()

    def refresh(self) -> None:
        """Reload the published settings of every queue (and republish them if missing); the
        first refresh that reaches Redis judges its servers (:meth:`guard_servers`)."""
        self.guard_servers()
        names = list(dict.fromkeys(q.logical_name for q in self.queues))  # shards share theirs
        try:
            published = queue_overrides.load_published(names)
        except DelayQueueError as e:
            logger.debug("settings refresh skipped: %s", e)
            return
        for q in self.queues:
            try:
                base = file_queue_settings(q.logical_name)
            except ConfigurationError:
                continue  # settings became invalid under override_settings; keep the last
            new = queue_overrides.merge(base, published[q.logical_name])
            if new != q.settings:
                logger.info("queue %s: settings now %s", q.name, _diff(q.settings, new))
                q.settings = new
        configured_names = set(queue_names())  # a queue only the registry knows has no row
        missing = [n for n, values in published.items() if values is None and n in configured_names]
        if missing:  # recomputed every refresh, so a failed republish is tried again
            self._republish(missing)
        self._refresh_schedules()
        if self._any_queue:
            self._follow_registry()

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
        if self._any_queue:
            self._register_task_schedules(published.recurrences)
        keeper.set_definitions(
            published.recurrences,
            self.queues,
            published.version,
            published.unreadable,
            # From the settings file alone (nothing published, no rows): schedules added in
            # the admin are unknown here, not deleted.
            authoritative=published.version > 0,
        )

    def _is_task(self, message: Message) -> bool:
        """Whether ``message`` is a task to run: its envelope carries the task mark, which only
        the Tasks backend's enqueue (and a recurring ``task`` schedule) sets, never a payload.
        A signal message whose payload has a "django.task" key (a webhook's JSON, say) goes to
        its receivers: it must never import and run anything.

        A task enqueued by an earlier version has no mark: it is still run where that version
        ran it (a queue a TASKS backend takes) if no signal receiver listens there, so the
        messages waiting across an upgrade keep working and a signal queue never runs one.
        """
        if message.task:
            return True
        return (
            is_task_payload(message.payload)
            and self._is_task_queue(message.queue)
            and not topic(message.queue).has_listeners(sender=message.queue)
        )

    def _is_task_queue(self, name: str) -> bool:
        """A queue a TASKS backend lists, or, with one that takes any queue, one in the
        registry of task queues (asked at once for a queue registered since the last
        refresh). Never a queue only signal messages go to: a payload shaped like a task
        there (a webhook's JSON) must not import and run anything."""
        if name in self._task_queues:
            return True
        if not self._any_queue or not is_registered(name):  # Redis down: raises, retried
            return False
        self._task_queues = self._task_queues | {name}
        return True

    def _follow_registry(self) -> None:
        """Take the registry's queues as task queues, and serve the new ones (``discover``)."""
        try:
            names = registered()
        except DelayQueueError as e:
            logger.debug("task queues not read from the registry: %s", e)
            return
        self._task_queues = self._task_queues | set(names)
        if not self._discover:
            return
        served = {q.logical_name for q in self.queues}
        for name in [n for n in names if n not in served]:
            try:
                shards = shard_queues(name)
            except ConfigurationError as e:  # its DELAYQUEUE settings became invalid
                logger.warning("task queue %s not served: %s", name, e)
                continue
            added = self.add_queues(shards)
            self._by_name.update((q.name, q) for q in added)
            self._load_task_scripts(added)
            logger.info("%s now consuming %s (tasks were sent there)", self.name, name)

    def _register_task_schedules(self, found: Sequence[Recurrence]) -> None:
        """A ``task`` schedule on a queue only a backend taking any queue takes: that queue
        runs tasks, and goes into the registry so that get_result and runqueue find it."""
        for r in found:
            if r.task and r.queue not in self._task_queues and backend_takes(r.backend, r.queue):
                try:
                    register(r.queue)
                except DelayQueueError as e:
                    logger.debug("task queue %s not registered: %s", r.queue, e)
                    continue
                self._task_queues = self._task_queues | {r.queue}

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

    def _republish(self, names: list[str]) -> None:
        # Redis lost the config hashes (restart without persistence, FLUSHALL): put the rows
        # back. One DB query per refresh at most, and only in that case.
        try:
            count = queue_settings_mirror.publish_from_db(names=names)
        except (DatabaseError, DelayQueueError) as e:
            logger.debug("settings not republished: %s", e)
            return
        finally:
            close_old_connections()
        if count:
            logger.info("republished settings of %s", ", ".join(names))
        if count < len(names):
            # No row yet (the database was down when this worker started and synced): create
            # the rows from the settings file, which publishes them too.
            self.sync_settings()


def sync_settings() -> None:
    """Mirror the settings file into the rows and Redis; never raises (logs and retries)."""
    try:
        for mirror in MIRRORS:
            mirror.sync()
    except DatabaseError as e:
        logger.warning("settings rows not synced (database unavailable?): %s", e)
    finally:
        close_old_connections()


def tick_payload(recurrence: Recurrence, instant_ms: int) -> Any:
    """What a tick carries: the schedule's payload, or the message of its ``task``."""
    if recurrence.task:
        return task_payload(
            recurrence.task, list(recurrence.args), dict(recurrence.kwargs), recurrence.backend
        )
    return recurrence.payload


def _diff(old: Any, new: Any) -> str:
    a, b = old.to_mapping(), new.to_mapping()
    return ", ".join(f"{k}={b[k]!r}" for k in b if a.get(k) != b[k]) or "unchanged"
