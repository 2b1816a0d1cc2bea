-- release: claimed deliveries that never started (consumer shutting down) -> front of ready,
-- without using up an attempt.
-- KEYS[1] unack zset   KEYS[2] ready list   KEYS[3] attempts hash   KEYS[4] tokens hash
-- ARGV[1] wake channel   ARGV[2..] pairs: id, token
-- returns: number of messages released (a stale token or a reaped message is skipped)
-- Announces them on the wake channel so an idle consumer claims them at once.
guard()
local n = 0
for i = #ARGV - 1, 2, -2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[4], id) == ARGV[i + 1] and redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('LPUSH', KEYS[2], id)
    if redis.call('HINCRBY', KEYS[3], id, -1) <= 0 then redis.call('HDEL', KEYS[3], id) end
    redis.call('HDEL', KEYS[4], id)
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[1], '0') end
return n
