-- purge: dead letters (garbage) -> gone.
-- KEYS[1] garbage zset   KEYS[2] messages hash   KEYS[3] attempts hash   KEYS[4] tokens hash
-- KEYS[5] reasons hash   KEYS[6] successors hash
-- ARGV[1] limit   ARGV[2..] ids (none: the oldest `limit` dead letters)
-- returns: {purged, dead letters left}
-- A dead message keeps a successor only when a bad attempt count buried it at claim or release
-- (nack and reap let the successor take its place): purging the id removes that too.
--- @include "includes/guard.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash'
)
local ids = {}
if #ARGV > 1 then
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    n = n + 1
  end
end
return {n, redis.call('ZCARD', KEYS[1])}
