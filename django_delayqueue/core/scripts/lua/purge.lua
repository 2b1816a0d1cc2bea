-- purge: dead letters (garbage) -> gone.
-- KEYS[1] garbage zset   KEYS[2] messages hash   KEYS[3] attempts hash   KEYS[4] tokens hash
-- KEYS[5] reasons hash   KEYS[6] successors hash   KEYS[7] priorities hash
-- KEYS[8] flow_keys hash   KEYS[9] progress hash
-- KEYS[10..] the result record of each id (a task's; any type)
-- ARGV[1] seconds a purged task's result record is kept (when it has no expiry yet)
-- ARGV[2..] ids
-- returns: {purged, dead letters left}
-- A dead message keeps a successor only when a bad attempt count buried it at claim or release
-- (nack and reap let the successor take its place): purging the id removes that too.
--- @include "includes/guard.lua"
--- @include "includes/ended_record.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'hash', KEYS[9], 'hash'
)
local n = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    for k = 2, 9 do redis.call('HDEL', KEYS[k], id) end  -- every hash holding the id
    keep_ended_record(KEYS[8 + i], ARGV[1])  -- a task's result: FAILED, then gone
    n = n + 1
  end
end
return {n, redis.call('ZCARD', KEYS[1])}
