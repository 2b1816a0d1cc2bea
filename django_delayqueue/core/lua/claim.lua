-- claim: up to N ids from ready -> unack, each with a visibility deadline and a new token.
-- KEYS[1] ready list   KEYS[2] unack zset   KEYS[3] messages hash   KEYS[4] attempts hash
-- KEYS[5] tokens hash   KEYS[6] seq counter
-- ARGV[1] deadline (ms)   ARGV[2] most ids to claim
-- returns: flat array of quadruples: id, envelope ('' when missing), attempt, token
local ids = redis.call('LPOP', KEYS[1], tonumber(ARGV[2]))
if not ids then return {} end
local last = redis.call('INCRBY', KEYS[6], #ids)
local out = {}
for i, id in ipairs(ids) do
  local token = tostring(last - #ids + i)
  local envelope = redis.call('HGET', KEYS[3], id) or ''
  local attempt = redis.call('HINCRBY', KEYS[4], id, 1)
  redis.call('HSET', KEYS[5], id, token)
  redis.call('ZADD', KEYS[2], ARGV[1], id)
  out[#out + 1] = id
  out[#out + 1] = envelope
  out[#out + 1] = attempt
  out[#out + 1] = token
end
return out
