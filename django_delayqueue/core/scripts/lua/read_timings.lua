-- read_timings: a queue's delivery timings: the totals and the given minutes (core/timings).
-- KEYS[1] timings hash (totals)   KEYS[2..] minutes: minute hashes, in the caller's order
-- returns: one flat field/value list (HGETALL) per key, in the order of KEYS (an expired
-- minute: an empty list); a key of another type fails the call (it writes nothing)
local timings = KEYS[1]
local minutes = {}
for i = 2, #KEYS do minutes[i - 1] = KEYS[i] end
local out = {redis.call('HGETALL', timings)}
for i, minute in ipairs(minutes) do
  out[i + 1] = redis.call('HGETALL', minute)
end
return out
