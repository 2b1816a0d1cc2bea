-- purge: dead letters (garbage) -> gone.
-- KEYS[1] garbage zset   KEYS[2] messages hash   KEYS[3] attempts hash   KEYS[4] tokens hash
-- KEYS[5] reasons hash   KEYS[6] successors hash
-- ARGV[1] limit   ARGV[2..] ids (none: the oldest `limit` dead letters)
-- returns: {purged, dead letters left}
-- A dead message keeps a successor only when a bad attempt count buried it at claim or release
-- (nack and reap let the successor take its place): purging the id removes that too.
--- @include "includes/guard.lua"
--- @include "includes/dead_letters.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash'
)
local n = 0
for _, id in ipairs(dead_letter_ids(KEYS[1], 2, tonumber(ARGV[1]))) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    for k = 2, 6 do redis.call('HDEL', KEYS[k], id) end  -- every hash holding the id
    n = n + 1
  end
end
return {n, redis.call('ZCARD', KEYS[1])}
