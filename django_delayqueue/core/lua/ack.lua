-- ack: a delivery finished; the message is gone (envelope, attempts, token, reason).
-- KEYS[1] unack zset   KEYS[2] retry zset   KEYS[3] garbage zset   KEYS[4] messages hash
-- KEYS[5] attempts hash   KEYS[6] tokens hash   KEYS[7] reasons hash
-- ARGV pairs: id, token
-- returns: number of messages acknowledged
-- Only the delivery holding the current token may ack. A late ack (deadline passed, message
-- reaped to retry or garbage) still counts while no newer delivery began; once the message is
-- back in ready or claimed again the token differs and the ack is ignored.
local n = 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[6], id) == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[7], id)
    n = n + 1
  end
end
return n
