-- promote: due pending and due retry messages -> ready, in bounded batches.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] tokens hash
-- ARGV[1] now (ms)   ARGV[2] limit: most ids moved from each zset in this call
-- returns: {moved, more (1 when a zset still holds due ids), next due (ms) or -1}
-- A retry id loses its delivery token here: a late ack of the old delivery must not delete a
-- message that is back in the ready list.
local now, limit = ARGV[1], tonumber(ARGV[2])
local moved, more = 0, 0
local function move(src, clear_tokens)
  local ids = redis.call('ZRANGEBYSCORE', src, '-inf', now, 'LIMIT', 0, limit)
  for i = 1, #ids, 500 do
    local chunk = {unpack(ids, i, math.min(i + 499, #ids))}
    redis.call('ZREM', src, unpack(chunk))
    redis.call('RPUSH', KEYS[3], unpack(chunk))
    if clear_tokens then redis.call('HDEL', KEYS[4], unpack(chunk)) end
  end
  moved = moved + #ids
  -- Ask again only if due ids are left: a batch that was exactly `limit` may have emptied it.
  if #ids == limit and #redis.call('ZRANGEBYSCORE', src, '-inf', now, 'LIMIT', 0, 1) > 0 then
    more = 1
  end
end
move(KEYS[1], false)
move(KEYS[2], true)
local next_due = -1
for _, key in ipairs({KEYS[1], KEYS[2]}) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    local score = tonumber(first[2])
    if next_due == -1 or score < next_due then next_due = score end
  end
end
return {moved, more, next_due}
