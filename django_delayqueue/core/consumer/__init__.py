"""The consumer: the loop class (``loop.Consumer``) and the parts it owns.

- ``rounds``: the round trip, one pipeline per Redis server (record, promote, claim);
- ``round_parts``: the one interface of what rides on a round trip besides promote and claim
  (the outcomes to record, the recurring keeper, or ``NoKeeper``);
- ``recording``: outcomes waiting to be written to Redis, and the journal rows;
- ``claims``: claims whose reply was lost, asked for again;
- ``waiter``: sleeping until the earliest due time or a producer's wake-up;
- ``handler_threads``: each queue's handler threads and the messages claimed for them;
- ``outcomes``: what one handler call did (ack, retry, dead letter);
- ``extender``: extending the visibility deadline of long handlers;
- ``handler_answers``: what a running handler asks (``message.aborted``, ``message.progress``),
  answered for core/running.py, registered here.
"""

from django_delayqueue.core import running
from django_delayqueue.core.consumer.handler_answers import ANSWERS
from django_delayqueue.core.consumer.loop import Consumer

# Message.aborted and Message.progress ask core/running.py (the envelope may not import the
# consumer): from now on, this package answers.
running.register(ANSWERS)

__all__ = ["Consumer"]
