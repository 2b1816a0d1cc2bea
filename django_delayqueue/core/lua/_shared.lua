-- _shared: Lua functions several scripts use, put before a script that calls one of them.
-- Each function starts at a line "local function <name>(" and ends at the next line "end".

-- envelope_times(raw): due and scheduled time (ms) of an envelope "<due>,<due - scheduled>,
-- <payload JSON>" with both numbers in hex (or of the JSON object form of earlier versions);
-- nil, nil when they cannot be read. Mirrors decode_envelope() in envelope.py.
local function envelope_times(raw)
  if not raw then return nil, nil end
  local due, lead = string.match(raw, '^(%-?%x+),(%-?%x+),')
  if due then
    local function signed_hex(text)
      if string.sub(text, 1, 1) == '-' then return -tonumber(string.sub(text, 2), 16) end
      return tonumber(text, 16)
    end
    due = signed_hex(due)
    return due, due - signed_hex(lead)
  end
  local ok, data = pcall(cjson.decode, raw)
  if ok and type(data) == 'table' then return tonumber(data['d']), tonumber(data['s']) end
  return nil, nil
end

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
