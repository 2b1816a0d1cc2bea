-- includes/aborts.lua: an aborted delivery (abort.lua) ends in the dead letters.

-- take_abort(aborts, id, token): the dead letters' reason of id's delivery ``token`` if it was
-- aborted ("aborted", or "aborted: <reason>"), else nil. Removes id's entry either way: its
-- delivery is ending (an entry under another token is one a delivery left behind).
local function take_abort(aborts, id, token)
  local entry = redis.call('HGET', aborts, id)
  if not entry then return nil end
  redis.call('HDEL', aborts, id)
  local sep = string.find(entry, ' ', 1, true)
  if not sep or string.sub(entry, 1, sep - 1) ~= token then return nil end
  local reason = string.sub(entry, sep + 1)
  if reason == '' then return 'aborted' end
  return 'aborted: ' .. reason
end
