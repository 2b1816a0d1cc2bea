-- slot_freed: messages of a queue with max_in_flight or key_concurrency ended (acked, retried,
-- dead): if claims wait on a cap (the queue's, or a flow key's), wake the sleeping consumers to
-- claim in the freed slots.
-- KEYS[1] limiter hash
-- ARGV[1] now (ms)   ARGV[2] wake channel
-- returns: 1 if consumers were woken, else 0
-- Sent by a consumer with the round trip that records its outcomes, after them, only for a
-- queue whose settings have a cap (no cost otherwise). It reads the flag the claim sets when a
-- cap held it back (includes/flow_limits.lua): no PUBLISH while nobody waits. While the rate or
-- the cap holds ready messages back (a limit wait period: includes/limit_waits.lua), it notes
-- since when a slot is free: the wait of the next message claimed ends then, not at its claim
-- (also when Redis is out of memory: includes/memory.lua).
local limiter = KEYS[1]
--- @include "includes/memory.lua"
local now, channel = ARGV[1], ARGV[2]
local state = redis.call('HMGET', limiter, 'held', 'wait_since', 'wait_free')
if state[2] and not state[3] then
  allow_oom(limiter, 'hash')
  redis.call('HSET', limiter, 'wait_free', now)
end
local held = state[1]
if held == 'in_flight' or held == 'key' then
  redis.call('PUBLISH', channel, '0')
  return 1
end
return 0
