-- journal: append one entry (a consumer batch of outcomes) to the queue's capped stream.
-- KEYS[1] journal stream
-- ARGV[1] max length (approximate)   ARGV[2..] field, value pairs
-- returns: the entry id
local journal = KEYS[1]
return redis.call('XADD', journal, 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 2))
