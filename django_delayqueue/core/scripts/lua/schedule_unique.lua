-- schedule_unique: messages scheduled (or replaced) under ids with a uniqueness window:
-- schedule(..., id=..., unique_for=seconds), with or without replace=True.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] attempts hash   KEYS[8] tokens hash
-- KEYS[9] reasons hash   KEYS[10] successors hash   KEYS[11] cancelled hash
-- KEYS[12] ready_since hash   KEYS[13] ranked zset   KEYS[14] priorities hash  (as replace.lua)
-- KEYS[15] unique zset (id -> end of its window, ms)
-- KEYS[16] flow_keys hash   KEYS[17] key_turns zset   KEYS[18] key_waiting zset
-- KEYS[19] key_state hash   KEYS[20] key_tats zset   KEYS[21] key_lists prefix
-- KEYS[22] key_load zset
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] mode: 'schedule' (an id that is taken keeps its message) or 'replace'
-- ARGV[5..] quadruples: id, due (ms), envelope, window (ms, > 0)
-- returns: {how many messages were stored, then for each message that found its id taken or
--           its window open: its position in this call (1-based), the state of the message
--           holding the id ('' for none), and the end of the open window that refused it (ms;
--           0 when no window refused it: then it was kept out (schedule) or replaced it)}
-- The rules are includes/unique.lua's (docs/flow-control.md, "Uniqueness windows"). Messages
-- are taken one by one, so a second message of an id in one call finds the first one's window.
local pending, ready, messages, unack = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry, garbage, attempts, tokens = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local reasons, successors, cancelled, ready_since = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local ranked, priorities, unique, flow_keys = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_turns, key_waiting, key_state, key_tats = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
local key_lists, key_load = KEYS[21], KEYS[22]
--- @include "includes/guard.lua"
--- @include "includes/unique.lua"
local mode = ARGV[4]
if mode ~= 'schedule' and mode ~= 'replace' then
  return redis.error_reply('schedule_unique: unknown mode ' .. tostring(mode))
end
-- Every key a message of the call may write, checked before the first write, so that no
-- message finds a wrong type after an earlier one was stored. A schedule writes pending or
-- ready, the messages hash (its HSETNX, the first write, proves it) and the window; a replace
-- may write every key (replace_triples checks them again, at no extra cost per message).
if mode == 'schedule' then
  guard(pending, 'zset', ready, 'list', unique, 'zset')
else
  guard(
    pending, 'zset', ready, 'list', messages, 'hash', unack, 'zset', retry, 'zset',
    garbage, 'zset', attempts, 'hash', tokens, 'hash', reasons, 'hash', successors, 'hash',
    cancelled, 'hash', ready_since, 'hash', ranked, 'zset', priorities, 'hash', unique, 'zset'
  )
end
local out, opened, wake = {0}, 0, nil
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
for i = 5, #ARGV, 4 do
  local stored, state, open_until, announce = schedule_in_window(
    pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
    cancelled, ready_since, ranked, priorities,
    unique, i, tonumber(ARGV[i + 3]), mode == 'replace', K
  )
  out[1] = out[1] + stored
  opened = opened + stored
  wake = earlier(wake, announce)
  if state ~= nil then
    out[#out + 1] = (i - 5) / 4 + 1
    out[#out + 1] = state
    out[#out + 1] = open_until or 0
  end
end
if opened > 0 then forget_windows(unique, 2 * opened) end
publish_wake(wake)  -- once for the call, as schedule.lua
return out
