-- schedule: new messages -> pending (or ready when already due), idempotent on id.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset
-- KEYS[7] flow_keys hash   KEYS[8] key_turns zset   KEYS[9] key_waiting zset
-- KEYS[10] key_state hash   KEYS[11] key_tats zset   KEYS[12] key_lists prefix
-- KEYS[13] key_load zset
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4..] triples: id, due (ms), envelope
-- returns: {how many messages were scheduled, then for each message not scheduled because its
--           id is taken (nothing of it changed): its position in this call (1-based) and the
--           state of the message holding the id}
-- replace.lua replaces instead; includes/scheduling.lua says when consumers are woken. A
-- message whose envelope carries a flow key has it noted in the flow_keys hash, and goes to
-- its key's list when due (includes/key_turns.lua).
local pending, ready, messages, unack = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry, garbage, flow_keys, key_turns = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key_waiting, key_state, key_tats, key_lists = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_load = KEYS[13]
--- @include "includes/scheduling.lua"
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
return schedule_triples(pending, ready, messages, unack, retry, garbage, 4, #ARGV, false, K)
