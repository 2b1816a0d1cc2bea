"""Scheduling many messages at once: pipelined chunks, each one schedule (or replace) script call.

A mixin of :class:`~django_delayqueue.core.queue.Queue`, which provides ``clock``,
``prepare`` and the two bound scripts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django_delayqueue.core.errors import PayloadError
from django_delayqueue.core.results import BulkResult, Prepared, Rejected

if TYPE_CHECKING:
    from django_delayqueue.core.clock import Clock
    from django_delayqueue.core.scripts.fast_path import BoundScript

DEFAULT_CHUNK = 500  # messages per schedule script call: ~ms of Redis time, never a long block


class BulkScheduling:
    clock: Clock
    _schedule_one: BoundScript
    _replace_one: BoundScript
    announce_args: tuple[int, str]

    if TYPE_CHECKING:

        def prepare(
            self,
            payload: Any,
            *,
            delay: Any = None,
            at: Any = None,
            id: str | None = None,
            now_ms: int | None = None,
        ) -> Prepared: ...

        def confirm_replicas(self, what: str, result: Any = None) -> None: ...

    def schedule_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        replace: bool = False,
    ) -> BulkResult:
        """Schedule many messages in pipelined chunks; invalid ones are reported, not raised.

        Each item is a mapping with ``payload`` and optional ``id``, ``delay``, ``at`` and
        ``replace`` (default: the ``replace`` argument). A pipeline holds several chunks so a
        batch costs few round trips; items keep their order, replacing or not.
        """
        total = BulkResult()
        now = self.clock.now_ms()
        pending: list[Prepared] = []
        flags: list[bool] = []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, Mapping):
                    raise PayloadError(
                        f"item must be a mapping with a payload, not a {type(item).__name__}"
                    )
                pending.append(
                    self.prepare(
                        item.get("payload"),
                        delay=item.get("delay"),
                        at=item.get("at"),
                        id=item.get("id"),
                        now_ms=now,
                    )
                )
                flags.append(bool(item.get("replace", replace)))
            except PayloadError as e:
                total.rejected.append(Rejected(index, _safe_id(item), str(e)))
            if len(pending) >= chunk_size * 8:
                total.merge(self._send_prepared(pending, now, chunk_size, flags))
                pending, flags = [], []
        total.merge(self._send_prepared(pending, now, chunk_size, flags))
        self.confirm_replicas(f"{total.scheduled + total.replaced} scheduled message(s)", total)
        return total

    def schedule_prepared(
        self,
        prepared: Sequence[Prepared],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        replace: bool = False,
    ) -> BulkResult:
        """Schedule messages already validated by :meth:`prepare` (used by the Spark job)."""
        flags = [replace] * len(prepared)
        result = self._send_prepared(prepared, self.clock.now_ms(), chunk_size, flags)
        self.confirm_replicas(f"{result.scheduled + result.replaced} scheduled message(s)", result)
        return result

    def _send_prepared(
        self,
        prepared: Sequence[Prepared],
        now: int,
        chunk_size: int,
        flags: Sequence[bool],
    ) -> BulkResult:
        """Send runs of items that replace or not, in order (one pipeline per run)."""
        result = BulkResult()
        start = 0
        while start < len(prepared):
            replace, end = flags[start], start + 1
            while end < len(prepared) and flags[end] == replace:
                end += 1
            calls, sizes = [], []
            for chunk in _chunks(prepared[start:end], chunk_size):
                args: list[Any] = [now, *self.announce_args]
                for message_id, due, envelope in chunk:
                    args += (message_id, due, envelope)
                calls.append(args)
                sizes.append(len(chunk))
            script = self._replace_one if replace else self._schedule_one
            for size, reply in zip(sizes, script.call_many(calls), strict=True):
                stored, taken = int(reply[0]), (len(reply) - 1) // 2
                result.scheduled += stored - (taken if replace else 0)
                result.replaced += taken if replace else 0
                result.already_present += 0 if replace else size - stored
            start = end
        return result


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _safe_id(item: Mapping[str, Any]) -> str | None:
    value = item.get("id") if isinstance(item, Mapping) else None
    return value if isinstance(value, str) else None
