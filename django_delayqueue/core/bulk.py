"""Scheduling many messages at once: pipelined chunks, each one schedule (or replace) script call.

A part of :class:`~django_delayqueue.core.queue.Queue`, given the queue's
:class:`~.queue_place.QueuePlace` and its :class:`~.scheduling.Scheduling` (whose ``prepare``
checks each message and whose bound scripts store them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.errors import PayloadError
from django_delayqueue.core.observability import tracing
from django_delayqueue.core.results import BulkResult, Prepared, Rejected
from django_delayqueue.core.scripts.calls import is_out_of_memory, script_error
from django_delayqueue.core.uniqueness import window_ms_of

if TYPE_CHECKING:
    from django_delayqueue.core.queue_place import QueuePlace
    from django_delayqueue.core.scheduling import Scheduling

DEFAULT_CHUNK = 500  # messages per schedule script call: ~ms of Redis time, never a long block
NOT_STORED = "Redis is out of memory (used_memory above maxmemory): not stored, send it again"


class BulkScheduling:
    """Schedules many messages at once, in pipelined chunks of one script call each."""

    def __init__(self, place: QueuePlace, scheduling: Scheduling) -> None:
        self.place = place
        self.scheduling = scheduling

    def schedule_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        replace: bool = False,
    ) -> BulkResult:
        """Schedule many messages in pipelined chunks; invalid ones are reported, not raised.

        Each item is a mapping with ``payload`` and optional ``id``, ``delay``, ``at``,
        ``replace`` (default: the ``replace`` argument), ``unique_for`` (seconds or a
        timedelta, with an ``id``: as ``Queue.schedule``'s; refused ones are counted in
        ``within_window``) and ``key`` (the message's flow key, as ``Queue.schedule``'s; a bad
        one is rejected). The key travels in the envelope, so keyed and unkeyed items share
        the chunks and scripts (which keep the queue's flow_keys hash). A pipeline holds several
        chunks so a batch costs few round trips; items keep their order, replacing or not, with
        a window or not. When Redis is out of memory, a chunk it refuses (nothing of it is
        written) and every item after it are reported in ``not_scheduled``, and no more is
        sent.
        """
        # One producer span for the call: every message of it carries its context.
        with tracing.producing(self.place.logical_name) as span:
            total = self._schedule_items(items, chunk_size, replace)
            if span.is_recording():
                span.set_attribute(
                    "messaging.batch.message_count", total.scheduled + total.replaced
                )
            return total

    def _schedule_items(
        self, items: Iterable[Mapping[str, Any]], chunk_size: int, replace: bool
    ) -> BulkResult:
        total = BulkResult()
        now = self.place.clock.now_ms()
        prepare = self.scheduling.prepare
        pending: list[Prepared] = []
        flags: list[bool] = []
        windows: list[int] = []
        indexes: list[int] = []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, Mapping):
                    raise PayloadError(
                        f"item must be a mapping with a payload, not a {type(item).__name__}"
                    )
                window = window_ms_of(item.get("unique_for"), item.get("id"))
                pending.append(
                    prepare(
                        item.get("payload"),
                        delay=item.get("delay"),
                        at=item.get("at"),
                        id=item.get("id"),
                        now_ms=now,
                        key=item.get("key"),
                    )
                )
                flags.append(bool(item.get("replace", replace)))
                windows.append(window)
                indexes.append(index)
            except PayloadError as e:
                total.rejected.append(Rejected(index, _safe_id(item), str(e)))
            if len(pending) >= chunk_size * 8:
                self._send_prepared(pending, chunk_size, flags, indexes, total, windows)
                pending, flags, windows, indexes = [], [], [], []
        self._send_prepared(pending, chunk_size, flags, indexes, total, windows)
        _confirm(self.place, total)
        return total

    def schedule_prepared(
        self,
        prepared: Sequence[Prepared],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        replace: bool = False,
        unique_ms: Sequence[int] | None = None,
    ) -> BulkResult:
        """Schedule messages already validated by :meth:`prepare` (used by the Spark job); those
        Redis refused for memory are in ``not_scheduled`` (indexes into ``prepared``).
        ``unique_ms``: each message's uniqueness window (ms, from
        :func:`~.uniqueness.window_ms_of`; 0 for none), if any has one."""
        flags = [replace] * len(prepared)
        if unique_ms is not None and len(unique_ms) != len(prepared):
            raise ValueError("unique_ms needs one window (or 0) per prepared message")
        result = BulkResult()
        indexes = list(range(len(prepared)))
        self._send_prepared(prepared, chunk_size, flags, indexes, result, unique_ms)
        _confirm(self.place, result)
        return result

    def _send_prepared(
        self,
        prepared: Sequence[Prepared],
        chunk_size: int,
        flags: Sequence[bool],
        indexes: Sequence[int],
        result: BulkResult,
        windows: Sequence[int] | None = None,
    ) -> None:
        """Send runs of items that replace or not, with a uniqueness window or not, in order
        (one pipeline per run), counting what became of them in ``result``. Once a chunk was
        refused for memory, the rest is reported as not scheduled without being sent (each
        refused chunk changed nothing: see lua/includes/memory.lua). The scripts' now is read
        again for each pipeline, not taken from the start of the batch: a window opens when its
        message is stored, so a slow iterable or a long batch cannot open one already over."""
        windowed = [bool(w) for w in windows] if windows else [False] * len(prepared)
        start = 0
        while start < len(prepared):
            replace, unique, end = flags[start], windowed[start], start + 1
            while end < len(prepared) and (flags[end], windowed[end]) == (replace, unique):
                end += 1
            chunks = [range(i, min(i + chunk_size, end)) for i in range(start, end, chunk_size)]
            now = self.place.clock.now_ms()
            if unique:
                assert windows is not None
                self._send_windowed(prepared, now, chunks, replace, windows, indexes, result)
                start = end
                continue
            scripts = self.scheduling
            script = scripts.replace_one if replace else scripts.schedule_one
            announce_args = self.place.announce_args
            calls = (
                [now, *announce_args, *(part for i in chunk for part in prepared[i])]
                for chunk in chunks
            )
            for chunk, reply in _stored_chunks(script, calls, chunks, prepared, indexes, result):
                stored, taken = int(reply[0]), (len(reply) - 1) // 2
                result.scheduled += stored - (taken if replace else 0)
                result.replaced += taken if replace else 0
                result.already_present += 0 if replace else len(chunk) - stored
            start = end

    def _send_windowed(
        self,
        prepared: Sequence[Prepared],
        now: int,
        chunks: Sequence[range],
        replace: bool,
        windows: Sequence[int],
        indexes: Sequence[int],
        result: BulkResult,
    ) -> None:
        """One run of items with uniqueness windows: schedule_unique.lua per chunk."""
        mode = "replace" if replace else "schedule"
        announce_args = self.place.announce_args
        calls = (
            [
                now,
                *announce_args,
                mode,
                *(part for i in chunk for part in (*prepared[i], windows[i])),
            ]
            for chunk in chunks
        )
        chunked = _stored_chunks(
            self.scheduling.schedule_unique, calls, chunks, prepared, indexes, result
        )
        for _chunk, reply in chunked:
            # {stored, then triples: position, state, window end (0: the id was taken)}
            ends = [int(reply[n]) for n in range(3, len(reply), 3)]
            refused = sum(1 for end in ends if end > 0)
            taken = len(ends) - refused
            stored = int(reply[0])
            result.within_window += refused
            result.scheduled += stored - (taken if replace else 0)
            result.replaced += taken if replace else 0
            result.already_present += 0 if replace else taken


def _stored_chunks(
    script: Any,
    calls: Iterable[list[Any]],
    chunks: Sequence[range],
    prepared: Sequence[Prepared],
    indexes: Sequence[int],
    result: BulkResult,
) -> Iterator[tuple[range, Any]]:
    """Send ``calls`` (one per chunk) and yield each chunk whose script ran with its reply.

    Nothing is sent once a full Redis refused part of this ``schedule_many``: those chunks, and
    any a full Redis refuses now, are counted as not scheduled. A script error is raised."""
    replies: list[Any] = [None] * len(chunks)  # None: not sent
    if not result.not_scheduled:
        replies = script.call_many(list(calls), raise_errors=False)
    for chunk, reply in zip(chunks, replies, strict=True):
        if reply is None or is_out_of_memory(reply):
            result.not_scheduled += [
                Rejected(indexes[i], prepared[i].id, NOT_STORED) for i in chunk
            ]
            continue
        if isinstance(reply, Exception):
            raise script_error(script.script.name, reply) from reply
        yield chunk, reply


def _confirm(place: QueuePlace, result: BulkResult) -> None:
    """With MIN_REPLICAS, wait for the replicas to have what was stored; nothing to wait for
    when a full Redis refused everything (its probe write would be refused too)."""
    stored = result.scheduled + result.replaced
    if stored or result.already_present or not result.not_scheduled:
        place.confirm_replicas(f"{stored} scheduled message(s)", result)


def _safe_id(item: Mapping[str, Any]) -> str | None:
    value = item.get("id") if isinstance(item, Mapping) else None
    return value if isinstance(value, str) else None
