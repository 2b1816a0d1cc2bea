-- includes/scheduling.lua: new messages -> pending (or ready when already due), idempotent on
-- id; shared by schedule.lua and enqueue_task.lua, which take the same first keys and arguments
-- (pending zset, ready list, messages hash, unack zset, retry zset, garbage zset, given to
-- schedule_triples by the names of their prologues):
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- A sleeping consumer is woken (one PUBLISH per call) for a message already due, or due within
-- the horizon and earlier than every pending one. A consumer never sleeps longer than the
-- horizon without reading the pending head itself, so a later message needs no announcement,
-- and scheduling it does not read the head at all.
--- @include "includes/guard.lua"
--- @include "includes/state.lua"
--- @include "includes/key_turns.lua"

-- schedule_triples(pending, ready, messages, unack, retry, garbage, first, last, keep_wake, K):
-- the messages in ARGV[first..last], triples of id, due (ms), envelope, stored under the six keys
-- given first. Returns {how many were scheduled, then for each message not scheduled because its
-- id is taken (nothing of it changed): its position among the triples (1-based) and the state of
-- the message holding the id}. Telling that state costs reads only when the id is taken. With
-- keep_wake, nothing is published: the time to announce (nil for none) is returned second, for a
-- caller that calls this per message to publish once (unique.lua). K: the keyed keys
-- (key_turns.lua): the key of a keyed envelope is noted in K.flow_keys, and a keyed message due
-- now goes to its key's list, or behind the due messages still in pending (key_turns.lua,
-- due_unpromoted) (nil: the messages have no key).
local function schedule_triples(
  pending, ready, messages, unack, retry, garbage, first, last, keep_wake, K
)
  local flow_keys = K and K.flow_keys
  local now = tonumber(ARGV[1])
  local horizon = now + tonumber(ARGV[2])
  -- Types: ready and pending are written after a HSETNX (the first write, which proves the
  -- messages hash), so each is checked first, and only if this call will write it.
  local write_ready, write_pending, keyed = false, false, {}
  for i = first + 1, last, 3 do
    if flow_keys then keyed[i - 1] = envelope_key(ARGV[i + 1]) end
    if tonumber(ARGV[i]) <= now and not keyed[i - 1] then
      write_ready = true
    elseif tonumber(ARGV[i]) <= now then
      write_pending = true  -- may wait in pending behind due ones (due_unpromoted)
    else
      write_pending = true
    end
  end
  if write_pending then guard(pending, 'zset') end
  if write_ready then guard(ready, 'list') end
  if next(keyed) then
    guard(flow_keys, 'hash', K.turns, 'zset', K.waiting, 'zset', K.state, 'hash', K.load, 'zset')
  end
  local earliest, head_read, wake = nil, false, nil
  local behind = nil  -- due_unpromoted(pending, now), read once, for a keyed message due now
  local created, out = 0, {0}
  for i = first, last, 3 do
    local id, due = ARGV[i], tonumber(ARGV[i + 1])
    if redis.call('HSETNX', messages, id, ARGV[i + 2]) == 0 then
      out[#out + 1] = (i - first) / 3 + 1
      out[#out + 1] = state_of(id, pending, unack, retry, garbage)
    else
      local key = keyed[i]
      if key then redis.call('HSET', flow_keys, id, key) end
      if due <= now then
        if key and behind == nil then behind = due_unpromoted(pending, now) end
        if key and behind then
          redis.call('ZADD', pending, due, id)
        elseif key then
          key_push(K, key, id, false)
        else
          redis.call('RPUSH', ready, id)
        end
        wake = now
      else
        if due <= horizon then
          if not head_read then
            local head = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
            earliest = head[2] and tonumber(head[2]) or nil
            head_read = true
          end
          if earliest == nil or due < earliest then
            earliest = due
            if wake == nil or due < wake then wake = due end
          end
        end
        redis.call('ZADD', pending, due, id)
      end
      created = created + 1
    end
  end
  out[1] = created
  if keep_wake then return out, wake end
  if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
  return out
end
