"""The consumer: the loop class (``loop.Consumer``) and its parts.

- ``rounds``: one pipelined round trip per Redis server (promote, claim, record outcomes);
- ``waiter``: sleeping until the earliest due time or a producer's wake-up;
- ``handler_threads``: each queue's handler threads and their inbox;
- ``outcomes``: what one handler call did (ack, retry, dead letter);
- ``recording``: outcomes waiting to be written to Redis, and the journal rows;
- ``extender``: extending the visibility deadline of long handlers.
"""

from django_delayqueue.core.consumer.loop import Consumer

__all__ = ["Consumer"]
