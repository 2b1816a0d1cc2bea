-- peek: one page of messages in one state, with their envelopes, attempts and reasons.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] unack zset   KEYS[4] retry zset
-- KEYS[5] garbage zset   KEYS[6] messages hash   KEYS[7] attempts hash   KEYS[8] reasons hash
-- KEYS[9] cancelled hash   KEYS[10] ranked zset
-- KEYS[11] flow_keys hash   KEYS[12] key_turns zset   KEYS[13] key_waiting zset
-- KEYS[14] key_state hash   KEYS[15] key_tats zset   KEYS[16] key_lists prefix
-- KEYS[17] key_load zset
-- ARGV[1] state name   ARGV[2] offset   ARGV[3] limit
-- returns: {total, then quintuples: id, score ('' for ready), envelope or '', attempts, reason}
-- Ready is listed in the order a claim takes it: the ranked entries above priority 0, the list,
-- then the ranked entries below 0 (see ready_list.lua); then the keyed ready messages
-- (key_turns.lua), key by key: the keys in turn order, then those waiting for a token or a
-- slot, each key's messages in its order (a page deep among them walks the keys before it).
-- An attempt count that is not a number is shown as 0, with the bad value named in the reason.
local pending, ready, unack, retry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local garbage, messages, attempts, reasons = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local cancelled, ranked, flow_keys, key_turns = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_waiting, key_state, key_tats, key_lists = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_load = KEYS[17]
--- @include "includes/attempts.lua"
--- @include "includes/ready_list.lua"
local states = {pending = 1, ready = 2, unack = 3, retry = 4, garbage = 5}
local index = states[ARGV[1]]
if not index then return redis.error_reply('unknown state ' .. ARGV[1]) end
local first, last = tonumber(ARGV[2]), tonumber(ARGV[2]) + tonumber(ARGV[3]) - 1
local key = ({pending, ready, unack, retry, garbage})[index]
local total, rows = 0, {}
if index == 2 then
  -- The dead entries cancel left in the list are skipped, and not counted: walking past them
  -- costs what LRANGE costs to reach the offset, plus a hash lookup per entry.
  local dead = dead_in_ready(cancelled)
  local listed = math.max(0, redis.call('LLEN', key) - dead)
  local nranked = redis.call('ZCARD', ranked)
  local high = nranked > 0 and redis.call('ZCOUNT', ranked, '-inf', '(' .. RANK_NORMAL) or 0
  total = listed + nranked
  local ids = {}
  if first < high then  -- positions [0, high): the ranked zset from its start
    ids = redis.call('ZRANGE', ranked, first, math.min(last, high - 1))
  end
  local from, to = math.max(first, high) - high, math.min(last, high + listed - 1) - high
  if from <= to then  -- positions [high, high + listed): the list's live entries
    local page
    if dead > 0 then
      page = ready_walk(key, cancelled, from, to - from + 1, math.huge)
    else
      page = redis.call('LRANGE', key, from, to)
    end
    for _, id in ipairs(page) do ids[#ids + 1] = id end
  end
  from, to = math.max(first, high + listed) - listed, last - listed
  if from <= to and from < nranked then  -- the rest: the ranked zset after its first `high`
    for _, id in ipairs(redis.call('ZRANGE', ranked, from, to)) do ids[#ids + 1] = id end
  end
  local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
  local nkeyed = keyed_ready(K)
  total = total + nkeyed
  local skip, want = math.max(0, first - listed - nranked), last - first + 1 - #ids
  if nkeyed > 0 and want > 0 then
    for _, zset in ipairs({K.turns, K.waiting}) do
      local at = 0
      while want > 0 do
        local keys = redis.call('ZRANGE', zset, at, at + 99)
        if #keys == 0 then break end
        at = at + #keys
        for _, flow_key in ipairs(keys) do
          if want <= 0 then break end
          local list = K.lists .. flow_key
          local len = redis.call('LLEN', list)
          if skip >= len then
            skip = skip - len
          else
            local page = redis.call('LRANGE', list, skip, skip + want - 1)
            skip = 0
            for _, id in ipairs(page) do ids[#ids + 1] = id end
            want = want - #page
          end
        end
      end
    end
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
  out[#out + 1] = redis.call('HGET', messages, id) or ''
  local attempt, bad = attempt_count(redis.call('HGET', attempts, id))
  local reason = redis.call('HGET', reasons, id) or ''
  if bad then reason = reason == '' and bad or bad .. '; ' .. reason end
  out[#out + 1] = attempt or 0
  out[#out + 1] = reason
end
return out
