-- ack: deliveries finished; the messages are gone (envelope, attempts, token, reason).
-- KEYS[1] unack zset   KEYS[2] retry zset   KEYS[3] garbage zset   KEYS[4] messages hash
-- KEYS[5] attempts hash   KEYS[6] tokens hash   KEYS[7] reasons hash
-- ARGV pairs: id, token
-- returns: number of messages acknowledged
-- Only the delivery holding the current token may ack. A late ack (deadline passed, message
-- reaped to retry or garbage) still counts while no newer delivery began; once the message is
-- back in ready or claimed again the token differs and the ack is ignored.
-- Tokens are read with one HMGET and the messages deleted with one variadic call per key (per
-- chunk of 1000, under Lua's unpack limit): a batch costs Redis little more than one message.
guard()
local n = 0
for i = 1, #ARGV, 2000 do
  local last = math.min(i + 1999, #ARGV)
  local ids = {}
  for j = i, last, 2 do ids[#ids + 1] = ARGV[j] end
  local current = redis.call('HMGET', KEYS[6], unpack(ids))
  local done, seen = {}, {}
  for k, id in ipairs(ids) do
    if current[k] == ARGV[i + 2 * k - 1] and not seen[id] then
      seen[id] = true
      done[#done + 1] = id
    end
  end
  if #done > 0 then
    for key = 1, 3 do redis.call('ZREM', KEYS[key], unpack(done)) end
    for key = 4, 7 do redis.call('HDEL', KEYS[key], unpack(done)) end
    n = n + #done
  end
end
return n
