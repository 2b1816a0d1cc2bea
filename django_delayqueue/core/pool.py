"""Handler threads and the deadline extender of the consumer.

Handlers run on daemon threads so that the loop thread stays free to watch signals and the
grace period, and so that a forced exit is not held up by a stuck handler (whose message the
visibility timeout brings back).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable

from .envelope import Message
from .outcome import Outcome

logger = logging.getLogger(__name__)


class Batch:
    """One claimed batch being worked through by the pool."""

    def __init__(self, messages: Iterable[Message]) -> None:
        self.todo: deque[Message] = deque(messages)
        self.size = len(self.todo)
        self.running_by_token: dict[str, Message] = {}
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        if not self.todo:
            self.done.set()

    def take(self, stopping: bool) -> Message | None:
        with self.lock:
            if stopping or not self.todo:
                return None
            message = self.todo.popleft()
            self.running_by_token[message.token] = message
            return message

    def finish(self, outcome: Outcome) -> None:
        with self.lock:
            self.running_by_token.pop(outcome.message.token, None)
            self.outcomes.append(outcome)
            if len(self.outcomes) == self.size:
                self.done.set()

    def unstarted(self) -> list[Message]:
        with self.lock:
            left = list(self.todo)
            self.todo.clear()
            return left

    def finished_and_running(self) -> tuple[list[Outcome], list[Message]]:
        """The outcomes so far and the messages still running, read at one instant.

        Read apart, a handler finishing in between would be in neither list: not recorded,
        not given back.
        """
        with self.lock:
            return list(self.outcomes), list(self.running_by_token.values())

    def running(self) -> list[Message]:
        with self.lock:
            return list(self.running_by_token.values())

    def in_flight(self) -> list[Message]:
        with self.lock:
            return list(self.todo) + list(self.running_by_token.values())


class HandlerPool:
    """``size`` daemon threads that pull messages off the current batch one at a time."""

    def __init__(
        self,
        size: int,
        work: Callable[[Message], Outcome],
        stopping: Callable[[], bool],
    ) -> None:
        self._work = work
        self._stopping = stopping
        self._batches: deque[Batch] = deque()
        self._wakeup = threading.Condition()
        self._threads = [
            threading.Thread(target=self._serve, name=f"delayqueue-handler-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def submit(self, batch: Batch) -> None:
        with self._wakeup:
            self._batches.append(batch)
            self._wakeup.notify_all()

    def _serve(self) -> None:
        while True:
            with self._wakeup:
                while not self._batches:
                    self._wakeup.wait()
                batch = self._batches[0]
            message = batch.take(self._stopping())
            if message is None:
                with self._wakeup:
                    if self._batches and self._batches[0] is batch:
                        self._batches.popleft()
                continue
            try:
                outcome = self._work(message)
            except BaseException:  # run_handler never raises; this guards the thread itself
                logger.exception("handler thread failed on message %s", message.id)
                continue
            batch.finish(outcome)


class Extender:
    """Pushes out the visibility deadline of messages that are still in flight."""

    def __init__(
        self,
        interval: float,
        in_flight: Callable[[], list[Message]],
        extend: Callable[[list[Message]], None],
    ) -> None:
        self._interval = interval
        self._in_flight = in_flight
        self._extend = extend
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayqueue-extender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            messages = self._in_flight()
            if not messages:
                continue
            try:
                self._extend(messages)
            except Exception as e:  # Redis down: the next tick tries again
                logger.warning("could not extend %d deadlines: %s", len(messages), e)

    def stop(self) -> None:
        self._stop.set()
