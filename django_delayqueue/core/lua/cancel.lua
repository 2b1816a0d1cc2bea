-- cancel: waiting messages (pending, retry or ready) -> gone. In-flight (unack) and dead
-- (garbage) messages are not cancelled: the first may be running, the second is purged.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] messages hash
-- KEYS[5] attempts hash   KEYS[6] tokens hash   KEYS[7] reasons hash
-- ARGV: ids
-- returns: number of messages cancelled
local n = 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 or redis.call('ZREM', KEYS[2], id) == 1
      or redis.call('LREM', KEYS[3], 1, id) == 1 then
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[7], id)
    n = n + 1
  end
end
return n
