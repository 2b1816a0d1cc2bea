-- heartbeat: a consumer says it is alive on one queue (stats.lua counts the consumers alive)
-- when Redis is out of memory and refused the consumer's plain ZADD (core/consumer/rounds.py);
-- consumers silent for long are forgotten on the way.
-- KEYS[1] heartbeats zset (consumer -> last seen ms)
-- ARGV[1] now (ms)   ARGV[2] forget the consumers last seen before (ms)   ARGV[3] consumer name
-- returns: 1
-- Runs when Redis is out of memory (see includes/memory.lua): its first write removes (a
-- ZREMRANGEBYSCORE, which may remove nothing), after which Redis lets the ZADD through, so a
-- consumer that goes on delivering on a full server does not look dead to the health check.
local heartbeats = KEYS[1]
redis.call('ZREMRANGEBYSCORE', heartbeats, '-inf', '(' .. ARGV[2])
redis.call('ZADD', heartbeats, ARGV[1], ARGV[3])
return 1
