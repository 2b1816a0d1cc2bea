-- extend: push the visibility deadline of deliveries still running further out.
-- KEYS[1] unack zset   KEYS[2] tokens hash
-- ARGV[1] new deadline (ms)   ARGV[2..] pairs: id, token
-- returns: number of deliveries extended (a stale token or a reaped message is skipped)
-- Runs when Redis is out of memory (see includes/memory.lua): a running handler's deadline
-- must keep moving, or its message would be delivered a second time while it runs.
--- @include "includes/memory.lua"
local n = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id) == ARGV[i + 1] and redis.call('ZSCORE', KEYS[1], id) then
    if n == 0 then allow_oom(KEYS[1], 'zset') end
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], id)
    n = n + 1
  end
end
return n
