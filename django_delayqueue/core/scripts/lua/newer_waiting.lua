-- newer_waiting: how many messages wait for a consumer that reads their envelope's format (a
-- consumer that did not read it left them: defer.lua), and the newest format among them.
-- KEYS[1] newer hash   KEYS[2] messages hash   KEYS[3] unack zset
-- ARGV[1] most entries looked at
-- returns: {how many wait, the newest format they need (0: none waits), 1 when every entry was
-- looked at (else the count is the entries looked at that wait, plus all those not looked at)}
-- An entry whose message is gone (delivered by a consumer that read it, cancelled, purged) is
-- forgotten here: nothing else deletes it, so the queue's hot paths pay nothing for the newer
-- hash. One in unack is not counted (a consumer holds it: it is delivered now, or left again);
-- one replaced by a message another consumer reads is counted until a consumer claims it.
-- Cost: one HLEN when nothing waits; else O(entries looked at), at most ARGV[1] of them.
local newer, messages, unack = KEYS[1], KEYS[2], KEYS[3]
local most = tonumber(ARGV[1])
local total = redis.call('HLEN', newer)
if total == 0 then return {0, 0, 1} end
local entries = redis.call('HSCAN', newer, 0, 'COUNT', most)
local looked, whole = entries[2], entries[1] == '0'
local waiting, newest, gone = 0, 0, {}
for i = 1, #looked, 2 do
  local id = looked[i]
  if redis.call('HEXISTS', messages, id) == 0 then
    gone[#gone + 1] = id
  elseif not redis.call('ZSCORE', unack, id) then
    waiting = waiting + 1
    newest = math.max(newest, tonumber(string.match(looked[i + 1], '^(%d+)')) or 0)
  end
end
for i = 1, #gone, 1000 do redis.call('HDEL', newer, unpack(gone, i, math.min(i + 999, #gone))) end
if not whole then waiting = waiting + total - #looked / 2 end
return {waiting, newest, whole and 1 or 0}
