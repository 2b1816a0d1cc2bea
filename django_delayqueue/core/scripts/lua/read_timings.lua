-- read_timings: a queue's delivery timings: the totals and the given minutes (core/timings).
-- KEYS[1] timings hash (totals)   KEYS[2..] minutes: minute hashes, in the caller's order
-- returns: one flat field/value list (HGETALL) per key, in the order of KEYS (an expired
-- minute: an empty list); a key of another type fails the call (it writes nothing)
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HGETALL', KEYS[i])
end
return out
