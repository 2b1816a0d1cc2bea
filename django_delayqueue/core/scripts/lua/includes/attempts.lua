-- includes/attempts.lua: reading a message's delivery count.

-- attempt_count(raw): deliveries so far, from an attempts hash value (nil: none yet); or nil
-- and a reason naming the value when it is not a whole number. Such a message cannot be
-- counted against max attempts, so the scripts send it to garbage with that reason rather than
-- failing half-way (Redis does not roll a script back) or delivering it forever.
local function attempt_count(raw)
  if not raw then return 0 end
  local n = tonumber(raw)
  if n and n >= 0 and n < 2 ^ 53 and math.floor(n) == n then return n end
  return nil, "attempt count '" .. string.sub(raw, 1, 100) .. "' is not a number"
end
