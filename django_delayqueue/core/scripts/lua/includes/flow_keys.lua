-- includes/flow_keys.lua: a message's flow key (schedule(..., key=...)), read from its envelope
-- and kept in the queue's flow_keys hash (id -> key) while the message exists.

-- envelope_key(envelope): the flow key in an envelope "<due>,<lead>,k<n>,<key>..." (n: its
-- length in bytes, hex; mirrors _read_key() in envelope.py), or nil when it has none (the
-- JSON object form of earlier versions has none). The key stays right after the times in every
-- envelope format (a format's number, "v<n>,", follows it: docs/upgrades.md), so the key of a
-- later release's message is read here too.
local function envelope_key(envelope)
  if not envelope then return nil end
  local _, last, size = string.find(envelope, '^%-?%x+,%-?%x+,k(%x+),')
  if not last then return nil end
  local key = string.sub(envelope, last + 1, last + tonumber(size, 16))
  if key == '' then return nil end
  return key
end

-- keep_flow_key(flow_keys, id, envelope): id's entry in the flow_keys hash says the key of the
-- envelope now stored for it: written when it has one, deleted when it has none (a message
-- replaced by one without a key). No call at all when flow_keys is nil (a script storing what
-- can never carry a key).
local function keep_flow_key(flow_keys, id, envelope)
  if not flow_keys then return end
  local key = envelope_key(envelope)
  if key then
    redis.call('HSET', flow_keys, id, key)
  else
    redis.call('HDEL', flow_keys, id)
  end
end

-- note_flow_key(flow_keys, id, envelope): as keep_flow_key, for a message just created (no
-- entry to delete): costs nothing but the envelope's match for a message without a key.
local function note_flow_key(flow_keys, id, envelope)
  if not flow_keys then return end
  local key = envelope_key(envelope)
  if key then redis.call('HSET', flow_keys, id, key) end
end
