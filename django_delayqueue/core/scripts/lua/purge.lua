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
local garbage, messages, attempts, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local reasons, successors, priorities, flow_keys = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local progress = KEYS[9]
local records = {}
for i = 10, #KEYS do records[i - 9] = KEYS[i] end
--- @include "includes/guard.lua"
--- @include "includes/ended_record.lua"
guard(
  garbage, 'zset', messages, 'hash', attempts, 'hash', tokens, 'hash', reasons, 'hash',
  successors, 'hash', priorities, 'hash', flow_keys, 'hash', progress, 'hash'
)
-- Every hash that may hold the id.
local hashes = {messages, attempts, tokens, reasons, successors, priorities, flow_keys, progress}
local n = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', garbage, id) == 1 then
    for _, hash in ipairs(hashes) do redis.call('HDEL', hash, id) end
    keep_ended_record(records[i - 1], ARGV[1])  -- a task's result: FAILED, then gone
    n = n + 1
  end
end
return {n, redis.call('ZCARD', garbage)}
