"""How a claimed message's handler runs: on a handler thread or on the event loop.

- ``threads``: one queue's handler threads and the messages claimed for them;
  ``threads_by_queue``: every queue's, for the loop; ``contracts``: what they and the consumer
  give each other (``RunningHandler``);
- ``coroutines``: ``async def`` handlers on one event loop (``HandlerCoroutines``), with
  ``coroutine_context`` (what a handler's own task reaches of its run), ``coroutine_threads``
  (the threads a coroutine starts, counted as its delivery's), ``loop_liveness`` (a blocked
  loop, looked at by the watchdog, which keeps coroutines' time limits as it keeps threads')
  and ``interruptible`` (the ``await`` a soft limit interrupts);
- ``progress_reports``: progress reported by running handlers, sent with the next beat;
- ``answers``: what a running handler asks (``message.aborted``, ``message.progress``),
  answered for ``core/running.py``.

Nothing is imported here: each module is imported by its own name.
"""
