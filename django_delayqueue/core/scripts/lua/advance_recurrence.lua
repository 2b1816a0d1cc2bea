-- advance_recurrence: create a recurring schedule's next ticks, once, whoever asks first.
-- Every runqueue that serves the schedule's queue computes the same plan (core/recurring) and
-- sends it here with the schedule state it last saw; only the first call whose expectation
-- still holds changes anything. So ticks are created exactly once, by any number of racing
-- consumers, and a consumer killed before or after this call leaves the state whole: either
-- the ticks and the new state exist, or neither does and the next consumer does it.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] recurrence states hash
-- KEYS[8] future ticks zset (tick id -> instant ms)   KEYS[9] tick runs hash (name -> last run)
-- KEYS[10] flow_keys hash   KEYS[11] key_turns zset   KEYS[12] key_waiting zset
-- KEYS[13] key_state hash   KEYS[14] key_tats zset   KEYS[15] key_lists prefix
-- KEYS[16] key_load zset
--   (a keyed schedule's ticks carry its key: includes/key_turns.lua)
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] schedule name   ARGV[5] the state expected ('' for none)
-- ARGV[6] the new state (a deleted schedule's is a tombstone: see core/recurring/planning.py;
--         '' removes a tombstone every consumer has seen)
-- ARGV[7] '1': first withdraw the schedule's future ticks (it was edited or paused); '2': that,
--         and forget its last run too (it was deleted)
-- ARGV[8] n: how many waiting ticks the catch-up policy skips   ARGV[9..8+n] the skipped ids
-- ARGV[9+n..] triples: tick id, instant (ms), envelope
-- returns: {1, ticks created} when the state was as expected, else {0, the state found ('')}
-- A state is "<cursor ms> <signature>": the latest tick created and the definition it
-- followed. A tick is an ordinary message (includes/scheduling.lua), idempotent on its id; a
-- tick due after now is also remembered in the future ticks zset, which is what lets an edit
-- or a deletion withdraw it (a due tick is left alone: it was due under the old definition).
local pending, ready, messages, unack = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry, garbage, recurrence_states, ticks = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local tick_runs, flow_keys, key_turns, key_waiting = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_state, key_tats, key_lists, key_load = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
--- @include "includes/scheduling.lua"
-- Rare (once per tick, per schedule): every key it may touch is checked before any write.
guard(
  pending, 'zset', ready, 'list', messages, 'hash', unack, 'zset', retry, 'zset',
  garbage, 'zset', recurrence_states, 'hash', ticks, 'zset', flow_keys, 'hash'
)
local now, name = tonumber(ARGV[1]), ARGV[4]
local found = redis.call('HGET', recurrence_states, name) or ''
if found ~= ARGV[5] then return {0, found} end

if ARGV[7] ~= '0' then
  local prefix = name .. '@'
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', ticks, '(' .. now, '+inf')) do
    if string.sub(id, 1, #prefix) == prefix then
      -- Only a tick still waiting in pending is withdrawn (a pending message is its score
      -- and its envelope, nothing else); one already due or delivered stays.
      if redis.call('ZREM', pending, id) == 1 then
        redis.call('HDEL', messages, id)
        redis.call('HDEL', flow_keys, id)
      end
      redis.call('ZREM', ticks, id)
    end
  end
end

-- Ticks that came due while no consumer ran and that catch_up skips: withdrawn if no one has
-- taken them out of pending yet (one a consumer promoted before it died runs after all).
local skipped = tonumber(ARGV[8])
for i = 9, 8 + skipped do
  if redis.call('ZREM', pending, ARGV[i]) == 1 then
    redis.call('HDEL', messages, ARGV[i])
    redis.call('HDEL', flow_keys, ARGV[i])
  end
  redis.call('ZREM', ticks, ARGV[i])
end

local created, first = 0, 9 + skipped
if #ARGV >= first then  -- schedule_triples checks the types of what it writes
  local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
  created = schedule_triples(
    pending, ready, messages, unack, retry, garbage, first, #ARGV, false, K
  )[1]
  for i = first, #ARGV, 3 do
    if tonumber(ARGV[i + 1]) > now then redis.call('ZADD', ticks, ARGV[i + 1], ARGV[i]) end
  end
end
-- Ticks that came due are no one's to withdraw any more: the zset holds future ones only.
redis.call('ZREMRANGEBYSCORE', ticks, '-inf', now)
if ARGV[6] == '' then  -- an old tombstone, forgotten
  redis.call('HDEL', recurrence_states, name)
else
  redis.call('HSET', recurrence_states, name, ARGV[6])
end
-- The last run is for display only: a tick runs key of the wrong type must not keep a
-- schedule from being deleted (pcall: its error is ignored, after every other write).
if ARGV[7] == '2' then redis.pcall('HDEL', tick_runs, name) end
return {1, created}
