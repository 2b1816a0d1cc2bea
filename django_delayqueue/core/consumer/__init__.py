"""The consumer: the loop class (``loop.Consumer``) and the parts it owns.

- ``loop``: ``Consumer``, the owner: run, step, stop, the hooks a subclass overrides;
- ``delivery``: ``HandlerDelivery``, the one path of a claimed message to its handler, taken by
  the handler threads and the coroutines alike;
- ``outcomes``: what one handler call did (ack, retry, dead letter);
- ``stopping``: the consumer's stop requests and grace period;
- ``rounds/``: the round trip to Redis and what rides on it (planning, claims, recording,
  the waiter);
- ``handlers/``: how a handler runs (threads, coroutines, progress, what it may ask);
- ``limits/``: what bounds a running delivery (runs, watchdog, aborts, the lease extender,
  handlers that could not be stopped).

``docs/architecture.md`` has the lifecycle of a running delivery: who moves it, and what Redis
holds meanwhile."""

from django_delayqueue.core import running
from django_delayqueue.core.consumer.handlers.answers import ANSWERS
from django_delayqueue.core.consumer.loop import Consumer

# Message.aborted and Message.progress ask core/running.py (the envelope may not import the
# consumer): from now on, this package answers.
running.register(ANSWERS)

__all__ = ["Consumer"]
