-- extend: push the visibility deadline of deliveries still running further out.
-- KEYS[1] unack zset   KEYS[2] tokens hash
-- ARGV[1] new deadline (ms)   ARGV[2..] pairs: id, token
-- returns: number of deliveries extended (a stale token or a reaped message is skipped)
local n = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id) == ARGV[i + 1] and redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], id)
    n = n + 1
  end
end
return n
