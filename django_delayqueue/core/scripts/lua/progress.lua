-- progress: the latest progress of running deliveries (message.progress, dq.progress), sent
-- by their consumer with its next beat (core/consumer/progress_reports.py).
-- KEYS[1] unack zset   KEYS[2] tokens hash   KEYS[3] progress hash
-- ARGV[1..] triples: id, token, progress (JSON: percent, note, when; core/progress.py)
-- returns: number of reports written (a stale token, or a message no longer in flight, is
-- skipped: a stopped handler's late report never lands on its redelivery's)
-- Only the delivery holding the message's current token, while it is in unack, may write;
-- ack, nack, reap and release (and cancel, purge) delete the entry: progress ends with its
-- delivery, and a retry starts without one. Not run when Redis is out of memory: a report is
-- worth less than the acks it would compete with, and the next beat sends a newer one.
local unack, tokens, progress = KEYS[1], KEYS[2], KEYS[3]
--- @include "includes/guard.lua"
guard(progress, 'hash')
local n = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HGET', tokens, id) == ARGV[i + 1] and redis.call('ZSCORE', unack, id) then
    redis.call('HSET', progress, id, ARGV[i + 2])
    n = n + 1
  end
end
return n
