-- record_timings: add a consumer's delivery timings of the last few seconds (bucket counts,
-- sums, outcome counts: core/timings) to its queue's running totals and to the current minute.
-- KEYS[1] timings hash (totals, never expiring)   KEYS[2] minute hash (this minute's timings)
-- ARGV[1] ttl seconds: how long the minute hash is kept after its last write
-- ARGV[2..] increments: pairs of field and increment (a whole number)
-- returns: 1
-- Both hashes take the same increments: the totals are what Prometheus reads as counters (only
-- ever incremented, so monotonic whatever the number of consumers), the minutes what the
-- admin's percentiles over the last minutes and hour are read from. The fields are a fixed
-- set, so neither hash grows with traffic; the minutes expire on their own.
local timings, minute = KEYS[1], KEYS[2]
--- @include "includes/guard.lua"
guard(timings, 'hash', minute, 'hash')
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', timings, ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', minute, ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', minute, ARGV[1])
return 1
