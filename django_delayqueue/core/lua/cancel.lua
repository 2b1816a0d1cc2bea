-- cancel: waiting messages (pending, retry or ready) -> gone. In-flight (unack) and dead
-- (garbage) messages are not cancelled: the first may be running, the second is purged.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] messages hash
-- KEYS[5] attempts hash   KEYS[6] tokens hash   KEYS[7] reasons hash   KEYS[8] journal stream
-- ARGV[1] now (ms)   ARGV[2] journal max length (approximate; 0: no journal entry)
-- ARGV[3..] ids
-- returns: number of messages cancelled
-- The cancelled messages are journalled as one entry (fields n, o) like a consumer batch: rows
-- [id, scheduled, due, delivered (null), finished (now), attempts so far, 'cancel', ''].
guard()
local now, maxlen = tonumber(ARGV[1]), tonumber(ARGV[2])
local rows = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 or redis.call('ZREM', KEYS[2], id) == 1
      or redis.call('LREM', KEYS[3], 1, id) == 1 then
    local due, scheduled = envelope_times(redis.call('HGET', KEYS[4], id))
    if not due then due, scheduled = cjson.null, cjson.null end
    local attempt = tonumber(redis.call('HGET', KEYS[5], id) or '0')
    rows[#rows + 1] = {id, scheduled, due, cjson.null, now, attempt, 'cancel', ''}
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[7], id)
  end
end
if #rows > 0 and maxlen > 0 then
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', maxlen, '*', 'n', #rows, 'o', cjson.encode(rows))
end
return #rows
