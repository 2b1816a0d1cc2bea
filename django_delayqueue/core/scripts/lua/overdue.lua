-- overdue: how many messages wait in pending and retry past their time, for the stats (how late
-- the work is now: queuestats, the admin, metrics, the health report).
-- KEYS[1] pending zset   KEYS[2] retry zset
-- ARGV[1] now (ms)
-- returns: {pending messages due by now, retrying messages whose retry time has come}
-- A consumer's round moves them to ready within milliseconds of their time; with no consumer
-- running they stay where they are, so the backlog of an outage is here, not in ready. Two
-- ZCOUNTs: O(log n) whatever the backlog.
local pending, retry = KEYS[1], KEYS[2]
local now = ARGV[1]
return {
  redis.call('ZCOUNT', pending, '-inf', now),
  redis.call('ZCOUNT', retry, '-inf', now),
}
