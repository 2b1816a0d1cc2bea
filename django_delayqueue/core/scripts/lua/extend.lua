-- extend: push the visibility deadline of deliveries still running further out.
-- KEYS[1] unack zset   KEYS[2] tokens hash
-- ARGV[1] new deadline (ms)   ARGV[2..] pairs: id, token
-- returns: number of deliveries extended (a stale token or a reaped message is skipped)
-- Runs when Redis is out of memory (see includes/memory.lua): a running handler's deadline
-- must keep moving, or its message would be delivered a second time while it runs.
local unack, tokens = KEYS[1], KEYS[2]
--- @include "includes/memory.lua"
local n = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', tokens, id) == ARGV[i + 1] and redis.call('ZSCORE', unack, id) then
    if n == 0 then allow_oom(unack, 'zset') end
    redis.call('ZADD', unack, 'XX', ARGV[1], id)
    n = n + 1
  end
end
return n
