"""What "a queue" offers its callers, whether it is one :class:`~.queue.Queue` or a
:class:`~.sharding.ShardedQueue` over several: the one type to annotate with.

Producers, the admin, the outbox and the Spark job name a queue and use this side of it (routed
by message id on a sharded queue). The consumer's transitions are per shard: a consumer claims
from each of ``shards``, which are plain ``Queue`` objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.clock import Clock
from django_delayqueue.core.due_times import Delay
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.progress import Progress
from django_delayqueue.core.results import (
    AbortResult,
    BulkResult,
    Page,
    Prepared,
    ScheduleResult,
    Snapshot,
)
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.core.uniqueness import UniqueFor

if TYPE_CHECKING:
    from django_delayqueue.core.queue import Queue


class LogicalQueue(Protocol):
    """A queue as its callers name it (``logical_name``); see the methods of ``Queue``."""

    name: str
    logical_name: str
    client: RedisClient
    clock: Clock
    settings: QueueSettings

    @property
    def shards(self) -> list[Queue]: ...

    def shard_for(self, message_id: str) -> Queue: ...

    def keys_for(self, message_id: str) -> QueueKeys: ...

    # --- scheduling ------------------------------------------------------------------------

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
    ) -> Prepared: ...

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
    ) -> ScheduleResult: ...

    def send_prepared(
        self,
        prepared: Prepared,
        *,
        now_ms: int | None = None,
        replace: bool = False,
        unique_ms: int = 0,
    ) -> ScheduleResult: ...

    def send_with_record(
        self,
        prepared: Prepared,
        record_key: str,
        record: str,
        *,
        priority: int = 0,
        now_ms: int | None = None,
    ) -> ScheduleResult: ...

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
    ) -> ScheduleResult | None: ...

    def schedule_many(
        self, items: Iterable[Mapping[str, Any]], *, chunk_size: int = ..., replace: bool = False
    ) -> BulkResult: ...

    def schedule_prepared(
        self,
        prepared: Sequence[Prepared],
        *,
        chunk_size: int = ...,
        replace: bool = False,
        unique_ms: Sequence[int] | None = None,
    ) -> BulkResult: ...

    # --- by id, or everything --------------------------------------------------------------

    def cancel(self, *ids: str) -> int: ...

    def run_now(self, *ids: str) -> int: ...

    def abort(self, message_id: str, reason: str = "") -> AbortResult: ...

    def requeue(self, *ids: str, limit: int = 1000) -> int: ...

    def purge(self, *ids: str, limit: int = 1000) -> int: ...

    # --- reading ---------------------------------------------------------------------------

    def counts(self) -> dict[str, int]: ...

    def progress_of(self, *message_ids: str) -> dict[str, Progress]: ...

    def snapshot(self, now_ms: int | None = None) -> Snapshot: ...

    def peek(self, state: str, offset: int = 0, limit: int = 50) -> Page: ...
