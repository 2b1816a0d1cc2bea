-- claim: up to N ids from ready -> unack, each with a visibility deadline and a new token.
-- KEYS[1] ready list   KEYS[2] unack zset   KEYS[3] messages hash   KEYS[4] attempts hash
-- KEYS[5] tokens hash   KEYS[6] seq counter
-- ARGV[1] deadline (ms)   ARGV[2] most ids to claim
-- returns: flat array of quadruples: id, envelope ('' when missing), attempt, token
-- One variadic call per key and chunk rather than four calls per message: a batch of a few
-- hundred costs Redis little more than one message. Chunks keep unpack() under Lua's limit.
-- An empty ready list costs one read; otherwise every key written after the LPOP is checked.
if redis.call('LLEN', KEYS[1]) == 0 then return {} end
guard()
local ids = redis.call('LPOP', KEYS[1], tonumber(ARGV[2]))
local first = redis.call('INCRBY', KEYS[6], #ids) - #ids + 1
local out = {}
for i = 1, #ids, 1000 do
  local last = math.min(i + 999, #ids)
  local envelopes = redis.call('HMGET', KEYS[3], unpack(ids, i, last))
  local attempts = redis.call('HMGET', KEYS[4], unpack(ids, i, last))
  local attempt_args, token_args, deadline_args = {}, {}, {}
  for j = i, last do
    local id, k = ids[j], j - i + 1
    local attempt = (tonumber(attempts[k]) or 0) + 1
    attempt_args[2 * k - 1], attempt_args[2 * k] = id, attempt
    local token = string.format('%d', first + j - 1)
    token_args[2 * k - 1], token_args[2 * k] = id, token
    deadline_args[2 * k - 1], deadline_args[2 * k] = ARGV[1], id
    out[#out + 1] = id
    out[#out + 1] = envelopes[k] or ''
    out[#out + 1] = attempt
    out[#out + 1] = token
  end
  redis.call('HSET', KEYS[4], unpack(attempt_args))
  redis.call('HSET', KEYS[5], unpack(token_args))
  redis.call('ZADD', KEYS[2], unpack(deadline_args))
end
return out
