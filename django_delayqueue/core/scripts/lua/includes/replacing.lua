-- includes/replacing.lua: messages under ids that may be taken, replacing what holds them;
-- shared by replace.lua and send_once.lua, which take the same first keys and arguments:
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] attempts hash   KEYS[8] tokens hash
-- KEYS[9] reasons hash   KEYS[10] successors hash   KEYS[11] cancelled hash
-- KEYS[12] ready_since hash   KEYS[13] ranked zset   KEYS[14] priorities hash
-- (and the keyed keys, key_turns.lua, given to replace_triples by the caller)
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- The rules are replace.lua's (docs/scheduling.md, "Re-scheduling an id").
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/state.lua"
--- @include "includes/placing.lua"

-- replace_triples(first, last, keep_wake): the messages in ARGV[first..last], triples of id,
-- due (ms), envelope. Returns {how many were stored (all of them), then for each id that was
-- taken: its position among the triples (1-based) and the state of the message it replaced}.
-- With keep_wake, the time to announce is returned second instead of published (as
-- schedule_triples's). K: the keyed keys (key_turns.lua); a message replaced at once takes the
-- key of its new envelope (or none); one in flight keeps its own until its successor follows.
-- A keyed message replaced in ready leaves its key's list (and goes where it belongs now).
local function replace_triples(first, last, keep_wake, K)
  local flow_keys = K and K.flow_keys
  guard(
    KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'hash', KEYS[4], 'zset', KEYS[5], 'zset',
    KEYS[6], 'zset', KEYS[7], 'hash', KEYS[8], 'hash', KEYS[9], 'hash', KEYS[10], 'hash',
    KEYS[11], 'hash', KEYS[12], 'hash', KEYS[13], 'zset', KEYS[14], 'hash'
  )
  if K then
    guard(flow_keys, 'hash', K.turns, 'zset', K.waiting, 'zset', K.state, 'hash', K.load, 'zset')
  end
  local now = tonumber(ARGV[1])
  local horizon = now + tonumber(ARGV[2])
  local out, wake = {0}, nil
  for i = first, last, 3 do
    local id, due, envelope = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
    local state = nil
    if redis.call('HEXISTS', KEYS[3], id) == 1 then
      state = state_of(id, KEYS[1], KEYS[4], KEYS[5], KEYS[6])
      out[#out + 1] = (i - first) / 3 + 1
      out[#out + 1] = state
    end
    local old_key = state == 'ready' and flow_keys and redis.call('HGET', flow_keys, id)
    if state == 'unack' then
      redis.call('HSET', KEYS[10], id, envelope)
    else
      if state == 'pending' then
        redis.call('ZREM', KEYS[1], id)
      elseif state == 'retry' then
        redis.call('ZREM', KEYS[5], id)
      elseif state == 'garbage' then
        redis.call('ZREM', KEYS[6], id)
      end
      redis.call('HSET', KEYS[3], id, envelope)
      if state then
        keep_flow_key(flow_keys, id, envelope)
      else
        note_flow_key(flow_keys, id, envelope)
      end
      for key = 7, 10 do redis.call('HDEL', KEYS[key], id) end
      redis.call('HDEL', KEYS[12], id)
      redis.call('HDEL', KEYS[14], id)
      if state ~= 'ready' then
        wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon, K))
      elseif old_key then
        -- Not in its key's list: in the ready list, where a consumer of the release before
        -- keys promoted it (as cancel.lua's fallback).
        if not key_drop(K, old_key, id, now) then
          drop_from_ready(KEYS[2], KEYS[11], KEYS[13], id)
        end
        wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon, K))
      elseif due > now or (flow_keys and envelope_key(envelope)) then
        drop_from_ready(KEYS[2], KEYS[11], KEYS[13], id)
        wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon, K))
      elseif redis.call('ZREM', KEYS[13], id) == 1 then
        wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon, K))
      end
    end
    out[1] = out[1] + 1
  end
  if keep_wake then return out, wake end
  if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
  return out
end
