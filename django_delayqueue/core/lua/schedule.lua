-- schedule: new messages -> pending (or ready when already due), idempotent on id.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash
-- ARGV[1] now (ms)   ARGV[2] wake channel
-- ARGV[3..] triples: id, due (ms), envelope JSON
-- returns: how many messages were scheduled; the others' ids were already present (unchanged)
-- Publishes the earliest new due time on the wake channel when it beats every pending one,
-- so a sleeping consumer wakes for it (once per call, not once per message).
local now = tonumber(ARGV[1])
-- Types: this read proves pending's and the first HSETNX (the first write) proves messages';
-- ready is written after a HSETNX, so it is checked first, and only when something is due.
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
for i = 4, #ARGV, 3 do
  if tonumber(ARGV[i]) <= now then
    guard(2)
    break
  end
end
local earliest = first[2] and tonumber(first[2]) or nil
local wake = nil
local created = 0
for i = 3, #ARGV, 3 do
  local id, due = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('HSETNX', KEYS[3], id, ARGV[i + 2]) == 1 then
    if due <= now then
      redis.call('RPUSH', KEYS[2], id)
      wake = now
    else
      redis.call('ZADD', KEYS[1], due, id)
      if earliest == nil or due < earliest then
        earliest = due
        if wake == nil or due < wake then wake = due end
      end
    end
    created = created + 1
  end
end
if wake ~= nil then redis.call('PUBLISH', ARGV[2], tostring(wake)) end
return created
