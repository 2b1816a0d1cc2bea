"""A queue spread over N hash tags (and so, on a Redis Cluster, over several masters).

``QUEUES["order-close"]["shards"] = 3`` makes one logical queue of three ordinary queues, its
shards, whose keys carry ``#0``, ``#1``, ``#2`` in their hash tag (``QueueKeys.shard``). Every
message id belongs to one shard, always the same (CRC-32 of the id, modulo N: the same in every
process), so idempotency, ``replace`` and cancel by id work as on one queue. Consumers claim from
every shard in each round (each shard is a queue of their own); counts add the shards up.

:class:`ShardedQueue` has the producer's and the admin's side of ``Queue``'s interface, routing
by id; what acts on a whole queue (requeue or purge everything, counts) runs on every shard.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django_delayqueue.core.due_times import Delay
from django_delayqueue.core.envelope import new_id, validate_id, validate_key
from django_delayqueue.core.errors import ConfigurationError, PayloadError
from django_delayqueue.core.inspection import MAX_PAGE
from django_delayqueue.core.keys import MAX_SHARDS, STATES, QueueKeys
from django_delayqueue.core.observability import tracing
from django_delayqueue.core.progress import Progress
from django_delayqueue.core.queue import Queue
from django_delayqueue.core.recurring.recurrence import (
    MAX_NAME_LENGTH as MAX_SCHEDULE_NAME,
)
from django_delayqueue.core.recurring.recurrence import parse_tick_id
from django_delayqueue.core.results import (
    AbortResult,
    BulkResult,
    Page,
    Prepared,
    Rejected,
    ScheduleResult,
    Snapshot,
)
from django_delayqueue.core.settings import QueueSettings
from django_delayqueue.core.uniqueness import UniqueFor, window_ms_of


def key_shard(key: str, shards: int) -> int:
    """The shard where every message of flow key ``key`` lives (see ``ShardedQueue.id_for_key``)."""
    return zlib.crc32(key.encode()) % shards


def keyed_schedule_problem(name: str, key: str | None, shards: int) -> str | None:
    """Why a recurring schedule ``name`` with flow key ``key`` cannot tick on a queue of
    ``shards`` shards (None: it can). Its state and ticks live on its name's shard (one script
    moves them on together, core.recurring), and a keyed message on its key's shard: both must
    be the same shard. The hint names a name that fits."""
    if key is None or shards <= 1 or shard_index(name, shards) == key_shard(key, shards):
        return None
    home = key_shard(key, shards)
    # About one name in `shards` fits: 100 times as many tries all miss with odds of e**-100.
    tries = (f"{name}-{n}" for n in range(1, 100 * shards + 1))
    fits = next((t for t in tries if shard_index(t, shards) == home), None)
    example = f" (e.g. {fits!r})" if fits and len(fits) <= MAX_SCHEDULE_NAME else ""
    return (
        f"on a queue of {shards} shards, a schedule's ticks live on its name's shard "
        f"({shard_index(name, shards)}) and the messages of key {key!r} on shard {home}: name "
        f"the schedule so that both are one{example} or leave out its key"
    )


def shard_index(message_id: str, shards: int) -> int:
    """The shard of ``message_id`` among ``shards`` (stable across processes and versions).

    A recurring schedule's tick (``name@2026-11-25T02:00:00Z``) goes where its schedule's
    name goes: a schedule's state and all its ticks share one shard, which is what lets one
    script create a tick and move the state on together (core.recurring).
    """
    tick = parse_tick_id(message_id)
    key = tick[0] if tick is not None else message_id
    return zlib.crc32(key.encode()) % shards


class ShardedQueue:
    """One logical queue over ``shards`` (Queue objects of one name, shard 0..N-1)."""

    def __init__(self, shards: Sequence[Queue]) -> None:
        if not 2 <= len(shards) <= MAX_SHARDS:
            raise ValueError(f"a sharded queue has 2 to {MAX_SHARDS} shards, not {len(shards)}")
        self.shards = list(shards)
        for q in self.shards:  # each keeps its share of the flow limits (core/flow_limits)
            q.shard_count = len(self.shards)
        self.name = self.logical_name = shards[0].logical_name
        self.client = shards[0].client
        self.clock = shards[0].clock

    def __repr__(self) -> str:
        return f"<ShardedQueue {self.name!r} x{len(self.shards)}>"

    @property
    def settings(self) -> QueueSettings:
        return self.shards[0].settings

    @settings.setter
    def settings(self, value: QueueSettings) -> None:
        for q in self.shards:
            q.settings = value

    def shard_for(self, message_id: str) -> Queue:
        return self.shards[shard_index(message_id, len(self.shards))]

    def keys_for(self, message_id: str) -> QueueKeys:
        return self.shard_for(message_id).keys

    # --- scheduling: by id -----------------------------------------------------------------

    def prepare(self, payload: Any, **kwargs: Any) -> Prepared:
        key = kwargs.get("key")
        if key is not None:
            kwargs["id"] = self.id_for_key(validate_key(key), kwargs.get("id"))
        return self.shards[0].prepare(payload, **kwargs)

    def id_for_key(self, key: str, message_id: str | None = None) -> str:
        """An id that routes a message of ``key`` to the key's shard.

        Every message of a key lives on one shard, so that the key's limits (in-flight count,
        rate, turns) are kept by one script call, exactly. Messages are still found by id
        (cancel, abort, task results), so the id must route there too: without ``message_id``
        a random one that does is made up (about as many draws as there are shards); a given
        id that routes elsewhere is refused, as no place could both find it by id and keep its
        key's limits.
        """
        shards = len(self.shards)
        home = key_shard(key, shards)
        if message_id is None:
            while True:
                candidate = new_id()
                if shard_index(candidate, shards) == home:
                    return candidate
        if shard_index(validate_id(message_id), shards) != home:
            raise PayloadError(
                f"queue {self.name!r} has {shards} shards: a message of key {key!r} lives on "
                f"shard {home}, where id {message_id!r} is not found (its id routes to shard "
                f"{shard_index(message_id, shards)}); leave id= out (an id that routes there "
                "is made up and returned) or schedule it without key="
            )
        return message_id

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
        with tracing.producing(self.logical_name) as span:
            window_ms = window_ms_of(unique_for, id)
            now = self.clock.now_ms()
            prepared = self.prepare(payload, delay=delay, at=at, id=id, now_ms=now, key=key)
            tracing.scheduled(span, prepared.id, prepared.due_ms)
            # The id's shard holds its window too: every schedule of an id finds the same one.
            return self.send_prepared(prepared, now_ms=now, replace=replace, unique_ms=window_ms)

    def send_prepared(self, prepared: Prepared, **kwargs: Any) -> ScheduleResult:
        return self.shard_for(prepared.id).send_prepared(prepared, **kwargs)

    def send_with_record(
        self, prepared: Prepared, record_key: str, record: str, **kwargs: Any
    ) -> ScheduleResult:
        return self.shard_for(prepared.id).send_with_record(prepared, record_key, record, **kwargs)

    def send_once(self, prepared: Prepared, token: str, **kwargs: Any) -> ScheduleResult | None:
        return self.shard_for(prepared.id).send_once(prepared, token, **kwargs)

    def schedule_many(self, items: Iterable[Mapping[str, Any]], **kwargs: Any) -> BulkResult:
        """As ``Queue.schedule_many``; ids are given to items without one first, to route them
        (a keyed item's to its key's shard, as :meth:`prepare` does; a given id that routes
        elsewhere is rejected)."""
        by_shard: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
        positions: dict[int, list[int]] = defaultdict(list)  # each item's place in ``items``
        total = BulkResult()
        for position, item in enumerate(items):
            try:
                item = self._routable(item)
            except PayloadError as e:
                total.rejected.append(Rejected(position, _given_id(item), str(e)))
                continue
            # Not a mapping: any shard reports it as the plain queue does.
            key = str(item["id"]) if isinstance(item, Mapping) else ""
            index = shard_index(key, len(self.shards))
            by_shard[index].append(item)
            positions[index].append(position)
        for index, chunk in by_shard.items():
            done = self.shards[index].schedule_many(chunk, **kwargs)
            # A refused item is reported at its place in the caller's items, not in the chunk.
            total.merge(_placed(done, positions[index]))
        total.rejected.sort(key=lambda r: r.index)
        total.not_scheduled.sort(key=lambda r: r.index)
        return total

    def _routable(self, item: Any) -> Any:
        """``item`` with the id that routes it (PayloadError: it cannot be routed)."""
        if not isinstance(item, Mapping):
            return item  # any shard reports it as the plain queue does
        key = item.get("key")
        if item.get("id") is None:
            # Before an id is made up for it, which would make its window a no-op.
            window_ms_of(item.get("unique_for"), None)
        if key is not None:
            return {**item, "id": self.id_for_key(validate_key(key), item.get("id"))}
        return item if item.get("id") is not None else {**item, "id": new_id()}

    def schedule_prepared(
        self,
        prepared: Sequence[Prepared],
        *,
        unique_ms: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> BulkResult:
        total = BulkResult()
        positions = self._by_shard([p.id for p in prepared], range(len(prepared)))
        for index, places in positions.items():
            windows = None if unique_ms is None else [unique_ms[i] for i in places]
            done = self.shards[index].schedule_prepared(
                [prepared[i] for i in places], unique_ms=windows, **kwargs
            )
            total.merge(_placed(done, places))
        total.not_scheduled.sort(key=lambda r: r.index)
        return total

    # --- by id, or on every shard ------------------------------------------------------------

    def cancel(self, *ids: str) -> int:
        return sum(self.shards[i].cancel(*chunk) for i, chunk in self._by_shard(ids).items())

    def abort(self, message_id: str, reason: str = "") -> AbortResult:
        return self.shard_for(message_id).abort(message_id, reason)

    def run_now(self, *ids: str) -> int:
        return sum(self.shards[i].run_now(*chunk) for i, chunk in self._by_shard(ids).items())

    def requeue(self, *ids: str, **kwargs: Any) -> int:
        if not ids:
            return sum(q.requeue(**kwargs) for q in self.shards)
        return sum(
            self.shards[i].requeue(*chunk, **kwargs) for i, chunk in self._by_shard(ids).items()
        )

    def purge(self, *ids: str, **kwargs: Any) -> int:
        if not ids:
            return sum(q.purge(**kwargs) for q in self.shards)
        return sum(
            self.shards[i].purge(*chunk, **kwargs) for i, chunk in self._by_shard(ids).items()
        )

    # --- reading ---------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return self.snapshot().counts

    def progress_of(self, *message_ids: str) -> dict[str, Progress]:
        found: dict[str, Progress] = {}
        for i, chunk in self._by_shard(message_ids).items():
            found.update(self.shards[i].progress_of(*chunk))
        return found

    def snapshot(self, now_ms: int | None = None) -> Snapshot:
        now = self.clock.now_ms() if now_ms is None else now_ms
        return merge_snapshots(self.name, [q.snapshot(now) for q in self.shards])

    def peek(self, state: str, offset: int = 0, limit: int = 50) -> Page:
        """A page of the shards' messages in ``state``, shard after shard (each in its own
        order): the arguments and bounds of ``Queue.peek``."""
        if not (offset >= 0 and 1 <= limit <= MAX_PAGE):
            raise ConfigurationError(f"peek needs offset >= 0 and 1 <= limit <= {MAX_PAGE}")
        totals = [q.peek(state, 0, 1).total for q in self.shards]  # checks ``state`` too
        rows = []
        skip, want = offset, limit
        for q, total in zip(self.shards, totals, strict=True):
            if want <= 0:
                break
            if skip >= total:
                skip -= total
                continue
            page = q.peek(state, skip, want)
            rows += page.messages[:want]
            want -= len(page.messages[:want])
            skip = 0
        return Page(sum(totals), rows)

    def _by_shard(self, ids: Sequence[str], items: Sequence[Any] | None = None) -> dict[int, list]:
        chosen: dict[int, list[Any]] = defaultdict(list)
        for n, message_id in enumerate(ids):
            chosen[shard_index(message_id, len(self.shards))].append(
                message_id if items is None else items[n]
            )
        return chosen


def _given_id(item: Any) -> str | None:
    value = item.get("id") if isinstance(item, Mapping) else None
    return value if isinstance(value, str) else None


def _placed(done: BulkResult, positions: Sequence[int]) -> BulkResult:
    """A shard's result with the items it reports at their places in the caller's items."""
    done.rejected = [replace(r, index=positions[r.index]) for r in done.rejected]
    done.not_scheduled = [replace(r, index=positions[r.index]) for r in done.not_scheduled]
    return done


def merge_snapshots(name: str, parts: Sequence[Snapshot]) -> Snapshot:
    """One snapshot of a logical queue from its shards': counts added up, the oldest overdue and
    the nearest due time over all of them."""
    overdue = [s.oldest_overdue_ms for s in parts if s.oldest_overdue_ms is not None]
    upcoming = [s.next_due_ms for s in parts if s.next_due_ms is not None]
    return Snapshot(
        name,
        {state: sum(s.counts[state] for s in parts) for state in STATES},
        max(overdue) if overdue else None,
        min(upcoming) if upcoming else None,
    )
