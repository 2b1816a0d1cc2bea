-- slot_freed: messages of a queue with max_in_flight or key_concurrency ended (acked, retried,
-- dead): if claims wait on a cap (the queue's, or a flow key's), wake the sleeping consumers to
-- claim in the freed slots.
-- KEYS[1] limiter hash
-- ARGV[1] wake channel
-- returns: 1 if consumers were woken, else 0
-- Sent by a consumer with the round trip that records its outcomes, after them, only for a
-- queue whose settings have a cap (no cost otherwise). It reads the flag the claim sets when a
-- cap held it back (includes/flow_limits.lua): no PUBLISH while nobody waits.
local held = redis.call('HGET', KEYS[1], 'held')
if held == 'in_flight' or held == 'key' then
  redis.call('PUBLISH', ARGV[1], '0')
  return 1
end
return 0
