"""The consumer's rounds: the round trip to Redis and what rides on it.

- ``round_trip``: one pipeline per Redis server that records, promotes and claims (``RoundTrip``);
- ``planning``: what the next round claims and when it is due (``RoundPlanner``);
- ``waiter``: sleeping until the earliest due time or a producer's wake-up, and the claim lead;
- ``claim_ahead``: how many messages a queue's threads hold claimed ahead of a free thread;
- ``claims``: claims whose reply was lost, asked for again;
- ``flow_holds``: which queues a rate limit or an in-flight cap holds back, and until when;
- ``parts``: the one interface of what rides on a round trip besides promote and claim
  (the outcomes to record, the recurring keeper, or ``NoKeeper``);
- ``recording``, ``merged_writes``, ``replica_acks``: outcomes and journal rows written to Redis;
- ``left_at_stop``: what is left to record when the consumer stops;
- ``details``: what the heartbeat, sent with a round, says of this process.

Nothing is imported here: each module is imported by its own name.
"""
