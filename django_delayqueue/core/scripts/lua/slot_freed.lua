-- slot_freed: messages of a queue with max_in_flight ended (acked, retried, dead): if claims
-- wait on the cap, wake the sleeping consumers to claim in the freed slots.
-- KEYS[1] limiter hash
-- ARGV[1] wake channel
-- returns: 1 if consumers were woken, else 0
-- Sent by a consumer with the round trip that records its outcomes, after them, only for a
-- queue whose settings have max_in_flight (no cost otherwise). It reads the flag the claim
-- sets when the cap held it back (includes/flow_limits.lua): no PUBLISH while nobody waits.
if redis.call('HGET', KEYS[1], 'held') == 'in_flight' then
  redis.call('PUBLISH', ARGV[1], '0')
  return 1
end
return 0
