-- give_back.lua: return a reservation whose request never went upstream, only if no reservation
-- was made after it (the same rule as `BucketState::give_back` in src/store/bucket.rs).
--
-- KEYS[1]  the bucket state written by acquire.lua (struct '<dddd': tokens, ts, seq, epoch)
-- ARGV[1]  seq of the reservation (the integer acquire.lua replied)
-- ARGV[2]  its cost, tokens
--
-- Reply: integer 1 if the tokens were returned (then seq is the previous reservation's again),
--        integer 0 if not (the key is gone, or a later reservation depends on this one); nothing written.
-- The key keeps its TTL (SET KEEPTTL, Redis >= 6.0): it was set for a bucket with less in it, so it
-- is long enough.

local STATE = '<dddd'
local seq = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
if seq == nil or cost == nil then
  return redis.error_reply('ERR give_back.lua: bad arguments (seq, cost)')
end

local raw = redis.pcall('GET', KEYS[1])
if type(raw) ~= 'string' or #raw ~= 32 then
  return 0
end
local tokens, ts, stored, epoch = struct.unpack(STATE, raw)
if stored ~= seq then
  return 0
end

redis.call('SET', KEYS[1], struct.pack(STATE, tokens + cost, ts, seq - 1, epoch), 'KEEPTTL')
return 1
