-- peek: one page of messages in one state, with their envelopes, attempts and reasons.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] unack zset   KEYS[4] retry zset
-- KEYS[5] garbage zset   KEYS[6] messages hash   KEYS[7] attempts hash   KEYS[8] reasons hash
-- KEYS[9] cancelled hash
-- ARGV[1] state name   ARGV[2] offset   ARGV[3] limit
-- returns: {total, then quintuples: id, score ('' for ready), envelope or '', attempts, reason}
-- An attempt count that is not a number is shown as 0, with the bad value named in the reason.
--- @include "includes/attempts.lua"
--- @include "includes/ready_list.lua"
local states = {pending = 1, ready = 2, unack = 3, retry = 4, garbage = 5}
local index = states[ARGV[1]]
if not index then return redis.error_reply('unknown state ' .. ARGV[1]) end
local first, last = tonumber(ARGV[2]), tonumber(ARGV[2]) + tonumber(ARGV[3]) - 1
local key = KEYS[index]
local total, rows = 0, {}
if index == 2 then
  -- The dead entries cancel left in the list are skipped, and not counted: walking past them
  -- costs what LRANGE costs to reach the offset, plus a hash lookup per entry.
  local dead = dead_in_ready(KEYS[9])
  total = math.max(0, redis.call('LLEN', key) - dead)
  local ids
  if dead > 0 then
    ids = ready_walk(key, KEYS[9], first, last - first + 1, math.huge)
  else
    ids = redis.call('LRANGE', key, first, last)
  end
  for _, id in ipairs(ids) do
    rows[#rows + 1] = id
    rows[#rows + 1] = ''
  end
else
  total = redis.call('ZCARD', key)
  rows = redis.call('ZRANGE', key, first, last, 'WITHSCORES')
end
local out = {total}
for i = 1, #rows, 2 do
  local id = rows[i]
  out[#out + 1] = id
  out[#out + 1] = rows[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[6], id) or ''
  local attempts, bad = attempt_count(redis.call('HGET', KEYS[7], id))
  local reason = redis.call('HGET', KEYS[8], id) or ''
  if bad then reason = reason == '' and bad or bad .. '; ' .. reason end
  out[#out + 1] = attempts or 0
  out[#out + 1] = reason
end
return out
