-- publish_recurrences: every recurring schedule's definition, published at once with a version.
-- KEYS[1] the published recurrences hash (fields "definitions" (JSON) and "version")
-- ARGV[1] the definitions, JSON
-- returns: the new version
-- The version only grows, even when the hash was lost (a restart without persistence, a
-- cluster node that lost its data): it is at least the server's clock in ms. A schedule's
-- state records the version that wrote it, and consumers holding older definitions leave it
-- alone; a version that went back would freeze such a schedule until enough publishes.
local published = KEYS[1]
--- @include "includes/guard.lua"
redis.replicate_commands()  -- TIME before a write: replicate the effects (a no-op on Redis 7)
guard(published, 'hash')
local old = tonumber(redis.call('HGET', published, 'version') or '0') or 0
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local version = math.max(old + 1, clock)
redis.call('HSET', published, 'definitions', ARGV[1], 'version', string.format('%d', version))
return version
