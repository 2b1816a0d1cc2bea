-- includes/replacing.lua: messages under ids that may be taken, replacing what holds them;
-- shared by replace.lua and send_once.lua, which take the same first keys and arguments
-- (pending zset, ready list, messages hash, unack zset, retry zset, garbage zset, attempts
-- hash, tokens hash, reasons hash, successors hash, cancelled hash, ready_since hash, ranked
-- zset, priorities hash, given to replace_triples by the names of their prologues; and the
-- keyed keys, key_turns.lua)
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- The rules are replace.lua's (docs/scheduling.md, "Re-scheduling an id").
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/state.lua"
--- @include "includes/placing.lua"

-- replace_triples(pending, ..., priorities (the fourteen keys above), first, last, keep_wake, K):
-- the messages in ARGV[first..last], triples of id, due (ms), envelope. Returns {how many were
-- stored (all of them), then for each id that was taken: its position among the triples (1-based)
-- and the state of the message it replaced}. With keep_wake, the time to announce is returned
-- second instead of published (as schedule_triples's). K: the keyed keys (key_turns.lua); a
-- message replaced at once takes the key of its new envelope (or none); one in flight keeps its
-- own until its successor follows. A keyed message replaced in ready leaves its key's list (and
-- goes where it belongs now).
local function replace_triples(
  pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
  cancelled, ready_since, ranked, priorities, first, last, keep_wake, K
)
  local flow_keys = K and K.flow_keys
  guard(
    pending, 'zset', ready, 'list', messages, 'hash', unack, 'zset', retry, 'zset',
    garbage, 'zset', attempts, 'hash', tokens, 'hash', reasons, 'hash', successors, 'hash',
    cancelled, 'hash', ready_since, 'hash', ranked, 'zset', priorities, 'hash'
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
    if redis.call('HEXISTS', messages, id) == 1 then
      state = state_of(id, pending, unack, retry, garbage)
      out[#out + 1] = (i - first) / 3 + 1
      out[#out + 1] = state
    end
    local old_key = state == 'ready' and flow_keys and redis.call('HGET', flow_keys, id)
    if state == 'unack' then
      redis.call('HSET', successors, id, envelope)
    else
      if state == 'pending' then
        redis.call('ZREM', pending, id)
      elseif state == 'retry' then
        redis.call('ZREM', retry, id)
      elseif state == 'garbage' then
        redis.call('ZREM', garbage, id)
      end
      redis.call('HSET', messages, id, envelope)
      if state then
        keep_flow_key(flow_keys, id, envelope)
      else
        note_flow_key(flow_keys, id, envelope)
      end
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', tokens, id)
      redis.call('HDEL', reasons, id)
      redis.call('HDEL', successors, id)
      redis.call('HDEL', ready_since, id)
      redis.call('HDEL', priorities, id)
      if state ~= 'ready' then
        wake = earlier(wake, place(pending, ready, id, due, now, horizon, K))
      elseif old_key then
        -- Not in its key's list: in the ready list, where a consumer of the release before
        -- keys promoted it (as cancel.lua's fallback).
        if not key_drop(K, old_key, id, now) then
          drop_from_ready(ready, cancelled, ranked, id)
        end
        wake = earlier(wake, place(pending, ready, id, due, now, horizon, K))
      elseif due > now or (flow_keys and envelope_key(envelope)) then
        drop_from_ready(ready, cancelled, ranked, id)
        wake = earlier(wake, place(pending, ready, id, due, now, horizon, K))
      elseif redis.call('ZREM', ranked, id) == 1 then
        wake = earlier(wake, place(pending, ready, id, due, now, horizon, K))
      end
    end
    out[1] = out[1] + 1
  end
  if keep_wake then return out, wake end
  if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
  return out
end
