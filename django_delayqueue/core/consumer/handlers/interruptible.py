"""An ``await`` that can be made to raise an exception of our choosing: :class:`Interruptible`.

The soft time limit of a coroutine handler is ``SoftTimeLimitExceeded`` raised at the ``await``
it is suspended in. Asyncio has no such operation, only cancelling a task; this wrapper turns
one cancellation into the exception asked for. It knows nothing of messages or limits (the
coroutines' runner and the watchdog decide when to interrupt), which is why it stands alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from typing import Any


class Interruptible:
    """Awaits ``coro`` as ``await coro`` would, and can raise an exception of our choosing at the
    ``await`` it is suspended in (:meth:`interrupt`).

    Asyncio offers one way to wake a suspended coroutine: cancel its task (which cancels the
    future it waits for). This stands between the task and the coroutine, and turns that one
    CancelledError into ``error``; every other exception and every value passes through, and the
    task's cancel count is put back (``uncancel``), so ``asyncio.timeout`` and TaskGroups inside
    the handler are not confused.
    """

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro: Any = coro.__await__()
        self._error: BaseException | None = None
        self._task: asyncio.Task[Any] | None = None  # the task awaiting it
        self.awaiting = False  # between the first step and the end

    def interrupt(self, error: BaseException) -> bool:
        """On the loop's thread: raise ``error`` in the coroutine at its current await."""
        if not self.awaiting or self._error is not None or self._task is None:
            return False
        self._error = error
        self._task.cancel()
        return True

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        self._task = asyncio.current_task()
        self.awaiting = True
        try:
            while True:
                try:
                    yielded = coro.send(value) if error is None else coro.throw(error)
                except StopIteration as stop:
                    return stop.value
                try:
                    value, error = (yield yielded), None
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as e:
                    value, error = None, e
                    if isinstance(e, asyncio.CancelledError) and self._error is not None:
                        error, self._error = self._error, None
                        task = asyncio.current_task()
                        if task is not None and hasattr(task, "uncancel"):  # Python 3.11+
                            task.uncancel()
        finally:
            self.awaiting = False
