-- includes/state.lua: telling which state holds a stored message.

-- state_of(id, pending, unack, retry, garbage): the state of a message whose envelope is
-- stored: the zset holding it, else 'ready'. A zset key of the wrong type is read as not holding
-- it (pcall): naming the state must not fail a schedule call that already wrote.
local function state_of(id, pending, unack, retry, garbage)
  if type(redis.pcall('ZSCORE', pending, id)) == 'string' then return 'pending' end
  if type(redis.pcall('ZSCORE', unack, id)) == 'string' then return 'unack' end
  if type(redis.pcall('ZSCORE', retry, id)) == 'string' then return 'retry' end
  if type(redis.pcall('ZSCORE', garbage, id)) == 'string' then return 'garbage' end
  return 'ready'
end
