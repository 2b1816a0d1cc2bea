"""What bounds a running delivery: its time limits, its abort, its lease, and what happens when
its handler cannot be stopped.

- ``runs``: a running handler's ``Run`` and what it may be told (``abort_requested``,
  ``handler_returned``, ``stop_error``), with ``handler_run`` (the stop sent to it, its
  settlement) and ``shared_slot`` (finding the Run from a copy of its thread's context);
- ``watchdog``: soft and hard time limits, the end of an abort's grace and the wait for a stop
  to end, for every running delivery (thread or coroutine), on its own thread;
- ``aborts``: learning which running messages were aborted (``dq.abort``);
- ``extender``: extending the visibility deadline (the lease) of messages still held;
- ``stopped``: handlers that had to be stopped, and settling their messages;
- ``unstoppable``: handlers that did not end after their stop, handed to the loop's thread.

Nothing is imported here: each module is imported by its own name.
"""
