-- includes/envelope.lua: reading the due and scheduled times of a stored envelope. Every
-- envelope format keeps them first (docs/upgrades.md), so this reads an envelope of any format,
-- a later release's too.

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
  if ok and type(data) == 'table' then
    local d, s = tonumber(data['d']), tonumber(data['s'])
    -- Only finite numbers: a NaN or an infinity would make a later cjson.encode fail, after
    -- the caller's writes (Redis does not roll a script back).
    if d and s and d == d and s == s and math.abs(d) < 2 ^ 53 and math.abs(s) < 2 ^ 53 then
      return d, s
    end
  end
  return nil, nil
end

-- envelope_due(raw): the due time alone (ms), or nil: envelope_times' fast path for the
-- common envelope (a due time not negative), read per message by the claim's limit waits.
local function envelope_due(raw)
  local due = raw and string.match(raw, '^(%x+),')
  if due then return tonumber(due, 16) end
  return (envelope_times(raw))
end
