-- replace: schedule messages under ids that may be taken, replacing what holds them.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] attempts hash   KEYS[8] tokens hash
-- KEYS[9] reasons hash   KEYS[10] successors hash   KEYS[11] cancelled hash
-- KEYS[12] ready_since hash   KEYS[13] ranked zset   KEYS[14] priorities hash
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4..] triples: id, due (ms), envelope
-- returns: {how many messages were stored (all of them), then for each id that was taken: its
--           position in this call (1-based) and the state of the message it replaced}
-- Rules (docs/scheduling.md, "Re-scheduling an id"):
-- * free id: scheduled as schedule.lua does.
-- * waiting (pending, ready, retry) or dead (garbage): the message is replaced at once, as a
--   new message: new envelope, moved to pending or ready by the new due time, attempts, reason
--   and delivery token cleared (a late ack of an earlier delivery cannot delete the new
--   message), its priority and any successor dropped: afterwards the id holds exactly this
--   message. A ready message due now again keeps its place in the list (one that had a
--   priority goes to the list's tail).
-- * in flight (unack): the message becomes the id's successor (replacing an earlier one),
--   scheduled when the running delivery is acknowledged, or when it dies (ack, nack, reap).
-- New messages due now, or due within the horizon, are announced on the wake channel.
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/state.lua"
--- @include "includes/placing.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'hash', KEYS[4], 'zset', KEYS[5], 'zset',
  KEYS[6], 'zset', KEYS[7], 'hash', KEYS[8], 'hash', KEYS[9], 'hash', KEYS[10], 'hash',
  KEYS[11], 'hash', KEYS[12], 'hash', KEYS[13], 'zset', KEYS[14], 'hash'
)
local now = tonumber(ARGV[1])
local horizon = now + tonumber(ARGV[2])
local out, wake = {0}, nil
for i = 4, #ARGV, 3 do
  local id, due, envelope = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local state = nil
  if redis.call('HEXISTS', KEYS[3], id) == 1 then
    state = state_of(id, KEYS[1], KEYS[4], KEYS[5], KEYS[6])
    out[#out + 1] = (i - 1) / 3
    out[#out + 1] = state
  end
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
    for key = 7, 10 do redis.call('HDEL', KEYS[key], id) end
    redis.call('HDEL', KEYS[12], id)
    redis.call('HDEL', KEYS[14], id)
    if state ~= 'ready' then
      wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon))
    elseif due > now then
      drop_from_ready(KEYS[2], KEYS[11], KEYS[13], id)
      wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon))
    elseif redis.call('ZREM', KEYS[13], id) == 1 then
      wake = earlier(wake, place(KEYS[1], KEYS[2], id, due, now, horizon))
    end
  end
  out[1] = out[1] + 1
end
if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
return out
