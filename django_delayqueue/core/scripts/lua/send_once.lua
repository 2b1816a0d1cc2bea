-- send_once: one message as schedule.lua, replace.lua or enqueue_task.lua would store it, unless
-- its send token was sent already: the transactional outbox (django_delayqueue.outbox) sends a
-- row under the row's token, so a row sent twice (its sender died, or timed out, between this
-- script and deleting the row, and a relay sent it again) is stored once, even if its message
-- was delivered and acknowledged in between.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] attempts hash   KEYS[8] tokens hash
-- KEYS[9] reasons hash   KEYS[10] successors hash   KEYS[11] cancelled hash
-- KEYS[12] ready_since hash   KEYS[13] ranked zset   KEYS[14] priorities hash  (as replace.lua)
-- KEYS[15] sent zset (send token -> when it was sent, ms)
-- KEYS[16] the task's result record (hash; mode 'task' only, any key of the queue otherwise)
-- KEYS[17] unique zset (id -> end of its uniqueness window, ms; read only with ARGV[12] > 0)
-- KEYS[18] flow_keys hash   KEYS[19] key_turns zset   KEYS[20] key_waiting zset
-- KEYS[21] key_state hash   KEYS[22] key_tats zset   KEYS[23] key_lists prefix
-- KEYS[24] key_load zset
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] id   ARGV[5] due (ms)   ARGV[6] envelope
-- ARGV[7] mode: 'schedule', 'replace' or 'task'   ARGV[8] send token
-- ARGV[9] how long (ms) a token is remembered   ARGV[10] the record's enqueued field (JSON)
-- ARGV[11] priority (-100..100)   (ARGV[10] and ARGV[11]: mode 'task' only)
-- ARGV[12] unique window, ms (uniqueness window; 0 for none; not for mode 'task')
-- returns: {-1} when the token was sent within ARGV[9] ms (nothing changed but the token's
--          time, renewed); else what the mode's script returns (the token is remembered,
--          older ones forgotten); with a window, what schedule_unique.lua returns.
local pending, ready, messages, unack = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry, garbage, attempts, tokens = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local reasons, successors, cancelled, ready_since = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local ranked, priorities, sent, record = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local unique, flow_keys, key_turns, key_waiting = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
local key_state, key_tats, key_lists, key_load = KEYS[21], KEYS[22], KEYS[23], KEYS[24]
--- @include "includes/guard.lua"
--- @include "includes/scheduling.lua"
--- @include "includes/replacing.lua"
--- @include "includes/task_enqueue.lua"
--- @include "includes/unique.lua"
local mode = ARGV[7]
if mode ~= 'schedule' and mode ~= 'replace' and mode ~= 'task' then
  return redis.error_reply('send_once: unknown mode ' .. tostring(mode))
end
local window = tonumber(ARGV[12])
if window > 0 and mode == 'task' then
  return redis.error_reply('send_once: a task takes no uniqueness window')
end
guard(sent, 'zset')
if window > 0 then guard(unique, 'zset') end
local now = tonumber(ARGV[1])
local sent_at = redis.call('ZSCORE', sent, ARGV[8])
if sent_at and tonumber(sent_at) > now - tonumber(ARGV[9]) then
  -- Sent again: its sender still holds a row it cannot delete (its replicas do not confirm,
  -- say). Remembered from now, so that a row resent for longer than the memory never stores
  -- its message twice.
  redis.call('ZADD', sent, now, ARGV[8])
  return {-1}
end
local out
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
if window > 0 then
  local stored, state, open_until, wake = schedule_in_window(
    pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
    cancelled, ready_since, ranked, priorities,
    unique, 4, window, mode == 'replace', K
  )
  out = {stored}
  if state ~= nil then out = {stored, 1, state, open_until or 0} end
  if stored > 0 then forget_windows(unique, 2) end
  publish_wake(wake)
elseif mode == 'schedule' then
  out = schedule_triples(pending, ready, messages, unack, retry, garbage, 4, 6, false, K)
elseif mode == 'replace' then
  out = replace_triples(
    pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
    cancelled, ready_since, ranked, priorities, 4, 6, false, K
  )
else
  out = enqueue_task(
    pending, ready, messages, unack, retry, garbage, record, ranked, priorities, ARGV[10],
    tonumber(ARGV[11]), K
  )
end
-- Written last, so that a mode's guard failing leaves everything as it was.
redis.call('ZADD', sent, now, ARGV[8])
redis.call('ZREMRANGEBYSCORE', sent, '-inf', now - tonumber(ARGV[9]))
return out
