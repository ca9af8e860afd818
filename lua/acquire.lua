-- acquire.lua: reserve `cost` tokens of one bucket in one call (the same algorithm as
-- `BucketState::reserve` in src/store/bucket.rs; keep the two in step).
--
-- KEYS[1]  the bucket, e.g. tollgate:{provider:region}: a string of four little-endian doubles,
--          struct '<dddd' = tokens, ts (µs), seq, epoch (µs), with a TTL (see below)
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  capacity, tokens (>= 1)
-- ARGV[3]  cost, tokens
-- ARGV[4]  max_wait_us: refuse (taking nothing) a slot further away than this, in microseconds
-- ARGV[5]  now_us: the caller's clock in microseconds (store.clock = "local"); absent, "" or "0"
--          means: read this server's TIME (store.clock = "redis")
--
-- Reply: an array of integers {status, wait_us, seq[, epoch]}
--   { 1, wait_us, seq, epoch}  granted: go in wait_us microseconds; seq numbers the reservation
--                       (give_back.lua); epoch is when this state was created: a caller that sees it
--                       change knows the state (and the queue of slots in it) was lost, e.g. by a restart
--   { 0, wait_us, 0}    refused, the slot would be wait_us away (> max_wait_us); nothing written
--   {-1, 0, 0}          refused, cost is not in (0, capacity]: it can never be served; nothing written
-- Integers only: Redis truncates Lua numbers to integers in replies. Every value here is an exact
-- integer below 2^53 (seq starts at a time in microseconds, about 1.8e15 with TIME).
--
-- Why packed doubles and not a hash of decimal strings: the state reads and writes back exactly, and
-- the number <-> text conversions (strtod, %.17g) were half of this script's cost in redis-server
-- (callgrind: ~85k instructions a call with a hash, ~45k packed). GET + SET PX is also one call
-- fewer than HMGET + HSET + PEXPIRE.

local MICROS = 1000000
-- Keep an idle key this much past the moment it would be full again: the expiry must never come
-- before the refill is complete (a fresh state is full), and callers' clocks (store.clock = "local")
-- may run apart from the server's by about this much.
local EXPIRE_MARGIN_MS = 1000
local STATE = '<dddd'
local STATE_BYTES = 32

local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local now = tonumber(ARGV[5] or '')
if rate == nil or not (rate > 0) or capacity == nil or cost == nil or max_wait == nil then
  return redis.error_reply('ERR acquire.lua: bad arguments (rate, capacity, cost, max_wait_us[, now_us])')
end

if not (cost > 0 and cost <= capacity) then
  return {-1, 0, 0}
end

if now == nil or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * MICROS + tonumber(t[2])
end

local tokens, ts, seq, epoch
-- pcall: a key of another type (e.g. a hash left by an older tollgate) reads as no state.
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'string' and #raw == STATE_BYTES then
  tokens, ts, seq, epoch = struct.unpack(STATE, raw)
else
  -- A new (or expired) bucket is full; seq starts at now so that a reservation of an earlier
  -- incarnation of the key cannot be given back into this one. A value of another shape is not
  -- ours to read: SET replaces it, as if the state had been lost.
  tokens, ts, seq, epoch = capacity, now, now, now
end

-- A caller's clock behind the stored time must not credit the same interval twice.
if now < ts then
  now = ts
end

local elapsed = (now - ts) / MICROS
local after = math.min(capacity, tokens + elapsed * rate) - cost
local wait = 0
if after < 0 then
  wait = math.ceil(-after / rate * MICROS)
end
if wait > max_wait then
  return {0, wait, 0}
end

seq = seq + 1
-- Full again after (capacity - after) / rate seconds; forget the key then (plus the margin).
local full_ms = math.ceil((capacity - after) / rate * 1000)
redis.call('SET', KEYS[1], struct.pack(STATE, after, now, seq, epoch),
  'PX', string.format('%d', full_ms + EXPIRE_MARGIN_MS))
return {1, wait, seq, epoch}
