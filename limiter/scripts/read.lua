-- One history read against the user's read budget (limiter/reads.py): a GCRA bucket of its own, so
-- reads never spend the chat completions' requests or tokens.
-- KEYS[1]: the user's read budget in its tier. ARGV[2]: window_us, ARGV[3]: capacity.
-- Returns {allowed, remaining, reset_ms, retry_after_ms}.
local window = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local new_tat = math.max(tat, now) + span(1, window, capacity)
local wait = new_tat - (now + window)
local function ceil_ms(us)
  return math.ceil(us / 1000)
end
if wait > 0 then
  return {0, room(tat, window, capacity), ceil_ms(math.max(tat, now) - now), ceil_ms(wait)}
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', ceil_ms(new_tat - now) + EXPIRY_MARGIN_MS)
return {1, room(new_tat, window, capacity), ceil_ms(new_tat - now), 0}
