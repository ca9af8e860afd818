-- peek.lua: tokens of one bucket now, without writing (the same as `BucketState::tokens_at`).
--
-- KEYS[1]  the bucket state written by acquire.lua (struct '<dddd': tokens, ts, seq, epoch)
-- ARGV[1]  rate, tokens per second
-- ARGV[2]  capacity, tokens
-- ARGV[3]  now_us: the caller's clock in microseconds; absent, "" or "0" means this server's TIME
--
-- Reply: a bulk string, the tokens as a decimal number (%.17g; may be fractional or negative for
-- debt), e.g. "3", "-1.5". A missing key is a full bucket: the capacity.

local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3] or '')
if rate == nil or capacity == nil then
  return redis.error_reply('ERR peek.lua: bad arguments (rate, capacity[, now_us])')
end

local raw = redis.pcall('GET', KEYS[1])
if type(raw) ~= 'string' or #raw ~= 32 then
  return string.format('%.17g', capacity)
end
local tokens, ts = struct.unpack('<dddd', raw)

if now == nil or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local elapsed = math.max(0, now - ts) / 1000000
return string.format('%.17g', math.min(capacity, tokens + elapsed * rate))
