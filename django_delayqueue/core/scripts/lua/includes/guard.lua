-- includes/guard.lua: key type checks made before a script's first write.
-- Redis does not roll a script back when a command fails half-way: a claim whose unack key had
-- been overwritten by a string would have popped ids from ready and lost them. So a script
-- calls guard() on the keys it is about to write before its first write, naming the type each
-- must hold, and changes nothing if one holds another. A key whose type an earlier command of
-- the script already proved (a read, or the first write itself) needs no check: that is what
-- keeps an idle poll at a couple of commands. tests/core/test_core_key_types.py breaks every key
-- under every operation.

-- guard(key, type, key, type, ...): raise a WRONGTYPE error, before anything is written,
-- unless each key is missing or holds its type ('zset', 'list', 'hash', 'string', 'stream').
-- Variadic, not a table: it runs on hot paths (a schedule() of one message), where allocating
-- a table cost as much as the TYPE call itself.
local function guard(...)
  for n = 1, select('#', ...), 2 do
    local key, expected = select(n, ...)
    local actual = redis.call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= expected then
      error({err = 'WRONGTYPE key ' .. key .. ' holds a ' .. actual .. ', not a ' ..
        expected .. ': nothing was changed'})
    end
  end
end
