"""A queue signal's receivers, sync and async, and sending a delivery to them on the event loop.

A message whose queue's signal has only sync receivers goes to a handler thread, which calls
``Signal.send_robust`` (``Worker.handle``). One with at least one ``async def`` receiver runs on
the worker's event loop (``Worker.ahandle``), sent by :func:`asend_robust`, which does what
Django's ``Signal.asend_robust`` (Django 5.0+) does, on every Django this app supports (4.2 has
no async receivers of its own):

- the async receivers run concurrently on the loop (``asyncio.gather``);
- the sync receivers run one after the other, in one ``sync_to_async`` call (asgiref's one
  thread for thread-sensitive code, as Django's ``asend_robust`` does), beside them (the worker
  checks that thread's database connections before and after each message, as a handler
  thread's are: ``Worker.ahandle``);
- an ``Exception`` from a receiver is its response; a ``BaseException`` fails the delivery;
- a delivery cancelled (a time limit, an abort, a stop) while its sync receivers run ends only
  once they have returned (:func:`in_thread_to_its_end`): a thread cannot be stopped, and they
  must never run beside the message's redelivery.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.dispatch import Signal

from django_delayqueue.core.consumer.handlers.coroutine_context import interruptible, sync_part

Receiver = Callable[..., Any]


def is_async_receiver(receiver: Any) -> bool:
    """Django's own test (asgiref's ``iscoroutinefunction``, which also knows
    ``markcoroutinefunction``), or the standard library's where asgiref is older."""
    try:
        from asgiref.sync import iscoroutinefunction
    except ImportError:  # asgiref before 3.6 (Django 4.2's floor is 3.6: defensive)
        return inspect.iscoroutinefunction(receiver)
    return bool(iscoroutinefunction(receiver))


def split_receivers(signal: Signal, sender: Any) -> tuple[list[Receiver], list[Receiver]]:
    """``signal``'s live receivers for ``sender``: (sync ones, async ones), each in order."""
    live: Any = signal._live_receivers(sender)
    if isinstance(live, tuple):  # Django 5.0+: already split
        return list(live[0]), list(live[1])
    sync: list[Receiver] = []
    async_: list[Receiver] = []
    for receiver in live:  # Django 4.2: one list
        (async_ if is_async_receiver(receiver) else sync).append(receiver)
    return sync, async_


def has_async_receivers(signal: Signal, sender: Any) -> bool:
    """Whether ``signal`` has an async receiver for ``sender`` (asked for every message)."""
    # Django 5.0+ keeps each receiver's is_async last in its entry: a signal without any
    # async receiver (the common case) is answered without resolving its weak references.
    for entry in signal.receivers:
        if entry[-1] is not False:  # async (True), or Django 4.2's entry without the flag
            return bool(split_receivers(signal, sender)[1])
    return False


async def asend_robust(signal: Signal, sender: Any, **named: Any) -> list[tuple[Receiver, Any]]:
    """Send ``signal`` to its sync and async receivers as Django's ``Signal.asend_robust``
    does; returns [(receiver, response or Exception)], the sync receivers' first."""
    sync_receivers, async_receivers = split_receivers(signal, sender)

    def send_sync() -> list[tuple[Receiver, Any]]:
        responses: list[tuple[Receiver, Any]] = []
        for receiver in sync_receivers:
            try:
                responses.append((receiver, receiver(signal=signal, sender=sender, **named)))
            except Exception as err:
                responses.append((receiver, err))
        return responses

    async def no_sync() -> list[tuple[Receiver, Any]]:
        return []

    async def send_async(receiver: Receiver) -> Any:
        try:
            return await interruptible(receiver(signal=signal, sender=sender, **named))
        except Exception as err:
            return err

    sync_part = in_thread_to_its_end(send_sync) if sync_receivers else no_sync()
    responses, async_responses = await asyncio.gather(
        sync_part, asyncio.gather(*(send_async(r) for r in async_receivers))
    )
    responses.extend(zip(async_receivers, async_responses, strict=True))
    return responses


async def in_thread_to_its_end(func: Callable[..., Any], *args: Any) -> Any:
    """``await sync_to_async(func)(*args)``, awaited to its end even when the calling coroutine
    is cancelled (or interrupted) meanwhile; what interrupted it is raised after.

    Cancelling a coroutine that awaits a thread stops the waiting, not the thread: left there,
    ``func`` would go on running after the delivery was given up on, beside its redelivery. A
    ``func`` that never returns keeps its coroutine from ending, which the consumer reports as
    a coroutine that cannot be stopped (its process is replaced).
    """
    # sync_part: a coroutine dropped with a closing loop keeps its message until func ended.
    future = asyncio.ensure_future(sync_to_async(sync_part(func))(*args))
    interrupted: BaseException | None = None
    while True:
        try:
            result = await asyncio.shield(future)
        except GeneratorExit:  # closed with its loop: no waiting left to do
            raise
        except BaseException as e:
            if not future.done():  # the caller was cancelled, not func: wait on
                interrupted = interrupted or e
                continue
            raise
        break
    if interrupted is not None:
        raise interrupted
    return result
