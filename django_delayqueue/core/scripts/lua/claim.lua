-- claim: up to N ids from ready -> unack, each with a visibility deadline and a new token.
-- KEYS[1] ready list   KEYS[2] unack zset   KEYS[3] messages hash   KEYS[4] attempts hash
-- KEYS[5] tokens hash   KEYS[6] seq counter   KEYS[7] garbage zset   KEYS[8] reasons hash
-- KEYS[9] cancelled hash   KEYS[10] ready_since hash   KEYS[11] ranked zset
-- KEYS[12] limiter hash   KEYS[13] newer hash
-- KEYS[14] flow_keys hash   KEYS[15] key_turns zset   KEYS[16] key_waiting zset
-- KEYS[17] key_state hash   KEYS[18] key_tats zset   KEYS[19] key_lists prefix
-- KEYS[20] key_load zset
-- KEYS[21] claim receipt string (optional: one per consumer, see below)
-- ARGV[1] now (ms)   ARGV[2] deadline (ms)   ARGV[3] most ids to claim
-- ARGV[4] limits: '' or "<interval ms> <burst> <cap> <key cap> <key interval ms> <key burst>"
--   (see includes/flow_limits.lua and includes/key_claims.lua)
-- ARGV[5] the newest envelope format the claiming consumer reads
-- ARGV[6] claim id (with KEYS[21])   ARGV[7] '1': replay the receipt only, claim nothing new
-- returns: flat array of quadruples: id, envelope ('' when missing), attempt, token; when a
-- limit held the claim back (it took fewer than it wanted and found ready), one more element
-- after them: when (ms) the next message may start, -1 when a message in flight must end first;
-- when a claimed message had come back to ready (a retry, requeue, run now, release: it has a
-- ready_since), one more element, a table {id, ready_since (ms), ...} of those: the consumer
-- measures their start lateness from it, as counts.lua counts them overdue from it; when a
-- flow limit held claimed messages back, one last element, a table of numbers: the limit
-- wait (ms) of each message, in the order of the quadruples (includes/limit_waits.lua), which
-- the consumer takes off their lateness. A replay (the receipt) returns the same tables, kept
-- in the receipt (the claim deleted ready_since, and the waits are the claim's).
-- Flow control: with limits (a rate, an in-flight cap) the claim takes at most what they allow
-- now and says when to come back (the limit that held it back: a cap with slots left over, a
-- rate with a token left, did not), so that consumers sleep instead of polling; without them
-- it pays one comparison of ARGV[4]. ARGV[1] is the consumer's reading of the server clock
-- (core/clock.py, never ahead of it: the one clock of due times, injectable in tests), or the
-- instant it aims at when that is at most one claim lead (MAX_CLAIM_LEAD_MS, 5 ms) ahead
-- (consumer/loop.py): a rate's token may then be granted up to that lead before its instant.
-- Keys (includes/key_claims.lua): keyed ready messages wait in per-key lists; the claim takes
-- them by turns, one per key per turn, the unkeyed ready list taking turns as one more key, and
-- within each key's limits (key_concurrency, key_rate_limit). A queue without keyed messages
-- pays one HLEN for this.
-- The receipt: a claim that took messages records its claim id and what it took in KEYS[21]
-- (one SET, expiring a minute after their visibility deadline: after an outage longer than the
-- timeout they may still sit in unack, not reaped yet). A reply can be lost after the script ran
-- (the connection broke; redis-py may even send the pipeline again): called again with the
-- same claim id, the claim takes nothing new and returns those messages again (those still in
-- unack under the token it gave them), with the new deadline. A message that never reached
-- its consumer is then delivered, not left to time out and lose an attempt (or die on its
-- last one). A different claim id claims as usual; '1' in ARGV[7] (a consumer stopping) only
-- replays, so that the consumer can give those messages back. The receipt costs a GET, and a
-- SET when something was claimed.
-- One variadic call per key and chunk rather than four calls per message: a batch of a few
-- hundred costs Redis little more than one message. Chunks keep unpack() under Lua's limit.
-- Redis does not roll a script back, so everything is read before the first write, and the
-- first write that changes anything is the INCRBY of the token counter, which fails on a
-- counter that is not an integer: a bad value or a key of the wrong type fails the claim with
-- nothing changed. Before it, allow_oom() lets the claim run when Redis is out of memory
-- (includes/memory.lua): deliveries go on, and their acks free memory. The
-- reads prove the types of ready, messages and attempts; unack and tokens are checked. A claim
-- that takes keyed messages writes first as it pops them from their keys' lists: it checks
-- every key it touches after that before it pops (see there). A
-- message whose attempt count is not a number goes to garbage with a reason, not to a handler.
-- The dead entries of messages cancelled in ready are dropped (at most 1000 a call), and do
-- not count towards N. An empty ready costs two reads (three with a receipt).
-- Waiting for a newer consumer (the newer hash, written by defer.lua): a message claimed by a
-- consumer that reads its envelope's format (ARGV[5]) waits for none any more, whatever its
-- delivery does next (a retry, the dead letters, a release); its entry goes, so the stats
-- (newer_waiting.lua) no longer count it. One read per claim that finds ready messages (the
-- HLEN, which proves the type); the envelopes are read only when the hash has entries.
-- Order: the ranked entries above priority 0, the list, the ranked entries below 0 (see
-- ready_list.lua); a queue without priorities pays one ZCARD for it.
local ready, unack, messages, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local tokens, seq, garbage, reasons = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local cancelled, ready_since, ranked, limiter = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local newer, flow_keys, key_turns, key_waiting = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_state, key_tats, key_lists, key_load = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
local receipt = KEYS[21]
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/envelope.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/memory.lua"
--- @include "includes/flow_limits.lua"
--- @include "includes/key_claims.lua"
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local now, deadline, claim_id = tonumber(ARGV[1]), ARGV[2], ARGV[6]
local reads_format = tonumber(ARGV[5])

-- tables_of(record): a receipt's trailing tables taken off it: the ready_since pairs (ids
-- first) and the limit waits (numbers).
local function tables_of(record)
  local back, waits = nil, nil
  while type(record[#record]) == 'table' do
    local t = table.remove(record)
    if type(t[1]) == 'number' then waits = t else back = t end
  end
  return back, waits
end

if receipt then
  local held = redis.call('GET', receipt)
  -- {claim id, first token, ids..., the ready_since pairs of those that came back, waits}
  local record = held and cmsgpack.unpack(held)
  if record and record[1] == claim_id then
    local out, deadlines, kept, kept_waits = {}, {}, {}, {}
    local back, waits = tables_of(record)
    for k = 3, #record do
      local id, token = record[k], string.format('%d', record[2] + k - 3)
      if redis.call('HGET', tokens, id) == token and redis.call('ZSCORE', unack, id) then
        kept[id] = true
        out[#out + 1] = id
        out[#out + 1] = redis.call('HGET', messages, id) or ''
        out[#out + 1] = redis.call('HGET', attempts, id)
        out[#out + 1] = token
        deadlines[#deadlines + 1] = deadline
        deadlines[#deadlines + 1] = id
        kept_waits[#kept_waits + 1] = waits and waits[k - 2] or 0
      end
    end
    allow_oom(unack, 'zset')  -- a replay runs when Redis is out of memory, as a claim does
    for i = 1, #deadlines, 2000 do  -- after every read (see above)
      redis.call('ZADD', unack, 'XX', unpack(deadlines, i, math.min(i + 1999, #deadlines)))
    end
    if back then  -- as the claim it replays said, for the messages still in flight
      local since = {}
      for k = 1, #back, 2 do
        if kept[back[k]] then since[#since + 1], since[#since + 2] = back[k], back[k + 1] end
      end
      if #since > 0 then out[#out + 1] = since end
    end
    if waits and #kept_waits > 0 then out[#out + 1] = kept_waits end
    return out
  end
  if ARGV[7] == '1' then return {} end
end
local len, nranked = redis.call('LLEN', ready), redis.call('ZCARD', ranked)
local nkeyed = redis.call('HLEN', K.flow_keys) > 0 and keyed_ready(K) or 0
if len == 0 and nranked == 0 and nkeyed == 0 then return {} end
local newer_entries = redis.call('HLEN', newer) > 0  -- before any write: it proves the type
local want, dead_total = tonumber(ARGV[3]), dead_in_ready(cancelled)
local limits, wanted, flow = ARGV[4], want, nil
if limits ~= '' then
  want, flow = flow_allowance(limiter, unack, limits, now, want)
  if want == 0 then
    allow_oom(limiter, 'hash')  -- waiting on a limit is noted when Redis is full, too
    return {flow_settle(limiter, flow, 0, wanted, true, nil)}
  end
end
local high, low = {}, {}
if nranked > 0 then
  high = redis.call('ZRANGEBYSCORE', ranked, '-inf', '(' .. RANK_NORMAL, 'LIMIT', 0, want)
end
-- Keyed messages and the list take turns (key_claims.lua): how many the list gives, the keyed
-- ids taken (popped from their lists already), why keys held some back and the limit wait
-- periods of the keys taken from.
local plain_quota, keyed_ids, key_hold, key_periods = want - #high, {}, nil, {}
if nkeyed > 0 and #high < want then
  -- The rotation writes before the INCRBY of tokens: a counter it would fail on fails now.
  local counter = redis.call('GET', seq)
  if counter and not tonumber(counter) then redis.call('INCRBY', seq, 1) end
  -- Its pops come first: every key written or read after them is checked now, or a wrong
  -- type would fail the claim with popped ids in no state (lost). Those read above (ready,
  -- ranked, cancelled, newer, flow_keys, key_state) need no check.
  guard(
    unack, 'zset', tokens, 'hash', messages, 'hash', attempts, 'hash', ready_since, 'hash',
    garbage, 'zset', reasons, 'hash', K.turns, 'zset', K.waiting, 'zset', K.tats, 'zset',
    K.load, 'zset'
  )
  allow_oom(unack, 'zset')
  plain_quota, keyed_ids, key_hold, key_periods = take_turns(
    K, limits, now, want - #high, math.max(0, len - dead_total)
  )
  -- Consumers may sleep on a key hold (slot_freed.lua wakes them only while the limiter says
  -- 'key'): a claim that gets all it wants keeps it while keys still wait for a slot or token.
  if flow and flow.held == 'key' and redis.call('ZCARD', K.waiting) > 0 then
    flow.keep_held = true
  end
end
local listed, walked, dead, ndead = {}, 0, {}, 0
if plain_quota > 0 and len > 0 then
  if dead_total > 0 then
    listed, walked, dead, ndead = ready_walk(ready, cancelled, 0, plain_quota, 1000)
  else
    walked = math.min(len, plain_quota)
    listed = redis.call('LRANGE', ready, 0, walked - 1)
  end
end
-- Below priority 0 only once the list is walked to its end (past a long run of dead entries it
-- may not be).
if nranked > #high and #high + #listed + #keyed_ids < want and walked == len then
  low = redis.call('ZRANGEBYSCORE', ranked, '(' .. RANK_NORMAL, '+inf', 'LIMIT', 0,
    want - #high - #listed - #keyed_ids)
end
local ids, ranked_ids = {}, {}
for _, id in ipairs(high) do ids[#ids + 1], ranked_ids[#ranked_ids + 1] = id, id end
for _, id in ipairs(listed) do ids[#ids + 1] = id end
for _, id in ipairs(keyed_ids) do ids[#ids + 1] = id end
for _, id in ipairs(low) do ids[#ids + 1], ranked_ids[#ranked_ids + 1] = id, id end
local n = #ids
local since = n > 0 and redis.call('HLEN', ready_since) > 0  -- rarely: a message came back
local envelopes, counts, came_back = {}, {}, {}
for i = 1, n, 1000 do
  local last = math.min(i + 999, n)
  local e = redis.call('HMGET', messages, unpack(ids, i, last))
  local a = redis.call('HMGET', attempts, unpack(ids, i, last))
  for k = 1, last - i + 1 do envelopes[i + k - 1], counts[i + k - 1] = e[k], a[k] end
  if since then
    local r = redis.call('HMGET', ready_since, unpack(ids, i, last))
    for k = 1, last - i + 1 do came_back[i + k - 1] = r[k] end
  end
end
local deliver, bad = {}, {}
for j = 1, n do
  local count, why = attempt_count(counts[j])
  if count then
    deliver[#deliver + 1] = j
    counts[j] = count + 1
  else
    bad[#bad + 1] = {ids[j], why}
  end
end
-- The ids whose entry in the newer hash goes: this consumer reads their envelopes (a corrupt
-- one it buries: no consumer waits for it either). Read before the first write.
local read_here = {}
if newer_entries and n > 0 then
  for i = 1, n, 1000 do
    local last = math.min(i + 999, n)
    local left = redis.call('HMGET', newer, unpack(ids, i, last))
    for k = 1, last - i + 1 do
      local j = i + k - 1
      if left[k] and envelope_format(envelopes[j]) <= reads_format then
        read_here[#read_here + 1] = ids[j]
      end
    end
  end
end
guard(unack, 'zset', tokens, 'hash')
if #bad > 0 then guard(garbage, 'zset', reasons, 'hash', K.load, 'zset') end
allow_oom(unack, 'zset')
local first = 0
if #deliver > 0 then first = redis.call('INCRBY', seq, #deliver) - #deliver + 1 end
if walked > 0 then redis.call('LTRIM', ready, walked, -1) end
for i = 1, #ranked_ids, 1000 do
  redis.call('ZREM', ranked, unpack(ranked_ids, i, math.min(i + 999, #ranked_ids)))
end
if ndead > 0 then
  if walked == len then
    redis.call('DEL', cancelled)  -- the list is empty: no entry is left to be dead
  else
    for id, passed in pairs(dead) do
      local left = (tonumber(redis.call('HGET', cancelled, id)) or 0) - passed
      if left > 0 then
        redis.call('HSET', cancelled, id, left)
      else
        redis.call('HDEL', cancelled, id)
      end
    end
    set_dead_in_ready(cancelled, dead_total - ndead)
  end
end
local out = {}
for i = 1, #deliver, 1000 do
  local last = math.min(i + 999, #deliver)
  local attempt_args, token_args, deadline_args = {}, {}, {}
  for d = i, last do
    local j, k = deliver[d], d - i + 1
    local id = ids[j]
    local token = string.format('%d', first + d - 1)
    attempt_args[2 * k - 1], attempt_args[2 * k] = id, counts[j]
    token_args[2 * k - 1], token_args[2 * k] = id, token
    deadline_args[2 * k - 1], deadline_args[2 * k] = deadline, id
    out[#out + 1] = id
    out[#out + 1] = envelopes[j] or ''
    out[#out + 1] = counts[j]
    out[#out + 1] = token
  end
  redis.call('HSET', attempts, unpack(attempt_args))
  redis.call('HSET', tokens, unpack(token_args))
  redis.call('ZADD', unack, unpack(deadline_args))
end
if since then
  for i = 1, n, 1000 do redis.call('HDEL', ready_since, unpack(ids, i, math.min(i + 999, n))) end
end
for i = 1, #read_here, 1000 do
  redis.call('HDEL', newer, unpack(read_here, i, math.min(i + 999, #read_here)))
end
for _, dead_one in ipairs(bad) do
  redis.call('ZADD', garbage, ARGV[1], dead_one[1])
  redis.call('HSET', reasons, dead_one[1], dead_one[2])
  if nkeyed > 0 then key_slot_freed(K, dead_one[1], now) end
end
local held_for = nil  -- the queue's limit wait period, as it stood for the messages taken
if flow then
  local more = len + nranked - dead_total + nkeyed > n  -- ready messages left after this claim
  local come_back
  come_back, held_for = flow_settle(limiter, flow, #deliver, wanted, more, key_hold)
  if come_back then out[#out + 1] = come_back end
end
local back = {}  -- {id, ready_since, ...}: in the reply, and in the receipt for a replay
if since then
  for _, j in ipairs(deliver) do
    if came_back[j] then back[#back + 1], back[#back + 2] = ids[j], came_back[j] end
  end
  if #back > 0 then out[#out + 1] = back end
end
-- The limit wait of each message taken (includes/limit_waits.lua): from when it was ready (it
-- came back to ready, or its due time) within the periods of the queue's and its key's limits.
local waits, waited = {}, false
if held_for or next(key_periods) then
  for d, j in ipairs(deliver) do
    local held_by_key = key_periods[ids[j]]
    local w = 0
    if held_for or held_by_key then
      local at = tonumber(came_back[j]) or envelope_due(envelopes[j])
      w = held_wait(at, now, held_for)
      if held_by_key then w = math.max(w, held_wait(at, now, held_by_key)) end
    end
    waits[d] = w
    if w > 0 then waited = true end
  end
  if waited then out[#out + 1] = waits end
end
if receipt and #deliver > 0 then
  local record = {claim_id, first}
  for d = 1, #deliver do record[d + 2] = ids[deliver[d]] end
  if #back > 0 then record[#record + 1] = back end
  if waited then record[#record + 1] = waits end
  local ttl = math.max(0, tonumber(deadline) - now) + 60000  -- see the header
  redis.call('SET', receipt, cmsgpack.pack(record), 'PX', ttl)
end
return out
