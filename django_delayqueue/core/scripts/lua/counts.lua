-- counts: the size of every state, and what is needed to tell how overdue the queue is.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] unack zset   KEYS[4] retry zset
-- KEYS[5] garbage zset   KEYS[6] messages hash   KEYS[7] cancelled hash
-- KEYS[8] ready_since hash   KEYS[9] ranked zset   KEYS[10] key_state hash
-- KEYS[11] key_turns zset   KEYS[12] key_waiting zset   KEYS[13] key_tats zset
-- KEYS[14] key_lists prefix
-- ARGV[1] now (ms)   ARGV[2] the flow keys' limits: "<key cap> <key interval ms> <key burst>"
--   (as claim.lua's limits end, includes/key_claims.lua; '' or 0s: none)
-- returns: {pending, ready, unack, retry, garbage, earliest pending due or -1,
--           earliest retry-at or -1, since when the oldest ready message is due, or -1,
--           how many of the ready messages are keyed (in their keys' lists)}
-- A message back in ready (retried, requeued, run now, released) is due from when it came
-- back (ready_since), not from the due time in its envelope, which it was delivered at before.
-- The dead entries cancel left in the ready list are not counted, and the oldest ready message
-- is the first live entry (looked for among the first 1000 dead ones: -1 past them), or the
-- first of a priority in the ranked zset, whichever is due earliest.
-- Keyed ready messages (includes/key_turns.lua) count too, but only those their key's limits do
-- not hold back (those wait on purpose): the heads of the first 3 keys in the rotation that
-- have a free slot and a token, due from when their key's limits let them go if later (a slot
-- freed, a token came: the key's limit wait period, includes/limit_waits.lua), and the head of
-- the key whose token came first, if it came already (the next claim puts it back in turns).
-- The rotation is in turn order, the key served next first: a backlog no consumer claims shows
-- at its head. Bounded: at most 4 keys read, whatever their number (a few commands each).
local pending, ready, unack, retry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local garbage, messages, cancelled, ready_since = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local ranked, key_state, key_turns, key_waiting = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_tats, key_lists = KEYS[13], KEYS[14]
--- @include "includes/envelope.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/limit_waits.lua"
local now = tonumber(ARGV[1])
local key_cap, key_interval, key_burst = string.match(ARGV[2] or '', '^(%S+) (%S+) (%S+)')
key_cap, key_interval, key_burst =
  tonumber(key_cap) or 0, tonumber(key_interval) or 0, tonumber(key_burst) or 1
local MOST_KEYS = 3

local function first_score(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2]) or -1
end

-- ready_at(id): since when a ready message is due (it came back, or its envelope's due time).
local function ready_at(id)
  return tonumber(redis.call('HGET', ready_since, id))
    or envelope_times(redis.call('HGET', messages, id))
end

local dead = dead_in_ready(cancelled)
local keyed = tonumber(redis.call('HGET', key_state, ' ready')) or 0
local head
if dead > 0 then
  head = ready_walk(ready, cancelled, 0, 1, 1000)[1]
else
  head = redis.call('LINDEX', ready, 0)
end
local heads = ranked_heads(ranked)
if head then heads[#heads + 1] = head end
local ready_due = -1
local function consider(due)
  if due and (ready_due == -1 or due < ready_due) then ready_due = due end
end
for _, id in ipairs(heads) do consider(ready_at(id)) end

-- keyed_head(key, free_since): the due time of the key's first ready message, from when its
-- limits let it go if later (`free_since`, and what its limit wait period says).
local came_back = nil  -- whether any message came back to ready (one HLEN, when keys are read)
local function keyed_head(key, free_since)
  local id = redis.call('LINDEX', key_lists .. key, 0)
  if not id then return nil end
  if came_back == nil then came_back = redis.call('HLEN', ready_since) > 0 end
  local due = came_back and tonumber(redis.call('HGET', ready_since, id))
  due = due or envelope_times(redis.call('HGET', messages, id))
  if not due then return nil end
  local p = nil
  if key_cap > 0 or key_interval > 0 then
    p = period_of(redis.call('HGET', key_state, 'w:' .. key))
  end
  if p then
    if key_cap > 0 then due = math.max(due, p.free or p.at) end
    if key_interval > 0 and p.token then due = math.max(due, p.token) end
  end
  if free_since then due = math.max(due, free_since) end
  return due
end

if keyed > 0 and now then
  for _, key in ipairs(redis.call('ZRANGE', key_turns, 0, MOST_KEYS - 1)) do
    local held = false
    if key_cap > 0 then
      held = (tonumber(redis.call('HGET', key_state, 'c:' .. key)) or 0) >= key_cap
    end
    if not held and key_interval > 0 then
      local tat = tonumber(redis.call('ZSCORE', key_tats, key))
      held = tat ~= nil and tat + (1 - key_burst) * key_interval > now
    end
    if not held then consider(keyed_head(key)) end
  end
  local token = redis.call('ZRANGE', key_waiting, 0, 0, 'WITHSCORES')
  if token[2] and tonumber(token[2]) <= now then
    consider(keyed_head(token[1], tonumber(token[2])))
  end
end
return {
  redis.call('ZCARD', pending),
  math.max(0, redis.call('LLEN', ready) - dead) + redis.call('ZCARD', ranked) + keyed,
  redis.call('ZCARD', unack), redis.call('ZCARD', retry), redis.call('ZCARD', garbage),
  first_score(pending), first_score(retry), ready_due, keyed,
}
